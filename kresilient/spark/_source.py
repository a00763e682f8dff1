"""``kresilient``: a PySpark data source that writes DataFrames to Kafka without losing rows.

A drop-in for Spark's built-in Kafka sink (same columns, same ``kafka.*`` options), written
with PySpark's Python Data Source API (Arrow-based writers) on librdkafka::

    from kresilient.spark._source import register, last_write_summary

    register(spark)
    (df.selectExpr("CAST(id AS STRING) AS key", "payload AS value")
       .write.format("kresilient")                 # was: .format("kafka")
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .mode("append")
       .save())
    print(last_write_summary())                    # rows written / dead-lettered

    (stream_df.writeStream.format("kresilient")
       .option("kafka.bootstrap.servers", "broker:9092").option("topic", "orders")
       .option("checkpointLocation", "/chk/orders").start())

Guarantee: **at-least-once** by default. ``acks=all`` and idempotence are forced and unsafe
settings refused; a task reports success only after Kafka acknowledged every row, so a job or
micro-batch that succeeded wrote every row at least once. A retried task re-sends its
partition (as with the built-in sink), so duplicates are possible after task retries or a
streaming restart. Rows that can never be produced (too large, invalid) go to a dead-letter
topic (``deadLetterTopic``, default ``<topic>.dlq``) with kresilient's error headers instead of
failing the job; retriable failures fail the task so Spark retries it.

``.option("guarantee", "exactly_once")`` (streaming only): one Kafka transaction per task with a
batch marker committed in it, so a replayed micro-batch is skipped where it had committed; for
``read_committed`` consumers, given deterministic replay. See docs/spark.md for the
preconditions.

Importing this module needs pyspark and pyarrow (``pip install kresilient[spark]``); ``import
kresilient`` alone never imports them.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        WriterCommitMessage,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "kresilient.spark needs pyspark>=4.0 and pyarrow: pip install 'kresilient[spark]'"
    ) from exc
try:  # Arrow batches for streaming writers came with pyspark 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - pyspark 4.0: batch writes only
    DataSourceStreamArrowWriter = None  # type: ignore[assignment,misc]

import structlog
from opentelemetry import trace

from kresilient.errors import ConfigError
from kresilient.redaction import Redactor
from kresilient.spark import _fork_guard
from kresilient.spark._options import (
    PLAN_REDACTION_REGEX,
    ColumnLayout,
    SchemaError,
    SinkOptions,
    column_layout,
    parse_options,
    redact_plan_options,
)
from kresilient.spark._summary import (
    WriteSummary,
    all_summaries,
    latest_summary,
    store_summary,
    summarize,
    summary_of,
)
from kresilient.spark._task import TaskReport, scrubbed
from kresilient.spark._write import sink_producer_config, write_task

__all__ = [
    "FORMAT",
    "PLAN_REDACTION_REGEX",
    "KResilientDataSource",
    "SchemaError",
    "TaskReport",
    "WriteSummary",
    "last_write_summary",
    "register",
    "write",
    "write_stream",
    "write_summaries",
]

FORMAT = "kresilient"
"""The format name: ``df.write.format("kresilient")`` (Spark reserves ``kafka``)."""

_log = structlog.get_logger("kresilient.spark")
_tracer = trace.get_tracer("kresilient.spark")
_summary_dir: str | None = None


class _Plan:
    """Everything a writer needs, checked on the driver before any task starts (picklable)."""

    def __init__(self, options: Mapping[str, str], schema: Any, summary_dir: str | None) -> None:
        try:
            self._check(options, schema, summary_dir)
        except Exception as exc:
            # The driver's error is what the user and Spark's logs see first.
            safe = scrubbed(exc, Redactor.for_config(_kafka_options(options)))
            if safe is None:
                raise
            raise safe from None

    def _check(self, options: Mapping[str, str], schema: Any, summary_dir: str | None) -> None:
        self.options: SinkOptions = parse_options(options)
        self.layout: ColumnLayout = column_layout(
            [(f.name, f.dataType.simpleString()) for f in schema.fields],
            topic_option=self.options.topic,
        )
        self.config: dict[str, Any] = sink_producer_config(self.options)
        self.summary_dir = summary_dir

    def write(self, iterator: Iterator[Any]) -> TaskReport:
        if self.options.guarantee == "exactly_once":
            from kresilient.spark._eos import write_task_exactly_once

            return write_task_exactly_once(self.options, self.layout, iterator, config=self.config)
        return write_task(self.options, self.layout, iterator, config=self.config)

    def commit(
        self, messages: list[WriterCommitMessage | None], mode: str, batch_id: int | None
    ) -> None:
        attrs: dict[str, Any] = {"messaging.system": "kafka", "spark.write.mode": mode}
        if batch_id is not None:
            attrs["spark.streaming.batch.id"] = batch_id
        with _tracer.start_as_current_span("kresilient.spark.write_commit", attributes=attrs) as s:
            summary = summarize(
                messages,
                mode=mode,
                batch_id=batch_id,
                topic=self.options.topic,
                guarantee=self.options.guarantee,
                write_id=self.options.write_id,
            )
            s.set_attribute("kresilient.spark.rows", summary.rows)
            s.set_attribute("kresilient.spark.dead_lettered", summary.dead_lettered)
        store_summary(self.summary_dir, summary)
        log = _log.warning if summary.dead_lettered else _log.info
        log(
            "spark_write_committed",
            mode=mode,
            batch_id=batch_id,
            topic=self.options.topic,
            tasks=summary.tasks,
            rows=summary.rows,
            written=summary.written,
            dead_lettered=summary.dead_lettered,
            dead_letter_reasons=dict(summary.dead_letter_reasons),
            dead_letter_topics=list(summary.dead_letter_topics),
        )

    def abort(self, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
        done = [m for m in messages if m is not None]
        _log.error(
            "spark_write_aborted",
            batch_id=batch_id,
            topic=self.options.topic,
            tasks_succeeded=len(done),
            tasks=len(messages),
            note=(
                "succeeded tasks committed their rows and batch markers: a replay skips them"
                if self.options.guarantee == "exactly_once"
                else "rows of succeeded tasks stay in Kafka; a rerun writes them again "
                "(at-least-once)"
            ),
        )

    def __repr__(self) -> str:
        return f"_Plan({self.options!r})"


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> TaskReport:
        return self.plan.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.plan.commit(messages, "batch", None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.plan.abort(messages, None)


class _StreamWriter(DataSourceStreamArrowWriter or object):  # type: ignore[misc]
    def __init__(self, plan: _Plan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> TaskReport:
        return self.plan.write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.plan.commit(messages, "streaming", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.plan.abort(messages, batchId)


class KResilientDataSource(DataSource):
    """The ``kresilient`` data source (write-only). Register it with :func:`register`."""

    #: Where commit() stores summaries; set on the per-driver subclass made by register().
    summary_dir: str | None = None

    @classmethod
    def name(cls) -> str:
        """The format name, ``kresilient``."""
        return FORMAT

    def writer(self, schema: Any, overwrite: bool) -> _BatchWriter:
        """The batch writer; ``mode("overwrite")`` is refused (Kafka topics are append-only)."""
        if overwrite:
            raise ConfigError(
                "save mode 'overwrite' is not supported: Kafka topics are append-only; "
                "use mode('append')",
                key="mode",
            )
        plan = _Plan(self.options, schema, self.summary_dir)
        if plan.options.guarantee == "exactly_once":
            raise ConfigError(
                "guarantee=exactly_once is for streaming queries (it needs the micro-batch id "
                "Spark replays after a failure); batch writes are at-least-once",
                key="guarantee",
            )
        return _BatchWriter(plan)

    def streamWriter(self, schema: Any, overwrite: bool) -> _StreamWriter:
        """The streaming writer (append, update or complete mode: every row is appended).

        With ``guarantee=exactly_once`` it also creates the compacted marker topic if needed.
        """
        if DataSourceStreamArrowWriter is None:
            import pyspark

            raise ConfigError(
                "writeStream.format('kresilient') needs pyspark>=4.1 (Arrow batches for "
                f"streaming writers); this is pyspark {pyspark.__version__}: upgrade, or use "
                "kresilient.spark.write_stream(..., engine='jvm')",
                key="format",
            )
        plan = _Plan(self.options, schema, self.summary_dir)
        if plan.options.guarantee == "exactly_once":
            from kresilient.spark._eos import committed_batches, ensure_marker_topic

            # A query that committed batches never gets a new, empty marker topic.
            checkpoint = {str(k).lower(): v for k, v in self.options.items()}.get(
                "checkpointlocation"
            )
            ensure_marker_topic(
                plan.config,
                plan.options.marker_topic_name,
                committed=committed_batches(checkpoint),
            )
        return _StreamWriter(plan)


def _kafka_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``kafka.*`` options without their prefix (the producer's view, for redaction)."""
    return {
        str(k)[len("kafka.") :]: str(v)
        for k, v in options.items()
        if str(k).lower().startswith("kafka.")
    }


