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

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer

from kresilient.config import SECRET_KEYS, producer_config, redact
from kresilient.errors import (
    ConfigError,
    DeliveryError,
    DeliveryFailure,
    ErrorCategory,
    FatalProducerError,
    MessageTooLargeError,
    ProduceError,
    classify,
    translate,
)
from kresilient.leadership import LeadershipMonitor, LeadershipState
from kresilient.producer import _paths as paths
from kresilient.producer._handle import DeliveryHandle, DeliveryResult, _FullHandle, handle_extras
from kresilient.producer._health import BrokerStats, ProducerHealth, broker_stats
from kresilient.producer._support import (
    LogBridge,
    category_counts,
    compose_delivery_error,
    fatal_cause,
    scrubber,
)
from kresilient.telemetry import Telemetry

__all__ = ["DeliveryHandle", "DeliveryResult", "ProducerHealth", "ResilientProducer"]

#: poll(0) once every this many produce() calls (mask: a power of two minus one), so delivery
#: reports are served even if the application never polls.
_POLL_MASK: Final = 1023
#: At most this many delivered, unreferenced handles are kept for reuse.
_POOL_MAX: Final = 65536
#: Callbacks kresilient installs itself; a user's own are chained after kresilient's.
_CHAINED_CALLBACKS: Final = ("error_cb", "stats_cb", "on_delivery", "logger")
_TOO_LARGE: Final = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
_DEFAULT_MAX_BYTES: Final = 1_000_000
#: Identical global errors (error_cb) are logged at most once per this many seconds.
_ERROR_LOG_INTERVAL: Final = 5.0
_ERROR_LEVEL_CATEGORIES: Final = frozenset({ErrorCategory.AUTH, ErrorCategory.CONFIG})


_new_handle = object.__new__


def _lean_handle(owner: ResilientProducer) -> DeliveryHandle:
    handle: DeliveryHandle = _new_handle(DeliveryHandle)
    handle._owner = owner
    return handle


def _closed_produce(*_args: Any, **_kwargs: Any) -> None:
    raise KafkaException(KafkaError(KafkaError._STATE, "producer is closed"))


def _no_poll(_timeout: float = 0) -> int:
    return 0


