"""Exactly-once streaming writes: one Kafka transaction per task, committed with a batch marker.

For micro-batch ``B`` and Spark partition ``P`` of query ``Q`` (persistent id, survives
restarts), a task:

1. builds a transactional producer with ``transactional.id = <prefix>-<P>`` (stable across
   attempts, speculative copies and restarts) and calls ``init_transactions()``: the broker
   fences every older producer of that id and aborts its open transaction;
2. reads the marker: the committed offset of group ``<prefix>-<P>`` on ``(topic, 0)``, read with
   ``isolation.level=read_committed`` (stable: the fencing above completed any transaction).
   The broker deletes a member-less group's offsets after ``offsets.retention.minutes`` (7
   days by default), so the same marker is also written, in the same transaction, as a record
   keyed ``<prefix>-<P>`` to a compacted marker topic (``markerTopic``, default
   ``<topic>.kresilient-markers``), which keeps a key's latest record forever. When the group
   has no offset, the task reads the marker topic: a marker found there is the expired one;
   none means this partition never committed;
3. if the marker says ``B`` is committed (offset ``B + 1``), writes nothing and reports
   ``skipped`` (Spark replayed a batch whose partition had committed before a failure);
4. otherwise begins a transaction, produces every row (dead letters inside it), writes the
   marker record ``B + 1``, commits the marker ``B + 1`` with ``send_offsets_to_transaction``
   and commits: rows and both markers become visible atomically, to ``read_committed``
   consumers only.

Tripwires: the marker records the query id and the row count; a replay with another row count
(non-deterministic input) or a marker written by another query (a reused prefix) fails the task
with an explanation instead of silently skipping or duplicating.

To keep the transaction from ever becoming abortable over one bad row, the producer's
``message.max.bytes`` (and so ``batch.size``) is capped at the topic's ``max.message.bytes``: a
row too large for the topic is refused locally and dead-lettered (without its value) inside
the transaction. A row the broker refuses for another reason aborts the transaction and fails
the task (documented limit of this mode).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from kresilient import _catalog as catalog
from kresilient._txn import TransactionErrorKind, classify_transaction_error
from kresilient.errors import (
    TOO_LARGE_CODES,
    ConfigError,
    DeadLetterError,
    DeliveryError,
    FatalProducerError,
    KResilientError,
    ReplayMismatchError,
    classify,
)
from kresilient.redaction import Redactor
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
from kresilient.spark._write import (
    _STRIPPING,
    RedactingLogger,
    _Collector,
    _dead_letter_headers,
    _delivery_failure,
    _Entry,
    _Failure,
    _flushed_failures,
    _reasons,
    _Strip,
    _TaskWriter,
    _wait_for_room,
)

__all__ = [
    "ReplayMismatchError",
    "committed_batches",
    "ensure_marker_topic",
    "write_task_exactly_once",
]

_log = structlog.get_logger("kresilient.spark")

_TIMEOUT = 60.0
_MARKER_UNSET = -1001
#: Room for the record batch header and per-record overhead under the topic's limit.
_OVERHEAD = 1024
#: (bootstrap servers, topic) -> (max.message.bytes, when read, monotonic)
_topic_limits: dict[tuple[str, str], tuple[int, float]] = {}
#: How long a topic's max.message.bytes is trusted without a size refusal (a raised limit is
#: seen by the next task after this at the latest; a refusal re-reads it at once).
_LIMIT_TTL = 60.0
#: Coordinator errors of a marker read that clear by themselves (a fresh cluster's
#: __consumer_offsets still loading, a coordinator moving): retried until _TIMEOUT.
_COORDINATOR_CODES = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._WAIT_COORD,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


def transactional_prefix(options: SinkOptions, info: TaskInfo) -> str:
    """``transactionalIdPrefix`` if given, else ``kresilient-<query id>``."""
    if options.transactional_id_prefix:
        return options.transactional_id_prefix
    if info.query_id is None:
        raise KResilientError("exactly_once needs a streaming query (no query id on this task)")
    return f"kresilient-{info.query_id}"


def _connection_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a producer config that any client needs (bootstrap, security, ...)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        prop = catalog.lookup(key)
        if prop is not None and prop.scope == "*" and not callable(value):
            out[key] = value
    out.pop("client.id", None)
    out.pop("statistics.interval.ms", None)
    return out


def _topic_limit(config: Mapping[str, Any], topic: str, *, fresh: bool = False) -> int:
    """The topic's ``max.message.bytes``: cached per process for :data:`_LIMIT_TTL` seconds,
    read again when ``fresh`` (after a size refusal: the topic's setting may have changed)."""
    cache_key = (str(config.get("bootstrap.servers")), topic)
    cached = _topic_limits.get(cache_key)
    if cached is not None and not fresh and time.monotonic() - cached[1] < _LIMIT_TTL:
        return cached[0]
    admin = AdminClient(_connection_config(config))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT)
    limit = int(described["max.message.bytes"].value)
    _topic_limits[cache_key] = (limit, time.monotonic())
    return limit


