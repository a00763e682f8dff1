"""Crash-loop protection (issue 17, item 2), real cluster, consumer processes.

A handler calls ``os._exit(1)`` on one record (a crash no Python code sees). A supervisor loop
restarts the consumer process (tests/consumer_worker.py, static group membership like a
restarted pod) until it stops dying: with the default ``max_process_deaths=3`` the record is
dead-lettered (``kresilient.error.category=crash_loop``) after exactly 3 deaths, and every
other record is handled. The negative control runs the same supervisor with the protection
off: the process dies on every start and nothing after the record is ever handled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from _producer_helpers import read_back
from test_consumer_integration import TopicFactory, committed, produce, with_dlq

from kresilient.consumer._crashloop import CLEAN, parse_marker
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("consumer_worker.py")
N = 40
DIE_AT = 17


def _values() -> list[bytes]:
    return [b"die" if i == DIE_AT else b"v%d" % i for i in range(N)]


def _handled(out: Path) -> list[tuple[str, int]]:
    if not out.exists():
        return []
    lines = out.read_bytes().splitlines()
    return [
        (ln.split()[0].decode(), int(ln.split()[2])) for ln in lines if ln.startswith(b"died")
    ] + [("ok", int(ln.split()[1])) for ln in lines if not ln.startswith(b"died")]


def _supervise(
    bootstrap: str, topic: str, group: str, out: Path, max_deaths: int, max_starts: int
) -> tuple[int, bool]:
    """Restart the worker until it handles every other record (then SIGTERM) or
    ``max_starts`` starts. Returns (deaths, finished)."""
    deaths = 0
    wanted = {i for i in range(N) if i != DIE_AT}
    for _ in range(max_starts):
        proc = subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--group",
                group,
                "--out",
                str(out),
                "--die-on",
                "die",
                "--max-process-deaths",
                str(max_deaths),
                "--instance-id",
                f"{group}-pod-0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if wanted <= {o for kind, o in _handled(out) if kind == "ok"}:
                    proc.send_signal(signal.SIGTERM)
                    assert proc.wait(30) == 0
                    return deaths, True
                time.sleep(0.1)  # polling the worker's output file, not settling
            else:
                raise AssertionError("worker neither died nor finished within 60 s")
            assert proc.returncode == 1, proc.returncode
            deaths += 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return deaths, False


def test_record_killing_the_process_is_dead_lettered_after_max_process_deaths(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(
        bootstrap, topic, [(b"k%d" % i, v, [("h", b"%d" % i)], 0) for i, v in enumerate(_values())]
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"

    deaths, finished = _supervise(bootstrap, topic, group, out, max_deaths=3, max_starts=8)

    assert finished
    assert deaths == 3
    handled = _handled(out)
    assert [o for kind, o in handled if kind == "died"] == [DIE_AT] * 3
    ok = {o for kind, o in handled if kind == "ok"}
    assert ok == {i for i in range(N) if i != DIE_AT}  # nothing else skipped
    (record,) = read_back(bootstrap, dlq)
    assert (record.key(), record.value()) == (b"k%d" % DIE_AT, b"die")
    headers = list(record.headers() or [])
    assert headers[0] == ("h", b"%d" % DIE_AT)  # original headers first, byte for byte
    info = dict(headers)
    assert info["kresilient.error.category"] == b"crash_loop"
    assert info["kresilient.attempts"] == b"3"
    assert parse_dead_letter_headers(headers).original_offset == DIE_AT
    # the clean stop committed everything with the clean-end marker
    assert committed(bootstrap, group, topic, [0]) == {0: N}
    assert _marker(bootstrap, group, topic) == CLEAN


def test_negative_control_without_protection_the_partition_stalls(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """max_process_deaths=None: every start dies on the same record, nothing after it is ever
    handled and nothing is dead-lettered (the fault above is real)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k%d" % i, v, None, 0) for i, v in enumerate(_values())])
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"

    deaths, finished = _supervise(bootstrap, topic, group, out, max_deaths=0, max_starts=4)

    assert (deaths, finished) == (4, False)
    assert max(o for kind, o in _handled(out) if kind == "ok") < DIE_AT
    assert read_back(bootstrap, dlq) == []


