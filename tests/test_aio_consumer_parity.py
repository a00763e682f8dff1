"""AsyncResilientConsumer parity with ResilientConsumer (health, leadership, callbacks ...),
on the real cluster."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest
import tenacity
from confluent_kafka import Message
from test_consumer_integration import TopicFactory, committed, ends, produce, with_dlq

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ConsumerHealth, RetryPolicy
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _conf(cluster: KafkaCluster, group: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": group or f"g-{uuid.uuid4().hex[:10]}",
        **extra,
    }


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_health_reports_counts_holds_rebalances_breaker_and_leadership(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(None, b"%d-%d" % (p, i), None, p) for i in range(20) for p in (0, 1)],
    )
    attempts: dict[bytes, int] = defaultdict(int)
    release = asyncio.Event()
    stats: list[str] = []

    async def handle(msg: Message) -> None:
        value = msg.value() or b""
        attempts[value] += 1
        if value == b"1-3":
            raise ValueError("poison")  # dead-lettered at once
        if value == b"0-5" and not release.is_set():
            raise TimeoutError("downstream busy")  # retried: the partition is held

    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer = AsyncResilientConsumer(
        _conf(
            kafka_cluster,
            group,
            **{"statistics.interval.ms": 200, "stats_cb": stats.append},
        ),
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_never, wait=tenacity.wait_fixed(0.2)),
    )
    before = consumer.health()
    assert isinstance(before, ConsumerHealth) and not before.running
    task = asyncio.create_task(consumer.run())
    # partition 0 is held at offset 5 while the record keeps failing
    await _until(lambda: bool(consumer.health().held_partitions), 60, "a held partition")
    await _until(lambda: attempts[b"0-5"] >= 3, 60, "retries")
    held = consumer.health().held_partitions
    assert held[0]["topic"] == topic and held[0]["partition"] == 0 and held[0]["offset"] == 5
    assert held[0]["attempts"] >= 2
    release.set()
    await _until(lambda: consumer.processed + consumer.dead_lettered == 40, 60, "every record")
    # leadership from the consumer's own statistics (and the user's stats_cb still called)
    await _until(
        lambda: f"{topic}[0]" in consumer.health().leadership["partitions"], 60, "statistics"
    )
    health = consumer.health()
    consumer.stop()
    await asyncio.wait_for(task, 60)
    assert health.running and not health.stopping
    assert health.processed == 39 and health.dead_lettered == 1
    assert health.retries >= 2 and health.held_partitions == []
    assert health.dead_letters_pending == 0
    assert health.rebalances["assigned"] >= 1 and health.rebalances["lost"] == 0
    assert health.commit_failures == 0 and health.last_commit_error is None
    assert health.circuit_breaker is not None and not health.circuit_breaker["open"]
    lead = health.leadership
    assert lead["stats_ticks"] > 0 and lead["state"] == "stable"
    assert lead["partitions"][f"{topic}[0]"]["leader"] is not None
    assert stats, "the application's stats_cb was not called"
    after = consumer.health()
    assert not after.running and after.rebalances["revoked"] >= 1
    high = ends(kafka_cluster.bootstrap_servers, topic)
    assert committed(kafka_cluster.bootstrap_servers, group, topic, high) == high


@pytest.mark.parametrize("kind", ["async_producer", "sync_producer", "writer"])
async def test_dead_letters_through_the_applications_own_producer_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    from _producer_helpers import read_back
    from opentelemetry.sdk.trace import TracerProvider

    from kresilient.aio import AsyncResilientProducer
    from kresilient.deadletter import DeadLetterWriter, parse_dead_letter_headers
    from kresilient.producer import ResilientProducer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(
        bootstrap,
        topic,
        [
            (b"k%d" % i, b"bad-%d" % i if i in (3, 7) else b"ok", [("h", b"%d" % i)], None)
            for i in range(10)
        ],
    )

    async def handle(msg: Message) -> None:
        if (msg.value() or b"").startswith(b"bad"):
            raise ValueError("not an order")

    # a traced producer: it would add a traceparent header if asked to propagate
    tracing = TracerProvider()
    sink: Any
    if kind == "async_producer":
        sink = AsyncResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=tracing)
    elif kind == "sync_producer":
        sink = ResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=tracing)
    else:
        sink = DeadLetterWriter({"bootstrap.servers": bootstrap})
    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer = AsyncResilientConsumer(
        _conf(kafka_cluster, group), [topic], handle, dead_letter_producer=sink
    )
    task = asyncio.create_task(consumer.run())
    await _until(lambda: consumer.processed + consumer.dead_lettered == 10, 60, "every record")
    consumer.stop()
    await asyncio.wait_for(task, 60)
    assert consumer.dead_lettered == 2
    assert consumer._writer is None  # no writer of its own: the application's client wrote
    records = sorted(read_back(bootstrap, dlq), key=lambda r: r.key() or b"")
    assert [(r.key(), r.value()) for r in records] == [(b"k3", b"bad-3"), (b"k7", b"bad-7")]
    for r in records:
        names = [name for name, _ in r.headers() or []]
        assert "traceparent" not in names  # byte for byte: nothing of the producer's added
        info = parse_dead_letter_headers(r.headers())
        assert info.original_topic == topic and info.consumer_group == group
        assert info.original_headers == (("h", r.key()[1:]),)  # type: ignore[index]
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high
    # the application's client is not closed by the consumer
    if kind == "async_producer":
        await (await sink.produce(dlq, b"still open"))
        await sink.close()
    elif kind == "sync_producer":
        sink.produce(dlq, b"still open").result(30)
        sink.close()
    else:
        sink.close()
