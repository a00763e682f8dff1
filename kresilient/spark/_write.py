"""Executor side of the ``kresilient`` Spark sink: one Spark task's write, start to commit.

A task turns the Arrow record batches Spark hands the Python worker into Kafka records, then
flushes and checks every delivery report before it returns its commit message:

* rows that can never be produced (too large, invalid, a ``partition`` the topic lacks, a null
  topic) go to the dead-letter topic with kresilient's error headers, and are counted;
* any other failure (delivery timeout, a fatal producer error, authorization, a missing topic)
  fails the task, so Spark retries it (at-least-once: a retry re-sends the whole partition);
* nothing is reported as written before the broker acknowledged it (acks=all, idempotent).

Producers are cached per Python worker process and keyed by their configuration (Spark reuses
workers across tasks and micro-batches); a task that fails for any reason discards its producer
so a retry never inherits a broken one (the built-in sink's SPARK-27042).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer

from kresilient.config import producer_config
from kresilient.deadletter import (
    DeadLetterHandle,
    DeadLetterRecord,
    DeadLetterWriter,
    dead_letter_headers,
)
from kresilient.errors import (
    TOO_LARGE_CODES,
    Classification,
    DeadLetterError,
    DeliveryError,
    DeliveryFailure,
    FatalProducerError,
    KResilientError,
    UnsafeConfigError,
    classify,
    failure_from_report,
    is_unproducible,
    translate,
)
from kresilient.reachability import AuthFailure, Reachability, client_certificate
from kresilient.redaction import Redactor, redact_text
from kresilient.spark._options import ColumnLayout, SinkOptions
from kresilient.spark._task import (
    TaskInfo,
    TaskReport,
    make_report,
    record_report,
    scrubbed,
    task_info,
    task_span_attributes,
    tracer,
)

__all__ = [
    "RedactingLogger",
    "TaskInfo",
    "TaskReport",
    "discard_producers",
    "sink_producer_config",
    "task_info",
    "write_task",
]

_log = structlog.get_logger("kresilient.spark")
#: Settings the sink forces whatever the options say (the guarantee depends on them).
FORCED: Mapping[str, str] = {"acks": "all", "enable.idempotence": "true"}

VALUE_DROPPED_HEADER = "kresilient.value.dropped.bytes"
"""On a dead letter whose value the dead-letter topic refused as too large: the value's size."""
KEY_DROPPED_HEADER = "kresilient.key.dropped.bytes"
"""On a dead letter still too large without its value: the key's size (key left out too)."""
HEADERS_DROPPED_HEADER = "kresilient.headers.dropped.bytes"
"""On a dead letter still too large without its value: the row's own headers' size (left out:
only kresilient's headers remain)."""


@dataclass(frozen=True)
class _Strip:
    """What a dead letter leaves out of its row (a size refusal moves to the next level)."""

    value: bool = False
    key: bool = False
    headers: bool = False


#: A dead letter keeps the whole row; too large: without the value; still too large (a large
#: key or headers): without key and the row's headers, kresilient's headers only, so a row
#: that can never be produced never fails the job over the size of its own dead letter.
_STRIPPING = (_Strip(), _Strip(value=True), _Strip(value=True, key=True, headers=True))


_ASIDE: Mapping[str, Any] = {"batch.num.messages": 1, "linger.ms": 0}
_DEAD_LETTER_MAX_BYTES = 16 * 1024 * 1024
_MAX_CACHED = 4
#: flush() in slices: between them the task checks for a refused login (and Python runs
#: signal handlers).
_FLUSH_SLICE = 1.0
_UNREACHABLE_LOG_INTERVAL = 60.0
_METADATA_TIMEOUT = 30.0
#: error_cb codes of a refused SASL login or TLS handshake.
_REFUSAL_CODES = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
#: error_cb codes of a failed connection (a broker's TLS alert among them).
_CONNECT_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})

#: A deeper local queue than librdkafka's 100k messages (bounded to 256 MiB), so a task rarely
#: waits for room while earlier rows are still being acknowledged (user settings win).
_QUEUE_DEFAULTS: Mapping[str, str] = {
    "queue.buffering.max.messages": "1000000",
    "queue.buffering.max.kbytes": "262144",
}


