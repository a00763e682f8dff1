"""Many records of one partition in flight, on the real cluster (issue 40).

``ResilientConsumer(ordering="key")`` hands the records of one partition to a thread pool:
per key the handling order is the offset order; the committed offset never passes an
unfinished record, the finished records above it are listed in its metadata, and the next
owner of the partition skips them. The restart test has a control with the list switched
off (``in_flight_metadata=False``): the next owner then redoes every record above the
committed offset.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Consumer, Message, TopicPartition
from test_consumer_integration import (
    Runner,
    TopicFactory,
    config,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.consumer._inflight import finished_from
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

KEYED: dict[str, Any] = {
    "ordering": "key",
    "max_process_deaths": None,
    "outage_retry": None,
    "install_signal_handlers": False,
}


def _committed(cluster: KafkaCluster, group: str, topic: str) -> tuple[int, str | None]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
    try:
        (part,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return part.offset, part.metadata
    finally:
        consumer.close()


class _Recorder:
    """Handled records by key, and the most records seen running at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[bytes | None, list[int]] = {}
        self.offsets: list[int] = []
        self.running = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def leave(self, msg: Message) -> None:
        with self.lock:
            self.running -= 1
            self.by_key.setdefault(msg.key(), []).append(msg.offset())  # type: ignore[arg-type]
            self.offsets.append(msg.offset())  # type: ignore[arg-type]


def test_key_order_is_offset_order_with_many_in_flight(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, _ = with_dlq(topic_factory)
    n, keys = 800, 40
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % keys), b"%d" % i, None, 0) for i in range(n)],
    )
    rec = _Recorder()
    gate = threading.Event()

    def handle(msg: Message) -> None:
        rec.enter()
        gate.wait(0.002 * (hash(msg.value()) % 3))  # handlers end in a different order
        rec.leave(msg)

    cfg = config(kafka_cluster)
    consumer = ResilientConsumer(cfg, [topic], handle, max_in_flight=16, **KEYED)
    runner = Runner(consumer)
    wait_for(lambda: len(rec.offsets) >= n, 120, "every record handled")
    runner.stop()
    assert runner.error is None
    assert sorted(rec.offsets) == list(range(n))  # each once
    for key, offsets in rec.by_key.items():
        assert offsets == sorted(offsets), key
    assert 1 < rec.most <= 16  # concurrent, within the window
    assert _committed(kafka_cluster, cfg["group.id"], topic)[0] == n


def _stuck_run(
    cluster: KafkaCluster,
    topic: str,
    group: str,
    *,
    stuck: set[int],
    n: int,
    metadata: bool,
) -> tuple[ResilientConsumer, threading.Event, list[int]]:
    """A consumer whose handler never returns for the offsets in ``stuck``."""
    release = threading.Event()
    handled: list[int] = []
    lock = threading.Lock()

    def handle(msg: Message) -> None:
        if msg.offset() in stuck:
            release.wait(120)
            raise RuntimeError("released at teardown")
        with lock:
            handled.append(msg.offset())  # type: ignore[arg-type]

    consumer = ResilientConsumer(
        config(cluster, group, **{"auto.commit.interval.ms": 200}),
        [topic],
        handle,
        max_in_flight=32,
        shutdown_timeout=0.5,  # the stuck records are abandoned at the stop
        in_flight_metadata=metadata,
        **KEYED,
    )
    return consumer, release, handled


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "control-bare"])
def test_commit_stops_at_an_unfinished_record_and_a_restart_redoes_only_it(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, metadata: bool
) -> None:
    topic, _ = with_dlq(topic_factory)
    n, stuck = 60, {5, 9}
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % i, b"%d" % i, None, 0) for i in range(n)],  # distinct keys
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    first, release, handled = _stuck_run(
        kafka_cluster, topic, group, stuck=stuck, n=n, metadata=metadata
    )
    runner = Runner(first)
    try:
        wait_for(lambda: len(handled) == n - len(stuck), 60, "every other record handled")

        seen: list[Any] = []

        def listed() -> bool:
            offset, meta = _committed(kafka_cluster, group, topic)
            seen[:] = [offset, meta]
            got = finished_from(meta, offset)
            return offset == 5 and (
                not metadata or (got is not None and len(got) == n - 7)
            )  # 6..59 but 9

        try:
            wait_for(listed, 60, "the commit of the lowest unfinished record")
        except AssertionError:
            raise AssertionError(f"committed {seen}") from None
        offset, meta = _committed(kafka_cluster, group, topic)
        assert offset == 5  # never past the stuck record, whatever finished above it
        got = finished_from(meta, offset)
        if metadata:
            assert got is not None and got.offsets() == [o for o in range(6, n) if o != 9]
        else:
            assert got is None
        runner.stop()  # 5 and 9 still running: abandoned after shutdown_timeout
        assert runner.error is None
        assert _committed(kafka_cluster, group, topic)[0] == 5
    finally:
        release.set()
        first.stop()  # a failed wait leaves no consumer behind

    # the next owner: handles the unfinished records (and, without the list, all above 5)
    second, release2, redone = _stuck_run(
        kafka_cluster, topic, group, stuck=set(), n=n, metadata=metadata
    )
    expected = sorted(stuck) if metadata else list(range(5, n))
    runner2 = Runner(second)
    try:
        wait_for(lambda: len(redone) >= len(expected), 60, "the redo")
        wait_for(lambda: _committed(kafka_cluster, group, topic)[0] == n, 60, "the end commit")
        runner2.stop()
    finally:
        release2.set()
        second.stop()
    assert runner2.error is None
    assert sorted(redone) == expected


