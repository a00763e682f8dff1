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
* **bad record or bad dependency**: distinct records failing in a row (or a Schema Registry
  5xx/429/timeout) are a dependency outage: the partitions are held and the same record
  retried, nothing is dead-lettered, until a record succeeds (:mod:`._outage`);
* **probes**: ``/live`` and ``/ready`` over HTTP (``health_port``), lag gauges;
* **deduplication** (``dedupe=``, a :class:`~kresilient.dedupe.Deduplicator`): a record
  marked ``kresilient.possible.duplicate: true`` whose ``kresilient.message.id`` was processed
  (a spooled producer's or the outbox relay's re-sent copy) is skipped, its offset stored;
* a **circuit breaker** stops the consumer (:class:`~kresilient.CircuitBreakerOpenError`)
  when dead-lettering exceeds its limit;
* optional **deserializers** whose failures are dead-lettered with the raw bytes;
* **outputs**: a handler may return :class:`Output` records; with
  ``transactions=TransactionPolicy(...)`` they, the dead letters, the retry-topic records
  and the consumed offsets commit in one Kafka transaction (exactly once, :mod:`._output`);
  without, they are produced and confirmed before the batch's offsets are stored
  (at-least-once);
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

import time
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from types import TracebackType
from typing import Any, Final, Literal, cast

import structlog
import tenacity
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from kresilient._ratelimit import RateLimiter
from kresilient._watchdog import bounded_call
from kresilient.consumer._batch import BatchProcessor
from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._crashloop import CLEAN, CrashGuard
from kresilient.consumer._events import ClientEvents
from kresilient.consumer._failures import DeadLetterSink, FailureHandler
from kresilient.consumer._holds import TP, Hold, Holds, LoopState, Verdict
from kresilient.consumer._inflight import ORDERINGS, Ordering
from kresilient.consumer._offsets import OffsetKeeper
from kresilient.consumer._output import (
    AtLeastOnceOutputs,
    HandlerOutputError,
    Output,
    TransactionalBatches,
    TransactionPolicy,
    TxnCrashOffsets,
    emitting,
    outputs_of,
    refusing_batch_outputs,
)
from kresilient.consumer._parallel import ParallelRunner
from kresilient.consumer._probes import ON_STALL, Probes
from kresilient.consumer._retrytopics import RetryTopicPolicy, RetryView
from kresilient.consumer._support import (
    NOT_RETRIED,
    Deserializer,
    Deserializing,
    RetryPolicy,
    SignalHandlers,
    Watchdog,
    auto_commit,
    build_consumer_config,
    literal_topics,
    max_poll_interval,
    retire_client,
)
from kresilient.deadletter import (
    CircuitBreakerPolicy,
    DeadLetterPolicy,
    DeadLetterWriter,
)
from kresilient.deadletter import dead_letter_producer_config as dead_letter_producer_config_of
from kresilient.dedupe import Deduplicator, record_id
from kresilient.errors import BatchItemError, ConfigError, classify, translate
from kresilient.leadership import LeadershipMonitor
from kresilient.producer import (
    LogBridge,
    Reachability,
    ResilientProducer,
    TransactionalProducer,
    client_certificate,
    connect_failure,
)
from kresilient.redaction import Redactor, redact_config
from kresilient.telemetry import Telemetry

__all__ = [
    "NOT_RETRIED",
    "OUTAGE_LIMIT_S",
    "OUTAGE_RETRY",
    "BatchItemError",
    "ConsumerHealth",
    "HandlerOutputError",
    "Output",
    "ResilientConsumer",
    "RetryPolicy",
    "RetryTopicPolicy",
    "TransactionPolicy",
]

Handler = Callable[[Message], object]
BatchHandler = Callable[[list[Message]], object]
RebalanceListener = Callable[[list[TopicPartition]], object]
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

_DEFAULT_RETRY: Final = RetryPolicy()
#: A dependency outage (distinct records failing in a row, or a Schema Registry outage): the
#: record is held and retried with backoff 0.5 s doubling to 10 s, for at most 10 minutes
#: per record (the outage limit; then it is dead-lettered, and the breaker counts it).
OUTAGE_LIMIT_S: Final = 600.0
OUTAGE_RETRY: Final = RetryPolicy(
    stop=tenacity.stop_after_delay(OUTAGE_LIMIT_S),
    wait=tenacity.wait_exponential(multiplier=0.5, max=10),
    retry=tenacity.retry_always,
)
_DEFAULT_DEAD_LETTER: Final = DeadLetterPolicy()
_DEFAULT_BREAKER: Final = CircuitBreakerPolicy()
#: "Cluster unreachable" warnings are repeated at most once per this many seconds.
_UNREACHABLE_LOG_INTERVAL: Final = 60.0
#: The metadata request that checks the dead-letter topics (and so the connection) at start.
_METADATA_TIMEOUT: Final = 10.0


@dataclass(frozen=True, kw_only=True)
class ConsumerHealth:
    """A point-in-time view of a :class:`ResilientConsumer` for health checks.

    ``moved_to_retry``: records written to a retry topic; ``crash_loops``: records
    dead-lettered for killing the process; ``duplicates_skipped``: deliveries of possible
    duplicates ``dedupe`` skipped (their offsets stored; not in ``processed``);
    ``blocked_keys``: keys whose later records wait behind a record in a retry topic
    (``RetryTopicPolicy(ordered=True)``).
    ``held_partitions``: the partitions paused for a retry (topic, partition, offset,
    attempts, resumed); ``rebalances``: assigned/revoked/lost
    callbacks so far; ``circuit_breaker``: its state (``None`` without a breaker);
    ``leadership``: the leadership monitor's snapshot; ``outage``: the dependency outage in
    progress (records held, nothing dead-lettered; docs/consumer.md, "Bad record or bad
    dependency"), or ``None``.
    ``as_dict()`` gives the plain dict; ``health()["processed"]`` (the dict access of 0.1)
    still works until the next minor version, with a :class:`DeprecationWarning`.
    """

    group_id: str
    client_id: str
    running: bool
    stopping: bool
    processed: int
    retries: int
    dead_lettered: int
    dead_letters_pending: int
    held_partitions: list[dict[str, Any]]
    rebalances: dict[str, int]
    commit_failures: int
    last_commit_error: str | None
    circuit_breaker: dict[str, Any] | None
    leadership: dict[str, Any] = field(repr=False)
    moved_to_retry: int = 0  #: records written to a retry topic (retry_topics)
    crash_loops: int = 0  #: records dead-lettered for killing the process (crash_loop)
    duplicates_skipped: int = 0  #: possible duplicates skipped by ``dedupe``
    blocked_keys: int = 0  #: keys held behind a record in a retry topic (``ordered=True``)
    #: the dependency outage in progress (``since_s``, ``error_type``, ``error`` redacted,
    #: ``failures``, ``outages`` so far), ``None`` when there is none
    outage: dict[str, Any] | None = None
    #: the stall in progress (docs/stalls.md): what stopped (``None``: no stall), since when
    #: (wall clock, ``time.time()``), and the stalls reported so far
    stalled: str | None = None
    stalled_since: float | None = None
    stalls: int = 0
    #: librdkafka consumers recreated by ``on_stall="heal"`` so far
    recreations: int = 0
    #: with ``transactions=``: ``transactional_id``, ``committed``, ``aborted``, ``fenced``,
    #: ``closed`` (by a fatal error: the consumer stops), ``open``, ``recreations`` (of the
    #: transactional producer); ``None`` without
    transactions: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        """Running, not stopping, no stall, no dependency outage, not fenced and its
        transactional producer not closed by a fatal error (``/ready``
        says the same of a member that has joined its group)."""
        return (
            self.running
            and not self.stopping
            and self.stalled is None
            and self.outage is None
            and not (
                self.transactions is not None
                and (self.transactions["fenced"] or self.transactions.get("closed", False))
            )
        )

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (what ``health()`` returned in 0.1)."""
        return asdict(self)

    def _deprecated(self) -> None:
        warnings.warn(
            "ResilientConsumer.health() returns a ConsumerHealth: use attributes "
            "(health().processed) or health().as_dict(); dict access goes in the next minor",
            DeprecationWarning,
            stacklevel=3,
        )

    def __getitem__(self, key: str) -> Any:
        self._deprecated()
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def keys(self) -> Iterator[str]:
        """Deprecated dict access (see the class docstring)."""
        self._deprecated()
        return iter(self.as_dict())

    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated dict access (see the class docstring)."""
        self._deprecated()
        return getattr(self, key, default)

    def __contains__(self, key: object) -> bool:
        self._deprecated()
        return isinstance(key, str) and key in self.__dataclass_fields__


def _check_ordering(
    ordering: str,
    max_in_flight: int,
    max_bytes: int,
    *,
    batch: bool,
    ordered_retry_topics: bool,
    span_per_call: bool,
) -> None:
    """Refuse what in-partition concurrency does not combine with yet (issue 40).

    Crash-loop protection combines: a partition probed after an unclean end runs its probe
    one record at a time (``ParallelRunner``), the others concurrently. Retry topics combine
    (``RetryTopicPolicy(ordered=False)``: a failure is moved to its tier and finished when the
    write is acknowledged; a retry-topic record waits in its window until it is due);
    ``ordered=True`` does not yet: its blocked keys would have to route a key's later records
    behind the moved one across many records in flight."""
    if ordering not in ORDERINGS:
        raise ConfigError(f"ordering must be one of {ORDERINGS}, got {ordering!r}", key="ordering")
    if max_in_flight < 1 or max_bytes < 1:
        raise ConfigError("max_in_flight and max_in_flight_bytes must be >= 1", key="ordering")
    if ordering == "partition":
        return
    refused = [
        name
        for name, on in (
            ("batch_handler", batch),
            ("retry_topics=RetryTopicPolicy(ordered=True)", ordered_retry_topics),
            ('trace_spans="call"', span_per_call),
        )
        if on
    ]
    if refused:
        raise ConfigError(
            f"ordering={ordering!r} does not combine with {', '.join(refused)} yet: "
            "each would lose its per-record guarantee with many records in flight (issue 40)",
            key="ordering",
        )