@dataclass
class _Failure:
    """A row Kafka refused: enough to dead-letter it and to say why."""

    topic: str | None
    partition: int
    key: bytes | str | None
    value: bytes | str | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: int
    error: KafkaError
    classification: Classification
    local: bool = False  # refused by the client before sending (not a delivery report)


class _Collector:
    """Delivery-report sink for one producer: only failures arrive (delivery.report.only.error)."""

    def __init__(
        self, redact: Callable[[str], str] = redact_text, *, certificate: str | None = None
    ) -> None:
        self.failures: list[_Failure] = []
        self.fatal: KafkaError | None = None
        self.redact = redact
        #: Recent client-level errors, redacted, by name: why rows time out (authentication,
        #: connection refused...). Named in the task's failure.
        self.client_errors: dict[str, str] = {}
        #: Refused logins and brokers down, the producer's rule for failing fast on them
        #: (:meth:`Reachability.final_refusal`); a flush that delivered marks it connected.
        self.reach = Reachability(_log, interval=_UNREACHABLE_LOG_INTERVAL, certificate=certificate)

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failures.append(_failure_from_report(err, msg, None))

    def on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.fatal = err
        # librdkafka echoes configuration values here (a malformed sasl.oauthbearer.config).
        text = self.redact(err.str() or "")
        if err.name() in self.client_errors or len(self.client_errors) < 5:
            self.client_errors[err.name()] = text
        code = err.code()
        if code in _REFUSAL_CODES:
            self.reach.refusal(text, code)
        elif code in _CONNECT_CODES:
            # a refused client certificate (mTLS: expired, unknown CA) is a _TRANSPORT whose
            # text is the broker's TLS alert ("alert certificate unknown")
            self.reach.failed(text)
        elif code == KafkaError._ALL_BROKERS_DOWN:
            self.reach.all_down(text)

    def reset(self) -> None:
        self.failures = []
        self.client_errors = {}


def _failure_from_report(
    err: KafkaError, msg: Any, headers: list[tuple[str, bytes | None]] | None
) -> _Failure:
    ts_type, ts = msg.timestamp()
    return _Failure(
        topic=msg.topic(),
        partition=msg.partition() if msg.partition() is not None else -1,
        key=msg.key(),
        value=msg.value(),
        headers=headers if headers is not None else msg.headers(),
        timestamp=ts if ts_type and ts > 0 else 0,
        error=err,
        classification=classify(err, context="delivery"),
    )


@dataclass
class _Entry:
    config: Mapping[str, Any]
    producer: Producer
    collector: _Collector
    single: tuple[Producer, _Collector] | None = None
    redactor: Redactor | None = None  #: removes this config's secrets from any text
    dead_letters: DeadLetterWriter | None = None

    def dead_letter_writer(self, options: SinkOptions) -> DeadLetterWriter:
        """The dead-letter writer of this producer's tasks (built on first use from the
        user's ``kafka.*`` options, room for values up to 16 MiB: the dead-letter topic
        decides what it accepts)."""
        if self.dead_letters is None:
            self.dead_letters = DeadLetterWriter(
                dict(options.producer),
                client_id="kresilient-spark",
                message_max_bytes=_DEAD_LETTER_MAX_BYTES,
            )
        return self.dead_letters

    def redact(self, text: str) -> str:
        if self.redactor is None:
            self.redactor = Redactor.for_config(self.config)
        return self.redactor(text)


_PRODUCERS: dict[tuple[tuple[str, str], ...], _Entry] = {}


def sink_producer_config(options: SinkOptions) -> dict[str, Any]:
    """The validated producer configuration of a write (no callbacks): safe defaults, forced
    acks=all + idempotence, unsafe values refused (:class:`~kresilient.UnsafeConfigError`)."""
    for name, forced in FORCED.items():
        given = options.producer.get(name)
        if given is not None and given.strip().lower() not in (forced, "-1"):
            raise translate_config(name, given)
    cfg = producer_config(dict(options.producer))
    cfg.update(FORCED)
    # Only failures need a Python callback (success is proven by flush() returning with an
    # empty queue). confluent-kafka applies this in its C callback, not in librdkafka: each
    # delivered row still costs a delivery event, but no Python call or object.
    cfg["delivery.report.only.error"] = True
    if "statistics.interval.ms" not in options.producer:
        cfg["statistics.interval.ms"] = "0"  # nobody reads statistics inside a Spark task
    for key, value in _QUEUE_DEFAULTS.items():
        if key not in options.producer:
            cfg[key] = value
    return cfg