class ResilientProducer:
    """A producer with safe defaults whose flush() reports every failed message.

    Args:
        config: confluent-kafka / librdkafka configuration (never mutated). ``error_cb``,
            ``stats_cb`` and ``on_delivery`` in it are called after kresilient's own handling.
        allow_unsafe: keys whose weakening values are accepted (one warning is logged).
        dead_letter_topic: where values over ``message.max.bytes`` go (raw bytes, original
            headers plus the ``kresilient.*`` error headers); ``None``: raise instead.
        recreate_on_fatal: rebuild the underlying producer after a fatal error instead of
            raising :class:`~kresilient.FatalProducerError`.
        logger: a structlog logger (default ``structlog.get_logger("kresilient.producer")``),
            bound to this client's ``client_id``.
        tracer_provider, meter_provider, propagator: OpenTelemetry; default: the global ones.
        backpressure_timeout: seconds produce() waits (polling) for room in a full local queue.
        dead_letter_max_bytes: ``message.max.bytes`` of the dead-letter producer.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        allow_unsafe: Iterable[str] = (),
        dead_letter_topic: str | None = None,
        recreate_on_fatal: bool = False,
        logger: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        propagator: Any = None,
        backpressure_timeout: float = 60.0,
        dead_letter_max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        base_log = logger if logger is not None else structlog.get_logger("kresilient.producer")
        allow = tuple([allow_unsafe] if isinstance(allow_unsafe, str) else allow_unsafe)
        cfg = producer_config(config, allow_unsafe=allow, logger=base_log)
        self._user_config = config
        self._allow_unsafe = allow
        self._user_cb: dict[str, Any] = {name: cfg.pop(name, None) for name in _CHAINED_CALLBACKS}
        for name, cb in self._user_cb.items():
            if cb is not None and name != "logger" and not callable(cb):
                raise ConfigError(f"{name} must be callable", key=name)
        self._scrub = scrubber(
            str(v) for k, v in cfg.items() if k in SECRET_KEYS and isinstance(v, str)
        )
        self._rdk_config = cfg
        self.client_id: str = str(cfg.get("client.id", ""))
        self._log = base_log.bind(client_id=self.client_id, kafka_role="producer")
        self._max_bytes = int(cfg.get("message.max.bytes", _DEFAULT_MAX_BYTES))
        self._backpressure_timeout = float(backpressure_timeout)
        self._dead_letter_topic = dead_letter_topic
        self._dead_letter_max_bytes = int(dead_letter_max_bytes)
        self._recreate_on_fatal = recreate_on_fatal

        max_age = cfg.get("metadata.max.age.ms")
        self._monitor = LeadershipMonitor(
            metadata_max_age_ms=int(max_age) if max_age is not None else None, logger=self._log
        )
        self._tel_args = {
            "tracer_provider": tracer_provider,
            "meter_provider": meter_provider,
            "propagator": propagator,
        }
        self._tel = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=propagator,
            client_id=self.client_id,
            logger=self._log,
        )
        self._monitor.add_listener(self._tel.leadership_listener())
        self._tracing = self._tel.enabled

        self._lock = threading.Lock()  # the failures list
        self._recreate_lock = threading.Lock()
        self._reported: deque[tuple[DeliveryHandle, Any, Any]] = deque()
        self._pool: deque[DeliveryHandle] = deque(maxlen=_POOL_MAX)
        self._failures: list[DeliveryFailure] = []
        self._failed_total = 0
        self._unaccounted = 0
        self._callback_errors = 0
        self._backpressure_waits = 0
        self._recreations = 0
        self._pending_fatal: KafkaException | None = None
        self._fatal: FatalProducerError | None = None
        self._closed = False
        self._brokers: BrokerStats | None = None
        self._last_error: tuple[str, float] | None = None
        self._logged_at: dict[object, float] = {}
        self._ids = itertools.count(1)
        self._default_cb = self._user_cb["on_delivery"]
        self._lean = not self._tracing and self._default_cb is None
        self._dlq: Any = None  # a ResilientProducer for the dead-letter topic, made on first use
        self._log_bridge = LogBridge(
            self._log,
            self._monitor.on_log,
            self._scrub,
            user_logger=self._user_cb["logger"],
            on_failure=self._callback_raised,
        )

        self._producer: Any = None
        self._produce: Callable[..., None] = _closed_produce
        self._poll: Callable[[float], int] = _no_poll
        self._install(self._new_producer())
        self._log.info(
            "producer_created",
            config=redact(self._rdk_config),
            tracing=self._tracing,
            dead_letter_topic=dead_letter_topic,
            recreate_on_fatal=recreate_on_fatal,
        )

    # ------------------------------------------------------------------ construction

    def _new_producer(self) -> Producer:
        conf = dict(self._rdk_config)
        conf["error_cb"] = self._on_error
        conf["stats_cb"] = self._on_stats
        conf["logger"] = self._log_bridge
        try:
            return Producer(conf)
        except KafkaException as exc:
            raise translate(
                KafkaException(KafkaError(exc.args[0].code(), self._scrub(exc.args[0].str())))
                if exc.args and isinstance(exc.args[0], KafkaError)
                else exc,
                operation="configure",
            ) from None

    def _install(self, producer: Producer) -> None:
        self._producer = producer
        self._produce = producer.produce
        self._poll = producer.poll

    # ------------------------------------------------------------------ hot path

    def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
    ) -> DeliveryHandle:
        """Queue one message; return its :class:`DeliveryHandle` (never blocks on the network).

        ``on_delivery(err, msg)`` is called like confluent-kafka's (the handle is already
        done inside it); an exception it raises is logged and counted, never propagated.

        Raises :class:`~kresilient.MessageTooLargeError` (without a dead-letter topic), a
        BACKPRESSURE :class:`~kresilient.ProduceError` when the local queue stayed full for
        ``backpressure_timeout``, :class:`~kresilient.FatalProducerError`, or another
        classified :class:`~kresilient.ProduceError` from librdkafka's local checks.
        """
        n = next(self._ids)
        if headers is None and on_delivery is None and self._lean:
            pool = self._pool  # delivered handles nobody kept
            if pool:
                try:
                    handle = pool.pop()
                except IndexError:  # another thread took the last one
                    handle = _lean_handle(self)
            else:
                handle = _lean_handle(self)
            handle._id = n
        else:
            handle, headers = self._full_handle(
                n, topic, key, value, headers, partition, on_delivery
            )
        part = -1 if partition is None else partition
        ts = 0 if timestamp is None else timestamp
        try:
            self._produce(topic, value, key, part, handle, None, ts, headers)
        except BufferError:
            return paths.produce_blocked(self, topic, value, key, part, handle, ts, headers)
        except KafkaException as exc:
            return paths.produce_failed(self, exc, topic, value, key, part, handle, ts, headers)
        if not n & _POLL_MASK:
            self._tick()
        return handle

    def _full_handle(
        self,
        n: int,
        topic: str,
        key: Any,
        value: Any,
        headers: Any,
        partition: int | None,
        on_delivery: Any,
    ) -> tuple[_FullHandle, Any]:
        """A handle for a message with headers, a callback or a span, and the headers to send.

        The handle keeps the caller's headers (what a failure report should show and a re-send
        should use); the headers sent carry the trace context when a span was started.
        """
        token = None
        sent = headers
        if self._tracing:
            sent, token = self._tel.producer_send(
                topic, key, len(value) if value is not None else 0, headers, partition
            )
        cb = self._default_cb if on_delivery is None else on_delivery
        return _FullHandle(self, n, headers, cb, token), sent

    def _tick(self) -> None:
        """Every _POLL_MASK+1 messages: serve delivery reports, pick up a late tracer provider."""
        self.poll(0)
        if not self._tracing and not self._closed:
            self._tracing = self._tel.enabled
            self._lean = not self._tracing and self._default_cb is None

    def _settle(self, exc: BaseException | None) -> None:
        paths.settle(self, exc)

    # ------------------------------------------------------------------ delivery reports

    def _delivered_traced(self, handle: _FullHandle, msg: Any) -> None:
        self._tel.producer_delivered(handle._token, None, msg, None)

    def _process_reported(self) -> None:
        """Classify the failure reports the handles queued (outside librdkafka callbacks)."""
        reported = self._reported
        while reported:
            try:
                handle, err, msg = reported.popleft()
            except IndexError:  # another thread took the last one
                return
            self._delivery_failed(handle, err, msg)

    def _delivery_failed(self, handle: DeliveryHandle, err: KafkaError, msg: Any) -> None:
        # In a delivery report librdkafka has retried what it could: UNKNOWN_TOPIC_OR_PART
        # there means a missing topic (CONFIG), not a leader move.
        classification = classify(err, context="delivery")
        partition = msg.partition()
        offset = msg.offset()
        value = msg.value()
        topic = msg.topic()
        failure = DeliveryFailure(
            topic=topic,
            partition=partition if partition is not None and partition >= 0 else None,
            offset=offset if offset is not None and offset >= 0 else None,
            key=msg.key(),
            value_size=len(value) if value is not None else 0,
            headers=handle_extras(handle)[0],
            classification=classification,
            error=err,
            message_id=handle._id,
        )
        cls = MessageTooLargeError if err.code() in _TOO_LARGE else ProduceError
        handle._error = cls(
            self._scrub(err.str()),
            code=err.code(),
            name=err.name(),
            topic=topic,
            partition=failure.partition,
            classification=classification,
        )
        with self._lock:
            self._failures.append(failure)
            self._failed_total += 1
        self._monitor.on_error(err, topic, failure.partition)
        if isinstance(handle, _FullHandle) and handle._token is not None:
            self._tel.producer_delivered(handle._token, err, msg, classification)
            handle._token = None
        self._log.debug(
            "delivery_failed",
            topic=topic,
            partition=failure.partition,
            message_id=handle._id,
            error=err.name(),
            category=classification.category.name,
            possibly_persisted=classification.possibly_persisted,
        )

    def _callback_raised(self, exc: Exception) -> None:
        """A callback raised. A fatal error cutting in is kept for poll()/flush() to handle."""
        fatal = fatal_cause(exc)
        if fatal is not None:
            self._pending_fatal = fatal
            return
        self._callback_errors += 1
        if self._rate_ok(type(exc).__name__):
            self._log.error(
                "callback_failed", error=repr(exc), errors=self._callback_errors, exc_info=exc
            )

    def _rate_ok(self, key: object) -> bool:
        now = time.monotonic()
        last = self._logged_at.get(key)
        if last is not None and now - last < _ERROR_LOG_INTERVAL:
            return False
        self._logged_at[key] = now
        return True

    # ------------------------------------------------------------------ librdkafka callbacks

    def _on_error(self, err: KafkaError) -> None:
        try:
            self._last_error = (err.name(), time.time())
            self._monitor.on_error(err)
            if self._rate_ok(err.code()):
                c = classify(err)
                level = "error" if c.category in _ERROR_LEVEL_CATEGORIES else "warning"
                getattr(self._log, level)(
                    "kafka_client_error",
                    error=err.name(),
                    code=err.code(),
                    reason=self._scrub(err.str()),
                    category=c.category.name,
                    remedy=c.remedy,
                )
            cb = self._user_cb["error_cb"]
            if cb is not None:
                cb(err)
        except Exception as exc:
            self._callback_raised(exc)

    def _on_stats(self, stats_json: str) -> None:
        try:
            doc = json.loads(stats_json)
            self._monitor.on_stats(doc)
            self._brokers = broker_stats(doc)
            cb = self._user_cb["stats_cb"]
            if cb is not None:
                cb(stats_json)
        except Exception as exc:
            self._callback_raised(exc)

    # ------------------------------------------------------------------ public API

    def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports and callbacks for up to ``timeout`` seconds; return how many.

        Raises :class:`~kresilient.FatalProducerError` on a fatal error (unless
        ``recreate_on_fatal``).
        """
        try:
            served = self._poll(timeout)
        except (KafkaException, SystemError) as exc:
            served = 0
            self._settle(exc)
        else:
            if self._reported or self._pending_fatal is not None:
                self._settle(None)
        if self._dlq is not None:
            served += self._dlq.poll(0)
        return served

    def _take_failures(self) -> list[DeliveryFailure]:
        self._process_reported()
        with self._lock:
            failures, self._failures = self._failures, []
        return failures

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is delivered or failed (``timeout``: seconds).

        Raises :class:`~kresilient.DeliveryError` listing every message that failed since the
        previous flush (each with its classification), and also when messages are still queued
        or in flight at the timeout: success is never reported while messages remain.
        Raises :class:`~kresilient.FatalProducerError` when a fatal error surfaces (without
        ``recreate_on_fatal``); the messages it failed are listed by the next ``flush()`` or
        ``close()``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        remaining = 0
        while self._producer is not None:
            left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            recreations = self._recreations
            try:
                remaining = self._producer.flush(left)
            except (KafkaException, SystemError) as exc:
                self._settle(exc)  # raises unless the producer was recreated
                continue
            if self._pending_fatal is not None:
                self._settle(None)
            if self._recreations == recreations:
                break
        failures = self._take_failures()
        if self._dlq is not None:
            try:
                self._dlq.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))
            except DeliveryError as exc:
                failures.extend(exc.failures)
        unaccounted, self._unaccounted = self._unaccounted, 0
        if not failures and not remaining and not unaccounted:
            if self._fatal is not None:
                raise self._fatal
            return
        raise self._delivery_error(failures, remaining, unaccounted, timeout)

    def _delivery_error(
        self,
        failures: list[DeliveryFailure],
        remaining: int,
        unaccounted: int,
        timeout: float | None,
    ) -> DeliveryError:
        self._log.warning(
            "delivery_failures",
            failed=len(failures),
            by_category=category_counts(failures),
            remaining=remaining,
            unaccounted=unaccounted,
        )
        error = compose_delivery_error(failures, remaining, unaccounted, timeout)
        if self._fatal is not None:
            error.__cause__ = self._fatal
        return error

    def close(self, timeout: float | None = None) -> None:
        """Flush, then release the producer. Idempotent.

        Messages still queued when ``timeout`` expires are purged and reported in the
        :class:`~kresilient.DeliveryError` (never dropped silently).
        """
        if self._closed:
            return
        failures: list[DeliveryFailure] = []
        try:
            self.flush(timeout)
        except DeliveryError as exc:
            failures.extend(exc.failures)
        except FatalProducerError:
            pass  # raised to the caller before, or just now by flush; what it failed follows
        lost = 0
        if self._producer is not None and len(self._producer) > 0:
            lost = paths.drain(self._producer)
        failures.extend(self._take_failures())
        if self._dlq is not None:
            try:
                self._dlq.close(timeout)
            except DeliveryError as exc:
                failures.extend(exc.failures)
        lost += self._unaccounted
        self._unaccounted = 0
        self._closed = True
        self._produce = _closed_produce
        self._poll = _no_poll
        self._producer = None  # destroys the librdkafka instance (its queue is empty)
        self._log.info("producer_closed", failed=len(failures), unaccounted=lost)
        if failures or lost:
            raise self._delivery_error(failures, 0, lost, timeout)

    def __enter__(self) -> ResilientProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except DeliveryError as delivery:  # do not mask the exception already propagating
            exc.add_note(f"kresilient: while closing the producer: {delivery}")

    def __del__(self) -> None:
        # Dropped without close(): messages still queued would vanish with the client.
        try:
            left = len(self._producer) if self._producer is not None else 0
            if left and not self._closed:
                self._log.error(
                    "producer_dropped_without_close",
                    queued=left,
                    note="call flush()/close() or use the context manager",
                )
        except Exception:  # interpreter shutdown: nothing left to report to
            pass

    def __len__(self) -> int:
        """Messages queued, in flight, or awaiting their delivery report."""
        return len(self._producer) if self._producer is not None else 0

    @property
    def leadership(self) -> LeadershipMonitor:
        """The :class:`~kresilient.LeadershipMonitor` fed by this producer's statistics."""
        return self._monitor

    def health(self) -> ProducerHealth:
        """A snapshot for health checks: brokers up, in flight, failures, leadership, metadata."""
        states = self._monitor.states()
        churn = tuple(
            f"{t}[{p}]" for (t, p), s in states.items() if s is LeadershipState.SUSTAINED_CHURN
        )
        produced = int(self._ids.__reduce__()[1][0]) - 1
        snapshot = self._monitor.snapshot()
        brokers = self._brokers
        last = self._last_error
        return ProducerHealth(
            client_id=self.client_id,
            closed=self._closed,
            fatal_error=self._fatal.name if self._fatal is not None else None,
            brokers_up=brokers.up if brokers is not None else None,
            brokers_total=brokers.total if brokers is not None else None,
            in_flight=len(self),
            produced=produced,
            failed_total=self._failed_total,
            failed_since_flush=len(self._failures),
            backpressure_waits=self._backpressure_waits,
            recreations=self._recreations,
            callback_errors=self._callback_errors,
            leadership={f"{t}[{p}]": s.name for (t, p), s in sorted(states.items())},
            sustained_churn=churn,
            stale_metadata=tuple(self._monitor.stale_metadata()),
            metadata_age_ms={
                t: v["metadata_age_ms"]
                for t, v in snapshot["topics"].items()
                if v.get("metadata_age_ms") is not None
            },
            last_error=last[0] if last is not None else None,
            last_error_at=last[1] if last is not None else None,
            monitor=snapshot,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("fatal" if self._fatal else "open")
        return (
            f"<ResilientProducer client_id={self.client_id!r} {state} in_flight={len(self)} "
            f"failed_since_flush={len(self._failures)}>"
        )
