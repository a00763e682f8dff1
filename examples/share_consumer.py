"""A worker queue on Kafka: three ResilientShareConsumer members of one share group (KIP-932).

Run it against a Kafka 4.2+ cluster (``KRESILIENT_BOOTSTRAP_SERVERS=host:9092``) or let it
start a local 1-node KRaft cluster on Kafka 4.4.0 (needs Java and Maven; ~30 s)::

    python examples/share_consumer.py

What happens:

1. The share group ``jobs-<id>`` is set to start at the earliest offset (a new share group
   starts at the latest one) and 600 jobs are produced to a 2-partition topic (created with its
   dead-letter topic ``jobs-<id>.dlq``: the consumer checks at start that it exists); 1 % are not
   JSON (poison) and 5 % hit a flaky "renderer" that fails their first delivery.
2. Three members in threads share both partitions record by record. A flaky job is RELEASEd
   after the retry policy's wait and delivered again (its delivery count is the attempt, so the
   next attempt may run on another member); a poison job is written to ``jobs-<id>.dlq``, byte
   for byte with the ``kresilient.*`` headers, and ACCEPTed once the dead letter is
   acknowledged.
3. The members' counters and the dead letters are printed.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from kresilient.share import ResilientShareConsumer, configure_share_group
from kresilient.testing import KafkaCluster

JOBS = 600


def produce_jobs(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10})
    for i in range(JOBS):
        body = b"{not json" if i % 100 == 7 else json.dumps({"job": i}).encode()
        producer.produce(topic, body, key=str(i).encode())
    producer.flush(30)


def handle(msg: Message) -> None:
    job = json.loads(msg.value() or b"")  # poison raises ValueError: dead-lettered at once
    if job["job"] % 20 == 3 and msg.delivery_count() == 1:
        raise TimeoutError(f"renderer timed out on job {job['job']}")  # retried elsewhere


def run(
    bootstrap: str, *, replication: int = 1, cluster: KafkaCluster | None = None
) -> dict[str, Any]:
    """Run the three members until every job is settled; return their summed counters."""
    topic = f"jobs-{uuid.uuid4().hex[:6]}"
    if cluster is not None:
        cluster.create_topic(topic, 2, replication_factor=replication)
        cluster.create_topic(topic + ".dlq", 1, replication_factor=replication)
    else:  # the dead-letter topic must exist (DeadLetterPolicy.require_topic, the default)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        wanted = [NewTopic(topic, 2, replication), NewTopic(topic + ".dlq", 1, replication)]
        for future in admin.create_topics(wanted).values():
            future.result(30)
    config = {"bootstrap.servers": bootstrap, "group.id": topic}
    configure_share_group(config, topic, {"share.auto.offset.reset": "earliest"})
    produce_jobs(bootstrap, topic)
    members = [ResilientShareConsumer(config, [topic], handle) for _ in range(3)]
    threads = [threading.Thread(target=m.run, daemon=True) for m in members]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            done = sum(m.stats.accepted + m.stats.dead_lettered for m in members)
            if done >= JOBS:
                break
            time.sleep(0.2)
    finally:
        for m in members:
            m.stop()
        for t in threads:
            t.join(30)
        for m in members:
            m.close()
    totals: dict[str, Any] = {"topic": topic}
    for m in members:
        for name, value in m.health()["stats"].items():
            totals[name] = totals.get(name, 0) + value
    return totals


def main() -> None:
    external = os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
    if external:
        print(run(external))
        return
    with KafkaCluster(1, version="4.4.0") as cluster:
        print(run(cluster.bootstrap_servers, cluster=cluster))


if __name__ == "__main__":
    main()