def translate_config(name: str, given: str) -> KResilientError:
    """The refusal of a weakened forced setting, naming the option."""
    return UnsafeConfigError(
        f"kafka.{name}={given} is refused: the kresilient sink forces {name}={FORCED[name]} "
        "(its no-loss guarantee depends on it)",
        key=f"kafka.{name}",
        value=given,
    )


def _cache_key(cfg: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in cfg.items()))


def _acquire(cfg: Mapping[str, Any]) -> tuple[tuple[tuple[str, str], ...], _Entry]:
    key = _cache_key(cfg)
    entry = _PRODUCERS.get(key)
    if entry is None:
        while len(_PRODUCERS) >= _MAX_CACHED:
            _discard(next(iter(_PRODUCERS)))
        producer, collector = _new_producer(cfg)
        entry = _Entry(cfg, producer, collector)
        _PRODUCERS[key] = entry
    entry.collector.reset()
    return key, entry


def _new_producer(cfg: Mapping[str, Any]) -> tuple[Producer, _Collector]:
    redactor = Redactor.for_config(cfg)
    collector = _Collector(redactor, certificate=client_certificate(cfg))
    conf = dict(cfg)
    conf["on_delivery"] = collector.on_delivery
    conf["error_cb"] = collector.on_error
    conf.setdefault("logger", RedactingLogger(redactor))
    try:
        return Producer(conf), collector
    except KafkaException as exc:
        # librdkafka echoes the offending value (a malformed sasl.oauthbearer.config...).
        raise translate(exc, operation="produce", redactor=redactor) from None


class RedactingLogger:
    """librdkafka's log lines (``logger`` setting), redacted, into the ``kresilient.spark``
    logger; without it librdkafka writes them raw to the worker's stderr, which Spark keeps
    in the executor logs."""

    __slots__ = ("_redact",)

    def __init__(self, redact: Callable[[str], str]) -> None:
        self._redact = redact

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """The ``logging.Logger.log`` signature confluent-kafka calls."""
        _log.log(level, "librdkafka", line=self._redact(fmt % args if args else fmt))


def _aside_producer(entry: _Entry) -> tuple[Producer, _Collector]:
    """The producer for rows re-sent alone: one record per batch (``_TaskWriter.retry_alone``)."""
    if entry.single is None:
        entry.single = _new_producer({**entry.config, **_ASIDE})
    entry.single[1].reset()
    return entry.single


def _discard(key: tuple[tuple[str, str], ...]) -> None:
    """Drop a producer whose task failed: its queue belongs to a failed attempt."""
    entry = _PRODUCERS.pop(key, None)
    if entry is None:
        return
    for producer in (entry.producer, entry.single[0] if entry.single else None):
        if producer is None:
            continue
        try:
            producer.purge(in_queue=True, in_flight=False, blocking=False)
            producer.flush(2.0)
        except Exception as exc:  # best effort: the object is being thrown away
            _log.debug("spark_producer_discard_failed", error=entry.redact(str(exc)))
    if entry.dead_letters is not None:
        try:  # a failed task's dead letters were never counted: purging them loses nothing
            entry.dead_letters.close(2.0)
        except Exception as exc:
            _log.debug("spark_dead_letter_writer_discard_failed", error=entry.redact(str(exc)))


def discard_producers() -> None:
    """Close every cached producer of this process (called at exit; tests use it too)."""
    for key in list(_PRODUCERS):
        entry = _PRODUCERS.pop(key)
        entry.producer.flush(10.0)
        if entry.single is not None:
            entry.single[0].flush(10.0)
        if entry.dead_letters is not None:
            with contextlib.suppress(DeliveryError):  # every task flushed its own already
                entry.dead_letters.close(10.0)


atexit.register(discard_producers)


