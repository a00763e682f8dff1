"""The ``kresilient`` Spark sink against the real 3-node cluster (issue 8, tests 4a-4e).

One ``local[2,3]`` SparkSession (2 cores, up to 3 attempts per task) serves the module. Every
test reads the topic back with a confluent-kafka consumer and checks every id: ids are 8-byte
big-endian keys, so a million of them become one numpy array.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
np = pytest.importorskip("numpy")

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from kresilient.testing import KafkaCluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TopicFactory = Any


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from kresilient.spark import register
    from kresilient.spark.connector import connector_jars

    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("kresilient-spark-tests")
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


def _frame(spark: Any, rows: int, *, size: int = 100, partitions: int = 2) -> Any:
    from pyspark.sql import functions as F

    return spark.range(rows, numPartitions=partitions).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr(f"repeat('v', {size})").cast("binary").alias("value"),
    )


def _writer(df: Any, cluster: KafkaCluster, topic: str) -> Any:
    return (
        df.write.format("kresilient")
        .option("kafka.bootstrap.servers", cluster.bootstrap_servers)
        .option("topic", topic)
        .option("kafka.linger.ms", "5")
        .mode("append")
    )


def _high_watermarks(cluster: KafkaCluster, topic: str) -> int:
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "kr-spark-hwm"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()


def _read_ids(cluster: KafkaCluster, topic: str, *, isolation: str = "read_uncommitted") -> Any:
    """Every record's key of ``topic`` as an int64 array (one entry per record)."""
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"kr-spark-read-{topic}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "fetch.max.bytes": 16 * 1024 * 1024,
        }
    )
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        chunks: list[bytes] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 300
        while remaining and time.monotonic() < deadline:
            msgs = c.consume(num_messages=10000, timeout=1.0)
            chunks.append(b"".join(m.key() for m in msgs if m.error() is None))
            # Positions, not offsets of messages: transaction markers occupy offsets too.
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        assert not remaining, f"could not read {topic} to its end"
        return np.frombuffer(b"".join(chunks), dtype=">i8").astype(np.int64)
    finally:
        c.close()


def _assert_all_present(ids: Any, rows: int, *, exclude: frozenset[int] = frozenset()) -> None:
    expected = np.setdiff1d(np.arange(rows, dtype=np.int64), np.fromiter(exclude, np.int64))
    missing = np.setdiff1d(expected, ids)
    assert missing.size == 0, f"{missing.size} ids lost, e.g. {missing[:10].tolist()}"
    assert np.isin(ids, expected).all(), "records that were never written appeared"


def _last_summary() -> Any:
    from kresilient.spark import last_write_summary

    return last_write_summary()


# --------------------------------------------------------------------------- 4a
def test_batch_million_rows_all_present_no_duplicates(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    rows = 1_000_000
    topic = topic_factory(partitions=2)
    _writer(_frame(spark, rows), kafka_cluster, topic).save()

    summary = _last_summary()
    assert summary.topic == topic
    assert (summary.rows, summary.written, summary.dead_lettered) == (rows, rows, 0)
    assert summary.retried_tasks == 0  # so duplicates would be a defect, not a retry
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, rows)
    assert ids.size == rows, f"{ids.size - rows} duplicates without any task retry"


