"""One dead letter per poison record in a share group: the cases review13 broke (issue 43).

One 1-node cluster on Kafka 4.2+ (share groups GA) with ``network_faults=True``, for this module
only: the dead-letter writer's connection is frozen (a hung connection, librdkafka #5153) so a
dead letter is still in flight when its record's lock ends.

* a dead letter in flight at the lock's end: the record is not RELEASEd early and its next
  delivery writes no second dead letter (control: the same without the fault);
* a record fetched in the background and handed out after its lock expired (delivery count 1)
  while another member dead-lettered it: no second dead letter;
* several dead-letter topics: ``require_topic`` is enforced at start; with it off, one missing
  topic does not stop the index for the others;
* a dead-letter topic the member may not read (the error path, no cluster);
* configuration refused without a cluster: regex topics, a lookback of inf/nan.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    KafkaError,
    Message,
    Producer,
    ShareConsumer,
)

from kresilient.deadletter import (
    CONSUMER_GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
    DeadLetterPolicy,
    build_dead_letter_record,
)
from kresilient.errors import ConfigError
from kresilient.pytest_plugin import session_kafka_version
from kresilient.share import ResilientShareConsumer, configure_share_group
from kresilient.share._deadletters import DeadLetterIndex
from kresilient.testing import KafkaCluster

NEWEST = "4.4.0"


def _share_version() -> str:
    asked = session_kafka_version()
    major_minor = tuple(int(p) for p in asked.split(".")[:2] if p.isdigit())
    return asked if major_minor >= (4, 2) else NEWEST


@pytest.fixture(name="cluster", scope="module")
def _cluster() -> Iterator[KafkaCluster]:
    with KafkaCluster(
        1,
        version=_share_version(),
        network_faults=True,
        broker_config={
            "group.share.min.record.lock.duration.ms": 1000,
            "group.share.session.timeout.ms": 10000,
            "group.share.min.session.timeout.ms": 6000,
            "group.share.heartbeat.interval.ms": 1000,
            "group.share.min.heartbeat.interval.ms": 500,
        },
    ) as cluster:
        yield cluster


def _wait(
    cond: Callable[[], bool], what: str, step: Callable[[], object], timeout: float = 90.0
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        step()


def _group(cluster: KafkaCluster, prefix: str, lock_ms: int) -> str:
    group = f"{prefix}-{uuid.uuid4().hex[:8]}"
    configure_share_group(
        {"bootstrap.servers": cluster.bootstrap_servers},
        group,
        {"share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": lock_ms},
    )
    return group


def _produce(cluster: KafkaCluster, topic: str, key: bytes, value: bytes) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    p.produce(topic, value, key)
    assert p.flush(30) == 0


def _dead_letters(cluster: KafkaCluster, topic: str) -> Counter[bytes]:
    """The values in ``topic``, counted (read to its end: nothing in flight any more)."""
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"dlq-reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    c.subscribe([topic])
    out: Counter[bytes] = Counter()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == -191 and c.assignment():  # _PARTITION_EOF
                    break
                continue
            out[m.value() or b""] += 1
    finally:
        c.close()
    return out


def _poisoned(calls: list[tuple[str, bytes, int]], name: str) -> Callable[[Message], None]:
    def handle(msg: Message) -> None:
        calls.append((name, msg.key() or b"", msg.delivery_count() or 0))
        raise ValueError("poison")

    return handle


# --------------------------------------------------------------------------- in flight


@pytest.mark.parametrize("frozen", [True, False], ids=["writer-frozen", "control"])
def test_dead_letter_in_flight_at_the_lock_end_is_not_written_twice(
    cluster: KafkaCluster, frozen: bool
) -> None:
    """review13 finding 1: the writer's connection hangs, so the dead letter of ``x`` is still
    in flight when its lock ends. It is not RELEASEd early, and its next delivery (to this
    member) waits for that dead letter instead of writing a second one; once the connection
    heals the dead letter lands and the record is ACCEPTed, counted once. Control: without the
    fault, one delivery and one dead letter."""
    topic = cluster.create_topic(f"share-fly-{uuid.uuid4().hex[:6]}", 1, 1)
    cluster.create_topic(topic + ".dlq", 1, 1)
    group = _group(cluster, "fly", 4000)
    client_id = f"fly-{uuid.uuid4().hex[:6]}"
    calls: list[tuple[str, bytes, int]] = []
    consumer = ResilientShareConsumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group, "client.id": client_id},
        [topic],
        _poisoned(calls, "A"),
    )
    writer = consumer._writer
    assert writer is not None
    pending_seen: list[int] = []
    healed = threading.Event()

    def watch() -> None:  # heal once x was delivered again with its dead letter pending
        while not healed.is_set():
            if sum(1 for c in calls if c[1] == b"x") >= 2:
                pending_seen.append(writer.pending)
                cluster.network.heal()
                healed.set()
                return
            time.sleep(0.01)

    try:
        _produce(cluster, topic, b"warm", b"poison-warm")  # the writer connects
        _wait(
            lambda: consumer.stats.dead_lettered == 1, "the warm-up dead letter", consumer.poll_once
        )
        watcher = threading.Thread(target=watch, daemon=True)
        if frozen:
            assert cluster.network.freeze_connections(client_id=f"{client_id}-dlq") >= 1
            watcher.start()
        _produce(cluster, topic, b"x", b"poison-x")
        _wait(lambda: consumer.stats.dead_lettered == 2, "x dead-lettered", consumer.poll_once)
    finally:
        healed.set()
        cluster.network.heal()
        consumer.close()
    dlq = _dead_letters(cluster, topic + ".dlq")
    assert dlq == Counter({b"poison-warm": 1, b"poison-x": 1}), dlq
    stats = consumer.stats
    x_calls = [c[2] for c in calls if c[1] == b"x"]
    if frozen:
        # the fault was real: x's dead letter was pending when x came back
        assert pending_seen and pending_seen[0] >= 1, pending_seen
        assert x_calls[:2] == [1, 2], calls
        assert stats.dead_letters_in_flight >= 1
    else:
        assert x_calls == [1], calls
        assert stats.dead_letters_in_flight == 0
    assert stats.dead_letters_unconfirmed == 0
    assert stats.dead_lettered == 2  # x counted once


# --------------------------------------------------------------------------- stale record


class _Prefetching:
    """A share consumer whose poll keeps what the broker handed it for a later poll call: the
    records a fetch acquired during one call and librdkafka hands out at the next (review13
    probe p6 saw it happen on its own; here it happens at a known point)."""

    def __init__(self, real: ShareConsumer) -> None:
        self._real = real
        self.held: list[Message] = []
        self.holding = True

    def poll(self, timeout: float) -> list[Message]:
        if self.holding:
            self.held += self._real.poll(timeout)
            return []
        out, self.held = self.held, []
        return out

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def test_stale_background_record_is_not_dead_lettered_twice(cluster: KafkaCluster) -> None:
    """review13 finding 2 (no fault): member B's fetch acquires ``x`` during one poll call that
    hands it nothing, then B is busy longer than the lock; the lock expires, A gets ``x``
    (delivery 2) and dead-letters it; B's next poll hands it the stale ``x``, with delivery
    count 1. B writes no second dead letter: its index question reads the high watermarks
    after this poll returned (A's dead letter was acknowledged before that), finds A's dead
    letter and ACCEPTs x (refused or a no-op at the broker) instead of writing one."""
    topic = cluster.create_topic(f"share-stale-{uuid.uuid4().hex[:6]}", 1, 1)
    cluster.create_topic(topic + ".dlq", 1, 1)
    group = _group(cluster, "stale", 3000)
    calls: list[tuple[str, bytes, int]] = []
    base = {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group}
    b = ResilientShareConsumer({**base, "client.id": "B"}, [topic], _poisoned(calls, "B"))
    fetch = _Prefetching(b._consumer)
    b._consumer = fetch  # type: ignore[assignment]
    a = ResilientShareConsumer({**base, "client.id": "A"}, [topic], _poisoned(calls, "A"))
    try:
        _produce(cluster, topic, b"x", b"poison-x")
        _wait(lambda: bool(fetch.held), "B acquires x", lambda: b.poll_once(0.3))
        _wait(
            lambda: a.stats.dead_lettered + a.stats.dead_letters_found > 0,
            "A settles x after B's lock",
            lambda: a.poll_once(0.3),
        )
        fetch.holding = False
        assert b.poll_once(0.3) == 1  # the stale x
    finally:
        b.close()
        a.close()
    assert calls == [("A", b"x", 2), ("B", b"x", 1)], calls
    dlq = _dead_letters(cluster, topic + ".dlq")
    assert dlq == Counter({b"poison-x": 1}), (dlq, calls)
    assert b.stats.dead_lettered == 0, (b.stats, calls)
    assert b.stats.dead_letters_found == 1, (b.stats, calls)


# --------------------------------------------------------------------------- several topics


def _die_after_dead_letter(cluster: KafkaCluster, group: str, topic: str) -> None:
    """A member that writes a record's dead letter (acknowledged) and dies before its ACCEPT:
    a raw ShareConsumer that RELEASEs it instead."""
    sc = ShareConsumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    sc.subscribe([topic])
    got: list[Message] = []
    deadline = time.monotonic() + 60
    while not got:
        assert time.monotonic() < deadline, "the record was not delivered"
        got = [m for m in sc.poll(0.5) if m.error() is None]
    rec = build_dead_letter_record(
        got[0], policy=DeadLetterPolicy(), group=group, exc=ValueError("poison"), attempts=1
    )
    p = Producer({"bootstrap.servers": cluster.bootstrap_servers, "acks": "all"})
    p.produce(rec.topic, rec.value, rec.key, headers=list(rec.headers))
    assert p.flush(30) == 0
    for m in got:
        sc.acknowledge(m, AcknowledgeType.RELEASE)
    sc.commit_sync(10)
    sc.close()


def test_missing_dead_letter_topic_is_refused_at_start_and_does_not_stop_the_others(
    cluster: KafkaCluster,
) -> None:
    """review13 finding 3: ``require_topic`` (the default) refuses a missing dead-letter topic
    at start, naming it. With it off, the missing topic is waited for on its own: a record of
    the other topic whose dead letter another member wrote before dying is found (one dead
    letter), and health() names the topic waited for."""
    prefix = f"share-topics-{uuid.uuid4().hex[:6]}"
    topic = cluster.create_topic(prefix + "-a", 1, 1)
    cluster.create_topic(topic + ".dlq", 1, 1)
    other = cluster.create_topic(prefix + "-other", 1, 1)  # its .dlq does not exist
    group = _group(cluster, "topics", 6000)
    config = {"bootstrap.servers": cluster.bootstrap_servers, "group.id": group}
    with pytest.raises(ConfigError, match=rf"\['{other}.dlq'\] do not exist"):
        ResilientShareConsumer(config, [topic, other], print)
    _produce(cluster, topic, b"r", b"poison-r")
    _die_after_dead_letter(cluster, group, topic)
    calls: list[tuple[str, bytes, int]] = []
    consumer = ResilientShareConsumer(
        config,
        [topic, other],
        _poisoned(calls, "B"),
        dead_letter=DeadLetterPolicy(require_topic=False),
    )
    try:
        stats = consumer.stats
        _wait(
            lambda: stats.dead_letters_found + stats.dead_lettered > 0,
            "the record delivered again",
            lambda: consumer.poll_once(0.5),
        )
        index = consumer.health()["dead_letter_index"]
    finally:
        consumer.close()
    assert (stats.dead_letters_found, stats.dead_lettered) == (1, 0), (stats, calls)
    assert stats.dead_letters_unconfirmed == 0
    assert index["topics"][topic + ".dlq"] == "reading", index
    assert index["topics"][other + ".dlq"].startswith("waiting"), index
    assert index["state"] == "waiting"
    assert _dead_letters(cluster, topic + ".dlq") == Counter({b"poison-r": 1})


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("lookback", [float("inf"), float("nan"), -1.0])
def test_lookback_must_be_finite_seconds(lookback: float) -> None:
    cfg = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}
    with pytest.raises(ConfigError, match="dead_letter_lookback_s") as exc:
        ResilientShareConsumer(cfg, ["t"], print, dead_letter_lookback_s=lookback)
    assert exc.value.key == "dead_letter_lookback_s"


def test_regex_subscription_is_refused_naming_it() -> None:
    cfg = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}
    with pytest.raises(ConfigError, match=r"\^jobs-.\*") as exc:
        ResilientShareConsumer(cfg, ["^jobs-.*"], print)
    assert exc.value.key == "topics"


class _Log:
    """A logger keeping (level, event, fields)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, object]]] = []

    def __getattr__(self, level: str) -> Callable[..., None]:
        def log(event: str, **fields: object) -> None:
            self.events.append((level, event, fields))

        return log