class _TaskWriter:
    """Produces one task's rows and dead letters; raises if anything is not acknowledged.

    ``check_partitions``: decide from the topic's metadata, before producing, that a row's
    ``partition`` does not exist (a local failure, dead-lettered). The exactly-once path needs
    it: its new transactional producer has no metadata yet, so librdkafka would report such a
    row only through a delivery report, after the transaction became abortable (issue 37 #5).
    """

    def __init__(
        self,
        options: SinkOptions,
        layout: ColumnLayout,
        entry: _Entry,
        *,
        check_partitions: bool = False,
    ) -> None:
        self.options = options
        self.layout = layout
        self.entry = entry
        self.producer = entry.producer
        self.collector = entry.collector
        self.rows = 0
        self.local_failures: list[_Failure] = []
        #: topic -> its partition count (None: unknown, the producer decides)
        self.partitions: dict[str, int | None] | None = {} if check_partitions else None

    def _lacks(self, topic: str, partition: int) -> bool:
        """``topic`` is known not to have ``partition`` (metadata read once per topic)."""
        assert self.partitions is not None
        if topic not in self.partitions:
            self.partitions[topic] = _partition_count(self.producer, topic)
        count = self.partitions[topic]
        return count is not None and not 0 <= partition < count

    def _missing_partition(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp: int,
    ) -> None:
        count = self.partitions.get(topic) if self.partitions is not None else None
        err = KafkaError(
            KafkaError._UNKNOWN_PARTITION,
            f"partition {partition} does not exist: topic {topic!r} has {count} partition(s)",
        )
        self.local_failures.append(
            _Failure(topic, partition, key, value, headers, timestamp, err, classify(err), True)
        )

    # -- produce --------------------------------------------------------------------------
    def write_batches(self, batches: Iterable[Any]) -> None:
        for batch in batches:
            n = batch.num_rows
            if n == 0:
                continue
            self.rows += n
            self._write_batch(batch, n)
            self.producer.poll(0)

    def _column(self, batch: Any, index: int | None, n: int, default: Any) -> Iterable[Any]:
        if index is None:
            return repeat(default, n)
        return batch.column(index).to_pylist()  # type: ignore[no-any-return]

    def _write_batch(self, batch: Any, n: int) -> None:
        lay = self.layout
        values = batch.column(lay.value).to_pylist()
        keys = self._column(batch, lay.key, n, None)
        if (
            lay.partition is None
            and lay.headers is None
            and lay.timestamp is None
            and (self.options.topic or lay.topic is None)
        ):
            self._write_simple(str(self.options.topic), values, keys)
            return
        topics: Iterable[Any] = (
            repeat(self.options.topic, n)
            if self.options.topic
            else batch.column(lay.topic).to_pylist()
        )
        partitions = self._column(batch, lay.partition, n, None)
        headers = _header_lists(batch.column(lay.headers)) if lay.headers is not None else None
        stamps = _millis(batch.column(lay.timestamp)) if lay.timestamp is not None else None
        # Delivery reports carry neither headers nor the timestamp: a failed row's are taken
        # from the batch, found by the row's index bound into its own delivery callback (rows
        # equal in value and key are not interchangeable: their headers may differ).
        report = (
            _BatchReport(self.collector, headers, stamps)
            if headers is not None or stamps is not None
            else None
        )
        produce = self.producer.produce
        for row, (topic, value, key, part, hdrs, ts) in enumerate(
            zip(
                topics,
                values,
                keys,
                partitions,
                headers if headers is not None else repeat(None, n),
                stamps if stamps is not None else repeat(0, n),
                strict=False,
            )
        ):
            p = -1 if part is None else part
            if topic is None:
                self._invalid_row(value, key, p, hdrs, ts or 0, "null topic")
                continue
            if self.partitions is not None and p != -1 and self._lacks(topic, p):
                self._missing_partition(topic, value, key, p, hdrs, ts or 0)
                continue
            callback = partial(report.failed, row) if report is not None else None
            try:  # positional: topic, value, key, partition, callback, (alias), timestamp, headers
                produce(topic, value, key, p, callback, None, ts or 0, hdrs)
            except (BufferError, KafkaException):
                self._produce_one(topic, value, key, p, hdrs, ts or 0, callback)

    def _write_simple(self, topic: str, values: list[Any], keys: Iterable[Any]) -> None:
        produce = self.producer.produce
        for value, key in zip(values, keys, strict=False):
            try:
                produce(topic, value, key)
            except (BufferError, KafkaException):
                self._produce_one(topic, value, key, -1, None, 0, None)

    def _produce_one(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp: int,
        report: Callable[[KafkaError | None, Any], None] | None,
    ) -> None:
        """The slow path of one row: wait for room, or classify a local refusal."""
        while True:
            try:
                produce = self.producer.produce
                produce(topic, value, key, partition, report, None, timestamp, headers)  # type: ignore[arg-type]
                return
            except BufferError:
                _wait_for_room(self.producer)
            except KafkaException as exc:
                err = exc.args[0]
                c = classify(err)
                if not _is_row_error(c):
                    raise translate(exc, topic=topic, operation="produce") from exc
                self.local_failures.append(
                    _Failure(topic, partition, key, value, headers, timestamp, err, c, local=True)
                )
                return

    def _invalid_row(
        self,
        value: Any,
        key: Any,
        partition: int,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp: int,
        reason: str,
    ) -> None:
        # INVALID_RECORD: the classification table's own POISON verdict for a record the
        # broker could never accept (no second, Spark-only notion of "poison").
        err = KafkaError(KafkaError.INVALID_RECORD, f"invalid row: {reason}")
        self.local_failures.append(
            _Failure(None, partition, key, value, headers, timestamp, err, classify(err), True)
        )

    # -- check ----------------------------------------------------------------------------
    def flush_and_check(self) -> list[_Failure]:
        """Wait for every delivery report; return the rows to dead-letter, raise for the rest."""
        failures = self.local_failures + _flushed_failures(self.producer, self.collector)
        self.local_failures = []
        # The broker refuses a whole batch when the batch exceeds the topic's
        # max.message.bytes: rows batched with an oversized one failed only by company.
        batched = [f for f in failures if not f.local and f.error.code() in TOO_LARGE_CODES]
        if batched:
            if len(batched) > 100:
                _log.warning(
                    "spark_batches_refused_as_too_large",
                    rows=len(batched),
                    hint="the topic's max.message.bytes is below the producer's batch.size: "
                    "set kafka.batch.size lower; these rows are re-sent one per request",
                )
            alone = {id(f) for f in batched}
            failures = [f for f in failures if id(f) not in alone] + self.retry_alone(batched)
        return failures

    def retry_alone(self, failures: list[_Failure]) -> list[_Failure]:
        """Send each row again in a batch of its own; return the rows that still fail."""
        producer, collector = _aside_producer(self.entry)
        for f in failures:
            while True:
                try:
                    producer.produce(
                        f.topic,  # type: ignore[arg-type]
                        f.value,
                        f.key,
                        partition=f.partition,
                        timestamp=f.timestamp,
                        headers=f.headers,  # type: ignore[arg-type]
                        on_delivery=_Resent(collector, f),
                    )
                    break
                except BufferError:
                    _wait_for_room(producer)
        return _flushed_failures(producer, collector)

    def dead_letter(self, failures: list[_Failure], attempt: int) -> dict[str, int]:
        """Write ``failures`` to their dead-letter topics; raise unless all are acknowledged.

        Written by the library's one :class:`~kresilient.deadletter.DeadLetterWriter` (cached
        with this task's producer). The dead letter keeps the row's key, value and headers
        plus kresilient's error headers (:func:`kresilient.deadletter.dead_letter_headers`). A
        value the dead-letter topic refuses as too large is dropped on a second try, its size
        kept in the ``kresilient.value.dropped.bytes`` header, so an oversized row never fails
        the job.
        """
        writer = self.entry.dead_letter_writer(self.options)
        done: list[_DeadLetter] = []
        pending = failures
        for strip in _STRIPPING:
            sent = [self._send_dead_letter(writer, f, attempt, strip) for f in pending]
            _settle(writer)
            # Still too large: again with less of the row (the next level), while one is left.
            pending = [d.failure for d in sent if d.too_large() and strip is not _STRIPPING[-1]]
            done += [d for d in sent if not (d.too_large() and strip is not _STRIPPING[-1])]
            if not pending:
                break
        failed = [d for d in done if d.error() is not None]
        if failed:
            first = failed[0].error()
            raise DeadLetterError(
                f"{len(failed)} dead letter(s) to {failed[0].topic!r} not acknowledged by Kafka"
                f" ({first.message if first else '?'})",
                topic=failed[0].topic,
                classification=first.classification if first else None,
            )
        topics: dict[str, int] = {}
        for d in done:
            topics[d.topic] = topics.get(d.topic, 0) + 1
        return topics

    def _send_dead_letter(
        self, writer: DeadLetterWriter, f: _Failure, attempt: int, strip: _Strip
    ) -> _DeadLetter:
        dlq = self.options.dead_letter_topic_for(f.topic)
        if dlq is None:
            raise DeliveryError(
                f"a row could not be produced ({f.classification.name}: "
                f"{f.classification.remedy}) and dead letters are disabled "
                "(set the 'deadLetterTopic' option)",
                failures=[_delivery_failure(f, 0)],
            )
        headers = _dead_letter_headers(f, attempt, strip=strip, redactor=self.entry.redact)
        record = DeadLetterRecord(
            topic=dlq,
            key=None if strip.key else _raw(f.key),
            value=None if strip.value else _raw(f.value),
            headers=headers,
        )
        try:
            return _DeadLetter(f, dlq, writer.write(record), None)
        except DeadLetterError as exc:  # refused before sending (too large for the writer...)
            return _DeadLetter(f, dlq, None, exc)


