"""ResilientProducer failure paths without a broker (a closed loopback port): what happens to
the data when a step raises (issue 11 defect 4 and "Also", issue 23 defects 3 and 11, issue 22
point 8, and the secrets of issue 11 defect 5)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from structlog.testing import capture_logs

from kresilient.errors import (
    DeadLetterError,
    DeliveryError,
    FatalProducerError,
    KResilientError,
    ProduceError,
)
from kresilient.producer import ResilientProducer


@pytest.fixture(name="offline")
def _offline() -> dict[str, Any]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}


@pytest.fixture(name="make")
def _make(offline: dict[str, Any]) -> Iterator[Any]:
    made: list[ResilientProducer] = []

    def make(extra: dict[str, Any] | None = None, **kwargs: Any) -> ResilientProducer:
        producer = ResilientProducer({**offline, **(extra or {})}, exit_timeout=0, **kwargs)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        with contextlib.suppress(KResilientError):  # leftovers are the point of some tests
            producer.close(0)


class _BrokenDeadLetterProducer:
    """A dead-letter producer whose flush/close raise something other than DeliveryError."""

    def __init__(self) -> None:
        self.broken = True

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float | None = None) -> None:
        if self.broken:
            raise FatalProducerError("dead-letter producer fenced")

    def close(self, _timeout: float | None = None) -> None:
        if self.broken:
            raise FatalProducerError("dead-letter producer fenced")


def _one_failure(make: Any, broken: _BrokenDeadLetterProducer) -> tuple[ResilientProducer, int]:
    producer = make({"message.timeout.ms": 300, "linger.ms": 0}, dead_letter_topic="dlq")
    assert producer._dead_letters is not None
    producer._dead_letters.writer = broken
    handle = producer.produce("t", b"x")
    assert handle.exception(timeout=30) is not None  # the failure happened (negative control)
    return producer, handle.message_id


def test_flush_keeps_failures_when_the_dead_letter_flush_raises(make: Any) -> None:
    broken = _BrokenDeadLetterProducer()
    producer, message_id = _one_failure(make, broken)
    with pytest.raises(FatalProducerError):
        producer.flush()
    broken.broken = False
    with pytest.raises(DeliveryError) as info:
        producer.flush()  # the failure is still reported, not forgotten
    assert [f.message_id for f in info.value.failures] == [message_id]
    producer.flush()  # reported once


def test_close_lists_failures_when_the_dead_letter_close_raises(make: Any) -> None:
    broken = _BrokenDeadLetterProducer()
    producer, message_id = _one_failure(make, broken)
    with pytest.raises(DeliveryError) as info:
        producer.close()
    assert [f.message_id for f in info.value.failures] == [message_id]
    assert isinstance(info.value.__cause__, FatalProducerError)
    assert health_closed(producer)


def health_closed(producer: ResilientProducer) -> bool:
    return producer.health().closed and len(producer) == 0


def _fatal() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FATAL, "fenced by a test", fatal=True))


@pytest.mark.parametrize("threads", [2, 8])
def test_threads_meeting_one_fatal_error_recreate_once(make: Any, threads: int) -> None:
    producer = make(recreate_on_fatal=True)
    generation = producer.health().recreations  # before the calls that met the error
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def meet() -> None:
        barrier.wait()
        try:
            producer._handle_fatal(_fatal(), generation)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=meet) for _ in range(threads)]
    with capture_logs() as logs:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert errors == []
    assert producer.health().recreations == 1
    assert [e["event"] for e in logs].count("producer_recreated") == 1
    producer.produce("t", b"after")  # the new instance works
    # a fatal error of the NEW instance is a new event: it recreates again
    producer._handle_fatal(_fatal(), 1)
    assert producer.health().recreations == 2


def test_threads_meeting_one_fatal_error_raise_the_same_error_and_log_it_once(
    make: Any,
) -> None:
    producer = make()
    barrier = threading.Barrier(4)
    raised: list[BaseException] = []

    def meet() -> None:
        barrier.wait()
        try:
            producer._handle_fatal(_fatal(), 0)
        except BaseException as exc:
            raised.append(exc)

    workers = [threading.Thread(target=meet) for _ in range(4)]
    with capture_logs() as logs:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert len(raised) == 4 and all(isinstance(e, FatalProducerError) for e in raised)
    assert len({id(e) for e in raised}) == 1
    assert [e["event"] for e in logs].count("producer_fatal_error") == 1


@pytest.fixture(name="spans")
def _spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


@pytest.mark.parametrize(
    "bad",
    [{"key": 12345}, {"headers": [("h", 12345)]}, {"timestamp": "yesterday"}],
    ids=["int-key", "int-header-value", "str-timestamp"],
)
def test_span_ends_when_produce_raises_a_non_kafka_exception(
    make: Any, spans: tuple[TracerProvider, InMemorySpanExporter], bad: dict[str, Any]
) -> None:
    provider, exporter = spans
    producer = make(tracer_provider=provider)
    with pytest.raises(TypeError):
        producer.produce("t", b"v", **{"headers": [("ok", b"1")], **bad})
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None and span.attributes.get("error.type") == "TypeError"
    producer.flush(5)  # nothing was queued: nothing to report


def test_message_key_is_not_on_spans_unless_asked(
    make: Any, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    for record in (False, True):
        producer = make(tracer_provider=provider, record_message_key=record)
        producer.produce("t", b"v", key=b"alice@example.com")
        with pytest.raises(DeliveryError):
            producer.close(0)
    default, opted_in = exporter.get_finished_spans()
    assert "messaging.kafka.message.key" not in (default.attributes or {})
    assert (opted_in.attributes or {}).get("messaging.kafka.message.key") == "alice@example.com"


def test_produce_after_close_says_the_producer_is_closed(make: Any) -> None:
    producer = make()
    producer.close()
    with pytest.raises(ProduceError) as info:
        producer.produce("t", b"x")
    assert "closed" in str(info.value)
    assert "transaction" not in info.value.classification.remedy.lower()
    assert "Create a new client" in info.value.classification.remedy


SECRET = "Sup3rS3cretValue42xq"


def _slices(secret: str, n: int = 8) -> set[str]:
    return {secret[i : i + n] for i in range(len(secret) - n + 1)}


@pytest.mark.parametrize(
    "oauth_config",
    [f"principal=alice {SECRET}", f"principal=alice extension_x={SECRET} junk"],
    ids=["bare-secret", "secret-in-pair"],
)
def test_malformed_oauthbearer_config_never_leaks_a_fragment(
    offline: dict[str, Any], caplog: pytest.LogCaptureFixture, oauth_config: str
) -> None:
    caplog.set_level(logging.DEBUG)
    user_logger = logging.getLogger("app.rdkafka")
    config = {
        **offline,
        "log_level": 7,
        "debug": "conf,security",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": True,
        "sasl.oauthbearer.config": oauth_config,
        "sasl.password": "an0ther-S3cret-pw",
        "message.timeout.ms": 500,
        "logger": user_logger,
    }
    with capture_logs() as logs:
        producer = ResilientProducer(config, exit_timeout=0)
        producer.produce("t", b"x")
        with pytest.raises(DeliveryError) as info:
            producer.flush()
        text = " ".join(
            [repr(producer), repr(producer.health()), str(info.value), repr(info.value.failures)]
        )
        producer.close(0)
    everything = " ".join([text, repr(logs), caplog.text])
    # negative control: librdkafka did complain about the value (and echoed part of it)
    assert "oauthbearer.config" in everything
    assert any(e["event"] == "kafka_client_error" for e in logs)
    leaked = {s for s in _slices(SECRET) | _slices("an0ther-S3cret-pw") if s in everything}
    assert leaked == set()


def test_oversized_value_refused_by_the_dead_letter_writer_too_raises_dead_letter_error(
    make: Any,
) -> None:
    producer = make(
        {"message.max.bytes": 10_000}, dead_letter_topic="dlq", dead_letter_max_bytes=20_000
    )
    with pytest.raises(DeadLetterError) as info:
        producer.produce("t", b"x" * 50_000)
    assert "dead_letter_max_bytes=20000" in str(info.value)
    producer.flush(5)  # nothing queued anywhere: nothing to report


def test_dead_letter_write_that_fails_later_is_reported_by_flush_and_the_handle(
    make: Any,
) -> None:
    producer = make(
        {"message.max.bytes": 10_000, "message.timeout.ms": 500}, dead_letter_topic="dlq"
    )
    seen: list[Any] = []
    handle = producer.produce(
        "t", b"x" * 20_000, key=b"k", on_delivery=lambda err, msg: seen.append((err, msg))
    )
    with pytest.raises(DeliveryError) as info:
        producer.flush()
    assert [f.topic for f in info.value.failures] == ["dlq"]
    error = handle.exception(0)
    assert isinstance(error, ProduceError) and isinstance(error.__cause__, DeadLetterError)
    assert len(seen) == 1 and seen[0][0] is not None and seen[0][1].key() == b"k"


class _ExplodingProcessor(SimpleSpanProcessor):
    def on_end(self, span: Any) -> None:
        raise RuntimeError("span processor bug")


def test_a_span_processor_that_raises_changes_nothing_for_the_message(make: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(_ExplodingProcessor(exporter))
    producer = make({"message.timeout.ms": 300, "linger.ms": 0}, tracer_provider=provider)
    handle = producer.produce("t", b"v", headers=[("h", b"1")])
    with pytest.raises(DeliveryError) as info:
        producer.flush()
    assert [f.message_id for f in info.value.failures] == [handle.message_id]
    assert isinstance(handle.exception(0), ProduceError)