def test_a_dead_letter_topic_the_member_may_not_read_is_reported_and_answered_unknown() -> None:
    """review13 finding 4, the error path (no cluster): the reader's fetch of a dead-letter
    topic refused for authorization (the member may WRITE it, not READ it) is reported once
    as a WARNING naming the topic and the missing ACL, shown in the index's state, and every
    lookup is answered ``None`` (unknown: the dead letter is written, counted unconfirmed) at
    once instead of waiting. A real SASL_SSL cluster with ACLs gave the same (probe p5 of
    review13 on this code: state ``refused``, found 0, unconfirmed 1; READ granted: found 1).
    """
    log = _Log()
    index = DeadLetterIndex(
        {"bootstrap.servers": "127.0.0.1:9"},
        ["jobs.dlq", "other.dlq"],
        "g",
        client_id="acl-test",
        log=log,
        redact=str,
    )
    index.start()
    try:
        # a client error that names no topic is kept, and refuses nothing (review14 F6: it
        # refused every topic); the real refusal of one topic's fetch is a message of that
        # partition (the real-cluster test of it is in tests/test_security.py)
        vague = KafkaError(
            KafkaError.TOPIC_AUTHORIZATION_FAILED, "Fetch from broker 1 failed: Topic authorization"
        )
        index._on_error(vague)
        assert not any(s.startswith("refused") for s in index.state()["topics"].values())
        refused = KafkaError(
            KafkaError.TOPIC_AUTHORIZATION_FAILED, "jobs.dlq [0]: Topic authorization failed"
        )
        index._on_error(refused)
        index._on_error(refused)  # reported once
        key = ("jobs", 0, 7, 1700000000000, hash(b"v"))
        assert index.contains(key, 60.0, since=time.monotonic(), topic="jobs.dlq") is None
        state = index.state()
    finally:
        index.close()
    assert not state["topics"]["other.dlq"].startswith("refused"), state
    assert state["state"] == "refused", state
    assert state["topics"]["jobs.dlq"].startswith("refused: "), state
    assert "TOPIC_AUTHORIZATION_FAILED" in str(state["error"])
    warnings = [e for e in log.events if e[1] == "share_dead_letter_index_refused"]
    assert len(warnings) == 1, log.events
    level, _event, fields = warnings[0]
    assert level == "warning"
    assert fields["topic"] == "jobs.dlq"
    assert "READ" in str(fields["remedy"])


