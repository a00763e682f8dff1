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
  Kafka Streams header sets; written by a :class:`~kresilient.ResilientProducer`;
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

import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, cast

import structlog
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from opentelemetry.propagators.composite import CompositePropagator

from kresilient.consumer._batch import BatchMixin
from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._events import EventsMixin
from kresilient.consumer._failures import FailureMixin
from kresilient.consumer._holds import TP, Hold, Verdict
from kresilient.consumer._offsets import OffsetKeeper
from kresilient.consumer._support import (
    NOT_RETRIED,
    BatchItemError,
    Deserializer,
    Deserializing,
    RetryPolicy,
    SignalHandlers,
    Watchdog,
    auto_commit,
    build_consumer_config,
    dead_letter_producer_config,
    literal_topics,
    max_poll_interval,
)
from kresilient.deadletter import (
    CircuitBreakerPolicy,
    DeadLetterPolicy,
)
from kresilient.errors import (
    ConfigError,
    KResilientError,
    classify,
    translate,
)
from kresilient.leadership import LeadershipMonitor
from kresilient.producer import ResilientProducer
from kresilient.redaction import Redactor, redact_config
from kresilient.telemetry import Telemetry

__all__ = [
    "NOT_RETRIED",
    "BatchItemError",
    "ResilientConsumer",
    "RetryPolicy",
]

Handler = Callable[[Message], object]
BatchHandler = Callable[[list[Message]], object]
RebalanceListener = Callable[[list[TopicPartition]], object]

_DEFAULT_RETRY: Final = RetryPolicy()
_DEFAULT_DEAD_LETTER: Final = DeadLetterPolicy()
_DEFAULT_BREAKER: Final = CircuitBreakerPolicy()
#: The dead-letter producer must not replace the original ``traceparent`` header: the record's
#: trace context goes to ``kresilient.traceparent`` instead (see kresilient.deadletter).
_NO_PROPAGATION: Final = CompositePropagator([])


def drop_unassigned(
    msgs: list[Message], assigned: set[TP]
) -> tuple[list[Message], list[Message]]:
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


