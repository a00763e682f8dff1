"""AsyncResilientProducer on the real cluster (issue 14): results, failures, DLQ, cancellation.

Chaos (leader SIGKILL, preferred election, 2 of 3 nodes down) is in test_aio_producer_chaos.py.
"""

from __future__ import annotations

import asyncio
import gc
import uuid
import weakref
from typing import Any

import pytest
from _producer_helpers import header_dict, read_back
from confluent_kafka.aio import AIOProducer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kresilient.aio import AsyncDeliveryHandle, AsyncResilientProducer
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.errors import (
    DeliveryError,
    ErrorCategory,
    MessageTooLargeError,
    ProduceError,
    UnsafeConfigError,
)
from kresilient.producer import DeliveryResult
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def _conf(cluster: KafkaCluster, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **extra}


async def test_await_produce_then_await_handle_gives_where_it_was_written(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    async with AsyncResilientProducer(_conf(kafka_cluster)) as producer:
        handles = [await producer.produce(topic, b"v%d" % i, key=b"k") for i in range(50)]
        results = [await h for h in handles]
        await producer.flush()
        health = await producer.health()
    assert all(isinstance(r, DeliveryResult) for r in results)
    assert [r.offset for r in results] == list(range(50))
    assert {(r.topic, r.partition) for r in results} == {(topic, 0)}
    assert health.produced == 50 and health.failed_total == 0 and health.brokers_up == 3
    assert [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)] == [
        b"v%d" % i for i in range(50)
    ]


