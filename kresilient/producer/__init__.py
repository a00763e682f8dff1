"""ResilientProducer: a confluent-kafka producer that cannot lose a message silently.

The full description is the docstring of :mod:`kresilient.producer._producer`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.producer._handle import delivered_result
from kresilient.producer._producer import (
    DEFAULT_STALL_AFTER,
    DEFAULT_UNREACHABLE_TIMEOUT,
    RELEASE_TIMEOUT,
    STALL_METRIC,
    DeliveryHandle,
    DeliveryResult,
    ProducerHealth,
    ResilientProducer,
)
from kresilient.producer._spool import (
    MESSAGE_ID_HEADER,
    POSSIBLE_DUPLICATE_HEADER,
    FlushResult,
    Spool,
    SpoolCorruptError,
    SpoolError,
)
from kresilient.producer._transactional import (
    ProducerFencedError,
    TransactionAbortedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kresilient.reachability import (
    AuthFailure,
    LogBridge,
    Reachability,
    client_certificate,
    connect_failure,
)

# These live in kresilient.reachability (below every client, so the dead-letter writer, admin
# and Spark sink use them without importing the producer) and stay re-exported here. LogBridge
# routes librdkafka log lines into structlog (redacted, connection failures summarised);
# Reachability gives "cluster unreachable" warnings naming hosts and reasons and recognises a
# refused login (AuthFailure); client_certificate() is what Reachability(certificate=...)
# checks for expiry.
__all__ = [
    "DEFAULT_STALL_AFTER",
    "DEFAULT_UNREACHABLE_TIMEOUT",
    "MESSAGE_ID_HEADER",
    "POSSIBLE_DUPLICATE_HEADER",
    "RELEASE_TIMEOUT",
    "STALL_METRIC",
    "AuthFailure",
    "DeliveryHandle",
    "DeliveryResult",
    "FlushResult",
    "LogBridge",
    "ProducerFencedError",
    "ProducerHealth",
    "Reachability",
    "ResilientProducer",
    "Spool",
    "SpoolCorruptError",
    "SpoolError",
    "TransactionAbortedError",
    "TransactionOutcomeUnknownError",
    "TransactionalProducer",
    "client_certificate",
    "connect_failure",
    "delivered_result",
]
