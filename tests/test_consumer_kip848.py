"""The key consumer guarantees with the next-generation group protocol (KIP-848).

``group.protocol=consumer`` moves assignment and the session timeout to the broker (Kafka
4.x serves it). The guarantees must not change: a SIGKILLed consumer restarted skips nothing,
a leader SIGKILL during consumption loses nothing, and a long retry causes no rebalance.

Differences from the classic protocol (docs/testing.md, "KIP-848"): the client may not set
``session.timeout.ms``/``heartbeat.interval.ms``/``partition.assignment.strategy``
(``consumer_config`` refuses them); the session timeout is the group's
``consumer.session.timeout.ms`` (broker default 45 s, no lower than the broker's
``group.consumer.min.session.timeout.ms``; the test cluster allows 6 s), set here per group
with IncrementalAlterConfigs so a SIGKILLed member is replaced in seconds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import tenacity
from confluent_kafka import ConsumerGroupType, Message, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from test_consumer_integration import (
    Runner,
    TopicFactory,
    committed,
    ends,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.testing import KafkaCluster

# The group config needs the harness's lowered broker minimum: not on an external cluster.
pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_NEXT_GEN = {"group.protocol": "consumer"}

_WORKER = textwrap.dedent(
    """
    import os, sys, threading
    from kresilient.consumer import ResilientConsumer
    bootstrap, topic, group, out = sys.argv[1:5]
    stall_after = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    handled = [0]
    def handle(msg):
        if stall_after and handled[0] >= stall_after:
            threading.Event().wait()  # stuck mid-stream until killed: the kill cuts it short
        os.write(fd, b"%d %d %s\\n" % (msg.partition(), msg.offset(), msg.value()))
        handled[0] += 1
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
         "auto.commit.interval.ms": 500},
        [topic], handle,
    )
    consumer.run()
    print("stopped", flush=True)
    """
)


def _group(cluster: KafkaCluster, session_ms: int = 6000) -> str:
    """A fresh group id whose broker-side session timeout is ``session_ms``."""
    group = f"g848-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                "consumer.session.timeout.ms",
                str(session_ms),
                incremental_operation=AlterConfigOpType.SET,
            ),
            ConfigEntry(
                "consumer.heartbeat.interval.ms",
                "1000",
                incremental_operation=AlterConfigOpType.SET,
            ),
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    return group


def _assert_next_gen(cluster: KafkaCluster, group: str) -> None:
    """The group really ran the KIP-848 protocol (not a silent fallback to classic)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    (future,) = admin.describe_consumer_groups([group]).values()
    assert future.result(timeout=30).type == ConsumerGroupType.CONSUMER


