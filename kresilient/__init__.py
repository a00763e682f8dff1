"""kresilient: Kafka clients that are hard to misuse and easy to trust.

The public API is re-exported here; subpackages and modules hold the details:

- :mod:`kresilient.producer`: ResilientProducer (no silent loss, classified flush failures),
  the crash-safe ``Spool``.
- :mod:`kresilient.consumer`: ResilientConsumer (commit after processing, retries, DLQ).
- :mod:`kresilient.aio`: the same guarantees for asyncio services.
- :mod:`kresilient.telemetry`: OpenTelemetry spans and metrics, trace context in headers.
- :mod:`kresilient.spark`: the ``kresilient`` PySpark data source.
- :mod:`kresilient.lint`, :mod:`kresilient.doctor`: config lint, live audit, diagnosis.
- :mod:`kresilient.testing`: a real 3-node KRaft Kafka cluster for tests and demos.
- Shared leaves: :mod:`kresilient.errors` (classification, the exception tree),
  :mod:`kresilient.config` (safe defaults, validation), :mod:`kresilient.redaction`,
  :mod:`kresilient.deadletter` (record format, the one dead-letter writer),
  :mod:`kresilient.retry` (tenacity predicates), :mod:`kresilient.leadership` (burst vs
  churn), :mod:`kresilient.dedupe`, :mod:`kresilient.outbox`, :mod:`kresilient.admin`.
"""

from __future__ import annotations

import importlib
import typing

from kresilient._version import __version__

if typing.TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is loaded on first use
    from kresilient.config import consumer_config, producer_config, redact
    from kresilient.consumer import (
        OUTAGE_RETRY,
        ConsumerHealth,
        Output,
        ResilientConsumer,
        RetryPolicy,
        RetryTopicPolicy,
        TransactionPolicy,
    )
    from kresilient.deadletter import (
        CircuitBreakerPolicy,
        DeadLetterInfo,
        DeadLetterPolicy,
        DeadLetterRecord,
        DeadLetterWriter,
        dead_letter_headers,
        dead_letter_producer_config,
        parse_dead_letter_headers,
    )
    from kresilient.deadletter_cli import (
        InspectedRecord,
        InspectResult,
        ReplayResult,
        inspect_dead_letters,
        replay_dead_letters,
    )
    from kresilient.dedupe import Deduplicator
    from kresilient.errors import (
        Action,
        BatchItemError,
        CircuitBreakerOpenError,
        Classification,
        CommitError,
        ConfigError,
        ConsumeError,
        CrashLoopError,
        DeadLetterError,
        DeliveryError,
        DeliveryFailure,
        ErrorCategory,
        FatalProducerError,
        KafkaClientError,
        KResilientError,
        MessageTooLargeError,
        ProduceError,
        ReplayMismatchError,
        SchemaError,
        SpoolCorruptError,
        SpoolError,
        UnsafeConfigError,
        classify,
        failure_from_report,
        is_unproducible,
        translate,
    )
    from kresilient.leadership import (
        ChurnPolicy,
        LeadershipChange,
        LeadershipMonitor,
        LeadershipState,
    )
    from kresilient.producer import (
        DeliveryHandle,
        DeliveryResult,
        FlushResult,
        ProducerFencedError,
        ProducerHealth,
        ResilientProducer,
        Spool,
        TransactionAbortedError,
        TransactionalProducer,
        TransactionOutcomeUnknownError,
    )
    from kresilient.retry import (
        retry_if_action,
        retry_if_category,
        retry_if_classification,
        retry_if_kafka_code,
        retry_if_kafka_retriable,
        retry_if_possibly_persisted,
        retry_if_refresh_metadata,
        retry_unless_possibly_persisted,
    )
    from kresilient.telemetry import Telemetry, add_trace_context

