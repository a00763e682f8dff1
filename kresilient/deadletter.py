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
``kresilient.exception.message``      ``str(exception)``, redacted (truncated to 4 KiB)
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

import contextlib
import dataclasses
import datetime as _dt
import logging
import struct
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer

from kresilient import _catalog as catalog
from kresilient._ratelimit import RateLimiter
from kresilient.config import producer_config
from kresilient.errors import (
    Classification,
    ConfigError,
    DeadLetterError,
    DeliveryError,
    DeliveryFailure,
    ErrorCategory,
    classify,
    exception_type_name,
    failure_from_report,
    translate,
)
from kresilient.reachability import (
    AuthFailure,
    Reachability,
    TransientLines,
    client_certificate,
    purge_refused,
)
from kresilient.redaction import Redactor, redact_config, redact_text

__all__ = [
    "ATTEMPTS",
    "CONSUMER_GROUP",
    "DEAD_LETTER_FORCED",
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
    "DeadLetterHandle",
    "DeadLetterInfo",
    "DeadLetterPolicy",
    "DeadLetterRecord",
    "DeadLetterResult",
    "DeadLetterWriter",
    "build_dead_letter_record",
    "dead_letter_headers",
    "dead_letter_producer_config",
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


def _stacktrace(exc: BaseException, redact: Callable[[str], str]) -> bytes:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _text(redact(text), _STACKTRACE_LIMIT)


#: The headers kresilient fills with free text taken from an exception (its message, its
#: stack trace): the only ones of its block that can carry a secret, so the ones
#: :class:`DeadLetterWriter` passes through its configuration's redactor once more.
_FREE_TEXT_HEADERS: Final = {
    EXCEPTION_MESSAGE: _MESSAGE_LIMIT,
    SPRING_EXCEPTION_MESSAGE: _MESSAGE_LIMIT,
    SPRING_EXCEPTION_STACKTRACE: _STACKTRACE_LIMIT,
    STREAMS_MESSAGE: _MESSAGE_LIMIT,
    STREAMS_STACKTRACE: _STACKTRACE_LIMIT,
}


def _redact_free_text(headers: HeaderList, redact: Callable[[str], str]) -> HeaderList:
    """``headers`` with kresilient's free-text headers (exception message, stack traces) passed
    through ``redact``; everything else byte for byte.

    Only kresilient's own block is touched: the headers from the LAST
    ``kresilient.original.topic`` on (:func:`dead_letter_headers` appends its block after the
    record's original headers, and that block opens with it). The original headers, even ones
    of the same names (a dead letter replayed and dead-lettered again), stay as they were. A
    value that redaction leaves unchanged keeps its exact bytes.
    """
    start = next(
        (i for i in range(len(headers) - 1, -1, -1) if headers[i][0] == ORIGINAL_TOPIC), None
    )
    if start is None:
        return headers
    out = list(headers)
    for i in range(start, len(out)):
        name, value = out[i]
        limit = _FREE_TEXT_HEADERS.get(name)
        if limit is None or not value:
            continue
        text = value.decode("utf-8", "replace")
        scrubbed = redact(text)
        if scrubbed != text:
            out[i] = (name, _text(scrubbed, limit))
    return out


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
    redact: Callable[[str], str] = redact_text,
) -> HeaderList:
    """The full header list of a dead-letter record: originals first, then kresilient's.

    ``partition``/``offset``/``timestamp``/``group`` may be ``None`` (e.g. a record that was
    never written, dead-lettered by the producer): their headers are then left out.
    ``classification`` defaults to :func:`~kresilient.errors.classify` of ``exc``.
    ``trace_context`` is a W3C carrier (``{"traceparent": ..., "tracestate": ...}``) written
    as ``kresilient.traceparent``/``kresilient.tracestate``. ``compat`` adds the ``"spring"``
    and/or ``"streams"`` header sets. ``timestamp_type`` is ``Message.timestamp()[0]``.

    The exception's message and stack trace are free text written into Kafka: they go through
    ``redact`` first, the :class:`~kresilient.redaction.Redactor` of the client configuration
    the dead letter is written for (default: :func:`~kresilient.redaction.redact_text`, which
    knows no configuration; :class:`DeadLetterWriter` applies its own configuration's redactor
    again when it writes).
    """
    compat = tuple(compat)
    unknown = set(compat) - _COMPAT
    if unknown:
        raise ValueError(f"unknown compat header set(s) {sorted(unknown)}; use 'spring', 'streams'")
    if classification is None:
        classification = classify(exc)
    out = _header_items(original_headers)
    etype = exception_type_name(exc)
    message = _text(redact(_message(exc)), _MESSAGE_LIMIT)
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
    stack = _stacktrace(exc, redact) if compat else b""
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


