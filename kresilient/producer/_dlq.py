"""The producer's dead-letter path: values over ``message.max.bytes`` kept byte for byte.

The record goes to the dead-letter topic with the ORIGINAL key, value and headers plus the
``kresilient.*`` error headers of :func:`kresilient.deadletter.dead_letter_headers` (the same
format the consumer writes, so ``kresilient dlq inspect/replay`` read both). It is written by a
second :class:`~kresilient.ResilientProducer` whose ``message.max.bytes`` is
``dead_letter_max_bytes``: the oversized value cannot pass the first producer's own limit.
The dead-letter topic's ``max.message.bytes`` must allow it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.propagators.composite import CompositePropagator

from kresilient.deadletter import dead_letter_headers
from kresilient.errors import DeadLetterError, MessageTooLargeError

_NO_PROPAGATION = CompositePropagator([])

if TYPE_CHECKING:
    from kresilient.producer._handle import DeliveryHandle
    from kresilient.producer._producer import ResilientProducer

__all__ = ["dead_letter_oversized"]


def _dead_letter_producer(owner: ResilientProducer) -> ResilientProducer:
    if owner._dlq is None:
        from kresilient.producer._producer import ResilientProducer

        config = dict(owner._user_config)
        config["message.max.bytes"] = owner._dead_letter_max_bytes
        config["client.id"] = f"{owner.client_id}-dlq"
        owner._dlq = ResilientProducer(
            config,
            allow_unsafe=owner._allow_unsafe,
            recreate_on_fatal=owner._recreate_on_fatal,
            logger=owner._log,
            tracer_provider=owner._tel_args.get("tracer_provider"),
            meter_provider=owner._tel_args.get("meter_provider"),
            # The record keeps the original headers byte for byte (a traceparent among them):
            # the DLQ write's own context goes in kresilient.traceparent instead.
            propagator=_NO_PROPAGATION,
            backpressure_timeout=owner._backpressure_timeout,
        )
    dlq: ResilientProducer = owner._dlq
    return dlq


def dead_letter_oversized(
    owner: ResilientProducer,
    error: MessageTooLargeError,
    *,
    topic: str,
    value: Any,
    key: Any,
    headers: Any,
    partition: int | None,
    timestamp: int,
    on_delivery: Any,
) -> DeliveryHandle:
    """Send an oversized record to ``owner``'s dead-letter topic; return that write's handle.

    Raises :class:`~kresilient.DeadLetterError` if the dead-letter producer refuses it too.
    """
    dlq_topic = owner._dead_letter_topic
    assert dlq_topic is not None
    producer = _dead_letter_producer(owner)
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
        trace_context=owner._tel.trace_carrier(),
    )
    try:
        handle = producer.produce(
            dlq_topic,
            value,
            key,
            headers=dl_headers,
            timestamp=timestamp or None,
            on_delivery=on_delivery,
        )
    except MessageTooLargeError as exc:
        raise DeadLetterError(
            f"{error.message}; the dead-letter producer refused it too "
            f"(dead_letter_max_bytes={owner._dead_letter_max_bytes})",
            topic=dlq_topic,
            classification=error.classification,
        ) from exc
    owner._log.warning(
        "message_dead_lettered",
        topic=topic,
        dead_letter_topic=dlq_topic,
        value_size=error.size,
        limit=error.limit,
        reason="MSG_SIZE_TOO_LARGE",
    )
    return handle