def register(spark: Any) -> None:
    """Register the ``kresilient`` format on ``spark`` (a ``SparkSession``); call it again in
    any other thread that writes with it (Spark finds the format through the thread's active
    session).

    Also protects the driver's py4j connections from forked children (see
    :mod:`kresilient.spark._fork_guard`: a fork elsewhere in the program used to move this
    thread to a JVM thread without the active session, and the format was not found), creates
    this driver program's summary directory, read by :func:`last_write_summary`,
    and extends the session's ``spark.sql.redaction.options.regex`` with
    :data:`PLAN_REDACTION_REGEX`, so that no secret ``kafka.*`` option shows in a plan.
    """
    _fork_guard.install()  # a fork elsewhere in the driver must not cut this thread's py4j link
    _activate(spark)
    redact_plan_options(spark)
    _ensure_summary_dir()
    # A subclass made here is pickled by value, so Spark's planning and commit processes see
    # this driver's summary directory.
    source = type(
        "KResilientDataSourceForDriver",
        (KResilientDataSource,),
        {"summary_dir": _summary_dir, "__module__": __name__},
    )
    spark.dataSource.register(source)


def _ensure_summary_dir() -> str:
    global _summary_dir
    if _summary_dir is None:
        _summary_dir = tempfile.mkdtemp(prefix="kresilient-spark-")
        atexit.register(shutil.rmtree, _summary_dir, True)
    return _summary_dir


