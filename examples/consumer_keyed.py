"""Many records of one partition in flight, in order per key (issue 40, docs/parallel.md).

Run it against any cluster (``KRESILIENT_BOOTSTRAP_SERVERS=host:9092``) or let it start a local
3-node KRaft cluster (needs Java; ~30 s)::

    python examples/consumer_keyed.py

2,000 account events over 100 accounts go to ONE partition; the handler "calls a service"
(sleeps 5 ms). With ``ordering="key"`` and 32 in flight they are handled about 30 times faster
than one at a time, each account's events in offset order; the committed offset is the
lowest unfinished record, with the finished ones above it listed in its metadata.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

from confluent_kafka import Message, Producer

from kresilient.consumer import ResilientConsumer
from kresilient.testing import KafkaCluster

EVENTS = 2_000
ACCOUNTS = 100


def produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(EVENTS):
        producer.produce(topic, b"event %d" % i, key=b"account-%d" % (i % ACCOUNTS), partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0


def consume(bootstrap: str, topic: str) -> dict[bytes, list[int]]:
    """Handle every event with 32 in flight; return each account's offsets in handling order."""
    seen: dict[bytes, list[int]] = {}
    lock = threading.Lock()
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        time.sleep(0.005)  # the service call
        with lock:
            seen.setdefault(msg.key() or b"", []).append(msg.offset() or 0)
            if sum(map(len, seen.values())) == EVENTS:
                consumer.stop()

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"accounts-{uuid.uuid4().hex[:6]}"},
        [topic],
        handle,
        ordering="key",
        max_in_flight=32,
        install_signal_handlers=False,
    )
    consumer.run()
    return seen


def main() -> int:
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        topic = f"accounts-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 1, 3)
        cluster.create_topic(topic + ".dlq", 1, 3)
        produce(cluster.bootstrap_servers, topic)
        start = time.perf_counter()
        seen = consume(cluster.bootstrap_servers, topic)
        took = time.perf_counter() - start
    in_order = all(offsets == sorted(offsets) for offsets in seen.values())
    print(
        f"{EVENTS} events of {len(seen)} accounts in {took:.1f} s; per-account order kept: "
        f"{in_order}"
    )
    return 0 if in_order and sum(map(len, seen.values())) == EVENTS else 1


if __name__ == "__main__":
    sys.exit(main())
