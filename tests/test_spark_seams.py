"""The Spark sink at the seams issue 37 (Spark part) and issue 35 found, on the real cluster.

Most tests drive one task directly (``write_task`` / ``write_task_exactly_once``: exactly what a
Python worker runs, Arrow batches in, a ``TaskReport`` or an exception out), which keeps them
cheap; the few that need Spark itself share one local-mode session. Each test names the defect
it covers and was checked to fail on c15a167.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)
from structlog.testing import capture_logs  # noqa: E402

from kresilient.deadletter import ORIGINAL_TIMESTAMP  # noqa: E402
from kresilient.errors import ConfigError, KResilientError  # noqa: E402
from kresilient.spark._eos import ensure_marker_topic, write_task_exactly_once  # noqa: E402
from kresilient.spark._options import column_layout, parse_options  # noqa: E402
from kresilient.spark._task import TaskInfo, TaskReport  # noqa: E402
from kresilient.spark._write import discard_producers, sink_producer_config, write_task  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TopicFactory = Any
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


# --------------------------------------------------------------------------- helpers
def _batch(ids: range, *, sizes: dict[int, int] | None = None, **columns: Any) -> Any:
    """Rows keyed by id (8-byte big-endian), 100-byte values except ``sizes``."""
    sizes = sizes or {}
    arrays = [
        pa.array([i.to_bytes(8, "big") for i in ids], pa.binary()),
        pa.array([b"v" * sizes.get(i, 100) for i in ids], pa.binary()),
    ]
    names = ["key", "value"]
    for name, data in columns.items():
        if name in names:
            arrays[names.index(name)] = data
        else:
            arrays.append(data)
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)


def _spark_type(t: Any) -> str:
    if pa.types.is_list(t):
        return "array<struct<key:string,value:binary>>"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return {"binary": "binary", "string": "string", "int32": "int"}[str(t)]


def _run(
    bootstrap: str, batches: list[Any], *, info: TaskInfo | None = None, **options: str
) -> TaskReport:
    opts = parse_options({"kafka.bootstrap.servers": bootstrap, **options})
    layout = column_layout(
        [(f.name, _spark_type(f.type)) for f in batches[0].schema], topic_option=opts.topic
    )
    cfg = sink_producer_config(opts)
    task = info or TaskInfo(partition_id=0, attempt=0)
    try:
        if opts.guarantee == "exactly_once":
            ensure_marker_topic(cfg, opts.marker_topic_name)
            return write_task_exactly_once(
                opts, layout, iter(batches), config=cfg, context=lambda: task
            )
        return write_task(opts, layout, iter(batches), config=cfg, context=lambda: task)
    finally:
        discard_producers()


def _records(bootstrap: str, topic: str, *, committed: bool = False) -> list[Any]:
    """Every record of ``topic`` (all partitions), read to the end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-seams-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
            # An offset out of range resets to the log's start, never past a record still
            # there (librdkafka's default, END, would skip it); a record missing fails the
            # read below. (CI21 and CI27's OFFSET_OUT_OF_RANGE at offset 0 was a record of
            # 2023 deleted by the retention check: the tests write recent timestamps now.)
            "auto.offset.reset": "earliest",
        }
    )
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = _high_watermarks(bootstrap, topic, parts)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            out += [m for m in c.consume(num_messages=1000, timeout=0.5) if m.error() is None]
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        assert not remaining, f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def _high_watermarks(bootstrap: str, topic: str, parts: list[int]) -> dict[int, int]:
    """The high watermarks, read_uncommitted: a read_committed client's watermark query answers
    the last stable offset, which lags a transaction's commit until its markers are written."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-seams-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_uncommitted",  # librdkafka's default is read_committed
        }
    )
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def _ids(bootstrap: str, topic: str, *, committed: bool = False) -> list[int]:
    return [int.from_bytes(m.key(), "big") for m in _records(bootstrap, topic, committed=committed)]


def _eos(
    bootstrap: str,
    batch: Any,
    *,
    topic: str,
    dlq: str,
    prefix: str,
    batch_id: int,
    attempt: int = 0,
    **options: str,
) -> TaskReport:
    info = TaskInfo(partition_id=0, attempt=attempt, batch_id=batch_id, query_id="q-seams")
    return _run(
        bootstrap,
        [batch],
        info=info,
        topic=topic,
        deadLetterTopic=dlq,
        guarantee="exactly_once",
        transactionalIdPrefix=prefix,
        **options,
    )


# --------------------------------------------------------------------------- issue 37 #1
def test_dead_letter_carries_its_own_rows_headers_when_an_earlier_row_has_the_same_value(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Rows 0 and 1 share a value (and key); row 0 goes to a topic that takes it, row 1 to one
    whose max.message.bytes refuses it (a delivery report, which carries neither headers nor
    timestamp). Row 1's dead letter must carry row 1's headers and timestamp. On c15a167 the
    report was matched by value to row 0: the dead letter said id=row-0."""
    bootstrap = kafka_cluster.bootstrap_servers
    roomy, small = topic_factory(), topic_factory(config={"max.message.bytes": 16384})
    dlq = topic_factory()
    n = 2
    value = pa.array([b"x" * 20_000] * n, pa.binary())
    key = pa.array([b"same-key"] * n, pa.binary())
    headers = pa.array([[{"key": "row", "value": b"row-%d" % i}] for i in range(n)], _HEADERS)
    # an hour ago: a timestamp older than the topic's retention (7 days) has its record
    # deleted by the next retention check (every 60 s here) before it is read back (CI21, CI27)
    hour_ago_us = (int(time.time()) - 3600) * 1_000_000
    stamps = pa.array([hour_ago_us + i * 1000 for i in range(n)], pa.timestamp("us"))
    topics = pa.array([roomy, small], pa.string())
    batch = _batch(range(n), key=key, value=value, headers=headers, timestamp=stamps, topic=topics)
    report = _run(bootstrap, [batch], deadLetterTopic=dlq)
    assert (report.written, report.dead_lettered) == (1, 1)
    (written,) = _records(bootstrap, roomy)
    assert dict(written.headers())["row"] == b"row-0"  # control: row 0 is the one written
    (dead,) = _records(bootstrap, dlq)
    found = dict(dead.headers())
    assert found["row"] == b"row-1", "row 1's dead letter carries another row's headers"
    assert found[ORIGINAL_TIMESTAMP] == str(hour_ago_us // 1000 + 1).encode()


# --------------------------------------------------------------------------- issue 37 #5
def test_exactly_once_row_for_a_partition_the_topic_lacks_is_dead_lettered_not_aborting(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A ``partition`` the topic lacks, under exactly_once: the row is decided unproducible
    from the topic's metadata before the transaction, dead-lettered in it, the other rows
    committed. On c15a167 every attempt aborted ("the broker refused rows inside the
    transaction"): the new transactional producer learnt it only from a delivery report."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(partitions=2), topic_factory()
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    parts = pa.array([7 if i == 5 else i % 2 for i in range(20)], pa.int32())
    report = _eos(
        bootstrap,
        _batch(range(20), partition=parts),
        topic=topic,
        dlq=dlq,
        prefix=prefix,
        batch_id=0,
    )
    assert (report.written, report.dead_lettered, report.skipped) == (19, 1, False)
    assert report.dead_letter_reasons == {"_UNKNOWN_PARTITION": 1}
    assert sorted(_ids(bootstrap, topic, committed=True)) == [i for i in range(20) if i != 5]
    assert _ids(bootstrap, dlq, committed=True) == [5]


# --------------------------------------------------------------------------- issue 37 #2
def test_exactly_once_refuses_a_marker_topic_with_several_partitions(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A compacted marker topic with 3 partitions: markers would land on partitions by key
    while the durable read looks at partition 0 only (duplicates once the marker groups'
    offsets expire). It is refused, naming it and the fix, at planning and in the task. On
    c15a167 it was accepted and the task wrote its marker wherever its key hashed."""
    bootstrap = kafka_cluster.bootstrap_servers
    markers = topic_factory(partitions=3, config={"cleanup.policy": "compact"})
    with pytest.raises(ConfigError, match="exactly 1 partition") as info:
        ensure_marker_topic({"bootstrap.servers": bootstrap}, markers)
    assert markers in str(info.value) and info.value.key == "markertopic"
    # The task refuses it too (a topic recreated under a running query), before writing.
    topic, dlq = topic_factory(), topic_factory()
    opts = parse_options(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "deadLetterTopic": dlq,
            "guarantee": "exactly_once",
            "transactionalIdPrefix": f"kr-seams-{uuid.uuid4().hex[:8]}",
            "markerTopic": markers,
        }
    )
    layout = column_layout([("key", "binary"), ("value", "binary")], topic_option=topic)
    info_task = TaskInfo(partition_id=0, attempt=0, batch_id=0, query_id="q-seams")
    with pytest.raises(ConfigError, match="exactly 1 partition"):
        write_task_exactly_once(
            opts,
            layout,
            iter([_batch(range(5))]),
            config=sink_producer_config(opts),
            context=lambda: info_task,
        )
    assert _ids(bootstrap, topic, committed=True) == []
    # Control: a 1-partition compacted topic is accepted.
    ensure_marker_topic(
        {"bootstrap.servers": bootstrap}, topic_factory(config={"cleanup.policy": "compact"})
    )


# --------------------------------------------------------------------------- issue 37 #3
def _stream_writer(bootstrap: str, topic: str, markers: str, checkpoint: Path) -> Any:
    """What Spark calls on the driver to plan a streaming write (``streamWriter``)."""
    from pyspark.sql.types import BinaryType, StructField, StructType

    from kresilient.spark._source import KResilientDataSource

    source = KResilientDataSource(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "guarantee": "exactly_once",
            "markerTopic": markers,
            "checkpointLocation": str(checkpoint),
        }
    )
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    return source.streamWriter(schema, False)


def _topic_exists(bootstrap: str, name: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return name in admin.list_topics(timeout=30).topics


def test_marker_topic_deleted_while_down_is_not_recreated_for_a_query_that_committed(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """The query's checkpoint has committed micro-batches, its marker topic is gone: planning
    the restarted query fails naming the topic instead of creating it empty (with expired
    marker group offsets, the replay would write the committed batch again). On c15a167
    streamWriter recreated it. Control: a new query (empty checkpoint) gets it created."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()
    markers = f"t-markers-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "commits").mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    with pytest.raises(ConfigError, match="committed micro-batch") as info:
        _stream_writer(bootstrap, topic, markers, checkpoint)
    assert markers in str(info.value)
    assert not _topic_exists(bootstrap, markers), "the marker topic was recreated empty"
    fresh = tmp_path / "new-query"
    fresh.mkdir()
    _stream_writer(bootstrap, topic, markers, fresh)
    deadline = time.monotonic() + 60
    while not _topic_exists(bootstrap, markers) and time.monotonic() < deadline:
        time.sleep(0.2)  # created: until the broker that answers has its metadata
    assert _topic_exists(bootstrap, markers)
    # With the topic there, the query that committed plans normally.
    _stream_writer(bootstrap, topic, markers, checkpoint)


# --------------------------------------------------------------------------- issue 37 #4
def test_exactly_once_sees_a_raised_max_message_bytes_and_keeps_the_rows_value(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Write 1 reads the topic's max.message.bytes (40,000); it is raised to 200,000; write 2
    has a 60 kB row. The row must end in the topic with its value, not dead-lettered without
    it: the size refusal under the stale limit makes the task read the limit again and fail
    the attempt (the producer's limit cannot change), and the retry writes it. On c15a167
    the limit stayed cached for the worker's life: the row was dead-lettered, value dropped."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(config={"max.message.bytes": "40000"})
    dlq = topic_factory()
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    first = _eos(bootstrap, _batch(range(5)), topic=topic, dlq=dlq, prefix=prefix, batch_id=0)
    assert first.written == 5
    admin = AdminClient({"bootstrap.servers": bootstrap})
    raised = ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[raised])
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    rows = _batch(range(100, 110), sizes={104: 60_000})
    reports: list[TaskReport] = []
    for attempt in range(2):  # Spark's retry of a failed attempt
        try:
            reports.append(
                _eos(
                    bootstrap,
                    rows,
                    topic=topic,
                    dlq=dlq,
                    prefix=prefix,
                    batch_id=1,
                    attempt=attempt,
                )
            )
            break
        except KResilientError as exc:
            assert "max.message.bytes was raised" in str(exc)
    assert reports, "the retry did not write the batch"
    assert (reports[0].written, reports[0].dead_lettered) == (10, 0)
    written = {
        int.from_bytes(m.key(), "big"): m for m in _records(bootstrap, topic, committed=True)
    }
    assert sorted(written) == [*range(5), *range(100, 110)]
    assert len(written[104].value()) == 60_000
    assert _ids(bootstrap, dlq, committed=True) == []


# --------------------------------------------------------------------------- suspicion: B+1
def test_exactly_once_replay_of_a_batch_older_than_the_marker_logs_an_error(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Suspicion (confirmed): the marker says batch 3 committed, Spark replays batch 1 (the
    checkpoint went back): the rows are skipped, and now an ERROR names the group, the batch
    and the marker. On c15a167 it skipped without a log line. Control: the ordinary replay of
    the last batch (marker == B+1) skips without it."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(), topic_factory()
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    _eos(bootstrap, _batch(range(5)), topic=topic, dlq=dlq, prefix=prefix, batch_id=3)
    with capture_logs() as logs:
        replay = _eos(bootstrap, _batch(range(5)), topic=topic, dlq=dlq, prefix=prefix, batch_id=3)
    assert replay.skipped
    assert not [e for e in logs if e["log_level"] == "error"]
    with capture_logs() as logs:
        older = _eos(bootstrap, _batch(range(7)), topic=topic, dlq=dlq, prefix=prefix, batch_id=1)
    assert older.skipped
    (error,) = [e for e in logs if e["event"] == "spark_exactly_once_checkpoint_behind_marker"]
    assert error["log_level"] == "error"
    assert (error["group"], error["batch_id"], error["marker_batch"], error["rows_skipped"]) == (
        f"{prefix}-0",
        1,
        3,
        7,
    )


# --------------------------------------------------------------------------- suspicion: coordinator
class _FakeCoordinatorConsumer:
    """``committed()`` answering NOT_COORDINATOR ``failures`` times (what the first task on a
    fresh cluster meets), then the real answer."""

    def __init__(self, real: Consumer, failures: int, code: int) -> None:
        self.real = real
        self.failures = failures
        self.code = code
        self.calls = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return self.real.committed(partitions, timeout=timeout)


def test_fake_not_coordinator_on_the_marker_read_is_retried(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Suspicion (confirmed, fake: a real broker answers NOT_COORDINATOR only while a
    coordinator moves or loads): ``_read_marker`` gave up on the first NOT_COORDINATOR /
    COORDINATOR_LOAD_IN_PROGRESS and failed the task; now it retries them until its deadline.
    Control: an error that does not clear (authorization) still escapes at once."""
    from kresilient.spark._eos import _read_marker

    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()
    real = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kr-seams-{uuid.uuid4().hex}"})
    try:
        for code in (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
            fake = _FakeCoordinatorConsumer(real, 3, code)
            assert _read_marker(fake, topic)[0] == -1001  # type: ignore[arg-type]
            assert fake.calls == 4
        denied = _FakeCoordinatorConsumer(real, 1, KafkaError.GROUP_AUTHORIZATION_FAILED)
        with pytest.raises(KafkaException):
            _read_marker(denied, topic)  # type: ignore[arg-type]
        assert denied.calls == 1
    finally:
        real.close()


# --------------------------------------------------------------------------- suspicion: big key
def test_dead_letter_of_a_row_too_large_by_its_key_or_headers_does_not_fail_the_job(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Suspicion (confirmed): a row too large because of its 30 kB key (or its 30 kB of
    headers), the dead-letter topic as small as the topic. Dropping the value is not enough;
    on c15a167 the dead letter was refused again and the task failed (DeadLetterError).
    Now the last level leaves out key and the row's headers too, with their sizes in
    kresilient.key.dropped.bytes / kresilient.headers.dropped.bytes. Both modes."""
    bootstrap = kafka_cluster.bootstrap_servers
    small = {"max.message.bytes": "16384"}
    ids = range(6)
    keys = pa.array([b"k" * 30_000 if i == 1 else i.to_bytes(8, "big") for i in ids], pa.binary())
    headers = pa.array(
        [[{"key": "big", "value": b"h" * 30_000}] if i == 4 else [] for i in ids], _HEADERS
    )
    batch = _batch(ids, key=keys, headers=headers)
    topic, dlq = topic_factory(config=small), topic_factory(config=small)
    report = _run(bootstrap, [batch], topic=topic, deadLetterTopic=dlq)
    assert (report.written, report.dead_lettered) == (4, 2)
    letters = _records(bootstrap, dlq)
    dropped = sorted(
        (h.get("kresilient.key.dropped.bytes"), h.get("kresilient.headers.dropped.bytes"))
        for h in (dict(m.headers() or []) for m in letters)
    )
    assert dropped == [(b"30000", None), (b"8", b"30003")]
    assert all(m.key() is None and m.value() is None for m in letters)
    # exactly_once: the same rows, refused locally by the producer capped at the topic's limit
    topic, dlq = topic_factory(config=small), topic_factory(config=small)
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    eos = _eos(bootstrap, batch, topic=topic, dlq=dlq, prefix=prefix, batch_id=0)
    assert (eos.written, eos.dead_lettered) == (4, 2)
    assert len(_records(bootstrap, dlq, committed=True)) == 2
    assert sorted(_ids(bootstrap, topic, committed=True)) == [0, 2, 3, 5]


# --------------------------------------------------------------------------- issue 35 #4 audit
def test_id_audit_transactional_ids_and_marker_keys_unique_per_query_stable_per_restart(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Issue 35 #4's audit, Spark part (no defect found): the sink mints no message ids; its
    transactional ids, marker groups and marker keys are ``kresilient-<query id>-<partition>``,
    the query id being Spark's persistent random UUID of the checkpoint: distinct for two
    queries (and hosts), the same after a restart (it must be: that is what fences a zombie
    attempt). An explicit ``transactionalIdPrefix`` reused by another query is refused by
    the marker's query id, also once the group offsets expired (durable marker record)."""
    from kresilient.errors import ReplayMismatchError
    from kresilient.spark._eos import transactional_prefix

    opts = parse_options({"kafka.bootstrap.servers": "x:1", "topic": "t"})
    q1, q2 = str(uuid.uuid4()), str(uuid.uuid4())
    ids = {
        transactional_prefix(opts, TaskInfo(partition_id=0, attempt=a, batch_id=b, query_id=q))
        for q in (q1, q2)
        for a, b in ((0, 0), (3, 7))  # attempts and batches (a restart) of one query
    }
    assert ids == {f"kresilient-{q1}", f"kresilient-{q2}"}
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(), topic_factory()
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    first = _run(
        bootstrap,
        [_batch(range(5))],
        info=TaskInfo(partition_id=0, attempt=0, batch_id=0, query_id=q1),
        topic=topic,
        deadLetterTopic=dlq,
        guarantee="exactly_once",
        transactionalIdPrefix=prefix,
    )
    assert first.written == 5
    group = f"{prefix}-0"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_consumer_groups([group], request_timeout=30)[group].result()  # "expired"
    with pytest.raises(ReplayMismatchError, match="was used by streaming query"):
        _run(
            bootstrap,
            [_batch(range(5))],
            info=TaskInfo(partition_id=0, attempt=0, batch_id=0, query_id=q2),
            topic=topic,
            deadLetterTopic=dlq,
            guarantee="exactly_once",
            transactionalIdPrefix=prefix,
        )
    assert sorted(_ids(bootstrap, topic, committed=True)) == list(range(5))


# --------------------------------------------------------------------------- with Spark
@pytest.fixture(scope="module", name="event_log")
def _event_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of the module session's Spark event log (plain text, one file)."""
    return tmp_path_factory.mktemp("spark-events")


@pytest.fixture(scope="module", name="spark")
def _spark(event_log: Path) -> Iterator[Any]:
    from kresilient.spark import register
    from kresilient.spark.connector import connector_jars
    from kresilient.spark.testing import local_session

    spark = local_session(
        "kresilient-spark-seams",
        master="local[2,3]",
        jars=connector_jars(),
        conf={  # the event log is one of the texts that leave the process (issue 35 #10)
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_log.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        },
    )
    register(spark)
    yield spark
    spark.stop()


def _keyed(spark: Any, rows: int) -> Any:
    return spark.range(rows, numPartitions=1).selectExpr(
        "unhex(lpad(hex(id), 16, '0')) AS key", "CAST(repeat('v', 10) AS BINARY) AS value"
    )


def test_write_returns_its_own_summary_when_another_write_commits_right_after_it(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, monkeypatch: Any
) -> None:
    """Suspicion (confirmed): ``spark.write()`` returned the newest summary of the driver's
    directory. Another write (another thread, a streaming micro-batch) committing between
    this write's commit and that read was returned instead: here it commits right after
    ``save()`` returns, deterministically. Now each write() call reads the summary of its own
    ``writeId``. On c15a167 write A returned write B's summary (B's topic, 7 rows)."""
    from pyspark.sql.readwriter import DataFrameWriter

    from kresilient.spark import write

    bootstrap = kafka_cluster.bootstrap_servers
    mine, other = topic_factory(), topic_factory()
    real_save = DataFrameWriter.save
    interleaved: list[Any] = []

    def save_then_another_write(self: Any, *args: Any, **kwargs: Any) -> None:
        real_save(self, *args, **kwargs)
        if not interleaved:  # once: the other write commits before this one's summary is read
            interleaved.append(None)
            interleaved[0] = write(_keyed(spark, 7), topic=other, bootstrap_servers=bootstrap)

    monkeypatch.setattr(DataFrameWriter, "save", save_then_another_write)
    summary = write(_keyed(spark, 25), topic=mine, bootstrap_servers=bootstrap)
    assert interleaved and interleaved[0] is not None
    assert (interleaved[0].topic, interleaved[0].rows) == (other, 7)  # the fault was real
    assert summary is not None
    assert (summary.topic, summary.rows, summary.written) == (mine, 25, 25)


def test_jvm_engine_two_concurrent_writes_leave_use_v1_source_list_as_it_was(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Suspicion (confirmed): each engine="jvm" write took kafka out of
    spark.sql.sources.useV1SourceList and put back what it had seen. Write B starting while A
    runs saw A's change; A finished and restored the list, B finished and "restored" it
    without kafka for good (and a write planned between A's restore and B's end would use
    the V1 path, whose Observation never completes). Here B starts while A runs and ends
    after A, ordered by files the two writes' tasks wait for. On c15a167 the session was left
    without kafka in the list. Now the first write saves the value, the last restores it."""
    from kresilient.spark import write

    bootstrap = kafka_cluster.bootstrap_servers
    conf_key = "spark.sql.sources.useV1SourceList"
    spark.conf.unset(conf_key)
    assert "kafka" in spark.conf.get(conf_key)  # Spark's default: the V1 path for kafka
    b_running, a_done = str(tmp_path / "b-running"), str(tmp_path / "a-done")

    def wait_for_file(path: str) -> None:  # runs in a Python worker: imports inside
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} never appeared")
            time.sleep(0.05)  # polling a condition the other write sets

    def a_waits_for_b(batches: Iterator[Any]) -> Iterator[Any]:
        wait_for_file(b_running)
        yield from batches

    def b_waits_for_a(batches: Iterator[Any]) -> Iterator[Any]:
        open(b_running, "w").close()
        wait_for_file(a_done)
        yield from batches

    schema = "key binary, value binary"
    df_a = _keyed(spark, 10).mapInArrow(a_waits_for_b, schema)
    df_b = _keyed(spark, 20).mapInArrow(b_waits_for_a, schema)
    topic_a, topic_b, dlq = topic_factory(), topic_factory(), topic_factory()
    results: dict[str, Any] = {}

    def run(name: str, df: Any, topic: str) -> None:
        try:
            results[name] = write(
                df, topic=topic, bootstrap_servers=bootstrap, engine="jvm", dead_letter_topic=dlq
            )
        except BaseException as exc:
            results[name] = exc

    a = threading.Thread(target=run, args=("a", df_a, topic_a))
    a.start()
    deadline = time.monotonic() + 120
    while "kafka" in spark.conf.get(conf_key) and time.monotonic() < deadline:
        time.sleep(0.05)  # until write A has taken kafka out (it is in its save())
    b = threading.Thread(target=run, args=("b", df_b, topic_b))
    b.start()
    a.join(180)
    Path(a_done).touch()
    b.join(180)
    assert not a.is_alive() and not b.is_alive(), "a write never finished"
    assert results["a"].rows == 10, results["a"]
    assert results["b"].rows == 20, results["b"]
    assert "kafka" in spark.conf.get(conf_key), "kafka was left out of useV1SourceList"


def _jvm_write_with_secret(spark: Any, bootstrap: str, topic: str, dlq: str) -> Any:
    """An engine="jvm" write whose ``sasl.jaas.config`` (a SCRAM login with neither of
    Spark's redaction words in key or value) holds :data:`_CREDENTIAL` and whose ``client.id``
    (not a secret) is :data:`_CANARY`; returns the session's SQL executions."""
    from kresilient.spark import write

    login = "org.apache.kafka.common.security.scram.ScramLoginModule"
    spark.conf.unset("spark.sql.redaction.options.regex")  # a session no register() touched
    spark.conf.unset("spark.sql.redaction.string.regex")
    spark.conf.set("spark.sql.ui.explainMode", "extended")
    try:
        write(
            _keyed(spark, 3),
            topic=topic,
            bootstrap_servers=bootstrap,
            engine="jvm",
            dead_letter_topic=dlq,
            # unused over PLAINTEXT: the write succeeds
            options={
                "sasl.jaas.config": f'{login} required credential="{_CREDENTIAL}";',
                "client.id": _CANARY,
            },
        )
    finally:
        spark.conf.unset("spark.sql.ui.explainMode")
    return spark._jsparkSession.sharedState().statusStore().executionsList()


_CREDENTIAL = "Zq8VbN3xLp7TwR5"
_CANARY = "kr-canary-Hd4Jw9"


def test_jvm_engine_secret_option_is_redacted_in_the_plan(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Issue 35 #10 (Spark part): an engine="jvm" write's plan (the SQL tab's details, the
    event log's plan description, EXPLAIN) shows its ``kafka.*`` options and, in the node
    ``KafkaWrite(None,{...})``, the producer settings without the prefix. A secret whose key
    and value match none of Spark's redaction words showed in clear in both: engine="jvm"
    never extended the redaction regexes. On c15a167 the credential was in the plan."""
    topic = topic_factory()
    executions = _jvm_write_with_secret(
        spark, kafka_cluster.bootstrap_servers, topic, topic_factory()
    )
    plans = [str(executions.apply(i).physicalPlanDescription()) for i in range(executions.size())]
    ours = [p for p in plans if topic in p and "kafka.bootstrap.servers" in p]
    assert ours, "the write's options are not in the plan: the check below proves nothing"
    assert "kafka.sasl.jaas.config=*********(redacted)" in ours[-1]
    assert "KafkaWrite(" in ours[-1] and "sasl.jaas.config=*********(redacted)" in ours[-1]
    assert not any(_CREDENTIAL in p for p in plans)


def test_jvm_engine_secret_option_not_in_the_plan_graph(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, event_log: Path
) -> None:
    """Issue 35 #10 follow-up: the SQL tab's plan graph and the event log's ``sparkPlanInfo``
    describe nodes with ``simpleString``, which Spark never redacts, and the V2 kafka write
    (engine="jvm" uses it for its Observation counts) prints ``KafkaWrite``'s producer
    settings there. Now a secret reaches the producer through a ``config.providers``
    placeholder (a private file, removed after the write), never through Spark's options.
    Control: a setting that is not secret (the ``client.id``) IS in both texts, so the write
    node is there and is read. On c15a167 (and up to this fix) the credential was in both."""
    topic = topic_factory()
    executions = _jvm_write_with_secret(
        spark, kafka_cluster.bootstrap_servers, topic, topic_factory()
    )
    store = spark._jsparkSession.sharedState().statusStore()
    descriptions: list[str] = []
    for i in range(executions.size()):
        nodes = store.planGraph(executions.apply(i).executionId()).allNodes()
        descriptions += [str(nodes.apply(n).desc()) for n in range(nodes.size())]
    writes = [d for d in descriptions if "KafkaWrite" in d]
    assert any(_CANARY in d for d in writes), "no write node with its settings: proves nothing"
    assert not any(_CREDENTIAL in d for d in descriptions)

    def logged() -> str:
        return "".join(f.read_text(errors="replace") for f in event_log.rglob("*") if f.is_file())

    deadline = time.monotonic() + 60
    while not (topic in logged() and _CANARY in logged()) and time.monotonic() < deadline:
        time.sleep(0.2)  # the listener bus writes the event log asynchronously
    text = logged()
    assert topic in text and _CANARY in text, "the write is not in the event log: proves nothing"
    assert '"sparkPlanInfo"' in text
    assert _CREDENTIAL not in text
    assert any("sasl.jaas.config=${kresilient:" in d for d in writes)  # how: a placeholder
    # the secrets file is gone after the write
    assert not list(Path(tempfile.gettempdir()).glob(f"kresilient-spark-*/{_CANARY}-*"))


@pytest.mark.streaming_source
def test_streaming_restart_after_marker_topic_deleted_fails_naming_it(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Issue 37 #3 end to end: an exactly-once query commits a micro-batch, stops; its marker
    topic is deleted; the restarted query (same checkpoint) fails naming the topic, and the
    topic is not recreated. Control: the first start created it (a new query)."""
    from pyspark.errors import StreamingQueryException

    bootstrap = kafka_cluster.bootstrap_servers
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-000.csv").write_text("".join(f"{i}\n" for i in range(50)))
    topic, dlq = topic_factory(), topic_factory()
    markers = f"t-markers-{uuid.uuid4().hex[:8]}"
    checkpoint = tmp_path / "checkpoint"

    def start() -> Any:
        return (
            spark.readStream.schema("id LONG")
            .csv(str(source))
            .selectExpr("unhex(lpad(hex(id), 16, '0')) AS key", "CAST('v' AS BINARY) AS value")
            .writeStream.format("kresilient")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("deadLetterTopic", dlq)
            .option("guarantee", "exactly_once")
            .option("markerTopic", markers)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    first = start()
    try:
        first.processAllAvailable()
    finally:
        first.stop()
    assert _topic_exists(bootstrap, markers)  # control: created for the new query
    assert sorted(_ids(bootstrap, topic, committed=True)) == list(range(50))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([markers], operation_timeout=30)[markers].result()
    deadline = time.monotonic() + 60
    while _topic_exists(bootstrap, markers) and time.monotonic() < deadline:
        time.sleep(0.2)  # until every broker's metadata has dropped it
    assert not _topic_exists(bootstrap, markers)
    (source / "part-001.csv").write_text("".join(f"{i}\n" for i in range(50, 60)))
    second = start()
    with pytest.raises(StreamingQueryException, match="committed micro-batch") as info:
        second.awaitTermination(120)
    assert markers in str(info.value)
    assert not _topic_exists(bootstrap, markers), "the marker topic was recreated empty"