def _forget_topic_limit(config: Mapping[str, Any], topic: str) -> None:
    _topic_limits.pop((str(config.get("bootstrap.servers")), topic), None)


def committed_batches(checkpoint: str | None) -> int | None:
    """How many micro-batches the query's checkpoint says it committed (files in its
    ``commits`` directory); ``None`` when that cannot be read from here (no checkpoint
    location in the options, or one on a remote file system)."""
    if not checkpoint:
        return None
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None
    commits = Path(parsed.path if parsed.scheme else checkpoint) / "commits"
    try:
        return sum(1 for p in commits.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return 0
    except OSError:
        return None


def ensure_marker_topic(config: Mapping[str, Any], name: str, *, committed: int | None = 0) -> None:
    """Create the compacted marker topic if it is missing; refuse one that would lose markers.

    Called on the driver when an exactly-once streaming query is planned. Raises
    :class:`~kresilient.ConfigError` (key ``markerTopic``) when the topic cannot be created,
    its ``cleanup.policy`` is not exactly ``compact`` (``delete`` would expire markers), or it
    has more than one partition (markers are read from partition 0).

    ``committed``: the micro-batches the query's checkpoint committed (:func:`committed_batches`;
    ``None``: unknown). A query that committed batches never gets a new, empty marker topic:
    its markers were in the missing one, and without them (the marker groups' offsets expire)
    a replay would write committed rows again. Then this raises, naming the topic.
    """
    admin = AdminClient(_connection_config(config))
    metadata = admin.list_topics(timeout=_TIMEOUT)  # all topics: never auto-creates one
    if name not in metadata.topics and committed:
        raise ConfigError(
            f"the marker topic {name!r} does not exist, but this query's checkpoint has "
            f"{committed} committed micro-batch(es): their exactly-once markers were in it "
            "(deleted?). Recreating it empty could write committed rows again. Restore the "
            "topic, or start a new query (a new checkpoint location); if this query never "
            "wrote with exactly_once, create the topic yourself (1 partition, "
            "cleanup.policy=compact)",
            key="markertopic",
        )
    if name not in metadata.topics:
        if committed is None:
            _log.warning(
                "spark_marker_topic_created_unchecked",
                topic=name,
                note="the query's checkpoint could not be read here (remote file system?): "
                "if this query committed micro-batches before, its markers were in a deleted "
                "topic of this name and a replay may write committed rows again",
            )
        replicas = min(3, len(metadata.brokers))
        new = NewTopic(
            name,
            num_partitions=1,
            replication_factor=replicas,
            config={"cleanup.policy": "compact", "min.insync.replicas": str(min(2, replicas))},
        )
        try:
            admin.create_topics([new], operation_timeout=_TIMEOUT)[name].result(timeout=_TIMEOUT)
            return  # created compacted just now (a describe could still miss it)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ConfigError(
                    f"guarantee=exactly_once keeps its batch markers in the compacted topic "
                    f"{name!r}, which could not be created ({exc.args[0].name()}): create it "
                    "with cleanup.policy=compact, or name another with the markerTopic option",
                    key="markertopic",
                ) from None
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    deadline = time.monotonic() + _TIMEOUT
    while True:  # a topic created a moment ago may not be known to every broker yet
        try:
            described = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT)
            break
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    partitions = len(metadata.topics[name].partitions) if name in metadata.topics else 1
    if partitions != 1:
        raise ConfigError(_many_partitions(name, partitions), key="markertopic")
    policy = described["cleanup.policy"].value
    if policy.replace(" ", "") != "compact":
        raise ConfigError(
            f"marker topic {name!r} has cleanup.policy={policy}: exactly_once needs "
            "cleanup.policy=compact (with delete, the broker would expire the batch markers "
            "and a replay would duplicate committed rows)",
            key="markertopic",
        )


