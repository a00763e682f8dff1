"""Seams between features, driven together by a stateful test (issue 35).

Every feature of kresilient passed its own tests while hostile reviews broke it at the seams
*between* features: two spools on one file minting one message id twice, outbox ids unique
per table only, forwarded retry headers routing a dead letter to another service's DLQ, an
application's own HTTP error held forever as a "registry outage", a secret echoed in a
handler's exception written into a dead letter, a transactional DLQ that ``dlq replay
--group`` replays on every run. This module drives those features *together* with a
``hypothesis`` :class:`RuleBasedStateMachine`.

What it drives:

* upstream producers: a plain one, spooled ones (a second ``Spool`` on the same file, and a
  spooled producer in a child process SIGKILLed without ``close()`` whose spool is then
  reopened), outbox relays over several databases, and a ``TransactionalProducer`` writing
  to the source topic (so the source topic is transactional, an aborted transaction now and
  then);
* consumers: ``ordering="partition"`` with retry topics, dedupe, a DLQ, crash-loop protection
  (``max_process_deaths=3``), dependency-outage detection and a value deserializer; and
  ``ordering="key"`` with the same outage detection, value deserializer and crash-loop
  protection (docs/parallel.md: no retry topics in that mode here) in the same group; a second
  member joining mid-way (a rebalance); a consumer in a child process SIGKILLed without
  ``close()`` and restarted in the same group;
* handlers failing with poison, transient, HTTP-transport errors of their own
  (``requests.ConnectionError``, which follows the retry policy and ends in the DLQ) and a
  handler echoing the consumer's secret; a Schema Registry outage raised by the value
  deserializer (a transport error inside the deserialization step), which must be HELD and
  handled once the registry answers, never dead-lettered;
* a downstream service forwarding ``msg.headers()``, and replay of a transactional DLQ.

Invariants, checked after every step (``@invariant``, also after the set-up):

* nothing committed past an unhandled record: for every partition of the source, retry and
  downstream topics, each committed record below the group's committed offset is handled,
  dead-lettered or (on a source topic) moved to its retry topic;
* no two distinct messages with one ``kresilient.message.id``, and every further copy of an
  id marked as a possible duplicate;
* every dead letter in the DLQ of the topic it was consumed from, byte-identical to the
  record (key and value), with that topic as ``kresilient.original.topic``; only bad records
  (never a registry-outage record) are dead-lettered;
* nothing of an aborted upstream transaction handled or dead-lettered;
* no secret of any client config in any byte written to Kafka (keys, values, headers), in
  the logs, in the spans, or on stdout/stderr (this process's file descriptors through
  ``capfd``, librdkafka's own lines included, and the child processes' output);
* after a consumption: no acknowledged message missing (every record produced and
  acknowledged is handled or, if it is bad, dead-lettered); a transactional dead-letter topic
  is read to its end and ``replay --group`` replays each committed record once, however often
  it runs.

It runs on the suite's real cluster, not on librdkafka's mock cluster: the seams include
transactional topics (commit markers, aborted records, ``read_committed``), per-topic
``max.message.bytes`` and consumer groups across restarts, which the mock cluster models
only in part. Each example uses topics of its own.

Budget: ``KRESILIENT_SEAMS_EXAMPLES`` examples (default 1, derandomized so a CI run is
reproducible) of ``KRESILIENT_SEAMS_STEPS`` steps each (default 8). Every example ends with
the actions its steps did not take, in a fixed order, so even one short example reaches every
seam; the consumer kill is the costly one (a child process, and a group session timeout, 6 s,
before the restart is assigned). CI's one derandomized example is hypothesis' simplest (its
steps only produce; the teardown takes every action): a fixed scenario over every seam, with
the invariants after each step, in 28-35 s on the shared session cluster (42-51 s wall with
the cluster's start; 2 cores at load 6-11). The search is the release run, random and longer::

    KRESILIENT_SEAMS_EXAMPLES=40 KRESILIENT_SEAMS_STEPS=25 KRESILIENT_SEAMS_RANDOM=1 \\
        .venv/bin/python -m pytest tests/test_seams_stateful.py -p no:cacheprovider

(``KRESILIENT_SEAMS_DUMP=<dir>`` writes each example's log lines and captured output there.)
A failing example is shrunk (up to hypothesis' 5 minutes): the report lists its steps, then
the ``teardown:`` actions it ended with.

"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests
import structlog
import tenacity
from confluent_kafka import Consumer, Producer, TopicPartition
from hypothesis import HealthCheck, Phase, Verbosity, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
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
    TransactionalProducer,
    replay_dead_letters,
)
from kresilient.clusterinfo import committed_offsets
from kresilient.deadletter import ORIGINAL_TOPIC, dead_letter_headers
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER
from kresilient.testing import KafkaCluster

sqlalchemy = pytest.importorskip("sqlalchemy")
outbox = pytest.importorskip("kresilient.outbox")

EXAMPLES = int(os.environ.get("KRESILIENT_SEAMS_EXAMPLES", "1"))
STEPS = int(os.environ.get("KRESILIENT_SEAMS_STEPS", "8"))
RANDOM = os.environ.get("KRESILIENT_SEAMS_RANDOM") == "1"
#: A directory: each example's log lines and output are written there (debugging).
DUMP = os.environ.get("KRESILIENT_SEAMS_DUMP")
VERBOSITY = Verbosity.verbose if os.environ.get("KRESILIENT_SEAMS_VERBOSE") else Verbosity.normal

#: What the handler (or the deserializer) does with a record, by the first word of its value.
KINDS = ("ok", "poison", "transient", "http", "secret", "registry")
#: Kinds that must end in the dead-letter topic (the rest must be handled).
DEAD = {"poison", "http", "secret"}
#: The upstream producers.
VIAS = ("plain", "spool", "outbox", "txn")
#: How many times the Schema Registry "is down" for a registry record (deserializer calls).
REGISTRY_FAILS = 2
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
    "consume with ordering=key",
    "kill a spooled producer, reopen its spool",
    "kill a consumer, restart it in its group",
)
RETRY_DELAY = 0.2
OUTAGE_LIMIT = 3.0
#: How often each rule ran (and what the checks saw), over every example of the run: the test
#: fails if a rule never ran, so a budget too small to reach a seam cannot pass unnoticed.
RAN: Counter[str] = Counter()
#: Seconds spent per action and in the checks, over the run (printed with RAN).
SPENT: Counter[str] = Counter()
HERE = Path(__file__).resolve().parent


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
    registry: Counter[bytes] = field(default_factory=Counter)

    def count(self, table: Counter[bytes], value: bytes) -> int:
        with self.lock:
            table[value] += 1
            return table[value]


def _read_topics(
    bootstrap: str, topics: list[str], *, timeout: float = 30.0
) -> dict[str, list[Any]]:
    """Every committed record of ``topics`` (one consumer for all), from the beginning to the
    end offsets as they were when the read started (``read_committed``: the read ends on the
    position, never on "the last offset seen", which a transaction's commit marker never is)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"seams-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        meta = c.list_topics(timeout=timeout).topics
        ends = {}
        for topic in topics:
            for p in sorted(meta[topic].partitions):
                end = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                if end > 0:
                    ends[topic, p] = end
        todo = set(ends)
        c.assign([TopicPartition(t, p, 0) for t, p in todo])
        out: dict[str, list[Any]] = {t: [] for t in topics}
        deadline = time.monotonic() + timeout
        while todo:
            assert time.monotonic() < deadline, f"could not read {sorted(todo)} in {timeout} s"
            for msg in c.consume(500, 0.1):
                if msg.error() is None:
                    out[str(msg.topic())].append(msg)
            for pos in c.position([TopicPartition(t, p) for t, p in todo]):
                if pos.offset >= ends[pos.topic, pos.partition]:
                    todo.discard((pos.topic, pos.partition))
        return out
    finally:
        c.close()


def _read_all(bootstrap: str, topic: str, *, timeout: float = 30.0) -> list[Any]:
    """Every committed record of ``topic`` (see :func:`_read_topics`)."""
    return _read_topics(bootstrap, [topic], timeout=timeout)[topic]


def _header(msg: Any, name: str) -> bytes | None:
    found = None
    for k, v in msg.headers() or ():
        if k == name:
            found = v
    return found


# ---------------------------------------------------------------------- the service's code
# Module level: the consumer child process (``_consumer_child``) runs the same code.


def make_handler(topic: str, secret: str, book: Book, out: int | None = None) -> Any:
    """The service's handler: what it does with a record is named by the record's first word.
    ``out``: a file descriptor each handled value is written to (one ``write(2)``) before the
    handler returns, so a SIGKILLed process leaves what it handled behind."""

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
        if out is not None:
            os.write(out, value + b"\n")
        book.count(book.handled, value)

    return handle


def make_deserializer(book: Book) -> Any:
    """A value deserializer whose Schema Registry is down for the first ``REGISTRY_FAILS``
    reads of each ``registry:`` record (the transport error a registry client raises)."""

    def deserialize(value: bytes | None, ctx: Any) -> bytes | None:
        if (
            value is not None
            and value.startswith(b"registry:")
            and book.count(book.registry, value) <= REGISTRY_FAILS
        ):
            raise requests.ConnectionError(
                "http://schema-registry.internal:8081/schemas/ids/1: connection refused"
            )
        return value

    return deserialize


def make_consumer(
    conf: dict[str, Any],
    topic: str,
    book: Book,
    secret: str,
    *,
    ordering: str = "partition",
    tracer_provider: Any = None,
    out: int | None = None,
) -> ResilientConsumer:
    retry = RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.05))
    common: dict[str, Any] = {
        "retry": retry,
        "dedupe": Deduplicator(),
        "install_signal_handlers": False,
        "poll_timeout": 0.2,
        "tracer_provider": tracer_provider,
    }
    handler = make_handler(topic, secret, book, out)
    # http records fail for good: where several come in a row with no success between,
    # they look like a dependency outage (issue 36) and are held; a short outage limit
    # dead-letters them after it, as the default (10 minutes) would, only sooner
    common["outage_retry"] = RetryPolicy(
        stop=tenacity.stop_after_delay(OUTAGE_LIMIT),
        wait=tenacity.wait_fixed(0.2),
        retry=tenacity.retry_always,
    )
    common["value_deserializer"] = make_deserializer(book)
    if ordering == "key":
        # issue 40: crash-loop protection on (a probed partition runs one record at a time)
        return ResilientConsumer(
            conf,
            [topic],
            handler,
            ordering="key",
            max_in_flight=8,
            max_process_deaths=3,
            **common,
        )
    return ResilientConsumer(
        conf,
        [topic],
        handler,
        retry_topics=RetryTopicPolicy(delays=(RETRY_DELAY,)),
        max_process_deaths=3,
        **common,
    )


