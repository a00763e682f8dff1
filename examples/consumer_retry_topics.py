"""A ResilientConsumer with non-blocking retry topics and Kubernetes probes.

Run it against a cluster (``KRESILIENT_BOOTSTRAP_SERVERS=host:9092``) or let it start a local
3-node KRaft cluster (needs Java; ~30 s)::

    python examples/consumer_retry_topics.py

What happens:

1. 500 payments are produced to ``payments-<id>``; 2 % hit a "fraud service" that refuses the
   first attempt, 1 payment is refused every time.
2. The consumer moves each refused payment to ``payments-<id>.retry.2s`` (then ``.retry.5s``)
   instead of holding its partition: every other payment is handled at once; the moved ones
   come back when due; the one refused every time ends in ``payments-<id>.dlq``, byte for byte.
3. Meanwhile ``/live`` and ``/ready`` answer on 127.0.0.1 (``health_port``), as a Kubernetes
   probe would ask them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import urllib.request
import uuid
from contextlib import ExitStack

import structlog
from confluent_kafka import Message
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kresilient.consumer import ResilientConsumer, RetryTopicPolicy
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

PAYMENTS = 500
# Unordered (the default): a moved record's later same-key records are handled before it.
# RetryTopicPolicy(delays=(2, 5), ordered=True) keeps them behind it (docs/consumer.md).
TIERS = RetryTopicPolicy(delays=(2, 5))


def create_topics(bootstrap: str, names: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, 3, 3) for n in names], operation_timeout=30)
    for future in futures.values():
        future.result(60)


def main(bootstrap: str | None = None) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with ExitStack() as stack:
        bootstrap = bootstrap or os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
        if not bootstrap:
            bootstrap = stack.enter_context(KafkaCluster()).bootstrap_servers
        topic = f"payments-{uuid.uuid4().hex[:6]}"
        create_topics(bootstrap, [topic, *TIERS.topics(topic), topic + ".dlq"])
        with ResilientProducer({"bootstrap.servers": bootstrap}) as producer:
            for i in range(PAYMENTS):
                body = {"id": i, "suspicious": i % 50 == 1, "blocked": i == 250}
                producer.produce(topic, json.dumps(body).encode(), key=b"card-%d" % (i % 40))
            producer.flush()

        handled: set[int] = set()
        consumer: ResilientConsumer

        def pay(msg: Message) -> None:
            payment = json.loads(msg.value() or b"")
            retried = any(h[0] == "kresilient.retry.tier" for h in msg.headers() or [])
            if payment["blocked"] or (payment["suspicious"] and not retried):
                raise ConnectionError("fraud service refused")  # -> the next retry tier
            handled.add(payment["id"])

        def done() -> bool:
            # The last event may be the dead letter rather than a handled payment (the one
            # refused every time goes through both tiers first): watched from here, not in pay.
            return len(handled) == PAYMENTS - 1 and consumer.health().dead_lettered == 1

        consumer = ResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": f"payments-{uuid.uuid4().hex[:6]}"},
            [topic],
            pay,
            retry_topics=TIERS,
            health_port=0,  # a Kubernetes pod would use a fixed port and health_host="0.0.0.0"
            install_signal_handlers=False,
        )
        worker = threading.Thread(target=consumer.run)
        worker.start()
        while consumer.health_port is None and worker.is_alive():
            time.sleep(0.05)
        for path in ("/live", "/ready"):
            url = f"http://127.0.0.1:{consumer.health_port}{path}"
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    print(f"GET {path}: {resp.status}")
            except OSError as exc:  # 503 before the group is joined
                print(f"GET {path}: {exc}")
        deadline = time.monotonic() + 120
        while worker.is_alive() and not done() and time.monotonic() < deadline:
            time.sleep(0.1)
        consumer.stop()
        worker.join(30)
        health = consumer.health()
        print(
            f"handled {len(handled)} of {PAYMENTS}; moved to retry topics: "
            f"{health.moved_to_retry}; dead-lettered: {health.dead_lettered}"
        )
        return 0 if len(handled) == PAYMENTS - 1 and health.dead_lettered == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
