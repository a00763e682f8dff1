"""Transactional outbox: orders and their events in one transaction, published by a relay.

    python examples/outbox_relay.py [DATABASE_URL]

Default database: SQLite in a temp directory (pass a PostgreSQL URL such as
``postgresql+psycopg://user@127.0.0.1:5432/db`` to use PostgreSQL; needs
``pip install "kresilient[outbox]"``). Starts a local 3-node Kafka cluster (or uses
``$KRESILIENT_BOOTSTRAP_SERVERS``). Writes 500 orders, each with its outbox row in the same
transaction, rolls every fifth one back, runs a relay until the outbox is empty, and checks
that exactly the committed orders were published.
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

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def published(bootstrap: str) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{TOPIC}"})
    end = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)[1]
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    ids: list[int] = []
    deadline = time.monotonic() + 60
    while len(ids) < end and time.monotonic() < deadline:
        ids += [int(m.value()) for m in consumer.consume(1000, 1.0) if m.error() is None]
    consumer.close()
    return ids


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

    with KafkaCluster() as cluster:
        cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
        stop = threading.Event()
        with OutboxRelay(engine, outbox, {"bootstrap.servers": cluster.bootstrap_servers}) as relay:
            worker = threading.Thread(target=relay.run, args=(stop,))
            worker.start()
            deadline = time.monotonic() + 60
            while relay.pending() and time.monotonic() < deadline:
                time.sleep(0.2)
            stop.set()
            worker.join()
        ids = published(cluster.bootstrap_servers)
    assert ids == committed, "a committed order missing, or a rolled-back one published"
    print(f"{len(ids)} committed orders published once, in order; {ORDERS - len(ids)} rolled back")


if __name__ == "__main__":
    main()