def test_a_retrying_key_blocks_only_itself_and_poison_is_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, dlq = with_dlq(topic_factory)
    n = 200
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % 10), b"poison" if i == 30 else b"%d" % i, None, 0) for i in range(n)],
    )
    flaky_failures: list[int] = []
    rec = _Recorder()

    def handle(msg: Message) -> None:
        if msg.value() == b"poison":
            raise ValueError("not a number")  # not retried: dead-lettered at once
        if msg.offset() == 3 and len(flaky_failures) < 2:
            flaky_failures.append(3)
            raise ConnectionError("flaky")  # retried twice, then handled
        rec.enter()
        rec.leave(msg)

    cfg = config(kafka_cluster)
    consumer = ResilientConsumer(
        cfg,
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_fixed(0.3)),
        max_in_flight=8,
        **KEYED,
    )
    runner = Runner(consumer)
    wait_for(lambda: len(rec.offsets) >= n - 1, 60, "every record but the poison handled")
    wait_for(lambda: consumer.health().dead_lettered == 1, 30, "the dead letter acknowledged")
    runner.stop()
    assert runner.error is None
    assert flaky_failures == [3, 3]
    for key, offsets in rec.by_key.items():
        assert offsets == sorted(offsets), key
    # key k3 waited behind its retrying record; the other keys did not: some of their
    # records later than 3 were handled before 3 was
    assert rec.offsets.index(3) > rec.offsets.index(4)
    letters = read_back(kafka_cluster.bootstrap_servers, dlq)
    assert [m.value() for m in letters] == [b"poison"]
    assert _committed(kafka_cluster, cfg["group.id"], topic)[0] == n


def test_orderings_refuse_what_they_do_not_combine_with_yet(
    kafka_cluster: KafkaCluster,
) -> None:
    cfg = config(kafka_cluster)
    with pytest.raises(ConfigError, match='trace_spans="call"'):
        ResilientConsumer(cfg, ["t"], print, ordering="key", trace_spans="call")
    with pytest.raises(ConfigError, match="ordering must be one of"):
        ResilientConsumer(cfg, ["t"], print, ordering="keys")  # type: ignore[arg-type]


