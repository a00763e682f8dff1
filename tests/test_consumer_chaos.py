"""ResilientConsumer through crashes: its own SIGKILL (7a) and a leader's SIGKILL (7d)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message, Producer
from test_consumer_integration import (
    Runner,
    TopicFactory,
    committed,
    config,
    ends,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.consumer import ResilientConsumer
from kresilient.testing import KafkaCluster

WORKER = Path(__file__).with_name("consumer_worker.py")


def _lines(path: Path) -> list[tuple[int, int, int]]:
    """``(partition, offset, id)`` per complete line of a worker's output file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n")[:-1]:  # a SIGKILL never splits a write(2)
        p, o, v = line.split(b" ")
        out.append((int(p), int(o), int(v)))
    return out


def _worker(bootstrap: str, topic: str, group: str, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
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
            "--sleep",
            "0.0003",  # ~20 s for 50k messages: several commits happen before the kill
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.integration
def test_7a_consumer_sigkilled_mid_stream_then_restarted(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """50k messages; the consumer process is SIGKILLed mid-stream and restarted: every
    message processed at least once, none skipped, and the only duplicates are messages the
    first process handled after the last offset it committed (its work in flight)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=3)
    n = 50_000
    produce(bootstrap, topic, [(b"%d" % i, b"%d" % i, None, None) for i in range(n)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"

    first = _worker(bootstrap, topic, group, first_out)
    try:
        wait_for(
            lambda: first_out.exists() and first_out.read_bytes().count(b"\n") >= 20_000,
            120,
            "the first worker to progress",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    before = _lines(first_out)
    assert len(before) < n, "the first worker finished before it was killed"
    at_kill = committed(bootstrap, group, topic, range(3))
    assert any(o > 0 for o in at_kill.values()), "nothing was committed before the kill"

    second = _worker(bootstrap, topic, group, second_out)
    try:
        wait_for(
            lambda: (
                {v for _, _, v in before} | {v for _, _, v in _lines(second_out)} >= set(range(n))
            ),
            240,
            "the restarted worker to finish",
        )
    finally:
        second.send_signal(signal.SIGTERM)  # graceful: finish, commit, leave
        stdout, _ = second.communicate(timeout=60)
    assert second.returncode == 0, stdout
    after = _lines(second_out)

    ids = [v for _, _, v in before + after]
    assert set(ids) == set(range(n))  # at least once, none skipped
    assert len(set(before)) == len(before) and len(set(after)) == len(after)
    duplicates = {(p, o) for p, o, _ in before} & {(p, o) for p, o, _ in after}
    # the restart resumes exactly at the committed offset of each partition ...
    high = ends(bootstrap, topic)
    for p in range(3):
        resumed = [o for q, o, _ in after if q == p]
        if resumed:
            assert min(resumed) == max(at_kill[p], 0), (p, min(resumed), at_kill)
        else:  # the first worker had handled and committed all of it
            assert at_kill[p] == high[p]
    # ... so duplicates are exactly the first worker's uncommitted work in flight
    in_flight = {(p, o) for p, o, _ in before if o >= at_kill[p]}
    assert duplicates == in_flight
    print(f"7a: {len(before)} handled before SIGKILL, {len(duplicates)} re-handled after it")
    assert committed(bootstrap, group, topic, high) == high  # the graceful stop committed all


@pytest.mark.broker_smoke
@pytest.mark.integration
@pytest.mark.chaos
def test_7d_leader_sigkill_during_consumption(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """SIGKILL of a partition leader while messages are produced and consumed: nothing lost,
    the same consumer continues after the election, nothing handled twice."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=3)
    n = 30_000
    seen: list[int] = []
    stamps: list[float] = []  # partition 0's
    all_done = threading.Event()

    def handle(msg: Message) -> None:
        seen.append(int(msg.value() or b""))
        if msg.partition() == 0:
            stamps.append(time.monotonic())
        if len(seen) >= n and len(set(seen)) == n:
            all_done.set()

    delivered: list[int] = []

    killed = threading.Event()

    def produce_steadily() -> None:
        """~3000 msg/s, the second half only once the leader is killed: data keeps arriving
        after the kill however slowly the consumer started (on a loaded machine it once
        consumed partition 0 whole before the kill)."""
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120000,
            }
        )

        def report(err: Any, msg: Message) -> None:
            assert err is None, err
            delivered.append(int(msg.value() or b""))

        for start in range(0, n, 300):
            if start == n // 2:
                assert killed.wait(300), "the leader was never killed"
            for i in range(start, start + 300):
                producer.produce(topic, b"%d" % i, key=b"%d" % i, on_delivery=report)
            producer.poll(0.1)
        assert producer.flush(120) == 0

    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer = ResilientConsumer(
        config(kafka_cluster, group), [topic], handle, install_signal_handlers=False
    )
    runner = Runner(consumer)
    feeder = threading.Thread(target=produce_steadily, daemon=True)
    victim = kafka_cluster.leader(topic, 0)
    try:
        feeder.start()
        wait_for(lambda: len(seen) >= 5_000, 180, "consumption to start")
        killed_at = time.monotonic()
        kafka_cluster.kill(victim)
        killed.set()
        kafka_cluster.wait_for_leader(topic, 0, not_on=victim, timeout=60)
        elected_at = time.monotonic()
        feeder.join(300)
        assert sorted(delivered) == list(range(n))
        assert all_done.wait(240), f"only {len(set(seen))} of {n} handled after the kill"
    finally:
        runner.stop(120)
        kafka_cluster.start(victim)
        for t in (topic, dlq):
            for p in range(3):
                kafka_cluster.wait_for_isr(t, p, size=3, timeout=120)
    assert runner.error is None
    assert set(seen) == set(range(n))  # no loss
    dupes = sum(c - 1 for c in Counter(seen).values())
    health = consumer.health()
    after_kill = [t for t in stamps if t >= killed_at]
    assert after_kill, "partition 0 was consumed completely before its leader was killed"
    before_kill = [t for t in stamps if t < killed_at]
    around = before_kill[-1:] + after_kill
    gaps = [b - a for a, b in itertools.pairwise(around)]
    print(
        f"7d: killed node {victim} (leader of partition 0); new leader visible after "
        f"{elected_at - killed_at:.1f} s; partition 0's longest pause in consumption after the "
        f"kill {max(gaps, default=0):.1f} s ({len(after_kill)} of its messages handled after); "
        f"duplicates {dupes}; commit failures {health.commit_failures}; "
        f"rebalances {health.rebalances}"
    )
    # a duplicate needs a partition to move to a new member (lost or revoked) before its
    # offsets were committed: with one stable member there is none
    if health.rebalances["lost"] == 0 and health.rebalances["revoked"] <= 1:
        assert dupes == 0
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high
