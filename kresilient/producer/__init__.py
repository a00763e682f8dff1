"""ResilientProducer: a confluent-kafka producer that cannot lose a message silently.

The full description is the docstring of :mod:`kresilient.producer._producer`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.producer._producer import (
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
from kresilient.producer._support import (
    AuthFailure,
    LogBridge,
    Reachability,
    client_certificate,
    connect_failure,
)

# LogBridge (librdkafka log lines into structlog, redacted, connection failures summarised),
# Reachability ("cluster unreachable" warnings naming hosts and reasons) and connect_failure
# are public for the other clients (consumer, admin) that route librdkafka output the same way;
# AuthFailure is what Reachability.refused holds (a refused SASL login or TLS handshake) and
# client_certificate() what Reachability(certificate=...) checks for expiry.
__all__ = [
    "MESSAGE_ID_HEADER",
    "POSSIBLE_DUPLICATE_HEADER",
    "AuthFailure",
    "DeliveryHandle",
    "DeliveryResult",
    "FlushResult",
    "LogBridge",
    "ProducerHealth",
    "Reachability",
    "ResilientProducer",
    "Spool",
    "SpoolCorruptError",
    "SpoolError",
    "client_certificate",
    "connect_failure",
]
