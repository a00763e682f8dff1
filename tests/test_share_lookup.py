"""The share consumer's dead-letter lookup (kresilient/share/_lookup.py) on the real cluster.

A redelivered poison record's dead letter may already be written (its first member died
between the dead letter's acknowledgement and the ACCEPT): the lookup finds it by the
``kresilient.original.*`` headers, and only it. Plain topics on the session cluster: the
lookup reads the dead-letter topic with a plain consumer, whatever the source's group type.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from kresilient.deadletter import ORIGINAL_OFFSET, ORIGINAL_PARTITION, ORIGINAL_TOPIC
from kresilient.share._lookup import dead_letter_exists, lookup_config
from kresilient.testing import KafkaCluster


def _records(cluster: KafkaCluster, topic: str, n: int) -> list[Message]:
    """``n`` records written to ``topic`` partition 0 and read back (real Message objects)."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    for i in range(n):
        producer.produce(topic, b"v%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap_servers, "group.id": uuid.uuid4().hex}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Message] = []
    try:
        while len(out) < n:
            out += [m for m in consumer.consume(n, 10) if m.error() is None]
    finally:
        consumer.close()
    return out


def _dead_letter(cluster: KafkaCluster, dlq: str, msg: Message, partition: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers})
    headers = [
        (ORIGINAL_TOPIC, str(msg.topic()).encode()),
        (ORIGINAL_PARTITION, str(msg.partition()).encode()),
        (ORIGINAL_OFFSET, str(msg.offset()).encode()),
    ]
    producer.produce(dlq, msg.value(), key=msg.key(), headers=headers, partition=partition)
    assert producer.flush(30) == 0


@pytest.mark.integration
def test_the_lookup_finds_a_records_dead_letter_and_only_it(kafka_cluster: KafkaCluster) -> None:
    topic = kafka_cluster.create_topic(f"lookup-{uuid.uuid4().hex[:8]}", 1, 3, {})
    dlq = kafka_cluster.create_topic(f"{topic}.dlq", 3, 3, {})
    records = _records(kafka_cluster, topic, 5)
    config = lookup_config(
        {
            "bootstrap.servers": kafka_cluster.bootstrap_servers,
            "group.id": "share-g",
            "sasl.password": "never-used",
            "client.id": "worker",
        }
    )
    assert "group.id" in config and config["group.id"] != "share-g"
    # negative control first: nothing written yet, nothing found
    assert not dead_letter_exists(config, dlq, records[2], timeout=30)
    _dead_letter(kafka_cluster, dlq, records[1], partition=0)  # a neighbour, another partition
    _dead_letter(kafka_cluster, dlq, records[2], partition=2)
    _dead_letter(kafka_cluster, dlq, records[3], partition=1)
    assert dead_letter_exists(config, dlq, records[2], timeout=30)
    assert dead_letter_exists(config, dlq, records[3], timeout=30)
    assert not dead_letter_exists(config, dlq, records[0], timeout=30)
    assert not dead_letter_exists(config, dlq, records[4], timeout=30)


@pytest.mark.integration
def test_the_lookup_of_a_topic_that_does_not_exist_finds_nothing(
    kafka_cluster: KafkaCluster,
) -> None:
    topic = kafka_cluster.create_topic(f"lookup-{uuid.uuid4().hex[:8]}", 1, 3, {})
    (record,) = _records(kafka_cluster, topic, 1)
    config = lookup_config({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    assert not dead_letter_exists(config, f"{topic}.missing-dlq", record, timeout=30)


def test_the_lookup_config_keeps_the_connection_and_drops_the_rest() -> None:
    config = lookup_config(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "security.protocol": "SASL_SSL",
            "sasl.password": "s3cret",
            "group.id": "share-g",
            "share.acknowledgement.mode": "explicit",
            "statistics.interval.ms": 5000,
            "stats_cb": print,
            "client.id": "worker",
        }
    )
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.password"] == "s3cret"
    assert "share.acknowledgement.mode" not in config and "stats_cb" not in config
    assert "statistics.interval.ms" not in config
    assert config["client.id"] == "worker-dlq-lookup" and config["enable.auto.commit"] is False
