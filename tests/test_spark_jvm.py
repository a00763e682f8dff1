"""``engine="jvm"`` (Spark's built-in ``kafka`` sink behind kresilient's checks) on the real
cluster: rows known unproducible are routed to the dead-letter topic with kresilient's headers,
innocent rows reach the topic, counts are right; unsafe settings are refused naming the key.

The connector jars come through Maven (:func:`kresilient.spark.connector.connector_jars`).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Consumer, TopicPartition

from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TopicFactory = Any


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    from kresilient.spark.connector import connector_jars
    from kresilient.spark.testing import local_session

    spark = local_session("kresilient-jvm-engine", master="local[2,3]", jars=connector_jars())
    yield spark
    spark.stop()


def _records(cluster: KafkaCluster, topic: str) -> list[tuple[int, Any, Any, dict[str, bytes]]]:
    """Every record of ``topic``: (partition, key, value, headers as a dict)."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": f"r-{topic}"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[tuple[int, Any, Any, dict[str, bytes]]] = []
        deadline = time.monotonic() + 120
        while len(out) < sum(ends.values()) and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error() is None:
                    out.append((m.partition(), m.key(), m.value(), dict(m.headers() or [])))
        assert len(out) == sum(ends.values()), f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def test_jvm_engine_routes_unproducible_rows_to_dlq_innocent_rows_written(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from pyspark.sql import functions as F

    from kresilient.spark import last_write_summary, write

    rows = 20_000
    topic = topic_factory(partitions=2, config={"max.message.bytes": 65536})
    dlq = topic_factory(partitions=1)
    oversized = {11, 10_000, 19_999}
    bad_partition = {5, 15_000}
    size = F.when(F.col("id").isin(*oversized), 100 * 1024).otherwise(100)
    part = F.when(F.col("id").isin(*bad_partition), F.lit(7)).otherwise(F.col("id") % 2)
    df = spark.range(rows, numPartitions=2).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr("repeat('v', 1)").alias("v"),
        size.alias("size"),
        part.cast("int").alias("partition"),
        F.array(F.struct(F.lit("source").alias("key"), F.lit(b"test").alias("value"))).alias(
            "headers"
        ),
    )
    df = df.select(
        "key", F.expr("repeat(v, size)").cast("binary").alias("value"), "partition", "headers"
    )

    summary = write(
        df,
        topic=topic,
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        engine="jvm",
        dead_letter_topic=dlq,
        linger_ms=5,
        batch_size=16384,
    )

    bad = oversized | bad_partition
    assert summary is not None and summary.engine == "jvm"
    assert (summary.rows, summary.written, summary.dead_lettered) == (rows, rows - 5, 5)
    assert dict(summary.dead_letter_reasons) == {"MSG_SIZE_TOO_LARGE": 3, "_UNKNOWN_PARTITION": 2}
    assert summary.dead_letter_topics == (dlq,)
    assert last_write_summary() == summary
    written = _records(kafka_cluster, topic)
    ids = sorted(int.from_bytes(k, "big") for _, k, _, _ in written)
    assert ids == sorted(set(range(rows)) - bad)  # every innocent row once, no routed row
    assert all(p == int.from_bytes(k, "big") % 2 for p, k, _, _ in written)
    assert all(h == {"source": b"test"} for _, _, _, h in written)
    dead = {int.from_bytes(k, "big"): (v, h) for _, k, v, h in _records(kafka_cluster, dlq)}
    assert sorted(dead) == sorted(bad)
    for row, (value, headers) in dead.items():
        assert headers["source"] == b"test"  # the row's own headers come first, kept
        assert headers["kresilient.original.topic"] == topic.encode()
        assert headers["kresilient.exception.type"] == b"kresilient.spark.RoutedBeforeSend"
        assert headers["kresilient.attempts"] == b"0"
        assert headers["kresilient.failed.at"].endswith(b"Z")
        message = headers["kresilient.exception.message"]
        if row in oversized:
            assert message.startswith(b"MSG_SIZE_TOO_LARGE: ")
            assert value == b"v" * (100 * 1024)  # fits the dead-letter topic: kept
        else:
            assert message.startswith(b"_UNKNOWN_PARTITION: partition 7 does not exist")
            assert headers["kresilient.original.partition"] == b"7"
            assert value == b"v" * 100


