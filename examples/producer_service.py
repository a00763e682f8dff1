"""A producer service that survives a broker crash: no message lost, none duplicated.

    python examples/producer_service.py

Starts a local 3-node Kafka cluster (or uses ``$KRESILIENT_BOOTSTRAP_SERVERS``), produces
30,000 orders with ResilientProducer, SIGKILLs the leader of their partition a third of the way
through (and restarts it later), then reads the topic back and checks that every order arrived
exactly once and in order. On an external cluster the kill is skipped.
"""

from __future__ import annotations

import time

import structlog
from confluent_kafka import Consumer, TopicPartition

import kresilient.logging
from kresilient import DeliveryError, ResilientProducer
from kresilient.testing import KafkaCluster

ORDERS = 30_000
TOPIC = f"orders-{int(time.time())}"

kresilient.logging.configure()  # INFO and above on stderr: stdout keeps the program's output
log = structlog.get_logger("producer_service")


def read_back(bootstrap: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{TOPIC}"})
    end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)[1]
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    values: list[bytes] = []
    while len(values) < end:
        values += [m.value() for m in consumer.consume(1000, 1.0) if m.error() is None]
    consumer.close()
    return values


def main() -> None:
    with KafkaCluster() as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        victim = cluster.leader(TOPIC)
        # Safe defaults: acks=all, idempotence, bounded delivery timeout, murmur2 partitioner.
        with ResilientProducer({"bootstrap.servers": cluster.bootstrap_servers}) as producer:
            for i in range(ORDERS):
                producer.produce(TOPIC, b"order-%06d" % i, key=b"customer-%d" % (i % 97))
                if i == ORDERS // 3 and cluster.supports_chaos:
                    log.warning("killing the partition leader", node=victim)
                    cluster.kill(victim)  # SIGKILL, mid-stream
                if i == 2 * ORDERS // 3 and cluster.supports_chaos:
                    cluster.start(victim)
                    log.info("restarted the old leader", node=victim)
                if i % 1000 == 999:
                    time.sleep(0.02)  # a service's pace: the stream spans the failover
            try:
                producer.flush()  # raises DeliveryError listing every failed message
            except DeliveryError as exc:
                for failure in exc.failures:
                    log.error("not delivered", id=failure.message_id, why=failure.classification)
                raise
            health = producer.health()
        log.info(
            "all acknowledged",
            produced=health.produced,
            failed=health.failed_total,
            leader_now=cluster.leader(TOPIC),
            leadership=health.leadership,
        )
        values = read_back(cluster.bootstrap_servers)
        expected = [b"order-%06d" % i for i in range(ORDERS)]
        assert values == expected, "lost, duplicated or reordered orders"
        log.info("read back: every order exactly once, in order", orders=len(values))


if __name__ == "__main__":
    main()
