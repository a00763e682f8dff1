"""The producer's dead-letter path: values over ``message.max.bytes`` kept byte for byte.

The record goes to the dead-letter topic with the ORIGINAL key, value and headers plus the
``kresilient.*`` error headers of :func:`kresilient.deadletter.dead_letter_headers` (the same
format the consumer writes, so ``kresilient dlq inspect/replay`` read both). It is written by
the one dead-letter writer of kresilient, :class:`kresilient.deadletter.DeadLetterWriter`,
whose ``message.max.bytes`` is ``dead_letter_max_bytes``: the oversized value cannot pass
the first producer's own limit. The dead-letter topic's ``max.message.bytes`` must allow it
too.

:class:`OversizedDeadLetters` is composed into the producer with explicit constructor
arguments and makes its writer on first use through the ``make_writer`` factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from kresilient.deadletter import (
    DeadLetterHandle,
    DeadLetterRecord,
    DeadLetterWriter,
    dead_letter_headers,
)
from kresilient.errors import DeadLetterError, MessageTooLargeError, ProduceError
from kresilient.producer._handle import DeliveryHandle, DeliveryResult

__all__ = ["DeadLetteredHandle", "OversizedDeadLetters"]


class DeadLetteredHandle(DeliveryHandle):
    """The :class:`DeliveryHandle` of a message diverted to the dead-letter topic.

    It resolves to the dead-letter write: ``result().topic`` is the dead-letter topic; a
    failed write is a :class:`~kresilient.ProduceError` carrying the dead-letter error's
    classification (the :class:`~kresilient.DeadLetterError` is its ``__cause__``).
    """

    __slots__ = ("_dead_letter",)

    def __init__(self, message_id: int, dead_letter: DeadLetterHandle) -> None:
        self._id = message_id
        self._dead_letter = dead_letter

    def __call__(self, err: Any, msg: Any) -> None:  # never handed to librdkafka
        raise TypeError("a dead-lettered handle is not a delivery callback")

    def done(self) -> bool:
        return self._dead_letter.done()

    def result(self, timeout: float | None = None) -> DeliveryResult:
        error = self.exception(timeout)
        if error is not None:
            raise error
        r = self._dead_letter.result(0)
        return DeliveryResult(topic=r.topic, partition=r.partition, offset=r.offset)

    def exception(self, timeout: float | None = None) -> ProduceError | None:
        cause = self._dead_letter.exception(timeout)
        if cause is None:
            return None
        error = ProduceError(
            f"dead-letter write failed: {cause.message}",
            topic=cause.topic,
            classification=cause.classification,
        )
        error.__cause__ = cause
        return error

    def __repr__(self) -> str:
        return f"<DeliveryHandle #{self._id} dead-lettered {self._dead_letter!r}>"


class _WrittenMessage:
    """What a user ``on_delivery(err, msg)`` receives for a dead-lettered message."""

    __slots__ = ("_error", "_offset", "_partition", "_record")

    def __init__(self, record: DeadLetterRecord, handle: DeadLetterHandle) -> None:
        self._record = record
        error = handle.exception(0)
        code = error.classification.code if error is not None else None
        self._error = (
            None if error is None else KafkaError(code if code is not None else KafkaError._FAIL)
        )
        result = None if error is not None else handle.result(0)
        self._partition = result.partition if result is not None else -1
        self._offset = result.offset if result is not None else -1001

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._record.topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> Any:
        return self._record.key

    def value(self) -> Any:
        return self._record.value

    def headers(self) -> Any:
        return self._record.headers


class OversizedDeadLetters:
    """Writes oversized records to one dead-letter topic through a lazily made writer.

    Args:
        topic: the dead-letter topic.
        max_bytes: ``message.max.bytes`` of the dead-letter writer (for the error message).
        make_writer: builds the :class:`~kresilient.deadletter.DeadLetterWriter` (called
            once, on the first record).
        log: the owner's structlog logger.
        trace_carrier: returns the current trace context as header fields; it goes in
            ``kresilient.traceparent`` (the record keeps the original headers byte for byte).
    """

    def __init__(
        self,
        *,
        topic: str,
        max_bytes: int,
        make_writer: Callable[[], DeadLetterWriter],
        log: Any,
        trace_carrier: Callable[[], dict[str, str]],
    ) -> None:
        self.topic = topic
        self._max_bytes = max_bytes
        self._make_writer = make_writer
        self._log = log
        self._trace_carrier = trace_carrier
        #: The dead-letter writer once made (``None`` until the first oversized record).
        self.writer: Any = None

    def write(
        self,
        error: MessageTooLargeError,
        *,
        message_id: int,
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        timestamp: int,
        on_delivery: Callable[[Any, Any], None] | None,
    ) -> DeadLetteredHandle:
        """Send an oversized record to the dead-letter topic; return its handle.

        Raises :class:`~kresilient.DeadLetterError` if the writer refuses it (too large for
        ``dead_letter_max_bytes`` too, its queue full, closed, fatal).
        """
        if self.writer is None:
            self.writer = self._make_writer()
        record = DeadLetterRecord(
            topic=self.topic,
            key=key,
            value=value,
            headers=dead_letter_headers(
                topic,
                partition,
                None,
                timestamp or None,
                None,
                error,
                error.classification,
                1,
                original_headers=headers,
                trace_context=self._trace_carrier(),
            ),
            timestamp=timestamp or None,
        )
        callback = None
        if on_delivery is not None:
            user = on_delivery

            def callback(handle: DeadLetterHandle) -> None:
                msg = _WrittenMessage(record, handle)
                user(msg.error(), msg)

        try:
            written = self.writer.write(record, on_delivery=callback)
        except DeadLetterError as exc:
            if exc.classification.name in ("MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
                raise DeadLetterError(
                    f"{error.message}; the dead-letter producer refused it too "
                    f"(dead_letter_max_bytes={self._max_bytes})",
                    topic=self.topic,
                    classification=error.classification,
                ) from exc
            raise
        self._log.warning(
            "message_dead_lettered",
            topic=topic,
            dead_letter_topic=self.topic,
            value_size=error.size,
            limit=error.limit,
            reason="MSG_SIZE_TOO_LARGE",
        )
        return DeadLetteredHandle(message_id, written)
