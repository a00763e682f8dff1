"""OpenTelemetry spans and metrics for Kafka clients, on the current messaging conventions.

One :class:`Telemetry` object per client. The producer and consumer call it on their hot paths:

Producer (one PRODUCER span per message that ends at the *delivery report*, not at enqueue)::

    headers, token = tel.producer_send(topic, key, len(value), headers, partition)
    producer.produce(topic, value, key, headers=headers, on_delivery=...)
    # in the delivery callback:
    tel.producer_delivered(token, err, msg, classification)

Consumer (one CONSUMER span per message, parented to / linked with the producer's context)::

    with tel.process_span(msg) as span:
        handle(msg)                         # retries: tel.retry_event(span, attempt, exc)
        with tel.dead_letter_span(dlq_topic, source=msg, reason=exc):
            dlq_producer.produce(dlq_topic, ..., headers=tel.inject_headers(dlq_headers))
    tel.record_commit(offsets)

Cost: with only ``opentelemetry-api`` installed (or no provider configured) every call returns
after a couple of attribute loads, no span or attribute dict is built. A global provider set
*after* the client was created is picked up on the next call. Sampling is respected: a sampled-out
span is never recorded, but its context is still injected so downstream services agree. With a
``TraceIdRatioBased`` or ``ParentBased(TraceIdRatioBased)`` sampler the producer takes the
sampler's decision itself (same rule, same trace ids): a sampled-out message costs a random
draw and a ``traceparent`` header, no SDK span (:mod:`kresilient.telemetry.sampling`).

Attribute/metric names: :mod:`kresilient.telemetry.names` (checked against the
``opentelemetry-semantic-conventions`` package by the tests).
"""

from __future__ import annotations

from kresilient.telemetry._telemetry import *  # noqa: F403
from kresilient.telemetry._telemetry import __all__ as __all__