def _check_transactions(
    policy: TransactionPolicy, *, batch: bool, ordering: str, own_dlq_producer: str | None = None
) -> None:
    """Refuse what consume-transform-produce in transactions does not combine with."""
    if not isinstance(policy, TransactionPolicy):
        raise ConfigError(
            f"transactions must be a kresilient.TransactionPolicy, got {type(policy).__name__}",
            key="transactions",
        )
    refused = [
        name
        for name, on in (
            ("batch_handler", batch),
            (f"ordering={ordering!r}", ordering != "partition"),
        )
        if on
    ]
    if refused:
        raise ConfigError(
            f"transactions= does not combine with {', '.join(refused)}: a transaction holds "
            "the records of a batch in offset order, per-record outputs and their dead letters "
            "(docs/transactions.md)",
            key="transactions",
        )
    if own_dlq_producer is not None:
        # it would be ignored: dead letters are written by the transactional producer,
        # inside the transaction (a producer of its own could not be in it)
        raise ConfigError(
            f"transactions= does not combine with {own_dlq_producer}: dead letters are "
            "written inside the transaction by its transactional producer; set that "
            "producer's settings with TransactionPolicy(producer_config=...)",
            key=own_dlq_producer,
        )


def drop_unassigned(msgs: list[Message], assigned: set[TP]) -> tuple[list[Message], list[Message]]:
    """Split fetched messages into (those of ``assigned`` partitions, the others).

    Error events without a partition (``partition() is None`` or negative) are kept.
    """
    kept: list[Message] = []
    dropped: list[Message] = []
    for m in msgs:
        part = m.partition()
        if part is None or part < 0 or (m.topic(), part) in assigned:
            kept.append(m)
        else:
            dropped.append(m)
    return kept, dropped


class _Handled(Exception):
    """The traced path already handled a handler failure inside its span.

    ``stop`` is the exception the failure handling raised to stop the consumer (circuit
    breaker open, dead-letter write refused, no dead-letter topic), re-raised by the loop.
    """

    def __init__(self, stop: BaseException | None = None) -> None:
        super().__init__()
        self.stop = stop