# --------------------------------------------------------------------------- 4b
def test_task_attempt_failing_mid_write_loses_nothing(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    rows = 100_000
    topic = topic_factory(partitions=2)
    marker = tmp_path / "attempt0-failed"
    bootstrap = kafka_cluster.bootstrap_servers
    fail_at = 90_000  # in partition 1 (ids 50000..99999), after 4 Arrow batches of 10,000

    def fail_first_attempt(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs in a Python worker: only names importable there (no helpers of this module).
        import time

        from confluent_kafka import Consumer, TopicPartition
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for batch in batches:
            if ctx.attemptNumber() == 0 and fail_at in batch.column(0).to_pylist():
                # Fail only once rows of this attempt are in Kafka: a failure *mid-write*. The
                # other task writes at most rows // 2 (partition 0); more than that in the topic
                # means this attempt's own rows are there (more than 0 did not: partition 0's
                # rows alone satisfied it and the attempt could fail having written nothing).
                c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kr-spark-wait"})
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    tps = [TopicPartition(topic, p) for p in (0, 1)]
                    if sum(c.get_watermark_offsets(tp, timeout=10)[1] for tp in tps) > rows // 2:
                        break
                    time.sleep(0.05)
                c.close()
                marker.write_text("failed")
                raise RuntimeError("injected failure of task attempt 0")
            yield batch

    from pyspark.sql import functions as F

    df = (
        spark.range(rows, numPartitions=2)
        .mapInArrow(fail_first_attempt, "id long")
        .select(
            F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
            F.expr("repeat('v', 100)").cast("binary").alias("value"),
        )
    )
    _writer(df, kafka_cluster, topic).save()

    assert marker.exists(), "the injected failure did not happen"
    summary = _last_summary()
    assert summary.retried_tasks == 1
    assert summary.rows == rows
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, rows)
    assert ids.size > rows, "the failed attempt wrote nothing: the failure was not mid-write"


def _wait_for_records(bootstrap: str, topic: str, *, minimum: int, timeout: float = 60) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kr-spark-wait"})
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            parts = c.list_topics(topic, timeout=10).topics[topic].partitions
            total = sum(c.get_watermark_offsets(TopicPartition(topic, p))[1] for p in parts)
            if total >= minimum:
                return
            time.sleep(0.05)
    finally:
        c.close()


# --------------------------------------------------------------------------- 4c
@pytest.mark.chaos
def test_leader_sigkill_during_write_job_succeeds_no_loss(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    # The kill comes at 20,000 rows: 280,000 are still to go through the new leader (the
    # assertion below checks the write was still running).
    rows = 300_000
    topic = topic_factory(partitions=2)
    killed: dict[str, int] = {}
    write_done = threading.Event()

    def kill_leader_mid_write() -> None:
        # save() stays on the test's thread (the data source is registered on its session).
        _wait_for_records(kafka_cluster.bootstrap_servers, topic, minimum=20_000, timeout=300)
        if write_done.is_set():
            return
        victim = kafka_cluster.leader(topic, 0)
        killed["at"] = _high_watermarks(kafka_cluster, topic)
        kafka_cluster.kill(victim)
        killed["node"] = victim

    killer = threading.Thread(target=kill_leader_mid_write, daemon=True)
    killer.start()
    try:
        _writer(_frame(spark, rows), kafka_cluster, topic).save()  # raises if the job fails
        write_done.set()
        killer.join(timeout=300)
        assert "node" in killed, "the leader was not killed during the write"
        assert killed["at"] < rows, "the leader died after every row was written"
    finally:
        write_done.set()
        killer.join(timeout=300)
        if "node" in killed:
            kafka_cluster.start(killed["node"])
        for p in (0, 1):
            kafka_cluster.wait_for_isr(topic, p, size=3, timeout=120)
    summary = _last_summary()
    assert (summary.rows, summary.written) == (rows, rows)
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, rows)


# --------------------------------------------------------------------------- columns
def test_builtin_sink_columns_topic_partition_headers_timestamp(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from pyspark.sql import functions as F

    rows = 1_000
    # retention.ms=-1: the rows carry 2023 timestamps, which time-based retention would delete
    # (the broker rolls and deletes even the active segment) while the test reads them back.
    forever = {"retention.ms": -1}
    even, odd = (topic_factory(partitions=3, config=forever) for _ in range(2))
    dlq = topic_factory(partitions=1)
    df = spark.range(rows, numPartitions=2).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.col("id").cast("string").alias("value"),  # a string value, as the built-in allows
        F.when(F.col("id") % 2 == 0, F.lit(even)).otherwise(F.lit(odd)).alias("topic"),
        # id 999 names partition 7 of a 3-partition topic: an invalid row, dead-lettered
        F.when(F.col("id") == 999, 7).otherwise(F.col("id") % 3).cast("int").alias("partition"),
        F.array(
            F.struct(F.lit("source").alias("key"), F.lit(b"spark").alias("value")),
            F.struct(
                F.lit("id").alias("key"), F.col("id").cast("string").cast("binary").alias("value")
            ),
        ).alias("headers"),
        F.timestamp_millis(F.lit(1_700_000_000_000) + F.col("id")).alias("timestamp"),
    )
    (
        df.write.format("kresilient")
        .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
        .option("deadLetterTopic", dlq)
        .mode("append")
        .save()
    )
    summary = _last_summary()
    assert (summary.written, summary.dead_lettered) == (rows - 1, 1)
    assert dict(summary.dead_letter_reasons) == {"_UNKNOWN_PARTITION": 1}
    seen = 0
    for topic, parity in ((even, 0), (odd, 1)):
        c = Consumer(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, "group.id": f"cols-{topic}"}
        )
        try:
            for p in range(3):
                end = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                c.assign([TopicPartition(topic, p, 0)])
                got = []
                deadline = time.monotonic() + 120
                while len(got) < end and time.monotonic() < deadline:
                    # consume() returns at num_messages or at the timeout: ask for what is left
                    batch = c.consume(num_messages=end - len(got), timeout=2.0)
                    got += [m for m in batch if not m.error()]
                assert len(got) == end, f"read {len(got)} of {end} records of {topic}[{p}]"
                for m in got:
                    row = int.from_bytes(m.key(), "big")
                    assert row % 2 == parity and row % 3 == p
                    assert m.value() == str(row).encode()
                    assert m.headers() == [("source", b"spark"), ("id", str(row).encode())]
                    assert m.timestamp()[1] == 1_700_000_000_000 + row
                seen += len(got)
        finally:
            c.close()
    assert seen == rows - 1
    dead = _read_records(kafka_cluster, dlq)
    assert [int.from_bytes(k, "big") for k, _, _ in dead] == [999]
    found = dict(dead[0][2])
    assert found["source"] == b"spark"  # the row's own headers are kept on the dead letter
    assert found["kresilient.original.topic"] == odd.encode()


