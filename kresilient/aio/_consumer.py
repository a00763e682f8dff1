"""AsyncResilientConsumer: an ``async def`` handler per record, committed only once handled.

Threads: every call into librdkafka (consume, store_offsets, pause/resume, commit, close, and
the rebalance callbacks they run) happens on ONE worker thread, as
``confluent_kafka.aio.AIOConsumer`` does; the event loop runs the handlers. The loop keeps
polling while handlers await, so a handler may await longer than ``max.poll.interval.ms``
without a rebalance; a partition whose buffer fills (a slow handler, a retry wait) is paused,
not left unpolled.

Offsets: a partition's records are handled one at a time, in order; the offset after a record
is stored (``enable.auto.offset.store=false``) only once its handler returned or its dead
letter was acknowledged, and stored offsets are committed by librdkafka in the background,
synchronously on revoke and on shutdown. Nothing is ever stored past an unfinished handler.
With ``ordering="key"``/``"none"`` (issue 40) many records of a partition are in flight, each
an asyncio task, under the sync consumer's window (:mod:`kresilient.aio._keyed`): the lowest
unfinished offset is stored and committed with the finished records above it in the metadata.

Why not ``AIOConsumer`` itself: its rebalance callbacks must be coroutines run through
``run_coroutine_threadsafe`` from the executor thread, and each call is a separate executor
round trip; one step function per poll (store + pause/resume + consume) on a worker thread of
our own costs one round trip per batch. See docs/asyncio.md.

Probes: ``health_port`` serves ``GET /live`` and ``GET /ready`` with the sync consumer's
implementation (:class:`kresilient.consumer.ConsumerProbes`: same options, reasons and gauges);
this module only tells it its state (:class:`_ProbeSource`). The worker thread updates the
figures at each step (lag from cached watermarks, once a second).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import itertools
import signal
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any, Final, Literal

import structlog
import tenacity
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kresilient._ratelimit import RateLimiter
from kresilient._watchdog import bounded_call
from kresilient.aio._keyed import ORDERINGS, KeyedRunner, Ordering
from kresilient.aio._producer import AsyncResilientProducer
from kresilient.aio._signals import install_loop_signals, restore_loop_signals
from kresilient.aio._transactional import TransactionalRunner
from kresilient.config import consumer_config
from kresilient.consumer import (
    FATAL_CONSUME_CODES,
    ON_STALL,
    OUTAGE_RETRY,
    CircuitBreaker,
    ConsumerHealth,
    ConsumerProbes,
    OutageDecision,
    OutageDetector,
    RetryPolicy,
    TransactionPolicy,
    is_outage,
    outage_classification,
    poison,
    positions_ahead,
    retire_client,
)
from kresilient.deadletter import (
    CircuitBreakerPolicy,
    DeadLetterPolicy,
    DeadLetterRecord,
    DeadLetterWriter,
    build_dead_letter_record,
)
from kresilient.dedupe import Deduplicator, record_id
from kresilient.errors import (
    CircuitBreakerOpenError,
    Classification,
    ConfigError,
    ConsumeError,
    DeadLetterError,
    ProduceError,
    classify,
    translate,
)
from kresilient.leadership import LeadershipMonitor
from kresilient.producer import ResilientProducer
from kresilient.reachability import LogBridge, Reachability, client_certificate
from kresilient.redaction import Redactor
from kresilient.telemetry import Telemetry

__all__ = ["AsyncResilientConsumer"]

AsyncHandler = Callable[[Message], Awaitable[object]]
TP = tuple[str, int]
#: A worker-thread step's operations: offsets to store, partitions to pause, to resume, idle
#: partitions to move to their position, and (ordering="key"/"none") offsets with their
#: finished-record lists to store and commit.
_Ops = tuple[
    list[TopicPartition],
    list[TopicPartition],
    list[TopicPartition],
    list[TopicPartition],
    list[TopicPartition],
]
#: (topic, kresilient.message.id): the key of the dedupe window
_Id = tuple[str, bytes]

#: Seconds the start-up metadata request (dead-letter topics exist?) may take.
_METADATA_TIMEOUT_S: Final = 30.0
#: The start-up metadata request is made in slices this long, librdkafka's callbacks served
#: in between: a refused login is named within a slice, not at _METADATA_TIMEOUT_S.
_METADATA_SLICE_S: Final = 1.0
#: error_cb codes that say the cluster refused the credentials or the certificate, and
#: connection failures (whose text may be a refused TLS handshake).
_REFUSAL_CODES: Final = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
_CONNECT_CODES: Final = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
#: At most this long the poll loop waits for handlers to work through a batch.
_DRAIN_WAIT_S: Final = 0.05
#: Records consumed per step (one worker-thread round trip).
_BATCH: Final = 500
#: consume() timeouts of a step while records flow / when idle.
_FLOWING_WAIT_S: Final = 0.01
_IDLE_WAIT_S: Final = 0.1
#: Records a partition's worker handles per turn of the concurrency semaphore.
_RUN: Final = 64
#: A partition with this many records waiting is paused until it is down to half.
_MAX_BUFFERED: Final = 2_000
#: Same replay remedy as the sync consumer's POISON (duplicate of consumer/_failures.poison).
_DEAD_LETTER_RETRY_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0)
#: Verdicts of the dedupe gate.
_HANDLE: Final = 0
_SKIP: Final = 1
_STOP: Final = 2
#: Records after a held one tried as probes when each proves nothing (poison, a duplicate),
#: as the sync consumer's _MAX_PROBES.
_MAX_PROBES: Final = 10
#: Characters of an exception's (redacted) text in the outage and final-failure lines.
_ERROR_TEXT: Final = 500


class _Partition:
    """One assigned partition: its buffered records and its (single) worker task."""

    __slots__ = (
        "ahead",
        "cut",
        "due",
        "halt",
        "held",
        "hold",
        "inhand",
        "last",
        "paused",
        "queue",
        "record",
        "revoked",
        "slot",
        "task",
        "tp",
    )

    def __init__(self, tp: TP) -> None:
        self.tp = tp
        self.queue: collections.deque[Message] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        # the last record handled (or dead-lettered) in order: its offset + 1 is stored next
        # (kept as the message, so the hot path makes no offset() call per record)
        self.last: Message | None = None
        # a retry wait or an unacknowledged dead letter: paused once a record is queued
        self.held = False
        self.hold: tuple[int, int] = (0, 0)  # (offset, attempts) of the held record
        self.due = 0.0  # monotonic time the held record's next attempt is due (/ready)
        # the record whose handler is in hand, None between runs (/ready samples it)
        self.inhand: Message | None = None
        # a probe handled out of turn, still queued: stored (not handled) in its turn
        self.ahead: Message | None = None
        self.paused = False
        self.revoked = False
        # revoked, lost, or the consumer stopping or failed: the one flag the worker checks
        # per record (set with revoked, by stop() and when _error is set)
        self.halt = False
        self.cut = asyncio.Event()  # set (on the loop) by stop/revoke: ends retry waits
        # the worker holds a concurrency slot: released once, by whoever holds it (a wait
        # that gives it up and is cancelled while taking it back does not hold it)
        self.slot = False
        # the state of ONE record (ordering="key"/"none"), not of a partition's worker
        self.record = False


class AsyncResilientConsumer:
    """Consume with an ``async def`` handler; commit only what was handled or dead-lettered.

    Args:
        config: confluent-kafka consumer configuration (never mutated; ``group.id``
            required). Same rules as :class:`~kresilient.ResilientConsumer`: settings that
            would commit unprocessed records are refused, naming the key
            (:class:`~kresilient.UnsafeConfigError`) unless listed in ``allow_unsafe``.
        topics: topics to subscribe to.
        handler: ``async def handler(msg)``; returning = handled. An exception is retried
            under ``retry`` (the partition paused, the consumer polling on), then the record
            is dead-lettered. A plain function is refused with ``TypeError``.
        retry: a :class:`~kresilient.RetryPolicy` (tenacity stop/wait/retry).
        outage_retry: a bad record or a bad dependency? As in
            :class:`~kresilient.ResilientConsumer` (docs/consumer.md, "Bad record or bad
            dependency"): distinct records failing in a row with a retriable error and no
            success between is a dependency outage; each record it holds is retried under
            this policy (default :data:`~kresilient.OUTAGE_RETRY`: backoff to 10 s, 10
            minutes per record), nothing is dead-lettered meanwhile; ``health().outage``
            reports it. A record whose ``retry`` is exhausted with no success anywhere since
            its first failure is kept (uncommitted) while the next record of its partition is
            tried (the probe). ``None``: every failure is the record's (dead-lettered once
            ``retry`` is exhausted).
        dead_letter: a :class:`~kresilient.DeadLetterPolicy`, or ``None`` to stop (raise)
            instead of dead-lettering.
        circuit_breaker: a :class:`~kresilient.CircuitBreakerPolicy`; when it opens,
            :meth:`run` commits what was handled and raises
            :class:`~kresilient.CircuitBreakerOpenError`.
        max_concurrency: handlers running at once across partitions (default 1). Each
            partition always has at most one, so per-partition order is kept.
        ordering: how many records of ONE partition are handled at once (docs/parallel.md,
            issue 40), as :class:`~kresilient.ResilientConsumer`'s: ``"partition"`` (the
            default: one at a time, in order), ``"key"`` (records with the same key one at a
            time, in offset order; different keys at once, each an asyncio task; keyless
            records are ordered among themselves like one key) or ``"none"`` (any records at
            once). With ``"key"``/``"none"`` the committed offset is the lowest unfinished
            record, the finished ones above it are listed in the commit metadata and a
            member taking the partition over skips them; a retry waits only its key;
            ``max_concurrency`` must stay 1 (``max_in_flight`` bounds the handlers).
        max_in_flight, max_in_flight_bytes: the window per partition for ``"key"``/``"none"``
            (records and bytes admitted: running or waiting for a retry); a full window
            pauses the partition while polling goes on. ``max_in_flight`` also bounds the
            handlers running at once across partitions, as the sync consumer's thread pool.
        in_flight_metadata: list the finished records above the committed offset in its
            metadata (``False``: a restart redoes everything above it; tests' control).
        dead_letter_producer: the application's own client for dead letters, not closed by
            this consumer: an :class:`~kresilient.aio.AsyncResilientProducer` (awaited on the
            loop), a :class:`~kresilient.ResilientProducer` or a
            :class:`~kresilient.deadletter.DeadLetterWriter` (both called off the loop).
            Records are written byte for byte (``propagate=False``: no trace header added).
            Default: a ``DeadLetterWriter`` made from ``config`` (acks=all, idempotent).
        dead_letter_producer_config: overrides for the dead-letter producer
            (see :func:`kresilient.deadletter.dead_letter_producer_config`).
        blocking_warning_s: a handler step that holds the event loop longer than this logs
            ``handler_blocked_event_loop`` (WARNING) naming the handler; ``None`` turns the
            step timing off (one clock read a record, about 0.06 µs).
        shutdown_timeout: seconds a shutdown (stop, SIGTERM, cancellation) or a revoke waits
            for the handlers in hand before leaving their records uncommitted; also the bound
            of librdkafka's final close (its commit and leaving the group): past it the close
            is left to a daemon thread and one ``close_timed_out`` WARNING says so.
        handle_signals: on :meth:`run` in the main thread, SIGTERM/SIGINT stop the consumer
            gracefully; a 2nd signal while handlers are in hand interrupts them (their
            records uncommitted, ``run()`` raises ``KeyboardInterrupt``), a 3rd aborts the
            shutdown, as :class:`~kresilient.ResilientConsumer` (handlers restored at exit).
        dedupe: a :class:`~kresilient.dedupe.Deduplicator`, as
            :class:`~kresilient.ResilientConsumer`'s: a record marked
            ``kresilient.possible.duplicate: true`` whose ``kresilient.message.id`` is in its
            window of ids handled (handler returned) is skipped without awaiting the handler;
            its offset is stored like a handled one's (in partition order), it is counted in
            ``health().duplicates_skipped`` and logged at DEBUG (``duplicate_skipped``) with
            its id. Unmarked records are never skipped. A marked record whose id another
            partition's handler has in hand (``max_concurrency>1``, or a retry wait) waits for
            that handler first, so two copies are never handled at once.
        logger, tracer_provider, meter_provider, propagator, record_message_key: as
            :class:`~kresilient.ResilientConsumer`.
        health_port: serve ``GET /live`` and ``GET /ready`` on this port while :meth:`run`
            runs (0: any free port, see :attr:`health_port`); ``None``: no server. The sync
            consumer's probes (docs/consumer.md, "Probes and lag"): ``/live`` is 503 once the
            consumer has not polled for ``max.poll.interval.ms`` (an event loop blocked by a
            handler) or stopped; ``/ready`` is 503 until the group is joined, during a
            dependency outage, and when a handler, a retry wait or a partition with lag made
            no progress for ``stall_after_s``. The meter provider gets the same gauges
            (``messaging.kafka.consumer.lag``, ``kresilient.consumer.time_since_progress``,
            ``kresilient.consumer.dependency_outage``, ``...duplicates_skipped``).
        health_host: the address the probe server binds (127.0.0.1 by default; a Kubernetes
            probe needs the pod's address, e.g. ``"0.0.0.0"``).
        stall_after_s: ``/ready`` turns 503 when a handler runs, a retry wait is overdue, or
            a partition with lag makes no progress (or its fetch is not answered) for this
            long; one ``consumer_stalled`` WARNING says so (docs/stalls.md).
        on_stall: ``"report"`` (default) or ``"heal"``: as
            :class:`~kresilient.ResilientConsumer`'s: on a ``progress`` or ``assignment`` stall
            with nothing in hand (no handler running, no record held by a retry, an outage or a dead
            letter) or a rebalance loop, the librdkafka consumer is recreated between two
            steps of the worker thread (the old one commits what was stored and closes in a
            daemon thread, waited for at most 5 s), one ``consumer_recreated`` WARNING.
        transactions: a :class:`~kresilient.TransactionPolicy`: consume-transform-produce
            exactly once (docs/asyncio.md, "Exactly once: transactions="). The handler returns
            its :class:`~kresilient.Output` records; they, the dead letters and the consumed
            offsets commit in one Kafka transaction, as with
            :class:`~kresilient.ResilientConsumer`'s ``transactions=``, whose engine runs in a
            worker thread and awaits the handler on the caller's loop (retries redo the
            transaction, dead letters are written in it). A handler cut short (past
            ``shutdown_timeout`` after a stop or a cancellation, a second signal, its loop
            closed or not running for longer than ``shutdown_timeout``) aborts the open
            transaction: its records are handled again by the next owner. ``health()`` is
            the sync engine's (``health().transactions``); the counters on this object are
            copied from it when :meth:`run` ends. Refused
            (:class:`~kresilient.ConfigError` naming the argument): ``ordering`` other than
            ``"partition"``, ``max_concurrency`` other than 1, ``dead_letter_producer`` and
            ``dead_letter_producer_config`` (dead letters are written by the transaction's
            producer: ``TransactionPolicy(producer_config=)``), and
            ``isolation.level=read_uncommitted``.
        max_process_deaths, crash_probe_records: crash-loop protection, with
            ``transactions=`` only (:class:`~kresilient.ResilientConsumer`'s, passed to its
            engine): a record during whose handling the process died ``max_process_deaths``
            times is dead-lettered (``kresilient.error.category=crash_loop``) at the next
            start without awaiting the handler; after an unclean end the first
            ``crash_probe_records`` records of a partition are handled with a marker
            committed before each call (docs/transactions.md). ``None``: off. Without
            ``transactions=`` the asyncio consumer has no crash-loop protection: a value
            other than the default is refused (:class:`~kresilient.ConfigError` naming it),
            except ``max_process_deaths=None`` (off: what happens).

    Example::

        async def handle(msg):
            await save(json.loads(msg.value()))   # ValueError -> dead-lettered at once

        consumer = AsyncResilientConsumer(
            {"bootstrap.servers": BOOTSTRAP, "group.id": "orders"}, ["orders"], handle)
        await consumer.run()      # until SIGTERM, consumer.stop() or task cancellation
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        handler: AsyncHandler,
        *,
        allow_unsafe: Iterable[str] = (),
        retry: RetryPolicy | None = None,
        outage_retry: RetryPolicy | None = OUTAGE_RETRY,
        dead_letter: DeadLetterPolicy | None = DeadLetterPolicy(),  # noqa: B008 (frozen)
        circuit_breaker: CircuitBreakerPolicy | None = CircuitBreakerPolicy(),  # noqa: B008
        max_concurrency: int = 1,
        ordering: Ordering = "partition",
        max_in_flight: int = 64,
        max_in_flight_bytes: int = 64 << 20,
        in_flight_metadata: bool = True,
        dead_letter_producer: AsyncResilientProducer
        | ResilientProducer
        | DeadLetterWriter
        | None = None,
        dead_letter_producer_config: Mapping[str, Any] | None = None,
        blocking_warning_s: float | None = 0.5,
        shutdown_timeout: float = 30.0,
        handle_signals: bool = True,
        logger: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        propagator: Any = None,
        record_message_key: bool = False,
        dedupe: Deduplicator | None = None,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        stall_after_s: float = 60.0,
        on_stall: Literal["report", "heal"] = "report",
        transactions: TransactionPolicy | None = None,
        max_process_deaths: int | None = 3,
        crash_probe_records: int = 20,
    ) -> None:
        if on_stall not in ON_STALL:
            raise ConfigError(
                f"on_stall must be 'report' or 'heal', not {on_stall!r}", key="on_stall"
            )
        if dedupe is not None and not isinstance(dedupe, Deduplicator):
            raise ConfigError(
                f"dedupe must be a kresilient.dedupe.Deduplicator, got {type(dedupe).__name__} "
                "(e.g. dedupe=Deduplicator(window=1_000_000))",
                key="dedupe",
            )
        self._dedupe = dedupe
        # ids whose handler is in hand (dedupe only): a marked copy on another partition waits
        # for it instead of being handled at the same time
        self._inflight: dict[_Id, asyncio.Future[None]] = {}
        self.duplicates_skipped = 0
        if not _is_async(handler):
            name = getattr(handler, "__qualname__", type(handler).__qualname__)
            raise TypeError(
                f"handler {name!r} is not an async function: AsyncResilientConsumer awaits "
                "`handler(msg)`; define it with `async def` (or use ResilientConsumer for a "
                "plain function)"
            )
        # ---- transactions= (issue 41): the sync transactional engine drives the handler
        # (kresilient/aio/_transactional.py); run(), stop(), health() and health_port delegate
        self._txn: TransactionalRunner | None = None
        if transactions is not None:
            self._topics = [topics] if isinstance(topics, str) else list(topics)
            self._txn = TransactionalRunner(
                config,
                self._topics,
                handler,
                transactions=transactions,
                handler_name=getattr(handler, "__qualname__", type(handler).__qualname__),
                max_concurrency=max_concurrency,
                ordering=ordering,
                dead_letter_producer=dead_letter_producer,
                dead_letter_producer_config=dead_letter_producer_config,
                blocking_warning_s=blocking_warning_s,
                shutdown_timeout=shutdown_timeout,
                handle_signals=handle_signals,
                logger=logger,
                allow_unsafe=allow_unsafe,
                retry=retry if retry is not None else RetryPolicy(),
                outage_retry=outage_retry,
                dead_letter=dead_letter,
                circuit_breaker=circuit_breaker,
                max_in_flight=max_in_flight,
                max_in_flight_bytes=max_in_flight_bytes,
                in_flight_metadata=in_flight_metadata,
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                propagator=propagator,
                record_message_key=record_message_key,
                dedupe=dedupe,
                health_port=health_port,
                health_host=health_host,
                stall_after_s=stall_after_s,
                on_stall=on_stall,
                max_process_deaths=max_process_deaths,
                crash_probe_records=crash_probe_records,
            )
            sync = self._txn.consumer
            self.group_id: str = sync.group_id
            self.client_id: str = sync.client_id
            # counters as health() reports them, copied when run() ends
            self.processed = self.dead_lettered = self.retries = self.blocked_warnings = 0
            self.commit_failures = 0
            return
        # crash-loop protection is the sync engine's, built only with transactions=: a value
        # set here would do nothing (None, protection off, is what happens and is accepted)
        for key, value, default in (
            ("max_process_deaths", max_process_deaths, 3),
            ("crash_probe_records", crash_probe_records, 20),
        ):
            if value != default and not (key == "max_process_deaths" and value is None):
                raise ConfigError(
                    f"{key}={value!r} applies only with transactions=: the asyncio consumer "
                    "without transactions has no crash-loop protection (remove it, or use "
                    "ResilientConsumer)",
                    key=key,
                )
        # ---- end of transactions=
        # the ordering's refusals first: ordering="key" with max_concurrency=0 is the
        # combination KR073 names (ConfigError), not a bare bound
        _check_ordering(ordering, max_in_flight, max_in_flight_bytes, max_concurrency)
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {max_concurrency}")
        if isinstance(topics, str):
            topics = [topics]
        self._topics = list(topics)
        if not self._topics:
            raise ValueError("topics must name at least one topic")
        # one literal topic: every record is of it (the fast path of _dispatch)
        self._single_topic: str | None = (
            self._topics[0]
            if len(self._topics) == 1 and not self._topics[0].startswith("^")
            else None
        )
        base_log = logger if logger is not None else structlog.get_logger("kresilient.aio")
        allow = tuple([allow_unsafe] if isinstance(allow_unsafe, str) else allow_unsafe)
        cfg = consumer_config(config, allow_unsafe=allow, logger=base_log)
        if not cfg.get("group.id"):
            raise ConfigError(
                "group.id is required (offsets are committed for a group)", key="group.id"
            )
        self._scrub: Callable[[str], str] = Redactor.for_config(cfg)
        self._cfg = cfg
        self.group_id = str(cfg["group.id"])
        self.client_id = str(cfg.get("client.id", ""))
        self._log = base_log.bind(
            client_id=self.client_id, group=self.group_id, kafka_role="consumer"
        )
        self._handler = handler
        self._handler_name = getattr(handler, "__qualname__", type(handler).__qualname__)
        self._retry = retry if retry is not None else RetryPolicy()
        # record or dependency (kresilient.consumer.OutageDetector, the sync consumer's own):
        # one per consumer, used on the loop only; None: every failure is the record's
        self._outage_retry = outage_retry
        self._detector: OutageDetector | None = (
            OutageDetector() if outage_retry is not None else None
        )
        # set (and replaced) when an outage ends: cuts short the waits of the records it held
        self._outage_over: asyncio.Event | None = None
        self._dead_letter = dead_letter
        self._breaker = CircuitBreaker(circuit_breaker) if circuit_breaker is not None else None
        self._max_concurrency = max_concurrency if ordering == "partition" else max_in_flight
        # None: no step timing (saves a clock read a record; blocking handlers go unnoticed)
        self._timing = blocking_warning_s is not None
        self._blocking_threshold = float(blocking_warning_s or 0.0)
        self._shutdown_timeout = float(shutdown_timeout)
        self._handle_signals = handle_signals
        self._dlq_overrides = dead_letter_producer_config
        # the application's own client for dead letters (not closed here)
        self._user_dlq = dead_letter_producer
        self._dlq_config = config
        self._allow = allow
        self._tel = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=propagator,
            client_id=self.client_id,
            consumer_group=self.group_id,
            record_message_key=record_message_key,
            redactor=self._scrub,
            logger=self._log,
        )
        # the user's own librdkafka callbacks run after kresilient's
        self._user_cb: dict[str, Callable[..., Any] | None] = {
            name: cfg.pop(name, None) for name in ("error_cb", "stats_cb", "on_commit", "logger")
        }
        max_age = cfg.get("metadata.max.age.ms")
        self._monitor = LeadershipMonitor(
            metadata_max_age_ms=int(max_age) if max_age is not None else None, logger=self._log
        )
        self._monitor.add_listener(self._tel.leadership_listener())
        # a refused login (wrong password, CA) ends run() naming it, as in ResilientConsumer
        self._reach = Reachability(self._log, certificate=client_certificate(cfg))
        # error_cb lines, one per error code per interval (suppressed=N on the next one), as
        # ResilientConsumer logs them; connection failures are summarised by _reach instead
        self._limiter = RateLimiter()
        self._rebalances = {"assigned": 0, "revoked": 0, "lost": 0}
        self.commit_failures = 0
        self._last_commit_error: str | None = None
        self._dead_letters_pending = 0
        self._parts: dict[TP, _Partition] = {}
        self._stop = False
        self._failure: BaseException | None = None
        self._running = False
        self._ran = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._consumer: Consumer | None = None
        self._writer: DeadLetterWriter | None = None
        self._kx = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="kresilient-aio-consumer"
        )
        self._sem: asyncio.Semaphore | None = None
        self.processed = 0
        self._credited = 0  # of `processed`, credited to the breaker
        self.dead_lettered = 0
        self.retries = 0
        self.blocked_warnings = 0
        # the heartbeat of the blocking warning (loop.time() values)
        self._beat_period = max(self._blocking_threshold / 4, 0.005)
        self._beat_at = 0.0
        self._beat_due = 0.0
        self._beat_late = 0.0
        self._beat_handle: asyncio.TimerHandle | None = None
        self._traced = False
        self._queued = 0  # records waiting in partition queues (all partitions)
        self._flowing = False  # the last consume returned records (worker thread only)
        self._advance_due = 0.0  # next check of idle partitions' positions (loop only)
        self._closing = False
        self._previous_signals: dict[signal.Signals, Any] = {}
        # SIGTERM/SIGINT as ResilientConsumer's SignalHandlers count them (issue 37 #8): the
        # 1st stops, a 2nd while handlers are in hand interrupts them (cancelled, their records
        # uncommitted, never retried or dead-lettered), a 2nd later is only logged, a 3rd
        # aborts the shutdown (no final commit, no close; run() raises KeyboardInterrupt)
        self._signals_received = 0
        self._signal_interrupted = False
        self._aborted = False
        self._committing = False  # the shutdown is past the handlers (commit and close)
        self._run_task: asyncio.Task[Any] | None = None
        self._commit_interval = float(cfg.get("auto.commit.interval.ms", 5000)) / 1000.0
        self._next_commit = 0.0
        # offsets stored since the last interval commit (worker thread only)
        self._unsynced = False
        self._auto_commit = str(cfg.get("enable.auto.commit", "true")).lower() in ("true", "1")
        self._drained = asyncio.Event()  # binds to the loop on first use (3.10+)
        # /live, /ready and the gauges: the sync consumer's implementation (its consumer is
        # set once created); the worker thread updates it at each step
        self._stored: dict[TP, int] = {}  # offsets stored, per partition (worker thread)
        self._probe_source = _ProbeSource(self)
        self._probes = ConsumerProbes(
            None,
            self._probe_source,
            stall_after_s=stall_after_s,
            max_poll_s=ConsumerProbes.max_poll_interval(cfg),
            group=self.group_id,
            outage=self._detector,
            log=self._log,
            redact=self._scrub,
            on_stall=on_stall,
            fetch_wait_s=float(cfg.get("fetch.wait.max.ms", 500)) / 1000.0,
        )
        self._generation = 0  # of the librdkafka consumer: each heal makes a new one
        self._meter_provider = meter_provider
        self._health_addr = (health_host, health_port)
        self._health_port: int | None = None
        self._next_tick = 0.0
        # ordering="key"/"none": the windows and the record tasks (None: one at a time)
        self._keyed: KeyedRunner | None = None
        # per partition, the state of each of its records in hand that failed once (its
        # retries, outage hold, dead letter): a revoke marks them revoked
        self._recs: dict[TP, set[_Partition]] = {}
        # positions of idle windows' partitions (worker thread: written in a step, read by
        # the loop before the next one)
        self._ahead: dict[TP, int] = {}
        # ordering="key"/"none" during a dependency outage: the held record tried next (one
        # at a time, each time the next one, as the sync runner), the others in line
        self._prober: _Partition | None = None
        self._probe_line: collections.deque[_Partition] = collections.deque()
        self._probe_turn: asyncio.Event | None = None  # set when the turn passes
        if ordering != "partition":
            self._keyed = KeyedRunner(
                ordering=ordering,
                max_records=max_in_flight,
                max_bytes=max_in_flight_bytes,
                metadata=in_flight_metadata,
                run_record=self._keyed_record,
                may_start=self._may_start,
                commit_interval=min(self._commit_interval, 1.0),
                log=self._log,
                redact=self._scrub,
            )

    # ------------------------------------------------------------------ public API

    def stop(self) -> None:
        """Ask :meth:`run` to finish: the records in hand complete, what was handled is
        committed, the group is left. Safe from any thread and from signal handlers."""
        if self._txn is not None:
            self._txn.stop()
            return
        self._stop = True
        self._halt_all()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._cut_all)

    @property
    def _error(self) -> BaseException | None:
        """What :meth:`run` raises; setting it halts every partition's worker."""
        return self._failure

    @_error.setter
    def _error(self, exc: BaseException | None) -> None:
        self._failure = exc
        if exc is not None:
            self._halt_all()

    def _halt_all(self) -> None:
        # any thread: list() copies the values atomically (no Python code runs meanwhile)
        for part in list(self._parts.values()):
            part.halt = True

    def health(self) -> ConsumerHealth:
        """A snapshot for health endpoints: the :class:`~kresilient.consumer.ConsumerHealth`
        of :class:`~kresilient.ResilientConsumer` (counts, held partitions, rebalances,
        commit failures, circuit breaker, leadership). Cheap and non-blocking: call it on the
        loop (or from another thread)."""
        if self._txn is not None:  # the sync engine's, with health().transactions
            return self._txn.health()
        for _ in range(10):  # another thread may change the dicts while we copy them
            try:
                return self._health()
            except RuntimeError:
                continue
        return self._health()

    @property
    def health_port(self) -> int | None:
        """The port ``/live`` and ``/ready`` are served on while :meth:`run` runs (the one
        picked when ``health_port=0``); ``None`` without a server or before :meth:`run`."""
        if self._txn is not None:
            return self._txn.consumer.health_port
        return self._health_port

    def _health(self) -> ConsumerHealth:
        breaker = self._breaker
        return ConsumerHealth(
            group_id=self.group_id,
            client_id=self.client_id,
            running=self._running,
            stopping=self._stop and self._running,
            processed=self.processed,
            duplicates_skipped=self.duplicates_skipped,
            retries=self.retries,
            dead_lettered=self.dead_lettered,
            dead_letters_pending=self._dead_letters_pending,
            held_partitions=[
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "offset": part.hold[0],
                    "attempts": part.hold[1],
                    "resumed": False,
                }
                for tp, part in self._held_states()
            ],
            rebalances=dict(self._rebalances),
            commit_failures=self.commit_failures,
            last_commit_error=self._last_commit_error,
            circuit_breaker=breaker.snapshot() if breaker is not None else None,
            leadership=self._monitor.snapshot(),
            outage=self._detector.snapshot() if self._detector is not None else None,
            **self._probes.stall_fields(),
        )

    def _held_states(self) -> list[tuple[TP, _Partition]]:
        """Each state waiting for a retry or a dead letter's acknowledgement: a partition's
        (one at a time), or a record's (ordering="key"/"none": several per partition)."""
        held = [(tp, part) for tp, part in list(self._parts.items()) if part.held]
        for tp, recs in list(self._recs.items()):
            held += [(tp, rec) for rec in list(recs) if rec.held]
        return held

    def _cut_all(self) -> None:
        for part in list(self._parts.values()):
            part.cut.set()

    async def run(self) -> None:
        """Consume until :meth:`stop`, SIGTERM/SIGINT or cancellation; then shut down cleanly.

        Signals (``handle_signals``): the first stops; a second while handlers are still in
        hand cancels them (their records stay uncommitted, never retried or dead-lettered
        because of it) and ``run()`` raises ``KeyboardInterrupt`` after committing what was
        handled; a second later in the shutdown is only logged; a third aborts the shutdown
        (no final commit, no close; ``KeyboardInterrupt``).

        Raises :class:`~kresilient.CircuitBreakerOpenError` when the breaker opens, the
        handler's exception when ``dead_letter=None`` and a record exhausted its retries, or a
        fatal consumer error; in every case after committing what was handled. Re-raises
        ``CancelledError`` after the same shutdown when cancelled. One call per instance.
        With ``transactions=``: the same, and :class:`~kresilient.ProducerFencedError` when
        another instance took the ``transactional_id``.
        """
        if self._txn is not None:
            try:
                await self._txn.run()
            finally:
                self._copy_counters(self._txn)
            return
        if self._running or self._ran:
            raise RuntimeError("run() can be called once per AsyncResilientConsumer")
        self._running = self._ran = True
        loop = self._loop = asyncio.get_running_loop()
        self._run_task = asyncio.current_task()
        self._sem = asyncio.Semaphore(self._max_concurrency)
        signals = self._install_signals(loop)
        cancelled: asyncio.CancelledError | None = None
        pending: asyncio.Future[list[Message]] | None = None
        if self._timing:
            self._beat_due = loop.time()
            self._heartbeat()
        try:
            await self._kafka(self._open)
            self._serve_probes()
            while not self._stop and self._error is None:
                self._traced = self._tel.enabled  # a provider set late is picked up here
                self._credit_breaker()
                remedy = self._probes.remedy
                if pending is None and remedy is not None and self._may_heal():
                    await self._kafka(self._heal, *remedy)
                if pending is None:
                    pending = loop.run_in_executor(self._kx, self._step, self._pending_ops())
                batch = await pending
                pending = None
                self._dispatch(batch)
                if self._queued:
                    # Let the handlers work through the batch before the next consume, but
                    # never longer than _DRAIN_WAIT_S: polling must go on while handlers
                    # await (then the next step runs while they do, storing what was handled
                    # so far, never past a handler). Fast handlers thus never share the GIL
                    # with a consume() building the next batch's messages, and the step after
                    # them stores the whole batch.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._drained.wait(), _DRAIN_WAIT_S)
        except asyncio.CancelledError as exc:
            cancelled = exc
        finally:
            if pending is not None:  # its records are dropped: uncommitted, read again
                pending.add_done_callback(_retrieve)
            try:
                # signals stay ours through the shutdown: a 2nd interrupts the handlers it
                # waits for, a 3rd aborts it
                await self._shutdown()
            finally:
                self._restore_signals(loop, signals)
                if self._beat_handle is not None:
                    self._beat_handle.cancel()
        if cancelled is not None:
            raise cancelled
        if self._signal_interrupted:
            # as ResilientConsumer: a 2nd signal interrupted a handler (after the shutdown
            # committed what was handled and left the group)
            raise KeyboardInterrupt
        if self._error is not None:
            raise self._error

    def _serve_probes(self) -> None:
        """Mark the probes running (polled: live), register the gauges, start the server."""
        probes = self._probes
        probes.last_poll = time.monotonic()
        probes.running = True
        probes.register_metrics(self._meter_provider)
        host, port = self._health_addr
        if port is not None:
            self._health_port = probes.serve(host, port)
            self._log.info("health_probes_serving", host=host, port=self._health_port)

    # ------------------------------------------------------------------ the worker thread

    async def _kafka(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self._loop is not None
        return await self._loop.run_in_executor(self._kx, fn, *args)

    def _client_conf(self, generation: int) -> dict[str, Any]:
        conf = dict(self._cfg)
        conf["error_cb"] = self._on_error
        conf["stats_cb"] = self._stats_cb(generation)
        conf["on_commit"] = self._on_commit
        # librdkafka's log lines through structlog, redacted, connection failures summarised
        # (never raw "%3|...|FAIL|" lines on stderr); the application's logger gets them too
        conf["logger"] = LogBridge(
            self._log,
            self._monitor.on_log,
            self._scrub,
            user_logger=self._user_cb["logger"],
            reachability=self._reach,
        )
        return conf

    def _open(self) -> None:
        conf = self._client_conf(self._generation)
        try:
            self._consumer = Consumer(conf)
        except KafkaException as exc:
            raise translate(exc, operation="configure", redactor=self._scrub) from None
        self._probes.consumer = self._consumer
        policy = self._dead_letter
        if policy is not None and policy.require_topic:
            self._check_dead_letter_topics(self._consumer, policy)
        self._subscribe(self._consumer)
        self._log.debug("consumer_started", topics=self._topics)

    def _subscribe(self, consumer: Consumer) -> None:
        """Subscribe ``consumer``; its rebalance callbacks are ignored once a heal replaced
        it (the old one's revoke at its close in the background must not touch the new
        member's partitions; confluent-kafka unassigns by itself)."""
        generation = self._generation

        def current(
            callback: Callable[[Consumer, list[TopicPartition]], None],
        ) -> Callable[[Consumer, list[TopicPartition]], None]:
            def guarded(client: Consumer, partitions: list[TopicPartition]) -> None:
                if generation == self._generation:
                    callback(client, partitions)

            return guarded

        consumer.subscribe(
            self._topics,
            on_assign=current(self._on_assign),
            on_revoke=current(self._on_revoke),
            on_lost=current(self._on_lost),
        )

    def _check_dead_letter_topics(self, consumer: Consumer, policy: DeadLetterPolicy) -> None:
        """Fail fast when a dead-letter topic is missing (not at the first poison record).

        DUPLICATE (minimal) of ResilientConsumer._check_dead_letter_topics (private there).
        """
        wanted = sorted({policy.topic_for(t) for t in self._topics if not t.startswith("^")})
        if not wanted:
            return
        deadline = time.monotonic() + _METADATA_TIMEOUT_S
        while True:
            try:
                metadata = consumer.list_topics(timeout=_METADATA_SLICE_S)
                break
            except KafkaException as exc:
                consumer.poll(0)  # error_cb: a refused login ends the wait (not subscribed yet)
                if self._error is not None:
                    raise self._error from None
                if time.monotonic() < deadline and classify(exc).retriable:
                    continue
                raise translate(exc, operation="consume", redactor=self._scrub) from None
        self._reach.connected()
        missing = [
            t for t in wanted if t not in metadata.topics or metadata.topics[t].error is not None
        ]
        if missing:
            raise ConfigError(
                f"dead-letter topic(s) {missing} do not exist: create them (replicated like "
                "the source topics, e.g. `kresilient topic create NAME --dlq`) or pass "
                "DeadLetterPolicy(require_topic=False)",
                key=None,
            )

    def _step(self, ops: _Ops) -> list[Message]:
        """On the worker thread: store offsets, pause/resume, then consume one batch."""
        consumer = self._consumer
        assert consumer is not None
        probes = self._probes
        probes.last_poll = now = time.monotonic()
        if now >= self._next_tick:  # lag and progress, about once a second
            self._next_tick = now + 1.0
            self._probe_source.sample(now)
            probes.tick(now)
        store, pause, resume, idle, keyed = ops
        self._store(store)
        if keyed:
            # ordering="key"/"none": the lowest unfinished offsets with their lists of
            # finished records, stored (an auto-commit carries the same metadata) and
            # committed once per interval
            self._store(keyed)
            try:
                consumer.commit(offsets=keyed, asynchronous=True)
            except KafkaException as exc:
                self._log.warning("commit_failed", reason="in_flight", error=self._scrub(str(exc)))
        if idle and self._keyed is not None:
            # positions past the stored offsets of idle windows (a transaction's markers at a
            # partition's end): the loop moves the windows there (KeyedRunner.advance)
            self._ahead = positions_ahead(
                consumer, [(p.topic, p.partition) for p in idle], {}, self._log, self._scrub
            )
        elif idle:
            ahead = self._advance_idle(idle)
            self._store(ahead)
            # both: the handled records' offsets of this step are committed on the interval
            # even when this step is also the idle tick (it replaced them here, so an idle
            # consumer did not commit its last record until the next one)
            store = [*store, *ahead]
        if store:
            self._unsynced = True
        if self._unsynced and not self._auto_commit and time.monotonic() >= self._next_commit:
            # enable.auto.commit=false: commit what was stored every auto.commit.interval.ms,
            # also in a step that stores nothing: the last offsets stored before the consumer
            # went idle are committed on the interval too, not at the next record (issue 37
            # #7: a crash meanwhile redid handled work)
            self._next_commit = time.monotonic() + self._commit_interval
            self._unsynced = False
            try:
                consumer.commit(asynchronous=True)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if not (isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET):
                    self._log.warning(
                        "commit_failed", reason="interval", error=self._scrub(str(exc))
                    )
        if pause:
            consumer.pause(pause)
        if resume:
            consumer.resume(resume)
        # Records flowing: a short wait (a full batch returns at once; a partial one waits
        # this long for more), so a stop() or a drained batch is acted on soon: a shutdown
        # waits for this step. Idle: a longer one, so an idle consumer costs ~10 wake-ups a
        # second.
        batch = consumer.consume(_BATCH, _FLOWING_WAIT_S if self._flowing else _IDLE_WAIT_S)
        self._flowing = bool(batch)
        return batch

    def _advance_idle(self, idle: list[TopicPartition]) -> list[TopicPartition]:
        """On the worker thread: the idle partitions whose position is past what was stored
        (a transaction's commit or abort markers, aborted records: offsets no record arrives
        for), to be stored at the position. Only partitions stored before by this owner."""
        consumer, stored = self._consumer, self._stored
        if consumer is None:
            return []
        mine = [(p.topic, p.partition) for p in idle if (p.topic, p.partition) in stored]
        ahead = positions_ahead(consumer, mine, stored, self._log, self._scrub)
        return [TopicPartition(t, p, offset) for (t, p), offset in ahead.items()]

    def _store(self, offsets: list[TopicPartition]) -> None:
        if not offsets or self._consumer is None:
            return
        try:
            self._consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:  # a partition just lost: its new owner re-reads
            self._log.warning("offset_store_failed", error=self._scrub(str(exc)))
            return
        stored = self._stored
        for p in offsets:
            stored[(p.topic, p.partition)] = p.offset

    def _commit(self, reason: str) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            committed = consumer.commit(asynchronous=False)
            self._tel.record_commit(committed or [])
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET:
                return  # nothing stored since the last commit
            self._log.warning("commit_failed", reason=reason, error=self._scrub(str(exc)))

    def _on_error(self, err: KafkaError) -> None:
        self._monitor.on_error(err)
        text = self._scrub(err.str())
        code = err.code()
        if err.fatal():
            self._error = translate(KafkaException(err), operation="consume", redactor=self._scrub)
            self._log.error("kafka_client_error", error=err.name(), reason=text, fatal=True)
        else:
            # As ResilientConsumer (consumer/_events.py): librdkafka reports every failed
            # reconnect, several a second while a cluster is unreachable. Connection failures
            # are summarised per host (kafka_unreachable, broker_unreachable: Reachability,
            # at a slow rate), anything else is logged once per code per interval with the
            # number held back since.
            if code in _REFUSAL_CODES:
                self._reach.refusal(text, code)
            if code == KafkaError._ALL_BROKERS_DOWN:
                self._reach.all_down(text)
            elif not (code in _CONNECT_CODES and self._reach.broker_failed(text)):
                allowed, suppressed = self._limiter.check(("error", code))
                if allowed:
                    self._log.warning(
                        "kafka_client_error",
                        error=err.name(),
                        reason=text,
                        suppressed=suppressed or None,
                    )
            self._refused()
        user = self._user_cb["error_cb"]
        if user is not None:
            user(err)

    def _refused(self) -> None:
        """A broker refused this consumer's credentials or certificate and none ever
        accepted them: run() ends with a ConsumeError naming the cause (AUTH, not retried)
        instead of polling in vain. A consumer that worked before keeps reconnecting."""
        failure = self._reach.final_refusal()
        if failure is None or self._error is not None or self._stop:
            return
        self._log.error(
            "kafka_authentication_failed",
            **failure.log_fields(),
        )
        self._error = ConsumeError(
            "no broker accepted this consumer's credentials or certificate",
            code=failure.code,
            classification=failure.classification(),
        )

    def _stats_cb(self, generation: int) -> Callable[[str], None]:
        def on_stats(stats: str) -> None:
            self._on_stats(stats)
            # a replaced instance closing in the background: its hung connections are no
            # longer this consumer's
            if generation == self._generation:
                self._probes.on_stats(stats)

        return on_stats

    # ------------------------------------------------------------------ heal (issue 42)

    def _may_heal(self) -> bool:
        """On the loop, between steps: nothing queued, no handler in hand, nothing held by a
        retry, an outage or an unacknowledged dead letter."""
        detector = self._detector
        if self._stop or self._error is not None or self._queued:
            return False
        if detector is not None and detector.active:
            return False
        if self._keyed is not None and not self._keyed.idle():
            return False
        return not any(
            part.held or part.inhand is not None or (part.task is not None and not part.task.done())
            for part in self._parts.values()
        )

    def _heal(self, kind: str, reason: str) -> None:
        """On the worker thread (the loop awaits it): recreate the librdkafka consumer, as
        ResilientConsumer does (the new one installed first, so the old one's callbacks are
        ignored; the old one commits what was stored and closes, bounded; the new member
        resumes from the committed offsets)."""
        old = self._consumer
        if old is None:
            return
        self._store(self._take_done())
        keyed = self._keyed
        if keyed is not None:  # idle (_may_heal): the loop awaits this, no task runs
            self._store(keyed.offsets(list(keyed.windows)))
            keyed.forget(list(keyed.windows))
        generation = self._generation + 1
        try:
            new = Consumer(self._client_conf(generation))
        except KafkaException as exc:
            self._log.warning("consumer_recreate_failed", cause=kind, error=self._scrub(str(exc)))
            return
        self._generation = generation
        self._consumer = self._probes.consumer = new
        stored = dict(self._stored)
        tps = set(self._parts) | set(stored)
        retire_client(
            old,
            stored,
            marker=None,
            redact=self._scrub,
            log=self._log,
            cause=kind,
            reason=reason,
            partitions=tps,
        )
        for tp in list(self._parts):  # every worker is done (_may_heal): no hop to the loop
            part = self._parts.pop(tp)
            part.revoked = part.halt = True
        self._stored.clear()
        self._subscribe(new)
        self._probes.healed(kind)

    def _on_stats(self, stats: str) -> None:
        # Parsed once, by the monitor (leadership for health() and telemetry), which hands
        # back the document for the broker states.
        doc = self._monitor.on_stats(stats)
        if doc is not None:
            self._reach.on_stats(doc)
        user = self._user_cb["stats_cb"]
        if user is not None:
            user(stats)

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """Commit results (background and on revoke/close): failures counted for health()."""
        failed: Any = None
        if err is not None and err.code() != KafkaError._NO_OFFSET:
            failed = err
        elif err is None:
            failed = next((p.error for p in partitions or [] if p.error is not None), None)
        if failed is not None:
            self.commit_failures += 1
            self._last_commit_error = self._scrub(str(failed))
            self._log.warning("commit_failed", reason="commit", error=self._last_commit_error)
        user = self._user_cb["on_commit"]
        if user is not None:
            user(err, partitions)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Worker thread, inside consume(): only dict stores (the loop is awaiting this step).
        self._reach.connected()  # the group coordinator answered: the login works
        for p in partitions:
            part = self._parts[(p.topic, p.partition)] = _Partition((p.topic, p.partition))
            # librdkafka may keep a pause from a previous assignment of this partition:
            # the next step resumes it (harmless when it was not paused)
            part.paused = True
        if self._keyed is not None:
            self._keyed.on_assign(_consumer, partitions)  # the finished-record lists
        self._probes.on_assign(partitions)
        self._rebalances["assigned"] += 1
        self._log.debug("partitions_assigned", partitions=len(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Let the revoked partitions' handlers in hand finish, then commit them (sync)."""
        tps = [(p.topic, p.partition) for p in partitions]
        loop = self._loop
        if self._keyed is not None:
            self._revoke_keyed(consumer, tps)
            return
        busy = [part for tp in tps if (part := self._parts.get(tp)) is not None and part.task]
        if not busy:  # nothing in hand (e.g. at close): no hop to the loop needed
            for tp in tps:
                if (part := self._parts.get(tp)) is not None:
                    part.revoked = part.halt = True
        elif loop is not None and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._finish(tps), loop)
            try:
                future.result(self._shutdown_timeout + 5)
            except Exception as exc:  # the loop is gone or stuck: commit what is recorded
                self._log.warning("revoke_wait_failed", error=type(exc).__name__)
        self._store(self._take_done(tps))
        if not (self._closing and self._auto_commit):
            # A rebalance: commit now, so the next owner starts exactly after our work. At
            # close() with auto-commit on, librdkafka commits the stored offsets itself
            # before it leaves the group (one round trip fewer).
            self._commit("revoke")
        for tp in tps:
            self._parts.pop(tp, None)
            self._stored.pop(tp, None)
        self._probes.forget(tps)
        self._rebalances["revoked"] += 1
        self._log.debug("partitions_revoked", partitions=len(tps))

    def _revoke_keyed(self, consumer: Consumer, tps: list[TP]) -> None:
        """Worker thread, ordering="key"/"none": on the loop, wait (up to
        ``shutdown_timeout``) for the revoked partitions' records in hand and take the lowest
        unfinished offsets with their lists; store and commit them (synchronously, with the
        metadata: always explicit, at close too), forget the partitions."""
        loop = self._loop
        parts: list[TopicPartition] = []
        if loop is not None and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._settle_keyed(tps, lost=False), loop)
            try:
                parts = future.result(self._shutdown_timeout + 10)
            except Exception as exc:  # the loop is gone or stuck: nothing safe to commit
                self._log.warning("revoke_wait_failed", error=type(exc).__name__)
        if parts:
            self._store(parts)
            try:
                committed = consumer.commit(offsets=parts, asynchronous=False)
                self._tel.record_commit(committed or [])
            except KafkaException as exc:
                self._log.warning("commit_failed", reason="revoke", error=self._scrub(str(exc)))
        for tp in tps:
            if (part := self._parts.pop(tp, None)) is not None:
                part.revoked = part.halt = True
            self._stored.pop(tp, None)
        self._probes.forget(tps)
        self._rebalances["revoked"] += 1
        self._log.debug("partitions_revoked", partitions=len(tps))

    async def _settle_keyed(self, tps: list[TP], *, lost: bool) -> list[TopicPartition]:
        """On the loop: wait for ``tps``' records in hand (bounded; the rest cancelled, left
        unfinished), then their committable offsets (none when ``lost``); forget them."""
        keyed = self._keyed
        assert keyed is not None
        try:
            await self._finish(tps)
            return [] if lost else keyed.offsets(tps)
        finally:
            keyed.forget(tps)
            for tp in tps:
                self._recs.pop(tp, None)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Lost (not revoked): commits would be refused; the new owner re-reads from the last
        commit. Stop the workers, and (as a revoke does) wait for the handlers in hand, up to
        ``shutdown_timeout``, then cancel them: this member may get the partitions back in
        the next assignment, and a second worker must not start on a partition while the
        first one's handler still runs (issue 37 #6: one offset handled twice at once).
        Nothing is stored or committed."""
        tps = [(p.topic, p.partition) for p in partitions]
        loop = self._loop
        busy = [part for tp in tps if (part := self._parts.get(tp)) is not None and part.task]
        if self._keyed is not None and loop is not None and not loop.is_closed():
            settled = asyncio.run_coroutine_threadsafe(self._settle_keyed(tps, lost=True), loop)
            try:
                settled.result(self._shutdown_timeout + 10)  # nothing to commit: lost
            except Exception as exc:  # the loop is gone or stuck
                self._log.warning("lost_wait_failed", error=type(exc).__name__)
            for tp in tps:
                if (part := self._parts.get(tp)) is not None:
                    part.revoked = part.halt = True
        elif busy and loop is not None and not loop.is_closed():
            future = asyncio.run_coroutine_threadsafe(self._finish(tps), loop)
            try:
                future.result(self._shutdown_timeout + 10)
            except Exception as exc:  # the loop is gone or stuck
                self._log.warning("lost_wait_failed", error=type(exc).__name__)
        else:
            for tp in tps:
                part = self._parts.get(tp)
                if part is not None:
                    part.revoked = part.halt = True
                    if loop is not None and not loop.is_closed():  # queues belong to the loop
                        loop.call_soon_threadsafe(self._drop_queue, part)
        for tp in tps:
            self._parts.pop(tp, None)  # its handled records: not stored (commits refused)
            self._stored.pop(tp, None)
        self._probes.on_lost(tps)
        self._rebalances["lost"] += 1
        self._log.warning("partitions_lost", partitions=len(partitions))

    def _drop_queue(self, part: _Partition) -> None:
        self._queued -= len(part.queue)
        part.queue.clear()
        if not self._queued:
            self._drained.set()

    def _take_done(self, tps: Iterable[TP] | None = None) -> list[TopicPartition]:
        out = []
        for tp in list(self._parts) if tps is None else tps:
            part = self._parts.get(tp)
            if part is not None and part.last is not None:
                out.append(TopicPartition(tp[0], tp[1], (part.last.offset() or 0) + 1))
                part.last = None
        return out

    # ------------------------------------------------------------------ the event loop

    def _pending_ops(self) -> _Ops:
        pause: list[TopicPartition] = []
        resume: list[TopicPartition] = []
        idle: list[TopicPartition] = []
        now = time.monotonic()
        keyed = self._keyed
        if keyed is not None:
            ahead, self._ahead = self._ahead, {}
            for tp, position in ahead.items():
                keyed.advance(tp, position)  # an idle window past a transaction's markers
            if now >= self._advance_due:
                self._advance_due = now + 1.0
                idle = [TopicPartition(*tp) for tp, w in keyed.windows.items() if w.idle]
            # the windows decide: a full one (or a long backlog, or a partition too far past
            # its lowest unfinished record) pauses its partition until it has room again
            for tp, part in list(self._parts.items()):
                blocked = keyed.blocked(tp)
                if blocked and not part.paused:
                    part.paused = True
                    pause.append(TopicPartition(*tp))
                elif part.paused and not blocked:
                    part.paused = False
                    resume.append(TopicPartition(*tp))
            return [], pause, resume, idle, keyed.due_offsets(now)
        if now >= self._advance_due:
            # Once a second: partitions with nothing queued, running or held move to the
            # consumer's position in the worker (past a transaction's markers at the end, as
            # ResilientConsumer: OffsetKeeper.advance_idle), so the commit reaches the end.
            self._advance_due = now + 1.0
            idle = [
                TopicPartition(*tp)
                for tp, part in self._parts.items()
                if not part.queue
                and not part.held
                and part.inhand is None
                and not part.revoked
                and (part.task is None or part.task.done())
            ]
        for tp, part in list(self._parts.items()):
            # A held partition is paused once a record is queued behind the held one, not
            # before: a record failing at the tail of a partition (nothing after it yet) is
            # probed with the next record to arrive, so the partition keeps fetching until
            # one does (paused at once, it never would: the probe waited for the limit).
            blocked = part.held and bool(part.queue)
            want = blocked or len(part.queue) >= _MAX_BUFFERED
            if want and not part.paused:
                part.paused = True
                pause.append(TopicPartition(*tp))
            elif part.paused and not blocked and len(part.queue) <= _MAX_BUFFERED // 2:
                part.paused = False
                resume.append(TopicPartition(*tp))
        return self._take_done(), pause, resume, idle, []

    def _dispatch(self, batch: list[Message]) -> None:
        """Queue each record behind its partition's; start the partition's worker if idle.

        A batch holds runs of records of one partition: the partition is looked up once per
        run, not per record. With one literal topic subscribed and no error event in the
        batch, the runs are found and queued in C (``groupby`` on the partition number,
        ``deque.extend``); otherwise record by record, by topic and partition.
        """
        parts = self._parts
        if self._keyed is not None:
            kept = []
            for msg in batch:
                if msg.error() is not None:
                    self._consume_error(msg)
                    continue
                part = parts.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
                if part is not None and not part.revoked:  # else: the new owner reads it
                    kept.append(msg)
            self._keyed.offer(kept)
            return
        touched: list[_Partition] = []
        queued = 0
        single = self._single_topic
        if single is not None and not any(map(Message.error, batch)):
            for p, run in itertools.groupby(batch, Message.partition):
                part = parts.get((single, p))  # type: ignore[arg-type]
                if part is None or part.revoked:
                    continue  # fetched before a revoke: the new owner reads it again
                queue = part.queue
                before = len(queue)
                queue.extend(run)
                queued += len(queue) - before
                if part.task is None:
                    touched.append(part)
        else:
            last_p: int | None = -2
            last_t: str | None = None
            part = None
            for msg in batch:
                if msg.error() is not None:
                    self._consume_error(msg)
                    continue
                p = msg.partition()
                # the topic too, always: a batch may hold the same partition number of two
                # topics back to back (a partition of one of them revoked meanwhile)
                if p != last_p or msg.topic() != last_t:
                    last_p, last_t = p, msg.topic()
                    part = parts.get((last_t, p))  # type: ignore[arg-type]
                    if part is not None and part.revoked:
                        part = None  # fetched before a revoke: the new owner reads it again
                    elif part is not None and part.task is None:
                        touched.append(part)
                if part is not None:
                    part.queue.append(msg)
                    queued += 1
        for part in touched:
            if part.task is None and part.queue:
                part.task = asyncio.create_task(self._work(part), name=f"kresilient {part.tp}")
        if queued:
            self._queued += queued
            self._drained.clear()

    def _consume_error(self, msg: Message) -> None:
        err = msg.error()
        assert err is not None
        if err.code() == KafkaError._PARTITION_EOF:
            return
        self._monitor.on_error(err, msg.topic(), msg.partition())
        if err.fatal() or err.code() in FATAL_CONSUME_CODES:  # a fenced static member too
            self._error = translate(KafkaException(err), operation="consume", redactor=self._scrub)
        self._log.warning("consume_error", error=err.name(), reason=self._scrub(err.str()))

    async def _work(self, part: _Partition) -> None:
        """One partition's records, one at a time, in order.

        The hot path per record: ``await handler(msg)``, the halt checks and one attribute
        store (plus one clock read when the blocking warning is on); the processed count,
        the queue count and the breaker are settled once per run, the offset to store is
        read from ``part.last`` when stored.
        """
        sem = self._sem
        assert sem is not None
        handler = self._handler
        dedupe = self._dedupe
        detector = self._detector
        queue = part.queue
        popleft = queue.popleft
        timing, threshold = self._timing, self._blocking_threshold
        clock = time.monotonic
        try:
            while queue and not part.revoked and not self._stop and self._error is None:
                # A run of records per acquisition: one task switch per run, not per record
                # (max_concurrency bounds handlers running at once, not their order).
                await sem.acquire()
                part.slot = True
                try:
                    taken = handled = 0
                    # dedupe or a span per record: the slow path (self._traced changes only
                    # between poll steps, so once per run is enough)
                    slow = dedupe is not None or self._traced
                    try:
                        prev = clock()
                        # the queue only grows meanwhile (a drop on revoke or loss sets
                        # part.revoked first), so popleft never meets an empty queue
                        for _ in range(min(_RUN, len(queue))):
                            # not queue: defensive (a probe leaves its record queued)
                            if part.halt or not queue:  # revoked, lost, stopping or failed
                                break
                            msg = popleft()
                            taken += 1
                            if msg is part.ahead:
                                # a probe handled out of turn (the records before it settled
                                # since): its offset is stored now, in partition order
                                part.ahead = None
                                part.last = msg
                                continue
                            part.inhand = msg  # /ready: a handler stuck on it is named
                            try:
                                if slow:
                                    if dedupe is not None:
                                        ok = await self._deduped(msg, part)
                                    else:
                                        ok = await self._process(msg, part)
                                else:
                                    try:
                                        await handler(msg)
                                    except Exception as exc:  # retries, dead letter
                                        # the breaker is credited with the successes first
                                        self.processed += handled
                                        if handled and detector is not None:
                                            self._succeeded()  # before this failure
                                        handled = 0
                                        ok = await self._process(msg, part, exc)
                                    else:
                                        handled += 1  # counted in bulk (finally below)
                                        ok = True
                            except BaseException as exc:  # not an Exception: never skip it
                                taken -= 1  # _interrupted puts it back in front
                                if self._interrupted(msg, part, exc):
                                    raise
                                return
                            if timing:
                                now = clock()
                                if now - prev > threshold:
                                    self._check_blocked(msg, now - prev)
                                prev = now
                            if ok is False:
                                break  # stopping (or revoked): nothing stored past it
                            part.last = msg
                    finally:
                        part.inhand = None
                        self.processed += handled  # the breaker is credited in bulk too
                        if handled and detector is not None:
                            self._succeeded()  # the outage detector too, once per run
                        self._queued -= taken
                        if not self._queued:
                            self._drained.set()
                finally:
                    # not `async with sem`: a wait that gave the slot up (_idle, _await_first)
                    # and was cancelled while taking it back holds none, and releasing one
                    # anyway would let max_concurrency+1 handlers run (issue 35)
                    if part.slot:
                        part.slot = False
                        sem.release()
        finally:
            part.task = None

    def _may_start(self, busy: bool) -> bool:
        """ordering="key"/"none": may new records start? Not while stopping, and not during
        a dependency outage while records are in hand (their held retries tell when it ends;
        with none in hand, only a new record can)."""
        if self._stop or self._error is not None:
            return False
        detector = self._detector
        return not (busy and detector is not None and detector.active)

    async def _keyed_record(self, tp: TP, msg: Message) -> bool:
        """ordering="key"/"none": one record, in its own task, under a slot of the
        semaphore (``max_in_flight``). True: it finished (handled, dead-lettered, skipped as a
        duplicate); False: it did not (stopping, revoked, a fatal outcome): it stays
        unfinished, so no commit passes it.

        The hot path is ``await handler(msg)``; a failure (or a span per record, or dedupe)
        goes through :meth:`_process` with a state of its own (its retry waits, outage hold
        and dead letter), whose waits the partition's ``cut`` ends."""
        part = self._parts.get(tp)
        if part is None or part.revoked or self._stop or self._error is not None:
            return False
        sem = self._sem
        assert sem is not None
        rec: _Partition | None = None
        await sem.acquire()
        try:
            if part.revoked or self._stop or self._error is not None:
                return False
            dedupe = self._dedupe
            if dedupe is not None and dedupe.is_duplicate(msg):
                # checked at its turn: in "key" mode a re-sent copy's original (same key)
                # finished before it started
                ident, _ = record_id(msg)
                self._skipped(msg, ident or b"")
                return True
            first: Exception | None = None
            if dedupe is None and not self._traced:
                began = time.monotonic() if self._timing else 0.0
                try:
                    await self._handler(msg)
                except Exception as exc:  # retries, dead letter
                    first = exc
                else:
                    self.processed += 1  # the breaker is credited in bulk (_credit_breaker)
                    if self._detector is not None:
                        self._succeeded()
                    return True
                finally:
                    if self._timing and (took := time.monotonic() - began) > (
                        self._blocking_threshold
                    ):
                        self._check_blocked(msg, took)  # did it hold the loop, or await?
            rec = _Partition(tp)
            rec.cut = part.cut  # stop() and the revoke end its waits
            rec.slot = rec.record = True
            self._recs.setdefault(tp, set()).add(rec)
            if part.revoked:
                rec.revoked = True
            return await self._process(msg, rec, first)
        except BaseException as exc:  # not an Exception: the record stays unfinished
            if self._interrupted(msg, rec if rec is not None else _Partition(tp), exc):
                raise
            return False
        finally:
            if rec is None:
                sem.release()
            else:
                recs = self._recs.get(tp)
                if recs is not None:
                    recs.discard(rec)
                if self._prober is rec:  # its probe is over, whatever the outcome
                    self._pass_probe()
                if rec.slot:  # a wait that gave it up and was cancelled holds none
                    rec.slot = False
                    sem.release()

    async def _deduped(self, msg: Message, part: _Partition) -> bool:
        """``dedupe`` on: skip a marked copy of a handled id, else handle the record (as the
        fast path of :meth:`_work` does) and remember its id once the handler returned. True:
        its offset may be stored (handled, dead-lettered or skipped)."""
        verdict, key = await self._dedupe_gate(msg, part)
        if verdict == _SKIP:
            return True
        if verdict == _STOP:
            return False
        try:
            if self._traced:
                return await self._process(msg, part)
            try:
                await self._handler(msg)
            except Exception as exc:  # retries, dead letter (the id remembered on success)
                return await self._process(msg, part, exc)
            self.processed += 1
            assert self._dedupe is not None
            self._dedupe.processed(msg)
            if self._detector is not None:
                self._succeeded()
            return True
        finally:
            if key is not None:  # handled, failed or interrupted: a waiting copy re-checks
                self._inflight.pop(key).set_result(None)

    async def _dedupe_gate(self, msg: Message, part: _Partition) -> tuple[int, _Id | None]:
        """``(_SKIP, None)`` for a marked copy of a handled id; ``(_STOP, None)`` when the
        partition is revoked or the consumer stops while waiting; else ``(_HANDLE, key)``
        with ``key`` the id now registered as in hand (None: no id, or already in hand).

        Two copies of one id on different partitions could otherwise be handled at once (the
        window only learns an id once its handler returned): a marked copy whose id is in
        hand elsewhere waits for that handler, then is checked against the window. An
        unmarked copy is handled whatever else is in hand (never skipped, as in the sync
        consumer).
        """
        dedupe = self._dedupe
        assert dedupe is not None
        ident, marked = record_id(msg)
        if ident is None:
            return _HANDLE, None
        key: _Id = (str(msg.topic()), ident)
        inflight = self._inflight
        if marked:
            while (first := inflight.get(key)) is not None:
                await self._await_first(first, part)
                if part.revoked or self._stop or self._error is not None:
                    return _STOP, None
            if dedupe.is_duplicate(msg):
                self._skipped(msg, ident)
                return _SKIP, None
        if key in inflight:
            return _HANDLE, None  # an unmarked repeat while another copy is in hand
        inflight[key] = asyncio.get_running_loop().create_future()
        return _HANDLE, key

    async def _await_first(self, first: asyncio.Future[None], part: _Partition) -> None:
        """Wait for another partition's handler of the same id (or this partition's cut),
        without holding a concurrency slot: that handler may need one to finish."""
        sem = self._sem
        assert sem is not None
        part.slot = False
        sem.release()
        try:
            cut = asyncio.ensure_future(part.cut.wait())
            try:
                await asyncio.wait((first, cut), return_when=asyncio.FIRST_COMPLETED)
            finally:
                cut.cancel()
        finally:
            await sem.acquire()  # cancelled here: no slot held (part.slot stays False)
            part.slot = True

    def _skipped(self, msg: Message, ident: bytes) -> None:
        """A possible duplicate skipped: counted, logged with its id (DEBUG: the per-record
        path), never dropped silently."""
        self.duplicates_skipped += 1
        self._log.debug(
            "duplicate_skipped",
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            message_id=ident.decode("utf-8", "replace"),
            note="marked as a possible duplicate and its message id was processed",
        )

    def _interrupted(self, msg: Message, part: _Partition, exc: BaseException) -> bool:
        """A handler ended with a BaseException (the task's cancellation, KeyboardInterrupt,
        a CancelledError of its own ...): the record goes back in front of its partition's
        queue, so nothing after it is stored or committed; anything but the shutdown's own
        cancellation stops the consumer with that exception (``run()`` raises it). True: the
        worker re-raises it (its own cancellation, KeyboardInterrupt, SystemExit)."""
        part.queue.appendleft(msg)
        task = asyncio.current_task()
        if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
            return True  # our shutdown (or the application's) cancelled it: not an error
        if self._error is None:
            self._error = exc
            self._log.error(
                "handler_interrupted",
                handler=self._handler_name,
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                error_type=type(exc).__name__,
            )
        self.stop()
        return isinstance(exc, (KeyboardInterrupt, SystemExit))

    async def _process(
        self, msg: Message, part: _Partition, first: Exception | None = None
    ) -> bool:
        """Handle one record (retries, dead letter). True: its offset may be stored.

        ``first``: the exception of a first attempt already made (the untraced fast path).
        Record or dependency (the :class:`~kresilient.consumer.OutageDetector`): poison is
        dead-lettered at once; a retriable failure during a dependency outage (or starting
        one) is held under ``outage_retry``; otherwise the ``RetryPolicy`` applies, and once
        it is exhausted the detector decides (dead letter, hold, or probe the next record).
        """
        detector = self._detector
        retrying: tenacity.Retrying | None = None
        state: tenacity.RetryCallState | None = None
        outage_state: tenacity.RetryCallState | None = None
        outages = 0  # outage-policy waits so far
        base = 0  # attempts before the RetryPolicy's budget was given afresh (an outage ended)
        mark = 0
        attempt = 0
        while True:
            attempt += 1
            failure: Exception | None = None
            delay: float | None = None  # None: no further attempt
            retriable = False
            with self._tel.process_span(msg, group=self.group_id):
                try:
                    if first is not None:
                        failed: Exception = first
                        first = None
                        raise failed
                    await self._handler(msg)
                except Exception as exc:
                    failure = exc
                    registry = outage_classification(exc) if detector is not None else None
                    classification = registry if registry is not None else classify(exc)
                    self._tel.set_error(exc, classification)
                    if retrying is None or state is None:  # built on the first failure only
                        retrying = self._retry.retrying()
                        state = tenacity.RetryCallState(retrying, None, (), {})
                        mark = detector.mark() if detector is not None else 0
                    state.attempt_number = max(attempt - base, 1)
                    state.set_exception((type(exc), exc, exc.__traceback__))
                    if registry is not None and not is_outage(registry):
                        pass  # the registry said 4xx (schema unknown): poison, at once
                    elif registry is None and not retrying.retry(state):
                        classification = poison(classification)
                    else:
                        retriable = True
                        wait = float(retrying.wait(state))
                        state.upcoming_sleep = wait
                        if not retrying.stop(state):
                            delay = wait
                            self._tel.retry_event(
                                None, attempt, exc, classification=classification, delay_s=wait
                            )
            if failure is None:
                self.processed += 1  # the breaker is credited in bulk (_credit_breaker)
                if self._dedupe is not None:
                    self._dedupe.processed(msg)
                if detector is not None:
                    self._succeeded()
                return True
            if self._signal_interrupted:
                # A 2nd signal cancelled the handler and it turned the CancelledError into
                # another exception (as a KeyboardInterrupt can be turned in the sync
                # consumer): the interruption, never retried or dead-lettered; uncommitted.
                return False
            outage = False  # held by the outage policy (not the RetryPolicy) this time
            if retriable and detector is not None:
                if detector.failure(
                    (msg.topic(), msg.partition(), msg.offset()),
                    error_type=type(failure).__name__,
                    error=self._error_text(failure),
                    classified=registry is not None,
                ):
                    self._outage_started(msg)
                decision: OutageDecision | None = None
                if detector.active:
                    decision = OutageDecision.HOLD
                elif delay is None:
                    decision = detector.exhausted(mark)
                if decision is OutageDecision.PROBE:
                    verdict = await self._probe(msg, part, failure, mark)
                    if verdict is False or verdict is None:
                        if verdict is False or self._stop or part.revoked:
                            return False  # stopping: uncommitted, read again later
                        # the probe proved an outage, or there was no record to probe: the
                        # held record's next attempt after the outage policy's wait
                        decision = OutageDecision.HOLD
                    else:
                        # the probe was handled: the held record kept failing while another
                        # record succeeded, it is bad
                        return await self._give_up(msg, part, failure, classify(failure), attempt)
                if decision is OutageDecision.HOLD:
                    outage = detector.active
                    if outage:
                        self._note_outage()
                    retrying_o = self._outage_retry
                    assert retrying_o is not None
                    o_retrying = retrying_o.retrying()
                    if outage_state is None:
                        outage_state = tenacity.RetryCallState(o_retrying, None, (), {})
                    outages += 1
                    outage_state.attempt_number = outages
                    outage_state.set_exception((type(failure), failure, failure.__traceback__))
                    wait = float(o_retrying.wait(outage_state))
                    outage_state.upcoming_sleep = wait
                    if o_retrying.stop(outage_state):
                        return await self._give_up(
                            msg, part, failure, classification, attempt, limit=True
                        )
                    outage_state.idle_for += wait
                    delay = wait
                elif decision is OutageDecision.DEAD_LETTER:
                    return await self._give_up(msg, part, failure, classification, attempt)
            if delay is None:
                if detector is not None:
                    return await self._give_up(msg, part, failure, classification, attempt)
                return await self._dead_letter_record(msg, part, failure, classification, attempt)
            if self._stop or part.revoked:
                return False  # shutting down mid-retries: uncommitted, read again later
            assert state is not None
            if not outage:
                state.idle_for += delay
            self.retries += 1
            self._log.debug(
                "message_retry_scheduled",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                attempt=attempt,
                delay_s=round(delay, 3),
                error_type=type(failure).__name__,
                outage=outage,
            )
            part.held = True  # paused while it waits; the consumer keeps polling
            part.hold = (msg.offset() or 0, attempt)
            part.due = time.monotonic() + delay
            try:
                ended = await self._idle(delay, part, outage=outage)
            finally:
                part.held = False
            if self._stop or part.revoked:
                return False
            if ended and detector is not None:
                # the outage ended while it waited: a fresh RetryPolicy budget, and the
                # evidence starts again (successes after now say it is bad)
                retrying, state, outage_state, outages = None, None, None, 0
                base = attempt

    async def _probe(
        self, held: Message, part: _Partition, exc: Exception, mark: int
    ) -> bool | None:
        """No evidence whether ``held`` (its RetryPolicy exhausted) is bad: try the next
        record(s) of its partition, ``held`` kept uncommitted.

        Returns True when a probe was handled (``held`` is bad); the probe stays queued as
        ``part.ahead``, its offset stored in its turn (:meth:`_work`), after the records
        before it are settled (those that proved nothing: dead-lettered or skipped in their
        turn), never before: a stop meanwhile leaves it uncommitted, handled again after a
        restart (at-least-once). None when the probe failed as
        ``held`` did (an outage: ``held`` is retried under ``outage_retry``, the probe
        handled again after it) or there was no record to probe; False when stopping.
        Each probe is retried under its own RetryPolicy first (a record failing once is no
        outage); a probe that proves nothing (poison, a duplicate ``dedupe`` skips) moves
        on to the next, up to ``_MAX_PROBES``.
        """
        detector = self._detector
        assert detector is not None
        queue = part.queue
        dedupe = self._dedupe
        for index in range(_MAX_PROBES):
            if index >= len(queue) or part.revoked or self._stop:
                break
            probe = queue[index]
            if probe is part.ahead:
                continue  # handled already (a probe of an earlier record): no new evidence
            if dedupe is not None:
                ident, marked = record_id(probe)
                if ident is not None and marked and dedupe.is_duplicate(probe):
                    continue  # a skip proves nothing: handled (skipped) in its turn
            retrying = self._retry.retrying()
            state = tenacity.RetryCallState(retrying, None, (), {})
            attempt = 0
            while True:
                attempt += 1
                try:
                    await self._handler(probe)
                except Exception as failure:
                    if self._signal_interrupted:
                        return False
                    registry = outage_classification(failure)
                    state.attempt_number = attempt
                    state.set_exception((type(failure), failure, failure.__traceback__))
                    if (registry is not None and not is_outage(registry)) or (
                        registry is None and not retrying.retry(state)
                    ):
                        break  # poison: proves nothing, dead-lettered in its turn
                    wait = float(retrying.wait(state))
                    state.upcoming_sleep = wait
                    if registry is None and not detector.active and not retrying.stop(state):
                        state.idle_for += wait  # the probe's own retry, the held one waiting
                        self.retries += 1
                        part.held = True
                        part.hold = (held.offset() or 0, attempt)
                        part.due = time.monotonic() + wait
                        try:
                            await self._idle(wait, part)
                        finally:
                            part.held = False
                        if self._stop or part.revoked:
                            return False
                        continue
                    if registry is None and detector.exhausted(mark) is (
                        OutageDecision.DEAD_LETTER
                    ):
                        return True  # others succeeded since held's first failure: bad
                    if detector.failure(
                        (probe.topic(), probe.partition(), probe.offset()),
                        error_type=type(failure).__name__,
                        error=self._error_text(failure),
                        classified=registry is not None,
                    ):
                        self._outage_started(probe)
                    return None  # an outage: held retried, the probe handled after it
                # the probe was handled: left queued, stored (not handled again) in its turn
                if part.revoked or index >= len(queue) or queue[index] is not probe:
                    return False  # revoked meanwhile (its queue dropped): read again later
                part.ahead = probe
                self.processed += 1
                if dedupe is not None:
                    dedupe.processed(probe)
                self._succeeded()
                return True
        return None

    async def _give_up(
        self,
        msg: Message,
        part: _Partition,
        exc: Exception,
        classification: Classification,
        attempts: int,
        *,
        limit: bool = False,
    ) -> bool:
        """The final failure of a record (one WARNING line with its redacted exception
        text), then its dead letter."""
        self._log.warning(
            "message_failed",
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            attempts=attempts,
            error_type=type(exc).__name__,
            error=self._error_text(exc),
            category=classification.category.value,
            reason=(
                "the dependency outage limit (outage_retry) was reached"
                if limit
                else "poison (not retried)"
                if classification.category.name == "POISON"
                else "failed while other records succeeded"
            ),
        )
        return await self._dead_letter_record(msg, part, exc, classification, attempts)

    def _error_text(self, exc: BaseException) -> str:
        text = self._scrub(str(exc) or type(exc).__name__)
        return text if len(text) <= _ERROR_TEXT else text[:_ERROR_TEXT] + "..."

    def _succeeded(self) -> None:
        """Records were handled: evidence the dependency works (ends an outage)."""
        detector = self._detector
        if detector is None or not detector.success():
            return
        self._log.warning(
            "dependency_outage_ended",
            lasted_s=round(detector.last_duration or 0.0, 3),
            failures=detector.last_failures,
            error_type=detector.error_type,
            note="the records it held are retried now, with their whole RetryPolicy again",
        )
        over = self._outage_over
        self._outage_over = None
        self._prober = None  # the held records all run again now (ordering="key"/"none")
        self._probe_line.clear()
        if over is not None:
            over.set()  # cut short the waits of the records it held

    def _outage_started(self, msg: Message) -> None:
        detector = self._detector
        assert detector is not None
        self._log.warning(
            "dependency_outage_started",
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            error_type=detector.error_type,
            error=detector.error,
            note="distinct records fail in a row: held and retried (outage_retry), nothing "
            "is dead-lettered until a record succeeds",
        )

    def _note_outage(self) -> None:
        detector = self._detector
        assert detector is not None
        held = detector.reminder()
        if held is not None:
            self._log.warning(
                "dependency_outage_continues",
                since_s=round(detector.duration(), 1),
                failures=detector.failures,
                held_back=held,
                error_type=detector.error_type,
            )

    async def _idle(self, delay: float, part: _Partition, *, outage: bool = False) -> bool:
        """Wait without holding a concurrency slot (other partitions' handlers run).
        ``outage``: held by a dependency outage, cut short when it ends (True then)."""
        sem = self._sem
        assert sem is not None
        part.slot = False
        sem.release()
        try:
            if not outage:
                await self._sleep(delay, part)
                return False
            over = self._outage_over
            if over is None:
                over = self._outage_over = asyncio.Event()
            if part.record:
                return await self._held_turn(delay, part, over)
            waits = [asyncio.ensure_future(part.cut.wait()), asyncio.ensure_future(over.wait())]
            try:
                await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            return over.is_set()
        finally:
            await sem.acquire()  # cancelled here: no slot held (part.slot stays False)
            part.slot = True

    async def _held_turn(self, delay: float, rec: _Partition, over: asyncio.Event) -> bool:
        """ordering="key"/"none", a record held by a dependency outage: as in the sync runner,
        ONE held record at a time is tried again, after ``outage_retry``'s wait, each time the
        next one in line (a bad record among them cannot keep the outage going); the others
        wait for the outage's end or their turn. True: the outage ended meanwhile."""
        line = self._probe_line
        if self._prober is rec:
            self._pass_probe()  # its probe failed: the next held record's turn
        if self._prober is None:
            self._prober = rec
        else:
            line.append(rec)
        try:
            while self._prober is not rec:
                turn = self._probe_turn
                if turn is None:
                    turn = self._probe_turn = asyncio.Event()
                if await self._first_of(rec.cut, over, turn):
                    return over.is_set()
            await self._first_of(rec.cut, over, timeout=delay)
            return over.is_set()
        finally:
            if rec in line:
                line.remove(rec)

    def _pass_probe(self) -> None:
        """The turn to be tried again passes to the next held record in line (none: free)."""
        line = self._probe_line
        self._prober = line.popleft() if line else None
        turn, self._probe_turn = self._probe_turn, None
        if turn is not None:
            turn.set()

    @staticmethod
    async def _first_of(
        cut: asyncio.Event,
        over: asyncio.Event,
        turn: asyncio.Event | None = None,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Wait for the first of the events (or ``timeout``); True when ``cut`` or ``over``
        is set (stop, revoke, the outage's end)."""
        events = [cut, over] if turn is None else [cut, over, turn]
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        return cut.is_set() or over.is_set()

    async def _sleep(self, delay: float, part: _Partition) -> None:
        """Wait ``delay`` s, cut short by stop() or the partition's revocation."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(part.cut.wait(), delay)

    async def _dead_letter_record(
        self,
        msg: Message,
        part: _Partition,
        exc: BaseException,
        classification: Classification,
        attempts: int,
    ) -> bool:
        policy = self._dead_letter
        if policy is None:
            self._error = exc
            self._log.error(
                "message_failed_no_dead_letter",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                error_type=type(exc).__name__,
            )
            return False
        if not self._breaker_allows(msg):
            return False
        record = build_dead_letter_record(
            msg,
            policy=policy,
            group=self.group_id,
            exc=exc,
            attempts=attempts,
            classification=classification,
            trace_context=self._tel.trace_carrier() or None,
            # this consumer's secrets out of the exception text, whatever writes the record
            redact=self._scrub,
        )
        tries = 0
        part.held = True
        part.hold = (msg.offset() or 0, attempts)
        part.due = time.monotonic()  # /ready: a write unacknowledged for stall_after_s
        self._dead_letters_pending += 1
        try:
            while True:
                with self._tel.dead_letter_span(
                    record.topic,
                    source=msg,
                    reason=exc,
                    classification=classification,
                    attempts=attempts,
                ):
                    try:
                        await self._send_dead_letter(record)
                    except DeadLetterError as err:
                        failed: DeadLetterError | None = err
                    else:
                        failed = None
                if failed is None:
                    break
                # Never commit past a record that is neither handled nor dead-lettered.
                delay = _DEAD_LETTER_RETRY_S[min(tries, len(_DEAD_LETTER_RETRY_S) - 1)]
                tries += 1
                self._log.error(
                    "dead_letter_failed",
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=msg.offset(),
                    error=failed.classification.name,
                    reason=self._scrub(str(failed)),
                    retry_in_s=delay,
                )
                if self._stop or part.revoked:
                    return False
                part.due = time.monotonic() + delay
                await self._idle(delay, part)
        finally:
            part.held = False
            self._dead_letters_pending -= 1
        self.dead_lettered += 1
        self._log.warning(
            "message_dead_lettered",
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            dead_letter_topic=record.topic,
            category=classification.category.name,
            attempts=attempts,
        )
        return True

    def _credit_breaker(self) -> None:
        """Credit the breaker with the successes since the last call (in bulk: once per
        poll step and before each dead letter, never per record)."""
        breaker = self._breaker
        if breaker is not None and self.processed > self._credited:
            breaker.record_successes(self.processed - self._credited)
            self._credited = self.processed

    def _breaker_allows(self, msg: Message) -> bool:
        """One more dead letter allowed? Otherwise the breaker opens: the consumer stops with
        :class:`~kresilient.CircuitBreakerOpenError` and ``msg`` stays uncommitted (the same
        rule as ResilientConsumer: at most ``max_consecutive`` dead letters in a row)."""
        breaker = self._breaker
        if breaker is None:
            return True
        self._credit_breaker()
        try:
            breaker.check()
        except CircuitBreakerOpenError as opened:
            self._tel.circuit_breaker_opened(
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                **breaker.snapshot(),
            )
            if self._error is None:
                self._error = opened
            self.stop()
            return False
        breaker.record_dead_letter()  # counted when queued, as the sync consumer does
        return True

    async def _send_dead_letter(self, record: DeadLetterRecord) -> None:
        """Write ``record`` byte for byte and wait for its acknowledgement (off the loop for
        the sync clients). Raises :class:`~kresilient.DeadLetterError`."""
        loop = asyncio.get_running_loop()
        sink = self._user_dlq
        try:
            if isinstance(sink, AsyncResilientProducer):
                handle = await sink.produce(
                    record.topic,
                    record.value,
                    key=record.key,
                    headers=record.headers,
                    propagate=False,
                )
                await handle
                return
            if isinstance(sink, ResilientProducer):
                sent = await loop.run_in_executor(
                    None,
                    functools.partial(
                        sink.produce,
                        record.topic,
                        record.value,
                        key=record.key,
                        headers=record.headers,
                        propagate=False,
                    ),
                )
                await loop.run_in_executor(None, sent.result, None)
                return
        except ProduceError as err:  # refused or not delivered: classified, retried by caller
            raise DeadLetterError(
                f"dead-letter write to {record.topic} failed: {err.message}",
                topic=record.topic,
                classification=err.classification,
            ) from err
        writer = sink if isinstance(sink, DeadLetterWriter) else self._writer
        if writer is None:
            writer = self._writer = await loop.run_in_executor(None, self._make_writer)
        written = await loop.run_in_executor(None, writer.write, record)
        await loop.run_in_executor(None, written.result, None)

    def _make_writer(self) -> DeadLetterWriter:
        return DeadLetterWriter(
            self._dlq_config,
            client_id=self.client_id,
            overrides=self._dlq_overrides,
            allow_unsafe=self._allow,
            logger=self._log,
        )

    # The blocking warning. Timing each step of a handler coroutine exactly needs a Python
    # trampoline around it (coro.send + StopIteration per record: ~1 us); instead the worker
    # reads the clock once per record, and a heartbeat on the loop (every quarter of the
    # threshold) tells a handler that held the loop from one that awaited.

    def _heartbeat(self) -> None:
        loop = self._loop
        if loop is None or not self._running:
            return
        now = loop.time()
        late = now - self._beat_due
        if late > self._beat_late:
            self._beat_late = late  # the loop was held this long (by something) meanwhile
        self._beat_at = now
        self._beat_due = now + self._beat_period
        self._beat_handle = loop.call_at(self._beat_due, self._heartbeat)

    def _check_blocked(self, msg: Message, elapsed: float) -> None:
        """A record took ``elapsed`` s (> threshold) as the worker saw it: warn if the
        handler held the loop, not if it awaited (the loop ran meanwhile)."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        if now - self._beat_at >= elapsed:
            blocked = elapsed  # no heartbeat ran: the handler never let the loop run
        else:  # it awaited; was the loop held by a step of it (or is it held right now)?
            blocked = max(self._beat_late, now - self._beat_due)
        self._beat_late = 0.0
        if blocked > self._blocking_threshold:
            self._blocked(msg, blocked)

    def _blocked(self, msg: Message, seconds: float) -> None:
        self.blocked_warnings += 1
        self._log.warning(
            "handler_blocked_event_loop",
            handler=self._handler_name,
            blocked_s=round(seconds, 3),
            threshold_s=self._blocking_threshold,
            topic=msg.topic() if msg is not None else None,
            partition=msg.partition() if msg is not None else None,
            offset=msg.offset() if msg is not None else None,
            remedy=(
                "the handler ran without awaiting for that long, so nothing else on the event "
                "loop ran (other partitions, polling, your web server): move blocking calls "
                "to `await asyncio.to_thread(...)` or use an async client"
            ),
        )

    async def _finish(self, tps: Iterable[TP] | None = None) -> None:
        """Stop dispatching to ``tps`` (all when None); wait for their handlers in hand."""
        parts = [
            self._parts[tp]
            for tp in (list(self._parts) if tps is None else tps)
            if tp in self._parts
        ]
        for part in parts:
            part.revoked = part.halt = True
            self._drop_queue(part)  # not started: the next owner (or the restart) reads them
        tasks = [p.task for p in parts if p.task is not None]
        if self._keyed is not None:
            # nothing more starts on them; records waiting for a retry are cut short (left
            # unfinished: their new owner handles them), those in their handler waited for
            tps = [p.tp for p in parts]
            tasks.extend(self._keyed.close_windows(tps))
            for tp in tps:
                for rec in self._recs.get(tp, ()):
                    rec.revoked = rec.halt = True
        for part in parts:
            part.cut.set()  # end retry and dead-letter waits
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self._shutdown_timeout)
            for task in late:
                task.cancel()
            if late:
                self._log.warning(
                    "handlers_not_finished",
                    count=len(late),
                    note="their records stay uncommitted and are read again",
                )
                await asyncio.wait(late, timeout=5)

    async def _shutdown(self) -> None:
        """Finish the records in hand, commit what was handled, leave the group.

        A 3rd signal aborts it (:meth:`_on_signal`): KeyboardInterrupt, no final commit, no
        close, no ``consumer_closed`` line."""
        self._stop = True
        self._probes.running = False  # /live and /ready: 503 from now on
        with contextlib.suppress(asyncio.CancelledError):  # cancelled again: still commit
            await asyncio.shield(self._finish())
        loop = asyncio.get_running_loop()
        if self._aborted:
            self._abandon()
            raise KeyboardInterrupt
        self._committing = True
        done = self._take_done()

        def close() -> None:
            self._store(done)
            consumer = self._consumer
            self._closing = True
            if consumer is not None:
                # Leaves the group; the revoke callback it runs commits what was stored
                # (synchronously), so no separate commit round trip first. Bounded: a
                # frozen group coordinator can hold it forever (docs/stalls.md).
                done_in_time, _ = bounded_call(
                    consumer.close, self._shutdown_timeout, name="kresilient-consumer-close"
                )
                if not done_in_time:
                    self._log.warning(
                        "close_timed_out",
                        client="AsyncResilientConsumer",
                        step="close_consumer",
                        shutdown_timeout=self._shutdown_timeout,
                        note=(
                            "librdkafka did not return in time (a group coordinator that "
                            "never answers?); left to a daemon thread, the shutdown goes on. "
                            "Offsets not committed: those records are read again"
                        ),
                    )
                self._consumer = None

        try:
            await asyncio.shield(loop.run_in_executor(self._kx, close))
        except asyncio.CancelledError:
            if not self._aborted:
                await self._release(loop)
                raise
            # aborted: the close goes on in the worker thread; nobody waits for it
            self._abandon()
            raise KeyboardInterrupt from None
        except BaseException:
            await self._release(loop)
            raise
        await self._release(loop)

    async def _release(self, loop: asyncio.AbstractEventLoop) -> None:
        """The shutdown's last step: the dead-letter writer closed, the worker thread let go."""
        writer = self._writer
        if writer is not None:
            with contextlib.suppress(Exception):
                await loop.run_in_executor(None, writer.close, 10.0)
        self._kx.shutdown(wait=False)
        self._running = False
        self._probes.close()
        self._log.debug(
            "consumer_closed", processed=self.processed, dead_lettered=self.dead_lettered
        )

    def _abandon(self) -> None:
        """The aborted shutdown's last act: nothing more is waited for."""
        self._kx.shutdown(wait=False)
        self._running = False
        self._probes.close()

    def _on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM/SIGINT, on the loop (``loop.add_signal_handler``), counted as
        ResilientConsumer counts them: the 1st stops gracefully; a 2nd while handlers are in
        hand interrupts them (cancelled; their records stay uncommitted and are never retried
        or dead-lettered because of it; ``run()`` raises ``KeyboardInterrupt`` after the
        commit of what was handled); a 2nd later in the shutdown is only logged; a 3rd
        aborts the shutdown (no final commit, no close; ``KeyboardInterrupt``). A handler
        that holds the event loop (never awaits) delays every signal until it awaits."""
        self._signals_received += 1
        if not self._stop:
            self.stop()
            return
        in_hand = [
            task
            for part in list(self._parts.values())
            if (task := part.task) is not None and not task.done()
        ]
        if self._keyed is not None:
            in_hand += [t for ts in self._keyed.tasks.values() for t in ts.values() if not t.done()]
        if in_hand and not self._committing and not self._signal_interrupted:
            self._signal_interrupted = True  # first: a CancelledError turned into another
            # exception by the handler is still the interruption (_process)
            self._log.warning(
                "handlers_interrupted",
                signal=sig.name,
                handlers=len(in_hand),
                note="second signal: the handlers in hand are cancelled; their records stay "
                "uncommitted and are read again; one more signal aborts the shutdown",
            )
            for task in in_hand:
                task.cancel()
            return
        if self._signals_received < 3:
            self._log.warning(
                "shutdown_signal_received",
                signal=sig.name,
                note="committing what was processed, then closing; one more signal aborts "
                "without the final commit",
            )
            return
        if self._aborted:
            return
        self._aborted = True
        self._log.error(
            "shutdown_aborted",
            signal=sig.name,
            note="third signal: the final commit and close are skipped; messages processed "
            "since the last commit will be consumed again",
        )
        task = self._run_task
        if task is not None and not task.done():
            task.cancel()

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self._handle_signals:
            return []
        return install_loop_signals(loop, self._on_signal, self._previous_signals)

    def _restore_signals(
        self, loop: asyncio.AbstractEventLoop, signals: list[signal.Signals]
    ) -> None:
        restore_loop_signals(loop, signals, self._previous_signals)

    def _copy_counters(self, txn: TransactionalRunner) -> None:
        health = txn.health()
        self.processed, self.dead_lettered = health.processed, health.dead_lettered
        self.retries, self.commit_failures = health.retries, health.commit_failures
        self.duplicates_skipped = health.duplicates_skipped
        self.blocked_warnings = txn.blocked_warnings

    def __repr__(self) -> str:
        return (
            f"<AsyncResilientConsumer group={self.group_id!r} topics={self._topics!r} "
            f"processed={self.processed} dead_lettered={self.dead_lettered}>"
        )


class _ProbeSource:
    """The asyncio consumer's state for :class:`~kresilient.consumer.ConsumerProbes`.

    A handler in hand is found by sampling (:meth:`sample`, the worker thread, once a
    second): the record each partition's worker has in hand, and since when the same one is;
    the hot path only stores the record it takes (``_Partition.inhand``)."""

    __slots__ = ("_consumer", "_inhand")

    def __init__(self, consumer: AsyncResilientConsumer) -> None:
        self._consumer = consumer
        #: partition -> (the record in hand at the last sample, when it was first seen)
        self._inhand: dict[TP, tuple[Message, float]] = {}

    def sample(self, now: float) -> None:
        seen: dict[TP, tuple[Message, float]] = {}
        previous = self._inhand
        for tp, part in list(self._consumer._parts.items()):
            msg = part.inhand
            if msg is None or part.held:  # idle, or a retry wait (retry_waits reports it)
                continue
            before = previous.get(tp)
            seen[tp] = before if before is not None and before[0] is msg else (msg, now)
        self._inhand = seen

    def stored_offsets(self) -> Mapping[TP, int]:
        return self._consumer._stored

    def handlers(self) -> list[tuple[float, Collection[str]]]:
        parts = self._consumer._parts
        return [
            (since, [f"{tp[0]}[{tp[1]}]"])
            for tp, (msg, since) in list(self._inhand.items())
            if (part := parts.get(tp)) is not None and part.inhand is msg and not part.held
        ]

    def retry_waits(self) -> list[tuple[TP, int, float]]:
        return [(tp, part.hold[0], part.due) for tp, part in self._consumer._held_states()]

    def held(self) -> Collection[TP]:
        return list(dict.fromkeys(tp for tp, _ in self._consumer._held_states()))

    def duplicates(self) -> int:
        return self._consumer.duplicates_skipped


def _check_ordering(
    ordering: str, max_in_flight: int, max_bytes: int, max_concurrency: int
) -> None:
    """Refuse what in-partition concurrency does not take, as ResilientConsumer does (the
    sync consumer's other refusals name options this consumer does not have)."""
    if ordering not in ORDERINGS:
        raise ConfigError(f"ordering must be one of {ORDERINGS}, got {ordering!r}", key="ordering")
    if max_in_flight < 1 or max_bytes < 1:
        raise ConfigError("max_in_flight and max_in_flight_bytes must be >= 1", key="ordering")
    if ordering != "partition" and max_concurrency != 1:
        raise ConfigError(
            f"ordering={ordering!r} does not combine with max_concurrency={max_concurrency}: "
            "max_in_flight bounds the handlers running at once in this mode",
            key="max_concurrency",
        )


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned step's outcome (no "exception was never retrieved")."""
    if not future.cancelled():
        future.exception()


def _is_async(handler: Any) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 (an object with async __call__)
    return call is not None and inspect.iscoroutinefunction(call)