def _raw(data: bytes | str | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


def _settle(writer: DeadLetterWriter) -> None:
    """Wait for every dead letter; each one's outcome is then read from its handle."""
    with contextlib.suppress(DeliveryError):
        writer.flush()


@dataclass
class _DeadLetter:
    """One dead-letter write: its handle, or the refusal that kept it from being queued."""

    failure: _Failure
    topic: str
    handle: DeadLetterHandle | None
    refused: DeadLetterError | None

    def error(self) -> DeadLetterError | None:
        if self.handle is None:
            return self.refused
        return self.handle.exception(0)

    def too_large(self) -> bool:
        err = self.error()
        return err is not None and err.classification.code in TOO_LARGE_CODES


def _partition_count(producer: Producer, topic: str) -> int | None:
    """``topic``'s partition count from the cluster's metadata (``None``: not known; the
    producer then decides, and a missing topic fails the task as it does without this)."""
    try:
        metadata = producer.list_topics(topic, timeout=_METADATA_TIMEOUT)
    except KafkaException:
        return None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        return None
    return len(found.partitions)


def _wait_for_room(producer: Producer) -> None:
    """The local queue is full: wait until delivery reports free some room.

    ``poll(timeout)`` returns as soon as a report is served. confluent-kafka applies
    ``delivery.report.only.error`` in its own callback, not in librdkafka: every delivered
    row still raises a delivery event (only the Python call is skipped), so the poll wakes
    as the queue drains.
    """
    producer.poll(0.05)


def _flushed_failures(producer: Producer, collector: _Collector) -> list[_Failure]:
    """Flush; return the row failures reported, raise for any other failure."""
    sent = len(producer)
    while producer.flush(_FLUSH_SLICE):
        refusal = collector.reach.final_refusal(all_down=True)
        if refusal is not None:
            _fail_refused(producer, collector, refusal)
    if len(producer):  # flush() returns 0 only when the queue is empty
        raise DeliveryError(f"{len(producer)} message(s) still queued after flush()")
    if sent and not collector.failures:
        collector.reach.connected()  # rows were acknowledged: the login works
    fatal = collector.fatal
    if fatal is not None:
        raise FatalProducerError(
            f"fatal producer error: {collector.redact(fatal.str() or '')}",
            code=fatal.code(),
            name=fatal.name(),
            classification=classify(fatal),
        )
    failures, client_errors = collector.failures, collector.client_errors
    collector.reset()
    task_errors = [f for f in failures if not _is_row_error(f.classification)]
    if task_errors:
        error = DeliveryError(failures=[_delivery_failure(f, i) for i, f in enumerate(task_errors)])
        if client_errors:
            seen = "; ".join(f"{n}: {t}" for n, t in client_errors.items())
            error = DeliveryError(
                f"{error.message} | client errors meanwhile: {seen}", failures=error.failures
            )
        raise error
    return failures


def _fail_refused(producer: Producer, collector: _Collector, refusal: AuthFailure) -> None:
    """No broker ever accepted this producer's login or certificate, and every broker is down
    for it: fail the task now, naming the cause, instead of after ``message.timeout.ms``.

    The rows still queued are purged (never sent: nothing in flight is touched) and listed as
    AUTH failures, not possibly persisted; the task fails and Spark retries or fails the job.
    The producer ResilientProducer's rule (:meth:`Reachability.final_refusal`): a producer
    that was connected before (a password rotated under it) keeps retrying.
    """
    with contextlib.suppress(KafkaException):
        producer.purge(in_queue=True, in_flight=False, blocking=False)
    producer.flush(_FLUSH_SLICE)  # serves the purged rows' reports
    classification = refusal.classification(
        possibly_persisted=False,
        note="The rows were failed at once: no broker ever accepted this producer, so they "
        "were never sent and not written",
    )
    failures = [dataclasses.replace(f, classification=classification) for f in collector.failures]
    collector.reset()
    _log.error(
        "kafka_authentication_failed",
        **refusal.log_fields(),
        rows=len(failures),
        note="queued rows failed at once (never sent)",
    )
    raise DeliveryError(
        f"{len(failures)} row(s) not sent: the cluster refused this producer "
        f"({classification.category.name}, {KafkaError(refusal.code).name()}): "
        f"{refusal.describe()}",
        failures=[_delivery_failure(f, i) for i, f in enumerate(failures)],
    )


class _Resent:
    """Delivery callback of a row re-sent alone: a report carries neither its headers nor its
    timestamp, the first failure does (rare path: one object per re-sent row)."""

    __slots__ = ("collector", "first")

    def __init__(self, collector: _Collector, first: _Failure) -> None:
        self.collector = collector
        self.first = first

    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            failure = _failure_from_report(err, msg, self.first.headers)
            failure.timestamp = self.first.timestamp
            self.collector.failures.append(failure)


class _BatchReport:
    """Headers and timestamps of one Arrow batch, for the delivery reports of its rows.

    Only failures reach :meth:`failed` (``delivery.report.only.error``). A report carries the
    row's topic, partition, key and value but not its headers nor its timestamp: each row's
    callback is ``partial(report.failed, <row index>)``, so the failed row is the one that was
    produced, never another row equal to it in value or key (issue 37 #1).
    """

    __slots__ = ("collector", "headers", "stamps")

    def __init__(
        self,
        collector: _Collector,
        headers: list[list[tuple[str, bytes | None]] | None] | None,
        stamps: list[int | None] | None,
    ) -> None:
        self.collector = collector
        self.headers = headers
        self.stamps = stamps

    def failed(self, row: int, err: KafkaError | None, msg: Any) -> None:
        """Delivery callback of row ``row`` of the batch."""
        if err is None:
            return
        failure = _failure_from_report(err, msg, self.headers[row] if self.headers else None)
        if self.stamps is not None:
            failure.timestamp = self.stamps[row] or 0
        self.collector.failures.append(failure)


def _header_lists(column: Any) -> list[list[tuple[str, bytes | None]] | None]:
    """An Arrow ``list<struct<key, value>>`` column as one header list per row (``None``: no
    headers), built from the flat child arrays: no dict per header as ``to_pylist()`` makes.

    When every row has the same number of headers (the usual case: a fixed set added by one
    layer), the lists are cut with ``zip`` over one iterator instead of a slice per row. The
    cyclic garbage collector is paused meanwhile: these lists and tuples cannot form cycles,
    and its passes over the millions of containers just made cost 4x the building itself
    (measured: 1.3 vs 0.26 us per row of two headers).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build_header_lists(column)
    finally:
        if enabled:
            gc.enable()


def _build_header_lists(column: Any) -> list[list[tuple[str, bytes | None]] | None]:
    import pyarrow.compute as pc

    n = len(column)
    if n and column.null_count == 0:
        bounds = pc.min_max(pc.list_value_length(column))
        width = bounds["min"].as_py()
        if width == bounds["max"].as_py():
            if width == 0:
                return [None] * n
            flat = column.flatten()  # this slice's headers only
            pairs = zip(_names(flat.field("key")), flat.field("value").to_pylist(), strict=True)
            return list(map(list, zip(*[pairs] * width, strict=True)))
    offsets = column.offsets.to_pylist()  # absolute positions into column.values
    every = list(
        zip(
            _names(column.values.field("key")),
            column.values.field("value").to_pylist(),
            strict=True,
        )
    )
    return [every[offsets[i] : offsets[i + 1]] or None for i in range(n)]


def _names(keys: Any) -> list[Any]:
    """Header names as Python strings, one object per distinct name: confluent-kafka caches a
    string's UTF-8 form in the object, so a name repeated on every row is encoded once."""
    encoded = keys.dictionary_encode()
    names = encoded.dictionary.to_pylist()
    return [None if i is None else names[i] for i in encoded.indices.to_pylist()]


def _millis(column: Any) -> list[int | None]:
    """Spark's microsecond timestamps as Kafka's milliseconds (truncated, as Java does)."""
    import pyarrow as pa

    return column.cast(pa.timestamp("ms"), safe=False).cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]


