"""Dead-letter record format, parsing and the circuit breaker (pure logic, no broker)."""

from __future__ import annotations

import datetime as dt
import json
import struct

import pytest
from confluent_kafka import Message
from confluent_kafka.error import ValueDeserializationError

from kresilient import deadletter as dl
from kresilient.consumer._breaker import CircuitBreaker
from kresilient.errors import CircuitBreakerOpenError, ErrorCategory, classify

ORIGINAL = [
    ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("bin", bytes(range(256))),
    ("null", None),
    ("dup", b"1"),
    ("dup", b"2"),
]
WHEN = dt.datetime(2026, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)


def _headers(**kw: object) -> list[tuple[str, bytes | None]]:
    args: dict[str, object] = {
        "original_headers": ORIGINAL,
        "failed_at": WHEN,
    }
    args.update(kw)
    try:
        raise ValueError("bad payload") from KeyError("inner")
    except ValueError as exc:
        return dl.dead_letter_headers(
            "orders",
            3,
            1234,
            1_700_000_000_123,
            "billing",
            exc,
            None,
            2,
            **args,  # type: ignore[arg-type]
        )


def test_issue_header_names_are_exact() -> None:
    assert dl.KRESILIENT_HEADERS[:10] == (
        "kresilient.original.topic",
        "kresilient.original.partition",
        "kresilient.original.offset",
        "kresilient.original.timestamp",
        "kresilient.consumer.group",
        "kresilient.exception.type",
        "kresilient.exception.message",
        "kresilient.error.category",
        "kresilient.attempts",
        "kresilient.failed.at",
    )


def test_java_header_names_match_their_sources() -> None:
    # spring-kafka KafkaHeaders.DLT_* and Kafka Streams ExceptionHandlerUtils.HEADER_ERRORS_*
    assert set(dl.SPRING_HEADERS) == {
        "kafka_dlt-original-topic",
        "kafka_dlt-original-partition",
        "kafka_dlt-original-offset",
        "kafka_dlt-original-timestamp",
        "kafka_dlt-original-timestamp-type",
        "kafka_dlt-original-consumer-group",
        "kafka_dlt-exception-fqcn",
        "kafka_dlt-exception-cause-fqcn",
        "kafka_dlt-exception-message",
        "kafka_dlt-exception-stacktrace",
    }
    assert set(dl.STREAMS_HEADERS) == {
        "__streams.errors.exception",
        "__streams.errors.message",
        "__streams.errors.stacktrace",
        "__streams.errors.topic",
        "__streams.errors.partition",
        "__streams.errors.offset",
    }


def test_original_headers_come_first_byte_for_byte() -> None:
    headers = _headers()
    assert headers[: len(ORIGINAL)] == ORIGINAL
    own = dict(headers[len(ORIGINAL) :])
    assert own == {
        "kresilient.original.topic": b"orders",
        "kresilient.original.partition": b"3",
        "kresilient.original.offset": b"1234",
        "kresilient.original.timestamp": b"1700000000123",
        "kresilient.consumer.group": b"billing",
        "kresilient.exception.type": b"ValueError",
        "kresilient.exception.message": b"bad payload",
        "kresilient.error.category": b"unknown",
        "kresilient.attempts": b"2",
        "kresilient.failed.at": b"2026-05-01T12:00:00.123Z",
    }


def test_trace_context_gets_its_own_names() -> None:
    headers = _headers(trace_context={"traceparent": "00-abc-def-01", "tracestate": "k=v"})
    names = [k for k, _ in headers]
    assert names.count("traceparent") == 1  # the original one, untouched
    assert dict(headers)["kresilient.traceparent"] == b"00-abc-def-01"
    assert dict(headers)["kresilient.tracestate"] == b"k=v"


def test_spring_compat_uses_java_binary_encodings() -> None:
    h = dict(_headers(compat=("spring",)))
    assert struct.unpack(">i", h["kafka_dlt-original-partition"] or b"")[0] == 3
    assert struct.unpack(">q", h["kafka_dlt-original-offset"] or b"")[0] == 1234
    assert struct.unpack(">q", h["kafka_dlt-original-timestamp"] or b"")[0] == 1_700_000_000_123
    assert h["kafka_dlt-original-timestamp-type"] == b"CreateTime"
    assert h["kafka_dlt-original-topic"] == b"orders"
    assert h["kafka_dlt-original-consumer-group"] == b"billing"
    assert h["kafka_dlt-exception-fqcn"] == b"ValueError"
    assert h["kafka_dlt-exception-cause-fqcn"] == b"KeyError"
    assert h["kafka_dlt-exception-message"] == b"bad payload"
    assert b"ValueError: bad payload" in (h["kafka_dlt-exception-stacktrace"] or b"")
    assert "__streams.errors.topic" not in h