def _cause(exc: BaseException) -> BaseException | None:
    """The exception's cause as Java's ``getCause()`` would give it: ``raise ... from X``, or
    the exception being handled when it was raised, unless that context was suppressed
    (``from None``: ``json.loads`` raises ``JSONDecodeError`` from inside an ``except
    StopIteration``, and that StopIteration is an implementation detail, not the cause)."""
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


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
    cause = _cause(exc)
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
    """One record to write to a dead-letter topic (key/value are the original raw bytes).

    ``timestamp`` (ms since the epoch) is the record's own timestamp when the writer should
    keep it (``None``: the time of the write).
    """

    topic: str
    key: bytes | None = field(repr=False)
    value: bytes | None = field(repr=False)
    headers: HeaderList = field(repr=False)
    timestamp: int | None = None


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
    redact: Callable[[str], str] = redact_text,
) -> DeadLetterRecord:
    """The dead-letter record for consumed message ``msg`` (a ``confluent_kafka.Message``).

    With ``raw=True``, ``raw_key``/``raw_value`` are the original bytes (the message's own
    key/value were replaced by deserialized objects); otherwise the message's are used.
    ``redact`` is the consumer's :class:`~kresilient.redaction.Redactor` (see
    :func:`dead_letter_headers`).
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
        redact=redact,
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
            seconds may be dead letters (judged once ``min_messages`` were handled). On by
            default (10 %, as Arroyo's ``DlqLimit``): a dependency outage no longer
            dead-letters (the consumer holds the records), so a tenth of the traffic
            dead-lettered means bad records or a bad deploy.
        window: seconds, for ``max_ratio``.
        min_messages: messages in the window before ``max_ratio`` is judged.
    """

    max_consecutive: int | None = 100
    max_ratio: float | None = 0.1
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


# --------------------------------------------------------------------------- the writer

#: What a dead-letter producer always runs with: a dead letter is written once and durably.
DEAD_LETTER_FORCED: Final[Mapping[str, str]] = {"acks": "all", "enable.idempotence": "true"}

# Canonical keys of the user's config that never reach the dead-letter producer: the
# guarantee settings it forces or derives, a transactional identity (sharing it would fence the
# user's own producer), and callbacks/serializers that belong to the user's client.
_DLQ_DROPPED: Final = frozenset(
    {
        "request.required.acks",
        "enable.idempotence",
        "max.in.flight.requests.per.connection",
        "message.send.max.retries",
        "queuing.strategy",
        "enable.gapless.guarantee",
        "transactional.id",
        "transaction.timeout.ms",
        "delivery.report.only.error",
        "client.id",
        "statistics.interval.ms",
        "error_cb",
        "stats_cb",
        "throttle_cb",
        "logger",
        "on_delivery",
        "dr_cb",
        "dr_msg_cb",
        "key.serializer",
        "value.serializer",
        "default.topic.config",
    }
)


_FORCED_CANONICAL: Final[Mapping[str, str]] = {
    "request.required.acks": "all",
    "enable.idempotence": "true",
}


def _canonical(key: str) -> str:
    prop = catalog.lookup(key)
    return prop.canonical if prop is not None else ""


