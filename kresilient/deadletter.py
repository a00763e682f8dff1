"""Dead letters: the record format, its headers, and the circuit breaker.

A dead-letter record keeps the failed record's ORIGINAL key and value bytes and its original
headers (byte for byte, in order, first), then appends kresilient's headers, all UTF-8 text:

====================================  ==========================================================
``kresilient.original.topic``         source topic (always first: it opens kresilient's block)
``kresilient.original.partition``     source partition, decimal
``kresilient.original.offset``        source offset, decimal
``kresilient.original.timestamp``     source timestamp, ms since the epoch, decimal
``kresilient.consumer.group``         the consumer group that gave up
``kresilient.exception.type``         e.g. ``ValueError``, ``json.decoder.JSONDecodeError``
``kresilient.exception.message``      ``str(exception)`` (truncated to 4 KiB)
``kresilient.error.category``         :class:`~kresilient.errors.ErrorCategory` value
``kresilient.attempts``               how many times the handler ran, decimal
``kresilient.failed.at``              ISO 8601 UTC, e.g. ``2026-05-01T12:00:00.123Z``
``kresilient.traceparent``            W3C trace context of the failed processing (when traced)
``kresilient.tracestate``             (when the context has one)
====================================  ==========================================================

The trace context gets its own names so the record's original ``traceparent`` (the producer's)
stays untouched. Optionally the Spring Kafka (``kafka_dlt-*``, as
``DeadLetterPublishingRecoverer`` writes them: partition as a 4-byte and offset/timestamp as
8-byte big-endian integers) and Kafka Streams (``__streams.errors.*``, KIP-1034, decimal text)
header sets are appended too, so Java tooling reads the same records.

:func:`parse_dead_letter_headers` reads any of the three formats back. The circuit breaker
(:class:`CircuitBreakerPolicy`) stops a consumer instead of dead-lettering a whole topic after
a bad deploy::

    from kresilient import CircuitBreakerPolicy, DeadLetterPolicy, ResilientConsumer

    ResilientConsumer(
        config, ["orders"], handle,
        dead_letter=DeadLetterPolicy(compat=("spring",)),        # -> orders.dlq
        circuit_breaker=CircuitBreakerPolicy(max_consecutive=20, max_ratio=0.05, window=60),
    )
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import struct
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from confluent_kafka import KafkaError, KafkaException

from kresilient.errors import Classification, classify, exception_type_name

__all__ = [
    "ATTEMPTS",
    "CONSUMER_GROUP",
    "ERROR_CATEGORY",
    "EXCEPTION_MESSAGE",
    "EXCEPTION_TYPE",
    "FAILED_AT",
    "KRESILIENT_HEADERS",
    "ORIGINAL_OFFSET",
    "ORIGINAL_PARTITION",
    "ORIGINAL_TIMESTAMP",
    "ORIGINAL_TOPIC",
    "SPRING_HEADERS",
    "STREAMS_HEADERS",
    "TRACEPARENT",
    "TRACESTATE",
    "CircuitBreakerPolicy",
    "Compat",
    "DeadLetterInfo",
    "DeadLetterPolicy",
    "DeadLetterRecord",
    "build_dead_letter_record",
    "dead_letter_headers",
    "exception_type_name",
    "parse_dead_letter_headers",
]

# --------------------------------------------------------------------------- header names

ORIGINAL_TOPIC: Final = "kresilient.original.topic"
ORIGINAL_PARTITION: Final = "kresilient.original.partition"
ORIGINAL_OFFSET: Final = "kresilient.original.offset"
ORIGINAL_TIMESTAMP: Final = "kresilient.original.timestamp"
CONSUMER_GROUP: Final = "kresilient.consumer.group"
EXCEPTION_TYPE: Final = "kresilient.exception.type"
EXCEPTION_MESSAGE: Final = "kresilient.exception.message"
ERROR_CATEGORY: Final = "kresilient.error.category"
ATTEMPTS: Final = "kresilient.attempts"
FAILED_AT: Final = "kresilient.failed.at"
TRACEPARENT: Final = "kresilient.traceparent"
TRACESTATE: Final = "kresilient.tracestate"

#: Every header kresilient itself writes, in the order it writes them.
KRESILIENT_HEADERS: Final = (
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_TIMESTAMP,
    CONSUMER_GROUP,
    EXCEPTION_TYPE,
    EXCEPTION_MESSAGE,
    ERROR_CATEGORY,
    ATTEMPTS,
    FAILED_AT,
    TRACEPARENT,
    TRACESTATE,
)

# Spring Kafka: org.springframework.kafka.support.KafkaHeaders (DLT_* constants).
_SPRING_PREFIX: Final = "kafka_dlt-"
SPRING_EXCEPTION_FQCN: Final = "kafka_dlt-exception-fqcn"
SPRING_EXCEPTION_CAUSE_FQCN: Final = "kafka_dlt-exception-cause-fqcn"
SPRING_EXCEPTION_MESSAGE: Final = "kafka_dlt-exception-message"
SPRING_EXCEPTION_STACKTRACE: Final = "kafka_dlt-exception-stacktrace"
SPRING_ORIGINAL_TOPIC: Final = "kafka_dlt-original-topic"
SPRING_ORIGINAL_PARTITION: Final = "kafka_dlt-original-partition"
SPRING_ORIGINAL_OFFSET: Final = "kafka_dlt-original-offset"
SPRING_ORIGINAL_TIMESTAMP: Final = "kafka_dlt-original-timestamp"
SPRING_ORIGINAL_TIMESTAMP_TYPE: Final = "kafka_dlt-original-timestamp-type"
SPRING_ORIGINAL_CONSUMER_GROUP: Final = "kafka_dlt-original-consumer-group"
SPRING_HEADERS: Final = (
    SPRING_ORIGINAL_TOPIC,
    SPRING_ORIGINAL_PARTITION,
    SPRING_ORIGINAL_OFFSET,
    SPRING_ORIGINAL_TIMESTAMP,
    SPRING_ORIGINAL_TIMESTAMP_TYPE,
    SPRING_ORIGINAL_CONSUMER_GROUP,
    SPRING_EXCEPTION_FQCN,
    SPRING_EXCEPTION_CAUSE_FQCN,
    SPRING_EXCEPTION_MESSAGE,
    SPRING_EXCEPTION_STACKTRACE,
)

# Kafka Streams: org.apache.kafka.streams.errors.internals.ExceptionHandlerUtils (KIP-1034).
_STREAMS_PREFIX: Final = "__streams.errors."
STREAMS_EXCEPTION: Final = "__streams.errors.exception"
STREAMS_MESSAGE: Final = "__streams.errors.message"
STREAMS_STACKTRACE: Final = "__streams.errors.stacktrace"
STREAMS_TOPIC: Final = "__streams.errors.topic"
STREAMS_PARTITION: Final = "__streams.errors.partition"
STREAMS_OFFSET: Final = "__streams.errors.offset"
STREAMS_HEADERS: Final = (
    STREAMS_EXCEPTION,
    STREAMS_MESSAGE,
    STREAMS_STACKTRACE,
    STREAMS_TOPIC,
    STREAMS_PARTITION,
    STREAMS_OFFSET,
)

Compat: TypeAlias = Literal["spring", "streams"]
HeaderList: TypeAlias = list[tuple[str, bytes | None]]
HeadersIn: TypeAlias = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None]

_COMPAT: Final = frozenset({"spring", "streams"})
_MESSAGE_LIMIT: Final = 4096
_STACKTRACE_LIMIT: Final = 16384
# Message.timestamp()[0] -> Java TimestampType.toString() (Spring's timestamp-type header).
_TIMESTAMP_TYPES: Final[Mapping[int, str]] = {
    0: "NoTimestampType",
    1: "CreateTime",
    2: "LogAppendTime",
}


def _text(value: str, limit: int) -> bytes:
    data = value.encode("utf-8", "replace")
    if len(data) <= limit:
        return data
    return data[: limit - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."


def _message(exc: BaseException) -> str:
    """``str(exc)``; for a confluent-kafka exception the error text, not the repr."""
    args = getattr(exc, "args", ())
    if isinstance(exc, KafkaException) and args and isinstance(args[0], KafkaError):
        return args[0].str()
    return str(exc)


def _stacktrace(exc: BaseException) -> bytes:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _text(text, _STACKTRACE_LIMIT)


def _iso_utc(when: _dt.datetime) -> str:
    return when.astimezone(_dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _header_items(headers: HeadersIn | None) -> HeaderList:
    if headers is None:
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [(k, v.encode("utf-8") if isinstance(v, str) else v) for k, v in items]


def dead_letter_headers(
    msg_topic: str,
    partition: int | None,
    offset: int | None,
    timestamp: int | None,
    group: str | None,
    exc: BaseException,
    classification: Classification | None,
    attempts: int,
    *,
    original_headers: HeadersIn | None,
    compat: Iterable[Compat] = (),
    failed_at: _dt.datetime | None = None,
    trace_context: Mapping[str, str] | None = None,
    timestamp_type: int = 1,
) -> HeaderList:
    """The full header list of a dead-letter record: originals first, then kresilient's.

    ``partition``/``offset``/``timestamp``/``group`` may be ``None`` (e.g. a record that was
    never written, dead-lettered by the producer): their headers are then left out.
    ``classification`` defaults to :func:`~kresilient.errors.classify` of ``exc``.
    ``trace_context`` is a W3C carrier (``{"traceparent": ..., "tracestate": ...}``) written
    as ``kresilient.traceparent``/``kresilient.tracestate``. ``compat`` adds the ``"spring"``
    and/or ``"streams"`` header sets. ``timestamp_type`` is ``Message.timestamp()[0]``.
    """
    compat = tuple(compat)
    unknown = set(compat) - _COMPAT
    if unknown:
        raise ValueError(f"unknown compat header set(s) {sorted(unknown)}; use 'spring', 'streams'")
    if classification is None:
        classification = classify(exc)
    out = _header_items(original_headers)
    etype = exception_type_name(exc)
    message = _text(_message(exc), _MESSAGE_LIMIT)
    when = failed_at if failed_at is not None else _dt.datetime.now(_dt.UTC)
    own: list[tuple[str, bytes | None]] = [(ORIGINAL_TOPIC, msg_topic.encode("utf-8"))]
    for name, number in (
        (ORIGINAL_PARTITION, partition),
        (ORIGINAL_OFFSET, offset),
        (ORIGINAL_TIMESTAMP, timestamp),
    ):
        if number is not None:
            own.append((name, str(number).encode("ascii")))
    if group:
        own.append((CONSUMER_GROUP, group.encode("utf-8")))
    own += [
        (EXCEPTION_TYPE, etype.encode("utf-8")),
        (EXCEPTION_MESSAGE, message),
        (ERROR_CATEGORY, classification.category.value.encode("ascii")),
        (ATTEMPTS, str(attempts).encode("ascii")),
        (FAILED_AT, _iso_utc(when).encode("ascii")),
    ]
    if trace_context:
        for name, key in ((TRACEPARENT, "traceparent"), (TRACESTATE, "tracestate")):
            value = trace_context.get(key)
            if value:
                own.append((name, value.encode("utf-8")))
    out += own
    stack = _stacktrace(exc) if compat else b""
    if "spring" in compat:
        out += _spring_headers(
            msg_topic,
            partition,
            offset,
            timestamp,
            timestamp_type,
            group,
            exc,
            etype,
            message,
            stack,
        )
    if "streams" in compat:
        out += [
            (STREAMS_EXCEPTION, etype.encode("utf-8")),
            (STREAMS_MESSAGE, message),
            (STREAMS_STACKTRACE, stack),
            (STREAMS_TOPIC, msg_topic.encode("utf-8")),
        ]
        if partition is not None:
            out.append((STREAMS_PARTITION, str(partition).encode("ascii")))
        if offset is not None:
            out.append((STREAMS_OFFSET, str(offset).encode("ascii")))
    return out


def _spring_headers(
    topic: str,
    partition: int | None,
    offset: int | None,
    timestamp: int | None,
    timestamp_type: int,
    group: str | None,
    exc: BaseException,
    etype: str,
    message: bytes,
    stack: bytes,
) -> HeaderList:
    out: HeaderList = [(SPRING_ORIGINAL_TOPIC, topic.encode("utf-8"))]
    if partition is not None:
        out.append((SPRING_ORIGINAL_PARTITION, struct.pack(">i", partition)))
    if offset is not None:
        out.append((SPRING_ORIGINAL_OFFSET, struct.pack(">q", offset)))
    if timestamp is not None:
        out.append((SPRING_ORIGINAL_TIMESTAMP, struct.pack(">q", timestamp)))
        kind = _TIMESTAMP_TYPES.get(timestamp_type, "CreateTime")
        out.append((SPRING_ORIGINAL_TIMESTAMP_TYPE, kind.encode("ascii")))
    if group:
        out.append((SPRING_ORIGINAL_CONSUMER_GROUP, group.encode("utf-8")))
    out.append((SPRING_EXCEPTION_FQCN, etype.encode("utf-8")))
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        out.append((SPRING_EXCEPTION_CAUSE_FQCN, exception_type_name(cause).encode("utf-8")))
    out += [(SPRING_EXCEPTION_MESSAGE, message), (SPRING_EXCEPTION_STACKTRACE, stack)]
    return out


# --------------------------------------------------------------------------- parsing


@dataclass(frozen=True, kw_only=True)
class DeadLetterInfo:
    """What a dead-letter record's headers say (see :func:`parse_dead_letter_headers`).

    ``format`` is ``"kresilient"``, ``"spring"``, ``"streams"`` or ``None`` (not a dead
    letter). ``original_headers`` are the source record's headers, byte for byte.
    """

    format: str | None
    original_topic: str | None = None
    original_partition: int | None = None
    original_offset: int | None = None
    original_timestamp: int | None = None
    consumer_group: str | None = None
    exception_type: str | None = None
    exception_message: str | None = None
    error_category: str | None = None
    attempts: int | None = None
    failed_at: str | None = None
    stacktrace: str | None = field(default=None, repr=False)
    trace_context: Mapping[str, str] = field(default_factory=dict)
    original_headers: tuple[tuple[str, bytes | None], ...] = field(default=(), repr=False)

    @property
    def is_dead_letter(self) -> bool:
        """True when the headers came from a dead-letter writer kresilient knows."""
        return self.format is not None

    @property
    def exception_short_type(self) -> str | None:
        """The exception's class name without its module (``JSONDecodeError``)."""
        if self.exception_type is None:
            return None
        return self.exception_type.rsplit(".", 1)[-1]