def _many_partitions(name: str, partitions: int) -> str:
    return (
        f"marker topic {name!r} has {partitions} partitions: exactly_once needs a marker "
        "topic with exactly 1 partition (markers are read from partition 0; one on another "
        "partition would be missed and committed rows written again once the marker groups' "
        "offsets expire). Recreate it with 1 partition and cleanup.policy=compact (only while "
        "no query uses it: it holds their markers), or name another with the markerTopic option"
    )


def _read_durable_marker(
    config: Mapping[str, Any], consumer: Consumer, marker_topic: str, key: str
) -> tuple[int, dict[str, Any]] | None:
    """The latest committed marker record of ``key`` in the marker topic (``None``: none).

    Reads the whole (compacted) topic with ``consumer`` (``read_committed``) up to the high
    watermark seen before, so no committed marker hides behind another task's open
    transaction (the last stable offset waits for it). Only needed when the group offset is
    missing: a partition's first batch, or offsets the broker expired.
    """
    tp = TopicPartition(marker_topic, 0)
    probe = Consumer({**_connection_config(config), "group.id": key, "enable.auto.commit": False})
    try:
        found_topic = probe.list_topics(timeout=_TIMEOUT).topics.get(marker_topic)
        if found_topic is None:
            raise KResilientError(
                f"the marker topic {marker_topic!r} does not exist: exactly_once cannot tell "
                "which partitions of this micro-batch already committed (deleted? a new "
                "markerTopic?). Restore it or start a new query (new checkpoint)"
            )
        if len(found_topic.partitions) > 1:
            raise ConfigError(
                _many_partitions(marker_topic, len(found_topic.partitions)), key="markertopic"
            )
        _, end = probe.get_watermark_offsets(tp, timeout=_TIMEOUT)  # read_uncommitted: the HWM
    finally:
        probe.close()
    if end <= 0:
        return None
    wanted = key.encode()
    found: bytes | None = None
    wait = max(int(config.get("transaction.timeout.ms", 60000)) / 1000, 60.0) + 30.0
    deadline = time.monotonic() + wait
    consumer.assign([TopicPartition(marker_topic, 0, OFFSET_BEGINNING)])
    try:
        while True:
            for m in consumer.consume(num_messages=1000, timeout=0.5):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                if m.key() == wanted:
                    found = m.value()
            (pos,) = consumer.position([tp])
            if pos.offset >= end:
                break
            if time.monotonic() > deadline:
                raise KResilientError(
                    f"could not read the marker topic {marker_topic!r} to offset {end} within "
                    f"{wait:.0f} s (a transaction stays open on it?)"
                )
    finally:
        consumer.unassign()
    if found is None:
        return None
    meta: dict[str, Any] = json.loads(found)
    return int(meta["batch"]), meta


def _read_marker(consumer: Consumer, topic: str) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + _TIMEOUT
    delay = 0.1
    while True:
        try:
            (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=_TIMEOUT)
            if tp.error is not None:
                raise KafkaException(tp.error)
            break
        except KafkaException as exc:
            # The first task on a fresh cluster meets a coordinator still loading
            # __consumer_offsets; a coordinator moving says NOT_COORDINATOR: both clear.
            err = exc.args[0]
            code = err.code() if isinstance(err, KafkaError) else None
            if code not in _COORDINATOR_CODES or time.monotonic() + delay > deadline:
                raise
            _log.debug("spark_marker_read_retried", topic=topic, error=err.name())
            time.sleep(delay)  # backoff between attempts, bounded by the deadline above
            delay = min(delay * 2, 2.0)
    meta: dict[str, Any] = {}
    if tp.metadata:
        try:
            meta = json.loads(tp.metadata)
        except ValueError:
            meta = {}
    return tp.offset, meta


