"""Crash-loop protection with many records of a partition in flight (issue 40), real cluster.

``ordering="key"`` keeps crash-loop protection on (``max_process_deaths=3`` by default): a
partition probed after an unclean end runs its probe one record at a time, each record's
marker committed (beside the list of finished records) before its handler call; an unprobed
partition runs concurrently with no marker commit.

A child process (this file run as a script) runs a keyed consumer whose handler calls
``os._exit(1)`` on one record while records of other keys are in flight; a supervisor
restarts it (static membership, like a restarted pod) until every other record is handled.
The negative control runs it with the protection off: the record kills every start.

    python tests/test_keyed_crashloop.py --bootstrap HOSTS --topic T --group G --out FILE
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
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
    committed,
    config,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.consumer._crashloop import parse_marker
from kresilient.consumer._inflight import finished_from, with_finished
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

N = 40
DIE_AT = 17
#: handler calls of other keys the dying record waits for (bounded) before it dies
_WAIT_OTHERS_S = 0.5


# ---------------------------------------------------------------------------- the child


def _child() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-process-deaths", type=int, default=3, help="0: protection off")
    parser.add_argument("--cross", action="store_true", help="two partitions (see _CROSS)")
    args = parser.parse_args()
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if args.cross:
        return _cross_child(args, fd)
    lock = threading.Lock()
    running = 0

    def handle(msg: Any) -> None:
        nonlocal running
        with lock:
            running += 1
            others = running - 1
        try:
            if msg.value() == b"die":
                # die while other keys' handlers run, when any may (an unprobed partition);
                # a probed one runs this record alone: the wait runs out
                deadline = time.monotonic() + _WAIT_OTHERS_S
                while others == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                    with lock:
                        others = running - 1
                os.write(fd, b"died %d %d\n" % (msg.offset(), others))
                os._exit(1)  # a crash no Python code sees
            time.sleep(0.05)  # the service call: keeps other keys in flight meanwhile
            os.write(fd, b"ok %d %d\n" % (msg.offset(), others))
        finally:
            with lock:
                running -= 1

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "group.instance.id": f"{args.group}-pod-0",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        },
        [args.topic],
        handle,
        ordering="key",
        max_in_flight=8,
        max_process_deaths=args.max_process_deaths or None,
    )
    print("started", flush=True)
    consumer.run()  # until SIGTERM
    os.close(fd)
    return 0


def _cross_child(args: argparse.Namespace, fd: int) -> int:
    """Two partitions: p0's ``die`` record kills the process, p1's records are innocent and
    slow (their handlers are in flight when it dies, unless the probe runs alone). Writes
    ``ok <partition * 100 + offset> 0`` per record handled."""

    killer = threading.Event()

    def handle(msg: Any) -> None:
        if msg.value() == b"die":
            killer.set()
            time.sleep(0.1)  # p1's handlers (if any started) are in flight meanwhile
            os._exit(1)
        # p1: in flight when the killer runs, if any may run beside it (bounded wait: a
        # probed record runs alone and waits it out); then the killer dies first
        if msg.partition() == 1 and killer.wait(0.5):
            time.sleep(1.0)
        os.write(fd, b"ok %d 0\n" % (msg.partition() * 100 + msg.offset()))

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "group.instance.id": f"{args.group}-pod-0",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        },
        [args.topic],
        handle,
        ordering="key",
        max_in_flight=8,
    )
    consumer.run()  # until SIGTERM
    os.close(fd)
    return 0


# ---------------------------------------------------------------------------- the tests


def _lines(out: Path) -> list[tuple[str, int, int]]:
    """(``ok``/``died``, offset, other handlers running when it started or died)."""
    if not out.exists():
        return []
    return [
        (kind.decode(), int(offset), int(others))
        for kind, offset, others in (ln.split() for ln in out.read_bytes().splitlines())
    ]


def _supervise(
    bootstrap: str,
    topic: str,
    group: str,
    out: Path,
    max_deaths: int,
    max_starts: int,
    wanted: set[int] | None = None,
    extra: tuple[str, ...] = (),
    min_deaths: int = 0,
    done: Any = None,
) -> tuple[int, bool]:
    """Restart the child until it handles every other record (``wanted``, then SIGTERM) or
    ``max_starts`` starts. Returns (deaths, finished)."""
    deaths = 0
    if wanted is None:
        wanted = set(range(N)) - {DIE_AT}
    argv = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, "--out", str(out)]
    argv += ["--max-process-deaths", str(max_deaths), *extra]
    for _ in range(max_starts):
        proc = subprocess.Popen(
            [sys.executable, __file__, *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120  # a bound for a hang, not a timing target
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                if (
                    deaths >= min_deaths
                    and wanted <= {o for kind, o, _ in _lines(out) if kind == "ok"}
                    and (done is None or done())
                ):
                    proc.send_signal(signal.SIGTERM)
                    assert proc.wait(30) == 0
                    return deaths, True
                time.sleep(0.1)  # polling the child's output file, not settling
            else:
                raise AssertionError("child neither died nor finished within 120 s")
            assert proc.returncode == 1, proc.returncode
            deaths += 1
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return deaths, False


def _committed_meta(bootstrap: str, group: str, topic: str) -> tuple[int, str | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
        return tp.offset, tp.metadata
    finally:
        c.close()


def test_keyed_record_killing_the_process_is_dead_lettered_after_max_process_deaths(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    values = [b"die" if i == DIE_AT else b"v%d" % i for i in range(N)]
    produce(
        bootstrap, topic, [(b"k%d" % i, v, [("h", b"%d" % i)], 0) for i, v in enumerate(values)]
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"

    deaths, finished = _supervise(bootstrap, topic, group, out, max_deaths=3, max_starts=6)

    assert (deaths, finished) == (3, True)
    lines = _lines(out)
    died = [(o, others) for kind, o, others in lines if kind == "died"]
    assert [o for o, _ in died] == [DIE_AT] * 3
    # the first death: a new group's partition is not probed, other keys were in flight;
    # after it the partition is probed: the record runs alone, its marker names it
    assert died[0][1] >= 1
    assert [others for _, others in died[1:]] == [0, 0]
    assert {o for kind, o, _ in lines if kind == "ok"} == set(range(N)) - {DIE_AT}
    (record,) = read_back(bootstrap, dlq)
    assert (record.key(), record.value()) == (b"k%d" % DIE_AT, b"die")
    headers = list(record.headers() or [])
    assert headers[0] == ("h", b"%d" % DIE_AT)
    info = dict(headers)
    assert info["kresilient.error.category"] == b"crash_loop"
    assert info["kresilient.attempts"] == b"3"
    assert parse_dead_letter_headers(headers).original_offset == DIE_AT
    # the clean stop committed everything with the clean-end marker
    offset, meta = _committed_meta(bootstrap, group, topic)
    marker = parse_marker(meta)
    assert offset == N and marker is not None and marker.clean


def test_negative_control_without_protection_the_keyed_record_kills_every_start(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """max_process_deaths=None: the record kills every start (other keys still flow: they
    are not behind it), it is never dead-lettered and the committed offset never passes it."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    values = [b"die" if i == DIE_AT else b"v%d" % i for i in range(N)]
    produce(bootstrap, topic, [(b"k%d" % i, v, None, 0) for i, v in enumerate(values)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"

    deaths, finished = _supervise(bootstrap, topic, group, out, max_deaths=0, max_starts=3)

    assert (deaths, finished) == (3, False)
    assert [o for kind, o, _ in _lines(out) if kind == "died"] == [DIE_AT] * 3
    assert read_back(bootstrap, dlq) == []
    assert committed(bootstrap, group, topic, [0])[0] <= DIE_AT


def test_a_killer_in_one_probed_partition_takes_no_record_of_another_with_it(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """review12 D3: after a death every partition is probed; a probed record runs alone in
    the process (no other handler in flight, nothing starts while it runs), so the marker of
    a death names only the killer. Before: p1's probed record in flight was blamed with each
    death and dead-lettered as ``crash_loop`` without its handler ever succeeding."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(partitions=2)
    dlq = topic_factory(partitions=2, name=topic + ".dlq")
    items = [(b"a%d" % i, b"die" if i == 3 else b"ok", None, 0) for i in range(8)]
    items += [(b"b%d" % i, b"ok", None, 1) for i in range(4)]
    produce(bootstrap, topic, items)
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "handled.txt"
    wanted = {o for o in range(8) if o != 3} | {100 + o for o in range(4)}

    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{group}"})

    def dead_lettered() -> bool:  # the killer's dead letter written (then a clean stop)
        return any(
            reader.get_watermark_offsets(TopicPartition(dlq, p), timeout=10)[1] > 0 for p in (0, 1)
        )

    try:
        deaths, finished = _supervise(
            bootstrap, topic, group, out, 3, 6, wanted, ("--cross",), 3, dead_lettered
        )
    finally:
        reader.close()

    assert (deaths, finished) == (3, True)
    assert {o for kind, o, _ in _lines(out) if kind == "ok"} == wanted  # every p1 record
    dead = read_back(bootstrap, dlq)
    assert [(r.key(), r.value()) for r in dead] == [(b"a3", b"die")]


PROBED = 5


def test_a_probed_partition_runs_its_probe_alone_then_concurrently_again(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The previous owner died (committed at 0 without the clean marker, its list naming 3
    and 4 finished): the next PROBED records run one at a time, each with a committed marker
    naming it beside the list; then the partition runs concurrently again (handlers overlap).
    Record 1 fails once: while it waits for its retry the committed marker says it waits (not
    in flight: a kill then is not its death), and the periodic commits keep that marker."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    n = 30
    produce(bootstrap, topic, [(b"k%d" % i, b"v%d" % i, None, 0) for i in range(n)])
    cfg = config(kafka_cluster, **{"auto.offset.reset": "earliest"})
    group = cfg["group.id"]
    died_meta = with_finished(None, 0, [3, 4])  # a list, no clean-end marker
    died = parse_marker(died_meta)
    assert died_meta is not None and died is not None and not died.clean
    setter = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        setter.commit(offsets=[TopicPartition(topic, 0, 0, metadata=died_meta)], asynchronous=False)
    finally:
        setter.close()

    lock = threading.Lock()
    running = 0
    overlapped: dict[int, int] = {}  #: offset -> other handlers running at its start
    markers: dict[int, tuple[int, str | None]] = {}  #: committed while it ran (probed ones)
    failed_once: set[int] = set()
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})

    def handle(msg: Message) -> None:
        nonlocal running
        offset: int = msg.offset()  # type: ignore[assignment]
        with lock:
            running += 1
            overlapped[offset] = running - 1
        try:
            if len(overlapped) <= PROBED:
                (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=30)
                markers[offset] = (tp.offset, tp.metadata)
                if offset == 1 and offset not in failed_once:
                    failed_once.add(offset)
                    raise RuntimeError("refused once")
            else:
                # after the probe: wait (bounded) for another key's handler to run beside it
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:
                    with lock:
                        if running > 1:
                            overlapped[offset] = max(overlapped[offset], running - 1)
                            break
                    time.sleep(0.005)
            time.sleep(0.02)
        finally:
            with lock:
                running -= 1

    consumer = ResilientConsumer(
        cfg,
        [topic],
        handle,
        ordering="key",
        max_in_flight=8,
        crash_probe_records=PROBED + 1,  # record 1's failed attempt counts too
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(2.0)),
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    waiting: list[tuple[int, str | None]] = []
    try:

        def record_1_waits() -> bool:
            (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=30)
            marker = parse_marker(tp.metadata)
            if marker is not None and marker.waiting:
                waiting.append((tp.offset, tp.metadata))
            return bool(waiting) or len(overlapped) > 2 or runner.error is not None

        wait_for(record_1_waits, 60, "record 1's waiting marker")
        wait_for(
            lambda: len(overlapped) == n - 2 or runner.error is not None,
            60,
            "every record not listed as finished",
        )
    finally:
        runner.stop()
        reader.close()
    assert runner.error is None
    assert waiting, "no waiting marker seen while record 1 waited for its retry"
    offset, meta = waiting[0]
    marker = parse_marker(meta)
    assert offset == 1 and marker is not None and (marker.offset, marker.waiting) == (1, True)
    listed = finished_from(meta, 1)
    assert listed is not None and listed.offsets() == [3, 4]
    assert sorted(overlapped) == [o for o in range(n) if o not in (3, 4)]  # 3, 4 skipped
    probed = sorted(overlapped)[:PROBED]
    assert probed == [0, 1, 2, 5, 6]
    assert [overlapped[o] for o in probed] == [0] * PROBED  # one at a time
    for o in probed:
        offset, meta = markers[o]
        marker = parse_marker(meta)
        # committed before its handler call: the offset is the record, the marker names it
        assert offset == o and marker is not None and marker.offset == o, (o, meta)
        listed = finished_from(meta, offset)
        assert (listed.offsets() if listed else []) == [x for x in (3, 4) if x > o], (o, meta)
    # the probe is over: concurrent again
    assert max(overlapped[o] for o in overlapped if o not in probed) >= 1
    offset, meta = _committed_meta(bootstrap, group, topic)
    clean = parse_marker(meta)
    assert offset == n and clean is not None and clean.clean


if __name__ == "__main__":
    sys.exit(_child())


def test_the_marker_and_the_list_share_the_metadata_and_a_list_too_long_is_left_out() -> None:
    """Each reader ignores the other's fields; over 4096 bytes the marker is committed alone
    (the records listed are then redone, the attribution is unchanged)."""
    from kresilient.consumer._crashloop import PROBE_END
    from kresilient.consumer._inflight import InflightWindow

    window: InflightWindow[int] = InflightWindow("key", max_records=4, max_bytes=1 << 20)
    for offset in range(10):
        window.offer(offset, b"k%d" % (offset % 2), 1, offset)
    window.serial = True
    assert window.ready(0.0) == [0]  # one at a time, the lowest unfinished
    assert window.ready(0.0) == []
    window.finish(0)
    assert window.ready(0.0) == [1]
    marker = '{"x":1,"d":1,"t":5}'
    meta = window.metadata("kresilient.v1 " + marker)
    assert meta is not None
    parsed = parse_marker(meta)
    assert parsed is not None and (parsed.offset, parsed.deaths, parsed.clean) == (1, 1, False)
    assert finished_from(meta, 1) is None  # nothing finished above 1 yet
    window.serial = False
    assert window.ready(0.0) == [2]  # key k0's next: 1 (k1) still runs
    window.finish(2)
    listed = finished_from(window.metadata(PROBE_END), 1)
    assert listed is not None and listed.offsets() == [2]
    # a list that does not fit: the marker alone
    scattered = list(range(2, 40_000, 2))
    long = with_finished("kresilient.v1 " + marker, 1, scattered)
    assert long == "kresilient.v1 " + marker
    assert len(with_finished(None, 1, scattered) or "") == 0