async def test_every_handle_is_done_when_flush_returns(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    # Both the poll thread and flush() serve delivery reports; librdkafka counts a message
    # until its callback returned, so a handle is done (no future needed to await it) once
    # flush() has returned, whichever thread served its report.
    async with AsyncResilientProducer(_conf(kafka_cluster)) as producer:
        for attempt in range(3):
            handles = [await producer.produce(topic, b"x" * 100) for _ in range(30_000)]
            await producer.flush()
            not_done = sum(not h.done() for h in handles)
            assert not_done == 0, f"attempt {attempt}: {not_done} handles not done after flush"
        assert (await handles[-1]).offset == 3 * 30_000 - 1


async def test_a_delivered_handle_nobody_keeps_is_freed_without_the_garbage_collector(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    # The async handle holds its sync handle, whose delivery callback is the async handle:
    # a cycle until delivery. Afterwards plain reference counting must free it, or every
    # message alive waits for a full collection (which scans all the others).
    async with AsyncResilientProducer(_conf(kafka_cluster)) as producer:
        handle = await producer.produce(topic, b"x")
        await producer.flush()
        assert (await handle).offset == 0
        gone = weakref.ref(handle)
        gc.disable()
        try:
            del handle
            assert gone() is None, "the delivered handle is only freed by the garbage collector"
        finally:
            gc.enable()


async def test_a_failed_delivery_raises_from_await_handle_and_from_flush(
    kafka_cluster: KafkaCluster,
) -> None:
    missing = f"aio-never-created-{uuid.uuid4().hex[:8]}"
    producer = AsyncResilientProducer(
        _conf(
            kafka_cluster, **{"message.timeout.ms": 3000, "topic.metadata.propagation.max.ms": 1000}
        )
    )
    handles = [await producer.produce(missing, b"x%d" % i) for i in range(3)]
    with pytest.raises(ProduceError) as one:
        await handles[0]
    assert one.value.classification.category is ErrorCategory.CONFIG
    assert one.value.topic == missing
    with pytest.raises(DeliveryError) as every:
        await producer.flush()
    assert sorted(f.message_id for f in every.value.failures) == [h.message_id for h in handles]
    await producer.flush()  # failures are reported once
    await producer.close()


async def test_unsafe_config_is_refused_naming_the_key(kafka_cluster: KafkaCluster) -> None:
    with pytest.raises(UnsafeConfigError) as info:
        AsyncResilientProducer(_conf(kafka_cluster, acks=1))
    assert info.value.key == "acks"
    assert "acks" in str(info.value)


async def test_oversized_value_goes_to_the_dead_letter_topic_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory()
    dlq = topic_factory(name=topic + ".dlq", config={"max.message.bytes": 4_000_000})
    big = bytes(range(256)) * 8_000  # 2 MB > message.max.bytes 1 MB
    async with AsyncResilientProducer(
        _conf(kafka_cluster), dead_letter_topic=dlq, dead_letter_max_bytes=4_000_000
    ) as producer:
        ok = await producer.produce(topic, b"small")
        diverted = await producer.produce(topic, big, key=b"k1", headers=[("h", b"1")])
        assert (await ok).topic == topic
        where = await diverted
    assert where.topic == dlq
    (record,) = read_back(kafka_cluster.bootstrap_servers, dlq)
    assert record.value() == big and record.key() == b"k1"
    info = parse_dead_letter_headers(record.headers())
    assert info.original_topic == topic
    assert info.original_headers == (("h", b"1"),)
    assert info.error_category == ErrorCategory.CONFIG.value  # MSG_SIZE_TOO_LARGE


async def test_oversized_value_without_dead_letter_topic_raises_at_produce(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    async with AsyncResilientProducer(_conf(kafka_cluster)) as producer:
        with pytest.raises(MessageTooLargeError):
            await producer.produce(topic, b"x" * 2_000_000)


async def test_trace_context_of_the_calling_task_goes_into_the_headers(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    async with AsyncResilientProducer(
        _conf(kafka_cluster),
        tracer_provider=provider,
        propagator=TraceContextTextMapPropagator(),
    ) as producer:

        async def request() -> AsyncDeliveryHandle:
            with tracer.start_as_current_span("request"):
                return await producer.produce(topic, b"traced")

        await (await asyncio.create_task(request()))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request_span = spans["request"]
    send = next(s for name, s in spans.items() if name != "request")
    assert send.parent is not None
    assert send.parent.span_id == request_span.context.span_id  # parented to the task's span
    (record,) = read_back(kafka_cluster.bootstrap_servers, topic)
    traceparent = header_dict(record)["traceparent"]
    assert traceparent is not None
    assert f"{request_span.context.trace_id:032x}".encode() in traceparent


async def test_propagate_false_sends_the_headers_exactly_as_given(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    original = [("traceparent", b"00-0123456789abcdef0123456789abcdef-0123456789abcdef-01")]
    async with AsyncResilientProducer(
        _conf(kafka_cluster), tracer_provider=provider, propagator=TraceContextTextMapPropagator()
    ) as producer:
        with tracer.start_as_current_span("forwarding"):
            await (await producer.produce(topic, b"as-is", headers=original, propagate=False))
            await (await producer.produce(topic, b"traced", headers=original))
    as_is, traced = read_back(kafka_cluster.bootstrap_servers, topic)
    assert as_is.headers() == original
    assert traced.headers() != original  # negative control: by default the context goes in


async def test_full_queue_is_awaited_not_spun_and_nothing_is_lost(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """A 200-message local queue and 5,000 messages: produce() awaits room; every one lands."""
    loop_turns = 0
    stop = asyncio.Event()

    async def ticker() -> None:  # proves the loop stays free while produce() waits
        nonlocal loop_turns
        while not stop.is_set():
            loop_turns += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    async with AsyncResilientProducer(
        _conf(kafka_cluster, **{"queue.buffering.max.messages": 200})
    ) as producer:
        max_in_flight = 0
        for i in range(5000):
            await producer.produce(topic, b"%05d" % i)
            # kresilient's own count of messages handed to librdkafka and not yet settled:
            # len(producer) would also count client events (delivery-report batches, errors)
            # waiting in librdkafka's reply queue, which can pass the message bound by a few
            max_in_flight = max(max_in_flight, producer._bridge.in_flight)
        await producer.flush()
        health = await producer.health()
    stop.set()
    await tick
    assert 0 < max_in_flight <= 200  # the count is live (not 0) and never passed the bound
    assert producer.backpressure_waits > 0  # negative control: the queue really was full
    assert health.backpressure_waits == 0  # never reached the sync producer's spinning path
    assert loop_turns > 100  # the loop ran other tasks while produce() awaited room
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert values == [b"%05d" % i for i in range(5000)]


@pytest.mark.parametrize("text", ["€" * 20_000, "e" * 20_000], ids=["multibyte", "ascii"])
async def test_a_str_value_counts_its_utf8_bytes_against_the_queue_budget(
    kafka_cluster: KafkaCluster, topic: str, text: str
) -> None:
    """queue.buffering.max.kbytes=64: kresilient waits for room at 90% of it (58,982 bytes).
    A str of 20,000 euro signs is 60,000 bytes on the wire (UTF-8): once it is queued the
    budget is spent and the next produce() awaits room (issue 35 suspicion: on c15a167 the
    str's 20,000 characters were counted, so the budget looked a third full). Control: an
    ASCII str of the same length (20,000 bytes) leaves room, no wait."""
    async with AsyncResilientProducer(
        _conf(kafka_cluster, **{"queue.buffering.max.kbytes": 64})
    ) as producer:
        first = await producer.produce(topic, text)  # no await inside: nothing settles
        assert producer._bridge.in_flight_bytes == len(text.encode())
        second = await producer.produce(topic, "after")
        await first
        await second
    assert producer.backpressure_waits == (1 if not text.isascii() else 0)
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert values == [text.encode(), b"after"]


async def test_cancelling_the_producing_task_loses_track_of_nothing(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """The task awaits each batch's handles; it is cancelled mid-stream while messages are in
    flight. Every produce() that returned is acknowledged (flush raises nothing) and on the
    topic exactly once; the awaits it abandoned did not cancel their messages."""
    producer = AsyncResilientProducer(_conf(kafka_cluster, **{"linger.ms": 50}))
    returned: list[AsyncDeliveryHandle] = []
    in_flight_at_cancel: list[int] = []
    cancelled_in_await = asyncio.Event()

    async def produce_forever() -> None:
        i = 0
        while True:
            batch = []
            for _ in range(500):
                batch.append(await producer.produce(topic, b"%06d" % i))
                returned.append(batch[-1])
                i += 1
            try:
                await asyncio.gather(*batch)
            except asyncio.CancelledError:
                cancelled_in_await.set()
                raise

    task = asyncio.create_task(produce_forever())
    while len(returned) < 5000 or len(producer) == 0:
        await asyncio.sleep(0.001)
    in_flight_at_cancel.append(len(producer))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert in_flight_at_cancel[0] > 0  # negative control: messages really were in flight
    await producer.flush(60)  # DeliveryError if any were lost or failed
    await producer.close()
    assert all(h.done() for h in returned)
    results = [await h for h in returned]
    assert [r.offset for r in results] == list(range(len(returned)))
    values = [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert values == [b"%06d" % i for i in range(len(returned))]


async def test_cancelling_one_awaiter_does_not_cancel_another_awaiting_the_same_handle(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    async with AsyncResilientProducer(_conf(kafka_cluster, **{"linger.ms": 200})) as producer:
        handle = await producer.produce(topic, b"shared")
        first = asyncio.create_task(_await(handle))
        second = asyncio.create_task(_await(handle))
        await asyncio.sleep(0)
        first.cancel()
        assert (await second).topic == topic
        with pytest.raises(asyncio.CancelledError):
            await first


async def _await(handle: AsyncDeliveryHandle) -> DeliveryResult:
    return await handle


async def test_produce_after_close_is_a_classified_error(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    producer = AsyncResilientProducer(_conf(kafka_cluster))
    await producer.close()
    await producer.close()  # idempotent
    with pytest.raises(ProduceError) as info:
        await producer.produce(topic, b"late")
    assert "closed" in str(info.value)


async def test_raw_aioproducer_cannot_send_headers_why_kresilient_does_not_wrap_it(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """Documents the design decision in docs/asyncio.md: if a confluent-kafka upgrade makes
    this fail, AIOProducer can carry traceparent/dead-letter headers and may be reconsidered."""
    raw = AIOProducer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    try:
        with pytest.raises(NotImplementedError):
            await raw.produce(topic, b"v", headers=[("traceparent", b"00-...")])
    finally:
        await raw.close()


@pytest.mark.asyncio
async def test_unreachable_timeout_reaches_the_sync_producer_and_fails_within_it(
    closed_port: int,
) -> None:
    """``AsyncResilientProducer(unreachable_timeout=...)`` is the sync producer's bound (issue 36
    #2): a producer pointed at a closed port gets the classified "never reached" failure, and
    ``None`` opts out as in the sync producer."""
    from kresilient import DeliveryError, ProduceError
    from kresilient.aio import AsyncResilientProducer

    config = {"bootstrap.servers": f"127.0.0.1:{closed_port}"}
    waiting = AsyncResilientProducer(config, unreachable_timeout=None)
    try:
        assert waiting._sync._unreachable_timeout is None
    finally:
        await waiting.close(timeout=0)
    producer = AsyncResilientProducer(config, unreachable_timeout=1.0)
    try:
        assert producer._sync._unreachable_timeout == 1.0
        handle = await producer.produce("orders", b"v")
        with pytest.raises(ProduceError) as info:
            await asyncio.wait_for(handle, timeout=60)
        text = str(info.value)
        assert f"127.0.0.1:{closed_port}" in text and "never sent" in text, text
    finally:
        with pytest.raises(DeliveryError):  # close() lists the failed message, as flush() does
            await producer.close()
