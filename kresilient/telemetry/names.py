"""Attribute, metric and event names used by :mod:`kresilient.telemetry`.

The ``messaging.*``, ``error.type``, ``server.*`` and ``exception.*`` names follow the
OpenTelemetry semantic conventions for messaging (Kafka), as published by the
``opentelemetry-semantic-conventions`` package (schema 1.44.0). That package is only a development
dependency, so the names are spelled out here; ``tests/test_telemetry_names.py`` asserts that
every one equals the package's constant, so a rename upstream fails the test suite.

``kresilient.*`` names are kresilient's own (no convention covers them).
"""

from __future__ import annotations

from typing import Final

SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.44.0"
INSTRUMENTATION_NAME: Final = "kresilient"

# --- semantic-convention attributes -------------------------------------------------------
MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_SYSTEM_KAFKA: Final = "kafka"
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID: Final = "messaging.destination.partition.id"
MESSAGING_KAFKA_MESSAGE_KEY: Final = "messaging.kafka.message.key"
MESSAGING_KAFKA_MESSAGE_TOMBSTONE: Final = "messaging.kafka.message.tombstone"
MESSAGING_KAFKA_OFFSET: Final = "messaging.kafka.offset"
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_CLIENT_ID: Final = "messaging.client.id"
MESSAGING_MESSAGE_BODY_SIZE: Final = "messaging.message.body.size"
MESSAGING_BATCH_MESSAGE_COUNT: Final = "messaging.batch.message_count"
ERROR_TYPE: Final = "error.type"
ERROR_TYPE_OTHER: Final = "_OTHER"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"
EXCEPTION_STACKTRACE: Final = "exception.stacktrace"

# messaging.operation.type values
OP_TYPE_SEND: Final = "send"
OP_TYPE_PROCESS: Final = "process"
OP_TYPE_SETTLE: Final = "settle"
# messaging.operation.name values used for Kafka (system-specific names)
OP_NAME_SEND: Final = "send"
OP_NAME_PROCESS: Final = "process"
OP_NAME_COMMIT: Final = "commit"

# --- semantic-convention metrics ----------------------------------------------------------
METRIC_SENT_MESSAGES: Final = "messaging.client.sent.messages"
METRIC_CONSUMED_MESSAGES: Final = "messaging.client.consumed.messages"
METRIC_OPERATION_DURATION: Final = "messaging.client.operation.duration"
METRIC_PROCESS_DURATION: Final = "messaging.process.duration"
# Recommended explicit bucket boundaries for the two duration histograms (seconds).
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)

# --- kresilient attributes, metrics, events -----------------------------------------------
KRESILIENT_ERROR_CATEGORY: Final = "kresilient.error.category"
KRESILIENT_RETRY_ATTEMPT: Final = "kresilient.retry.attempt"
KRESILIENT_RETRY_DELAY: Final = "kresilient.retry.delay_s"
KRESILIENT_DEAD_LETTER_TOPIC: Final = "kresilient.dead_letter.topic"
KRESILIENT_DEAD_LETTER_SOURCE_TOPIC: Final = "kresilient.dead_letter.source.topic"
KRESILIENT_DEAD_LETTER_SOURCE_PARTITION: Final = "kresilient.dead_letter.source.partition"
KRESILIENT_DEAD_LETTER_SOURCE_OFFSET: Final = "kresilient.dead_letter.source.offset"
KRESILIENT_DEAD_LETTER_REASON: Final = "kresilient.dead_letter.reason"
KRESILIENT_ATTEMPTS: Final = "kresilient.attempts"
KRESILIENT_LEADERSHIP_STATE: Final = "kresilient.leadership.state"
KRESILIENT_LEADERSHIP_PREVIOUS_STATE: Final = "kresilient.leadership.previous_state"

METRIC_RETRIES: Final = "kresilient.retries"
METRIC_DEAD_LETTERS: Final = "kresilient.dead_letters"
METRIC_LEADERSHIP_STATE_CHANGES: Final = "kresilient.leadership.state_changes"

EVENT_RETRY: Final = "kresilient.retry"
EVENT_EXCEPTION: Final = "exception"  # the span event name Span.record_exception uses
SPAN_DEAD_LETTER: Final = "dead_letter"  # span name prefix: "dead_letter {dlq topic}"

# structlog event names for notable state changes (one event per change, never per message).
LOG_LEADERSHIP_CHANGED: Final = "kafka_leadership_state_changed"
LOG_DEAD_LETTERED: Final = "kafka_message_dead_lettered"
LOG_CIRCUIT_BREAKER_OPENED: Final = "kafka_dead_letter_circuit_breaker_opened"
LOG_FATAL_ERROR: Final = "kafka_fatal_error"
# telemetry's own failure (a span processor or exporter raised): rate-limited, never per message
LOG_TELEMETRY_FAILED: Final = "kafka_telemetry_failed"