def dead_letter_producer_config(
    user_config: Mapping[str, Any],
    *,
    client_id: str | None = None,
    message_max_bytes: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    allow_unsafe: Iterable[str] = (),
    logger: Any = None,
) -> dict[str, Any]:
    """The configuration of a dead-letter producer, derived from any client's config.

    The ONE place it is decided (the producer, the consumer, the replay CLI and the Spark sink
    all call it): from ``user_config`` (a producer's or a consumer's) it keeps the settings
    any client or a producer understands (connection, security, SASL/OAuth incl. ``oauth_cb``,
    timeouts, compression, ...), drops consumer-only keys, the user's callbacks and
    serializers, any ``transactional.id``, and the guarantee settings, then forces
    ``acks=all`` and ``enable.idempotence=true`` and validates the result with
    :func:`kresilient.config.producer_config`. ``client.id`` is ``<client_id>-dlq`` (default:
    the user's ``client.id``, else ``kresilient``);
    ``message_max_bytes`` sets ``message.max.bytes`` (a producer dead-lettering oversized
    values needs a larger one); ``overrides`` are applied last (they may not weaken the forced
    settings: :class:`~kresilient.ConfigError`). ``allow_unsafe`` passes the user's accepted
    unsafe settings through (e.g. certificate verification off).

    >>> cfg = dead_letter_producer_config(
    ...     {"bootstrap.servers": "h:9092", "group.id": "g", "acks": "1", "linger.ms": 5},
    ...     client_id="orders-consumer",
    ... )
    >>> cfg["acks"], cfg["enable.idempotence"], cfg["client.id"], "group.id" in cfg
    ('all', 'true', 'orders-consumer-dlq', False)
    """
    out: dict[str, Any] = {}
    for key, value in user_config.items():
        prop = catalog.lookup(str(key))
        if prop is None or prop.scope == "C":
            continue  # unknown keys were refused when the user's client was built
        if prop.canonical in _DLQ_DROPPED or key in _DLQ_DROPPED:
            continue
        out[key] = value
    if message_max_bytes is not None:
        for key in [k for k in out if _canonical(k) == "message.max.bytes"]:
            del out[key]
        out["message.max.bytes"] = message_max_bytes
    if not client_id:
        client_id = next(
            (str(v) for k, v in user_config.items() if _canonical(str(k)) == "client.id"),
            "kresilient",
        )
    out["client.id"] = f"{client_id}-dlq"
    for key, value in (overrides or {}).items():
        forced = _FORCED_CANONICAL.get(_canonical(str(key)))
        text = catalog.to_config_string(value).strip().lower()
        if forced is not None and text not in (forced, "-1"):
            raise ConfigError(
                f"{key}={value!r}: a dead-letter producer always runs with "
                f"{', '.join(f'{k}={v}' for k, v in DEAD_LETTER_FORCED.items())}",
                key=str(key),
            )
        out[key] = value
    for key in [k for k in out if _canonical(k) in _FORCED_CANONICAL]:
        del out[key]  # an override spelled as an alias ("request.required.acks")
    out.update(DEAD_LETTER_FORCED)
    names = [allow_unsafe] if isinstance(allow_unsafe, str) else list(allow_unsafe)
    allowed = [k for k in names if _canonical(k) not in _DLQ_DROPPED | {""}]
    return producer_config(out, allow_unsafe=allowed, logger=logger)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetterResult:
    """Where a dead letter was written."""

    topic: str
    partition: int
    offset: int


