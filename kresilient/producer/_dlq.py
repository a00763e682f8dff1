"""The producer's dead-letter path: values over ``message.max.bytes`` kept byte for byte.

The record goes to the dead-letter topic with the ORIGINAL key, value and headers plus the
``kresilient.*`` error headers of :func:`kresilient.deadletter.dead_letter_headers` (the same
format the consumer writes, so ``kresilient dlq inspect/replay`` read both). It is written by a
second producer whose ``message.max.bytes`` is ``dead_letter_max_bytes``: the oversized value
cannot pass the first producer's own limit. The dead-letter topic's ``max.message.bytes`` must
allow it too.

:class:`OversizedDeadLetters` is composed into the producer with explicit constructor
arguments; it makes its own producer on first use through the ``make_producer`` factory (the
producer passes one that builds a :class:`~kresilient.ResilientProducer`, so this module never
imports the producer class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kresilient.deadletter import dead_letter_headers
from kresilient.errors import DeadLetterError, MessageTooLargeError

__all__ = ["OversizedDeadLetters"]


class OversizedDeadLetters:
    """Writes oversized records to one dead-letter topic through a lazily made producer.

    Args:
        topic: the dead-letter topic.
        max_bytes: ``message.max.bytes`` of the dead-letter producer (for the error message).
        make_producer: builds the dead-letter producer (called once, on the first record).
        log: the owner's structlog logger.
        trace_carrier: returns the current trace context as header fields; it goes in
            ``kresilient.traceparent`` (the record keeps the original headers byte for byte).
    """

    def __init__(
        self,
        *,
        topic: str,
        max_bytes: int,
        make_producer: Callable[[], Any],
        log: Any,
        trace_carrier: Callable[[], dict[str, str]],
    ) -> None:
        self.topic = topic
        self._max_bytes = max_bytes
        self._make_producer = make_producer
        self._log = log
        self._trace_carrier = trace_carrier
        #: The dead-letter producer once made (``None`` until the first oversized record).
        self.producer: Any = None

    def write(
        self,
        error: MessageTooLargeError,
        *,
        topic: str,
        value: Any,
        key: Any,
        headers: Any,
        partition: int | None,
        timestamp: int,
        on_delivery: Any,
    ) -> Any:
        """Send an oversized record to the dead-letter topic; return that write's handle.

        Raises :class:`~kresilient.DeadLetterError` if the dead-letter producer refuses it too.
        """
        if self.producer is None:
            self.producer = self._make_producer()
        dl_headers = dead_letter_headers(
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
        )
        try:
            handle = self.producer.produce(
                self.topic,
                value,
                key,
                headers=dl_headers,
                timestamp=timestamp or None,
                on_delivery=on_delivery,
            )
        except MessageTooLargeError as exc:
            raise DeadLetterError(
                f"{error.message}; the dead-letter producer refused it too "
                f"(dead_letter_max_bytes={self._max_bytes})",
                topic=self.topic,
                classification=error.classification,
            ) from exc
        self._log.warning(
            "message_dead_lettered",
            topic=topic,
            dead_letter_topic=self.topic,
            value_size=error.size,
            limit=error.limit,
            reason="MSG_SIZE_TOO_LARGE",
        )
        return handle