def _spring_cause(exc: BaseException) -> bytes | None:
    h = dict(
        dl.dead_letter_headers(
            "t", 0, 1, None, None, exc, None, 1, original_headers=None, compat=("spring",)
        )
    )
    return h.get("kafka_dlt-exception-cause-fqcn")


def test_spring_cause_of_a_json_decode_error_is_not_stopiteration() -> None:
    """Issue 22.8: json raises JSONDecodeError 'from None' inside 'except StopIteration';
    the suppressed context is not the cause (Spring writes the header only for a cause)."""
    import json

    try:
        json.loads("not json")
    except json.JSONDecodeError as exc:
        assert isinstance(exc.__context__, StopIteration)  # the trap is real
        assert _spring_cause(exc) is None
    try:
        raise ValueError("bad payload") from KeyError("inner")
    except ValueError as exc:
        assert _spring_cause(exc) == b"KeyError"  # an explicit cause
    try:
        try:
            json.loads("not json")
        except ValueError:
            raise RuntimeError("handler failed")  # noqa: B904 - implicit context on purpose
    except RuntimeError as exc:
        assert _spring_cause(exc) == b"json.decoder.JSONDecodeError"  # an implicit context


def test_streams_compat_uses_decimal_text() -> None:
    h = dict(_headers(compat=("streams",)))
    assert h["__streams.errors.topic"] == b"orders"
    assert h["__streams.errors.partition"] == b"3"
    assert h["__streams.errors.offset"] == b"1234"
    assert h["__streams.errors.exception"] == b"ValueError"
    assert h["__streams.errors.message"] == b"bad payload"
    assert "kafka_dlt-original-topic" not in h


def test_unknown_compat_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compat"):
        _headers(compat=("avro",))
    with pytest.raises(ValueError, match="unknown compat"):
        dl.DeadLetterPolicy(compat=("avro",))  # type: ignore[arg-type]


def test_long_messages_are_truncated() -> None:
    exc = RuntimeError("x" * 100_000)
    headers = dict(
        dl.dead_letter_headers("t", 0, 0, None, None, exc, None, 1, original_headers=None)
    )
    message = headers["kresilient.exception.message"] or b""
    assert 4000 < len(message) <= 4096 and message.endswith(b"...")
    assert "kresilient.original.timestamp" not in headers  # unknown values are left out
    assert "kresilient.consumer.group" not in headers


def test_kafka_exception_message_is_the_error_text() -> None:
    exc = ValueDeserializationError(exception=ValueError("not json"))
    headers = dict(
        dl.dead_letter_headers("t", 0, 0, None, None, exc, None, 1, original_headers=None)
    )
    assert (
        headers["kresilient.exception.type"] == b"confluent_kafka.error.ValueDeserializationError"
    )
    assert headers["kresilient.error.category"] == ErrorCategory.POISON.value.encode()
    assert headers["kresilient.exception.message"] == b"not json"


@pytest.mark.parametrize("compat", [(), ("spring",), ("streams",), ("spring", "streams")])
def test_parse_round_trip(compat: tuple[dl.Compat, ...]) -> None:
    info = dl.parse_dead_letter_headers(
        _headers(compat=compat, trace_context={"traceparent": "tp"})
    )
    assert info.format == "kresilient"
    assert info.is_dead_letter
    assert info.original_headers == tuple(ORIGINAL)
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        "orders",
        3,
        1234,
    )
    assert info.original_timestamp == 1_700_000_000_123
    assert info.consumer_group == "billing"
    assert info.exception_type == "ValueError" == info.exception_short_type
    assert info.exception_message == "bad payload"
    assert info.error_category == "unknown"
    assert info.attempts == 2
    assert info.failed_at == "2026-05-01T12:00:00.123Z"
    assert info.trace_context == {"traceparent": "tp"}
    assert (info.stacktrace is not None) == bool(compat)


def test_parse_spring_only_record() -> None:
    headers = [h for h in _headers(compat=("spring",)) if not h[0].startswith("kresilient.")]
    info = dl.parse_dead_letter_headers(headers)
    assert info.format == "spring"
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        "orders",
        3,
        1234,
    )
    assert info.original_timestamp == 1_700_000_000_123
    assert info.exception_type == "ValueError"
    assert info.original_headers == tuple(ORIGINAL)


def test_parse_streams_only_record() -> None:
    headers = [h for h in _headers(compat=("streams",)) if not h[0].startswith("kresilient.")]
    info = dl.parse_dead_letter_headers(dict(headers))
    assert info.format == "streams"
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        "orders",
        3,
        1234,
    )
    assert info.exception_message == "bad payload"


