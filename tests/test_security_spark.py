"""The ``kresilient`` Spark sink over SASL_SSL as a non-super user (issue 19, acceptance 1).

A batch ``df.write.format("kresilient")`` in local mode against a secured 3-node cluster
(SCRAM-SHA-512, ACLs enforced), as a user holding only ``WRITE`` and ``DESCRIBE`` on the
topic: the minimum the sink's idempotent producer needs (docs/security.md). Negative control:
the same job before the grant writes nothing and fails.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Consumer, TopicPartition

from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

_ROWS = 500


@pytest.fixture(scope="module")
def cluster(sasl_ssl_cluster: KafkaCluster) -> KafkaCluster:
    """The SASL_SSL cluster this file shares with the rest of the "security" group
    (tests/conftest.py): every test makes its own users, topics, groups and ACLs under unique
    names and asserts about those only."""
    return sasl_ssl_cluster


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    # the session of tests/test_spark_integration.py (local mode, the connector's jars)
    from pyspark.sql import SparkSession

    from kresilient.spark import register
    from kresilient.spark.connector import connector_jars

    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("kresilient-spark-security-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", ",".join(connector_jars()))
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    yield spark
    spark.stop()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _read_all(cluster: KafkaCluster, topic: str, expected: int, timeout: float) -> list[bytes]:
    """Every value of ``topic`` (2 partitions) read as the super user, until ``expected``
    values or the deadline."""
    consumer = Consumer(
        {**cluster.client_config(), "group.id": _name("reader"), "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return values


def test_spark_sink_round_trip_over_sasl_ssl_with_write_and_describe_only(
    cluster: KafkaCluster, spark: Any
) -> None:
    from pyspark.sql import functions as F

    user, topic = _name("spark"), _name("t")
    password = cluster.create_user(user)
    cluster.create_topic(topic, 2, 3, {"min.insync.replicas": 2})
    df = spark.range(_ROWS, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).cast("binary").alias("value"),
    )
    writer = df.write.format("kresilient").option("topic", topic).mode("append")
    for key, value in cluster.client_config(user).items():
        writer = writer.option(f"kafka.{key}", value)
    writer = writer.option("kafka.message.timeout.ms", "30000")

    # negative control: the same job without the ACLs fails and writes nothing
    with pytest.raises(Exception) as denied:  # Spark wraps the task's error
        writer.save()
    text = str(denied.value)
    # Which refusal comes first is a race inside librdkafka: the topic's (a delivery report)
    # or the idempotent producer id's (fatal, raised by poll/flush; CI saw it under load).
    # Either is an authorization failure naming its code.
    assert "TOPIC_AUTHORIZATION_FAILED" in text or (
        "FatalProducerError: CLUSTER_AUTHORIZATION_FAILED (31)" in text
        and "an idempotent producer needs WRITE on a topic" in text
    ), text[-2000:]
    assert password not in text
    assert _read_all(cluster, topic, 1, timeout=3) == []

    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    writer.save()
    values = _read_all(cluster, topic, _ROWS, timeout=60)
    assert sorted(values) == sorted(b"row-%d" % i for i in range(_ROWS))


@pytest.mark.parametrize("fault", ["wrong_password", "wrong_ca"])
def test_spark_sink_refused_login_fails_the_job_as_auth_naming_the_setting(
    cluster: KafkaCluster, spark: Any, tmp_path: Any, fault: str
) -> None:
    # message.timeout.ms of ten minutes: the job fails on the refusal itself, naming it (the
    # "refused this producer" error exists only on that path; at the timeout the rows would
    # fail as _MSG_TIMED_OUT with the client errors appended). Spark retries the task 3 times.
    from pyspark.sql import functions as F

    from kresilient.testing import CertificateAuthority

    user, topic = _name("spark"), _name("t")
    password = cluster.create_user(user)
    cluster.create_topic(topic, 2, 3, {"min.insync.replicas": 2})
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    config = dict(cluster.client_config(user))
    wrong = "Wr0ng-pass-" + uuid.uuid4().hex
    if fault == "wrong_password":
        config["sasl.password"] = wrong
    else:
        config["ssl.ca.location"] = str(CertificateAuthority(tmp_path / "other").ca_path)
    df = spark.range(50, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("value")
    )
    writer = df.write.format("kresilient").option("topic", topic).mode("append")
    for key, value in config.items():
        writer = writer.option(f"kafka.{key}", value)
    writer = writer.option("kafka.message.timeout.ms", "600000")
    began = time.monotonic()
    with pytest.raises(Exception) as refused:  # Spark wraps the task's DeliveryError
        writer.save()
    waited = time.monotonic() - began
    text = str(refused.value)
    code = "_AUTHENTICATION" if fault == "wrong_password" else "_SSL"
    assert f"not sent: the cluster refused this producer (AUTH, {code})" in text, text[-3000:]
    setting = "sasl.password" if fault == "wrong_password" else "ssl.ca.location"
    assert setting in text, text[-3000:]
    assert password not in text and wrong not in text
    assert _read_all(cluster, topic, 1, timeout=3) == []
    print(f"\n[{fault}] Spark job failed as AUTH after {waited:.1f} s (message.timeout.ms 600 s)")


def test_jvm_engine_over_sasl_ssl_secret_reaches_the_producer_not_the_plan(
    cluster: KafkaCluster, spark: Any
) -> None:
    """engine="jvm" keeps ``sasl.jaas.config`` (the SCRAM password inside) out of the options
    Spark prints in its plan graph: the producers read it from a private file through a
    ``config.providers`` placeholder (issue 35 #10 follow-up). This proves the placeholder
    reaches a working login: every row is written over SASL_SSL (the cluster refuses a wrong
    password: ``test_spark_sink_refused_login_fails_the_job_as_auth_naming_the_setting``),
    and neither the plan graph nor the plan text holds the password."""
    from pyspark.sql import functions as F

    from kresilient.spark import write

    topic, dlq = _name("t"), _name("dlq")
    cluster.create_topic(topic, 2, 3, {"min.insync.replicas": 2})
    cluster.create_topic(dlq, 1, 3, {"min.insync.replicas": 2})
    conf = cluster.client_config()
    password = conf["sasl.password"]
    login = "org.apache.kafka.common.security.scram.ScramLoginModule"
    df = spark.range(_ROWS, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("key"),
        F.concat(F.lit("row-"), F.col("id").cast("string")).cast("binary").alias("value"),
    )
    summary = write(
        df,
        topic=topic,
        bootstrap_servers=conf["bootstrap.servers"],
        engine="jvm",
        dead_letter_topic=dlq,
        options={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": conf["sasl.mechanism"],
            "sasl.jaas.config": f'{login} required username="{conf["sasl.username"]}" '
            f'password="{password}";',
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": conf["ssl.ca.location"],
        },
    )
    assert (summary.rows, summary.written) == (_ROWS, _ROWS)
    values = _read_all(cluster, topic, _ROWS, timeout=60)
    assert sorted(values) == sorted(b"row-%d" % i for i in range(_ROWS))
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    texts: list[str] = []
    for i in range(executions.size()):
        execution = executions.apply(i)
        texts.append(str(execution.physicalPlanDescription()))
        nodes = store.planGraph(execution.executionId()).allNodes()
        texts += [str(nodes.apply(n).desc()) for n in range(nodes.size())]
    assert any("KafkaWrite" in t and "sasl.jaas.config=${kresilient:" in t for t in texts)
    assert not any(password in t for t in texts)
