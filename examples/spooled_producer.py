"""A spooled producer: a crash or an outage loses nothing it accepted.

    python examples/spooled_producer.py

Starts a local 3-node Kafka cluster (or uses ``$KRESILIENT_BOOTSTRAP_SERVERS``). Round 1: a
producer pointed at a port where nothing listens stores 1,000 orders in its spool and is
closed without any of them delivered (what a crash or a long outage leaves). Round 2: a new
producer on the same spool file and the real cluster re-sends them first (marked as possible
duplicates), then 1,000 new orders. A ``ResilientConsumer(dedupe=Deduplicator())`` skips
the marked copies of orders it already processed, so its handler sees each order exactly once.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from pathlib import Path

import structlog
from confluent_kafka import Message

from kresilient.consumer import ResilientConsumer
from kresilient.dedupe import Deduplicator
from kresilient.producer import ResilientProducer, Spool
from kresilient.testing import KafkaCluster

ORDERS = 1_000
TOPIC = f"orders-{uuid.uuid4().hex[:8]}"

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def main() -> None:
    path = Path(tempfile.mkdtemp()) / "orders-spool.db"
    with KafkaCluster() as cluster:
        bootstrap = cluster.bootstrap_servers
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        cluster.create_topic(TOPIC + ".dlq", partitions=1, replication_factor=3)

        # Round 1: nothing reachable -> everything stays in the spool (not reported lost).
        down = ResilientProducer(
            {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 2000},
            spool=Spool(path),
        )
        for i in range(ORDERS):
            down.produce(TOPIC, b"order-%05d" % i, key=b"customer-1")
        print("round 1:", down.flush(3))  # FlushResult(delivered=0, spooled=1000)
        down.close(1)

        # Round 2: the real cluster. The stored orders go first, then the new ones.
        with ResilientProducer({"bootstrap.servers": bootstrap}, spool=Spool(path)) as producer:
            for i in range(ORDERS, 2 * ORDERS):
                producer.produce(TOPIC, b"order-%05d" % i, key=b"customer-1")
            print("round 2:", producer.flush(60))

        processed: list[int] = []

        def handle(msg: Message) -> None:
            processed.append(int(msg.value()[6:]))  # type: ignore[index]
            if len(processed) == 2 * ORDERS:
                consumer.stop()

        consumer = ResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": f"billing-{TOPIC}"},
            [TOPIC],
            handle,
            dedupe=Deduplicator(),  # skips marked copies of ids it already processed
        )
        consumer.run()
        print("duplicates skipped:", consumer.health().duplicates_skipped)
        assert processed == list(range(2 * ORDERS)), "lost, duplicated or out of order"
        print(f"{len(processed)} orders, each exactly once and in order")


if __name__ == "__main__":
    main()
