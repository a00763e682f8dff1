"""AsyncResilientProducer across real failures of the 3-node cluster (issue 14, acceptance 1, 2).

Every test heals the cluster it damaged; the plugin's ``chaos`` marker heals again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _producer_helpers import read_back

from kresilient.aio import AsyncDeliveryHandle, AsyncResilientProducer
from kresilient.errors import DeliveryError, ErrorCategory
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.asyncio]

N = 100_000
CHUNK = 1_000
PACE_S = 0.04  # between chunks: the stream lasts several seconds and spans the disruption


def _value(i: int) -> bytes:
    return b"%08d|" % i + b"p" * 91  # 100 bytes, unique id first


def _move_leadership_off_the_preferred_replica(cluster: KafkaCluster, topic: str) -> None:
    preferred = cluster.replicas(topic)[0]
    cluster.stop(preferred)
    cluster.start(preferred)
    cluster.wait_for_isr(topic, 0, size=3)
    assert cluster.leader(topic) != preferred


def _new_leader(cluster: KafkaCluster, topic: str, old: int) -> int:
    """The partition's leader once it is another node than ``old`` (or -1 after 60 s: the
    disruption did not move leadership, which the caller's assertion reports)."""
    deadline = time.monotonic() + 60
    while (leader := cluster.leader(topic)) in (-1, old):
        if time.monotonic() > deadline:
            return -1
        time.sleep(0.2)
    return leader


@pytest.mark.parametrize("kind", ["kill", "preferred_election"])
async def test_100k_across_a_leader_disruption_all_acknowledged_once_in_order(
    kafka_cluster: KafkaCluster, topic_factory: Any, kind: str
) -> None:
    topic = topic_factory()  # 1 partition, RF=3, min.insync.replicas=2
    if kind == "preferred_election":
        _move_leadership_off_the_preferred_replica(kafka_cluster, topic)
    leader_before = kafka_cluster.leader(topic)
    loop = asyncio.get_running_loop()
    if kind == "kill":
        begin, end = (
            (lambda: kafka_cluster.kill(leader_before)),
            (lambda: kafka_cluster.start(leader_before)),
        )
    else:
        begin, end = (lambda: kafka_cluster.elect_preferred_leaders(topic)), (lambda: None)
    handles: list[AsyncDeliveryHandle] = []
    leader_during: list[int] = []
    try:
        async with AsyncResilientProducer(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers}
        ) as producer:
            for i in range(N):
                handles.append(await producer.produce(topic, _value(i)))
                if i % CHUNK == CHUNK - 1:
                    await asyncio.sleep(PACE_S)
                if i == N // 3:
                    await loop.run_in_executor(None, begin)  # the cluster call blocks
                    # watched beside the stream, which goes on meanwhile
                    watch = loop.run_in_executor(
                        None, _new_leader, kafka_cluster, topic, leader_before
                    )
                elif i == 2 * N // 3:
                    leader_during.append(await watch)
                    await loop.run_in_executor(None, end)
            await producer.flush()  # raises DeliveryError if any message failed
            health = await producer.health()
    finally:
        kafka_cluster.heal([topic])
    results = [await h for h in handles]  # every handle: a DeliveryResult, none raises
    assert [r.offset for r in results] == list(range(N))
    assert health.failed_total == 0 and health.produced == N
    # negative control: leadership really moved mid-stream
    assert leader_during[0] not in (-1, leader_before)
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert len(values) == N  # nothing lost, nothing duplicated
    assert values == [_value(i) for i in range(N)]  # and in produce order


async def test_two_nodes_down_longer_than_the_delivery_timeout_flush_reports_every_message(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory()
    producer = AsyncResilientProducer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap_servers,
            "message.timeout.ms": 6000,
            "statistics.interval.ms": 1000,
        }
    )
    await (await producer.produce(topic, b"before"))
    leader = kafka_cluster.leader(topic)
    follower = next(n for n in kafka_cluster.replicas(topic) if n != leader)
    outage = 500
    try:
        kafka_cluster.kill(leader)
        kafka_cluster.kill(follower)
        handles = [await producer.produce(topic, b"outage-%04d" % i) for i in range(outage)]
        with pytest.raises(DeliveryError) as info:
            await producer.flush()
    finally:
        kafka_cluster.heal([topic])
    failures = info.value.failures
    # none silently dropped: every message of the outage reported, each exactly once
    assert sorted(f.message_id for f in failures) == [h.message_id for h in handles]
    for f in failures:
        assert f.classification.category is ErrorCategory.DELIVERY_TIMEOUT
    for h in handles:  # and each handle raises its own classified error
        assert h.done()
        with pytest.raises(Exception) as one:
            await h
        assert one.value.classification.category is ErrorCategory.DELIVERY_TIMEOUT  # type: ignore[attr-defined]
    # the producer recovers on the same instance (reconnect backoff: a probe may time out)
    deadline = time.monotonic() + 90
    while True:
        await producer.produce(topic, b"probe")
        try:
            await producer.flush()
            break
        except DeliveryError:
            assert time.monotonic() < deadline, "the producer did not recover"
    await producer.close()


async def test_cancelling_the_producing_task_during_an_outage_leaves_nothing_unaccounted(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    """The producing task is cancelled while 2 of 3 nodes are down and its messages are in
    flight: after the outage each message that produce() returned is either acknowledged or
    listed by flush() (classified) — none is silently dropped."""
    topic = topic_factory()
    producer = AsyncResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "message.timeout.ms": 8000}
    )
    await (await producer.produce(topic, b"before"))
    leader = kafka_cluster.leader(topic)
    follower = next(n for n in kafka_cluster.replicas(topic) if n != leader)
    returned: list[AsyncDeliveryHandle] = []

    async def produce_and_wait() -> None:
        for i in range(2000):
            handle = await producer.produce(topic, b"m-%05d" % i)
            returned.append(handle)
            if i % 100 == 99:
                await handle  # waits for the cluster: cancelled here

    try:
        kafka_cluster.kill(follower)
        task = asyncio.create_task(produce_and_wait())
        while len(returned) < 100:
            await asyncio.sleep(0.01)
        kafka_cluster.kill(leader)
        in_flight = len(producer)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert in_flight > 0  # negative control: the cancel hit messages in flight
        try:
            await producer.flush()
            failed: list[Any] = []
        except DeliveryError as exc:
            failed = exc.failures
    finally:
        kafka_cluster.heal([topic])
    # the cluster is back when a probe is acknowledged (reconnect backoff: it may time out)
    deadline = time.monotonic() + 90
    while True:
        probe = await producer.produce(topic, b"probe")
        try:
            await producer.flush()
            await probe
            break
        except Exception:
            assert time.monotonic() < deadline, "the producer did not recover"
    await producer.close()
    failed_ids = {f.message_id for f in failed}
    acknowledged = set()
    for h in returned:
        assert h.done()
        try:
            await h
            acknowledged.add(h.message_id)
        except Exception as exc:
            assert h.message_id in failed_ids, exc  # every failure was also in flush()
    assert acknowledged | failed_ids == {h.message_id for h in returned}
    assert not acknowledged & failed_ids
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    written = [v for v in values if v.startswith(b"m-")]
    assert len(written) == len(set(written))  # no duplicates
    assert len(written) >= len(acknowledged)  # every acknowledged message is on the topic
