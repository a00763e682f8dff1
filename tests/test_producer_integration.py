"""ResilientProducer against the real 3-node cluster: delivery, handles, health, tracing,
the dead-letter path for oversized values, fatal errors, and secrets in captured logs."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from _producer_helpers import header_dict, read_back
from structlog.testing import capture_logs

from kresilient.deadletter import ERROR_CATEGORY, ORIGINAL_TOPIC, parse_dead_letter_headers
from kresilient.errors import (
    ConfigError,
    DeliveryError,
    ErrorCategory,
    FatalProducerError,
    UnsafeConfigError,
)
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _config(cluster: KafkaCluster, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": cluster.bootstrap_servers, **extra}


def test_every_handle_resolves_and_records_come_back_in_order(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory(partitions=3)
    with ResilientProducer(_config(kafka_cluster, **{"statistics.interval.ms": 1000})) as producer:
        handles = [
            producer.produce(topic, b"v%05d" % i, key=b"k%d" % (i % 10)) for i in range(3000)
        ]
        producer.flush()
        results = [h.result(timeout=0) for h in handles]
        producer.poll(1.5)  # at least one statistics tick
        health = producer.health()
    assert all(r.topic == topic and r.offset >= 0 for r in results)
    assert len({(r.partition, r.offset) for r in results}) == 3000
    records = read_back(kafka_cluster.bootstrap_servers, topic)
    assert sorted(m.value() for m in records) == [b"v%05d" % i for i in range(3000)]
    by_partition: dict[int, list[bytes]] = {}
    for m in records:
        by_partition.setdefault(m.partition(), []).append(m.value())
    for values in by_partition.values():
        assert values == sorted(values)  # produce order kept within each partition
    # the Java-compatible murmur2 partitioner: one key, one partition
    key_parts: dict[bytes, set[int]] = {}
    for m in records:
        key_parts.setdefault(m.key(), set()).add(m.partition())
    assert all(len(p) == 1 for p in key_parts.values())
    assert health.brokers_up == 3 and health.brokers_total == 3
    assert health.failed_total == 0 and health.produced == 3000
    assert set(health.leadership.values()) == {"STABLE"}
    assert topic in health.metadata_age_ms
    assert health.healthy


def test_handles_the_application_keeps_are_never_reused(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    # Delivered handles nobody references are recycled for later messages; the ones the
    # application holds must keep their own outcome.
    topic = topic_factory(partitions=3)
    kept: dict[int, Any] = {}
    with ResilientProducer(_config(kafka_cluster)) as producer:
        for i in range(30_000):
            handle = producer.produce(topic, b"m%05d" % i)
            if i % 7 == 0:
                kept[i] = handle
            if i % 5000 == 0:
                producer.poll(0.05)  # let reports (and recycling) happen mid-stream
        producer.flush()
        assert len(producer._pool) > 0  # recycling did happen
    records = {
        (m.partition(), m.offset()): m.value()
        for m in read_back(kafka_cluster.bootstrap_servers, topic)
    }
    assert len(records) == 30_000
    for i, handle in kept.items():
        assert handle.message_id == i + 1
        r = handle.result(timeout=0)
        assert records[(r.partition, r.offset)] == b"m%05d" % i


def test_trace_context_is_injected_and_the_span_ends_at_the_delivery_report(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with ResilientProducer(_config(kafka_cluster), tracer_provider=provider) as producer:
        handle = producer.produce(topic, b"traced", headers=[("app", b"1")])
        assert exporter.get_finished_spans() == ()  # not ended at enqueue
        producer.flush()
    result = handle.result()
    spans = exporter.get_finished_spans()
    assert len(spans) == 1
    (record,) = read_back(kafka_cluster.bootstrap_servers, topic)
    headers = header_dict(record)
    assert headers["app"] == b"1"
    trace_id = f"{spans[0].context.trace_id:032x}"
    assert trace_id in headers["traceparent"].decode()  # type: ignore[union-attr]
    assert record.offset() == result.offset


def test_oversized_value_goes_to_the_dead_letter_topic_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory()
    dlq = topic_factory(config={"max.message.bytes": 4 * 1024 * 1024})
    big = bytes(range(256)) * 400  # 102400 bytes, over the 50000 limit below
    with ResilientProducer(
        _config(kafka_cluster, **{"message.max.bytes": 50_000}), dead_letter_topic=dlq
    ) as producer:
        small = producer.produce(topic, b"fits")
        diverted = producer.produce(topic, big, key=b"order-7", headers=[("trace", b"abc")])
        producer.flush()
    assert small.result().topic == topic
    assert diverted.result().topic == dlq
    (record,) = read_back(kafka_cluster.bootstrap_servers, dlq)
    assert record.value() == big
    assert record.key() == b"order-7"
    headers = header_dict(record)
    assert headers["trace"] == b"abc"
    assert headers[ORIGINAL_TOPIC] == topic.encode()
    assert headers[ERROR_CATEGORY] == b"config"
    info = parse_dead_letter_headers(record.headers())
    assert info.original_topic == topic
    assert info.exception_type is not None and "MessageTooLarge" in info.exception_type
    assert info.original_headers == (("trace", b"abc"),)
    assert [m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)] == [b"fits"]


def _gapless(cluster: KafkaCluster, **extra: Any) -> dict[str, Any]:
    # enable.gapless.guarantee turns a permanent produce error into a real fatal error
    # (_GAPLESS_GUARANTEE): the broker-side way to get one without a transactional fence.
    return _config(cluster, **{"enable.gapless.guarantee": True, "linger.ms": 50, **extra})


def test_fatal_error_raises_fatal_producer_error_and_close_lists_every_failure(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    topic = topic_factory(config={"max.message.bytes": 2000})
    producer = ResilientProducer(_gapless(kafka_cluster))
    handles = [producer.produce(topic, b"small") for _ in range(5)]
    handles.append(producer.produce(topic, b"x" * 5000))  # broker: MESSAGE_TOO_LARGE
    with pytest.raises(FatalProducerError) as fatal:
        producer.flush()
    assert fatal.value.classification.fatal
    assert fatal.value.classification.category is ErrorCategory.FATAL_PRODUCER
    with pytest.raises(FatalProducerError):
        producer.produce(topic, b"after")
    assert producer.health().fatal_error is not None and not producer.health().healthy
    with pytest.raises(DeliveryError) as closed:
        producer.close()
    failed = {f.message_id for f in closed.value.failures}
    assert failed == {h.message_id for h in handles}
    assert isinstance(closed.value.__cause__, FatalProducerError)


def test_recreate_on_fatal_accounts_for_every_message_then_keeps_producing(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    bad = topic_factory(config={"max.message.bytes": 2000})
    good = topic_factory(partitions=3)
    producer = ResilientProducer(_gapless(kafka_cluster), recreate_on_fatal=True)
    sent = [(good, b"g%05d" % i) for i in range(20_000)]
    sent.append((bad, b"x" * 5000))  # the broker refuses it: fatal under the gapless guarantee
    sent += [(good, b"h%05d" % i) for i in range(20_000)]
    with capture_logs() as logs, pytest.raises(DeliveryError) as info:
        handles = [producer.produce(t, v) for t, v in sent]  # the fatal may come in here
        producer.flush()
    failures = info.value.failures
    assert producer.health().recreations == 1
    assert any(e["event"] == "producer_recreated" for e in logs)
    failed_ids = {f.message_id for f in failures}
    delivered = [i for i, h in enumerate(handles) if h.exception(timeout=0) is None]
    # every message is either acknowledged or reported failed: none forgotten
    assert len(failed_ids) == len(failures)
    assert len(failed_ids) + len(delivered) == len(handles)
    assert handles[20_000].message_id in failed_ids
    for f in failures:
        if f.classification.name == "_PURGE_INFLIGHT":
            assert f.classification.possibly_persisted  # may have been written
        elif f.classification.name == "_PURGE_QUEUE":
            assert not f.classification.possibly_persisted  # never left the local queue
        else:
            assert f.classification.name == "MSG_SIZE_TOO_LARGE", f
    stored = {m.value() for m in read_back(kafka_cluster.bootstrap_servers, good)}
    assert {sent[i][1] for i in delivered} <= stored  # every acknowledged message is there
    after = producer.produce(good, b"after-recreate")
    producer.flush()
    assert after.result().topic == good
    producer.close()


def test_unsafe_and_unknown_settings_are_refused_naming_the_key(
    kafka_cluster: KafkaCluster,
) -> None:
    with pytest.raises(UnsafeConfigError) as unsafe:
        ResilientProducer(_config(kafka_cluster, acks=1))
    assert unsafe.value.key == "acks"
    with pytest.raises(ConfigError) as unknown:
        ResilientProducer(_config(kafka_cluster, **{"enable.idempotency": True}))
    assert unknown.value.key == "enable.idempotency"
    assert "enable.idempotence" in str(unknown.value)


def test_secrets_are_absent_from_captured_logs_of_a_real_session(
    kafka_cluster: KafkaCluster, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = {
        "sasl.password": "hunter2-a",
        "ssl.key.password": "hunter2-b",
        "sasl.oauthbearer.client.secret": "hunter2-c",
        "ssl.keystore.password": "hunter2-d",
    }
    with capture_logs() as logs:
        producer = ResilientProducer(
            _config(kafka_cluster, **secrets, debug="conf,broker", log_level=7)
        )
        producer.produce(topic, b"x")
        producer.flush()
        text = repr(producer) + repr(producer.health())
        producer.close()
    assert len(logs) > 5
    assert "hunter2" not in repr(logs) + caplog.text + text


def test_dead_lettered_record_keeps_the_callers_traceparent_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    topic = topic_factory()
    dlq = topic_factory(config={"max.message.bytes": 4 * 1024 * 1024})
    upstream = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("request"),
        ResilientProducer(
            _config(kafka_cluster, **{"message.max.bytes": 50_000}),
            dead_letter_topic=dlq,
            tracer_provider=provider,
        ) as producer,
    ):
        handle = producer.produce(topic, b"x" * 100_000, headers=[("traceparent", upstream)])
        producer.flush()
    assert handle.result().topic == dlq
    (record,) = read_back(kafka_cluster.bootstrap_servers, dlq)
    raw = record.headers() or []
    # The original header, first and unchanged; the DLQ write's own context is kept apart.
    assert raw[0] == ("traceparent", upstream)
    assert [k for k, _ in raw].count("traceparent") == 1
    assert b"kresilient.traceparent" in {k.encode() for k, _ in raw}
