"""kresilient: Kafka clients that are hard to misuse and easy to trust.

The public API is re-exported here; submodules hold the details:

- :mod:`kresilient.errors`: error classification and the exception tree.
- :mod:`kresilient.config`: safe producer/consumer defaults, validation, secret redaction.
- :mod:`kresilient.producer`: ResilientProducer (no silent loss, classified flush failures).
- :mod:`kresilient.consumer`: ResilientConsumer (commit after processing, retries, DLQ).
- :mod:`kresilient.deadletter`: the dead-letter record format and the circuit breaker.
- :mod:`kresilient.retry`: tenacity predicates driven by the classification.
- :mod:`kresilient.leadership`: leadership burst vs sustained churn, metadata age.
- :mod:`kresilient.testing`: a real 3-node KRaft Kafka cluster for tests and demos.
"""

from __future__ import annotations

from kresilient.config import consumer_config, producer_config, redact
from kresilient.consumer import BatchItemError, ResilientConsumer, RetryPolicy
from kresilient.deadletter import (
    CircuitBreakerPolicy,
    DeadLetterInfo,
    DeadLetterPolicy,
    dead_letter_headers,
    parse_dead_letter_headers,
)
from kresilient.errors import (
    Action,
    CircuitBreakerOpenError,
    Classification,
    CommitError,
    ConfigError,
    ConsumeError,
    DeadLetterError,
    DeliveryError,
    DeliveryFailure,
    ErrorCategory,
    FatalProducerError,
    KafkaClientError,
    KResilientError,
    MessageTooLargeError,
    ProduceError,
    UnsafeConfigError,
    classify,
    translate,
)
from kresilient.leadership import ChurnPolicy, LeadershipChange, LeadershipMonitor, LeadershipState
from kresilient.producer import DeliveryHandle, DeliveryResult, ProducerHealth, ResilientProducer
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

__version__ = "0.1.0"

__all__ = [
    "Action",
    "BatchItemError",
    "ChurnPolicy",
    "CircuitBreakerOpenError",
    "CircuitBreakerPolicy",
    "Classification",
    "CommitError",
    "ConfigError",
    "ConsumeError",
    "DeadLetterError",
    "DeadLetterInfo",
    "DeadLetterPolicy",
    "DeliveryError",
    "DeliveryFailure",
    "DeliveryHandle",
    "DeliveryResult",
    "ErrorCategory",
    "FatalProducerError",
    "KResilientError",
    "KafkaClientError",
    "LeadershipChange",
    "LeadershipMonitor",
    "LeadershipState",
    "MessageTooLargeError",
    "ProduceError",
    "ProducerHealth",
    "ResilientConsumer",
    "ResilientProducer",
    "RetryPolicy",
    "Telemetry",
    "UnsafeConfigError",
    "__version__",
    "add_trace_context",
    "classify",
    "consumer_config",
    "dead_letter_headers",
    "parse_dead_letter_headers",
    "producer_config",
    "redact",
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
