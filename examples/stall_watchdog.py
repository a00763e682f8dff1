"""A producer whose broker hangs: the watchdog says so once, health() turns false, and the
producer is healed; close() stays bounded with the broker frozen.

    python examples/stall_watchdog.py

Starts a local one-node Kafka cluster, produces a few orders, then freezes the broker with
SIGSTOP (a hung broker or a long GC pause: the connection stays open, librdkafka still counts
the broker up, no delivery report ever comes). With ``on_stall="heal"`` the watchdog reports
``producer_stalled`` after ``stall_after_s``, recreates the underlying producer, and the orders
it held are reported failed with their classification (``flush()`` lists them: nothing is
dropped silently). The broker is thawed and the failed orders are produced again (those
purged in flight may have been written already: a consumer deduplicates them). It freezes a
node: run it without ``$KRESILIENT_BOOTSTRAP_SERVERS``. See docs/stalls.md.
"""

from __future__ import annotations

import time

import structlog

import kresilient.logging
from kresilient import DeliveryError, ResilientProducer
from kresilient.testing import KafkaCluster

TOPIC = f"orders-{int(time.time())}"
ORDERS = 20

kresilient.logging.configure()  # INFO and above on stderr: stdout keeps the program's output
log = structlog.get_logger("stall_watchdog")


def main() -> None:
    with KafkaCluster(nodes=1) as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=1)
        config = {"bootstrap.servers": cluster.bootstrap_servers, "statistics.interval.ms": 1000}
        with ResilientProducer(config, stall_after_s=5.0, on_stall="heal") as producer:
            producer.produce(TOPIC, b"order-first")
            producer.flush(30)
            cluster.freeze(1)  # SIGSTOP: the broker hangs
            log.warning("froze the broker")
            orders = {}  # message id -> value, to produce again what the heal failed
            for i in range(ORDERS):
                value = b"order-%02d" % i
                orders[producer.produce(TOPIC, value).message_id] = value
            deadline = time.monotonic() + 60
            while producer.health().recreations == 0 and time.monotonic() < deadline:
                producer.poll(0.2)  # the watchdog runs as statistics are served
            health = producer.health()  # the stall was reported, then healed at once
            log.info("healed", stalls=health.stalls, recreations=health.recreations)
            cluster.thaw(1)
            try:
                producer.flush(60)
            except DeliveryError as exc:  # what the stalled instance held: reported, not lost
                log.warning("produced again after the heal", orders=len(exc.failures))
                for failure in exc.failures:
                    producer.produce(TOPIC, orders[failure.message_id])
                producer.flush(60)
            log.info("healthy again", healthy=producer.health().healthy)
        print(f"all {ORDERS + 1} orders acknowledged (some possibly twice); close() returned")


if __name__ == "__main__":
    main()
