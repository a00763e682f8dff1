"""ResilientConsumer: commit only after processing, retry without rebalance storms, keep poison.

What it adds to ``confluent_kafka.Consumer`` (see docs/consumer.md):

* **commit semantics**: an offset is stored (``enable.auto.offset.store=false``) only after
  its handler returned, or after its dead-letter write was ACKNOWLEDGED; stored offsets are
  committed in the background (or every ``auto.commit.interval.ms`` when
  ``enable.auto.commit=false``) and synchronously on revoke and on close. Commit failures are
  classified and logged. Defaults: cooperative-sticky, ``auto.offset.reset=earliest``;
  settings that would break the rule are refused (:class:`~kresilient.UnsafeConfigError`);
* **retries** from a :class:`RetryPolicy` of tenacity ``stop``/``wait``/``retry`` objects;
  between attempts the partition is paused (and seeked back) while the consumer keeps
  polling: no ``max.poll.interval.ms`` rebalance, other partitions keep flowing, order kept;
* **dead letters**: after the retries (at once for deserialization/validation errors) the
  record goes to ``<topic>.dlq`` with its original key/value bytes and headers plus the
  ``kresilient.*`` headers (:mod:`kresilient.deadletter`), optionally the Spring Kafka and
  Kafka Streams header sets; written by the one
  :class:`~kresilient.deadletter.DeadLetterWriter`;
* **retry topics** (:class:`RetryTopicPolicy`): failures moved to delayed
  ``<topic>.retry.<delay>`` topics instead of holding the partition;
* **crash-loop protection**: a record during which the process died ``max_process_deaths``
  times (counted in the committed offset's metadata) is dead-lettered as ``crash_loop``;
* **Schema Registry outages** (5xx, 429, timeouts) hold the partition instead of
  dead-lettering good records;
* **probes**: ``/live`` and ``/ready`` over HTTP (``health_port``), lag gauges;
* a **circuit breaker** stops the consumer (:class:`~kresilient.CircuitBreakerOpenError`)
  when dead-lettering exceeds its limit;
* optional **deserializers** whose failures are dead-lettered with the raw bytes;
* a graceful **shutdown** on :meth:`ResilientConsumer.stop`, SIGTERM or SIGINT: the message in
  hand is finished, what was processed is committed, the group is left.

Example::

    def handle(msg):
        order = json.loads(msg.value())      # ValueError -> dead-lettered at once
        save(order)                          # other errors: retried, then dead-lettered

    ResilientConsumer({"bootstrap.servers": BOOTSTRAP, "group.id": "orders-service"},
                      ["orders"], handle).run()  # until SIGTERM/SIGINT or stop()
"""

from __future__ import annotations

from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._consumer import *  # noqa: F403
from kresilient.consumer._consumer import __all__ as _consumer_all
from kresilient.consumer._failures import poison
from kresilient.consumer._registry import registry_classification

# CircuitBreaker (the running state of a CircuitBreakerPolicy) and poison (the classification
# of a failure the retry policy does not retry) are shared with kresilient.aio.
__all__ = [*_consumer_all, "CircuitBreaker", "poison", "registry_classification"]