# Each public name and the module defining it, imported on first access (PEP 562): importing
# kresilient, or any submodule such as kresilient.cli whose `--help` must be quick, no longer
# loads confluent-kafka, structlog, tenacity, the producer and the consumer (issue 36).
_EXPORTS: dict[str, str] = {
    "Action": "kresilient.errors",
    "BatchItemError": "kresilient.errors",
    "ChurnPolicy": "kresilient.leadership",
    "CircuitBreakerOpenError": "kresilient.errors",
    "CircuitBreakerPolicy": "kresilient.deadletter",
    "Classification": "kresilient.errors",
    "CommitError": "kresilient.errors",
    "ConfigError": "kresilient.errors",
    "ConsumeError": "kresilient.errors",
    "ConsumerHealth": "kresilient.consumer",
    "CrashLoopError": "kresilient.errors",
    "DeadLetterError": "kresilient.errors",
    "DeadLetterInfo": "kresilient.deadletter",
    "DeadLetterPolicy": "kresilient.deadletter",
    "DeadLetterRecord": "kresilient.deadletter",
    "DeadLetterWriter": "kresilient.deadletter",
    "Deduplicator": "kresilient.dedupe",
    "DeliveryError": "kresilient.errors",
    "DeliveryFailure": "kresilient.errors",
    "DeliveryHandle": "kresilient.producer",
    "DeliveryResult": "kresilient.producer",
    "ErrorCategory": "kresilient.errors",
    "FatalProducerError": "kresilient.errors",
    "FlushResult": "kresilient.producer",
    "InspectResult": "kresilient.deadletter_cli",
    "InspectedRecord": "kresilient.deadletter_cli",
    "KResilientError": "kresilient.errors",
    "KafkaClientError": "kresilient.errors",
    "LeadershipChange": "kresilient.leadership",
    "LeadershipMonitor": "kresilient.leadership",
    "LeadershipState": "kresilient.leadership",
    "MessageTooLargeError": "kresilient.errors",
    "OUTAGE_RETRY": "kresilient.consumer",
    "Output": "kresilient.consumer",
    "ProduceError": "kresilient.errors",
    "ProducerFencedError": "kresilient.producer",
    "ProducerHealth": "kresilient.producer",
    "ReplayMismatchError": "kresilient.errors",
    "ReplayResult": "kresilient.deadletter_cli",
    "ResilientConsumer": "kresilient.consumer",
    "ResilientProducer": "kresilient.producer",
    "RetryPolicy": "kresilient.consumer",
    "RetryTopicPolicy": "kresilient.consumer",
    "SchemaError": "kresilient.errors",
    "Spool": "kresilient.producer",
    "SpoolCorruptError": "kresilient.errors",
    "SpoolError": "kresilient.errors",
    "Telemetry": "kresilient.telemetry",
    "TransactionAbortedError": "kresilient.producer",
    "TransactionOutcomeUnknownError": "kresilient.producer",
    "TransactionPolicy": "kresilient.consumer",
    "TransactionalProducer": "kresilient.producer",
    "UnsafeConfigError": "kresilient.errors",
    "add_trace_context": "kresilient.telemetry",
    "classify": "kresilient.errors",
    "consumer_config": "kresilient.config",
    "dead_letter_headers": "kresilient.deadletter",
    "dead_letter_producer_config": "kresilient.deadletter",
    "failure_from_report": "kresilient.errors",
    "inspect_dead_letters": "kresilient.deadletter_cli",
    "is_unproducible": "kresilient.errors",
    "parse_dead_letter_headers": "kresilient.deadletter",
    "producer_config": "kresilient.config",
    "redact": "kresilient.config",
    "replay_dead_letters": "kresilient.deadletter_cli",
    "retry_if_action": "kresilient.retry",
    "retry_if_category": "kresilient.retry",
    "retry_if_classification": "kresilient.retry",
    "retry_if_kafka_code": "kresilient.retry",
    "retry_if_kafka_retriable": "kresilient.retry",
    "retry_if_possibly_persisted": "kresilient.retry",
    "retry_if_refresh_metadata": "kresilient.retry",
    "retry_unless_possibly_persisted": "kresilient.retry",
    "translate": "kresilient.errors",
}


def __getattr__(name: str) -> typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [  # noqa: RUF022  (plain sorted order, asserted by tests/test_package.py)
    "Action",
    "BatchItemError",
    "ChurnPolicy",
    "CircuitBreakerOpenError",
    "CircuitBreakerPolicy",
    "Classification",
    "CommitError",
    "ConfigError",
    "ConsumeError",
    "ConsumerHealth",
    "CrashLoopError",
    "DeadLetterError",
    "DeadLetterInfo",
    "DeadLetterPolicy",
    "DeadLetterRecord",
    "DeadLetterWriter",
    "Deduplicator",
    "DeliveryError",
    "DeliveryFailure",
    "DeliveryHandle",
    "DeliveryResult",
    "ErrorCategory",
    "FatalProducerError",
    "FlushResult",
    "InspectResult",
    "InspectedRecord",
    "KResilientError",
    "KafkaClientError",
    "LeadershipChange",
    "LeadershipMonitor",
    "LeadershipState",
    "MessageTooLargeError",
    "OUTAGE_RETRY",
    "Output",
    "ProduceError",
    "ProducerFencedError",
    "ProducerHealth",
    "ReplayMismatchError",
    "ReplayResult",
    "ResilientConsumer",
    "ResilientProducer",
    "RetryPolicy",
    "RetryTopicPolicy",
    "SchemaError",
    "Spool",
    "SpoolCorruptError",
    "SpoolError",
    "Telemetry",
    "TransactionAbortedError",
    "TransactionOutcomeUnknownError",
    "TransactionPolicy",
    "TransactionalProducer",
    "UnsafeConfigError",
    "__version__",
    "add_trace_context",
    "classify",
    "consumer_config",
    "dead_letter_headers",
    "dead_letter_producer_config",
    "failure_from_report",
    "inspect_dead_letters",
    "is_unproducible",
    "parse_dead_letter_headers",
    "producer_config",
    "redact",
    "replay_dead_letters",
    "retry_if_action",
    "retry_if_category",
    "retry_if_classification",
    "retry_if_kafka_code",
    "retry_if_kafka_retriable",
    "retry_if_possibly_persisted",
    "retry_if_refresh_metadata",
    "retry_unless_possibly_persisted",
    "translate",
]
