"""ResilientProducer: a confluent-kafka producer that cannot lose a message silently.

What it adds to ``confluent_kafka.Producer`` (see docs/producer.md):

* safe defaults on a copy of your config (acks=all, idempotence, unlimited retries within a
  bounded ``message.timeout.ms``, <= 5 in flight, the Java-compatible ``murmur2_random``
  partitioner, statistics for the leadership monitor); weakening settings are refused unless
  allowed per key (:mod:`kresilient.config`);
* :meth:`ResilientProducer.produce` returns a :class:`DeliveryHandle`;
  :meth:`ResilientProducer.flush` raises :class:`~kresilient.DeliveryError` listing every
  message that failed since the last flush, classified, and never reports success while
  messages remain queued;
* a full local queue is waited out (polling) for up to ``backpressure_timeout`` seconds, then
  a BACKPRESSURE-classified :class:`~kresilient.ProduceError`; nothing is dropped;
* a value over ``message.max.bytes`` raises :class:`~kresilient.MessageTooLargeError` at once,
  or goes to ``dead_letter_topic`` with its raw bytes and the shared dead-letter headers;
* fatal errors (fenced, idempotence state lost) raise :class:`~kresilient.FatalProducerError`;
  with ``recreate_on_fatal=True`` the producer is rebuilt and every message that was queued or
  in flight is reported failed with ``possibly_persisted=True``;
* a structlog logger bound to the client, OpenTelemetry spans and trace-context headers when an
  SDK is configured, and :meth:`ResilientProducer.health`.

Example::

    with ResilientProducer({"bootstrap.servers": "127.0.0.1:9092"}) as producer:
        for order in orders:
            producer.produce("orders", order.to_bytes(), key=order.id.encode())
        producer.flush()        # raises DeliveryError if any message failed
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
from kresilient.producer._support import LogBridge, Reachability, connect_failure

# LogBridge (librdkafka log lines into structlog, redacted, connection failures summarised),
# Reachability ("cluster unreachable" warnings naming hosts and reasons) and connect_failure
# are public for the other clients (consumer, admin) that route librdkafka output the same way.
__all__ = [
    "MESSAGE_ID_HEADER",
    "POSSIBLE_DUPLICATE_HEADER",
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
    "connect_failure",
]
