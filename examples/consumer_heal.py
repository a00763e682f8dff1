"""A consumer whose connections hang: the stall is said once and healed by a new client.

    python examples/consumer_heal.py

Starts a local one-node Kafka cluster behind the harness's fault proxy, consumes a few
orders, then freezes every connection the consumer has open (no byte either way, the sockets
stay up: librdkafka's hung connection, #5153) while more orders are written. The consumer's
fetch is never answered; with ``on_stall="heal"`` it reports ``consumer_stalled`` after
``stall_after_s``, recreates its librdkafka consumer (``consumer_recreated``: new connections,
a new member of the group resuming from the committed offsets) and handles the rest. An order
handled before the heal and not committed is handled again (at least once, nothing skipped).
It injects network faults: run it without ``$KRESILIENT_BOOTSTRAP_SERVERS``. See
docs/stalls.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog
from confluent_kafka import Message, Producer

import kresilient.logging
from kresilient import ResilientConsumer
from kresilient.testing import KafkaCluster

TOPIC = f"orders-{int(time.time())}"
ORDERS = 20

log = structlog.get_logger("consumer_heal")


def run(cluster: KafkaCluster) -> tuple[int, int]:
    """The scenario on a cluster started with ``network_faults=True``: returns (orders
    handled, heals)."""
    cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
    cluster.create_topic(f"{TOPIC}.dlq", partitions=1, replication_factor=1)
    handled: set[bytes] = set()

    def handle(msg: Message) -> None:
        handled.add(msg.value() or b"")

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "orders-service",
            "client.id": "orders-service",
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 1000,  # a hung fetch is seen in the statistics
            "session.timeout.ms": 6000,  # the hung old member leaves the group sooner
        },
        [TOPIC],
        handle,
        stall_after_s=5.0,
        on_stall="heal",
        install_signal_handlers=False,
    )
    runner = threading.Thread(target=consumer.run)
    runner.start()
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "client.id": "shop"})

    def wait(condition: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 90
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)
        log.info(condition, handled=len(handled))

    try:
        for i in range(ORDERS // 2):
            producer.produce(TOPIC, b"order-%02d" % i)
        producer.flush(30)
        wait("first orders handled", lambda: len(handled) == ORDERS // 2)
        frozen = cluster.network.freeze_connections(client_id="orders-service")
        log.warning("froze the consumer's connections", connections=frozen)
        for i in range(ORDERS // 2, ORDERS):
            producer.produce(TOPIC, b"order-%02d" % i)  # the shop's connections still work
        producer.flush(30)
        wait("every order handled", lambda: len(handled) == ORDERS)
        health = consumer.health()
        log.info("healed", stalls=health.stalls, recreations=health.recreations)
    finally:
        cluster.network.heal()
        consumer.stop()
        runner.join(60)
    return len(handled), health.recreations


def main() -> None:
    kresilient.logging.configure()  # INFO and above on stderr: stdout keeps the output
    with KafkaCluster(nodes=1, network_faults=True) as cluster:
        handled, heals = run(cluster)
    print(f"{handled} of {ORDERS} orders handled, {heals} heal(s)")


if __name__ == "__main__":
    main()
