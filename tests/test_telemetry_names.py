"""The library spells attribute/metric names as literals (semconv is a dev dependency only).

Every literal must equal the constant that opentelemetry-semantic-conventions publishes, and no
deprecated messaging name may be emitted.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import messaging_attributes as MA
from opentelemetry.semconv._incubating.metrics import messaging_metrics as MM
from opentelemetry.semconv.attributes import (
    error_attributes,
    exception_attributes,
    server_attributes,
)
from opentelemetry.semconv.schemas import Schemas

from kresilient.telemetry import names as N


def _sdk_exception_event_name() -> str:
    """The event name the SDK's own ``Span.record_exception`` writes (no semconv constant)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("names").start_span("s")
    span.record_exception(ValueError("x"))
    span.end()
    (finished,) = exporter.get_finished_spans()
    return finished.events[0].name


PAIRS = [
    (N.MESSAGING_SYSTEM, MA.MESSAGING_SYSTEM),
    (N.MESSAGING_SYSTEM_KAFKA, MA.MessagingSystemValues.KAFKA.value),
    (N.MESSAGING_DESTINATION_NAME, MA.MESSAGING_DESTINATION_NAME),
    (N.MESSAGING_DESTINATION_PARTITION_ID, MA.MESSAGING_DESTINATION_PARTITION_ID),
    (N.MESSAGING_KAFKA_MESSAGE_KEY, MA.MESSAGING_KAFKA_MESSAGE_KEY),
    (N.MESSAGING_KAFKA_MESSAGE_TOMBSTONE, MA.MESSAGING_KAFKA_MESSAGE_TOMBSTONE),
    (N.MESSAGING_KAFKA_OFFSET, MA.MESSAGING_KAFKA_OFFSET),
    (N.MESSAGING_CONSUMER_GROUP_NAME, MA.MESSAGING_CONSUMER_GROUP_NAME),
    (N.MESSAGING_OPERATION_TYPE, MA.MESSAGING_OPERATION_TYPE),
    (N.MESSAGING_OPERATION_NAME, MA.MESSAGING_OPERATION_NAME),
    (N.MESSAGING_CLIENT_ID, MA.MESSAGING_CLIENT_ID),
    (N.MESSAGING_MESSAGE_BODY_SIZE, MA.MESSAGING_MESSAGE_BODY_SIZE),
    (N.MESSAGING_BATCH_MESSAGE_COUNT, MA.MESSAGING_BATCH_MESSAGE_COUNT),
    (N.ERROR_TYPE, error_attributes.ERROR_TYPE),
    (N.ERROR_TYPE_OTHER, error_attributes.ErrorTypeValues.OTHER.value),
    (N.SERVER_ADDRESS, server_attributes.SERVER_ADDRESS),
    (N.SERVER_PORT, server_attributes.SERVER_PORT),
    (N.EXCEPTION_TYPE, exception_attributes.EXCEPTION_TYPE),
    (N.EXCEPTION_MESSAGE, exception_attributes.EXCEPTION_MESSAGE),
    (N.EXCEPTION_STACKTRACE, exception_attributes.EXCEPTION_STACKTRACE),
    (N.EVENT_EXCEPTION, _sdk_exception_event_name()),
    (N.OP_TYPE_SEND, MA.MessagingOperationTypeValues.SEND.value),
    (N.OP_TYPE_PROCESS, MA.MessagingOperationTypeValues.PROCESS.value),
    (N.OP_TYPE_SETTLE, MA.MessagingOperationTypeValues.SETTLE.value),
    (N.METRIC_SENT_MESSAGES, MM.MESSAGING_CLIENT_SENT_MESSAGES),
    (N.METRIC_CONSUMED_MESSAGES, MM.MESSAGING_CLIENT_CONSUMED_MESSAGES),
    (N.METRIC_OPERATION_DURATION, MM.MESSAGING_CLIENT_OPERATION_DURATION),
    (N.METRIC_PROCESS_DURATION, MM.MESSAGING_PROCESS_DURATION),
    (N.SCHEMA_URL, Schemas.V1_44_0.value),
]

DEPRECATED = {
    MA.MESSAGING_KAFKA_CONSUMER_GROUP,
    MA.MESSAGING_KAFKA_DESTINATION_PARTITION,
    MA.MESSAGING_KAFKA_MESSAGE_OFFSET,
    MA.MESSAGING_OPERATION,
    MA.MESSAGING_DESTINATION_PUBLISH_NAME,
    MM.MESSAGING_CLIENT_PUBLISHED_MESSAGES,
    MM.MESSAGING_PUBLISH_DURATION,
    MM.MESSAGING_PUBLISH_MESSAGES,
    MM.MESSAGING_RECEIVE_DURATION,
    MM.MESSAGING_RECEIVE_MESSAGES,
    MM.MESSAGING_PROCESS_MESSAGES,
}


@pytest.mark.parametrize(("literal", "published"), PAIRS, ids=[p[1] for p in PAIRS])
def test_literal_equals_semconv_constant(literal: str, published: str) -> None:
    assert literal == published


def _semconv_literals() -> dict[str, str]:
    """Every name in kresilient.telemetry.names that lives in a semantic-convention namespace."""
    return {
        k: v
        for k, v in vars(N).items()
        if k.isupper()
        and isinstance(v, str)
        and v.split(".")[0] in {"messaging", "error", "server", "exception"}
    }


def test_every_semconv_namespaced_literal_is_checked() -> None:
    checked = {p[0] for p in PAIRS}
    unchecked = {k for k, v in _semconv_literals().items() if v not in checked}
    assert unchecked == set()


def test_no_deprecated_name_is_used() -> None:
    used = {v for v in vars(N).values() if isinstance(v, str)}
    assert used & DEPRECATED == set()


def test_kresilient_names_stay_in_their_namespace() -> None:
    own = [
        v
        for k, v in vars(N).items()
        if (k.startswith(("KRESILIENT_", "METRIC_")) or k == "EVENT_RETRY")
        and isinstance(v, str)
        and v not in {p[0] for p in PAIRS}
    ]
    assert own, "expected kresilient's own names"
    assert all(v.startswith("kresilient.") for v in own)