class _Letter:
    """A dead letter as the reader sees it: kresilient's header block for group ``g``."""

    def __init__(self, offset: int, written_ms: int, original_offset: int) -> None:
        self._offset, self._ts = offset, written_ms
        self._headers = [
            (ORIGINAL_TOPIC, b"jobs"),
            (ORIGINAL_PARTITION, b"0"),
            (ORIGINAL_OFFSET, str(original_offset).encode()),
            (ORIGINAL_TIMESTAMP, b"1700000000000"),
            (CONSUMER_GROUP, b"g"),
        ]

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def value(self) -> bytes:
        return b"v"

    def topic(self) -> str:
        return "jobs.dlq"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)


def test_index_forgets_dead_letters_older_than_lookback_and_the_delivery_window() -> None:
    """review13 findings 6-7: a long-running member no longer keeps every dead letter it ever
    read (memory, and an earlier run's dead letters passing for this run's): one written
    longer ago than ``lookback_s + keep_s`` (the delivery-count limit times the lock: no
    delivery of its record can still be pending) is forgotten; a recent one is kept."""
    index = DeadLetterIndex(
        {"bootstrap.servers": "127.0.0.1:9"},
        ["jobs.dlq"],
        "g",
        client_id="age-test",
        log=_Log(),
        redact=str,
        lookback_s=60.0,
        keep_s=30.0,
    )
    now = int(time.time() * 1000)
    index._add(_Letter(0, now - 3_600_000, original_offset=1))  # type: ignore[arg-type]
    index._add(_Letter(1, now - 1_000, original_offset=2))  # type: ignore[arg-type]

    def key(original_offset: int) -> tuple[str, int, int, int, int]:
        return ("jobs", 0, original_offset, 1700000000000, hash(b"v"))

    assert index.contains(key(2), 0.0, since=0.0, topic="jobs.dlq") is True
    assert index.contains(key(1), 0.0, since=0.0, topic="jobs.dlq") is not True
    assert index.state()["entries"] == 1
