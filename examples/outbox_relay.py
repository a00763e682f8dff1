"""Transactional outbox: orders and their events in one transaction, published by a relay.

    python examples/outbox_relay.py [DATABASE_URL]

Default database: SQLite in a temp directory (pass a PostgreSQL URL such as
``postgresql+psycopg://user@127.0.0.1:5432/db`` to use PostgreSQL; needs
``pip install "kresilient[outbox]"``). Starts a local 3-node Kafka cluster (or uses
``$KRESILIENT_BOOTSTRAP_SERVERS``). Writes 500 orders, each with its outbox row in the same
transaction, rolls every fifth one back, plus one event too large for Kafka, runs a relay
until the outbox is empty, and checks that exactly the committed orders were published and
the oversized event went to the dead-letter topic (byte for byte) instead of stopping the
relay.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import threading
import time
import uuid

import structlog
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine

from kresilient.outbox import OutboxRelay, enqueue, outbox_table
from kresilient.testing import KafkaCluster

ORDERS = 500
TOPIC = f"order-events-{uuid.uuid4().hex[:8]}"
DLQ = f"{TOPIC}.dlq"
MAX_BYTES = 100_000  # the relay producer's message.max.bytes

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def published(bootstrap: str, topic: str) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}"})
    end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < end and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(1000, 1.0) if m.error() is None]
    consumer.close()
    return values


def main() -> None:
    url = sys.argv[1] if len(sys.argv) > 1 else f"sqlite:///{tempfile.mkdtemp()}/shop.db"
    engine = create_engine(url)
    metadata = MetaData()
    orders = Table(
        "orders", metadata, Column("id", Integer, primary_key=True), Column("item", String(40))
    )
    outbox = outbox_table(metadata)
    metadata.create_all(engine)

    committed = []
    for i in range(ORDERS):
        with engine.connect() as conn, conn.begin() as tx:  # the business transaction
            conn.execute(orders.insert().values(id=i, item=f"book-{i}"))
            enqueue(conn, outbox, topic=TOPIC, key=b"shop-1", value=b"%d" % i)
            if i % 5 == 4:
                tx.rollback()  # neither the order nor its event exists
            else:
                committed.append(i)
    scan = b"\x89PNG" + b"\0" * (2 * MAX_BYTES)  # an event Kafka will never accept
    with engine.begin() as conn:
        enqueue(conn, outbox, topic=TOPIC, key=b"shop-1", value=scan)

    with KafkaCluster() as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        cluster.create_topic(DLQ, partitions=1, replication_factor=3)
        stop = threading.Event()
        config = {"bootstrap.servers": cluster.bootstrap_servers, "message.max.bytes": MAX_BYTES}
        with OutboxRelay(engine, outbox, config, dead_letter_topic=DLQ) as relay:
            worker = threading.Thread(target=relay.run, args=(stop,))
            worker.start()
            deadline = time.monotonic() + 60
            while relay.pending() and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            worker.join()
        ids = [int(v) for v in published(cluster.bootstrap_servers, TOPIC)]
        dead = published(cluster.bootstrap_servers, DLQ)
    assert ids == committed, "a committed order missing, or a rolled-back one published"
    assert dead == [scan], "the oversized event was not dead-lettered byte for byte"
    print(
        f"{len(ids)} committed orders published once, in order; {ORDERS - len(ids)} rolled "
        f"back; the oversized event dead-lettered to {DLQ}"
    )


if __name__ == "__main__":
    main()