def _check_marker(meta: Mapping[str, Any], info: TaskInfo, prefix: str) -> None:
    query = meta.get("query")
    if query is not None and info.query_id is not None and query != info.query_id:
        raise ReplayMismatchError(
            f"transactional id prefix {prefix!r} was used by streaming query {query}; this is "
            f"query {info.query_id}. Give each query its own transactionalIdPrefix (a new "
            "checkpoint is a new query)"
        )


def write_task_exactly_once(
    options: SinkOptions,
    layout: ColumnLayout,
    batches: Iterator[Any],
    *,
    config: Mapping[str, Any],
    context: Any = task_info,
) -> TaskReport:
    """Write one task's rows in one transaction, or skip them if this batch already committed."""
    redactor = Redactor.for_config(config)
    try:
        return _write_task_exactly_once(options, layout, batches, config, context, redactor)
    except BaseException as exc:
        safe = scrubbed(exc, redactor)
        if safe is None:
            raise
        raise safe from None


def _write_task_exactly_once(
    options: SinkOptions,
    layout: ColumnLayout,
    batches: Iterator[Any],
    config: Mapping[str, Any],
    context: Any,
    redactor: Redactor,
) -> TaskReport:
    started = time.monotonic()
    info: TaskInfo = context()
    if info.batch_id is None:
        raise KResilientError("guarantee=exactly_once is only for streaming queries")
    topic = str(options.topic)
    prefix = transactional_prefix(options, info)
    name = f"{prefix}-{info.partition_id}"
    attrs = task_span_attributes(options, info)
    with tracer.start_as_current_span("kresilient.spark.write_task", attributes=attrs) as span:
        limit = min(
            int(config.get("message.max.bytes", 1_000_000)), _topic_limit(config, topic) - _OVERHEAD
        )
        sizing = _Sizing(config, topic, limit)
        collector = _Collector(redactor)
        conf = {k: v for k, v in config.items() if k != "delivery.report.only.error"}
        conf.update(
            {
                "transactional.id": name,
                "message.max.bytes": limit,
                "batch.size": min(int(conf.get("batch.size", 1_000_000)), limit),
                "delivery.report.only.error": True,
                "on_delivery": collector.on_delivery,
                "error_cb": collector.on_error,
                "logger": RedactingLogger(redactor),
            }
        )
        # librdkafka requires message.timeout.ms <= transaction.timeout.ms.
        if "transaction.timeout.ms" in options.producer:
            txn_timeout = int(conf["transaction.timeout.ms"])
            conf["message.timeout.ms"] = min(
                int(conf.get("message.timeout.ms", 300000)), txn_timeout
            )
        else:
            conf["transaction.timeout.ms"] = max(60000, int(conf.get("message.timeout.ms", 0)))
        producer = Producer(conf)
        consumer = Consumer(
            {
                **_connection_config(config),
                "group.id": name,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        try:
            producer.init_transactions(_TIMEOUT)  # fences older attempts, aborts their txn
            marker, meta = _read_marker(consumer, topic)
            if marker == _MARKER_UNSET:
                durable = _read_durable_marker(config, consumer, options.marker_topic_name, name)
                if durable is not None:
                    marker, meta = durable
                    _log.warning(
                        "spark_marker_group_offset_missing",
                        group=name,
                        marker=marker,
                        source=options.marker_topic_name,
                        note="the broker expired the marker group's offset "
                        "(offsets.retention.minutes); the durable marker record is used",
                    )
            _check_marker(meta, info, prefix)
            if marker != _MARKER_UNSET and marker >= info.batch_id + 1:
                rows = sum(b.num_rows for b in batches)
                if marker > info.batch_id + 1:
                    # Spark replays only its last batch: a marker past it means the
                    # checkpoint went back (partly reset, restored from a backup). These rows
                    # are skipped as written; if the batch now holds other rows, they are lost.
                    _log.error(
                        "spark_exactly_once_checkpoint_behind_marker",
                        group=name,
                        topic=topic,
                        partition=info.partition_id,
                        batch_id=info.batch_id,
                        marker_batch=marker - 1,
                        rows_skipped=rows,
                        note="the sink committed micro-batch up to the marker, the query's "
                        "checkpoint replays an older one: its rows are skipped as already "
                        "written. If the checkpoint was reset on purpose, start a new query "
                        "(new checkpoint and transactionalIdPrefix) instead",
                    )
                if marker == info.batch_id + 1 and meta.get("rows", rows) != rows:
                    raise ReplayMismatchError(
                        f"micro-batch {info.batch_id}, partition {info.partition_id} was "
                        f"committed with {meta.get('rows')} rows but is replayed with {rows}: "
                        "the input is not deterministic, exactly-once cannot hold"
                    )
                report = make_report(info, rows, {}, {}, started, skipped=True)
            else:
                report = _write_transaction(
                    producer, consumer, collector, options, layout, batches, info, sizing, name
                )
                report.seconds = time.monotonic() - started
        finally:
            consumer.close()
        span.set_attribute("kresilient.spark.rows", report.rows)
        span.set_attribute("kresilient.spark.skipped", report.skipped)
    record_report(options, report)
    return report


def _write_transaction(
    producer: Producer,
    consumer: Consumer,
    collector: _Collector,
    options: SinkOptions,
    layout: ColumnLayout,
    batches: Iterator[Any],
    info: TaskInfo,
    sizing: _Sizing,
    name: str,
) -> TaskReport:
    started = time.monotonic()
    topic = sizing.topic
    producer.begin_transaction()
    writer = _TaskWriter(options, layout, _Entry({}, producer, collector), check_partitions=True)
    try:
        writer.write_batches(batches)
        local = writer.local_failures
        writer.local_failures = []
        reported = _flushed_failures(producer, collector)  # raises for non-row errors
        if any(f.error.code() in TOO_LARGE_CODES for f in reported):
            sizing.forget()  # the topic's limit went down: the retry reads it again
        sizing.check_refusals(local)
        if reported:
            raise DeliveryError(
                "the broker refused rows inside the transaction (it is aborted): "
                + ", ".join(sorted({f.classification.name for f in reported})),
                failures=[_delivery_failure(f, i) for i, f in enumerate(reported)],
            )
        topics = _dead_letter_in_transaction(producer, collector, options, local, info.attempt)
        batch = info.batch_id + 1 if info.batch_id is not None else 0
        meta = {"query": info.query_id, "rows": writer.rows}
        # The durable marker, in the same transaction as the group offset below.
        record = json.dumps({"batch": batch, **meta}).encode()
        while True:
            try:
                producer.produce(options.marker_topic_name, record, name)
                break
            except BufferError:
                _wait_for_room(producer)
        marker = TopicPartition(topic, 0, batch, metadata=json.dumps(meta))
        producer.send_offsets_to_transaction([marker], consumer.consumer_group_metadata(), _TIMEOUT)
        _commit(producer)
    except BaseException:
        _abort_quietly(producer)
        raise
    return make_report(info, writer.rows, _reasons(local), topics, started)


class _Sizing:
    """The size limit a task's transactional producer was built with, and its check after a
    local size refusal: the topic's ``max.message.bytes`` may have been raised since it was
    read (issue 37 #4: the row was dead-lettered without its value although it now fits)."""

    def __init__(self, config: Mapping[str, Any], topic: str, limit: int) -> None:
        self.config = config
        self.topic = topic
        self.limit = limit  #: the producer's message.max.bytes

    def forget(self) -> None:
        _forget_topic_limit(self.config, self.topic)

    def check_refusals(self, local: list[_Failure]) -> None:
        """Raise (the transaction is aborted, Spark retries the task) when a row refused
        locally as too large fits the topic's limit read now: the producer cannot change its
        ``message.max.bytes``, the retry's producer is built with the new limit."""
        sizes = [
            len(f.value or b"") + len(f.key or b"")
            for f in local
            if f.topic == self.topic and f.error.code() in TOO_LARGE_CODES
        ]
        if not sizes:
            return
        now = min(
            int(self.config.get("message.max.bytes", 1_000_000)),
            _topic_limit(self.config, self.topic, fresh=True) - _OVERHEAD,
        )
        if now > self.limit:
            raise KResilientError(
                f"topic {self.topic!r}: max.message.bytes was raised while this task ran "
                f"(the producer's limit {self.limit} bytes, now {now}): {len(sizes)} row(s) "
                "refused as too large under the old limit may fit now. The transaction is "
                "aborted; the task's retry writes them with the new limit"
            )


def _dead_letter_in_transaction(
    producer: Producer,
    collector: _Collector,
    options: SinkOptions,
    failures: list[_Failure],
    attempt: int,
) -> dict[str, int]:
    """Dead letters go into the same transaction; a size failure's value is left out."""
    topics: dict[str, int] = {}
    for f in failures:
        dlq = options.dead_letter_topic_for(f.topic)
        if dlq is None:
            raise DeliveryError(
                f"a row could not be produced ({f.classification.name}) and dead letters are "
                "disabled (set the 'deadLetterTopic' option)",
                failures=[_delivery_failure(f, 0)],
            )
        # A row too large leaves its value out at once (it would not fit this producer's
        # limit, the topic's); refused again locally (a large key or headers), less of it.
        levels = _STRIPPING[1:] if f.error.code() in TOO_LARGE_CODES else _STRIPPING
        for strip in levels:
            headers = _dead_letter_headers(f, attempt, strip=strip, redactor=collector.redact)
            try:
                _produce_dead_letter(producer, dlq, f, strip, headers)
                break
            except DeadLetterError as exc:
                too_large = exc.classification and exc.classification.code in TOO_LARGE_CODES
                if not too_large or strip is levels[-1]:
                    raise
        topics[dlq] = topics.get(dlq, 0) + 1
    if failures:
        refused = _flushed_failures(producer, collector)
        if refused:
            raise DeadLetterError(
                f"{len(refused)} dead letter(s) refused by Kafka "
                f"({refused[0].classification.name})",
                topic=refused[0].topic,
                classification=refused[0].classification,
            )
    return topics


def _produce_dead_letter(
    producer: Producer,
    dlq: str,
    f: _Failure,
    strip: _Strip,
    headers: list[tuple[str, bytes | None]],
) -> None:
    key = None if strip.key else f.key
    value = None if strip.value else f.value
    while True:
        try:
            producer.produce(dlq, value, key, headers=headers)  # type: ignore[arg-type]
            return
        except BufferError:
            _wait_for_room(producer)
        except KafkaException as exc:
            raise DeadLetterError(
                f"could not write a dead letter to {dlq!r}: {exc.args[0].str()}",
                topic=dlq,
                classification=classify(exc.args[0]),
            ) from exc


def _commit(producer: Producer) -> None:
    """Commit, calling again on a retriable error (the shared rule, kresilient._txn). A
    commit that timed out has an unknown outcome: fatal, never called again on this epoch
    (KIP-890 defence); Spark's retry of the task builds a new producer, whose
    init_transactions() fences a late EndTxn, and its marker read says what committed."""
    for _ in range(3):
        try:
            producer.commit_transaction(_TIMEOUT)
            return
        except KafkaException as exc:
            err = exc.args[0]
            verdict = classify_transaction_error(exc, "commit_transaction")
            if verdict.kind is TransactionErrorKind.FATAL:
                raise FatalProducerError(
                    f"transaction commit failed ({verdict.reason}): {err.str()}",
                    code=err.code(),
                    name=err.name(),
                    classification=verdict.classification,
                ) from exc
            if verdict.kind is not TransactionErrorKind.RETRIABLE:
                raise
    producer.commit_transaction(_TIMEOUT)


def _abort_quietly(producer: Producer) -> None:
    # Fenced or fatal: the next init_transactions() of this transactional id aborts it anyway.
    with contextlib.suppress(KafkaException):
        producer.abort_transaction(_TIMEOUT)
