"""Seams between features, driven together by a stateful test (issue 35).

Every feature of kresilient passed its own tests while hostile reviews broke it at the seams
*between* features: two spools on one file minting one message id twice, outbox ids unique
per table only, forwarded retry headers routing a dead letter to another service's DLQ, an
application's own HTTP error held forever as a "registry outage", a secret echoed in a
handler's exception written into a dead letter, a transactional DLQ that ``dlq replay
--group`` replays on every run. This module drives those features *together* with a
``hypothesis`` :class:`RuleBasedStateMachine` and checks the product's invariants after every
consumption:

* no acknowledged message missing: every record produced (plain producer, spooled producers,
  outbox relays) is handled or, if it is bad, dead-lettered;
* no two distinct messages with one ``kresilient.message.id``, and every further copy of an
  id marked as a possible duplicate;
* every dead letter in the DLQ of the topic it was consumed from, byte-identical to the
  record (key and value), with that topic as ``kresilient.original.topic``;
* no secret of any client config in any byte written to Kafka (keys, values, headers), in
  the logs or in the spans;
* a transactional dead-letter topic is read to its end and ``replay --group`` replays each
  committed record once, however often it runs.

It runs on the suite's real cluster, not on librdkafka's mock cluster: the seams include
transactional topics (commit markers, aborted records, ``read_committed``), per-topic
``max.message.bytes`` and consumer groups across restarts, which the mock cluster models
only in part. Each example uses topics of its own.

Budget: ``KRESILIENT_SEAMS_EXAMPLES`` examples (default 2, derandomized so a CI run is
reproducible) of ``KRESILIENT_SEAMS_STEPS`` steps each (default 8). A release run::

    KRESILIENT_SEAMS_EXAMPLES=40 KRESILIENT_SEAMS_STEPS=25 KRESILIENT_SEAMS_RANDOM=1 \\
        .venv/bin/python -m pytest tests/test_seams_stateful.py
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import requests
import structlog
import tenacity
from confluent_kafka import Consumer, Producer, TopicPartition
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kresilient import (
    Deduplicator,
    ResilientConsumer,
    ResilientProducer,
    RetryPolicy,
    RetryTopicPolicy,
    Spool,
    SpoolError,
    replay_dead_letters,
)
from kresilient.deadletter import ORIGINAL_TOPIC, dead_letter_headers
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER
from kresilient.testing import KafkaCluster

sqlalchemy = pytest.importorskip("sqlalchemy")
outbox = pytest.importorskip("kresilient.outbox")

EXAMPLES = int(os.environ.get("KRESILIENT_SEAMS_EXAMPLES", "2"))
STEPS = int(os.environ.get("KRESILIENT_SEAMS_STEPS", "8"))
RANDOM = os.environ.get("KRESILIENT_SEAMS_RANDOM") == "1"
VERBOSITY = Verbosity.verbose if os.environ.get("KRESILIENT_SEAMS_VERBOSE") else Verbosity.normal

#: What the handler does with a record, by the first word of its value.
KINDS = ("ok", "poison", "transient", "http", "secret")
#: Kinds that must end in the dead-letter topic (the rest must be handled).
DEAD = {"poison", "http", "secret"}
#: How long one consumption may take before the records not accounted for are a failure.
DRAIN_TIMEOUT = 60.0
KEYS = (b"k0", b"k1", b"k2", b"k3", None)
#: The steps a scenario interleaves; every example ends with the ones it has not taken.
ACTIONS = (
    "produce",
    "open the spool again",
    "another outbox",
    "forward headers downstream",
    "transactional dead letters, replay twice",
    "consume",
    "consume with a second member joining",
)
RETRY_DELAY = 0.2
OUTAGE_LIMIT = 3.0
#: How often each rule ran (and what the checks saw), over every example of the run: the test
#: fails if a rule never ran, so a budget too small to reach a seam cannot pass unnoticed.
RAN: Counter[str] = Counter()


@dataclass
class Sent:
    """A record the test produced and that must be accounted for."""

    kind: str
    topic: str
    key: bytes | None
    value: bytes


@dataclass
class Book:
    """What the handlers saw (shared with the consumer threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    handled: Counter[bytes] = field(default_factory=Counter)
    attempts: Counter[bytes] = field(default_factory=Counter)

    def count(self, table: Counter[bytes], value: bytes) -> int:
        with self.lock:
            table[value] += 1
            return table[value]


def _read_all(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[Any]:
    """Every committed record of ``topic``, from the beginning to the end offsets as they
    were when the read started (``read_committed``: the read ends on the position, never on
    "the last offset seen", which a transaction's commit marker never is)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"seams-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        parts = sorted(c.list_topics(topic, timeout=timeout).topics[topic].partitions)
        ends = {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1] for p in parts
        }
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while todo:
            assert time.monotonic() < deadline, f"could not read {topic} to its end in {timeout} s"
            for msg in c.consume(500, 0.2):
                if msg.error() is None:
                    out.append(msg)
            for p in list(todo):
                (pos,) = c.position([TopicPartition(topic, p)])
                if pos.offset >= ends[p]:
                    todo.discard(p)
        return out
    finally:
        c.close()


def _header(msg: Any, name: str) -> bytes | None:
    found = None
    for k, v in msg.headers() or ():
        if k == name:
            found = v
    return found


class Seams(RuleBasedStateMachine):
    """Producers (plain, spooled, outbox), a consumer service with retry topics, dedupe and a
    DLQ, a downstream service that forwards headers, and replay of a transactional DLQ."""

    cluster: ClassVar[KafkaCluster]

    # ------------------------------------------------------------------ set-up

    @initialize()
    def start(self) -> None:
        cluster = self.cluster
        self.bootstrap = cluster.bootstrap_servers
        tag = uuid.uuid4().hex[:8]
        self.src = f"seams-{tag}"
        self.down = f"seams-down-{tag}"
        self.txdlq = f"seams-txdlq-{tag}"
        self.replayed_to = f"seams-replayed-{tag}"
        self.retry_topic = f"{self.src}.retry.200ms"
        for name, parts in (
            (self.src, 2),
            (self.src + ".dlq", 2),
            (self.retry_topic, 2),
            (f"{self.down}.retry.200ms", 1),
            (self.down, 1),
            (self.down + ".dlq", 1),
            (self.txdlq, 1),
            (self.replayed_to, 1),
        ):
            cluster.create_topic(name, partitions=parts, replication_factor=1)
        self.topics = [
            self.src,
            self.src + ".dlq",
            self.retry_topic,
            f"{self.down}.retry.200ms",
            self.down,
            self.down + ".dlq",
            self.txdlq,
            self.replayed_to,
        ]
        # Secrets every client config carries: none may leave the process anywhere.
        self.secrets = [f"S3cr3t-consumer-{tag}", f"S3cr3t-producer-{tag}"]
        self.consumer_conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": f"seams-{tag}",
            "sasl.password": self.secrets[0],
        }
        self.down_conf = {**self.consumer_conf, "group.id": f"seams-down-{tag}"}
        self.producer_conf = {"bootstrap.servers": self.bootstrap, "sasl.password": self.secrets[1]}
        self.logs = io.StringIO()
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(file=self.logs),
            cache_logger_on_first_use=False,
        )
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.sent: dict[bytes, Sent] = {}
        self.turn: Counter[str] = Counter()
        self.done: set[str] = set()
        self.book = Book()
        self.plain = ResilientProducer(self.producer_conf)
        self.dir = tempfile.mkdtemp(prefix="kresilient-seams-")
        self.spool_path = os.path.join(self.dir, "spool.db")
        self.spools: list[Spool] = []
        self.spooled: list[ResilientProducer] = []
        self._open_spool()
        self.outboxes: list[tuple[Any, Any, Any]] = []
        self._open_outbox()
        self.second_spool_refused = 0
        self.replays: list[int] = []
        self.tx_committed: list[bytes] = []
        # one record of each kind through each producer, so that every example starts from
        # the whole matrix; the rules then interleave the hostile steps
        for i, kind in enumerate(KINDS):
            for via in ("plain", "spool", "outbox"):
                self._produce(kind, via, 0, KEYS[i % len(KEYS)])

    def _open_spool(self) -> None:
        spool = Spool(self.spool_path)
        self.spools.append(spool)
        self.spooled.append(ResilientProducer(self.producer_conf, spool=spool))

    def _open_outbox(self) -> None:
        # Each outbox is its own database with the default table name, as two services
        # (or two deployments of one) would have.
        path = os.path.join(self.dir, f"outbox-{len(self.outboxes)}.db")
        engine = sqlalchemy.create_engine(f"sqlite:///{path}")
        metadata = sqlalchemy.MetaData()
        table = outbox.outbox_table(metadata)
        metadata.create_all(engine)
        relay = outbox.OutboxRelay(engine, table, self.producer_conf, flush_timeout_s=30.0)
        self.outboxes.append((engine, table, relay))

    def teardown(self) -> None:
        try:
            if hasattr(self, "sent"):
                # every example reaches every seam: the actions it has not taken, in order,
                # then whatever the last steps left is consumed and checked once more
                for action in ACTIONS:
                    if action not in self.done:
                        if action == "forward headers downstream" and not self._consumed_once:
                            self.consume(1)
                        self.step(action, [("ok", "plain", 0, None)], len(self.done))
                # and two records through each spool and outbox, so that a second instance
                # opened by the last actions is used too
                self._produce("ok", "spool", 0, None)
                self._produce("ok", "spool", 0, None)
                self._produce("poison", "outbox", 0, None)
                self._produce("ok", "outbox", 0, None)
                self._consume(1)
        finally:
            for producer in [*getattr(self, "spooled", []), getattr(self, "plain", None)]:
                if producer is not None:
                    producer.close()
            for _, _, relay in getattr(self, "outboxes", []):
                relay.close()
            for spool in getattr(self, "spools", []):
                spool.close()
            if hasattr(self, "dir"):
                shutil.rmtree(self.dir, ignore_errors=True)
            structlog.reset_defaults()

    # ------------------------------------------------------------------ producing

    def _produce(self, kind: str, via: str, which: int, key: bytes | None) -> None:
        RAN[f"produce {kind} via {via}"] += 1
        value = f"{kind}:{uuid.uuid4().hex}".encode()
        self.sent[value] = Sent(kind, self.src, key, value)
        # round robin over the instances (``which`` shifts it): once a second spool or outbox
        # exists, the very next records go through both
        self.turn[via] += 1 + which
        turn = self.turn[via]
        if via == "plain":
            self.plain.produce(self.src, value, key=key)
        elif via == "spool":
            self.spooled[turn % len(self.spooled)].produce(self.src, value, key=key)
        else:
            index = turn % len(self.outboxes)
            if index:
                RAN["produce via a second outbox"] += 1
            engine, table, _ = self.outboxes[index]
            with engine.begin() as conn:
                outbox.enqueue(conn, table, topic=self.src, value=value, key=key)

    @rule(
        action=st.sampled_from(ACTIONS),
        batch=st.lists(
            st.tuples(
                st.sampled_from(KINDS),
                st.sampled_from(("plain", "spool", "outbox")),
                st.integers(0, 3),
                st.sampled_from(KEYS),
            ),
            min_size=1,
            max_size=8,
        ),
        number=st.integers(0, 1000),
    )
    def step(
        self, action: str, batch: list[tuple[str, str, int, bytes | None]], number: int
    ) -> None:
        """One step of the scenario. The actions are drawn as one value rather than as rules of
        their own: hypothesis' swarm testing switches whole rules off per example, and a budget
        of a few examples would then never reach some seams."""
        self.done.add(action)
        if action == "produce":
            for kind, via, which, key in batch:
                self._produce(kind, via, which, key)
        elif action == "open the spool again":
            if len(self.spools) < 2:
                self.open_the_spool_again()
        elif action == "another outbox":
            if len(self.outboxes) < 2:
                self.another_outbox()
        elif action == "forward headers downstream":
            if self._retry_records_available():
                self.forward_headers_downstream(number)
            else:
                self.done.discard(action)  # not reached yet: the teardown does it
        elif action == "transactional dead letters, replay twice":
            self.transactional_dead_letters_then_replay_twice(1 + number % 3, number % 2)
        else:
            self.consume(1 if action == "consume" else 2)

    def open_the_spool_again(self) -> None:
        """A second process or object on the same spool file (a deploy overlap, pre-fork
        workers): refused, or else both mint ids from one sequence."""
        RAN["open the spool again"] += 1
        try:
            self._open_spool()
        except SpoolError:
            self.second_spool_refused += 1

    def another_outbox(self) -> None:
        RAN["another outbox"] += 1
        self._open_outbox()

    def forward_headers_downstream(self, pick: int) -> None:
        """A service forwards a record *with its headers* (``msg.headers()``) to the topic of
        another service, whose handler then fails on it: kresilient's retry headers came along."""
        records = _read_all(self.bootstrap, self.retry_topic)
        if not records:
            return
        RAN["forward headers downstream"] += 1
        msg = records[pick % len(records)]
        value = f"poison:{uuid.uuid4().hex}".encode()
        self.sent[value] = Sent("poison", self.down, msg.key(), value)
        self.plain.produce(self.down, value, key=msg.key(), headers=msg.headers())

    def _retry_records_available(self) -> bool:
        if not any(s.kind in ("transient", "http") for s in self.sent.values()):
            return False
        return self._consumed_once

    _consumed_once = False

    def transactional_dead_letters_then_replay_twice(self, committed: int, aborted: int) -> None:
        """Dead letters written in transactions (as the Spark exactly-once sink writes them),
        then ``replay --group`` twice: each committed dead letter replayed exactly once, and
        the read ends on the end offset although no record has offset end - 1."""
        RAN["transactional dead letters, replay twice"] += 1
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "transactional.id": f"seams-{uuid.uuid4()}"}
        )
        producer.init_transactions(30)
        plan = [(i, False) for i in range(committed)] + [(i, True) for i in range(aborted)]
        for n, abort in plan:
            value = f"txdl:{uuid.uuid4().hex}".encode()
            headers = dead_letter_headers(
                self.src, 0, n, None, "seams", ValueError("bad"), None, 1, original_headers=None
            )
            producer.begin_transaction()
            producer.produce(self.txdlq, value, key=b"k", headers=headers)
            if abort:
                # delivered first: librdkafka may fail an abort issued while the partition is
                # still being added to the transaction with a FATAL INVALID_TXN_STATE
                # (confluentinc/librdkafka#4849, seen in CI of 2da01c8); an abort after the
                # flush still leaves the record aborted, which is what this step needs
                producer.flush(30)
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
                self.tx_committed.append(value)
        producer.flush(30)
        group = f"seams-replay-{self.txdlq}"
        for _ in range(2):
            result = replay_dead_letters(
                self.txdlq,
                bootstrap_servers=self.bootstrap,
                target=self.replayed_to,
                group=group,
                timeout=15.0,
            )
            self.replays.append(result.replayed)
        replayed = Counter(m.value() for m in _read_all(self.bootstrap, self.replayed_to))
        assert set(replayed) == set(self.tx_committed), "replay lost or invented dead letters"
        twice = {v: n for v, n in replayed.items() if n > 1}
        assert not twice, f"replay --group replayed committed dead letters again: {twice}"

    # ------------------------------------------------------------------ consuming

    def _handler(self, topic: str) -> Any:
        book, secret = self.book, self.secrets[0]

        def handle(msg: Any) -> None:
            value = msg.value()
            kind = value.split(b":", 1)[0].decode()
            attempt = book.count(book.attempts, value)
            if kind == "poison":
                raise ValueError(f"cannot parse record at {topic}")
            if kind == "transient" and attempt == 1:
                raise TimeoutError("the dependency timed out once")
            if kind == "http":
                # the application's OWN dependency, not a Schema Registry
                raise requests.ConnectionError("http://billing.internal/charge: refused")
            if kind == "secret":
                raise ValueError(f"login refused for password {secret}")
            book.count(book.handled, value)

        return handle

    def _consumer(self, conf: dict[str, Any], topic: str, *, retry_topics: bool) -> Any:
        return ResilientConsumer(
            conf,
            [topic],
            self._handler(topic),
            retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.05)),
            retry_topics=RetryTopicPolicy(delays=(RETRY_DELAY,)) if retry_topics else None,
            # http records fail for good: where several come in a row with no success between,
            # they look like a dependency outage (issue 36) and are held; a short outage limit
            # dead-letters them after it, as the default (10 minutes) would, only sooner
            outage_retry=RetryPolicy(
                stop=tenacity.stop_after_delay(OUTAGE_LIMIT),
                wait=tenacity.wait_fixed(0.2),
                retry=tenacity.retry_always,
            ),
            dedupe=Deduplicator(),
            install_signal_handlers=False,
            poll_timeout=0.2,
            tracer_provider=self.tracer_provider,
        )

    def _publish(self) -> None:
        self.plain.flush(60)
        for producer in self.spooled:
            producer.flush(60)
        for _, _, relay in self.outboxes:
            deadline = time.monotonic() + 60
            while relay.pending():
                assert time.monotonic() < deadline, "the outbox relay did not publish its rows"
                relay.publish_batch()

    def _accounted(self, topic: str) -> tuple[set[bytes], list[Any]]:
        """The records of ``topic`` not accounted for yet, and its dead letters."""
        dead = _read_all(self.bootstrap, topic + ".dlq")
        dead_values = {m.value() for m in dead}
        with self.book.lock:
            handled = set(self.book.handled)
        missing = {
            v
            for v, s in self.sent.items()
            if s.topic == topic and v not in (dead_values if s.kind in DEAD else handled)
        }
        return missing, dead

    def consume(self, members: int) -> None:
        """Run the service (and the downstream one) until every record is accounted for."""
        RAN[f"consume with {members} member(s)"] += 1
        self._consume(members)

    def _consume(self, members: int) -> None:
        self._publish()
        for topic, conf, retry in (
            (self.src, self.consumer_conf, True),
            # the downstream service has retry topics of its own: forwarded upstream retry
            # headers must not make its records look like retries of the upstream topic
            (self.down, self.down_conf, True),
        ):
            if not any(s.topic == topic for s in self.sent.values()):
                continue
            runners = [_Runner(self._consumer(conf, topic, retry_topics=retry))]
            try:
                deadline = time.monotonic() + DRAIN_TIMEOUT
                joined = members == 1
                while True:
                    missing, _ = self._accounted(topic)
                    if not missing:
                        break
                    for r in runners:
                        r.check()
                    if not joined:
                        # a second member joins mid-way: a rebalance under load
                        runners.append(_Runner(self._consumer(conf, topic, retry_topics=retry)))
                        joined = True
                    if time.monotonic() > deadline:
                        kinds = Counter(self.sent[v].kind for v in missing)
                        raise AssertionError(
                            f"{len(missing)} record(s) of {topic} neither handled nor "
                            f"dead-lettered after {DRAIN_TIMEOUT:g} s, by kind: {dict(kinds)}"
                        )
                    time.sleep(0.2)
            finally:
                for r in runners:
                    r.stop()
        self._consumed_once = True
        self._check_topics()

    # ------------------------------------------------------------------ invariants

    def _check_topics(self) -> None:
        records = {t: _read_all(self.bootstrap, t) for t in self.topics}
        # one id, one message: every further copy of an id is the same message, marked
        by_id: dict[bytes, list[Any]] = defaultdict(list)
        for msg in records[self.src]:
            ident = _header(msg, MESSAGE_ID_HEADER)
            if ident is not None:
                by_id[ident].append(msg)
        for ident, copies in by_id.items():
            values = {m.value() for m in copies}
            assert len(values) == 1, (
                f"two distinct messages carry the message id {ident!r}: "
                f"{sorted(values)[:3]} (Deduplicator would drop one of them)"
            )
            for later in sorted(copies, key=lambda m: (m.partition(), m.offset()))[1:]:
                assert _header(later, POSSIBLE_DUPLICATE_HEADER) == b"true", (
                    f"a second copy of {ident!r} is not marked as a possible duplicate"
                )
        # dead letters: in the DLQ of the topic they were consumed from, byte for byte
        for topic in (self.src, self.down):
            for msg in records[topic + ".dlq"]:
                sent = self.sent.get(msg.value())
                assert sent is not None, f"{topic}.dlq holds an unknown record {msg.value()!r}"
                assert sent.topic == topic, (
                    f"the dead letter of a {sent.topic} record went to {topic}.dlq "
                    f"(headers: {msg.headers()})"
                )
                assert (msg.key(), sent.kind in DEAD) == (sent.key, True)
                assert _header(msg, ORIGINAL_TOPIC) == topic.encode(), (
                    f"dead letter in {topic}.dlq names original topic "
                    f"{_header(msg, ORIGINAL_TOPIC)!r}"
                )
        # no secret anywhere a person or another system can read
        for topic, msgs in records.items():
            for msg in msgs:
                blob = b"".join(
                    [msg.key() or b"", msg.value() or b""]
                    + [k.encode() + (v or b"") for k, v in msg.headers() or ()]
                )
                for secret in self.secrets:
                    assert secret.encode() not in blob, (
                        f"a secret was written to Kafka, topic {topic} offset {msg.offset()}"
                    )
        text = self.logs.getvalue() + "".join(
            json.dumps(
                {
                    "name": s.name,
                    "attributes": dict(s.attributes or {}),
                    "events": [[e.name, dict(e.attributes or {})] for e in s.events],
                    "status": s.status.description,
                },
                default=str,
            )
            for s in self.spans.get_finished_spans()
        )
        for secret in self.secrets:
            assert secret not in text, "a secret reached the logs or the spans"