def _is_row_error(c: Classification) -> bool:
    """A row error is a row that can never be produced (kresilient's one definition, shared
    with the producer and the consumer). A delivery timeout or a purge is NOT one: the row
    may succeed on a retry (and may even have been written), so it fails the task."""
    return is_unproducible(c)


def _delivery_failure(f: _Failure, index: int) -> DeliveryFailure:
    return failure_from_report(
        f.error,
        None,
        topic=f.topic or "",
        partition=f.partition,
        key=f.key,
        value=f.value,
        headers=f.headers,
        classification=f.classification,
        message_id=index,
    )


def _dead_letter_headers(
    f: _Failure,
    attempt: int,
    *,
    strip: _Strip,
    redactor: Callable[[str], str] | None = None,
) -> list[tuple[str, bytes | None]]:
    headers = list(
        dead_letter_headers(
            f.topic or "",
            f.partition if f.partition >= 0 else None,
            None,
            f.timestamp or None,
            None,
            translate(f.error, topic=f.topic, operation="produce", redactor=redactor),
            f.classification,
            attempt + 1,
            original_headers=None if strip.headers else f.headers,
            # the writer's config's secrets out of kresilient's free-text headers
            redact=redactor or redact_text,
        )
    )
    if strip.value and f.value is not None:
        headers.append((VALUE_DROPPED_HEADER, str(len(f.value)).encode()))
    if strip.key and f.key is not None:
        headers.append((KEY_DROPPED_HEADER, str(len(f.key)).encode()))
    if strip.headers and f.headers:
        size = sum(len(k) + len(v or b"") for k, v in f.headers)
        headers.append((HEADERS_DROPPED_HEADER, str(size).encode()))
    return headers