def test_jvm_engine_topic_column_routes_per_topic_limits_null_and_unknown_topics(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """With a ``topic`` column: each row is sized against its own topic's limit; a null topic
    and a topic outside ``topics=[...]`` are dead-lettered; counts per reason are exact."""
    from kresilient.spark import write

    small = topic_factory(partitions=1, config={"max.message.bytes": 65536})
    large = topic_factory(partitions=1)  # the broker's default limit, about 1 MB
    dlq = topic_factory(partitions=1)
    big = b"b" * (100 * 1024)
    rows = [
        (b"1", b"s", small),
        (b"2", big, small),  # too large for `small` only
        (b"3", big, large),
        (b"4", b"s", large),
        (b"5", b"s", None),
        (b"6", b"s", "not-a-topic-of-this-write"),
        (b"7", big, small),
    ]
    df = spark.createDataFrame(rows, "key BINARY, value BINARY, topic STRING")
    summary = write(
        df, bootstrap_servers=kafka_cluster.bootstrap_servers, engine="jvm",
        topics=[small, large], dead_letter_topic=dlq,
    )  # fmt: skip

    assert (summary.rows, summary.written, summary.dead_lettered) == (7, 3, 4)
    assert dict(summary.dead_letter_reasons) == {
        "MSG_SIZE_TOO_LARGE": 2,
        "NULL_TOPIC": 1,
        "UNKNOWN_TOPIC_OR_PART": 1,
    }
    assert sorted(k for _, k, _, _ in _records(kafka_cluster, small)) == [b"1"]
    assert sorted(k for _, k, _, _ in _records(kafka_cluster, large)) == [b"3", b"4"]
    dead = {k: h for _, k, _, h in _records(kafka_cluster, dlq)}
    assert sorted(dead) == [b"2", b"5", b"6", b"7"]
    assert dead[b"2"]["kresilient.original.topic"] == small.encode()
    assert dead[b"2"]["kresilient.exception.message"].startswith(b"MSG_SIZE_TOO_LARGE: ")
    assert "kresilient.original.topic" not in dead[b"5"]  # a null topic: no header, not ""
    assert dead[b"5"]["kresilient.exception.message"].startswith(b"NULL_TOPIC: ")
    assert dead[b"6"]["kresilient.original.topic"] == b"not-a-topic-of-this-write"
    assert dead[b"6"]["kresilient.error.category"] == b"config"


def test_jvm_engine_null_key_on_compacted_topic_and_timestamp_window(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from pyspark.sql import functions as F

    from kresilient.spark import write

    topic = topic_factory(
        partitions=1,
        config={"cleanup.policy": "compact", "message.timestamp.before.max.ms": 3_600_000},
    )
    dlq = topic_factory(partitions=1)
    df = spark.range(100, numPartitions=1).select(
        F.expr("IF(id = 3, NULL, unhex(lpad(hex(id), 16, '0')))").alias("key"),
        F.lit(b"x").alias("value"),
        # id 4: a day old, outside the topic's one-hour window
        F.expr("IF(id = 4, current_timestamp() - INTERVAL 1 DAY, current_timestamp())").alias(
            "timestamp"
        ),
    )
    summary = write(
        df, topic=topic, bootstrap_servers=kafka_cluster.bootstrap_servers, engine="jvm",
        dead_letter_topic=dlq,
    )  # fmt: skip
    assert summary is not None
    assert dict(summary.dead_letter_reasons) == {"INVALID_RECORD": 1, "INVALID_TIMESTAMP": 1}
    assert len(_records(kafka_cluster, topic)) == 98
    dead = _records(kafka_cluster, dlq)
    keys = sorted((k is None, k) for _, k, _, _ in dead)
    assert keys == [(False, (4).to_bytes(8, "big")), (True, None)]


def test_jvm_engine_refuses_unsafe_and_unknown_settings_naming_the_key(
    spark: Any, kafka_cluster: KafkaCluster, topic: str
) -> None:
    from kresilient.spark import write

    df = spark.range(1).selectExpr("CAST(id AS STRING) AS value")
    bs = kafka_cluster.bootstrap_servers
    for bad, key in (
        ({"acks": "1"}, "acks"),
        ({"enable.idempotence": "false"}, "enable.idempotence"),
        ({"max.in.flight.requests.per.connection": "10"}, "max.in.flight.requests.per.connection"),
        ({"transactional.id": "x"}, "transactional.id"),
        ({"queue.buffering.max.ms": "5"}, "queue.buffering.max.ms"),  # librdkafka's name
    ):
        with pytest.raises(ConfigError) as info:
            write(df, topic=topic, bootstrap_servers=bs, engine="jvm", options=bad)
        assert info.value.key == key
    with pytest.raises(ConfigError, match="must exist"):
        write(df, topic=topic + "-missing", bootstrap_servers=bs, engine="jvm")


def test_jvm_engine_client_id_shared_by_same_settings_until_a_write_fails() -> None:
    from kresilient.spark._jvm import java_producer_options, retire_client_id

    base = {"bootstrap.servers": "b:1", "client.id": "orders"}
    a = java_producer_options(base)
    b = java_producer_options(dict(base))
    other = java_producer_options({**base, "linger.ms": "7"})
    unnamed = java_producer_options({"bootstrap.servers": "b:1"})
    assert a["client.id"] == b["client.id"]  # Spark's pooled producers are reused
    assert a["client.id"].startswith("orders-") and a["client.id"] != "orders-"
    assert other["client.id"] != a["client.id"]
    assert unnamed["client.id"].startswith("kresilient-spark-")
    assert (a["acks"], a["enable.idempotence"]) == ("all", "true")

    retire_client_id(a)  # a failed write
    c = java_producer_options(base)
    assert c["client.id"] != a["client.id"] and c["client.id"].startswith("orders-")
    retire_client_id(a)  # a late report of the same failure retires nothing new
    assert java_producer_options(base)["client.id"] == c["client.id"]
    assert java_producer_options({**base, "linger.ms": "7"})["client.id"] == other["client.id"]


def test_jvm_engine_secrets_go_to_a_private_file_not_the_options() -> None:
    """Issue 35 #10 follow-up (pure logic; the plan graph and event log on a real write:
    tests/test_spark_seams.py): a secret setting leaves the options Spark sees as a
    ``${kresilient:<file>:<key>}`` placeholder; the file is private (0600 in a 0700
    directory), shared by concurrent writes with the same settings and removed by the last;
    a secret that is the user's own ``config.providers`` placeholder stays as it is; a
    cluster master (executors cannot read the driver's files) refuses an inline secret
    naming its key, without the value."""
    import os
    import stat
    from pathlib import Path

    from kresilient.spark._jvm import _secrets_out_of_plan, java_producer_options

    secret = 'x required password="Pw9=:#! \\é";'
    config = java_producer_options({"bootstrap.servers": "b:1", "sasl.jaas.config": secret})
    with _secrets_out_of_plan(config, executors_local=True) as options:
        placeholder = options["sasl.jaas.config"]
        assert placeholder.startswith("${kresilient:") and secret not in str(options)
        path = placeholder[len("${kresilient:") : -len(":sasl.jaas.config}")]
        assert options["config.providers"] == "kresilient"
        assert options["bootstrap.servers"] == "b:1"  # not secret: unchanged
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        body = Path(path).read_text(encoding="ascii")
        assert "Pw9" in body and "\\u00e9" in body  # escaped for Properties.load
        with _secrets_out_of_plan(config, executors_local=True) as again:
            assert again == options  # same settings: same options (Spark's producer pool)
        assert os.path.exists(path), "removed while another write still uses it"
    assert not os.path.exists(path)

    own = java_producer_options(
        {
            "bootstrap.servers": "b:1",
            "config.providers": "file",
            "config.providers.file.class": "org.apache.kafka.common.config.provider."
            "FileConfigProvider",
            "ssl.key.password": "${file:/mnt/s.properties:kp}",
        },
        known=frozenset({"bootstrap.servers", "ssl.key.password"}),  # providers: always taken
    )
    with _secrets_out_of_plan(own, executors_local=False) as options:
        assert options == own

    with pytest.raises(ConfigError) as info, _secrets_out_of_plan(config, executors_local=False):
        pass
    assert info.value.key == "sasl.jaas.config" and "Pw9" not in str(info.value)
    assert "config.providers" in str(info.value)


def test_jvm_engine_topic_settings_reused_within_ttl_and_forgotten_after_a_failure(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Issue 39 (engine="jvm" fixed cost): the topic settings read for a write serve the
    writes of the next ``TOPIC_SETTINGS_TTL`` seconds (a streaming query's micro-batches)
    through one ``Admin`` client kept open; a failed write forgets them (the broker's refusal
    may come from a changed setting), and so does the TTL. Control: the changed setting is
    really read once the cache is forgotten."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    import kresilient.spark._jvm as jvm_engine

    topic = topic_factory(partitions=1, config={"max.message.bytes": "40000"})
    config = jvm_engine.java_producer_options(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers}
    )
    jvm = spark._jvm
    first = jvm_engine.describe_topics(jvm, config, [topic])
    assert first[topic].max_message_bytes == 40000
    admin_before = dict(jvm_engine._admins)
    entry = ConfigEntry("max.message.bytes", "200000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    kafka_admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    kafka_admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    assert jvm_engine.describe_topics(jvm, config, [topic]) == first  # cached
    jvm_engine.forget_topic_limits()  # what a failed write does
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the controller's change reached the brokers
        jvm_engine.forget_topic_limits()
        again = jvm_engine.describe_topics(jvm, config, [topic])
        if again[topic].max_message_bytes == 200000:
            break
        time.sleep(0.2)
    assert again[topic].max_message_bytes == 200000
    assert dict(jvm_engine._admins) == admin_before, "the Admin client was not reused"


def test_jvm_engine_record_size_bound_counts_every_header_byte(spark: Any) -> None:
    """The routing's size bound, computed without lambdas, is exactly Java's upper bound of a
    one-record batch: 82 + key + value + per header (key bytes + value bytes + 10)."""
    from kresilient.spark._jvm import TopicLimits, route_plan

    rows = [
        (b"k", b"v" * 100, [("source", b"spark"), ("id", b"\x00" * 8)]),
        (None, b"", []),
        (b"kk", b"value", None),
        (b"", b"x", [("\u00e9t\u00e9", None), ("a", b"")]),  # a 2-byte char, a null value
        (b"k", b"v", [("h", b"\xff" * 3000)] * 40),
    ]
    schema = "key BINARY, value BINARY, headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
    df = spark.createDataFrame(rows, schema)
    limits = {"t": TopicLimits(partitions=1, max_message_bytes=100_000, compacted=False)}
    plan = route_plan(
        topic_sql="'t'", has={"key", "value", "headers"}, limits=limits, max_request_size=10**6
    )
    # Through py4j, not collect(): pyspark 4.0.0's collect() leaves its socket unclosed.
    java_rows = df.selectExpr(f"{plan.size}", f"{plan.reason}")._jdf.collectAsList()
    got = [(r.get(0), r.get(1)) for r in java_rows]

    def bound(key: Any, value: bytes, headers: Any) -> int:
        hs = sum(len(k.encode()) + len(v or b"") + 10 for k, v in headers or [])
        return 82 + len(key or b"") + len(value) + hs

    want = [bound(*r) for r in rows]
    assert [g for g, _ in got] == want
    assert [r for _, r in got] == [None, None, None, None, "MSG_SIZE_TOO_LARGE"]
    assert plan.reasons == ("MSG_SIZE_TOO_LARGE",)  # a fixed topic: only the size can fail


def _producer_client_ids(spark: Any, prefix: str) -> set[str]:
    """client.id of every live Java producer in the driver's JVM (local mode: the executors'),
    from its sender thread's name (``kafka-producer-network-thread | <client.id>``)."""
    threads = str(spark._jvm.java.lang.Thread.getAllStackTraces().keySet().toString())
    found = re.findall(r"kafka-producer-network-thread \| ([\w.-]+)", threads)
    return {i for i in found if i.startswith(prefix)}


def test_jvm_engine_writes_reuse_pooled_producers_and_a_failed_write_gets_new_ones(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Writes with the same settings share Spark's pooled producers (a streaming query does
    not leave a producer per micro-batch behind); after a failed write, the next write does
    not inherit the failed one's producers."""
    import uuid

    from pyspark.sql import functions as F

    from kresilient.spark import write

    topic = topic_factory(partitions=2)
    dlq = topic_factory(partitions=1)
    prefix = f"reuse-{uuid.uuid4().hex[:8]}"
    df = spark.range(1000, numPartitions=2).select(F.col("id").cast("string").alias("value"))

    def once(frame: Any) -> None:
        write(frame, topic=topic, bootstrap_servers=kafka_cluster.bootstrap_servers,
              engine="jvm", dead_letter_topic=dlq, client_id=prefix)  # fmt: skip

    for _ in range(3):
        once(df)
    first = _producer_client_ids(spark, prefix)
    assert len(first) == 1, first  # one client.id for three writes (each had its own before)

    failing = df.select(F.when(F.col("value") == "500", F.raise_error(F.lit("boom")))
                        .otherwise(F.col("value")).alias("value"))  # fmt: skip
    with pytest.raises(Exception, match="boom"):
        once(failing)
    once(df)
    after = _producer_client_ids(spark, prefix)
    assert after - first, (first, after)  # the write after the failure: new producers
    values = Counter(v.decode() for _, _, v, _ in _records(kafka_cluster, topic))
    # Nothing lost: the four good writes each wrote every row. The failed write's task that
    # met row 500 first wrote none of its rows; the other task may have written its own.
    assert all(values[str(i)] == 4 for i in range(500, 1000))
    assert all(values[str(i)] in (4, 5) for i in range(500))


def test_jvm_engine_streaming_routes_per_micro_batch(
    spark: Any, kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Any
) -> None:
    from pyspark.sql import functions as F

    from kresilient.spark import write_stream, write_summaries

    topic = topic_factory(partitions=1, config={"max.message.bytes": 65536})
    dlq = topic_factory(partitions=1)
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.txt").write_text("\n".join(["small"] * 9 + ["big"]) + "\n")
    lines = spark.readStream.format("text").load(str(src))
    df = lines.select(
        F.when(F.col("value") == "big", F.expr("repeat('v', 100000)"))
        .otherwise(F.col("value"))
        .alias("value")
    )
    query = write_stream(
        df,
        topic=topic,
        bootstrap_servers=kafka_cluster.bootstrap_servers,
        checkpoint_location=str(tmp_path / "chk"),
        engine="jvm",
        dead_letter_topic=dlq,
    )
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = [s for s in write_summaries() if s.mode == "streaming" and s.topic == topic]
    assert sum(s.written for s in streamed) == 9
    assert sum(s.dead_lettered for s in streamed) == 1
    assert len(_records(kafka_cluster, topic)) == 9
    dead = _records(kafka_cluster, dlq)
    assert [v[:3] for _, _, v, _ in dead] == [b"vvv"]
    headers = dead[0][3]  # a string value column, no headers column: kresilient's own only
    assert headers["kresilient.original.topic"] == topic.encode()
    assert headers["kresilient.exception.message"].startswith(b"MSG_SIZE_TOO_LARGE: record of ")
    assert headers["kresilient.error.category"] == b"config"
    assert "kresilient.original.partition" not in headers


def test_streaming_data_source_follows_the_installed_pyspark() -> None:
    """On the installed pyspark itself (CI runs the Spark tests on the lowest and the newest):
    4.0 refuses ``writeStream.format('kresilient')`` naming its version and the way out; 4.1+
    has the Arrow stream writer the data source subclasses."""
    import pyspark

    from kresilient.spark import _source

    major, minor = (int(p) for p in pyspark.__version__.split(".")[:2])
    source = _source.KResilientDataSource({"kafka.bootstrap.servers": "b:1", "topic": "t"})
    if (major, minor) < (4, 1):
        assert _source.DataSourceStreamArrowWriter is None
        with pytest.raises(ConfigError, match=rf"pyspark {re.escape(pyspark.__version__)}"):
            source.streamWriter(None, False)
    else:
        from pyspark.sql.datasource import DataSourceStreamArrowWriter

        assert _source.DataSourceStreamArrowWriter is DataSourceStreamArrowWriter
        assert issubclass(_source._StreamWriter, DataSourceStreamArrowWriter)


def test_streaming_data_source_refused_clearly_without_stream_arrow_writer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyspark 4.0 lacks ``DataSourceStreamArrowWriter``: the error says what to do."""
    from kresilient.spark import _source

    source = _source.KResilientDataSource({"kafka.bootstrap.servers": "b:1", "topic": "t"})
    monkeypatch.setattr(_source, "DataSourceStreamArrowWriter", None)
    with pytest.raises(ConfigError, match=r"pyspark>=4\.1.*engine='jvm'") as info:
        source.streamWriter(None, False)
    assert info.value.key == "format"