class ResilientConsumer:
    """A consumer loop that commits only what was processed or durably dead-lettered.

    Args:
        config: confluent-kafka / librdkafka config (never mutated); ``group.id`` required.
            ``error_cb``, ``stats_cb``, ``on_commit`` and ``logger`` in it are called after
            kresilient's own handling (``logger`` gets redacted lines).
        topics: topic names (or ``^regex`` patterns) to subscribe to.
        handler: called with each ``confluent_kafka.Message``; returning means success.
        batch_handler: instead of ``handler``: called with a list of messages of ONE
            partition, in offset order; raise :class:`BatchItemError` to name the failed item.
        retry: the :class:`RetryPolicy`.
        retry_topics: a :class:`RetryTopicPolicy`: failures it retries are moved to delayed
            retry topics (``<topic>.retry.<delay>``, subscribed too) instead of holding the
            partition; after the last tier, the dead-letter topic. Per-message handlers and
            literal topic names only. Per-key order is given up for the records moved, unless
            ``RetryTopicPolicy(ordered=True)``: later records of their keys follow them.
        outage_retry: the policy while a dependency is down: distinct records failing in a
            row with a retriable error and no success between, or a Schema Registry outage
            (5xx, 429, timeout, connection failure, 401/403 anywhere in the exception chain).
            The failed records' partitions are held (paused, polling on), the same record
            retried under it, nothing dead-lettered; ``health().outage``, ``/ready`` and a
            WARNING when it starts and ends report it. Its ``stop`` is the outage limit per
            record (then dead-lettered). Default :data:`OUTAGE_RETRY` (0.5 s doubling to
            10 s, 10 minutes). A record whose ``retry`` policy is exhausted while no other
            record succeeded since its first failure is not dead-lettered before the next
            record was tried (docs/consumer.md). ``None``: no outage detection, every
            failure is the record's (``retry``, then the dead-letter topic).
        dead_letter: the :class:`~kresilient.DeadLetterPolicy`; ``None``: no dead-letter
            topic, a message that exhausts its retries stops the consumer (its offset is not
            committed) and ``run()`` raises its exception.
        circuit_breaker: the :class:`~kresilient.CircuitBreakerPolicy`; ``None``: no limit.
        key_deserializer, value_deserializer: ``(bytes | None, SerializationContext) -> Any``
            (confluent-kafka ``Deserializer`` objects fit); the handler then sees the
            deserialized key/value; a failure is dead-lettered with the raw bytes.
        allow_unsafe: config keys whose weakening values are accepted.
        dead_letter_producer: a :class:`~kresilient.ResilientProducer` or a
            :class:`~kresilient.deadletter.DeadLetterWriter` to write dead letters with (not
            closed by this consumer). Records are written byte for byte: a producer is asked
            not to propagate its trace context into them. Default: a
            :class:`~kresilient.deadletter.DeadLetterWriter` made from
            ``config`` by :func:`kresilient.deadletter.dead_letter_producer_config`, with
            ``dead_letter_producer_config`` as overrides.
        max_batch_size: messages fetched per ``consume()`` call (handled one by one).
        poll_timeout: seconds one ``consume()`` call waits when idle (bounds stop latency).
        install_signal_handlers: route SIGTERM/SIGINT to :meth:`stop` during :meth:`run`
            (main thread only; see :meth:`run` for a second and third signal).
        on_assign, on_revoke, on_lost: called with the partitions after kresilient's own
            handling (on revoke: after the synchronous commit).
        logger: a structlog logger (default ``structlog.get_logger("kresilient.consumer")``).
        tracer_provider, meter_provider, propagator, link_mode: OpenTelemetry (see
            :class:`~kresilient.telemetry.Telemetry`); default: the global providers.
        shutdown_timeout: seconds to wait for outstanding dead-letter writes on revoke/close,
            and the bound of librdkafka's final commit and close together (a frozen group
            coordinator can hold ``Consumer.close()`` forever): past it they are left to a
            daemon thread, one ``close_timed_out`` WARNING names what was not done, and the
            shutdown goes on (docs/stalls.md). The records whose offsets were not committed
            are read again.
        record_message_key: put the message key on process spans
            (``messaging.kafka.message.key``); off by default, keys often carry personal data.
        metric_partition_attribute: put ``messaging.destination.partition.id`` on metrics too
            (spans always carry it); off by default: one series per partition.
        max_process_deaths: crash-loop protection: a record during whose handling the process
            died this many times is dead-lettered (``kresilient.error.category=crash_loop``)
            at the next start, without calling the handler. ``None``: off. Per-message
            handlers only (a batch handler is not probed).
        health_port: serve ``GET /live`` and ``GET /ready`` on this port while :meth:`run`
            runs (0: any free port, see :attr:`health_port`); ``None``: no server.
        health_host: the address the probe server binds (127.0.0.1 by default; a Kubernetes
            ``httpGet`` probe reaches the pod IP, so pass ``"0.0.0.0"`` there).
        stall_after_s: ``/ready`` turns 503 when a handler runs, a retry hold is overdue, or
            a lagging partition makes no progress (or its fetch is not answered) for longer
            than this; one ``consumer_stalled`` WARNING says so (docs/stalls.md).
        on_stall: ``"report"`` (default): say so, change nothing. ``"heal"``: on a
            ``progress`` stall or a member lost and not rejoined (``assignment``: a hung
            coordinator connection), with no handler running, nothing held by a retry or
            an outage, no dead letter pending, or on a rebalance loop, also recreate the librdkafka
            consumer at the next step of the loop: the stored offsets committed through the
            old one if it answers within ``HEAL_TIMEOUT`` (5 s), the old one closed in a
            daemon thread, a new member subscribed to the same topics in the same group,
            resuming from the committed offsets (what was not committed is handled again).
            One ``consumer_recreated`` WARNING per heal, ``health().recreations``.
        crash_probe_records: after an unclean end (the previous owner died or was cut off),
            this many records per partition are handled with their in-flight marker committed
            synchronously before the handler call (docs/consumer.md, crash loops).
        dedupe: a :class:`~kresilient.dedupe.Deduplicator`: a record marked
            ``kresilient.possible.duplicate: true`` whose ``kresilient.message.id`` is in its
            window of ids processed (handler returned) is skipped without calling the handler;
            its offset is stored like a processed one, it is counted in
            ``health().duplicates_skipped`` and the ``kresilient.consumer.duplicates_skipped``
            counter, and logged at DEBUG with its id. Unmarked records are never skipped. The
            window is bounded (``Deduplicator(window=...)``, least recent forgotten first) and
            in memory: a copy arriving after a restart or at another group member is handled
            again. Per-message and batch handlers (docs/durability.md).
        trace_spans: how a per-message handler is traced. ``"message"`` (default): one
            ``process {topic}`` span around each handler call, a child of the record's
            producer span. ``"call"``: one span around the handling of each ``consume()``
            result (up to ``max_batch_size`` records), linked to the records' producer spans
            (up to the SDK's link limit), as the official confluent-kafka instrumentation
            traces; handler failures are exception events on it, and dead letters are its
            children. Cheaper per record at high sampling ratios (docs/telemetry.md).
        ordering: how many records of ONE partition are handled at once (docs/parallel.md).
            ``"partition"`` (default): one at a time, in offset order. ``"key"``: records with
            the same key one at a time in offset order (keyless records as one key),
            different keys at once on a thread pool; ``"none"``: any records at once. Commits
            never pass an unfinished record; the finished records above the committed offset
            are listed in its metadata and skipped by the next owner. Not yet combined with
            ``batch_handler``, ``RetryTopicPolicy(ordered=True)`` or ``trace_spans="call"``:
            issue 40 (unordered ``retry_topics`` combine: a record's move is acknowledged
            before it counts as finished, a retry-topic record waits in its window until it
            is due, without holding other keys or polling). Outage
            detection works as in ``"partition"`` mode (the held records, one probe at a
            time); crash-loop protection too (a partition probed after an unclean end runs
            its ``crash_probe_records`` one at a time, then concurrently again).
        max_in_flight, max_in_flight_bytes: the window per partition for ``"key"``/``"none"``
            (records and bytes of key + value admitted and not finished); a full window
            pauses the partition while polling goes on. ``max_in_flight`` is the size of the
            thread pool too.
        in_flight_metadata: list the finished records above the committed offset in its
            metadata (``False``: a restart redoes everything from the committed offset).
        transactions: a :class:`TransactionPolicy`: consume-transform-produce exactly once.
            The handler returns its output records (:class:`Output`); they, the dead letters
            and the consumed offsets commit in one Kafka transaction per group of batches
            (``max_records`` / ``max_interval_s``), or none of them does; the consumer's own
            offset commits are off. A failing record aborts the transaction and the batch is
            redone after the retry policy's wait; once the policy gives up, the record is
            dead-lettered inside the transaction. With ``retry_topics``, a failure they take
            is written to its retry topic inside the transaction, which goes on; the retry
            topics' records are handled in transactions too. Fenced (another instance took
            the ``transactional_id``): ``run()`` raises
            :class:`~kresilient.ProducerFencedError`. Not combined with ``batch_handler`` or
            ``ordering="key"``/``"none"`` (:class:`~kresilient.ConfigError`). Crash-loop
            protection counts deaths in markers committed outside the transactions, at the
            committed position (docs/transactions.md). Without ``transactions=``, the
            :class:`Output` records a handler returns are produced at-least-once: delivered
            before the batch's offsets are stored.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        retry: RetryPolicy = _DEFAULT_RETRY,
        outage_retry: RetryPolicy | None = OUTAGE_RETRY,
        retry_topics: RetryTopicPolicy | None = None,
        dead_letter: DeadLetterPolicy | None = _DEFAULT_DEAD_LETTER,
        circuit_breaker: CircuitBreakerPolicy | None = _DEFAULT_BREAKER,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        allow_unsafe: Iterable[str] = (),
        dead_letter_producer: ResilientProducer | DeadLetterWriter | None = None,
        dead_letter_producer_config: Mapping[str, Any] | None = None,
        max_batch_size: int = 500,
        poll_timeout: float = 1.0,
        install_signal_handlers: bool = True,
        on_assign: RebalanceListener | None = None,
        on_revoke: RebalanceListener | None = None,
        on_lost: RebalanceListener | None = None,
        logger: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        propagator: Any = None,
        link_mode: Literal["parent", "link"] = "parent",
        shutdown_timeout: float = 30.0,
        record_message_key: bool = False,
        metric_partition_attribute: bool = False,
        max_process_deaths: int | None = 3,
        crash_probe_records: int = 20,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        stall_after_s: float = 60.0,
        on_stall: Literal["report", "heal"] = "report",
        dedupe: Deduplicator | None = None,
        trace_spans: Literal["message", "call"] = "message",
        ordering: Ordering = "partition",
        max_in_flight: int = 64,
        max_in_flight_bytes: int = 64 << 20,
        in_flight_metadata: bool = True,
        transactions: TransactionPolicy | None = None,
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ConfigError("pass exactly one of handler= and batch_handler=")
        if on_stall not in ON_STALL:
            raise ConfigError(
                f"on_stall must be 'report' or 'heal', not {on_stall!r}", key="on_stall"
            )
        if trace_spans not in ("message", "call"):
            raise ConfigError(
                f"trace_spans must be 'message' or 'call', got {trace_spans!r}", key="trace_spans"
            )
        if trace_spans == "call" and batch_handler is not None:
            raise ConfigError(
                "trace_spans='call' is for a per-message handler: a batch_handler's calls are "
                "traced one span each already",
                key="trace_spans",
            )
        self._span_per_call = trace_spans == "call"
        if transactions is not None:
            _check_transactions(
                transactions,
                batch=batch_handler is not None,
                ordering=ordering,
                own_dlq_producer="dead_letter_producer"
                if dead_letter_producer is not None
                else "dead_letter_producer_config"
                if dead_letter_producer_config
                else None,
            )
        _check_ordering(
            ordering,
            max_in_flight,
            max_in_flight_bytes,
            batch=batch_handler is not None,
            ordered_retry_topics=retry_topics is not None and retry_topics.ordered,
            span_per_call=self._span_per_call,
        )
        if dedupe is not None and not isinstance(dedupe, Deduplicator):
            raise ConfigError(
                f"dedupe must be a kresilient.dedupe.Deduplicator, got {type(dedupe).__name__} "
                "(e.g. dedupe=Deduplicator(window=1_000_000))",
                key="dedupe",
            )
        self._dedupe = dedupe
        self._topics = [topics] if isinstance(topics, str) else list(topics)
        if not self._topics:
            raise ConfigError("topics must name at least one topic")
        if max_batch_size < 1 or poll_timeout <= 0:
            raise ConfigError("max_batch_size must be >= 1 and poll_timeout > 0")
        self._retry_topics = retry_topics
        retry_map: dict[str, tuple[str, int]] = {}
        if retry_topics is not None:
            if batch_handler is not None or any(t.startswith("^") for t in self._topics):
                raise ConfigError(
                    "retry_topics needs a per-message handler and literal topic names"
                )
            for source in list(self._topics):
                for tier, name in enumerate(retry_topics.topics(source)):
                    retry_map[name] = (source, tier)
                    self._topics.append(name)
        # One literal topic (no pattern, no retry topics): every record of a batch is of it, so
        # _finish finds each partition's last record by partition() alone (a third of the cost
        # of a (topic, partition) key per record, which shows at millions of records a second).
        self._only_topic: str | None = (
            self._topics[0]
            if len(self._topics) == 1 and not self._topics[0].startswith("^")
            else None
        )
        if (max_process_deaths is not None and max_process_deaths < 1) or crash_probe_records < 1:
            raise ConfigError("max_process_deaths must be None or >= 1, crash_probe_records >= 1")
        base_log = logger if logger is not None else structlog.get_logger("kresilient.consumer")
        # every log line, exception and repr of this consumer goes through it (issue 11, 5)
        self._redact = Redactor.for_config(config)
        cfg = build_consumer_config(config, allow_unsafe, base_log)
        if transactions is not None:
            if str(cfg.get("isolation.level", "read_committed")) != "read_committed":
                raise ConfigError(
                    "transactions= reads with isolation.level=read_committed: records of "
                    "aborted transactions (its own redone ones included) would be handled",
                    key="isolation.level",
                )
            # the offsets commit in the transaction only (send_offsets_to_transaction)
            cfg["enable.auto.commit"] = False
        self._user_cb: dict[str, Callable[..., Any] | None] = {
            name: cfg.pop(name, None) for name in ("error_cb", "stats_cb", "on_commit", "logger")
        }
        self.group_id: str = str(cfg["group.id"])
        self.client_id: str = str(cfg.get("client.id", ""))
        self._log = log = base_log.bind(
            client_id=self.client_id, group_id=self.group_id, kafka_role="consumer"
        )
        self._rdk_config = cfg
        self._user_config = config
        self._allow_unsafe = allow_unsafe
        self._auto_commit, self._commit_interval = auto_commit(cfg)
        self._next_commit = 0.0

        self._batch_mode = batch_handler is not None
        self._deser = (
            Deserializing(
                batch_handler if batch_handler is not None else handler,  # type: ignore[arg-type]
                key_deserializer,
                value_deserializer,
            )
            if key_deserializer is not None or value_deserializer is not None
            else None
        )
        self._call: Callable[[Any], object]
        if self._batch_mode:
            assert batch_handler is not None
            self._call = refusing_batch_outputs(
                self._deser.call_batch if self._deser is not None else batch_handler
            )
        else:
            assert handler is not None
            self._call = self._deser if self._deser is not None else handler

        self._dlq_policy = dead_letter
        self._breaker = CircuitBreaker(circuit_breaker) if circuit_breaker is not None else None
        self._user_dlq = dead_letter_producer
        # derived (and validated) now: a bad override is a ConfigError here, not in run()
        self._dlq_overrides = dict(dead_letter_producer_config or {})
        self._dlq_config = (
            dead_letter_producer_config_of(
                config,
                client_id=self.client_id or None,
                overrides=self._dlq_overrides,
                allow_unsafe=allow_unsafe,
                logger=base_log,
            )
            if dead_letter is not None and dead_letter_producer is None and transactions is None
            else None
        )
        self._txn_policy = transactions
        self._txn: TransactionalBatches | None = None
        self._txn_config: dict[str, Any] | None = None
        if transactions is not None:
            # derived like the dead-letter producer's (connection and security keys, the
            # consumer's accepted unsafe settings), then the policy's overrides
            txn_cfg = dead_letter_producer_config_of(
                config,
                client_id=self.client_id or self.group_id,
                allow_unsafe=allow_unsafe,
                logger=base_log,
            )
            txn_cfg["client.id"] = f"{self.client_id or self.group_id}-txn"
            for key in ("message.timeout.ms", "delivery.timeout.ms"):
                # a dead-letter producer's delivery timeout; a transaction's records must be
                # delivered within transaction.timeout.ms (TransactionalProducer's default)
                txn_cfg.pop(key, None)
            txn_cfg.update(transactions.producer_config or {})
            self._txn_config = txn_cfg
        self._tracer_provider = tracer_provider
        self._propagator = propagator
        self._max_batch = max_batch_size
        self._poll_timeout = poll_timeout
        self._shutdown_timeout = shutdown_timeout

        max_age = cfg.get("metadata.max.age.ms")
        self._monitor = LeadershipMonitor(
            metadata_max_age_ms=int(max_age) if max_age is not None else None, logger=log
        )
        self._tel = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=propagator,
            client_id=self.client_id,
            consumer_group=self.group_id,
            link_mode=link_mode,
            record_message_key=record_message_key,
            metric_partition_attribute=metric_partition_attribute,
            redactor=self._redact,  # span statuses and events carry no secret either
            logger=log,
        )
        self._monitor.add_listener(self._tel.leadership_listener())

        self._state = state = LoopState()
        self._started = False
        self._closed = False
        self._watchdog = Watchdog(max_poll_interval(cfg) / 2, self._on_overrun)
        self._signals = SignalHandlers(self.stop, lambda: state.stop_requested, log)
        self._install_signals = install_signal_handlers
        self._reach = Reachability(
            log, interval=_UNREACHABLE_LOG_INTERVAL, certificate=client_certificate(cfg)
        )

        # librdkafka's callbacks go to the collaborators made below (the client comes first)
        self._events: ClientEvents
        conf = dict(cfg)
        conf["error_cb"] = lambda err: self._events.on_error(err)
        self._generation = 0  # of the librdkafka consumer: each heal makes a new one
        conf["stats_cb"] = self._stats_cb(0)
        conf["on_commit"] = lambda err, parts: self._events.on_commit(err, parts)
        # all librdkafka output through structlog (redacted, connection failures summarised):
        # never raw %3|...|FAIL| lines on stderr (issue 22, 2)
        self._unreachable: dict[str, str] = {}  # host -> reason, from librdkafka's FAIL lines
        conf["logger"] = LogBridge(
            log,
            self._on_log_line,
            self._redact,
            user_logger=self._user_cb["logger"],
            reachability=self._reach,
        )
        self._conf = conf  # a heal builds the new librdkafka consumer from it
        try:
            self._consumer = Consumer(conf)
        except KafkaException as exc:
            raise translate(exc, operation="configure", redactor=self._redact) from None

        self._holds = holds = Holds(self._consumer, log, self._redact)
        self._offsets = offsets = OffsetKeeper(
            self._consumer,
            log,
            self._tel,
            dead_letter.topic_for if dead_letter is not None else lambda _t: None,
            self._redact,
        )
        self._crash: CrashGuard | None = None
        if max_process_deaths is not None and not self._batch_mode:
            self._crash = CrashGuard(
                self._consumer,
                # transactions=: its markers are plain commits at the committed position,
                # outside the transactions (docs/transactions.md, crash loops)
                offsets
                if transactions is None
                else cast(Any, TxnCrashOffsets(offsets, self._txn_position)),
                max_deaths=max_process_deaths,
                window=crash_probe_records,
                log=log,
                redact=self._redact,
                offset_reset=str(conf.get("auto.offset.reset", "largest")),  # librdkafka's default
            )
            if ordering == "partition":
                offsets.clean_marker = CLEAN
            # else the runner commits the clean marker itself, with the finished-records list
            # (OffsetKeeper's clean commit would drop the list)
        self._guarded: Callable[[Any], object] = (
            self._crash.wrap(self._call) if self._crash is not None else self._call
        )
        self._inner: Callable[[Any], object] = self._call
        # the Output records a handler returns: in the transaction (transactions=), else
        # produced and confirmed before the batch's offsets are stored (ordering="partition");
        # outside the crash guard (its probe is around the handler call alone)
        self._outputs: AtLeastOnceOutputs | None = None
        self._outputs_failing = False  # output failures being handled (see _confirm_outputs)
        # the handler (and guarded) without the output wrapper: the untraced per-message
        # loop checks the result inline instead (a call frame less per record, ~35 ns)
        self._raw_call, self._raw_guarded = self._call, self._guarded
        if transactions is None and not self._batch_mode:
            if ordering == "partition":
                self._outputs = AtLeastOnceOutputs(self._output_producer)
                # a crash marker's commit (crash-loop protection) flushes them first
                self._offsets.output_floor = self._outputs.floor
            plain = self._call
            self._call = self._inner = emitting(plain, self._outputs)
            if self._guarded is not plain:
                self._guarded = emitting(self._guarded, self._outputs)
            else:
                self._guarded = self._call
        self._failures = failures = FailureHandler(
            group_id=self.group_id,
            state=state,
            holds=holds,
            offsets=offsets,
            retrying=retry.retrying(),
            outage_retrying=outage_retry.retrying() if outage_retry is not None else None,
            retry_topics=retry_topics,
            policy=dead_letter,
            breaker=self._breaker,
            deser=self._deser,
            batch_mode=self._batch_mode,
            tel=self._tel,
            log=log,
            redact=self._redact,
            interrupted=lambda: self._signals.interrupted,
        )
        self._events = events = ClientEvents(
            state=state,
            holds=holds,
            offsets=offsets,
            monitor=self._monitor,
            tel=self._tel,
            log=log,
            redact=self._redact,
            reachability=self._reach,
            limiter=RateLimiter(),
            user_callbacks=self._user_cb,
            listeners={"assign": on_assign, "revoke": on_revoke, "lost": on_lost},
            shutdown_timeout=shutdown_timeout,
        )
        events.crash = self._crash
        failures.retry_map = self._retry_map = retry_map
        self._probes = Probes(
            self._consumer,
            offsets,
            holds,
            state,
            stall_after_s=stall_after_s,
            max_poll_s=max_poll_interval(cfg),
            batch_started=lambda: self._watchdog.started,
            group=self.group_id,
            outage=failures.detector,
            log=log,
            redact=self._redact,
            # ordering="key"/"none": the runner's records held by a dependency outage;
            # transactions=: the retry-topic partitions waiting for their record's due time
            held=self._held_elsewhere,
            on_stall=on_stall,
            fetch_wait_s=float(cfg.get("fetch.wait.max.ms", 500)) / 1000.0,
        )
        events.probes = self._probes
        self._health_addr = (health_host, health_port)
        self._health_port: int | None = None
        self._meter_provider = meter_provider
        self._batches = BatchProcessor(
            call=self._call,
            state=state,
            holds=holds,
            failures=failures,
            offsets=offsets,
            breaker=self._breaker,
            consume_error=events.consume_error,
            overrun=self._give_back,
            dedupe=dedupe,
            skipped=self._skipped,
            tel=self._tel,
            group=self.group_id,
        )
        self._sink: DeadLetterSink | None = None
        self._parallel: ParallelRunner | None = None
        if ordering != "partition":
            self._parallel = ParallelRunner(
                consumer=self._consumer,
                call=self._call,
                ordering=ordering,
                max_records=max_in_flight,
                max_bytes=max_in_flight_bytes,
                metadata=in_flight_metadata,
                retrying=retry.retrying(),
                policy=dead_letter,
                breaker=self._breaker,
                dedupe=dedupe,
                deser=self._deser,
                tel=self._tel,
                state=state,
                offsets=offsets,
                consume_error=events.consume_error,
                group=self.group_id,
                log=log,
                redact=self._redact,
                commit_interval=min(self._commit_interval, 1.0),
                revoke_timeout=shutdown_timeout,
                detector=failures.detector,
                outage_retrying=failures.outage_retrying,
                guard=self._crash,
                retry_topics=retry_topics,
                retry_map=retry_map,
            )
        log.debug(
            "consumer_created",
            config=redact_config(cfg),
            topics=self._topics,
            dead_letter=dead_letter is not None,
            batch=self._batch_mode,
        )

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return after the message in hand (thread- and signal-safe)."""
        self._state.stop_requested = True
        self._state.interrupt = True

    def run(self) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT; then commit and leave the group.

        Signals (with ``install_signal_handlers``): the first stops after the message in hand;
        a second while a handler still runs interrupts it (``KeyboardInterrupt``, the message
        is not committed); a second during the shutdown is only logged, so what was processed
        is still committed and the group left; a third aborts the shutdown (logged
        ``shutdown_aborted``, ``KeyboardInterrupt``).

        Raises :class:`~kresilient.CircuitBreakerOpenError`, :class:`~kresilient.DeadLetterError`
        (a dead-letter write failed), :class:`~kresilient.ConsumeError` (fatal consumer error,
        or no broker reachable at start), with ``transactions=``
        :class:`~kresilient.ProducerFencedError` (another instance took the transactional id:
        a zombie stops) or :class:`~kresilient.FatalProducerError` (the transactional producer
        failed fatally, e.g. an abort refused), or, without a dead-letter topic, the handler's
        exception, always after the graceful shutdown. Can be called once.
        """
        if self._started or self._closed:
            raise RuntimeError("ResilientConsumer.run() can only be called once")
        self._started = True
        error: BaseException | None = None
        if self._install_signals:
            self._signals.install()
        try:
            self._start()
            self._loop()
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._shutdown(error)

    def _start(self) -> None:
        policy = self._dlq_policy
        if self._txn_policy is not None:
            if policy is None or policy.require_topic:  # and the retry topics, if any
                self._check_dead_letter_topics(policy)
            self._start_transactions(self._txn_policy)
        elif policy is not None or self._retry_map:
            if policy is None or policy.require_topic:
                self._check_dead_letter_topics(policy)
            target: ResilientProducer | DeadLetterWriter | None = self._user_dlq
            if target is None:
                # THE dead-letter writer (issue 12): byte for byte, acks=all + idempotence; its
                # send span is recorded by the sink through this consumer's telemetry
                target = DeadLetterWriter(
                    self._user_config,
                    client_id=self.client_id or None,
                    overrides=self._dlq_overrides,
                    allow_unsafe=self._allow_unsafe,
                    logger=self._log,
                )
            self._sink = self._failures.sink = self._events.sink = DeadLetterSink(
                target,
                owned=self._user_dlq is None,
                propagates=self._user_dlq is not None,
                tel=self._tel if isinstance(target, DeadLetterWriter) else None,
            )
            if self._parallel is not None:
                self._parallel.sink = self._sink
        self._subscribe()
        self._next_commit = time.monotonic() + self._commit_interval
        self._watchdog.start()
        probes = self._probes
        probes.last_poll = time.monotonic()
        probes.running = True
        probes.register_metrics(self._meter_provider)
        host, port = self._health_addr
        if port is not None:
            self._health_port = probes.serve(host, port)
            self._log.info("health_probes_serving", host=host, port=self._health_port)
        self._log.debug("consumer_started", topics=self._topics)

    def _output_producer(self) -> ResilientProducer:
        """The producer of the handler's outputs (at-least-once), made at the first one:
        the consumer's connection and security keys, its telemetry providers."""
        base = self.client_id or self.group_id
        cfg = dead_letter_producer_config_of(
            self._user_config, client_id=base, allow_unsafe=self._allow_unsafe, logger=self._log
        )
        cfg["client.id"] = f"{base}-out"
        return ResilientProducer(
            cfg,
            allow_unsafe=self._allow_unsafe,
            logger=self._log,
            tracer_provider=self._tracer_provider,
            meter_provider=self._meter_provider,
            propagator=self._propagator,
        )

    def _confirm_outputs(self) -> list[tuple[Any, BaseException]]:
        """Every output queued so far delivered (before offsets are stored: at a batch's end,
        and after a held record's retry); the earliest record of a partition whose output
        failed is that record's failure (retried or dead-lettered: the records after it are
        handled again). Returns those records with their errors (empty: all delivered)."""
        assert self._outputs is not None
        failed = self._outputs.confirm()
        # set while their failures are handled: one that stops the consumer (no dead-letter
        # topic, the breaker) leaves the others unhandled, and nothing of the batch is stored
        self._outputs_failing = bool(failed)
        for msg, exc in failed:
            self._state.nonsuccess += 1
            self._failures.on_failure(msg, exc)
        self._outputs_failing = False
        return failed

    def _start_transactions(self, policy: TransactionPolicy) -> None:
        """The transactional producer (its ``init_transactions()`` fences an older instance
        with the same id) and the collaborator writing each batch's transaction."""
        assert self._txn_config is not None
        producer = TransactionalProducer(
            self._txn_config,
            transactional_id=policy.transactional_id,
            timeout=policy.timeout,
            allow_unsafe=self._allow_unsafe,
            logger=self._log,
        )
        failures = self._failures
        self._txn = TransactionalBatches(
            consumer=self._consumer,
            producer=producer,
            policy=policy,
            # crash-loop protection around the handler call (its markers outside the
            # transactions, see TxnCrashOffsets)
            call=self._crash.wrap(self._call) if self._crash is not None else self._call,
            dead_letter=self._dlq_policy,
            retrying=failures.retrying,
            outage_retrying=failures.outage_retrying,
            detector=failures.detector,
            deser=self._deser,
            breaker=self._breaker,
            dedupe=self._dedupe,
            tel=self._tel,
            state=self._state,
            consume_error=self._events.consume_error,
            group=self.group_id,
            log=self._log,
            redact=self._redact,
            tracer_provider=self._tracer_provider,
            # committed: what the probes read as progress (never committed again by the
            # consumer: nothing is stored in librdkafka in this mode)
            on_committed=self._offsets.stored.update,
            retry_topics=self._retry_topics,
            retry_map=self._retry_map,
            probing=self._crash.probing if self._crash is not None else None,
        )
        self._txn.register_metrics(self._meter_provider)

    def _txn_position(self, tp: TP) -> int | None:
        """The committed position of ``tp`` (crash-loop markers with ``transactions=``)."""
        txn = self._txn
        return txn.committed_position(tp) if txn is not None else None

    def _subscribe(self) -> None:
        """Subscribe the current librdkafka consumer. Its callbacks are ignored once a heal
        replaced it (the old one's revoke at its close in the background must not touch
        the new member's state; confluent-kafka unassigns by itself)."""
        assign: RebalanceCallback
        revoke: RebalanceCallback
        lost: RebalanceCallback
        if self._txn is not None:
            assign, revoke, lost = (
                self._events.on_assign,
                self._revoked_transactional,
                self._lost_transactional,
            )
        elif self._parallel is None:
            assign, revoke, lost = (
                self._events.on_assign,
                self._events.on_revoke,
                self._events.on_lost,
            )
        else:
            assign, revoke, lost = (
                self._assigned_parallel,
                self._revoked_parallel,
                self._lost_parallel,
            )
        self._consumer.subscribe(
            self._topics,
            on_assign=self._current(assign),
            on_revoke=self._current(revoke),
            on_lost=self._current(lost),
        )

    def _current(self, callback: RebalanceCallback) -> RebalanceCallback:
        generation = self._generation

        def guarded(consumer: Any, partitions: list[TopicPartition]) -> None:
            if generation == self._generation:  # not an instance a heal replaced
                callback(consumer, partitions)

        return guarded

    def _stats_cb(self, generation: int) -> Callable[[str], None]:
        def on_stats(stats: str) -> None:
            self._events.on_stats(stats)
            # a replaced instance closing in the background: its hung connections are no
            # longer this consumer's
            if generation == self._generation:
                self._probes.on_stats(stats)

        return on_stats

    def _revoked_transactional(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Abort the open transaction (its records are redone: the partitions that stay
        are rewound), then the usual revoke (it commits nothing: nothing is stored)."""
        assert self._txn is not None
        self._txn.on_revoke(partitions)
        self._events.on_revoke(consumer, partitions)

    def _lost_transactional(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        assert self._txn is not None
        self._txn.on_revoke(partitions, lost=True)
        self._events.on_lost(consumer, partitions)

    def _assigned_parallel(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._events.on_assign(consumer, partitions)
        assert self._parallel is not None
        self._parallel.on_assign(partitions)

    def _revoked_parallel(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Wait (bounded) for the revoked partitions' running records, store what is safe,
        then the usual revoke (its synchronous commit carries it)."""
        assert self._parallel is not None
        try:
            self._parallel.revoke({(p.topic, p.partition) for p in partitions})
        except Exception as exc:  # never let a callback break consume(); raised by the loop
            self._parallel.fatal = exc
        self._events.on_revoke(consumer, partitions)

    def _lost_parallel(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        assert self._parallel is not None
        self._parallel.lost({(p.topic, p.partition) for p in partitions})
        self._events.on_lost(consumer, partitions)

    def _check_dead_letter_topics(self, policy: DeadLetterPolicy | None) -> None:
        retry = self._retry_map
        wanted = sorted(
            {policy.topic_for(t) for t in literal_topics(self._topics) if t not in retry}
            if policy is not None
            else set()
        ) + sorted(retry)
        if not wanted:
            return
        deadline = time.monotonic() + _METADATA_TIMEOUT
        while True:
            # short requests with the callbacks served in between: a cluster that cannot be
            # reached is named (kafka_unreachable, host and reason) within a second or two
            try:
                metadata = self._consumer.list_topics(timeout=1.0)
                break
            except KafkaException as exc:
                self._consumer.poll(0)  # error_cb, statistics and librdkafka's log lines
                if time.monotonic() < deadline and classify(exc).retriable:
                    continue
                error = translate(exc, operation="consume", redactor=self._redact)
                servers = self._redact(str(self._rdk_config.get("bootstrap.servers", "")))
                # one text, the consumer's own: it gave up, nothing was consumed or committed
                # (not the producer's "messages wait", not "retry without idempotence")
                raise type(error)(
                    f"no broker reachable within {_METADATA_TIMEOUT:g} s: {error.message}",
                    classification=self._reach.unreachable_classification(
                        error.classification,
                        servers=servers,
                        waited=_METADATA_TIMEOUT,
                        outcome="the consumer did not start: nothing was consumed or committed",
                    ),
                ) from exc
        missing = [
            t for t in wanted if t not in metadata.topics or metadata.topics[t].error is not None
        ]
        if missing:
            raise ConfigError(
                f"dead-letter/retry topic(s) {missing} do not exist: create them (replicated like "
                "the source topics, e.g. `kresilient topic create NAME --dlq`) or pass "
                "DeadLetterPolicy(require_topic=False)",
                key=None,
            )

    def _on_log_line(self, text: str) -> None:
        """Every (redacted) librdkafka log line: the leadership monitor, and the reason each
        unreachable host failed (named in the error of a start without any broker)."""
        self._monitor.on_log(text)
        failure = connect_failure(text)
        if failure is not None:
            self._unreachable[failure[0]] = failure[1]

    def _loop(self) -> None:
        consume = self._consumer.consume
        process = self._batches.process if self._batch_mode else self._process
        parallel = self._parallel
        if parallel is not None:
            process = parallel.process
        txn = self._txn
        if txn is not None:
            process = txn.process
        watchdog = self._watchdog
        tel = self._tel
        state = self._state
        events = self._events
        offsets = self._offsets
        holds = self._holds
        size = self._max_batch
        probes = self._probes
        recheck = tick = advance = 0.0
        while not state.stop_requested:
            if events.fatal is not None:
                raise events.fatal
            probes.last_poll = now = time.monotonic()
            if now >= tick:
                probes.tick(now)
                tick = now + 1.0
                remedy = probes.remedy
                if remedy is not None and self._may_heal():
                    self._heal(*remedy)
                    consume = self._consumer.consume
            timeout = self._poll_timeout
            if holds.by_tp:
                timeout = holds.service(timeout)
            if parallel is not None:
                timeout = parallel.service(timeout)
            if txn is not None:
                if txn.fatal is not None:
                    raise txn.fatal
                txn.tick(now)
                timeout = txn.timeout(timeout)
            elif offsets.pending:
                self._release_dead_letters()
            if txn is None and not self._auto_commit and time.monotonic() >= self._next_commit:
                self._next_commit = time.monotonic() + self._commit_interval
                offsets.commit_async()
            revocations = state.revocations
            try:
                # consume(n, t) blocks until n messages or t: take what is there, else wait
                # for ONE message (returns at once when it arrives), then whatever followed
                msgs = consume(size, 0)
                if not msgs:
                    msgs = consume(1, timeout)
                    if msgs and size > 1:
                        msgs.extend(consume(size - 1, 0))
            except KafkaException as exc:
                raise translate(exc, operation="consume", redactor=self._redact) from exc
            if state.revocations != revocations and msgs:
                # A rebalance was served inside a consume() call after an earlier call of this
                # iteration had returned messages: those of partitions revoked meanwhile were
                # committed past on revoke and belong to their new owner now (issue 11, 10).
                msgs = self._drop_unassigned(msgs)
                if txn is not None:
                    msgs = txn.drop_rewound(msgs)
            if not msgs:
                if parallel is None and now >= advance:
                    # idle: past a transaction marker at a partition's end (see advance_idle)
                    advance = now + 1.0
                    if txn is None:
                        offsets.advance_idle(holds.by_tp)
                    else:
                        txn.advance_idle()
                continue
            watchdog.started = now = time.monotonic()
            if now >= recheck:  # a tracer provider may be installed after start
                state.traced = tel.enabled
                recheck = now + 1.0
            process(msgs)
            watchdog.started = 0.0
        # from here on a 2nd signal is only logged (no window before _shutdown sets it too)
        self._signals.shutting_down = True

    # ------------------------------------------------------------------ heal (issue 42)

    def _held_elsewhere(self) -> Collection[TP]:
        """Partitions held by a collaborator (no progress expected of them)."""
        if self._parallel is not None:
            return self._parallel.held_partitions()
        if self._txn is not None:
            return self._txn.deferred()
        return ()

    def _may_heal(self) -> bool:
        """Nothing in hand (the loop thread, between batches: no handler runs), nothing held
        by a retry or an outage, no dead letter waiting for its acknowledgement."""
        parallel = self._parallel
        detector = self._failures.detector
        return not (
            self._state.stop_requested
            or self._holds.by_tp
            or self._offsets.pending
            or (detector is not None and detector.active)
            or (parallel is not None and (parallel.in_flight or parallel.held_partitions()))
            or (self._txn is not None and self._txn.open)
        )

    def _heal(self, kind: str, reason: str) -> None:
        """Recreate the librdkafka consumer (``on_stall="heal"``, on the loop thread).

        The new instance is installed first, so the old one's callbacks are ignored from
        then on; the old one commits what is stored (with the clean marker) and closes in a
        daemon thread, waited for at most ``HEAL_TIMEOUT``; the new one subscribes and
        resumes from the committed offsets: what was not committed is handled again.
        """
        old = self._consumer
        conf = dict(self._conf)
        conf["stats_cb"] = self._stats_cb(self._generation + 1)
        try:
            new = Consumer(conf)
        except KafkaException as exc:
            self._log.warning("consumer_recreate_failed", cause=kind, error=self._redact(str(exc)))
            return
        self._generation += 1
        self._consumer = new
        offsets = self._offsets
        stored = dict(offsets.stored)
        metadata: dict[TP, str | None] = {}
        if self._parallel is not None:
            # the runner stores once a second: what finished since is committed too (nothing
            # is in flight, so each window's committable offset is past all it handled)
            for tp, window in list(self._parallel.windows.items()):
                offset = window.committable()
                if offset is not None:
                    stored[tp] = offset
                    # the clean-end marker beside the list (crash-loop protection): the
                    # new member would otherwise probe every partition one record at a time
                    metadata[tp] = window.metadata(CLEAN if self._crash is not None else None)
        # the old member's partitions: the new one is assigned anew from the commits
        tps = set(stored) | set(self._probes.parts)
        retire_client(
            old,
            stored,
            marker=offsets.clean_marker,
            metadata=metadata,
            redact=self._redact,
            log=self._log,
            cause=kind,
            reason=reason,
            partitions=tps,
        )
        offsets.forget_stored(tps)
        if self._crash is not None:
            self._crash.forget(list(tps))
        if self._parallel is not None:
            self._parallel.lost(tps)
        if self._txn is not None:
            self._txn.forget(tps | set(self._txn.deferred()))
        # the collaborators that call librdkafka (built with the consumer) take the new one
        for keeper in (self._holds, offsets, self._crash, self._parallel, self._txn):
            if keeper is not None:
                keeper._consumer = new
        self._probes.consumer = new
        self._state.revocations += 1  # messages of the old instance in hand: none (between)
        self._subscribe()
        self._probes.healed(kind)

    def _drop_unassigned(self, msgs: list[Message]) -> list[Message]:
        try:
            assignment = self._consumer.assignment()
        except (KafkaException, RuntimeError) as exc:
            # cannot tell: keep them all. Dropping messages of a partition still assigned
            # would skip them for good (its fetch position is past them); handling one of a
            # revoked partition only duplicates it (at-least-once).
            self._log.warning("assignment_unknown", error=self._redact(str(exc)))
            return msgs
        kept, dropped = drop_unassigned(msgs, {(p.topic, p.partition) for p in assignment})
        if dropped:
            self._log.info(
                "revoked_messages_dropped",
                messages=len(dropped),
                partitions=sorted({f"{m.topic()}[{m.partition()}]" for m in dropped}),
                note="fetched before their partition was revoked: its new owner consumes them",
            )
        return kept

    # ------------------------------------------------------------------ per-message path

    def _process(self, msgs: list[Message]) -> None:
        """Handle one consumed batch message by message (the hot path: keep it lean)."""
        state = self._state
        crash = self._crash
        # while a batch holds records of a partition probed after an unclean end (or of a
        # never-committed one, not seeded yet), handler calls go through the guard
        self._inner = self._guarded if crash is not None and crash.in_batch() else self._call
        if state.traced and self._span_per_call:
            self._process_in_span(msgs)
            return
        if state.traced:
            self._handle_each(msgs, self._traced_call)
        elif self._outputs is not None and not self._routes():
            # the hot path: the raw handler, its outputs taken from its result inline
            raw = self._raw_guarded if self._inner is self._guarded else self._raw_call
            self._handle_each(msgs, raw, self._outputs.send)
        else:
            self._handle_each(msgs, self._inner)

    def _routes(self) -> bool:
        """A record may take another way than the handler (see :meth:`_routed`)."""
        return self._failures.keys is not None or bool(self._retry_map) or self._dedupe is not None

    def _process_in_span(self, msgs: list[Message]) -> None:
        """``trace_spans="call"``: the whole batch inside one process span, linked to the
        records' producers. What the failure handling raises (breaker open, no DLQ ...) leaves
        after the span ended, as in the per-message path; the handler's own exceptions are on
        the span (``_marked_call``)."""
        records = [m for m in msgs if m.error() is None]
        stop: BaseException | None = None
        with self._tel.batch_process_span(records, group=self.group_id):
            try:
                self._handle_each(msgs, self._marked_call)
            except BaseException as raised:
                stop = raised
        if stop is not None:
            raise stop

    def _marked_call(self, msg: Message) -> None:
        """The handler call of ``trace_spans="call"``: a failure is marked on the call's span
        (an exception event, ``error.type``) before the failure handling sees it."""
        try:
            self._inner(msg)
        except BaseException as exc:
            self._tel.set_error(exc, classify(exc) if isinstance(exc, Exception) else None)
            raise

    def _handle_each(
        self,
        msgs: list[Message],
        plain: Callable[[Any], object],
        send: Callable[[Any, tuple[Output, ...]], None] | None = None,
    ) -> None:
        """Handle *msgs* one by one with *plain* (behind the routes, if any).

        ``send``: *plain* is the raw handler (no routes, untraced): its :class:`Output`
        results are queued with ``send`` here; a held record's retry goes through the
        wrapped ``_inner``."""
        state = self._state
        # Ordered key retries, retry topics and dedupe wrap the call (once per batch): the
        # default consumer's loop tests nothing per message that the old layout did not.
        call = self._routed(plain) if self._routes() else plain
        retry_call = plain if send is None else self._inner
        holds = self._holds.by_tp
        on_failure = self._failures.on_failure
        state.batch = msgs
        state.nonsuccess = state.credited = state.reported = 0
        state.batch_errors = False
        msg: Message | None = None
        try:
            for msg in msgs:
                if msg.error() is not None:
                    state.nonsuccess += 1
                    state.batch_errors = True
                    self._events.consume_error(msg)
                    continue
                if holds:
                    hold = holds.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
                    if hold is not None:
                        self._held(hold, msg, retry_call)
                        if state.interrupt:
                            break
                        continue
                try:
                    result = call(msg)
                    if result is not None and send is not None:
                        produced = outputs_of(result, msg, strict=False)
                        if produced:
                            send(msg, produced)
                except _Handled as handled:
                    state.nonsuccess += 1
                    if handled.stop is not None:
                        raise handled.stop from None
                except Exception as exc:
                    on_failure(msg, exc)
                    state.nonsuccess += 1
                if state.interrupt:
                    break
            else:
                msg = None
            if self._outputs is not None and self._outputs.pending:
                failed = self._confirm_outputs()
                if failed and state.interrupt:
                    # stopping (a failure the consumer stops on, stop()): nothing at or after
                    # the earliest record whose outputs were not delivered is stored, in any
                    # partition of the batch (handled again after a restart, never lost)
                    position = {id(m): i for i, m in enumerate(msgs)}
                    in_batch = [m for m, _ in failed if id(m) in position]
                    earliest = min(in_batch, key=lambda m: position[id(m)]) if in_batch else msgs[0]
                    self._finish(msgs, earliest, done=False)
                    return
        except BaseException:
            # stopping with an exception (breaker open, KeyboardInterrupt in the handler ...):
            # the message in hand is not done, whatever happened to it
            outputs = self._outputs
            if outputs is not None and (outputs.pending or self._outputs_failing):
                # the batch's outputs not confirmed yet (or their failures not all handled):
                # store nothing of it unless every one was delivered (handled again after a
                # restart, never lost)
                try:
                    undelivered = self._outputs_failing or bool(outputs.confirm())
                except Exception:
                    undelivered = True
                self._outputs_failing = False
                if undelivered:
                    self._log.warning(
                        "outputs_unconfirmed_at_stop",
                        note="the batch's offsets are not stored: its records are handled "
                        "again after a restart",
                    )
                    raise
            self._finish(msgs, msg, done=False)
            raise
        self._finish(msgs, msg)

    def _routed(self, call: Callable[[Any], object]) -> Callable[[Any], object]:
        """``call`` behind the routes a record may take instead of the handler: behind an
        earlier failed record of its key, deferred to its retry topic's due time, skipped as
        a processed duplicate (each raises ``_Handled()``: not processed, nothing to stop).
        A processed record is recorded by dedupe and releases its key."""
        keys = self._failures.keys
        retry_map = self._retry_map
        dedupe = self._dedupe

        def routed(msg: Message) -> None:
            if keys is not None and keys.blocked:
                tier = keys.route(msg)
                if tier is not None:  # ordered: behind the earlier record of its key
                    self._failures.follow(msg, tier)
                    raise _Handled()
            if retry_map and msg.topic() in retry_map and self._defer(msg):
                raise _Handled()
            if dedupe is not None and dedupe.is_duplicate(self._original(msg)):
                self._skipped([msg])  # stored by _finish like a processed record
                if keys is not None and keys.blocked:
                    keys.done(msg)  # done with, like a processed one: its key flows on
                raise _Handled()
            call(msg)
            if dedupe is not None:
                dedupe.processed(self._original(msg))
            if keys is not None and keys.blocked:
                keys.done(msg)

        return routed

    def _original(self, msg: Message) -> Any:
        """``msg``, or for a retry-topic record the original it stands for (its topic and
        headers are the ones the dedupe window keys on)."""
        return RetryView(msg) if self._retry_map and msg.topic() in self._retry_map else msg

    def _skipped(self, msgs: list[Message]) -> None:
        """Possible duplicates ``dedupe`` skipped: counted, logged with their ids (DEBUG, the
        per-message path), never dropped silently."""
        self._state.duplicates += len(msgs)
        for msg in msgs:
            ident = record_id(msg)[0]
            self._log.debug(
                "duplicate_skipped",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                message_id=ident.decode("utf-8", "replace") if ident is not None else None,
                note="marked as a possible duplicate and its message id was processed",
            )

    def _traced_call(self, msg: Message) -> None:
        """``call`` inside a process span; failures are handled inside the span.

        Nothing but the handler's own ``BaseException`` escapes the span block: the span and
        ``messaging.process.duration`` carry the handler's exception (one exception event),
        never ``_Handled`` (issue 23, 2), which is raised after the span ended.
        """
        stop: BaseException | None = None
        with self._tel.process_span(cast(Any, msg), group=self.group_id):
            try:
                self._inner(msg)
            except Exception as exc:
                self._tel.set_error(exc, classify(exc))
                try:
                    self._failures.on_failure(msg, exc)
                except BaseException as raised:  # breaker open, no DLQ ...: re-raised by the loop
                    stop = raised
            else:
                return
        raise _Handled(stop)

    def _defer(self, msg: Message) -> bool:
        """A retry-topic record not due yet: hold its partition (paused, seeked back to it)
        until it is; True if deferred. Nothing sleeps: the loop keeps polling."""
        due_ms = RetryView(msg).due_ms()
        if due_ms is None:
            return False
        wait = due_ms / 1000.0 - time.time()
        if wait <= 0:
            return False
        offset = msg.offset()
        assert offset is not None
        tp: TP = (msg.topic(), msg.partition())  # type: ignore[assignment]
        self._offsets.store(tp, offset, msg.leader_epoch())  # everything before it is done
        self._holds.by_tp[tp] = Hold(tp=tp, offset=offset, due=time.monotonic() + wait)
        self._holds.excluded.add(tp)
        self._holds.pause(tp, offset)
        return True

    def _held(self, hold: Hold, msg: Message, call: Callable[[Any], object]) -> None:
        """A message of a held partition: skip it, or run the held message's next attempt."""
        state = self._state
        verdict = hold.verdict(msg.offset())  # type: ignore[arg-type]
        if verdict is Verdict.SKIP:
            self._holds.excluded.add(hold.tp)
            state.nonsuccess += 1
            return
        if verdict is Verdict.RELEASE:
            self._log.warning(
                "retry_hold_released",
                topic=hold.tp[0],
                partition=hold.tp[1],
                held_offset=hold.offset,
                offset=msg.offset(),
                reason="the held offset is no longer in the log (retention or truncation)",
            )
            self._holds.done(hold.tp)
        keys = self._failures.keys
        if verdict is Verdict.PROBE:
            self._probe(hold, msg)
            return
        if verdict is Verdict.AHEAD:  # a probe handled out of turn: stored now, in its turn
            self._holds.done(hold.tp)
            state.nonsuccess += 1  # counted when it was handled
            return
        if self._dedupe is not None and self._dedupe.is_duplicate(self._original(msg)):
            # the held record's next attempt, or a retry-topic record deferred to its due time
            # (whose first delivery never reached the dedupe check): a marked copy whose id was
            # processed meanwhile is skipped here as at its first delivery (issue 35)
            if verdict is Verdict.RETRY:
                self._holds.done(hold.tp)
                self._holds.excluded.discard(hold.tp)
            self._skipped([msg])
            if keys is not None and keys.blocked:
                keys.done(msg)
            state.nonsuccess += 1
            return
        try:
            call(msg)
        except _Handled as handled:
            state.nonsuccess += 1
            if handled.stop is not None:
                raise handled.stop from None
            return
        except Exception as exc:
            self._failures.on_failure(msg, exc)
            state.nonsuccess += 1
            return
        if (
            verdict is Verdict.RETRY
            and self._outputs is not None
            and self._outputs.pending
            and any((m.topic(), m.partition()) == hold.tp for m, _ in self._confirm_outputs())
        ):
            # confirmed alone, now: a broker refusing a whole batch of outputs fails every
            # record in it, so only the retry's own delivery says whether this record is bad
            # (another partition's failed output is that partition's failure, not this one's)
            return
        if self._dedupe is not None:
            self._dedupe.processed(self._original(msg))
        if keys is not None and keys.blocked:
            keys.done(msg)
        if verdict is Verdict.RETRY:
            self._holds.done(hold.tp)
            self._holds.excluded.discard(hold.tp)
            self._log.debug(
                "message_retry_succeeded",
                topic=hold.tp[0],
                partition=hold.tp[1],
                offset=hold.offset,
                attempts=hold.attempts + 1,
                held_s=round(time.monotonic() - hold.first_failure, 3),
            )

    def _probe(self, hold: Hold, msg: Message) -> None:
        """``msg``, after a held record whose retries are exhausted, tried as evidence
        (:mod:`kresilient.consumer._outage`): handled, the held record is dead-lettered and
        the partition continues; failed, the held record is held as an outage. Called
        without the process span and the routes (its failure must reach the probe's
        decision, not the retry/dead-letter one)."""
        state = self._state
        failures = self._failures
        dedupe = self._dedupe
        if dedupe is not None and dedupe.is_duplicate(self._original(msg)):
            state.nonsuccess += 1  # not handled: fetched again (and skipped) after the hold
            failures.probe_failed(hold, msg, None)
            return
        try:
            self._inner(msg)
        except Exception as exc:
            state.nonsuccess += 1
            failures.probe_failed(hold, msg, exc)
            return
        if dedupe is not None:
            dedupe.processed(self._original(msg))
        failures.probe_succeeded(hold, msg)

    def _finish(self, msgs: list[Message], last_seen: Message | None, *, done: bool = True) -> None:
        """Store the offsets of what this batch processed; give back the rest on overrun.

        ``last_seen``: the message the loop stopped at (``None``: all were seen); ``done``:
        whether that message was dealt with (handled, dead-lettered or held).
        """
        state = self._state
        n = len(msgs) if last_seen is None else msgs.index(last_seen) + int(done)
        seq = msgs if n == len(msgs) else msgs[:n]
        only = self._only_topic
        if state.batch_errors:
            last = {(m.topic(), m.partition()): m for m in seq if m.error() is None}
        elif only is not None:
            last = {(only, p): m for p, m in {m.partition(): m for m in seq}.items()}
        else:
            last = {(m.topic(), m.partition()): m for m in seq}
        excluded = self._holds.excluded
        if excluded:
            for tp in excluded:
                last.pop(tp, None)
            excluded.clear()
        self._offsets.store_last(last)  # type: ignore[arg-type]
        ok = n - state.nonsuccess
        state.processed += ok
        if ok > state.reported and self._failures.detector is not None:
            state.reported = ok
            self._failures.succeeded()  # evidence the dependencies work (ends an outage)
        if self._breaker is not None and ok > state.credited:
            self._breaker.record_successes(ok - state.credited)
        state.batch = []
        if state.overrun and n < len(msgs):
            self._give_back(msgs[n:])
        if state.overrun:
            state.overrun = False
            state.interrupt = state.stop_requested

    def _give_back(self, rest: list[Message]) -> None:
        """Seek partitions back to their first unprocessed message (after an overrun)."""
        self._holds.give_back(rest)
        self._log.info(
            "batch_overrun",
            unprocessed=len(rest),
            budget_s=self._watchdog.budget,
            note="slow handler: the rest of the batch is fetched again",
        )

    def _on_overrun(self) -> None:
        """Watchdog: the batch in progress outlasts half of max.poll.interval.ms."""
        self._state.overrun = True
        self._state.interrupt = True

    def _release_dead_letters(self) -> None:
        """Serve the dead-letter client; store past acknowledged writes (raises on failed)."""
        if self._sink is not None:
            self._sink.poll(0)
        self._offsets.release()

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self, error: BaseException | None) -> None:
        self._signals.shutting_down = True  # a 2nd signal no longer interrupts (3rd aborts)
        self._probes.running = False
        self._log.debug(
            "consumer_stopping",
            dead_letters_pending=self._offsets.pending_count()
            + (self._parallel.pending_writes if self._parallel is not None else 0),
            error=type(error).__name__ if error is not None else None,
        )
        self._watchdog.stop()
        sink = self._sink
        steps: list[tuple[str, Callable[[], None]]] = [
            # one thread, one bound: a frozen coordinator holds the commit, then the close
            ("commit_and_close", self._bounded("commit_and_close", self._commit_and_close)),
        ]
        parallel = self._parallel
        if parallel is not None:
            steps.insert(0, ("await_in_flight", lambda: parallel.close(self._shutdown_timeout)))
        txn = self._txn
        if txn is not None:
            # what was processed commits with its offsets (a graceful stop), else aborts
            steps.insert(0, ("finish_transaction", lambda: txn.finish(error is None)))
        if sink is not None and self._offsets.pending:
            steps.insert(
                0,
                (
                    "await_dead_letters",
                    lambda: self._offsets.wait(sink, None, self._shutdown_timeout),
                ),
            )
        if sink is not None and sink.owned:
            steps.append(("close_dead_letter_producer", lambda: sink.close(10)))
        outputs = self._outputs
        if outputs is not None and outputs.producer is not None:
            steps.append(("close_output_producer", lambda: outputs.close(10)))
        signals = self._signals
        try:
            for name, step in steps:
                try:
                    step()
                except Exception as exc:  # the next steps still run (commit, close)
                    if signals.aborted:  # the 3rd signal's KeyboardInterrupt, turned into exc
                        raise KeyboardInterrupt from exc
                    self._log.warning(
                        "shutdown_step_failed", step=name, error=self._redact(repr(exc))
                    )
                if signals.aborted:  # its KeyboardInterrupt was swallowed inside the step
                    raise KeyboardInterrupt
        finally:  # a third signal aborts (KeyboardInterrupt, logged by SignalHandlers)
            self._probes.close()
            self._closed = True
            self._signals.restore()
        self._log.debug(
            "consumer_closed",
            processed=self._state.processed,
            retries=self._state.retries,
            dead_lettered=self._offsets.dead_lettered,
            error=type(error).__name__ if error is not None else None,
        )

    def _commit_and_close(self) -> None:
        """The final commit, then librdkafka's close (which leaves the group); a third signal
        during the commit aborts (KeyboardInterrupt, handed to the shutdown's thread)."""
        signals = self._signals
        try:
            self._offsets.commit_sync("close")
        except Exception as exc:  # the close still runs
            if signals.aborted:  # the 3rd signal's KeyboardInterrupt, turned into exc
                raise KeyboardInterrupt from exc
            self._log.warning("shutdown_step_failed", step="commit", error=self._redact(repr(exc)))
        if signals.aborted:  # its KeyboardInterrupt was swallowed inside the commit
            raise KeyboardInterrupt
        self._consumer.close()

    def _bounded(self, step: str, call: Callable[[], Any]) -> Callable[[], None]:
        """``call`` (librdkafka's commit and close) bounded by ``shutdown_timeout``: past it
        the call is left to a daemon thread and one ``close_timed_out`` WARNING says so."""

        def run() -> None:
            done, _ = bounded_call(call, self._shutdown_timeout, name=f"kresilient-consumer-{step}")
            if not done:
                self._log.warning(
                    "close_timed_out",
                    client="ResilientConsumer",
                    step=step,
                    shutdown_timeout=self._shutdown_timeout,
                    partitions_with_offsets=len(self._offsets.stored),
                    note=(
                        "librdkafka did not return in time (a group coordinator that never "
                        "answers?); left to a daemon thread, the shutdown goes on. Offsets "
                        "not committed: those records are read again by the next owner"
                    ),
                )

        return run

    def close(self) -> None:
        """Release the consumer without running (``run()`` closes by itself). Idempotent.

        Bounded by ``shutdown_timeout`` whatever librdkafka does (see ``_shutdown``)."""
        if self._closed:
            return
        if self._started:
            self.stop()
            return
        self._closed = True
        self._bounded("close_consumer", self._consumer.close)()

    def __enter__(self) -> ResilientConsumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ introspection

    def health(self) -> ConsumerHealth:
        """A snapshot for health endpoints (safe to call from another thread)."""
        for _ in range(10):  # the loop thread may change the dicts while we copy them
            try:
                return self._health()
            except RuntimeError:
                continue
        return self._health()

    def _health(self) -> ConsumerHealth:
        breaker, offsets, state = self._breaker, self._offsets, self._state
        return ConsumerHealth(
            group_id=self.group_id,
            client_id=self.client_id,
            running=self._started and not self._closed,
            stopping=state.stop_requested,
            processed=state.processed,
            retries=state.retries,
            dead_lettered=offsets.dead_lettered
            + (self._txn.dead_lettered if self._txn is not None else 0),
            dead_letters_pending=offsets.pending_count()
            + (self._parallel.pending_writes if self._parallel is not None else 0),
            held_partitions=[h.snapshot() for h in list(self._holds.by_tp.values())],
            rebalances=dict(state.rebalances),
            commit_failures=offsets.commit_failures,
            last_commit_error=self._redact(str(offsets.last_commit_error))
            if offsets.last_commit_error is not None
            else None,
            circuit_breaker=breaker.snapshot() if breaker is not None else None,
            leadership=self._monitor.snapshot(),
            moved_to_retry=self._failures.moved
            + (self._txn.moved if self._txn is not None else 0)
            + (self._parallel.moved if self._parallel is not None else 0),
            crash_loops=self._crash.crash_loops if self._crash is not None else 0,
            duplicates_skipped=state.duplicates,
            blocked_keys=(
                self._txn.blocked_keys
                if self._txn is not None
                else len(self._failures.keys)
                if self._failures.keys is not None
                else 0
            ),
            outage=self._failures.detector.snapshot()
            if self._failures.detector is not None
            else None,
            transactions=self._txn.snapshot() if self._txn is not None else None,
            **self._probes.stall_fields(),
        )

    @property
    def health_port(self) -> int | None:
        """The port ``/live`` and ``/ready`` are served on (once :meth:`run` started)."""
        return self._health_port

    @property
    def consumer(self) -> Consumer:
        """The underlying ``confluent_kafka.Consumer`` (do not commit or store through it)."""
        return self._consumer

    def __repr__(self) -> str:
        return self._redact(
            f"<ResilientConsumer group={self.group_id!r} topics={self._topics!r} "
            f"processed={self._state.processed} dead_lettered={self._offsets.dead_lettered}>"
        )
