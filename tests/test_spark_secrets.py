"""Secrets never leave the ``kresilient`` Spark sink (issue 11, defect 5, Spark part).

Exits covered: a task's exception (what Spark prints into executor/driver logs, the UI and the
job's error), librdkafka's own log lines, and the write's options in Spark's plan (the SQL tab
of the UI and the event log show the logical plan with ``spark.sql.ui.explainMode=extended``).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from kresilient.errors import DeliveryError, KResilientError  # noqa: E402
from kresilient.redaction import Redactor  # noqa: E402
from kresilient.spark._options import column_layout, parse_options  # noqa: E402
from kresilient.spark._task import TaskInfo, scrubbed  # noqa: E402
from kresilient.spark._write import (  # noqa: E402
    RedactingLogger,
    discard_producers,
    sink_producer_config,
    write_task,
)

SECRET = "Sup3rSecretValue9"
#: Malformed on purpose: librdkafka echoes the unparsed tail, secret included.
OAUTH = f"principalXX=bob extension_a={SECRET}"
#: A private key whose text matches none of Spark's own redaction words (secret, password...).
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7XyZ"
PEM = f"-----BEGIN PRIVATE KEY-----\n{PEM_BODY}\n-----END PRIVATE KEY-----"


def test_scrubbed_exception_keeps_its_type_and_drops_the_chain() -> None:
    redactor = Redactor.for_config({"sasl.oauthbearer.config": OAUTH})
    try:
        try:
            raise ValueError(f"librdkafka said: beginning at: {OAUTH}")
        except ValueError as inner:
            raise DeliveryError(f"delivery failed near {SECRET}") from inner
    except DeliveryError as exc:
        safe = scrubbed(exc, redactor)
    assert isinstance(safe, DeliveryError)
    text = "".join(traceback.format_exception(safe))
    assert SECRET not in text and "[REDACTED]" in text
    assert "caused by ValueError" in str(safe)
    assert safe.__cause__ is None and safe.__context__ is None
    # Not a kresilient exception: wrapped, named, classified.
    other = scrubbed(RuntimeError(f"token {SECRET}"), redactor)
    assert isinstance(other, KResilientError) and "RuntimeError" in str(other)
    assert SECRET not in str(other)
    # Nothing secret: left alone (the caller re-raises the original).
    assert scrubbed(RuntimeError("plain"), redactor) is None
    assert scrubbed(KeyboardInterrupt(), redactor) is None


def test_librdkafka_log_lines_are_redacted() -> None:
    logger = RedactingLogger(Redactor.for_config({"sasl.oauthbearer.config": OAUTH}))
    with structlog.testing.capture_logs() as logs:
        logger.log(40, "%s [%s] %s", "OAUTHBEARER", "rdkafka#producer-1", f"beginning at: {OAUTH}")
    assert len(logs) == 1
    assert SECRET not in logs[0]["line"] and "[REDACTED]" in logs[0]["line"]


def test_task_failure_names_the_client_error_without_the_secret() -> None:
    """A malformed sasl.oauthbearer.config: librdkafka echoes its tail (secret included) in
    the error it reports, the rows time out, the task fails. The failure must say why (the
    authentication error) and carry no secret, anywhere in its traceback."""
    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "topic": "t",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanisms": "OAUTHBEARER",
            "kafka.enable.sasl.oauthbearer.unsecure.jwt": "true",
            "kafka.sasl.oauthbearer.config": OAUTH,
            "kafka.message.timeout.ms": "1500",
        }
    )
    layout = column_layout([("value", "binary")], topic_option="t")
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"], pa.binary())], ["value"])
    try:
        with pytest.raises(DeliveryError) as info:
            write_task(
                options,
                layout,
                iter([batch]),
                config=sink_producer_config(options),
                context=lambda: TaskInfo(partition_id=0, attempt=0),
            )
    finally:
        discard_producers()
    text = "".join(traceback.format_exception(info.value))
    assert "_MSG_TIMED_OUT" in text
    assert "sasl.oauthbearer.config beginning at" in text  # the cause is named ...
    assert SECRET not in text and "principalXX" not in text  # ... without the secret


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from kresilient.spark.connector import connector_jars

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kresilient-spark-secret-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", ",".join(connector_jars()))  # see test_spark_jvm
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    yield spark
    spark.stop()


@pytest.mark.integration
def test_secret_options_never_in_spark_plan(spark: Any, kafka_cluster: Any, topic: str) -> None:
    """With explainMode=extended, Spark puts the write's options into the plan kept for the SQL
    UI and the event log, hiding only keys/values matching its redaction regexes: a PEM key
    under ``kafka.ssl.key.pem`` matched none of them on 9c6e9f3. register() extends the
    session's option-redaction regex with every secret key kresilient knows."""
    from kresilient.spark import register

    register(spark)
    spark.conf.set("spark.sql.ui.explainMode", "extended")
    try:
        (
            spark.range(3)
            .selectExpr("CAST(id AS STRING) AS value")
            .write.format("kresilient")
            .option("kafka.bootstrap.servers", kafka_cluster.bootstrap_servers)
            .option("topic", topic)
            .option("kafka.ssl.key.pem", PEM)  # not used over PLAINTEXT: the write succeeds
            .mode("append")
            .save()
        )
    finally:
        spark.conf.unset("spark.sql.ui.explainMode")
    executions = spark._jsparkSession.sharedState().statusStore().executionsList()
    plans = [str(executions.apply(i).physicalPlanDescription()) for i in range(executions.size())]
    ours = [p for p in plans if "kafka.bootstrap.servers" in p]
    assert ours, "the write's options are not in the plan: the check below proves nothing"
    assert "kafka.ssl.key.pem=*********(redacted)" in ours[-1]
    assert not any(PEM_BODY in p for p in plans)
