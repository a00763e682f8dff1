"""ResilientProducer across real failures of the 3-node cluster (issue 4, 7a and 7b).

Every test restores the cluster it damaged (restart/thaw, then full ISR) before it ends; the
plugin's ``chaos`` marker heals again as a safety net.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from _producer_helpers import read_back

from kresilient.errors import DeliveryError, ErrorCategory
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

N = 100_000
CHUNK = 1_000
PACE_S = 0.04  # between chunks: the stream lasts a few seconds and spans the disruption
FREEZE_S = 9.0  # longer than broker.session.timeout.ms (3000 in the test cluster)


def _value(i: int) -> bytes:
    return b"%08d|" % i + b"p" * 91  # 100 bytes, unique id first


def _disruption(
    cluster: KafkaCluster, topic: str, kind: str
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(begin, end) actions for one kind of leader disruption of the topic's partition 0."""
    leader = cluster.leader(topic)
    if kind == "kill":
        return (lambda: cluster.kill(leader), lambda: cluster.start(leader))
    if kind == "stop":
        return (lambda: cluster.stop(leader), lambda: cluster.start(leader))
    if kind == "freeze":
        frozen_at: list[float] = []

        def freeze() -> None:
            cluster.freeze(leader)
            frozen_at.append(time.monotonic())

        def thaw() -> None:
            time.sleep(max(0.0, FREEZE_S - (time.monotonic() - frozen_at[0])))
            cluster.thaw(leader)

        return (freeze, thaw)
    if kind == "preferred_election":
        return (lambda: cluster.elect_preferred_leaders(topic), lambda: None)
    raise AssertionError(kind)


def _move_leadership_off_the_preferred_replica(cluster: KafkaCluster, topic: str) -> None:
    preferred = cluster.replicas(topic)[0]
    cluster.stop(preferred)
    cluster.start(preferred)
    cluster.wait_for_isr(topic, 0, size=3)
    assert cluster.leader(topic) != preferred


@pytest.mark.broker_smoke
@pytest.mark.parametrize("kind", ["kill", "stop", "freeze", "preferred_election"])
def test_leader_disruption_mid_stream_every_message_acknowledged_exactly_once_in_order(
    kafka_cluster: KafkaCluster, topic_factory: Any, kind: str
) -> None:
    topic = topic_factory()  # 1 partition, RF=3, min.insync.replicas=2
    if kind == "preferred_election":
        _move_leadership_off_the_preferred_replica(kafka_cluster, topic)
    leader_before = kafka_cluster.leader(topic)
    begin, end = _disruption(kafka_cluster, topic, kind)
    acked = [0]

    def count(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    try:
        with ResilientProducer(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "on_delivery": count}
        ) as producer:
            for i in range(N):
                producer.produce(topic, _value(i))
                if i % CHUNK == CHUNK - 1:
                    time.sleep(PACE_S)
                if i == N // 3:
                    begin()
                elif i == 2 * N // 3:
                    end()
            producer.flush()  # raises DeliveryError if any message failed
            health = producer.health()
    finally:
        kafka_cluster.heal([topic])
    assert acked[0] == N
    assert health.failed_total == 0 and health.produced == N
    if kind != "freeze":
        assert kafka_cluster.leader(topic) != leader_before or kind == "preferred_election"
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert len(values) == N  # nothing lost, nothing duplicated
    assert values == [_value(i) for i in range(N)]  # and in produce order


@pytest.mark.parametrize("down", ["leader_and_follower", "both_followers"])
def test_two_nodes_down_longer_than_the_delivery_timeout_reports_every_message(
    kafka_cluster: KafkaCluster, topic_factory: Any, down: str
) -> None:
    topic = topic_factory()
    timeout_ms = 6000
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "message.timeout.ms": timeout_ms,
        "statistics.interval.ms": 1000,
    }
    producer = ResilientProducer(config)
    producer.produce(topic, b"before")
    producer.flush()
    leader = kafka_cluster.leader(topic)
    followers = [n for n in kafka_cluster.replicas(topic) if n != leader]
    victims = [leader, followers[0]] if down == "leader_and_follower" else followers
    outage = 500
    try:
        for node in victims:
            kafka_cluster.kill(node)
        handles = [producer.produce(topic, b"outage-%04d" % i) for i in range(outage)]
        began = time.monotonic()
        with pytest.raises(DeliveryError) as info:
            producer.flush()
        waited = time.monotonic() - began
        health_down = producer.health()
    finally:
        kafka_cluster.heal([topic])
    failures = info.value.failures
    print(
        f"{down}: {len(failures)} failures after {waited:.1f} s:",
        {(f.classification.name, f.classification.possibly_persisted) for f in failures},
        "brokers up while down:",
        health_down.brokers_up,
    )
    # none silently dropped: every message of the outage is reported, each exactly once
    assert sorted(f.message_id for f in failures) == [h.message_id for h in handles]
    for f in failures:
        assert f.classification.category is ErrorCategory.DELIVERY_TIMEOUT
        assert f.classification.possibly_persisted
    assert all(h.done() and h.exception() is not None for h in handles)
    # After recovery new messages flow on the same producer once it has reconnected: it only
    # reconnects on demand, backing off up to reconnect.backoff.max.ms (10 s), so a probe
    # or two may still time out (6 s) first.
    probes = 0
    deadline = time.monotonic() + 180
    while True:
        probes += 1
        producer.produce(topic, b"probe")
        try:
            producer.flush()
            break
        except DeliveryError:
            assert time.monotonic() < deadline, "the producer did not recover"
    print(f"{down}: recovered after {probes} probe(s)")
    after = [producer.produce(topic, b"after-%04d" % i) for i in range(100)]
    producer.flush(60)
    assert all(h.result().topic == topic for h in after)
    producer.close()
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    records = [v for v in values if v != b"probe"]
    assert len(records) == len(set(records))  # no duplicates, whatever was persisted
    assert values[0] == b"before"
    assert values.count(b"probe") <= probes
    # "possibly persisted" is real: timed-out messages may be on the topic after recovery
    persisted = sum(1 for v in records if v.startswith(b"outage-"))
    print(f"{down}: {persisted} of {outage} timed-out messages were persisted after all")
    assert values[-100:] == [b"after-%04d" % i for i in range(100)]
