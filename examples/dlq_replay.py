"""Dead letters from Python: see what failed, fix the cause, replay only what can now succeed.

A consumer dead-letters two orders: one is poison (not JSON; replaying it would fail again),
one failed because the payment service was down (a ``ConnectionError``, retried, then
dead-lettered). After the "fix", :func:`inspect_dead_letters` shows both by error and
:func:`replay_dead_letters` sends back only the ``ConnectionError`` one, committing the
replay group's offsets so a second run sends nothing twice. The consumer then handles the
replayed order. Run it against a cluster of your own::

    python examples/dlq_replay.py --bootstrap-servers 127.0.0.1:9092

or without arguments to start a local 3-node cluster (``kresilient.testing``). The same from
a shell: ``kresilient dlq inspect TOPIC.dlq`` and ``kresilient dlq replay --from TOPIC.dlq
--filter exception=ConnectionError --group GROUP``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Iterator

import structlog
import tenacity
from confluent_kafka import Message

from kresilient import ResilientConsumer, ResilientProducer, RetryPolicy
from kresilient.admin import create_topic
from kresilient.deadletter_cli import inspect_dead_letters, replay_dead_letters

payment_service_up = False
handled: list[int] = []


@contextlib.contextmanager
def _cluster(servers: str | None) -> Iterator[str]:
    if servers:
        yield servers
        return
    from kresilient.testing import KafkaCluster

    print("starting a local 3-node Kafka cluster ...", file=sys.stderr)
    with KafkaCluster() as cluster:
        yield cluster.bootstrap_servers


def consume_until(servers: str, topic: str, last_id: int) -> None:
    """Run the billing consumer until it has handled the order ``last_id``."""
    consumer: ResilientConsumer | None = None

    def handle(msg: Message) -> None:
        order = json.loads(msg.value() or b"")  # ValueError: poison, dead-lettered at once
        if order.get("needs_payment") and not payment_service_up:
            raise ConnectionError("payment service unreachable")  # retried, then dead-lettered
        handled.append(order["id"])
        if order["id"] == last_id and consumer is not None:
            consumer.stop()  # after this message; offsets are committed on the way out

    consumer = ResilientConsumer(
        {"bootstrap.servers": servers, "group.id": f"{topic}-billing"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.2)),
    )
    consumer.run()


def main() -> int:
    global payment_service_up
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
    )
    parser.add_argument("--replication-factor", type=int, default=3)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    with _cluster(args.bootstrap_servers) as servers:
        topic = f"orders-{uuid.uuid4().hex[:8]}"
        dlq = f"{topic}.dlq"
        # One partition keeps the story in order: order 4 comes after both dead letters.
        create_topic(servers, topic, replication_factor=args.replication_factor, dead_letter=True)
        with ResilientProducer({"bootstrap.servers": servers}) as producer:
            producer.produce(topic, json.dumps({"id": 0}).encode())
            producer.produce(topic, b"{not json", key=b"1")
            producer.produce(topic, json.dumps({"id": 2}).encode())
            producer.produce(topic, json.dumps({"id": 3, "needs_payment": True}).encode())
            producer.produce(topic, json.dumps({"id": 4}).encode())
        consume_until(servers, topic, last_id=4)
        print(f"handled {handled}; 2 orders dead-lettered to {dlq}")

        seen = inspect_dead_letters(dlq, bootstrap_servers=servers)
        for (category, exception), count in seen.by_error.items():
            print(f"  {count} x {category} {exception}")
        for record in seen.records:
            print(f"  offset {record.offset}: {record.info.exception_type}: {record.value!r}")

        payment_service_up = True  # the cause is fixed: replay what failed because of it
        replay = replay_dead_letters(
            dlq,
            bootstrap_servers=servers,
            filters=["exception=ConnectionError"],  # not the poison: it would fail again
            group=f"{topic}-replay",
        )
        print(f"replay: {json.dumps(replay.summary())}")
        if not replay.ok or replay.replayed != 1:
            return 1
        again = replay_dead_letters(
            dlq,
            bootstrap_servers=servers,
            filters=["exception=ConnectionError"],
            group=f"{topic}-replay",
        )
        print(f"second replay: read {again.read}, replayed {again.replayed}")

        consume_until(servers, topic, last_id=3)  # the replayed order, handled this time
        print(f"handled {handled}")
        return 0 if again.replayed == 0 and handled[-1] == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