def test_the_keyed_example_keeps_each_accounts_order(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """examples/consumer_keyed.py's consumer, on the session cluster."""
    path = Path(__file__).resolve().parent.parent / "examples" / "consumer_keyed.py"
    spec = importlib.util.spec_from_file_location("consumer_keyed", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    topic, _ = with_dlq(topic_factory)
    example.produce(kafka_cluster.bootstrap_servers, topic)
    seen = example.consume(kafka_cluster.bootstrap_servers, topic)
    assert sum(map(len, seen.values())) == example.EVENTS
    assert all(offsets == sorted(offsets) for offsets in seen.values())


def test_key_order_holds_across_a_member_joining_and_leaving(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Acceptance 2 (rebalance half): a second member joins, then leaves, mid-stream."""
    topic, _ = with_dlq(topic_factory, partitions=4)
    n, keys = 6000, 50
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % keys), b"%d" % i, None, None) for i in range(n)],
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    lock = threading.Lock()
    order: dict[tuple[int, bytes | None], list[int]] = {}
    handled = {"a": 0, "b": 0}
    gate = threading.Event()

    def handler(member: str) -> Any:
        def handle(msg: Message) -> None:
            gate.wait(0.01)  # slow enough for the rebalances to land mid-stream
            with lock:
                key = (msg.partition() or 0, msg.key())
                order.setdefault(key, []).append(msg.offset())  # type: ignore[arg-type]
                handled[member] += 1

        return handle

    def member(name: str) -> ResilientConsumer:
        return ResilientConsumer(
            config(kafka_cluster, group), [topic], handler(name), max_in_flight=4, **KEYED
        )

    a, b = member("a"), member("b")
    run_a = Runner(a)
    try:
        wait_for(lambda: handled["a"] >= 500, 60, "member A to start")
        run_b = Runner(b)
        try:
            wait_for(lambda: handled["b"] >= 300, 60, "member B to get partitions")
        finally:
            run_b.stop()  # B leaves: A takes its partitions back
        assert run_b.error is None
        wait_for(lambda: sum(map(len, order.values())) >= n, 120, "every record handled")
    finally:
        run_a.stop()
    assert run_a.error is None
    assert a.health().rebalances["revoked"] >= 1 or b.health().rebalances["assigned"] >= 1
    everything = sorted(o for (p, _), offsets in order.items() for o in set(offsets))
    assert len(everything) == n  # every record (each partition's offsets are distinct)
    failures = a.health().commit_failures + b.health().commit_failures
    for key, offsets in order.items():
        # per key, handling order == offset order across both members; a record handled
        # twice (only after a failed commit) comes again in its key's order
        firsts = list(dict.fromkeys(offsets))
        assert firsts == sorted(firsts), key
        assert offsets == firsts or failures > 0, key


_WORKER = """
import os, sys, time
from kresilient.consumer import ResilientConsumer
bootstrap, topic, group, out, metadata = sys.argv[1:6]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def handle(msg):
    time.sleep(1.0 if msg.offset() % 97 == 0 else 0.01)  # a few slow records hold the offset
    os.write(fd, b"%d\\n" % msg.offset())

# group.instance.id (static membership): the restarted process takes the SIGKILLed one's
# place at once, where a new member waited out the dead one's session (6 s) at each of the 6
# starts; what it resumes from (the committed offset and its metadata) is the same.
ResilientConsumer(
    {"bootstrap.servers": bootstrap, "group.id": group, "auto.commit.interval.ms": 100,
     "session.timeout.ms": 6000, "group.instance.id": "worker"},
    [topic], handle, ordering="key", max_in_flight=64, in_flight_metadata=metadata == "1",
    max_process_deaths=None, outage_retry=None, install_signal_handlers=False,
).run()
"""


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "control-bare"])
def test_sigkill_redoes_only_records_not_listed_as_finished(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, metadata: bool
) -> None:
    """Acceptance 3, reduced: SIGKILL the consumer process 5 times with 64 in flight. After
    each kill, the records handled again are only records at or above the committed offset
    that its metadata does not list as finished; at the end none was never handled. The
    control (list off) redoes finished records above the committed offset too."""
    topic, _ = with_dlq(topic_factory)
    n = 3000
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % 300), b"%d" % i, None, 0) for i in range(n)],
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"
    out.touch()
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)

    def lines() -> list[int]:
        return [int(x) for x in out.read_text().split()]

    def start() -> subprocess.Popen[bytes]:
        args = [kafka_cluster.bootstrap_servers, topic, group, str(out), "1" if metadata else "0"]
        return subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    listed_total = 0
    saved_by_a_list = 0  # control: redone records a list would have skipped
    last: tuple[set[int], int, Any, int] | None = None  # at the previous kill
    for _run in range(6):  # 5 kills, each judged by the run after it
        mark = len(lines())
        proc = start()
        try:
            wait_for(lambda m=mark: len(lines()) >= m + 250, 90, "the worker's progress")
        finally:
            proc.kill()  # SIGKILL, 64 records in flight
            proc.wait(30)
        if last is not None:
            handled, offset, listed, since = last
            redone = {o for o in lines()[since:] if o in handled}
            for o in redone:
                assert o >= offset, (o, offset)  # never a record below the committed offset
                assert listed is None or o not in listed, o  # never one listed as finished
            if not metadata:
                saved_by_a_list += sum(1 for o in redone if o > offset)
        offset, meta = _committed(kafka_cluster, group, topic)
        listed = finished_from(meta, offset)
        listed_total += len(listed) if listed is not None else 0
        if last is not None and last[2] is not None and offset == last[1]:
            # the same committed offset: what was listed is still finished, still listed
            # (also the records the restarted member had not fetched again when it died)
            assert listed is not None and set(last[2].offsets()) <= set(listed.offsets())
        last = (set(lines()), offset, listed, len(lines()))
    proc = start()
    try:
        wait_for(lambda: set(lines()) >= set(range(n)), 120, "every record handled")
    finally:
        proc.kill()
        proc.wait(30)
    assert set(lines()) == set(range(n))  # 0 records never handled
    if metadata:
        assert listed_total > 0  # the lists were written (and honoured above)
    else:
        assert listed_total == 0 and saved_by_a_list > 0