# --------------------------------------------------------------------------- 4d
def test_oversized_rows_dead_lettered_job_succeeds_counts_reported(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from pyspark.sql import functions as F

    rows = 20_000
    # The topic takes at most 64 KiB: 100 KiB rows fail at the broker (delivery report);
    # 2 MB rows exceed the producer's message.max.bytes and fail before they are sent.
    topic = topic_factory(partitions=2, config={"max.message.bytes": 65536})
    dlq = topic_factory(partitions=1)
    # early in partition 0, the first and the last row of partition 1, and one in between
    broker_rejects = frozenset({11, 10_000, 19_999})
    client_rejects = frozenset({7, 15_555})
    size = (
        F.when(F.col("id").isin(*broker_rejects), 100 * 1024)
        .when(F.col("id").isin(*client_rejects), 2_000_000)
        .otherwise(100)
    )
    df = spark.range(rows, numPartitions=2).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr("repeat('v', 1)").alias("v"),
        size.alias("size"),
    )
    df = df.select("key", F.expr("repeat(v, size)").cast("binary").alias("value"))
    # batch.size below the topic's limit: only the oversized rows are refused by the broker.
    (
        _writer(df, kafka_cluster, topic)
        .option("deadLetterTopic", dlq)
        .option("kafka.batch.size", "16384")
        .save()
    )

    summary = _last_summary()
    bad = broker_rejects | client_rejects
    assert summary.dead_lettered == len(bad)
    assert summary.written == rows - len(bad)
    assert dict(summary.dead_letter_reasons) == {"MSG_SIZE_TOO_LARGE": len(bad)}
    assert summary.dead_letter_topics == (dlq,)
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, rows, exclude=bad)
    assert ids.size == rows - len(bad)
    dead = _read_records(kafka_cluster, dlq)
    assert sorted(int.from_bytes(k, "big") for k, _, _ in dead) == sorted(bad)
    for key, value, headers in dead:
        row = int.from_bytes(key, "big")
        found = dict(headers)
        assert found["kresilient.original.topic"] == topic.encode()
        assert b"MSG_SIZE_TOO_LARGE" in found["kresilient.exception.message"]
        if row in broker_rejects:  # fits the dead-letter topic: kept byte for byte
            assert value == b"v" * (100 * 1024)
        else:  # 2 MB: refused by the dead-letter topic too, so dropped and its size recorded
            assert value is None
            assert found["kresilient.value.dropped.bytes"] == b"2000000"


def test_rows_refused_only_for_an_oversized_neighbour_are_not_dead_lettered(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from pyspark.sql import functions as F

    rows = 1_000  # ~120 KB of rows: refused batches of small rows, each re-sent alone
    # Default batch.size (1 MB) > the topic's 16 KiB limit: the broker refuses whole batches
    # of small rows. Only the row that is too large by itself may be dead-lettered.
    topic = topic_factory(partitions=1, config={"max.message.bytes": 16384})
    dlq = topic_factory(partitions=1)
    oversized = 500
    size = F.when(F.col("id") == oversized, 20_000).otherwise(100)
    df = spark.range(rows, numPartitions=1).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr("repeat('v', 1)").alias("v"),
        size.alias("size"),
    )
    df = df.select("key", F.expr("repeat(v, size)").cast("binary").alias("value"))
    _writer(df, kafka_cluster, topic).option("deadLetterTopic", dlq).save()

    summary = _last_summary()
    assert (summary.written, summary.dead_lettered) == (rows - 1, 1)
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, rows, exclude=frozenset({oversized}))
    dead = _read_records(kafka_cluster, dlq)
    assert [int.from_bytes(k, "big") for k, _, _ in dead] == [oversized]