def write_task(
    options: SinkOptions,
    layout: ColumnLayout,
    batches: Iterator[Any],
    *,
    config: Mapping[str, Any],
    context: Callable[[], TaskInfo] = task_info,
) -> TaskReport:
    """Write one task's Arrow batches; return its report only once all rows are acknowledged."""
    started = time.monotonic()
    info = context()
    key, entry = _acquire(config)
    attrs = task_span_attributes(options, info)
    with tracer.start_as_current_span("kresilient.spark.write_task", attributes=attrs) as span:
        writer = _TaskWriter(options, layout, entry)
        try:
            writer.write_batches(batches)
            failures = writer.flush_and_check()
            topics = writer.dead_letter(failures, info.attempt) if failures else {}
        except BaseException as exc:
            _discard(key)  # never hand a failed attempt's producer to the retry
            # poll() and flush() raise a fatal error as it is (an idempotent producer refused
            # its producer id: CLUSTER_AUTHORIZATION_FAILED): named, with its remedy, redacted.
            error = (
                translate(exc, operation="produce", redactor=entry.redact)
                if isinstance(exc, KafkaException)
                else exc
            )
            safe = scrubbed(error, entry.redact)
            if safe is not None:
                raise safe from None
            if error is exc:
                raise
            raise error from None
        report = make_report(info, writer.rows, _reasons(failures), topics, started)
        span.set_attribute("kresilient.spark.rows", report.rows)
        span.set_attribute("kresilient.spark.dead_lettered", report.dead_lettered)
    record_report(options, report)
    return report


def _reasons(failures: list[_Failure]) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in failures:
        out[f.classification.name] = out.get(f.classification.name, 0) + 1
    return out