def _str(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _int(value: bytes | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None


def _java_int(value: bytes | None) -> int | None:
    """Spring writes big-endian binary; tolerate decimal text written by other tools."""
    if value is None:
        return None
    if len(value) == 4:
        return int(struct.unpack(">i", value)[0])
    if len(value) == 8:
        return int(struct.unpack(">q", value)[0])
    return _int(value)


def _first(
    headers: Sequence[tuple[str, bytes | None]], names: frozenset[str]
) -> dict[str, bytes | None]:
    found: dict[str, bytes | None] = {}
    for k, v in headers:
        if k in names and k not in found:
            found[k] = v
    return found


def parse_dead_letter_headers(headers: HeadersIn | None) -> DeadLetterInfo:
    """Read the dead-letter headers of a record (kresilient, Spring or Kafka Streams format).

    A record dead-lettered twice carries two kresilient blocks; the LAST one describes the
    latest failure and everything before it is the original headers.
    """
    items = _header_items(headers)
    start = None
    for i in range(len(items) - 1, -1, -1):
        if items[i][0] == ORIGINAL_TOPIC:
            start = i
            break
    if start is not None:
        return _parse_kresilient(items, start)
    if any(k.startswith(_SPRING_PREFIX) for k, _ in items):
        return _parse_spring(items)
    if any(k.startswith(_STREAMS_PREFIX) for k, _ in items):
        return _parse_streams(items)
    return DeadLetterInfo(format=None, original_headers=tuple(items))


_OWN: Final = frozenset(KRESILIENT_HEADERS)
_SPRING: Final = frozenset(SPRING_HEADERS)
_STREAMS: Final = frozenset(STREAMS_HEADERS)


def _parse_kresilient(items: HeaderList, start: int) -> DeadLetterInfo:
    block = items[start:]
    h = _first(block, _OWN)
    spring = _first(block, _SPRING)
    streams = _first(block, _STREAMS)
    stack = spring.get(SPRING_EXCEPTION_STACKTRACE) or streams.get(STREAMS_STACKTRACE)
    trace_context = {
        key: text
        for key, name in (("traceparent", TRACEPARENT), ("tracestate", TRACESTATE))
        if (text := _str(h.get(name)))
    }
    return DeadLetterInfo(
        format="kresilient",
        original_topic=_str(h.get(ORIGINAL_TOPIC)),
        original_partition=_int(h.get(ORIGINAL_PARTITION)),
        original_offset=_int(h.get(ORIGINAL_OFFSET)),
        original_timestamp=_int(h.get(ORIGINAL_TIMESTAMP)),
        consumer_group=_str(h.get(CONSUMER_GROUP)),
        exception_type=_str(h.get(EXCEPTION_TYPE)),
        exception_message=_str(h.get(EXCEPTION_MESSAGE)),
        error_category=_str(h.get(ERROR_CATEGORY)),
        attempts=_int(h.get(ATTEMPTS)),
        failed_at=_str(h.get(FAILED_AT)),
        stacktrace=_str(stack),
        trace_context=trace_context,
        original_headers=tuple(items[:start]),
    )


def _parse_spring(items: HeaderList) -> DeadLetterInfo:
    h = _first(items, _SPRING)
    return DeadLetterInfo(
        format="spring",
        original_topic=_str(h.get(SPRING_ORIGINAL_TOPIC)),
        original_partition=_java_int(h.get(SPRING_ORIGINAL_PARTITION)),
        original_offset=_java_int(h.get(SPRING_ORIGINAL_OFFSET)),
        original_timestamp=_java_int(h.get(SPRING_ORIGINAL_TIMESTAMP)),
        consumer_group=_str(h.get(SPRING_ORIGINAL_CONSUMER_GROUP)),
        exception_type=_str(h.get(SPRING_EXCEPTION_FQCN)),
        exception_message=_str(h.get(SPRING_EXCEPTION_MESSAGE)),
        stacktrace=_str(h.get(SPRING_EXCEPTION_STACKTRACE)),
        original_headers=tuple((k, v) for k, v in items if not k.startswith(_SPRING_PREFIX)),
    )


def _parse_streams(items: HeaderList) -> DeadLetterInfo:
    h = _first(items, _STREAMS)
    return DeadLetterInfo(
        format="streams",
        original_topic=_str(h.get(STREAMS_TOPIC)),
        original_partition=_int(h.get(STREAMS_PARTITION)),
        original_offset=_int(h.get(STREAMS_OFFSET)),
        exception_type=_str(h.get(STREAMS_EXCEPTION)),
        exception_message=_str(h.get(STREAMS_MESSAGE)),
        stacktrace=_str(h.get(STREAMS_STACKTRACE)),
        original_headers=tuple((k, v) for k, v in items if not k.startswith(_STREAMS_PREFIX)),
    )


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, kw_only=True)
class DeadLetterPolicy:
    """Where dead letters go and what they carry.

    Args:
        suffix: the dead-letter topic is ``<source topic><suffix>`` (default ``.dlq``).
        topic: one dead-letter topic for every source topic (overrides ``suffix``).
        compat: also write the ``"spring"`` (``kafka_dlt-*``) and/or ``"streams"``
            (``__streams.errors.*``) header sets.
        require_topic: check at start that the dead-letter topics exist (fail fast with a
            :class:`~kresilient.ConfigError` instead of at the first poison message).
    """

    suffix: str = ".dlq"
    topic: str | None = None
    compat: tuple[Compat, ...] = ()
    require_topic: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.compat) - _COMPAT
        if unknown:
            raise ValueError(f"unknown compat header set(s) {sorted(unknown)}")
        if self.topic is None and not self.suffix:
            raise ValueError("suffix must not be empty (the DLQ would be the source topic)")

    def topic_for(self, source_topic: str) -> str:
        """The dead-letter topic for records of ``source_topic``."""
        return self.topic if self.topic is not None else source_topic + self.suffix

    def replace(self, **changes: Any) -> DeadLetterPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class DeadLetterRecord:
    """One record to write to a dead-letter topic (key/value are the original raw bytes)."""

    topic: str
    key: bytes | None = field(repr=False)
    value: bytes | None = field(repr=False)
    headers: HeaderList = field(repr=False)