class DeadLetterHandle:
    """The outcome of one :meth:`DeadLetterWriter.write`.

    ``done()`` is true once the write was acknowledged or failed (as seen by the writer's
    ``poll``/``flush``); ``result()`` waits (serving the writer) and returns a
    :class:`DeadLetterResult` or raises the classified :class:`~kresilient.DeadLetterError`;
    ``exception()`` returns that error instead (``None`` on success). Until ``done()`` the
    source record must be treated as NOT dead-lettered (do not commit its offset).
    """

    __slots__ = ("_callback", "_err", "_error", "_msg", "_result", "_writer", "record")

    def __init__(
        self,
        writer: DeadLetterWriter,
        record: DeadLetterRecord,
        callback: Callable[[DeadLetterHandle], None] | None,
    ) -> None:
        self._writer = writer
        self.record = record
        self._callback = callback
        self._err: KafkaError | None = None
        self._msg: Any = None
        self._result: DeadLetterResult | None = None
        self._error: DeadLetterError | None = None

    # librdkafka's delivery report, from inside poll()/flush(). Only attribute stores and one
    # deque append: a fatal error being raised while reports are served makes the next C call
    # in a callback fail (see the producer), so the classification happens after poll returns.
    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        self._err = err
        self._msg = msg
        self._writer._reported.append(self)

    def done(self) -> bool:
        """True once the write was acknowledged (``result()``) or failed (``exception()``)."""
        return self._result is not None or self._error is not None

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            step = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if step <= 0:
                raise TimeoutError(
                    f"dead letter for {self.record.topic} not acknowledged within {timeout} s"
                )
            self._writer.poll(step)

    def result(self, timeout: float | None = None) -> DeadLetterResult:
        """Wait for the acknowledgement; raise :class:`~kresilient.DeadLetterError` on failure
        and :class:`TimeoutError` when ``timeout`` seconds pass first."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def exception(self, timeout: float | None = None) -> DeadLetterError | None:
        """Wait for the outcome; the error if the write failed, else ``None``."""
        self._wait(timeout)
        return self._error

    def __repr__(self) -> str:
        if self._error is not None:
            state = f"failed {self._error.classification.name}"
        elif self._result is not None:
            r = self._result
            state = f"written {r.topic}[{r.partition}]@{r.offset}"
        else:
            state = "pending"
        return f"<DeadLetterHandle {self.record.topic} {state}>"


_LOG_METHODS: Final[Mapping[int, str]] = {
    logging.CRITICAL: "critical",
    logging.ERROR: "error",
    logging.WARNING: "warning",
    logging.INFO: "info",
    logging.DEBUG: "debug",
}


class _LogBridge:
    """librdkafka's log lines into the writer's structlog logger: redacted, rate-limited."""

    def __init__(self, log: Any, redactor: Redactor, limiter: RateLimiter) -> None:
        self._log = log
        self._redact = redactor
        self._limiter = limiter
        # A passing condition (the producer-id state still loading on a fresh cluster) is
        # logged as one, as by the clients' own bridge: it was a WARNING here.
        self._transients = TransientLines(log)

    def log(self, level: int, fmt: str, *args: Any) -> None:
        try:
            facility = str(args[0]) if args else ""
            if TransientLines.known(facility) and self._transients.offer(
                facility, self._redact(str(args[2]) if len(args) > 2 else fmt % args)
            ):
                return
            allowed, suppressed = self._limiter.check(("log", facility))
            if allowed:  # redaction costs tens of microseconds: only for lines logged
                text = self._redact(str(args[2]) if len(args) > 2 else fmt % args)
                method = _LOG_METHODS.get(level, "info")
                fields: dict[str, Any] = {"facility": facility, "message": text}
                if suppressed:
                    fields["suppressed"] = suppressed
                getattr(self._log, method)("librdkafka_log", **fields)
        except Exception:  # logging must never break the client
            pass


_FATAL_PURGES: Final = frozenset(
    {KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT}
)
"""Report codes of writes librdkafka failed because the producer hit a fatal error."""

#: error_cb codes that say the cluster refused the credentials or the certificate, and
#: connection failures (whose text may be a refused TLS handshake: a broker's TLS alert).
_REFUSAL_CODES: Final = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
_CONNECT_CODES: Final = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
#: Report codes of a write that waited in vain for a connection (message.timeout.ms).
_TIMEOUT_CODES: Final = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT_QUEUE})
#: How often the "every broker is down" summary (kafka_unreachable) may be logged.
_UNREACHABLE_LOG_INTERVAL: Final = 60.0


def _fatal_of(exc: KafkaException) -> KafkaError | None:
    """The fatal error ``exc`` carries (its real cause when librdkafka knows it), or None."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None or not err.fatal():
        return None
    return err