ENGINES = ("python", "jvm")


def _producer_options(
    bootstrap_servers: str, options: Mapping[str, Any] | None, kafka_options: Mapping[str, Any]
) -> dict[str, Any]:
    # Keyword arguments spell dots as underscores (linger_ms -> linger.ms): producer setting
    # names of both clients have no underscores.
    out: dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
    out.update(options or {})
    out.update({k.replace("_", "."): v for k, v in kafka_options.items()})
    return out


def write(
    df: Any,
    *,
    topic: str | None = None,
    bootstrap_servers: str,
    engine: str = "python",
    dead_letter_topic: str | None = None,
    topics: list[str] | None = None,
    options: Mapping[str, Any] | None = None,
    **kafka_options: Any,
) -> WriteSummary | None:
    """Write ``df`` (the Kafka sink columns: ``value``, optional ``key``, ``topic``,
    ``partition``, ``headers``, ``timestamp``) to Kafka and return the write's summary.

    ``engine="python"`` (default): the ``kresilient`` data source (librdkafka; full
    classification, per-row dead letters of broker refusals, exactly-once for streaming);
    producer settings are librdkafka's. ``engine="jvm"``: Spark's built-in ``kafka`` sink
    (the Java client, needs its connector on the classpath) behind kresilient's checks: safe
    settings forced, rows known unproducible before sending routed to the dead-letter topic
    (which must exist), counts in the summary; a row the broker refuses anyway fails the task.
    Producer settings are the Java client's. See docs/spark.md for which to pick.

    Producer settings: ``options={"linger.ms": 5}`` and/or keywords with underscores for dots
    (``linger_ms=5``). ``topics``: with a ``topic`` column and ``engine="jvm"``, every topic
    the rows may name. Example::

        summary = write(df, topic="orders", bootstrap_servers="b:9092", engine="jvm",
                        linger_ms=5, batch_size=262144)
        summary.written, summary.dead_lettered
    """
    producer = _producer_options(bootstrap_servers, options, kafka_options)
    if engine == "jvm":
        from kresilient.spark._jvm import write_jvm

        summary = write_jvm(
            df,
            topic=topic,
            topics=topics,
            dead_letter_topic=dead_letter_topic,
            producer=producer,
        )
        store_summary(_ensure_summary_dir(), summary)
        return summary
    if engine != "python":
        raise ConfigError(
            f"engine must be one of {', '.join(ENGINES)}, not {engine!r}", key="engine"
        )
    register(df.sparkSession)
    w = df.write.format(FORMAT).mode("append")
    for k, v in producer.items():
        w = w.option(f"kafka.{k}", str(v).lower() if isinstance(v, bool) else str(v))
    if topic is not None:
        w = w.option("topic", topic)
    if dead_letter_topic is not None:
        w = w.option("deadLetterTopic", dead_letter_topic)
    # This write's own summary: the newest one may be another thread's write or a streaming
    # micro-batch that committed in between.
    write_id = uuid.uuid4().hex
    w.option("writeId", write_id).save()
    return summary_of(_summary_dir, write_id)