def _marker(bootstrap: str, group: str, topic: str) -> str | None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
        return tp.metadata
    finally:
        c.close()


def test_a_partition_without_records_does_not_keep_every_record_behind_the_guard(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Both partitions were committed without the clean marker (the previous owner died), so
    both are probed; partition 1 never gets records and stays probed. Records of partition 0
    are handled without the guard once its own probe is over: the guard is for batches holding
    records of a probed (or seeded) partition, not for the consumer's whole life. Control in
    the same run: the first record of partition 0 (probed) does go through the guard."""
    import threading

    from test_consumer_integration import Runner, config, wait_for

    from kresilient import ResilientConsumer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    _commit_unclean(bootstrap, group, topic, [0, 1])
    callers: list[tuple[int, str]] = []
    first_wave = threading.Event()

    def handle(msg: Any) -> None:
        callers.append((msg.offset(), sys._getframe(1).f_code.co_name))
        if len(callers) == 10:
            first_wave.set()

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        crash_probe_records=5,
        install_signal_handlers=False,
    )
    produce(bootstrap, topic, [(None, b"a%d" % i, None, 0) for i in range(10)])
    runner = Runner(consumer)
    try:
        wait_for(first_wave.is_set, 120, "the first 10 records")
        # a later batch: partition 1 (no records, committed without the marker) is still probed
        produce(bootstrap, topic, [(None, b"b%d" % i, None, 0) for i in range(10)])
        wait_for(lambda: len(callers) >= 20, 120, "the next 10 records")
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert callers[0] == (0, "guarded")  # control: the probed partition's first record
    later = [name for offset, name in callers if offset >= 10]
    assert len(later) == 10
    assert "guarded" not in later, callers


def _commit_unclean(bootstrap: str, group: str, topic: str, partitions: list[int]) -> None:
    """Commit ``group`` at offset 0 without any marker, as a member that died leaves it."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p, 0) for p in partitions]
        assert all(p.error is None for p in c.commit(offsets=parts, asynchronous=False) or [])
    finally:
        c.close()


# --------------------------------------------------------------------------- the seed


def _committed_parts(bootstrap: str, group: str, topic: str, n: int) -> dict[int, tuple[int, str]]:
    """The broker's committed (offset, metadata) of every partition of ``topic`` for ``group``."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(n)], timeout=30)
        return {tp.partition: (tp.offset, tp.metadata or "") for tp in got}
    finally:
        c.close()


class _Commits:
    """The synchronous commits a ResilientConsumer's librdkafka consumer made, in order, as
    lists of (topic, partition, offset, metadata); ``fail_offsets`` makes its look-up of the
    partitions' start offsets fail (an injected fault at the client boundary)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, fail_offsets: bool = False) -> None:
        from confluent_kafka import Consumer, KafkaError, KafkaException

        self.sync: list[list[tuple[str, int, int, str | None]]] = []
        sync = self.sync

        class Counting(Consumer):  # type: ignore[misc]
            def commit(self, *args: Any, **kwargs: Any) -> Any:
                offsets = kwargs.get("offsets")
                if not kwargs.get("asynchronous", True) and offsets:
                    sync.append([(p.topic, p.partition, p.offset, p.metadata) for p in offsets])
                return super().commit(*args, **kwargs)

            def offsets_for_times(self, *args: Any, **kwargs: Any) -> Any:
                if fail_offsets:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "injected"))
                return super().offsets_for_times(*args, **kwargs)

        monkeypatch.setattr("kresilient.consumer._consumer.Consumer", Counting)