class ResilientConsumer(FailureMixin, EventsMixin, BatchMixin):
    """A consumer loop that commits only what was processed or durably dead-lettered.

    Args:
        config: confluent-kafka / librdkafka config (never mutated); ``group.id`` required.
            ``error_cb``, ``stats_cb`` and ``on_commit`` in it are called after kresilient's.
        topics: topic names (or ``^regex`` patterns) to subscribe to.
        handler: called with each ``confluent_kafka.Message``; returning means success.
        batch_handler: instead of ``handler``: called with a list of messages of ONE
            partition, in offset order; raise :class:`BatchItemError` to name the failed item.
        retry: the :class:`RetryPolicy`.
        dead_letter: the :class:`~kresilient.DeadLetterPolicy`; ``None``: no dead-letter
            topic, a message that exhausts its retries stops the consumer (its offset is not
            committed) and ``run()`` raises its exception.
        circuit_breaker: the :class:`~kresilient.CircuitBreakerPolicy`; ``None``: no limit.
        key_deserializer, value_deserializer: ``(bytes | None, SerializationContext) -> Any``
            (confluent-kafka ``Deserializer`` objects fit); the handler then sees the
            deserialized key/value; a failure is dead-lettered with the raw bytes.
        allow_unsafe: config keys whose weakening values are accepted.
        dead_letter_producer: a :class:`~kresilient.ResilientProducer` to write dead letters
            with (not closed by this consumer); default: one made from ``config``'s
            connection settings, updated by ``dead_letter_producer_config``.
        max_batch_size: messages fetched per ``consume()`` call (handled one by one).
        poll_timeout: seconds one ``consume()`` call waits when idle (bounds stop latency).
        install_signal_handlers: route SIGTERM/SIGINT to :meth:`stop` during :meth:`run`
            (main thread only).
        on_assign, on_revoke, on_lost: called with the partitions after kresilient's own
            handling (on revoke: after the synchronous commit).
        logger: a structlog logger (default ``structlog.get_logger("kresilient.consumer")``).
        tracer_provider, meter_provider, propagator, link_mode: OpenTelemetry (see
            :class:`~kresilient.telemetry.Telemetry`); default: the global providers.
        shutdown_timeout: seconds to wait for outstanding dead-letter writes on revoke/close.
        record_message_key: put the message key on process spans
            (``messaging.kafka.message.key``); off by default, keys often carry personal data.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        handler: Handler | None = None,
        *,
        batch_handler: BatchHandler | None = None,
        retry: RetryPolicy = _DEFAULT_RETRY,
        dead_letter: DeadLetterPolicy | None = _DEFAULT_DEAD_LETTER,
        circuit_breaker: CircuitBreakerPolicy | None = _DEFAULT_BREAKER,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
        allow_unsafe: Iterable[str] = (),
        dead_letter_producer: ResilientProducer | None = None,
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
    ) -> None:
        if (handler is None) == (batch_handler is None):
            raise ConfigError("pass exactly one of handler= and batch_handler=")
        self._topics = [topics] if isinstance(topics, str) else list(topics)
        if not self._topics:
            raise ConfigError("topics must name at least one topic")
        if max_batch_size < 1 or poll_timeout <= 0:
            raise ConfigError("max_batch_size must be >= 1 and poll_timeout > 0")
        base_log = logger if logger is not None else structlog.get_logger("kresilient.consumer")
        # every log line, exception and repr of this consumer goes through it (issue 11, 5)
        self._redact = Redactor.for_config(config)
        cfg = build_consumer_config(config, allow_unsafe, base_log)
        self._user_cb: dict[str, Callable[..., Any] | None] = {
            name: cfg.pop(name, None) for name in ("error_cb", "stats_cb", "on_commit")
        }
        self.group_id: str = str(cfg["group.id"])
        self.client_id: str = str(cfg.get("client.id", ""))
        self._log = base_log.bind(
            client_id=self.client_id, group_id=self.group_id, kafka_role="consumer"
        )
        self._rdk_config = cfg
        self._user_config = config
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
            self._call = self._deser.call_batch if self._deser is not None else batch_handler
        else:
            assert handler is not None
            self._call = self._deser if self._deser is not None else handler

        self._retry_policy = retry
        self._retrying = retry.retrying()
        self._dlq_policy = dead_letter
        self._breaker = CircuitBreaker(circuit_breaker) if circuit_breaker is not None else None
        self._dlq_producer = dead_letter_producer
        self._own_dlq_producer = dead_letter_producer is None
        self._dlq_producer_config = dict(dead_letter_producer_config or {})
        self._max_batch = max_batch_size
        self._poll_timeout = poll_timeout
        self._shutdown_timeout = shutdown_timeout
        self._listeners = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        self._tel_args = {"tracer_provider": tracer_provider, "meter_provider": meter_provider}

        max_age = cfg.get("metadata.max.age.ms")
        self._monitor = LeadershipMonitor(
            metadata_max_age_ms=int(max_age) if max_age is not None else None, logger=self._log
        )
        self._tel = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=propagator,
            client_id=self.client_id,
            consumer_group=self.group_id,
            link_mode=link_mode,
            record_message_key=record_message_key,
            logger=self._log,
        )
        self._monitor.add_listener(self._tel.leadership_listener())
        self._traced = False

        # loop state
        self._holds: dict[TP, Hold] = {}
        self._excluded: set[TP] = set()
        self._batch: list[Message] = []
        self._nonsuccess = 0
        self._credited = 0
        self._batch_errors = False
        self._stop_requested = False
        self._interrupt = False
        self._overrun = False
        self._started = False
        self._closed = False
        self._fatal: KResilientError | None = None
        self._error_logged: dict[int, float] = {}
        # counters (health)
        self._processed = 0
        self._retries = 0
        self._rebalances = {"assigned": 0, "revoked": 0, "lost": 0}
        self._revocations = 0  # revoke + lost callbacks so far (see _loop)

        self._watchdog = Watchdog(max_poll_interval(cfg) / 2, self._on_overrun)
        self._signals = SignalHandlers(self.stop, lambda: self._stop_requested, self._log)
        self._install_signals = install_signal_handlers

        conf = dict(cfg)
        conf["error_cb"] = self._on_error
        conf["stats_cb"] = self._on_stats
        conf["on_commit"] = self._on_commit
        try:
            self._consumer = Consumer(conf)
        except KafkaException as exc:
            raise translate(exc, operation="configure", redactor=self._redact) from None
        self._offsets = OffsetKeeper(
            self._consumer,
            self._log,
            self._tel,
            dead_letter.topic_for if dead_letter is not None else lambda _t: None,
            self._redact,
        )
        self._log.info(
            "consumer_created",
            config=redact_config(cfg),
            topics=self._topics,
            dead_letter=dead_letter is not None,
            batch=self._batch_mode,
        )

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return after the message in hand (thread- and signal-safe)."""
        self._stop_requested = True
        self._interrupt = True

    def run(self) -> None:
        """Consume until :meth:`stop`, SIGTERM or SIGINT; then commit and leave the group.

        Raises :class:`~kresilient.CircuitBreakerOpenError`, :class:`~kresilient.DeadLetterError`
        (a dead-letter write failed), :class:`~kresilient.ConsumeError` (fatal consumer error)
        or, without a dead-letter topic, the handler's exception, always after the graceful
        shutdown. Can be called once.
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
        if policy is not None:
            if policy.require_topic:
                self._check_dead_letter_topics(policy)
            if self._dlq_producer is None:
                conf = dead_letter_producer_config(self._user_config, self.client_id)
                conf.update(self._dlq_producer_config)
                self._dlq_producer = ResilientProducer(
                    conf, logger=self._log, propagator=_NO_PROPAGATION, **self._tel_args
                )
        self._consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._next_commit = time.monotonic() + self._commit_interval
        self._watchdog.start()
        self._log.info("consumer_started", topics=self._topics)

    def _check_dead_letter_topics(self, policy: DeadLetterPolicy) -> None:
        wanted = sorted({policy.topic_for(t) for t in literal_topics(self._topics)})
        if not wanted:
            return
        try:
            metadata = self._consumer.list_topics(timeout=10)
        except KafkaException as exc:
            raise translate(exc, operation="consume", redactor=self._redact) from exc
        missing = [
            t for t in wanted if t not in metadata.topics or metadata.topics[t].error is not None
        ]
        if missing:
            raise ConfigError(
                f"dead-letter topic(s) {missing} do not exist: create them (replicated like "
                "the source topics) or pass DeadLetterPolicy(require_topic=False)",
                key=None,
            )

    def _loop(self) -> None:
        consume = self._consumer.consume
        process = self._process_batches if self._batch_mode else self._process
        watchdog = self._watchdog
        tel = self._tel
        size = self._max_batch
        recheck = 0.0
        while not self._stop_requested:
            if self._fatal is not None:
                raise self._fatal
            timeout = self._poll_timeout
            if self._holds:
                timeout = self._service_holds(timeout)
            if self._offsets.pending:
                self._release_dead_letters()
            if not self._auto_commit and time.monotonic() >= self._next_commit:
                self._next_commit = time.monotonic() + self._commit_interval
                self._offsets.commit_async()
            revocations = self._revocations
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
            if self._revocations != revocations and msgs:
                # A rebalance was served inside a consume() call after an earlier call of this
                # iteration had returned messages: those of partitions revoked meanwhile were
                # committed past on revoke and belong to their new owner now (issue 11, 10).
                msgs = self._drop_unassigned(msgs)
            if not msgs:
                continue
            watchdog.started = now = time.monotonic()
            if now >= recheck:  # a tracer provider may be installed after start
                self._traced = tel.enabled
                recheck = now + 1.0
            process(msgs)
            watchdog.started = 0.0

    def _drop_unassigned(self, msgs: list[Message]) -> list[Message]:
        try:
            assignment = self._consumer.assignment()
        except KafkaException as exc:  # cannot tell: keep nothing (the owner re-fetches them)
            self._log.warning("assignment_unknown", error=self._redact(str(exc)))
            assignment = []
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
        call = self._traced_call if self._traced else self._call
        holds = self._holds
        on_failure = self._on_failure
        self._batch = msgs
        self._nonsuccess = self._credited = 0
        self._batch_errors = False
        msg: Message | None = None
        try:
            for msg in msgs:
                if msg.error() is not None:
                    self._nonsuccess += 1
                    self._batch_errors = True
                    self._consume_error(msg)
                    continue
                if holds:
                    hold = holds.get((msg.topic(), msg.partition()))  # type: ignore[arg-type]
                    if hold is not None:
                        self._held(hold, msg, call)
                        if self._interrupt:
                            break
                        continue
                try:
                    call(msg)
                except _Handled as handled:
                    self._nonsuccess += 1
                    if handled.stop is not None:
                        raise handled.stop from None
                except Exception as exc:
                    on_failure(msg, exc)
                    self._nonsuccess += 1
                if self._interrupt:
                    break
            else:
                msg = None
        except BaseException:
            # stopping with an exception (breaker open, KeyboardInterrupt in the handler ...):
            # the message in hand is not done, whatever happened to it
            self._finish(msgs, msg, done=False)
            raise
        self._finish(msgs, msg)

    def _traced_call(self, msg: Message) -> None:
        """``call`` inside a process span; failures are handled inside the span.

        Nothing but the handler's own ``BaseException`` escapes the span block: the span and
        ``messaging.process.duration`` carry the handler's exception (one exception event),
        never ``_Handled`` (issue 23, 2), which is raised after the span ended.
        """
        stop: BaseException | None = None
        with self._tel.process_span(cast(Any, msg), group=self.group_id):
            try:
                self._call(msg)
            except Exception as exc:
                self._tel.set_error(exc, classify(exc))
                try:
                    self._on_failure(msg, exc)
                except BaseException as raised:  # breaker open, no DLQ ...: re-raised by the loop
                    stop = raised
            else:
                return
        raise _Handled(stop)

    def _held(self, hold: Hold, msg: Message, call: Callable[[Any], object]) -> None:
        """A message of a held partition: skip it, or run the held message's next attempt."""
        verdict = hold.verdict(msg.offset())  # type: ignore[arg-type]
        if verdict is Verdict.SKIP:
            self._excluded.add(hold.tp)
            self._nonsuccess += 1
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
            del self._holds[hold.tp]
        try:
            call(msg)
        except _Handled as handled:
            self._nonsuccess += 1
            if handled.stop is not None:
                raise handled.stop from None
            return
        except Exception as exc:
            self._on_failure(msg, exc)
            self._nonsuccess += 1
            return
        if verdict is Verdict.RETRY:
            self._holds.pop(hold.tp, None)
            self._excluded.discard(hold.tp)
            self._log.info(
                "message_retry_succeeded",
                topic=hold.tp[0],
                partition=hold.tp[1],
                offset=hold.offset,
                attempts=hold.attempts + 1,
                held_s=round(time.monotonic() - hold.first_failure, 3),
            )

    def _finish(self, msgs: list[Message], last_seen: Message | None, *, done: bool = True) -> None:
        """Store the offsets of what this batch processed; give back the rest on overrun.

        ``last_seen``: the message the loop stopped at (``None``: all were seen); ``done``:
        whether that message was dealt with (handled, dead-lettered or held).
        """
        n = len(msgs) if last_seen is None else msgs.index(last_seen) + int(done)
        seq = msgs if n == len(msgs) else msgs[:n]
        if self._batch_errors:
            last = {(m.topic(), m.partition()): m for m in seq if m.error() is None}
        else:
            last = {(m.topic(), m.partition()): m for m in seq}
        excluded = self._excluded
        if excluded:
            for tp in excluded:
                last.pop(tp, None)
            excluded.clear()
        self._offsets.store_last(last)  # type: ignore[arg-type]
        ok = n - self._nonsuccess
        self._processed += ok
        if self._breaker is not None and ok > self._credited:
            self._breaker.record_successes(ok - self._credited)
        self._batch = []
        if self._overrun and n < len(msgs):
            self._give_back(msgs[n:])
        if self._overrun:
            self._overrun = False
            self._interrupt = self._stop_requested

    def _release_dead_letters(self) -> None:
        """Serve the dead-letter producer; store past acknowledged writes (raises on failed)."""
        if self._dlq_producer is not None:
            self._dlq_producer.poll(0)
        self._offsets.release()

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self, error: BaseException | None) -> None:
        self._signals.shutting_down = True  # a 2nd signal no longer interrupts (3rd aborts)
        self._log.info(
            "consumer_stopping",
            dead_letters_pending=self._offsets.pending_count(),
            error=type(error).__name__ if error is not None else None,
        )
        self._watchdog.stop()
        producer = self._dlq_producer
        steps: list[tuple[str, Callable[[], None]]] = [
            ("commit", lambda: self._offsets.commit_sync("close")),
            ("close_consumer", self._consumer.close),
        ]
        if producer is not None and self._offsets.pending:
            steps.insert(
                0,
                (
                    "await_dead_letters",
                    lambda: self._offsets.wait(producer, None, self._shutdown_timeout),
                ),
            )
        if self._own_dlq_producer and producer is not None:
            steps.append(("close_dead_letter_producer", lambda: producer.close(10)))
        try:
            for name, step in steps:
                try:
                    step()
                except Exception as exc:  # the next steps still run (commit, close)
                    self._log.warning(
                        "shutdown_step_failed", step=name, error=self._redact(repr(exc))
                    )
        finally:  # a third signal aborts (KeyboardInterrupt, logged by SignalHandlers)
            self._closed = True
            self._signals.restore()
        self._log.info(
            "consumer_closed",
            processed=self._processed,
            retries=self._retries,
            dead_lettered=self._offsets.dead_lettered,
            error=type(error).__name__ if error is not None else None,
        )

    def close(self) -> None:
        """Release the consumer without running (``run()`` closes by itself). Idempotent."""
        if self._closed:
            return
        if self._started:
            self.stop()
            return
        self._closed = True
        try:
            self._consumer.close()
        finally:
            if self._own_dlq_producer and self._dlq_producer is not None:
                self._dlq_producer.close(10)

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

    def health(self) -> dict[str, Any]:
        """A snapshot for health endpoints (safe to call from another thread)."""
        for _ in range(10):  # the loop thread may change the dicts while we copy them
            try:
                return self._health()
            except RuntimeError:
                continue
        return self._health()

    def _health(self) -> dict[str, Any]:
        breaker, offsets = self._breaker, self._offsets
        return {
            "group_id": self.group_id,
            "client_id": self.client_id,
            "running": self._started and not self._closed,
            "stopping": self._stop_requested,
            "processed": self._processed,
            "retries": self._retries,
            "dead_lettered": self._offsets.dead_lettered,
            "dead_letters_pending": offsets.pending_count(),
            "held_partitions": [h.snapshot() for h in list(self._holds.values())],
            "rebalances": dict(self._rebalances),
            "commit_failures": offsets.commit_failures,
            "last_commit_error": str(offsets.last_commit_error)
            if offsets.last_commit_error is not None
            else None,
            "circuit_breaker": breaker.snapshot() if breaker is not None else None,
            "leadership": self._monitor.snapshot(),
        }

    @property
    def consumer(self) -> Consumer:
        """The underlying ``confluent_kafka.Consumer`` (do not commit or store through it)."""
        return self._consumer

    def __repr__(self) -> str:
        return (
            f"<ResilientConsumer group={self.group_id!r} topics={self._topics!r} "
            f"processed={self._processed} dead_lettered={self._offsets.dead_lettered}>"
        )
