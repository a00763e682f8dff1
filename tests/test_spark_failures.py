"""Failure paths of the ``kresilient`` Spark sink on the real 3-node cluster (issue 11).

What each test proves is one row of the Spark part of docs/failure-modes.md: a fault at one
step of a task, what escapes, and where the rows in flight end up. Rows are ids (8-byte
big-endian keys) so the topic and the dead-letter topic can be checked id by id.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Consumer, TopicPartition

from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TopicFactory = Any


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from kresilient.spark import register
    from kresilient.spark.connector import connector_jars

    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("kresilient-spark-failure-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", ",".join(connector_jars()))  # see test_spark_jvm
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    yield spark
    spark.stop()


def _ids_frame(spark: Any, rows: int, *, sizes: dict[int, int] | None = None) -> Any:
    """``rows`` rows keyed by id, 100-byte values except ``sizes`` (id -> value size)."""
    from pyspark.sql import functions as F

    size: Any = F.lit(100)
    for row, n in (sizes or {}).items():
        size = F.when(F.col("id") == row, n).otherwise(size)
    df = spark.range(rows, numPartitions=2).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.lit("v").alias("v"),
        size.alias("size"),
    )
    return df.select("key", F.expr("repeat(v, size)").cast("binary").alias("value"))


def _writer(df: Any, bootstrap: str, topic: str, dlq: str) -> Any:
    return (
        df.write.format("kresilient")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("deadLetterTopic", dlq)
        .option("kafka.linger.ms", "5")
        .mode("append")
    )


def _end_offsets(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kr-spark-failures-hwm"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def _read_ids(bootstrap: str, topic: str) -> list[int]:
    """Every record's id (its key) in ``topic``, all partitions, read to the end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-read-{topic}",
            "enable.auto.commit": False,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[int] = []
        deadline = time.monotonic() + 120
        while len(out) < sum(ends.values()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None:
                    out.append(int.from_bytes(m.key(), "big"))
        assert len(out) == sum(ends.values()), f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def _failure_text(exc: BaseException) -> str:
    """The whole story of a failed Spark action: the Java exception and every cause (the
    Python worker's traceback is in the innermost one; ``str()`` truncates it)."""
    java = getattr(exc, "java_exception", None)
    parts = [str(exc)]
    while java is not None:
        parts.append(str(java.toString()))
        java = java.getCause()
    return "\n".join(parts)


def _last_summary() -> Any:
    from kresilient.spark import last_write_summary

    return last_write_summary()


# --------------------------------------------------------------------------- issue 11, defect 1
@pytest.mark.chaos
def test_partition_unwritable_past_message_timeout_fails_job_nothing_dead_lettered(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The only replica of the topic's partition is down longer than message.timeout.ms: every
    row times out (_MSG_TIMED_OUT). That is not a bad row: the job must fail (Spark retries,
    then reports it) and nothing may reach the dead-letter topic. On 9c6e9f3 the rows were
    dead-lettered and the job reported success. Control: with the broker back, the same job
    succeeds and only the row that is too large by itself is a dead letter."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    rows, oversized = 2_000, 1_234
    topic = topic_factory(partitions=1, replication_factor=1, config={"min.insync.replicas": 1})
    dlq = topic_factory(partitions=1)
    bootstrap = kafka_cluster.bootstrap_servers
    df = _ids_frame(spark, rows, sizes={oversized: 2_000_000})  # > message.max.bytes (1 MB)
    victim = kafka_cluster.leader(topic, 0)
    kafka_cluster.kill(victim)
    try:
        with pytest.raises((Py4JJavaError, PySparkException)) as info:
            # 1 s (was 3 s): the replica is down for the whole write, so every row outlives
            # its timeout whatever its length; each of the task's 3 attempts waits it out.
            _writer(df, bootstrap, topic, dlq).option("kafka.message.timeout.ms", "1000").save()
        assert "_MSG_TIMED_OUT" in _failure_text(info.value)
        assert _end_offsets(bootstrap, dlq) == 0, "timed-out rows were dead-lettered"
    finally:
        kafka_cluster.start(victim)
        kafka_cluster.wait_for_leader(topic, 0, timeout=120)

    # Negative control: the fault was the partition, not the job. Healed, the job succeeds
    # and the one row that can never be produced is the only dead letter.
    _writer(df, bootstrap, topic, dlq).option("kafka.message.timeout.ms", "30000").save()
    summary = _last_summary()
    assert (summary.rows, summary.written, summary.dead_lettered) == (rows, rows - 1, 1)
    assert dict(summary.dead_letter_reasons) == {"MSG_SIZE_TOO_LARGE": 1}
    assert _read_ids(bootstrap, dlq) == [oversized]
    assert sorted(_read_ids(bootstrap, topic)) == [i for i in range(rows) if i != oversized]


# --------------------------------------------------------------------------- issue 16: format lost
def _fork_from_another_thread() -> None:
    """What ``KafkaCluster.start()`` does to (re)start a broker, and what any library in a
    driver program may do: fork a child that runs Python before ``exec`` (``preexec_fn``),
    from a thread other than the one that writes."""
    import subprocess
    import threading

    errors: list[BaseException] = []

    def fork() -> None:
        try:
            subprocess.run(["true"], preexec_fn=lambda: None, check=True)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    t = threading.Thread(target=fork, name="forking-thread")
    t.start()
    t.join()
    assert not errors, errors


def _keyed(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr("repeat('v', 100)").cast("binary").alias("value"),
    )


def test_format_still_found_after_a_failed_job_and_a_fork_in_another_thread(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, monkeypatch: Any
) -> None:
    """A job fails, a broker is restarted (a fork from another thread), and the next
    ``df.write.format("kresilient")`` in the same thread, without a second register(), must
    write every row. On the code before this fix it failed with DATA_SOURCE_NOT_FOUND: the
    forked child's garbage collector shut down this thread's py4j socket, py4j reconnected
    to a new JVM thread without an active session, and Spark looks Python data sources up
    only in the active session. Control: with py4j's own close() back, the same fork does
    move this thread to a new JVM thread and the format is not found."""
    from py4j import clientserver
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    from kresilient.spark import _fork_guard, register

    rows = 1_000
    topic, dlq = topic_factory(partitions=2), topic_factory(partitions=1)
    bootstrap = kafka_cluster.bootstrap_servers

    def jvm_thread() -> int:
        return int(spark._jvm.java.lang.Thread.currentThread().getId())

    def fail_every_task(batches: Iterator[Any]) -> Iterator[Any]:
        for _ in batches:
            raise RuntimeError("injected failure of every task")
        yield from ()

    failing = _keyed(spark.range(rows, numPartitions=2).mapInArrow(fail_every_task, "id long"))
    with pytest.raises((Py4JJavaError, PySparkException)) as info:
        _writer(failing, bootstrap, topic, dlq).save()
    assert "injected failure of every task" in _failure_text(info.value)
    before = jvm_thread()
    _fork_from_another_thread()
    assert jvm_thread() == before, "the fork cut this thread's py4j connection"
    _writer(_keyed(spark.range(rows, numPartitions=2)), bootstrap, topic, dlq).save()
    summary = _last_summary()
    assert (summary.topic, summary.rows, summary.written) == (topic, rows, rows)
    assert sorted(_read_ids(bootstrap, topic)) == list(range(rows))
    assert _end_offsets(bootstrap, dlq) == 0

    # Negative control: the fault is real. py4j's own close() in the forked child shuts the
    # shared socket down; this thread then talks to a new JVM thread and the format is gone.
    assert _fork_guard.original_close is not None
    with monkeypatch.context() as m:
        m.setattr(clientserver.ClientServerConnection, "close", _fork_guard.original_close)
        before = jvm_thread()
        _fork_from_another_thread()
        assert jvm_thread() != before, "the control fork did not cut the connection"
    with pytest.raises((Py4JJavaError, PySparkException), match="DATA_SOURCE_NOT_FOUND"):
        _writer(_keyed(spark.range(10)), bootstrap, topic, dlq).save()
    register(spark)  # what the format needs after such a reconnect (docs/spark.md)
    _writer(_keyed(spark.range(rows, 2 * rows, numPartitions=2)), bootstrap, topic, dlq).save()
    assert sorted(_read_ids(bootstrap, topic)) == list(range(2 * rows))


# --------------------------------------------------------------------------- issue 11, defect 9
def _committed_marker(bootstrap: str, group: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        c.close()


@pytest.mark.streaming_source
def test_exactly_once_marker_group_offsets_expired_replay_still_skips_committed_partition(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Any
) -> None:
    """Batch 1 commits partition 0 and fails in partition 1; then the broker "expires" the
    marker groups' offsets (deleted here with DeleteGroups: for a member-less group that is
    the state offsets.retention.minutes leaves, OffsetFetch answers "no offset" either way).
    The restarted query must still skip partition 0 of batch 1 (the durable marker record),
    so a read_committed read-back has every id exactly once. On 9c6e9f3 the marker was gone
    and partition 0 was written twice."""
    from confluent_kafka.admin import AdminClient
    from pyspark.errors import StreamingQueryException
    from pyspark.sql import functions as F

    files, per_file = 3, 2_000
    source = tmp_path / "in"
    source.mkdir()
    for f in range(files):
        ids = range(f * per_file, (f + 1) * per_file)
        (source / f"part-{f:03d}.csv").write_text("".join(f"{i}\n" for i in ids))
    topic = topic_factory(partitions=2)
    dlq = topic_factory(partitions=1)
    checkpoint = tmp_path / "checkpoint"
    allow = tmp_path / "allow-batch-1"
    bootstrap = kafka_cluster.bootstrap_servers

    def fail_batch_1_partition_1(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs in a Python worker: only names importable there.
        import time

        from confluent_kafka import Consumer, TopicPartition
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch, part = ctx.getLocalProperty("streaming.sql.batchId"), ctx.partitionId()
        if batch == "1" and part == 1 and not allow.exists():
            # Fail only once partition 0 of batch 1 has committed (its marker says 2).
            group = f"kresilient-{ctx.getLocalProperty('sql.streaming.queryId')}-0"
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
                if tp.offset >= 2:
                    break
                time.sleep(0.1)
            c.close()
            raise RuntimeError("injected failure: batch 1, partition 1")
        yield from batches

    def start() -> Any:
        stream = (
            spark.readStream.schema("id LONG")
            .option("maxFilesPerTrigger", 1)
            .csv(str(source))
            .repartition(2, "id")
            .mapInArrow(fail_batch_1_partition_1, "id long")
            .select(
                F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
                F.expr("repeat('v', 100)").cast("binary").alias("value"),
            )
        )
        return (
            stream.writeStream.format("kresilient")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("deadLetterTopic", dlq)
            .option("guarantee", "exactly_once")
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    first = start()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        first.awaitTermination(300)
    groups = [f"kresilient-{first.id}-{p}" for p in (0, 1)]
    # Partition 0 of batch 1 committed (marker 2); partition 1 still at batch 0 (marker 1).
    assert [_committed_marker(bootstrap, g, topic) for g in groups] == [2, 1]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
        future.result()
    # The simulated expiry is real: the broker has no marker offset any more.
    assert [_committed_marker(bootstrap, g, topic) for g in groups] == [-1001, -1001]

    allow.write_text("ok")
    second = start()
    try:
        second.processAllAvailable()
    finally:
        second.stop()
    from kresilient.spark import write_summaries

    replayed = [s for s in write_summaries() if s.topic == topic and s.batch_id == 1]
    ids = _read_ids_committed(bootstrap, topic)
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
    assert sorted(ids) == list(range(files * per_file))
    assert replayed and replayed[-1].skipped_tasks == 1, "partition 0 of batch 1 was rewritten"


def _read_ids_committed(bootstrap: str, topic: str) -> list[int]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-readc-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[int] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 120
        while remaining and time.monotonic() < deadline:
            for m in c.consume(num_messages=10_000, timeout=1.0):
                if m.error() is None:
                    out.append(int.from_bytes(m.key(), "big"))
            # Positions, not message offsets: transaction markers occupy offsets too.
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        assert not remaining, f"could not read {topic} to its end"
        return out
    finally:
        c.close()
