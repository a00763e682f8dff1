"""Crash-loop protection (issue 17, item 2), real cluster, consumer processes.

A handler calls ``os._exit(1)`` on one record (a crash no Python code sees). A supervisor loop
restarts the consumer process (tests/consumer_worker.py, static group membership like a
restarted pod) until it stops dying: with the default ``max_process_deaths=3`` the record is
dead-lettered (``kresilient.error.category=crash_loop``) after exactly 3 deaths, and every
other record is handled. The negative control runs the same supervisor with the protection
off: the process dies on every start and nothing after the record is ever handled.
"""

from __future__ import annotations

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
    """A new group's partition that never gets records stays seeded (its first record's offset
    is to be committed before that record is handled). Records of the other partitions are
    handled without the guard once their own seed is done: the guard is for batches holding
    records of a probed or seeded partition, not for the consumer's whole life. Control in the
    same run: the first record of partition 0 (seeded) does go through the guard."""
    import sys
    import threading

    from test_consumer_integration import Runner, config, wait_for

    from kresilient import ResilientConsumer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
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
        install_signal_handlers=False,
    )
    produce(bootstrap, topic, [(None, b"a%d" % i, None, 0) for i in range(10)])
    runner = Runner(consumer)
    try:
        wait_for(first_wave.is_set, 120, "the first 10 records")
        # a later batch: partition 1 (no records, never committed) is still seeded
        produce(bootstrap, topic, [(None, b"b%d" % i, None, 0) for i in range(10)])
        wait_for(lambda: len(callers) >= 20, 120, "the next 10 records")
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert callers[0] == (0, "guarded")  # control: the seeded partition's first record
    later = [name for offset, name in callers if offset >= 10]
    assert len(later) == 10
    assert "guarded" not in later, callers


def test_markers_parse_and_ignore_foreign_metadata() -> None:
    assert parse_marker(None) is None
    assert parse_marker("spark-query-7") is None
    assert parse_marker(CLEAN) is not None and parse_marker(CLEAN).clean  # type: ignore[union-attr]
    m = parse_marker('kresilient.v1 {"x":5,"d":2,"t":1700000000000}')
    assert m is not None and (m.offset, m.deaths, m.first_ms) == (5, 2, 1700000000000)
    assert parse_marker("kresilient.v1 {not json") is None
    garbled: Any = parse_marker('kresilient.v1 {"x":"5"}')
    assert garbled is not None and garbled.offset is None and not garbled.clean
