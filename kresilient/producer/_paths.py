"""The producer's slow paths: a full queue, synchronous produce errors, fatal errors.

Functions of the :class:`~kresilient.ResilientProducer` (``self``) kept out of
``producer.py`` so that file holds the hot path and the public API. None of this runs per
message unless something went wrong.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import KafkaError, KafkaException, Producer

from kresilient.errors import (
    FatalProducerError,
    MessageTooLargeError,
    ProduceError,
    classify,
    translate,
)
from kresilient.producer._handle import DeliveryHandle, _FullHandle, handle_extras
from kresilient.producer._support import fatal_cause, lost_fatal

if TYPE_CHECKING:
    from kresilient.producer._producer import ResilientProducer

__all__ = ["drain", "end_span", "handle_fatal", "produce_blocked", "produce_failed", "settle"]

_TOO_LARGE: Final = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
#: How long a purge waits for the purged messages' delivery reports.
DRAIN_TIMEOUT: Final = 10.0


def drain(producer: Producer) -> int:
    """Purge every queued and in-flight message and serve their delivery reports.

    Returns how many messages are still unaccounted for after ``DRAIN_TIMEOUT`` (normally 0:
    a purge turns every message into a ``_PURGE_QUEUE``/``_PURGE_INFLIGHT`` report).
    """
    with contextlib.suppress(KafkaException):
        producer.purge(in_queue=True, in_flight=True, blocking=True)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while len(producer) > 0 and time.monotonic() < deadline:
        try:
            producer.poll(0.1)
        except (KafkaException, SystemError):
            continue  # a fatal event or a callback cut short: the reports were queued
    return len(producer)


def produce_blocked(
    self: ResilientProducer,
    topic: str,
    value: Any,
    key: Any,
    part: int,
    handle: DeliveryHandle,
    ts: int,
    headers: Any,
) -> DeliveryHandle:
    """The local queue is full: serve delivery reports until there is room, or time out."""
    self._backpressure_waits += 1
    began = time.monotonic()
    deadline = began + self._backpressure_timeout
    while True:
        self.poll(0.05)
        try:
            self._produce(topic, value, key, part, handle, None, ts, headers)
        except BufferError as exc:
            if time.monotonic() < deadline:
                continue
            classification = classify(exc)
            error = ProduceError(
                f"local producer queue stayed full for {self._backpressure_timeout:g} s "
                f"({len(self)} messages queued); the message was not queued",
                code=KafkaError._QUEUE_FULL,
                name="_QUEUE_FULL",
                topic=topic,
                partition=part if part >= 0 else None,
                classification=classification,
            )
            end_span(self, handle, exc, classification)
            raise error from exc
        except KafkaException as exc:
            return produce_failed(self, exc, topic, value, key, part, handle, ts, headers)
        break
    self._log.debug("produce_backpressure", waited_s=round(time.monotonic() - began, 3))
    return handle


def produce_failed(
    self: ResilientProducer,
    exc: KafkaException,
    topic: str,
    value: Any,
    key: Any,
    part: int,
    handle: DeliveryHandle,
    ts: int,
    headers: Any,
) -> DeliveryHandle:
    """produce() raised synchronously: too large, fatal, or a local error."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    code = err.code() if err is not None else None
    if code in _TOO_LARGE:
        return _too_large(self, exc, topic, value, key, part, handle, ts, headers)
    if err is not None and (err.fatal() or code == KafkaError._FATAL):
        try:
            handle_fatal(self, exc)  # raises unless recreated
        except FatalProducerError:
            end_span(self, handle, exc, classify(exc))
            raise
        self._produce(topic, value, key, part, handle, None, ts, headers)
        return handle
    error = translate(exc, topic=topic, partition=part if part >= 0 else None, operation="produce")
    end_span(self, handle, exc, error.classification)
    raise error from exc


def _too_large(
    self: ResilientProducer,
    exc: KafkaException,
    topic: str,
    value: Any,
    key: Any,
    part: int,
    handle: DeliveryHandle,
    ts: int,
    headers: Any,
) -> DeliveryHandle:
    value_size = len(value) if value is not None else 0
    key_size = len(key) if key is not None else 0
    classification = classify(exc)
    error = MessageTooLargeError(
        f"value of {value_size} bytes (key {key_size} bytes, plus headers and record "
        f"framing) exceeds the producer's message.max.bytes={self._max_bytes}",
        size=value_size,
        limit=self._max_bytes,
        topic=topic,
        partition=part if part >= 0 else None,
        classification=classification,
    )
    end_span(self, handle, exc, classification)
    if self._dead_letter_topic is None:
        raise error from exc
    from kresilient.producer._dlq import dead_letter_oversized

    return dead_letter_oversized(
        self,
        error,
        topic=topic,
        value=value,
        key=key,
        headers=handle_extras(handle)[0] if isinstance(handle, _FullHandle) else headers,
        partition=part if part >= 0 else None,
        timestamp=ts,
        on_delivery=handle_extras(handle)[1],
    )


def end_span(
    self: ResilientProducer, handle: DeliveryHandle, err: Any, classification: Any
) -> None:
    if isinstance(handle, _FullHandle) and handle._token is not None:
        self._tel.producer_delivered(handle._token, err, None, classification)
        handle._token = None


def settle(self: ResilientProducer, exc: BaseException | None) -> None:
    """After serving callbacks: classify queued failures, handle a fatal error, re-raise."""
    self._process_reported()
    fatal = fatal_cause(exc)
    pending, self._pending_fatal = self._pending_fatal, None
    if fatal is None:
        fatal = pending or lost_fatal(exc, self._log_bridge.fatal_line)
    if fatal is not None:
        handle_fatal(self, fatal)
        return
    if isinstance(exc, KafkaException):
        raise translate(exc, operation="produce") from exc
    if exc is not None:
        raise exc


def handle_fatal(self: ResilientProducer, exc: KafkaException) -> None:
    """A fatal error surfaced: recreate the producer (option) or raise FatalProducerError."""
    if self._fatal is not None:
        raise self._fatal
    error = translate(exc, operation="produce")
    fatal = (
        error
        if isinstance(error, FatalProducerError)
        else FatalProducerError(error.message, classification=error.classification)
    )
    self._tel.fatal_error(fatal, fatal.classification, client_id=self.client_id)
    self._log.error(
        "producer_fatal_error",
        error=fatal.name,
        reason=self._scrub(fatal.message),
        recreate=self._recreate_on_fatal,
        in_flight=len(self),
    )
    if not self._recreate_on_fatal:
        self._fatal = fatal
        raise fatal from exc
    with self._recreate_lock:
        _recreate(self, fatal)


def _recreate(self: ResilientProducer, cause: FatalProducerError) -> None:
    """Replace the underlying producer; account for every message the old one held."""
    # librdkafka already failed what was queued (_PURGE_QUEUE: never sent); purge what is
    # left: in flight (_PURGE_INFLIGHT: possibly persisted) or queued meanwhile.
    old = self._producer
    try:
        lost = drain(old)
        self._process_reported()
    finally:
        self._pending_fatal = None  # the old instance's fatal event, already handled
    if lost:
        self._unaccounted += lost
        self._log.error("producer_recreate_unaccounted", messages=lost)
    self._install(self._new_producer())
    self._recreations += 1
    self._log.warning(
        "producer_recreated",
        cause=cause.name,
        recreations=self._recreations,
        note="messages queued or in flight were reported failed (possibly persisted)",
    )
