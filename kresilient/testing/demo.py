"""``kresilient demo``: produce through a fault on a real local cluster, then prove it.

Starts a 3-node KRaft Kafka (or uses ``KRESILIENT_BOOTSTRAP_SERVERS`` without the chaos),
produces numbered messages through :class:`kresilient.ResilientProducer`, injects a fault on
the partition leader a third of the way in and ends it later, then reads everything back
and prints what happened: the election, the producer's view of leadership, and the count of
missing and duplicated messages (both must be 0). The faults (``fault=``):

- ``kill``: SIGKILL the leader (a crash); restart it later.
- ``isolate``: cut the leader from clients and from the other nodes (a network
  partition, seed 000); the controller elects a new leader; heal later.
- ``ack-loss``: the leader keeps processing requests but its responses never reach the
  client (lost acknowledgements, seed 002) until the client times out and retries; the
  idempotent producer's retries are deduplicated by the broker.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError

from kresilient.testing._cluster import BOOTSTRAP_ENV, KafkaCluster

TOPIC = "kresilient.demo"


def _read_back(bootstrap: str, expected: int) -> list[int]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kresilient-demo-check",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    seen: list[int] = []
    deadline = time.monotonic() + 120
    idle = 0
    while time.monotonic() < deadline and (len(seen) < expected or idle < 2):
        batch = consumer.consume(10_000, timeout=0.5)
        idle = 0 if batch else idle + 1
        for msg in batch:
            err = msg.error()
            if err is None:
                seen.append(int(msg.value() or b"-1"))
            elif err.code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(f"reading back failed: {err}")
    consumer.close()
    return seen


def _inject(cluster: KafkaCluster, fault: str, leader: int, at: int, producer: Any) -> str:
    t0 = time.monotonic()
    if fault == "kill":
        cluster.kill(leader)
        new_leader = cluster.wait_for_leader(TOPIC, not_on=leader, timeout=60)
        return (
            f"SIGKILL node {leader} (leader) at message {at}: node {new_leader} "
            f"elected from the ISR in {time.monotonic() - t0:.1f}s"
        )
    if fault == "isolate":
        cluster.network.isolate(leader)
        new_leader = cluster.wait_for_leader(TOPIC, not_on=leader, timeout=60)
        return (
            f"ISOLATED node {leader} (leader) from clients and peers at message {at}: node "
            f"{new_leader} elected from the ISR in {time.monotonic() - t0:.1f}s"
        )
    network = cluster.network
    accepted = network.connections_accepted(leader)
    network.drop_responses(leader)
    # Keep the acknowledgements lost until the producer gave up waiting (request.timeout.ms)
    # and reconnected to retry: the broker has then stored messages the client thinks failed.
    deadline = time.monotonic() + 60
    while network.connections_accepted(leader) <= accepted and time.monotonic() < deadline:
        producer.poll(0.1)
    network.heal(leader)
    return (
        f"DROPPED {network.dropped_responses(leader)} responses of node {leader} (leader) at "
        f"message {at} for {time.monotonic() - t0:.1f}s: requests processed, acknowledgements "
        "lost, the producer timed out and retried"
    )


def _end(cluster: KafkaCluster, fault: str, leader: int, at: int) -> str:
    if fault == "kill":
        cluster.start(leader)
        return f"restarted node {leader} at message {at}"
    if fault == "isolate":
        cluster.network.heal(leader)
        return f"healed the network of node {leader} at message {at}"
    return f"(acknowledgements flowing again since the retry; message {at})"


def _quiet_librdkafka(
    _logger: Any, _name: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    # The demo is an application, so it may configure structlog: show kresilient's own
    # state changes, not librdkafka's connection chatter while a broker is down.
    if event.get("event") == "librdkafka_log":
        raise structlog.DropEvent
    return event


FAULTS = ("kill", "isolate", "ack-loss")
"""The faults :func:`main` can inject."""


def main(messages: int = 200_000, fault: str = "kill") -> int:
    """Run the demo; returns 0 when every message was acknowledged exactly once."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    structlog.configure(
        processors=[
            _quiet_librdkafka,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        # The report is the result (stdout); the events narrating it are logs (stderr).
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    from kresilient.errors import DeliveryError
    from kresilient.producer import ResilientProducer

    print("Starting a local 3-node Apache Kafka (KRaft) cluster ...", flush=True)
    # On the cluster named by $KRESILIENT_BOOTSTRAP_SERVERS the demo runs without the fault,
    # and there are no proxies to ask for (KafkaCluster refuses network_faults there).
    proxies = fault != "kill" and not os.environ.get(BOOTSTRAP_ENV)
    with KafkaCluster(network_faults=proxies) as cluster:
        print(f"  ready in {cluster.start_seconds:.1f}s at {cluster.bootstrap_servers}")
        cluster.create_topic(
            TOPIC, partitions=1, replication_factor=3, config={"min.insync.replicas": 2}
        )
        leader = cluster.leader(TOPIC)
        print(f"  topic {TOPIC}: replicas {cluster.replicas(TOPIC)}, leader node {leader}")

        acked = 0
        failed = 0

        def on_delivery(err: Any, msg: Any) -> None:
            nonlocal acked, failed
            if err is None:
                acked += 1
            else:
                failed += 1

        kill_at, restart_at = messages // 3, (2 * messages) // 3
        events: list[str] = []
        began = time.monotonic()
        with ResilientProducer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "client.id": "kresilient-demo",
                # A short demo: statistics every second so the leadership monitor sees the move.
                "statistics.interval.ms": 1000,
                # librdkafka gives up on an unanswered request after this (default 60 s).
                "socket.timeout.ms": 5000,
            }
        ) as producer:
            for i in range(messages):
                producer.produce(TOPIC, str(i).encode(), on_delivery=on_delivery)
                if i == kill_at and cluster.supports_chaos:
                    events.append(_inject(cluster, fault, leader, i, producer))
                if i == restart_at and cluster.supports_chaos:
                    events.append(_end(cluster, fault, leader, i))
            try:
                producer.flush()
            except DeliveryError as exc:
                print(f"  delivery failures reported (never silent): {exc}")
            health = producer.health()
        elapsed = time.monotonic() - began
        if cluster.supports_chaos:
            cluster.wait_for_isr(TOPIC, size=3, timeout=120)
            events.append(f"ISR back to {sorted(cluster.isr(TOPIC))}")

        what = {"kill": "a leader crash", "isolate": "a leader partition", "ack-loss": "lost acks"}
        print(f"\nProduced {messages} messages in {elapsed:.1f}s through {what[fault]}:")
        for line in events:
            print(f"  - {line}")
        print(f"  acknowledged {acked}, reported failed {failed}")
        print(f"  producer health: {health}")

        seen = _read_back(cluster.bootstrap_servers, acked)
        unique = set(seen)
        missing = acked - len(unique & set(range(messages)))
        duplicates = len(seen) - len(unique)
        in_order = seen == sorted(seen)
        print(
            f"\nRead back {len(seen)} messages: missing {missing}, duplicates {duplicates}, "
            f"in order: {in_order}"
        )
        ok = failed == 0 and missing == 0 and duplicates == 0 and acked == messages and in_order
        print("RESULT: " + ("no acknowledged message lost, none duplicated" if ok else "FAILED"))
        return 0 if ok else 1