def write_stream(
    df: Any,
    *,
    topic: str | None = None,
    bootstrap_servers: str,
    checkpoint_location: str,
    engine: str = "python",
    dead_letter_topic: str | None = None,
    topics: list[str] | None = None,
    options: Mapping[str, Any] | None = None,
    trigger: Mapping[str, Any] | None = None,
    **kafka_options: Any,
) -> Any:
    """Start a streaming query writing ``df`` to Kafka; returns the ``StreamingQuery``.

    ``engine="python"``: ``writeStream.format("kresilient")`` at-least-once (for
    ``guarantee="exactly_once"`` use the data source directly: its options are not producer
    settings).
    ``engine="jvm"``: one :func:`write` with ``engine="jvm"`` per micro-batch
    (``foreachBatch``): the same routing and checks, a summary per micro-batch in
    :func:`last_write_summary`, at-least-once (a replayed micro-batch is written again).
    ``trigger``: keyword arguments of ``DataStreamWriter.trigger`` (e.g.
    ``{"processingTime": "5 seconds"}``).
    """
    producer = _producer_options(bootstrap_servers, options, kafka_options)
    if engine == "jvm":
        from kresilient.spark._jvm import java_producer_options, write_jvm

        java_producer_options(producer)  # refuse bad settings before the query starts
        summary_dir = _ensure_summary_dir()

        def each(batch: Any, batch_id: int) -> None:
            summary = write_jvm(
                batch,
                topic=topic,
                topics=topics,
                dead_letter_topic=dead_letter_topic,
                producer=producer,
                mode="streaming",
                batch_id=batch_id,
            )
            store_summary(summary_dir, summary)

        w = df.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint_location)
    elif engine == "python":
        register(df.sparkSession)
        w = df.writeStream.format(FORMAT).option("checkpointLocation", checkpoint_location)
        for k, v in producer.items():
            w = w.option(f"kafka.{k}", str(v).lower() if isinstance(v, bool) else str(v))
        if topic is not None:
            w = w.option("topic", topic)
        if dead_letter_topic is not None:
            w = w.option("deadLetterTopic", dead_letter_topic)
    else:
        raise ConfigError(
            f"engine must be one of {', '.join(ENGINES)}, not {engine!r}", key="engine"
        )
    if trigger:
        w = w.trigger(**trigger)
    return w.start()


def _activate(spark: Any) -> None:
    """Make ``spark`` the active session of the calling thread's JVM twin.

    Spark looks a Python data source up in the *active* session, a JVM thread-local: a write
    from another thread (or after py4j handed this thread a new JVM thread) fails with
    ``DATA_SOURCE_NOT_FOUND`` although the format is registered. Calling :func:`register`
    again in that thread fixes it.
    """
    jvm = getattr(spark, "_jvm", None)  # None on Spark Connect: the server resolves it
    if jvm is not None:
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)


def last_write_summary() -> WriteSummary | None:
    """The summary of the last committed write (batch job or micro-batch) of this driver.

    ``None`` before the first commit. Example::

        >>> s = last_write_summary()
        >>> s.written, s.dead_lettered, dict(s.dead_letter_reasons)
        (1000000, 2, {'MSG_SIZE_TOO_LARGE': 2})
    """
    return latest_summary(_summary_dir)


def write_summaries() -> list[WriteSummary]:
    """Every write summary of this driver program kept so far (the last 200), oldest first."""
    return all_summaries(_summary_dir)