def test_parse_plain_record_is_not_a_dead_letter() -> None:
    info = dl.parse_dead_letter_headers(ORIGINAL)
    assert info.format is None and not info.is_dead_letter
    assert info.original_headers == tuple(ORIGINAL)
    assert dl.parse_dead_letter_headers(None).original_headers == ()


def test_parse_twice_dead_lettered_record_reads_the_last_block() -> None:
    first = _headers()
    second = dl.dead_letter_headers(
        "orders.dlq",
        0,
        7,
        None,
        "replayer",
        TypeError("again"),
        None,
        1,
        original_headers=first,
    )
    info = dl.parse_dead_letter_headers(second)
    assert info.original_topic == "orders.dlq" and info.exception_type == "TypeError"
    assert list(info.original_headers) == first


def test_build_record_keeps_raw_key_and_value() -> None:
    msg = Message(
        topic="orders",
        partition=1,
        offset=9,
        key=b"\x00k",
        value=b"\xff\xfe",
        headers=[("a", b"1")],
        timestamp=(1, 42),
    )
    policy = dl.DeadLetterPolicy()
    exc = json.JSONDecodeError("bad", "doc", 0)
    record = dl.build_dead_letter_record(msg, policy=policy, group="g", exc=exc, attempts=1)
    assert (record.topic, record.key, record.value) == ("orders.dlq", b"\x00k", b"\xff\xfe")
    assert record.headers[0] == ("a", b"1")
    assert dict(record.headers)["kresilient.exception.type"] == b"json.decoder.JSONDecodeError"
    # deserialized in place: the raw bytes are passed explicitly
    msg.set_value({"decoded": True})
    record = dl.build_dead_letter_record(
        msg, policy=policy, group="g", exc=exc, attempts=1, raw=True, raw_key=b"k", raw_value=b"v"
    )
    assert (record.key, record.value) == (b"k", b"v")
    assert "key" not in repr(record) and "\\xff" not in repr(record)


def test_policy_topics() -> None:
    assert dl.DeadLetterPolicy().topic_for("a") == "a.dlq"
    assert dl.DeadLetterPolicy(suffix="-dlt").topic_for("a") == "a-dlt"
    assert dl.DeadLetterPolicy(topic="all.dlq").topic_for("a") == "all.dlq"
    assert dl.DeadLetterPolicy().replace(suffix=".dead").topic_for("a") == "a.dead"
    with pytest.raises(ValueError):
        dl.DeadLetterPolicy(suffix="")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_breaker_consecutive_allows_exactly_the_limit() -> None:
    breaker = CircuitBreaker(dl.CircuitBreakerPolicy(max_consecutive=3))
    for _ in range(3):
        breaker.check()
        breaker.record_dead_letter()
    with pytest.raises(CircuitBreakerOpenError) as info:
        breaker.check()
    assert info.value.dead_letters == 4 and breaker.opened
    assert classify(info.value).category is ErrorCategory.POISON


def test_breaker_consecutive_resets_on_success() -> None:
    breaker = CircuitBreaker(dl.CircuitBreakerPolicy(max_consecutive=2))
    for _ in range(10):
        breaker.check()
        breaker.record_dead_letter()
        breaker.record_successes(1)
    assert not breaker.opened


def test_breaker_ratio_over_time_window() -> None:
    clock = _Clock()
    policy = dl.CircuitBreakerPolicy(
        max_consecutive=None, max_ratio=0.1, window=10.0, min_messages=50
    )
    breaker = CircuitBreaker(policy, clock=clock)
    breaker.record_successes(90)
    for _ in range(10):  # 10 of 100 = 0.1: allowed
        breaker.check()
        breaker.record_dead_letter()
    with pytest.raises(CircuitBreakerOpenError, match="11 of 101"):
        breaker.check()
    clock.now += 11.0  # the window moved on: old counts expire
    breaker = CircuitBreaker(policy, clock=clock)
    breaker.record_successes(10)
    breaker.check()  # 1 of 11, below min_messages: no verdict


def test_breaker_window_expiry() -> None:
    clock = _Clock()
    breaker = CircuitBreaker(
        dl.CircuitBreakerPolicy(max_consecutive=None, max_ratio=0.7, window=10.0, min_messages=4),
        clock=clock,
    )
    for _ in range(3):
        breaker.check()
        breaker.record_dead_letter()
        breaker.record_successes(1)
    clock.now += 20.0
    breaker.record_successes(100)
    assert breaker.snapshot()["window_dead_letters"] == 0
    breaker.check()


@pytest.mark.parametrize("kw", [{"max_consecutive": -1}, {"max_ratio": 1.5}, {"window": 0}])
def test_breaker_policy_validation(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        dl.CircuitBreakerPolicy(**kw)  # type: ignore[arg-type]