def _lines(path: Path) -> list[tuple[int, int, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n")[:-1]:  # a SIGKILL never splits a write(2)
        p, o, v = line.split(b" ")
        out.append((int(p), int(o), int(v)))
    return out


def _worker(
    bootstrap: str, topic: str, group: str, out: Path, stall_after: int = 0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, bootstrap, topic, group, str(out), str(stall_after)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_kip848_sigkilled_consumer_restarted_skips_nothing(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=3)
    n = 20_000
    produce(bootstrap, topic, [(b"%d" % i, b"%d" % i, None, None) for i in range(n)])
    group = _group(kafka_cluster)
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"
    # The first worker stops handling (stuck, not finished) after 5,000 messages, so the kill
    # always lands mid-stream however fast the machine is.
    first = _worker(bootstrap, topic, group, first_out, stall_after=5_000)
    try:
        wait_for(
            lambda: first_out.exists() and first_out.read_bytes().count(b"\n") >= 3_000,
            120,
            "the first worker to progress",
        )
        wait_for(
            lambda: any(o > 0 for o in committed(bootstrap, group, topic, range(3)).values()),
            60,
            "a first commit",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=30)
    before = _lines(first_out)
    at_kill = committed(bootstrap, group, topic, range(3))
    # negative control: the kill really cut the first worker short
    assert len(before) < n, "the first worker finished before it was killed"
    second = _worker(bootstrap, topic, group, second_out)
    try:
        wait_for(
            lambda: {v for *_, v in before} | {v for *_, v in _lines(second_out)} >= set(range(n)),
            180,
            "the restarted worker to finish (after the dead member's 6 s session)",
        )
    finally:
        second.send_signal(signal.SIGTERM)
        stdout, _ = second.communicate(timeout=60)
    assert second.returncode == 0, stdout
    after = _lines(second_out)
    assert {v for *_, v in before + after} == set(range(n))  # none skipped
    for p in range(3):
        resumed = [o for q, o, _ in after if q == p]
        if resumed:  # resumes exactly at the committed offset: no gap
            assert min(resumed) == max(at_kill[p], 0), (p, min(resumed), at_kill)
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high
    _assert_next_gen(kafka_cluster, group)


def test_kip848_leader_sigkill_during_consumption(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=3)
    n = 10_000
    seen: list[int] = []
    done = threading.Event()

    def handle(msg: Message) -> None:
        seen.append(int(msg.value() or b""))
        if len(set(seen)) == n:
            done.set()

    group = _group(kafka_cluster)
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, **_NEXT_GEN},
        [topic],
        handle,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    victim = kafka_cluster.leader(topic, 0)
    try:
        for i in range(n // 2):
            producer.produce(topic, b"%d" % i, key=b"%d" % i)
        assert producer.flush(60) == 0
        wait_for(lambda: len(seen) >= 1_000, 60, "consumption to start")
        kafka_cluster.kill(victim)
        kafka_cluster.wait_for_leader(topic, 0, not_on=victim, timeout=60)
        for i in range(n // 2, n):
            producer.produce(topic, b"%d" % i, key=b"%d" % i)
        assert producer.flush(120) == 0
        assert done.wait(180), f"only {len(set(seen))} of {n} handled after the kill"
    finally:
        runner.stop(120)
        kafka_cluster.start(victim)
        for t in (topic, dlq):
            for p in range(3):
                kafka_cluster.wait_for_isr(t, p, size=3, timeout=120)
    assert runner.error is None
    assert set(seen) == set(range(n))  # nothing lost
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high


def test_kip848_retrying_longer_than_max_poll_interval_causes_no_rebalance(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(bootstrap, topic, [(None, b"p0-%d" % i, None, 0) for i in range(20)])
    produce(bootstrap, topic, [(None, b"p1-%d" % i, None, 1) for i in range(10)])
    events: list[tuple[int, int]] = []
    rebalances: list[str] = []
    failing_since: list[float] = []
    failed_attempts: list[float] = []
    succeeded_at: list[float] = []
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        p, o = msg.partition(), msg.offset()
        if p == 0 and o == 5:
            if not failing_since:
                failing_since.append(time.monotonic())
            # fails for longer than max.poll.interval.ms: a blocking retry would be evicted
            if time.monotonic() - failing_since[0] < 12.0:
                failed_attempts.append(time.monotonic())
                raise ConnectionError("downstream unavailable")
            succeeded_at.append(time.monotonic())
        events.append((p, o))
        if len(events) == 30:
            consumer.stop()

    group = _group(kafka_cluster)
    consumer = ResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "max.poll.interval.ms": 8000,
            **_NEXT_GEN,
        },
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_delay(120), wait=tenacity.wait_fixed(0.5)),
        on_assign=lambda ps: rebalances.append("assign") if ps else None,
        on_revoke=lambda ps: rebalances.append("revoke") if ps else None,
        on_lost=lambda ps: rebalances.append("lost"),
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    runner.join(120)
    assert runner.error is None
    assert failing_since, "the failure never happened"  # negative control: the retry was real
    assert [o for p, o in events if p == 0] == list(range(20))  # order kept, nothing skipped
    assert "lost" not in rebalances and rebalances.count("revoke") <= 1, rebalances
    # held past max.poll.interval.ms (8 s) by retries made from the poll loop, each counted;
    # how many fit in 12 s depends on the machine's load, not on the consumer
    assert succeeded_at[0] - failed_attempts[0] > 8.0
    assert consumer.health().retries == len(failed_attempts) >= 2
    _assert_next_gen(kafka_cluster, group)