def _read_records(cluster: KafkaCluster, topic: str) -> list[tuple[bytes, Any, list[Any]]]:
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"r-{topic}"})
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[bytes, Any, list[Any]]] = []
        deadline = time.monotonic() + 60
        while len(out) < end and time.monotonic() < deadline:
            # consume() returns at num_messages or at the timeout: ask for what is left
            for m in c.consume(num_messages=end - len(out), timeout=1.0):
                if m.error() is None:
                    out.append((m.key(), m.value(), m.headers() or []))
        return out
    finally:
        c.close()


# --------------------------------------------------------------------------- 4e
@pytest.mark.streaming_source
def test_streaming_restart_from_checkpoint_loses_nothing(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    # 8 one-file micro-batches: the first run is stopped after 3 of them, so 5 are left as
    # margin for batches finishing before stop() takes effect.
    files, per_file = 8, 5_000
    source = tmp_path / "in"
    source.mkdir()
    for f in range(files):
        ids = range(f * per_file, (f + 1) * per_file)
        (source / f"part-{f:03d}.csv").write_text("".join(f"{i}\n" for i in ids))
    topic = topic_factory(partitions=2)
    checkpoint = tmp_path / "checkpoint"

    def start() -> Any:
        from pyspark.sql import functions as F

        stream = (
            spark.readStream.schema("id LONG")
            .option("maxFilesPerTrigger", 1)
            .csv(str(source))
            .select(
                F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
                F.expr("repeat('v', 100)").cast("binary").alias("value"),
            )
        )
        return (
            stream.writeStream.format("kresilient")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", topic)
            .option("checkpointLocation", str(checkpoint))
            .start()
        )

    first = start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            progress = first.lastProgress
            if progress is not None and progress["batchId"] >= 2:
                break
            time.sleep(0.2)
    finally:
        first.stop()  # may interrupt a micro-batch: its replay is what the restart must do
    written_before = _high_watermarks(kafka_cluster, topic)
    assert 0 < written_before < files * per_file, "the first run wrote nothing or everything"
    assert (checkpoint / "offsets").is_dir()

    second = start()
    try:
        second.processAllAvailable()
    finally:
        second.stop()
    summary = _last_summary()
    assert summary.mode == "streaming" and summary.batch_id is not None
    ids = _read_ids(kafka_cluster, topic)
    _assert_all_present(ids, files * per_file)


# --------------------------------------------------------------------------- 4e, exactly-once
@pytest.mark.streaming_source
def test_streaming_exactly_once_replay_after_failed_batch_no_loss_no_duplicates(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Batch 1 fails in partition 1 after partition 0 committed; the restart replays batch 1:
    partition 0 must be skipped (its marker says committed), partition 1 written once."""
    files, per_file = 3, 4_000  # batch 0, the failing batch 1, and one batch after the replay
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
        # Runs in a Python worker: only names importable there (no helpers of this module).
        import time

        from confluent_kafka import Consumer, TopicPartition
        from pyspark import TaskContext

        ctx = TaskContext.get()
        doomed = (
            ctx.getLocalProperty("streaming.sql.batchId") == "1"
            and ctx.partitionId() == 1
            and not allow.exists()
        )
        for n, batch in enumerate(batches):
            if doomed and n == 1:  # the first batch is already in the (open) transaction
                c = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": "kr-eos-wait",
                        "isolation.level": "read_committed",
                    }
                )
                c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
                seen, deadline = 0, time.monotonic() + 120
                while seen <= per_file and time.monotonic() < deadline:  # batch 0 + partition 0
                    seen += len(c.consume(num_messages=1000, timeout=0.5))
                c.close()
                raise RuntimeError("injected failure: batch 1, partition 1")
            yield batch

    def start() -> Any:
        from pyspark.sql import functions as F

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

    from pyspark.errors import StreamingQueryException

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        first = start()
        with pytest.raises(StreamingQueryException, match="injected failure"):
            first.awaitTermination(300)
        allow.write_text("ok")
        second = start()
        try:
            second.processAllAvailable()
        finally:
            second.stop()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    from kresilient.spark import write_summaries

    replayed = [s for s in write_summaries() if s.topic == topic and s.batch_id == 1]
    ids = _read_ids(kafka_cluster, topic, isolation="read_committed")
    assert ids.size == np.unique(ids).size, f"{ids.size - np.unique(ids).size} duplicates"
    assert replayed and replayed[-1].skipped_tasks == 1, "partition 0 of batch 1 was rewritten"
    _assert_all_present(ids, files * per_file)
    assert ids.size == files * per_file, f"{ids.size - files * per_file} duplicates"
