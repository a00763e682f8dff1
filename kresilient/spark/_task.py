"""One Spark task of the ``kresilient`` sink: who it is, what it reports, its span and metrics."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog
from opentelemetry import metrics, trace
from pyspark.sql.datasource import WriterCommitMessage

from kresilient.errors import KResilientError, classify
from kresilient.spark._options import SinkOptions

__all__ = [
    "TaskInfo",
    "TaskReport",
    "make_report",
    "record_report",
    "scrubbed",
    "task_info",
    "task_span_attributes",
    "tracer",
]

_log = structlog.get_logger("kresilient.spark")
tracer = trace.get_tracer("kresilient.spark")
_meter = metrics.get_meter("kresilient.spark")
_rows_written = _meter.create_counter(
    "kresilient.spark.rows.written", unit="{row}", description="Rows acknowledged by Kafka"
)
_rows_dead_lettered = _meter.create_counter(
    "kresilient.spark.rows.dead_lettered",
    unit="{row}",
    description="Rows that could never be produced, written to the dead-letter topic",
)


@dataclass(kw_only=True)
class TaskReport(WriterCommitMessage):
    """What one task attempt did; Spark pickles it back to the driver's ``commit()``."""

    partition_id: int
    attempt: int
    batch_id: int | None
    rows: int = 0
    written: int = 0
    dead_lettered: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    dead_letter_topics: list[str] = field(default_factory=list)
    skipped: bool = False  #: exactly-once: this partition of the batch was already committed
    seconds: float = 0.0


@dataclass(frozen=True, kw_only=True)
class TaskInfo:
    """Which Spark task is writing (from ``TaskContext``)."""

    partition_id: int
    attempt: int
    batch_id: int | None = None  #: streaming micro-batch id (None: a batch job)
    query_id: str | None = None  #: persistent streaming query id (survives restarts)


def task_info() -> TaskInfo:
    """The current task's identity; ``TaskInfo(partition_id=0, attempt=0)`` outside Spark."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return TaskInfo(partition_id=0, attempt=0)
    raw = ctx.getLocalProperty("streaming.sql.batchId")
    return TaskInfo(
        partition_id=ctx.partitionId(),
        attempt=ctx.attemptNumber(),
        batch_id=int(raw) if raw is not None else None,
        query_id=ctx.getLocalProperty("sql.streaming.queryId"),
    )


def task_span_attributes(options: SinkOptions, info: TaskInfo) -> dict[str, str | int]:
    """Attributes of the ``kresilient.spark.write_task`` span."""
    attrs: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.destination.name": options.topic or "(topic column)",
        "spark.partition.id": info.partition_id,
        "spark.task.attempt": info.attempt,
        "kresilient.spark.guarantee": options.guarantee,
    }
    if info.batch_id is not None:
        attrs["spark.streaming.batch.id"] = info.batch_id
    return attrs


def make_report(
    info: TaskInfo,
    rows: int,
    reasons: Mapping[str, int],
    topics: Mapping[str, int],
    started: float,
    *,
    skipped: bool = False,
) -> TaskReport:
    """The commit message of a finished task (``reasons``: dead letters per error name)."""
    dead = sum(reasons.values())
    return TaskReport(
        partition_id=info.partition_id,
        attempt=info.attempt,
        batch_id=info.batch_id,
        rows=rows,
        written=0 if skipped else rows - dead,
        dead_lettered=dead,
        dead_letter_reasons=dict(reasons),
        dead_letter_topics=sorted(topics),
        skipped=skipped,
        seconds=time.monotonic() - started,
    )


def record_report(options: SinkOptions, report: TaskReport) -> None:
    """Metrics and the executor log line of a finished task."""
    metric_attrs = {"messaging.destination.name": options.topic or "(topic column)"}
    _rows_written.add(report.written, metric_attrs)
    if report.dead_lettered:
        _rows_dead_lettered.add(report.dead_lettered, metric_attrs)
        _log.warning(
            "spark_rows_dead_lettered",
            partition=report.partition_id,
            attempt=report.attempt,
            count=report.dead_lettered,
            reasons=report.dead_letter_reasons,
            topics=report.dead_letter_topics,
        )


def scrubbed(exc: BaseException, redactor: Callable[[str], str]) -> BaseException | None:
    """``exc`` made safe to leave the task, or ``None`` when it holds no secret as it is.

    Spark prints a failed task's Python traceback, chained causes included, into executor and
    driver logs, the UI and the job's exception; librdkafka echoes configuration values (a
    malformed ``sasl.oauthbearer.config``, say) into its error texts. When the formatted
    traceback holds a secret, the message is redacted, the cause's text folded in redacted,
    and the chain dropped (the caller raises the result ``from None``). A kresilient exception
    keeps its type and classification; any other becomes a :class:`KResilientError` naming it.
    """
    if not isinstance(exc, Exception):
        return None  # KeyboardInterrupt, SystemExit: never rewritten
    text = "".join(traceback.format_exception(exc))
    if redactor(text) == text:
        return None
    message = redactor(str(exc))
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None:
        message += f" (caused by {type(cause).__name__}: {redactor(str(cause))})"
    if isinstance(exc, KResilientError):
        exc.args = (message,)
        exc.message = message
        exc.__cause__ = exc.__context__ = None
        return exc
    return KResilientError(f"{type(exc).__name__}: {message}", classification=classify(exc))