class _Runner:
    """A consumer's ``run()`` in a thread; its error re-raised by :meth:`check`."""

    def __init__(self, consumer: ResilientConsumer) -> None:
        self.consumer = consumer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:
            self.error = exc

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the consumer stopped: {self.error!r}") from self.error

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the consumer did not stop within 60 s"
        self.check()


def test_features_together_keep_the_invariants(kafka_cluster: KafkaCluster) -> None:
    Seams.cluster = kafka_cluster
    run_state_machine_as_test(
        Seams,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=not RANDOM,
            database=None,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
            report_multiple_bugs=False,
            verbosity=VERBOSITY,
        ),
        # every example runs the whole budget of steps: short runs reach no seam
        _min_steps=STEPS,
    )
    ran = dict(sorted(RAN.items()))
    print(f"seams: rules run {ran}")
    expected = {
        "open the spool again",
        "another outbox",
        "produce via a second outbox",
        "forward headers downstream",
        "transactional dead letters, replay twice",
        "consume with 2 member(s)",
        "consume with 1 member(s)",
        *(f"produce {k} via plain" for k in KINDS),
        *(f"produce {k} via spool" for k in KINDS),
        *(f"produce {k} via outbox" for k in KINDS),
    }
    assert not expected - set(RAN), f"the run never reached {sorted(expected - set(RAN))}"