@pytest.mark.parametrize("deaths", [3, None], ids=["protected", "control-unprotected"])
def test_a_new_group_is_seeded_with_one_commit_before_its_first_record(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
    deaths: int | None,
) -> None:
    """A new group on 6 partitions (partition 0's log starts at 1: its first record was
    deleted). Before the handler sees the first record, ONE synchronous commit has carried
    every partition, without the clean marker, at the offset the partition starts from; the
    broker holds all six. Every record is then handled from there (the seed moved no start).
    Control: without crash-loop protection nothing is committed before the first record."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient
    from test_consumer_integration import Runner, config, wait_for

    from kresilient import ResilientConsumer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory, partitions=6)
    produce(bootstrap, topic, [(None, b"v%d" % i, None, i % 6) for i in range(18)])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until it has answered
    (deleted,) = admin.delete_records([TopicPartition(topic, 0, 1)]).values()
    deleted.result(60)
    starts = {0: 1, **{p: 0 for p in range(1, 6)}}
    group = f"g-{uuid.uuid4().hex[:10]}"
    commits = _Commits(monkeypatch)
    seen: list[tuple[int, int]] = []
    at_first: dict[str, Any] = {}

    def handle(msg: Any) -> None:
        if not seen:  # what the broker holds when the first record is handed over
            at_first["sync"] = [list(c) for c in commits.sync]
            at_first["broker"] = _committed_parts(bootstrap, group, topic, 6)
        seen.append((msg.partition(), msg.offset()))

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        max_process_deaths=deaths,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: len(seen) >= 17, 120, "every record")
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert sorted(seen) == [(p, o) for p in range(6) for o in range(starts[p], 3)]
    if deaths is None:
        assert at_first["sync"] == []
        assert {o for o, _ in at_first["broker"].values()} == {-1001}  # nothing committed
        return
    seed = "kresilient.v1 {}"
    (one,) = at_first["sync"]  # ONE synchronous commit before the first record
    assert sorted(one) == [(topic, p, starts[p], seed) for p in range(6)]
    assert at_first["broker"] == {p: (starts[p], seed) for p in range(6)}
    assert parse_marker(seed) is not None and not parse_marker(seed).clean  # type: ignore[union-attr]


def test_a_new_group_whose_start_offsets_are_unknown_is_seeded_per_partition_injected(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look-up of the start offsets fails (injected at the client: a broker answers it
    whenever it is up). The guard falls back to seeding each partition at its first record:
    when a partition's first record is handled, the broker holds that record's offset without
    the clean marker for it. Control in the same run: the one-commit seed was not made."""
    from test_consumer_integration import Runner, config, wait_for

    from kresilient import ResilientConsumer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory, partitions=2)
    produce(bootstrap, topic, [(None, b"v%d" % i, None, i % 2) for i in range(6)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    commits = _Commits(monkeypatch, fail_offsets=True)
    at_first: dict[int, tuple[int, str]] = {}
    seen: list[int] = []

    def handle(msg: Any) -> None:
        p = msg.partition()
        if p not in at_first:
            at_first[p] = _committed_parts(bootstrap, group, topic, 2)[p]
        seen.append(p)

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: len(seen) >= 6, 120, "every record")
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert at_first == {0: (0, "kresilient.v1 {}"), 1: (0, "kresilient.v1 {}")}
    seeds = [c for c in commits.sync if c[0][3] == "kresilient.v1 {}"]
    assert sorted(seeds) == [
        [(topic, 0, 0, "kresilient.v1 {}")],
        [(topic, 1, 0, "kresilient.v1 {}")],
    ]


_BLOCKING_WORKER = r"""
import os, sys, threading
from kresilient.consumer import ResilientConsumer

bootstrap, topic, group, out, deaths = sys.argv[1:6]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def handle(msg):
    os.write(fd, b"call %d %d\n" % (msg.partition(), msg.offset()))
    threading.Event().wait()  # in flight until the process is killed

ResilientConsumer(
    {"bootstrap.servers": bootstrap, "group.id": group,
     "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
    [topic], handle, max_process_deaths=int(deaths) or None, install_signal_handlers=False,
).run()
"""


@pytest.mark.parametrize("deaths", [3, 0], ids=["protected", "control-unprotected"])
def test_a_sigkill_during_a_new_groups_first_record_is_detected_on_restart(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, deaths: int
) -> None:
    """A new group on 3 partitions; the process is SIGKILLed while its FIRST record is in
    flight. Every partition is then committed without the clean marker (the seed of the
    assignment), so the next start probes them: the first record it handles is committed as
    in flight with the unclean end counted (``d`` = 1) before the handler runs. Control
    without protection: nothing was committed, so the restart cannot tell it from a new group
    and counts no death."""
    from test_consumer_integration import wait_for

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory, partitions=3)
    produce(bootstrap, topic, [(None, b"v%d" % i, None, i % 3) for i in range(6)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    script = tmp_path / "worker.py"
    script.write_text(_BLOCKING_WORKER)
    out = tmp_path / "out"
    args = [bootstrap, topic, group, str(out), str(deaths)]

    def calls() -> list[tuple[int, int]]:
        lines = out.read_text().splitlines() if out.exists() else []
        return [(int(ln.split()[1]), int(ln.split()[2])) for ln in lines]

    def start_and_kill() -> tuple[tuple[int, int], dict[int, tuple[int, str]]]:
        """One start until its first handler call, then SIGKILL: (partition, offset) of that
        call and the group's commits read while it was in flight."""
        before = len(calls())
        proc = subprocess.Popen([sys.executable, str(script), *args])
        try:
            wait_for(lambda: len(calls()) > before or proc.poll() is not None, 120, "a call")
            assert proc.poll() is None, f"worker exited with {proc.returncode}"
            state = _committed_parts(bootstrap, group, topic, 3)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
        return calls()[before], state

    first, after_first = start_and_kill()
    assert first[1] == 0  # the partition's first record
    second, during_second = start_and_kill()
    in_flight = parse_marker(during_second[second[0]][1])
    if deaths == 0:
        assert {o for o, _ in after_first.values()} == {-1001}
        assert in_flight is None  # the death went unnoticed
        return
    for p in range(3):  # the seed: committed, not clean -> probed at the next start
        offset, metadata = after_first[p]
        marker = parse_marker(metadata)
        assert offset == 0 and marker is not None and not marker.clean, after_first
    assert in_flight is not None and in_flight.offset == second[1] == 0
    assert in_flight.deaths == 1  # the SIGKILL of the first start, counted


def test_markers_parse_and_ignore_foreign_metadata() -> None:
    assert parse_marker(None) is None
    assert parse_marker("spark-query-7") is None
    assert parse_marker(CLEAN) is not None and parse_marker(CLEAN).clean  # type: ignore[union-attr]
    m = parse_marker('kresilient.v1 {"x":5,"d":2,"t":1700000000000}')
    assert m is not None and (m.offset, m.deaths, m.first_ms) == (5, 2, 1700000000000)
    assert parse_marker("kresilient.v1 {not json") is None
    garbled: Any = parse_marker('kresilient.v1 {"x":"5"}')
    assert garbled is not None and garbled.offset is None and not garbled.clean


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_graceful_stop_without_records_leaves_the_partition_clean(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, ordering: str
) -> None:
    """Review 12 D2. Run 1 handles 10 records and stops cleanly (the clean marker at 10).
    Run 2 gets no record and stops cleanly: its assignment had committed the marker again
    without the clean flag (so a death before the next commit is seen), and its clean end
    now commits the partition back clean (before: ``kresilient.v1 {}`` stayed, and run 3
    probed its next 20 records one at a time, a synchronous commit each). Run 3 probes
    nothing."""
    import threading

    from kresilient.consumer import ResilientConsumer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    probed: list[int] = []

    def run(records: int) -> None:
        handled: list[int] = []
        consumer: ResilientConsumer

        def handle(msg: Any) -> None:
            assert consumer._crash is not None
            if consumer._crash.probes:
                probed.append(int(msg.offset()))
            handled.append(int(msg.offset()))

        consumer = ResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"},
            [topic],
            handle,
            ordering=ordering,  # type: ignore[arg-type]
            install_signal_handlers=False,
        )
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while len(handled) < records or consumer.health().rebalances["assigned"] < 1:
                assert time.monotonic() < deadline, (records, handled)
                time.sleep(0.05)  # polling what the consumer reports, not settling
        finally:
            consumer.stop()
            thread.join(60)
        assert len(handled) == records

    produce(bootstrap, topic, [(None, b"v%d" % i, None, 0) for i in range(10)])
    run(10)
    assert committed(bootstrap, group, topic, [0]) == {0: 10}
    assert parse_marker(_marker(bootstrap, group, topic)).clean  # type: ignore[union-attr]
    run(0)  # idle
    marker = parse_marker(_marker(bootstrap, group, topic))
    assert marker is not None and marker.clean, _marker(bootstrap, group, topic)
    produce(bootstrap, topic, [(None, b"v%d" % i, None, 0) for i in range(10, 15)])
    run(5)
    assert probed == []  # the third start probed nothing