def _consumer_child(args: dict[str, Any]) -> None:
    """A child process: the service's consumer, until it is SIGKILLed."""
    fd = os.open(args["out"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    make_consumer(args["conf"], args["topic"], Book(), args["secret"], out=fd).run()


#: A child process: a spooled producer that stores its records (``flush(0)``: stored, not
#: waited for) and is SIGKILLed at once, without close() (records possibly not delivered yet;
#: the spool holds them).
_SPOOLED_CHILD = """
import json, os, signal, sys
from kresilient import ResilientProducer, Spool
a = json.loads(sys.argv[1])
p = ResilientProducer(a["conf"], spool=Spool(a["path"]))
for value, key in a["records"]:
    p.produce(a["topic"], value.encode(), key=None if key is None else key.encode())
p.flush(0)  # stores the batch (durability "group"): the watermark of docs/durability.md
print("stored", len(a["records"]), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


class Seams(RuleBasedStateMachine):
    """Producers (plain, spooled, outbox, transactional), a consumer service with retry
    topics, dedupe, crash-loop protection and a DLQ (also keyed, also killed), a downstream
    service that forwards headers, and replay of a transactional DLQ."""

    cluster: ClassVar[KafkaCluster]
    capfd: ClassVar[Any] = None

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
        self.down_retry = f"{self.down}.retry.200ms"
        self.parts = {
            self.src: 2,
            self.src + ".dlq": 2,
            self.retry_topic: 2,
            self.down_retry: 1,
            self.down: 1,
            self.down + ".dlq": 1,
            self.txdlq: 1,
            self.replayed_to: 1,
        }
        for name, parts in self.parts.items():
            cluster.create_topic(name, partitions=parts, replication_factor=1)
        self.topics = list(self.parts)
        # Secrets every client config carries: none may leave the process anywhere.
        self.secrets = [f"S3cr3t-consumer-{tag}", f"S3cr3t-producer-{tag}"]
        self.consumer_conf = {
            "bootstrap.servers": self.bootstrap,
            "group.id": f"seams-{tag}",
            "sasl.password": self.secrets[0],
            # a killed member is out of the group after 6 s (the broker's minimum), not 45
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        }
        self.down_conf = {**self.consumer_conf, "group.id": f"seams-down-{tag}"}
        self.producer_conf = {"bootstrap.servers": self.bootstrap, "sasl.password": self.secrets[1]}
        self.logs = io.StringIO()
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            logger_factory=structlog.PrintLoggerFactory(file=self.logs),
            cache_logger_on_first_use=False,
        )
        self.output: list[str] = []  # stdout/stderr of this process and of the children
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.sent: dict[bytes, Sent] = {}
        self.aborted: set[bytes] = set()
        self.turn: Counter[str] = Counter()
        self.done: set[str] = set()
        self.book = Book()
        self.plain = ResilientProducer(self.producer_conf)
        self.txn = TransactionalProducer(self.producer_conf, transactional_id=f"seams-up-{tag}")
        self.txn_pending: list[tuple[bytes, bytes | None]] = []
        self.dir = tempfile.mkdtemp(prefix="kresilient-seams-")
        self.spool_path = os.path.join(self.dir, "spool.db")
        self.spools: list[Spool] = []
        self.spooled: list[ResilientProducer] = []
        self._open_spool(self.spool_path)
        self.outboxes: list[tuple[Any, Any, Any]] = []
        self._open_outbox()
        self.second_spool_refused = 0
        self.kills = 0
        self.replays: list[int] = []
        self.tx_committed: list[bytes] = []
        # one record of each kind through each producer, so that every example starts from
        # the whole matrix; the rules then interleave the hostile steps
        for i, kind in enumerate(KINDS):
            for via in VIAS:
                self._produce(kind, via, 0, KEYS[i % len(KEYS)])
        self._end_transaction(abort=False)
        # and an aborted upstream transaction, whose records no reader may see
        self._produce("ok", "txn", 0, KEYS[0])
        self._produce("poison", "txn", 0, KEYS[1])
        self._end_transaction(abort=True)

    def _open_spool(self, path: str) -> None:
        spool = Spool(path)
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
                    if action in self.done:
                        continue
                    if action == "forward headers downstream" and not self._consumed_once:
                        note("teardown: consume (so that a retry record exists)")
                        self.consume(1)
                    note(f"teardown: {action}")
                    self.step(action, [("ok", "plain", 0, None)], len(self.done))
                    self._check()
                # and two records through each spool and outbox, so that a second instance
                # opened by the last actions is used too
                note("teardown: two records through each spool and outbox, consume")
                self._produce("ok", "spool", 0, None)
                self._produce("ok", "spool", 0, None)
                self._produce("poison", "outbox", 0, None)
                self._produce("ok", "outbox", 0, None)
                self._consume(1)
                self._check()
        finally:
            if DUMP and hasattr(self, "logs"):
                name = os.path.join(DUMP, f"seams-{self.src}.log")
                with open(name, "w") as fh:
                    fh.write(self.logs.getvalue())
                    fh.write("\n".join(self.output))
            for producer in [*getattr(self, "spooled", []), getattr(self, "plain", None)]:
                if producer is not None:
                    producer.close()
            if getattr(self, "txn", None) is not None:
                self.txn.close()
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
        elif via == "txn":
            self.txn_pending.append((value, key))  # written by _end_transaction
        else:
            index = turn % len(self.outboxes)
            if index:
                RAN["produce via a second outbox"] += 1
            engine, table, _ = self.outboxes[index]
            with engine.begin() as conn:
                outbox.enqueue(conn, table, topic=self.src, value=value, key=key)

    def _end_transaction(self, *, abort: bool) -> None:
        """The upstream transactional producer writes what it was given in one transaction,
        committed or aborted (an aborted record must never reach a handler or a DLQ)."""
        pending, self.txn_pending = self.txn_pending, []
        if not pending:
            return
        try:
            with self.txn.transaction():
                for value, key in pending:
                    self.txn.produce(self.src, value, key=key)
                if abort:
                    raise _Abort
        except _Abort:
            RAN["upstream transaction aborted"] += 1
            for value, _ in pending:
                del self.sent[value]
                self.aborted.add(value)
        else:
            RAN["upstream transaction committed"] += 1

    @rule(
        action=st.sampled_from(ACTIONS),
        batch=st.lists(
            st.tuples(
                st.sampled_from(KINDS),
                st.sampled_from(VIAS),
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
        began = time.monotonic()
        try:
            self._step(action, batch, number)
        finally:
            SPENT[action] += time.monotonic() - began

    def _step(
        self, action: str, batch: list[tuple[str, str, int, bytes | None]], number: int
    ) -> None:
        if action == "produce":
            for kind, via, which, key in batch:
                self._produce(kind, via, which, key)
            self._end_transaction(abort=number % 4 == 0)
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
        elif action == "kill a spooled producer, reopen its spool":
            self.kill_a_spooled_producer(batch)
        elif action == "kill a consumer, restart it in its group":
            self.kill_a_consumer(batch, number)
        elif action == "consume with ordering=key":
            self.consume(1, ordering="key")
        else:
            self.consume(1 if action == "consume" else 2)

    def open_the_spool_again(self) -> None:
        """A second process or object on the same spool file (a deploy overlap, pre-fork
        workers): refused, or else both mint ids from one sequence."""
        RAN["open the spool again"] += 1
        try:
            self._open_spool(self.spool_path)
        except SpoolError:
            self.second_spool_refused += 1

    def another_outbox(self) -> None:
        RAN["another outbox"] += 1
        self._open_outbox()

    def kill_a_spooled_producer(self, batch: list[tuple[str, str, int, bytes | None]]) -> None:
        """A spooled producer stores records and is killed (SIGKILL, no flush, no close);
        the service restarts and opens the same spool file: every stored record is delivered,
        re-sent copies carry the same id, marked."""
        RAN["kill a spooled producer, reopen its spool"] += 1
        path = os.path.join(self.dir, f"spool-killed-{self.kills}.db")
        self.kills += 1
        records = []
        for kind, _, _, key in batch:
            value = f"{kind}:{uuid.uuid4().hex}".encode()
            self.sent[value] = Sent(kind, self.src, key, value)
            records.append((value.decode(), None if key is None else key.decode()))
        args = {"conf": self.producer_conf, "path": path, "topic": self.src, "records": records}
        child = subprocess.run(
            [sys.executable, "-c", _SPOOLED_CHILD, json.dumps(args)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        self.output += [child.stdout, child.stderr]
        assert child.returncode == -signal.SIGKILL and "stored" in child.stdout, (
            f"the spooled child did not store its records: rc {child.returncode}, "
            f"stderr {child.stderr[-2000:]}"
        )
        self._open_spool(path)  # the restart: re-sends what the killed one did not deliver

    def kill_a_consumer(self, batch: list[tuple[str, str, int, bytes | None]], number: int) -> None:
        """The service's consumer runs in a process that is killed (SIGKILL, no close())
        once it handled a record, then restarts in the same group: nothing was committed past
        an unhandled record, and the restart accounts for everything."""
        RAN["kill a consumer, restart it in its group"] += 1
        for kind, via, which, key in batch:
            self._produce(kind, via, which, key)
        self._produce("ok", "plain", 0, None)  # at least one record for the child to handle
        self._end_transaction(abort=False)
        self._publish()
        out = os.path.join(self.dir, f"handled-{uuid.uuid4().hex[:6]}.txt")
        args = {
            "conf": self.consumer_conf,
            "topic": self.src,
            "secret": self.secrets[0],
            "out": out,
        }
        code = (
            f"import json, sys; sys.path.insert(0, {str(HERE)!r}); "
            "import test_seams_stateful as t; t._consumer_child(json.loads(sys.argv[1]))"
        )
        logs = os.path.join(self.dir, f"child-{uuid.uuid4().hex[:6]}.log")
        with open(logs, "w") as sink:
            child = subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(args)], stdout=sink, stderr=sink
            )
            try:
                deadline = time.monotonic() + 60
                while not os.path.exists(out) or not Path(out).read_bytes():
                    assert child.poll() is None, "the consumer child died by itself"
                    assert time.monotonic() < deadline, "the consumer child handled nothing in 60 s"
                    time.sleep(0.02)
                # killed at once after its first handled record, or a little later (drawn)
                time.sleep(0.1 * (number % 4))
            finally:
                child.kill()
                child.wait(30)
        self.output.append(Path(logs).read_text(errors="replace"))
        for line in Path(out).read_bytes().splitlines():
            self.book.count(self.book.handled, line)
        self._check()  # what the killed process left committed
        self._consume(1)  # the restart, in the same group

    def forward_headers_downstream(self, pick: int) -> None:
        """A service forwards a record *with its headers* (``msg.headers()``) to the topic of
        another service, whose handler then fails on it: kresilient's retry headers came along,
        and its dead letter must still go to the downstream DLQ."""
        records = _read_all(self.bootstrap, self.retry_topic)
        if not records:
            return
        RAN["forward headers downstream"] += 1
        msg = records[pick % len(records)]
        # mostly a failure the downstream service retries (through its own retry topic, where
        # the forwarded headers once gave it the upstream coordinates), sometimes poison
        kind = "poison" if pick % 3 == 2 else "http"
        value = f"{kind}:{uuid.uuid4().hex}".encode()
        self.sent[value] = Sent(kind, self.down, msg.key(), value)
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

    def _consumer(self, conf: dict[str, Any], topic: str, ordering: str) -> Any:
        return make_consumer(
            conf,
            topic,
            self.book,
            self.secrets[0],
            ordering=ordering,
            tracer_provider=self.tracer_provider,
        )

    def _publish(self) -> None:
        self._end_transaction(abort=False)
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

    def consume(self, members: int, ordering: str = "partition") -> None:
        """Run the service (and the downstream one) until every record is accounted for."""
        RAN[f"consume with {members} member(s), ordering={ordering}"] += 1
        self._consume(members, ordering)

    def _consume(self, members: int, ordering: str = "partition") -> None:
        self._publish()
        for topic, conf, kind in (
            (self.src, self.consumer_conf, ordering),
            # the downstream service has retry topics of its own: forwarded upstream retry
            # headers must not make its records look like retries of the upstream topic
            (self.down, self.down_conf, "partition"),
        ):
            if not any(s.topic == topic for s in self.sent.values()):
                continue
            runners = [_Runner(self._consumer(conf, topic, kind))]
            try:
                deadline = time.monotonic() + DRAIN_TIMEOUT
                joined = members == 1
                while True:
                    missing, dead = self._accounted(topic)
                    # a record that must be handled (a Schema Registry outage's, a transient
                    # one's) in the DLQ: fail now, not at the drain's timeout
                    wrong = Counter(
                        s.kind
                        for m in dead
                        if (s := self.sent.get(m.value())) and s.kind not in DEAD
                    )
                    assert not wrong, (
                        f"records of {topic} that must be held and handled were dead-lettered, "
                        f"by kind: {dict(wrong)}"
                    )
                    if not missing:
                        break
                    for r in runners:
                        r.check()
                    if not joined:
                        # a second member joins mid-way: a rebalance under load
                        runners.append(_Runner(self._consumer(conf, topic, kind)))
                        joined = True
                    if time.monotonic() > deadline:
                        kinds = Counter(self.sent[v].kind for v in missing)
                        # a dead letter routed to another service's DLQ is named as such
                        astray = {
                            m.value()[:40]: f"{other}.dlq"
                            for other in (self.src, self.down)
                            if other != topic
                            for m in _read_all(self.bootstrap, other + ".dlq")
                            if m.value() in missing
                        }
                        raise AssertionError(
                            f"{len(missing)} record(s) of {topic} not accounted for (handled, "
                            f"or dead-lettered if bad) after {DRAIN_TIMEOUT:g} s, by kind: "
                            f"{dict(kinds)}"
                            + (
                                f"; dead-lettered to another topic's DLQ: {astray}"
                                if astray
                                else ""
                            )
                        )
                    time.sleep(0.2)
            finally:
                for r in runners:
                    r.stop()
        self._consumed_once = True

    # ------------------------------------------------------------------ invariants

    @invariant()
    def keeps_the_invariants(self) -> None:
        if hasattr(self, "sent"):
            self._check()

    def _check(self) -> None:
        began = time.monotonic()
        try:
            self._check_all()
        finally:
            SPENT["checks"] += time.monotonic() - began

    def _check_all(self) -> None:
        # the committed offsets first: a record below them was handled (or its dead letter,
        # or its move to a retry topic, acknowledged) before the commit, so whatever is read
        # after them cannot miss it
        committed = self._committed()
        records = _read_topics(self.bootstrap, self.topics)
        self._check_commits(committed, records)
        self._check_topics(records)
        self._check_output()

    def _groups(self) -> list[tuple[str, str, str]]:
        """(group, source topic, its retry topic) of the two services."""
        return [
            (str(self.consumer_conf["group.id"]), self.src, self.retry_topic),
            (str(self.down_conf["group.id"]), self.down, self.down_retry),
        ]

    def _committed(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for group, source, retry in self._groups():
            tps = committed_offsets(
                {"bootstrap.servers": self.bootstrap},
                group,
                [(t, p) for t in (source, retry) for p in range(self.parts[t])],
                30.0,
            )
            for tp in tps:
                out.setdefault(tp.topic, {})[tp.partition] = tp.offset
        return out

    def _check_commits(
        self, committed: dict[str, dict[int, int]], records: dict[str, list[Any]]
    ) -> None:
        """Nothing committed past an unhandled record: below each committed offset, every
        record is handled, dead-lettered or (on a source topic) moved to its retry topic."""
        with self.book.lock:
            handled = set(self.book.handled)
        for group, source, retry in self._groups():
            dead = {m.value() for m in records[source + ".dlq"]}
            moved = {m.value() for m in records[retry]}
            for topic, done in ((source, handled | dead | moved), (retry, handled | dead)):
                ends = committed.get(topic, {})
                for msg in records[topic]:
                    end = ends.get(msg.partition(), 0)
                    assert msg.offset() >= end or msg.value() in done, (
                        f"group {group} committed {topic}[{msg.partition()}] at {end}, past "
                        f"offset {msg.offset()} ({msg.value()[:40]!r}), neither handled nor "
                        f"dead-lettered{' nor moved to a retry topic' if topic == source else ''}"
                    )

    def _check_topics(self, records: dict[str, list[Any]]) -> None:
        # one id, one message: every further copy of an id is the same message, marked
        by_id: dict[bytes, list[Any]] = defaultdict(list)
        for msg in records[self.src]:
            assert msg.value() not in self.aborted, "a record of an aborted transaction is read"
            ident = _header(msg, MESSAGE_ID_HEADER)
            if ident is not None:
                by_id[ident].append(msg)
        for ident, copies in by_id.items():
            values = {m.value() for m in copies}
            assert len(values) == 1, (
                f"two distinct messages carry the message id {ident!r}: "
                f"{sorted(values)[:3]} (Deduplicator would drop one of them)"
            )
            # at most one copy unmarked (a keyless re-send may land in another partition,
            # before the first copy in (partition, offset) order)
            unmarked = [m for m in copies if _header(m, POSSIBLE_DUPLICATE_HEADER) != b"true"]
            assert len(unmarked) <= 1, (
                f"{len(unmarked)} copies of {ident!r} are not marked as possible duplicates"
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
                assert sent.kind in DEAD, (
                    f"a {sent.kind} record was dead-lettered ({msg.value()!r}, headers "
                    f"{msg.headers()})"
                )
                assert msg.key() == sent.key, f"dead letter {msg.value()!r} lost its key"
                assert _header(msg, ORIGINAL_TOPIC) == topic.encode(), (
                    f"dead letter in {topic}.dlq names original topic "
                    f"{_header(msg, ORIGINAL_TOPIC)!r}"
                )
        with self.book.lock:
            seen = set(self.book.attempts) | set(self.book.registry)
        assert not seen & self.aborted, "a record of an aborted transaction reached the service"
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

    def _check_output(self) -> None:
        if self.capfd is not None:
            out, err = self.capfd.readouterr()  # this process's fds 1 and 2, librdkafka's too
            self.output += [out, err]
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
            for chunk in self.output:
                assert secret not in chunk, f"a secret reached stdout/stderr: {chunk[-500:]!r}"


class _Abort(Exception):
    """Leaves a transaction's block: the upstream producer aborts it."""


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


def test_features_together_keep_the_invariants(
    kafka_cluster: KafkaCluster, capfd: pytest.CaptureFixture[str]
) -> None:
    Seams.cluster = kafka_cluster
    Seams.capfd = capfd
    RAN.clear()
    SPENT.clear()
    # hypothesis runs every example to stateful_step_count (it stops earlier with
    # probability 2**-16 per step, to be able to shrink the number of steps)
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
    )
    ran = dict(sorted(RAN.items()))
    print(f"seams: rules run {ran}")
    print(f"seams: seconds spent { ({k: round(v, 1) for k, v in SPENT.most_common()}) }")
    expected = {
        "open the spool again",
        "another outbox",
        "produce via a second outbox",
        "forward headers downstream",
        "transactional dead letters, replay twice",
        "consume with 2 member(s), ordering=partition",
        "consume with 1 member(s), ordering=partition",
        "consume with 1 member(s), ordering=key",
        "kill a spooled producer, reopen its spool",
        "kill a consumer, restart it in its group",
        "upstream transaction committed",
        "upstream transaction aborted",
        *(f"produce {k} via {via}" for k in KINDS for via in VIAS),
    }
    assert not expected - set(RAN), f"the run never reached {sorted(expected - set(RAN))}"
