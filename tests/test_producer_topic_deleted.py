"""Issue 23 defect 6: deleting a topic while producing to it is the application's problem
(a missing topic, CONFIG), not leadership trouble: no partition enters TRANSIENT_BURST or
SUSTAINED_CHURN. Real cluster."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from kresilient.errors import DeliveryError, ErrorCategory, ProduceError
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def test_deleting_the_topic_while_producing_is_not_leadership_trouble(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=3)
    producer = ResilientProducer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap_servers,
            "statistics.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 500,
            "message.timeout.ms": 8000,
            "linger.ms": 5,
        },
        exit_timeout=0,
    )
    try:
        for i in range(300):
            producer.produce(topic, b"before%d" % i)
        producer.flush()
        known = time.monotonic() + 30
        while len(producer.health().leadership) < 3 and time.monotonic() < known:
            producer.poll(0.2)  # statistics tick: the monitor learns the partitions
        assert set(producer.health().leadership.values()) == {"STABLE"}
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
        deleted = admin.delete_topics([topic])[topic]
        failures: list[Any] = []
        refused: list[ProduceError] = []
        produced = 0
        # keep producing through the deletion (messages in flight meet the broker's
        # UNKNOWN_TOPIC_OR_PART) until librdkafka refuses the missing topic at produce time
        deadline = time.monotonic() + 60
        while len(refused) < 50 and time.monotonic() < deadline:
            for _ in range(20):
                produced += 1
                try:
                    producer.produce(topic, b"after%d" % produced)
                except ProduceError as exc:
                    refused.append(exc)
            producer.poll(0.05)
            if deleted.done() and produced % 400 == 0:
                try:
                    producer.flush()
                except DeliveryError as exc:
                    failures.extend(exc.failures)
        deleted.result(0)
        try:
            producer.flush()
        except DeliveryError as exc:
            failures.extend(exc.failures)
        # negative control: the deletion did fail deliveries, as a missing topic
        names = {f.classification.name for f in failures}
        assert "UNKNOWN_TOPIC_OR_PART" in names, names
        assert {f.classification.category for f in failures} <= {
            ErrorCategory.CONFIG,
            ErrorCategory.DELIVERY_TIMEOUT,
        }
        assert all(e.classification.category is ErrorCategory.CONFIG for e in refused)
        states = set(producer.health().leadership.values())
        assert not states & {"TRANSIENT_BURST", "SUSTAINED_CHURN"}, states
    finally:
        with contextlib.suppress(DeliveryError):
            producer.close(0)
