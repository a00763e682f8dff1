"""Issue 22 point 8: health() right after producing and after statistics, on the 3-node
cluster: every broker counts (idle ones included), never ``None`` while open."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def test_health_counts_every_broker_right_after_producing_and_after_statistics(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=1)  # one leader: two brokers stay idle (INIT)
    with ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "statistics.interval.ms": 300}
    ) as producer:
        producer.produce(topic, b"x")
        early = producer.health()  # before any statistics
        assert (early.brokers_up, early.brokers_total) == (3, 3)
        assert early.healthy
        producer.flush()
        deadline = time.monotonic() + 30
        while producer._brokers is None and time.monotonic() < deadline:
            producer.poll(0.1)
        assert producer._brokers is not None  # statistics did arrive (negative control)
        late = producer.health()
        assert (late.brokers_up, late.brokers_total) == (3, 3)
        assert late.healthy
    closed = producer.health()
    assert closed.closed and closed.brokers_up is None and not closed.healthy