class DeadLetterWriter:
    """The one dead-letter writer: a raw ``confluent_kafka.Producer`` with a safe config.

    Used by the producer (oversized values), the consumer (poison messages), the replay CLI and
    the Spark sink. Its configuration comes from :func:`dead_letter_producer_config` (acks=all,
    idempotence, the user's connection and security settings). It never adds a header: a dead
    letter is written byte for byte as :class:`DeadLetterRecord` says (no trace propagation;
    the failed processing's context is already in ``kresilient.traceparent``), except that the
    free text of kresilient's own block (exception message, stack traces) goes through the
    configuration's redactor first: whoever built the
    record, a secret of the configuration it serves never reaches Kafka.

    * :meth:`write` queues a record and returns a :class:`DeadLetterHandle`; ``on_delivery``
      (optional) is called with the handle once it is acknowledged or failed, from the thread
      that runs :meth:`poll`/:meth:`flush`.
    * A full local queue is served (``poll``) and the write retried for up to
      ``backpressure_timeout`` seconds, then refused with a BACKPRESSURE
      :class:`~kresilient.DeadLetterError`; other refusals (too large, closed, fatal) raise a
      classified ``DeadLetterError`` at once. Nothing is dropped silently.
    * :attr:`pending` counts writes not yet acknowledged or failed; :meth:`flush` waits for
      them and raises :class:`~kresilient.DeliveryError` listing every failure since the last
      flush. A failure is forgotten only once a ``DeliveryError`` carrying it was raised, even
      when the underlying flush itself raises.
    * :meth:`close` flushes; what is still unacknowledged after ``timeout`` is purged, and
      reported as failed, never silently abandoned.
    * A refused login (wrong password, wrong CA, a certificate the brokers refuse) fails
      fast, as :class:`~kresilient.ResilientProducer` does: when a broker refused the
      credentials or certificate, no dead letter was ever acknowledged and librdkafka says
      every broker it knows is down (:meth:`kresilient.producer.Reachability.final_refusal`),
      the dead letters still queued are failed at once (never sent), each a
      :class:`~kresilient.DeadLetterError` classified AUTH (``_AUTHENTICATION``/``_SSL``, not
      retriable) naming librdkafka's reason and the setting to check, instead of waiting
      ``message.timeout.ms`` to fail as timed out. A writer that wrote before (a password
      rotated under it) keeps retrying; its timeouts then name the refusal.
    * Everything it logs or raises goes through the config's
      :class:`~kresilient.redaction.Redactor`.

    Example::

        with DeadLetterWriter(consumer_config, client_id="orders-consumer") as writer:
            handle = writer.write(record)
            writer.flush(10)            # raises DeliveryError if the write failed
            print(handle.result(0).offset)
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        client_id: str | None = None,
        message_max_bytes: int | None = None,
        overrides: Mapping[str, Any] | None = None,
        allow_unsafe: Iterable[str] = (),
        logger: Any = None,
        backpressure_timeout: float = 10.0,
    ) -> None:
        self._redact = Redactor.for_config({**config, **(overrides or {})})
        base = logger if logger is not None else structlog.get_logger("kresilient.deadletter")
        cfg = dead_letter_producer_config(
            config,
            client_id=client_id,
            message_max_bytes=message_max_bytes,
            overrides=overrides,
            allow_unsafe=allow_unsafe,
            logger=base,
        )
        self.client_id: str = str(cfg.get("client.id", "kresilient-producer"))
        self._log = base.bind(client_id=self.client_id)
        self._limiter = RateLimiter()
        self._backpressure_timeout = backpressure_timeout
        self._lock = threading.Lock()
        self._reported: deque[DeadLetterHandle] = deque()
        self._failures: list[DeliveryFailure] = []
        self._pending = 0
        self._written = 0
        self._failed = 0
        self._closed = False
        self._fatal: KafkaError | None = None
        self._bridge = _LogBridge(self._log, self._redact, self._limiter)
        #: refusals of the login or certificate, "all brokers down", and whether any dead
        #: letter was acknowledged (connected): the producer's one rule for failing fast
        self._reach: Reachability = Reachability(
            self._log, interval=_UNREACHABLE_LOG_INTERVAL, certificate=client_certificate(cfg)
        )
        #: the refusal the queued dead letters were failed for (:meth:`_fail_refused`)
        self._auth_purge: AuthFailure | None = None
        self._config = cfg
        rdk = dict(cfg)
        rdk["error_cb"] = self._on_error
        rdk["logger"] = self._bridge
        try:
            self._producer = Producer(rdk)
        except KafkaException as exc:
            raise translate(exc, operation="configure", redactor=self._redact) from None

    # ------------------------------------------------------------------ introspection

    @property
    def config(self) -> dict[str, Any]:
        """The dead-letter producer's configuration, secrets redacted."""
        return redact_config(self._config)

    @property
    def pending(self) -> int:
        """Writes queued and not yet acknowledged or failed."""
        return self._pending

    @property
    def written(self) -> int:
        """Dead letters acknowledged by the cluster so far."""
        return self._written

    @property
    def failed(self) -> int:
        """Dead letters whose write failed so far (reported or not yet)."""
        return self._failed

    @property
    def failures(self) -> tuple[DeliveryFailure, ...]:
        """Failures not yet raised by :meth:`flush`/:meth:`close` (they stay until then)."""
        with self._lock:
            return tuple(self._failures)

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __len__(self) -> int:
        return len(self._producer)

    def __repr__(self) -> str:
        return (
            f"<DeadLetterWriter {self.client_id} pending={self._pending} "
            f"written={self._written} failed={self._failed}{' closed' if self._closed else ''}>"
        )

    # ------------------------------------------------------------------ writing

    def write(
        self,
        record: DeadLetterRecord,
        *,
        on_delivery: Callable[[DeadLetterHandle], None] | None = None,
    ) -> DeadLetterHandle:
        """Queue ``record``; return its handle. Raises :class:`~kresilient.DeadLetterError`
        when the record cannot be queued (classified: BACKPRESSURE after
        ``backpressure_timeout`` s of a full queue, too large, closed, fatal)."""
        if self._closed:
            raise DeadLetterError(
                f"the dead-letter writer {self.client_id} is closed: "
                f"no dead letter can be written to {record.topic}",
                topic=record.topic,
                classification=classify(KafkaError(KafkaError._STATE, "writer is closed")),
            )
        fatal = self._fatal
        if fatal is not None:
            raise DeadLetterError(
                f"dead-letter write to {record.topic} refused: {self._fatal_reason(fatal)}",
                topic=record.topic,
                classification=self._fatal_classification(fatal),
            )
        handle = DeadLetterHandle(self, record, on_delivery)
        headers = _redact_free_text(record.headers, self._redact)
        kwargs: dict[str, Any] = {"headers": headers, "on_delivery": handle}
        if record.timestamp:
            kwargs["timestamp"] = record.timestamp
        deadline: float | None = None
        while True:
            try:
                with self._lock:
                    self._producer.produce(record.topic, record.value, record.key, **kwargs)
                    self._pending += 1
                return handle
            except BufferError as exc:
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._backpressure_timeout
                if now >= deadline:
                    raise DeadLetterError(
                        f"dead-letter queue of {self.client_id} stayed full for "
                        f"{self._backpressure_timeout:g} s ({len(self._producer)} queued): "
                        f"the dead letter for {record.topic} was not written",
                        topic=record.topic,
                        classification=classify(exc),
                    ) from exc
                self.poll(0.05)
            except KafkaException as exc:
                fatal = self._fatal or _fatal_of(exc) or self._fatal_cause(exc)
                if fatal is not None:  # produce() says only _FATAL: name the cause
                    self._fatal = fatal
                    raise DeadLetterError(
                        f"dead-letter write to {record.topic} refused: {self._fatal_reason(fatal)}",
                        topic=record.topic,
                        classification=self._fatal_classification(fatal),
                    ) from exc
                error = translate(
                    exc, topic=record.topic, operation="produce", redactor=self._redact
                )
                raise DeadLetterError(
                    f"dead-letter write to {record.topic} refused: {error.message}",
                    topic=record.topic,
                    classification=error.classification,
                ) from exc

    # ------------------------------------------------------------------ serving

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports for up to ``timeout`` seconds; settle their handles.

        A refused login fails the queued dead letters here (see the class docstring): their
        reports are served by the next ``poll``/``flush``."""
        try:
            served = int(self._producer.poll(timeout))
            if self._reach.refused is not None:
                self._fail_refused()
            return served
        except KafkaException as exc:
            # confluent-kafka raises a fatal error (e.g. InitProducerId refused: the principal
            # may write no topic) once from poll(); the purged writes are reported by the next
            # poll, each naming that cause. Anything else is not ours to hide.
            fatal = _fatal_of(exc)
            if fatal is None:
                raise
            self._fatal = fatal
            return 0
        finally:
            self._settle()

    def _fatal_cause(self, exc: KafkaException) -> KafkaError | None:
        """For a bare ``_FATAL`` from produce() before the fatal error was served: serve it
        now (error_cb, or confluent-kafka raising it from poll) to learn the real cause."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is None or err.code() != KafkaError._FATAL:
            return None
        try:
            self._producer.poll(0)
        except KafkaException as raised:
            if self._fatal is None:
                self._fatal = _fatal_of(raised)
        return self._fatal

    def _fatal_reason(self, fatal: KafkaError) -> str:
        return (
            f"the dead-letter producer {self.client_id} hit a fatal error: {fatal.name()}: "
            f"{self._redact(fatal.str() or '')}"
        )

    @staticmethod
    def _fatal_classification(fatal: KafkaError) -> Classification:
        """An authorization refusal is classified as such (grant the ACL), not as 'recreate
        the producer', which would not help."""
        cause = classify(KafkaError(fatal.code(), fatal.str()))
        return cause if cause.category is ErrorCategory.AUTH else classify(fatal)

    def _settle(self) -> None:
        """Classify the reports the handles queued and run their callbacks (outside librdkafka
        callbacks: see DeadLetterHandle.__call__)."""
        reported = self._reported
        while reported:
            try:
                handle = reported.popleft()
            except IndexError:  # another thread took the last one
                return
            err, msg = handle._err, handle._msg
            if err is None:
                handle._result = DeadLetterResult(
                    topic=msg.topic(), partition=msg.partition(), offset=msg.offset()
                )
                with self._lock:
                    self._pending -= 1
                    self._written += 1
                reach = self._reach
                if not reach.ever_connected or reach.refused is not None:
                    reach.connected()  # acknowledged: the login works (no fail-fast after)
            else:
                failure = failure_from_report(err, msg, headers=handle.record.headers)
                reason = self._redact(err.str() or err.name())
                classification = failure.classification
                fatal = self._fatal
                refused = self._refusal_classification(err, classification)
                name = err.name()
                if fatal is not None and err.code() in _FATAL_PURGES:
                    reason = f"{reason} ({self._fatal_reason(fatal)})"
                    classification = self._fatal_classification(fatal)
                elif refused is not None:  # the refusal is the cause, not the purge/timeout
                    reason, classification = refused
                    name = f"{classification.name} ({err.name()})"
                    failure = dataclasses.replace(failure, classification=classification)
                handle._error = DeadLetterError(
                    f"dead-letter write to {handle.record.topic} failed: {name}: {reason}",
                    topic=handle.record.topic,
                    classification=classification,
                )
                with self._lock:
                    self._pending -= 1
                    self._failed += 1
                    self._failures.append(failure)
                allowed, suppressed = self._limiter.check(("failed", err.code()))
                if allowed:
                    self._log.error(
                        "dead_letter_write_failed",
                        topic=handle.record.topic,
                        error=err.name(),
                        reason=reason,
                        category=classification.category.name,
                        remedy=classification.remedy,
                        suppressed=suppressed,
                    )
            callback = handle._callback
            if callback is not None:
                try:
                    callback(handle)
                except Exception as exc:  # a user callback must not break the writer
                    if self._limiter.allow(("callback", type(exc).__name__)):
                        self._log.error(
                            "dead_letter_callback_failed",
                            error=self._redact(repr(exc)),
                            exc_info=exc,
                        )

    def _refusal_classification(
        self, err: KafkaError, base: Classification
    ) -> tuple[str, Classification] | None:
        """``(reason, classification)`` of a failed write when a refused login is its cause:
        purged by :meth:`_fail_refused` (never sent), or timed out while the brokers refused
        this client. ``None`` otherwise."""
        reach = self._reach
        refused = reach.refused
        purged_for = self._auth_purge
        code = err.code()
        if code == KafkaError._PURGE_QUEUE and purged_for is not None and not reach.ever_connected:
            failure = refused or purged_for
            return (
                f"no broker accepted this client: {failure.detail}",
                failure.classification(
                    possibly_persisted=False,
                    note="The dead letter was failed at once, not retried until "
                    "message.timeout.ms: no broker ever accepted this writer, so it was never "
                    "sent and not written",
                ),
            )
        if refused is not None and code in _TIMEOUT_CODES:
            return (
                f"{self._redact(err.str() or err.name())} while the brokers refused this "
                f"client: {refused.detail}",
                refused.classification(
                    possibly_persisted=base.possibly_persisted,
                    note="The dead letter timed out waiting for a connection; "
                    + (
                        "it may have been written before the refusals began"
                        if base.possibly_persisted
                        else "it was not written"
                    ),
                ),
            )
        return None

    def _fail_refused(self) -> bool:
        """Fail the queued dead letters at once when the cluster refused this writer's login.

        The producer's rule (:meth:`kresilient.producer.Reachability.final_refusal` with
        ``all_down``): a broker refused the credentials or certificate, no dead letter was
        ever acknowledged, and librdkafka says every broker it knows is down. The dead
        letters still in librdkafka's queue are purged (never sent; nothing in flight is
        touched) and each ``_PURGE_QUEUE`` report is classified as the refusal by
        :meth:`_settle`. Called from ``error_cb`` (so during the ``flush()`` or ``poll()``
        that serves it: that flush serves the purged reports and returns, no slicing) and
        after ``poll()``. Returns True if dead letters were purged.
        """
        if self._fatal is not None or not self._pending:
            return False
        failure = self._reach.final_refusal(all_down=True)
        if failure is None:
            return False
        self._auth_purge = failure
        return purge_refused(
            self._producer,
            failure,
            self._limiter,
            self._log,
            counted="dead_letters",
            count=lambda: self._pending,
            note="queued dead letters failed at once (never sent); see flush()",
        )

    def _on_error(self, err: KafkaError) -> None:
        try:
            if err.fatal():
                self._fatal = err
            code = err.code()
            text = self._redact(err.str() or "")
            # Kept to name the cause of the failures that follow, and to fail fast on a
            # refused login (_fail_refused); librdkafka reconnects by itself.
            if code in _REFUSAL_CODES:
                self._reach.refusal(text, code)
            elif code in _CONNECT_CODES:
                self._reach.failed(text)  # the host's reason, a TLS alert's refusal
            if code == KafkaError._ALL_BROKERS_DOWN:
                # one kafka_unreachable line naming each host and the refusal, slowly
                self._reach.all_down(text)
            if self._reach.refused is not None:
                # served inside flush()/poll() on the caller's thread: the purged dead
                # letters' reports are served by that same flush, which then returns
                self._fail_refused()
            if code == KafkaError._ALL_BROKERS_DOWN:
                return
            allowed, suppressed = self._limiter.check(("error", code))
            if allowed:
                c = classify(err)
                self._log.warning(
                    "dead_letter_client_error",
                    error=err.name(),
                    reason=text,
                    category=c.category.name,
                    remedy=c.remedy,
                    suppressed=suppressed,
                )
        except Exception:  # an error callback must never raise into librdkafka
            pass

    # ------------------------------------------------------------------ flush, close

    def flush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (``None``: until done) for every pending write.

        Raises :class:`~kresilient.DeliveryError` listing each write that failed since the last
        flush, and saying how many are still pending when ``timeout`` passed first (those are
        not lost: a later ``flush``/``close`` reports them). When the underlying flush raises,
        the failures already known are raised with it (chained), not forgotten.
        """
        cause: BaseException | None = None
        if self._reach.refused is not None:
            self._fail_refused()  # written after a refusal: this flush serves their reports
        try:
            self._producer.flush(-1 if timeout is None else timeout)
        except Exception as exc:  # e.g. a fatal error surfacing from librdkafka
            cause = exc
            if isinstance(exc, KafkaException) and self._fatal is None:
                self._fatal = _fatal_of(exc)  # the purged writes then name it
                with contextlib.suppress(KafkaException):
                    self._producer.poll(0)  # serve the purge reports the raise cut short
        finally:
            self._settle()
        remaining = self._pending
        if cause is None and remaining == 0 and not self._failures:
            return
        with self._lock:
            failures, self._failures = self._failures, []
        parts = [DeliveryError(failures=failures).message] if failures else []
        if remaining:
            parts.append(
                f"{remaining} dead letter(s) still unacknowledged after flush(timeout={timeout})"
            )
        if cause is not None:
            parts.append(
                f"the dead-letter producer's flush raised {type(cause).__name__}: "
                f"{self._redact(str(cause))}"
            )
        error = DeliveryError("; ".join(parts), failures=failures)
        if cause is not None:
            raise error from cause
        raise error

    def close(self, timeout: float | None = 10.0) -> None:
        """Flush for up to ``timeout`` seconds, purge what is left (it is reported as failed,
        ``_PURGE_*``), and release the producer. Raises :class:`~kresilient.DeliveryError` when
        any write failed or was purged. Idempotent."""
        if self._closed:
            return
        self._closed = True
        error: DeliveryError | None = None
        try:
            self.flush(timeout)
        except DeliveryError as exc:
            error = exc
        if self._pending:
            with contextlib.suppress(KafkaException):
                self._producer.purge(in_queue=True, in_flight=True, blocking=True)
            deadline = time.monotonic() + 5.0
            while self._pending and time.monotonic() < deadline:
                with contextlib.suppress(KafkaException):
                    self._producer.poll(0.05)
                self._settle()
            with self._lock:
                failures, self._failures = self._failures, []
            lost = self._pending
            if failures or lost:
                parts = [DeliveryError(failures=failures).message] if failures else []
                if lost:
                    parts.append(f"{lost} dead letter(s) got no report before close")
                prior = list(error.failures) if error is not None else []
                error = DeliveryError(
                    "; ".join(([error.message] if error is not None else []) + parts),
                    failures=prior + failures,
                )
        self._log.debug("dead_letter_writer_closed", written=self._written, failed=self._failed)
        if error is not None:
            raise error

    def __enter__(self) -> DeadLetterWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
