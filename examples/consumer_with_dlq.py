"""A ResilientConsumer with retries, a dead-letter topic, inspection and replay.

Run it against any cluster (``KRESILIENT_BOOTSTRAP_SERVERS=host:9092``) or let it start a local
3-node KRaft cluster (needs Java; ~30 s)::

    python examples/consumer_with_dlq.py

What happens:

1. 1,000 orders are produced to ``orders-<id>``; 1 % are not JSON (poison) and 2 % hit a
   "payment gateway" that times out on the first two attempts.
2. A ResilientConsumer handles them: the flaky ones are retried (their partition is paused
   between attempts, the other partitions keep flowing); the poison ones go to
   ``orders-<id>.dlq`` at once, byte for byte, with the ``kresilient.*`` error headers.
3. ``kresilient dlq inspect`` shows the dead letters; the handler is "fixed" and
   ``kresilient dlq replay --filter category=poison`` brings them back for processing.
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from argparse import Namespace
from typing import Any

import structlog
import tenacity
from confluent_kafka import Message

from kresilient.consumer import ConsumerHealth, ResilientConsumer, RetryPolicy
from kresilient.deadletter_cli import main_inspect, main_replay
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

ORDERS = 1000


def produce_orders(bootstrap: str, topic: str) -> None:
    with ResilientProducer({"bootstrap.servers": bootstrap}) as producer:
        for i in range(ORDERS):
            if i % 100 == 7:
                value = b"<order id=%d>not json</order>" % i  # poison
            else:
                value = json.dumps({"id": i, "amount": i % 50, "flaky": i % 50 == 3}).encode()
            producer.produce(
                topic, value, key=b"customer-%d" % (i % 20), headers=[("source", b"web")]
            )
        producer.flush()


def run(bootstrap: str, topic: str, group: str, handler: Any, expected: int) -> ConsumerHealth:
    """Consume until ``expected`` messages were handled (a service would run until SIGTERM)."""
    done = 0
    consumer: ResilientConsumer

    def counting(msg: Message) -> None:
        nonlocal done
        handler(msg)
        done += 1
        if done == expected:
            consumer.stop()

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [topic],
        counting,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_fixed(0.2)),
    )
    consumer.run()  # returns after stop(): the last batch is committed, the group left
    return consumer.health()


def main() -> int:
    # WARNING: each dead letter's message_failed line (with the exception) and a dependency
    # outage's start and end; retries are DEBUG, rebalances INFO
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with KafkaCluster() as cluster:
        bootstrap = cluster.bootstrap_servers
        topic = f"orders-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, partitions=3, replication_factor=3)
        cluster.create_topic(topic + ".dlq", partitions=3, replication_factor=3)
        produce_orders(bootstrap, topic)
        group = f"billing-{uuid.uuid4().hex[:6]}"
        attempts: dict[int, int] = {}

        def bill(msg: Message) -> None:
            order = json.loads(msg.value() or b"")  # ValueError: dead-lettered at once
            if order["flaky"]:
                attempts[order["id"]] = attempts.get(order["id"], 0) + 1
                if attempts[order["id"]] <= 2:
                    raise TimeoutError("payment gateway timed out")  # retried
            # ... charge order["amount"] ...

        health = run(bootstrap, topic, group, bill, expected=ORDERS - 10)
        print(
            f"\nprocessed {health.processed}, retries {health.retries}, "
            f"dead-lettered {health.dead_lettered}\n"
        )

        connection = {
            "bootstrap_servers": bootstrap,
            "command_config": None,
            "property": None,
            "group": None,
            "timeout": 30.0,
        }
        main_inspect(
            Namespace(topic=topic + ".dlq", limit=2, brief=False, json=False, **connection)
        )

        print("\nthe handler learns to read the legacy XML orders; replaying the poison ones:")
        main_replay(
            Namespace(
                source=topic + ".dlq",
                target=topic,
                filters=["category=poison"],
                dry_run=False,
                limit=None,
                keep_timestamp=False,
                **connection,
            )
        )

        def bill_v2(msg: Message) -> None:
            value = msg.value() or b""
            if value.startswith(b"<order"):
                print(
                    f"  billed legacy order {value[10 : value.index(b'>')].decode()} "
                    f"(headers {msg.headers()})"
                )
            else:
                bill(msg)

        run(bootstrap, topic, group, bill_v2, expected=10)  # same group: only the replayed
    return 0


if __name__ == "__main__":
    sys.exit(main())