def build_dead_letter_record(
    msg: Any,
    *,
    policy: DeadLetterPolicy,
    group: str | None,
    exc: BaseException,
    attempts: int,
    classification: Classification | None = None,
    raw_key: bytes | None = None,
    raw_value: bytes | None = None,
    raw: bool = False,
    trace_context: Mapping[str, str] | None = None,
) -> DeadLetterRecord:
    """The dead-letter record for consumed message ``msg`` (a ``confluent_kafka.Message``).

    With ``raw=True``, ``raw_key``/``raw_value`` are the original bytes (the message's own
    key/value were replaced by deserialized objects); otherwise the message's are used.
    """
    topic = msg.topic()
    ts_type, ts = msg.timestamp()
    headers = dead_letter_headers(
        topic,
        msg.partition(),
        msg.offset(),
        ts if ts_type != 0 else None,
        group,
        exc,
        classification,
        attempts,
        original_headers=msg.headers(),
        compat=policy.compat,
        trace_context=trace_context,
        timestamp_type=ts_type,
    )
    return DeadLetterRecord(
        topic=policy.topic_for(topic),
        key=raw_key if raw else msg.key(),
        value=raw_value if raw else msg.value(),
        headers=headers,
    )


# --------------------------------------------------------------------------- circuit breaker


@dataclass(frozen=True, kw_only=True)
class CircuitBreakerPolicy:
    """When dead-lettering must stop the consumer instead (``None`` turns a limit off).

    Args:
        max_consecutive: at most this many dead letters in a row (no success between);
            the next one opens the breaker.
        max_ratio: at most this fraction of the messages handled in the last ``window``
            seconds may be dead letters (judged once ``min_messages`` were handled).
        window: seconds, for ``max_ratio``.
        min_messages: messages in the window before ``max_ratio`` is judged.
    """

    max_consecutive: int | None = 100
    max_ratio: float | None = None
    window: float = 60.0
    min_messages: int = 100

    def __post_init__(self) -> None:
        if self.max_consecutive is not None and self.max_consecutive < 0:
            raise ValueError("max_consecutive must be >= 0")
        if self.max_ratio is not None and not 0.0 <= self.max_ratio <= 1.0:
            raise ValueError("max_ratio must be within [0, 1]")
        if self.window <= 0:
            raise ValueError("window must be > 0 seconds")

    def replace(self, **changes: Any) -> CircuitBreakerPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)
