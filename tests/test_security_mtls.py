"""Mutual TLS (``KafkaCluster(security="ssl")``): the certificate's CN is the user (issue 19).

One mTLS cluster for the module: a round trip with a certificate user holding only its ACLs,
no certificate / an expired certificate refused at the handshake, a wrong key password
refused at construction, and neither the key password nor the private key ever printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import DeadLetterRecord, DeadLetterWriter
from kresilient.errors import (
    ConfigError,
    ConsumeError,
    DeliveryError,
    ErrorCategory,
    KafkaClientError,
    KResilientError,
)
from kresilient.producer import ResilientProducer
from kresilient.testing import CertificateAuthority, KafkaCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    c = KafkaCluster(security="ssl")
    try:
        c.start_cluster()
        yield c
    finally:
        c.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _read(cluster: KafkaCluster, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({**cluster.client_config(), "group.id": _name("r")})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return values


def _end_offset(cluster: KafkaCluster, topic: str) -> int:
    """The high watermark of ``topic``'s partition 0, read as the super user."""
    consumer = Consumer({**cluster.client_config(), "group.id": _name("w")})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


def test_mtls_producer_round_trip_as_certificate_user(cluster: KafkaCluster) -> None:
    user, topic = _name("svc"), cluster.create_topic(_name("t"), 1, 3)
    cluster.create_user(user)
    config = {**cluster.client_config(user), "message.timeout.ms": "15000"}
    assert config["security.protocol"] == "SSL" and "ssl.certificate.location" in config
    with ResilientProducer(config) as producer:  # negative control: no ACL for User:<CN>
        producer.produce(topic, b"denied")
        with pytest.raises(DeliveryError, match="TOPIC_AUTHORIZATION_FAILED"):
            producer.flush(30)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    with ResilientProducer(config) as producer:
        for i in range(10):
            producer.produce(topic, b"m%d" % i)
        producer.flush(30)
    assert _read(cluster, topic, 10) == [b"m%d" % i for i in range(10)]


@pytest.mark.parametrize("fault", ["no_certificate", "expired_certificate"])
def test_mtls_refused_certificate_is_an_ssl_error(
    cluster: KafkaCluster, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    user, topic = _name("svc"), cluster.create_topic(_name("t"), 1, 3)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    config = {**cluster.client_config(user), "message.timeout.ms": "8000"}
    if fault == "no_certificate":
        for key in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password"):
            del config[key]
    else:
        config.update(cluster.issue_certificate(user, expired=True).client_settings())
    with ResilientProducer(config) as producer:
        producer.produce(topic, b"x")
        with pytest.raises(DeliveryError):
            producer.flush(30)
        assert producer.health().last_error in ("_SSL", "_TRANSPORT")
    # the broker refuses the certificate with a TLS alert: kresilient's reachability summary
    # names TLS as the reason for every broker
    out = capfd.readouterr().out
    (line,) = [x for x in out.splitlines() if "kafka_unreachable" in x]
    assert line.count("'TLS'") == 3, line
    assert _end_offset(cluster, topic) == 0  # nothing was written (the high watermark, at once)


#: What the broker's TLS alert says (a JDK broker answers an expired client certificate with
#: "certificate unknown", no certificate at all with "bad certificate").
_ALERT = {
    "no_certificate": "alert bad certificate",
    "expired_certificate": "alert certificate unknown",
}


def _refused_config(cluster: KafkaCluster, user: str, fault: str) -> dict[str, str]:
    config = cluster.client_config(user)
    if fault == "no_certificate":
        for key in ("ssl.certificate.location", "ssl.key.location", "ssl.key.password"):
            del config[key]
    else:
        config.update(cluster.issue_certificate(user, expired=True).client_settings())
    return config


@pytest.mark.parametrize("fault", ["no_certificate", "expired_certificate"])
def test_mtls_refused_certificate_error_names_the_cause(cluster: KafkaCluster, fault: str) -> None:
    """The DeliveryError and the consumer's ConsumeError say the broker refused the client
    certificate (AUTH, the TLS alert, what to check), not only that time ran out."""
    user, topic, group = _name("svc"), cluster.create_topic(_name("t"), 1, 3), _name("g")
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "READ", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    good = {**cluster.client_config(user), "message.timeout.ms": "8000"}
    # negative control: the user's valid certificate writes and reads the topic
    with ResilientProducer(good) as producer:
        producer.produce(topic, b"ok")
        producer.flush(30)
    seen: list[bytes] = []

    def handle(msg: object) -> None:
        seen.append(msg.value())  # type: ignore[attr-defined]
        consumer.stop()

    consumer = ResilientConsumer(
        {**cluster.client_config(user), "group.id": group},
        [topic],
        handle,
        dead_letter=None,
        install_signal_handlers=False,
    )
    timer = threading.Timer(60, consumer.stop)  # bound: the record was produced above
    timer.start()
    try:
        consumer.run()
    finally:
        timer.cancel()
    assert seen == [b"ok"]

    bad = {**_refused_config(cluster, user, fault), "message.timeout.ms": "8000"}
    with ResilientProducer(bad) as producer:
        producer.produce(topic, b"x")
        with pytest.raises(DeliveryError) as exc:
            producer.flush(30)
    (failure,) = exc.value.failures
    assert failure.classification.category is ErrorCategory.AUTH
    assert failure.classification.name == "_SSL"
    assert not failure.classification.possibly_persisted
    assert _ALERT[fault] in str(exc.value) and "ssl.certificate.location" in str(exc.value)
    if fault == "expired_certificate":  # the broker's alert cannot say it: the client checks
        assert "expired on" in str(exc.value) and "renew" in str(exc.value)

    bad_consumer = {k: v for k, v in bad.items() if k != "message.timeout.ms"}
    consumer = ResilientConsumer(
        {**bad_consumer, "group.id": group}, [topic], handle, install_signal_handlers=False
    )
    with pytest.raises(ConsumeError) as cexc:
        consumer.run()
    assert cexc.value.classification.category is ErrorCategory.AUTH
    assert _ALERT[fault] in str(cexc.value) and "ssl.certificate.location" in str(cexc.value)
    assert _read(cluster, topic, 1) == [b"ok"]  # the refused producer wrote nothing


def test_mtls_key_password_and_private_key_never_printed(
    cluster: KafkaCluster, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    user, topic = _name("svc"), cluster.create_topic(_name("t"), 1, 3)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    config = {**cluster.client_config(user), "debug": "security,broker,protocol"}
    key_password = config["ssl.key.password"]
    pem = Path(config["ssl.key.location"]).read_text()
    body = "".join(pem.splitlines()[1:-1])
    captured: list[str] = []
    # 1. a working connection with debug on
    with ResilientProducer(config) as producer:
        captured.append(repr(producer))
        producer.produce(topic, b"ok")
        producer.flush(30)
    # 2. a wrong key password: refused when the client is built, naming the key
    wrong = {**config, "ssl.key.password": "Wr0ng-key-" + uuid.uuid4().hex}
    with pytest.raises(KResilientError) as exc:
        ResilientProducer(wrong)
    captured += [str(exc.value), repr(exc.value)]
    assert isinstance(exc.value, ConfigError) or "ssl" in str(exc.value).lower()
    # 3. the private key inline (ssl.key.pem) with a wrong password
    inline = {k: v for k, v in wrong.items() if k != "ssl.key.location"}
    inline["ssl.key.pem"] = pem
    with pytest.raises(KResilientError) as exc2:
        ResilientProducer(inline)
    captured += [str(exc2.value), repr(exc2.value)]
    out = capfd.readouterr()
    captured += [out.out, out.err]
    assert "SSL" in out.out  # debug was on
    blob = "\n".join(captured)
    for secret in (key_password, wrong["ssl.key.password"]):
        assert secret not in blob
        assert secret[len(secret) // 2 - 5 : len(secret) // 2 + 5] not in blob
    for chunk in re.findall(".{24}", body)[:6]:
        assert chunk not in blob
    assert "PRIVATE KEY-----" not in blob.replace("ssl.key.pem", "")


# --------------------------------------------------------------------------- expired certificate:
# every other component and CLI command (issue 19, acceptance 3). Each test's control: the same
# user's valid certificate does the same thing.

_EXPIRED_ALERT = "alert certificate unknown"


def _expired(cluster: KafkaCluster, user: str) -> dict[str, str]:
    return {
        **cluster.client_config(user),
        **cluster.issue_certificate(user, expired=True).client_settings(),
    }


def _assert_names_the_expired_certificate(exc: KResilientError, config: dict[str, str]) -> None:
    assert exc.classification.category is ErrorCategory.AUTH, exc
    assert not exc.classification.retriable
    assert exc.classification.name == "_SSL"
    text = str(exc)
    assert _EXPIRED_ALERT in text and "expired on" in text, text
    assert "ssl.certificate.location" in exc.classification.remedy
    assert config["ssl.key.password"] not in text + repr(exc)


async def _consume_one(config: dict[str, str], topic: str, deadline: float) -> list[bytes]:
    from kresilient.aio import AsyncResilientConsumer

    seen: list[bytes] = []
    consumer: AsyncResilientConsumer

    async def handle(msg: Message) -> None:
        seen.append(msg.value() or b"")
        consumer.stop()

    consumer = AsyncResilientConsumer(config, [topic], handle, handle_signals=False)
    await asyncio.wait_for(consumer.run(), deadline)
    return seen


def test_mtls_expired_certificate_aio_consumer_raises_auth_naming_it(
    cluster: KafkaCluster, capfd: pytest.CaptureFixture[str]
) -> None:
    user, topic, group = _name("svc"), cluster.create_topic(_name("t"), 1, 3), _name("g")
    cluster.create_topic(topic + ".dlq", 1, 3)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    cluster.grant(user, topic=topic + ".dlq", operations=("WRITE", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    with ResilientProducer(cluster.client_config()) as producer:
        producer.produce(topic, b"one")
        producer.flush(30)
    # control: the valid certificate consumes the record
    good = {**cluster.client_config(user), "group.id": group}
    assert asyncio.run(_consume_one(good, topic, 60)) == [b"one"]
    bad = {**_expired(cluster, user), "group.id": group}
    capfd.readouterr()
    began = time.monotonic()
    with pytest.raises(ConsumeError) as exc:
        # a deadline, not a measurement: without the refusal rule run() never ends
        asyncio.run(_consume_one(bad, topic, 25))
    print(f"aio consumer expired certificate: AUTH after {time.monotonic() - began:.1f} s")
    _assert_names_the_expired_certificate(exc.value, bad)
    out = capfd.readouterr()
    assert not _raw_fail_lines(out.err, bad), out.err[-2000:]
    assert "kafka_authentication_failed" in out.out


def test_mtls_expired_certificate_admin_create_topic_raises_auth_naming_it(
    cluster: KafkaCluster,
) -> None:
    from kresilient.admin import create_topic

    user, name = _name("svc"), _name("adm")
    cluster.create_user(user)
    cluster.grant(user, topic=name, operations=("CREATE", "DESCRIBE"), prefixed=True)
    (made,) = create_topic(  # control: the valid certificate creates the topic
        cluster.bootstrap_servers,
        name,
        replication_factor=3,
        timeout=30,
        client_config=cluster.client_config(user),
    )
    assert made.name == name and not made.existed
    bad = _expired(cluster, user)
    with pytest.raises(KafkaClientError) as exc:
        # the refusal ends the call, not the (generous) timeout
        create_topic(
            cluster.bootstrap_servers,
            name + "-2",
            replication_factor=3,
            timeout=60,
            client_config=bad,
        )
    _assert_names_the_expired_certificate(exc.value, bad)
    assert exc.value.code == KafkaError._SSL


@pytest.mark.parametrize("fault", ["expired_certificate", "wrong_ca"])
def test_mtls_dead_letter_writer_refused_certificate_fails_fast_as_auth(
    cluster: KafkaCluster, tmp_path: Path, fault: str
) -> None:
    """message.timeout.ms is 120 s: flush(30) must end with the dead letter failed as AUTH,
    never sent, naming the certificate (not "still unacknowledged" or timed out)."""
    user, topic = _name("svc"), cluster.create_topic(_name("t") + ".dlq", 1, 3)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    record = DeadLetterRecord(topic=topic, key=b"k", value=b"poison", headers=[])
    good = {**cluster.client_config(user), "message.timeout.ms": "120000"}
    with DeadLetterWriter(good) as writer:  # control: the valid certificate writes it
        handle = writer.write(record)
        writer.flush(30)
        assert handle.result(0).offset == 0
    if fault == "expired_certificate":
        bad = _expired(cluster, user)
    else:
        bad = {
            **cluster.client_config(user),
            "ssl.ca.location": str(CertificateAuthority(tmp_path / "other").ca_path),
        }
    writer = DeadLetterWriter({**bad, "message.timeout.ms": "120000"})
    try:
        handle = writer.write(record)
        began = time.monotonic()
        with pytest.raises(DeliveryError) as exc:
            writer.flush(30)
        print(f"dead-letter writer {fault}: AUTH after {time.monotonic() - began:.1f} s")
        assert "still unacknowledged" not in str(exc.value), exc.value
        (failure,) = exc.value.failures
        c = failure.classification
        assert c.category is ErrorCategory.AUTH and not c.retriable and c.name == "_SSL", c
        assert not c.possibly_persisted
        error = handle.exception(0)
        assert error is not None and error.classification.category is ErrorCategory.AUTH
        if fault == "expired_certificate":
            _assert_names_the_expired_certificate(error, bad)
        else:
            assert "certificate verify failed" in str(error)
            assert "ssl.ca.location" in error.classification.remedy
        assert writer.pending == 0
    finally:
        with contextlib.suppress(DeliveryError):
            writer.close(5)
    assert _end_offset(cluster, topic) == 1  # only the control's dead letter was written


def _cli_properties(path: Path, config: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in config.items() if k != "bootstrap.servers"))
    path.chmod(0o600)
    return path


_CLI_CAUSE = {
    "expired_certificate": (_EXPIRED_ALERT, "ssl.certificate.location"),
    "wrong_ca": ("certificate verify failed", "ssl.ca.location"),
}


@pytest.mark.parametrize("fault", ["expired_certificate", "wrong_ca"])
@pytest.mark.parametrize("command", ["dlq inspect", "dlq replay", "audit", "topic create"])
def test_mtls_cli_refused_certificate_exits_2_naming_the_setting(
    cluster: KafkaCluster,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    command: str,
    fault: str,
) -> None:
    """Every command: a refused handshake is exit 2 (the client's settings are the input to
    fix, as an unreachable cluster), one line naming librdkafka's reason, [_SSL] and the
    setting, within the connection timeout; never the key password."""
    from kresilient.cli import main as cli

    user, name = _name("svc"), _name("cli")
    cluster.create_user(user)
    dlq = cluster.create_topic(name + ".dlq", 1, 3)
    target = cluster.create_topic(name + "-to", 1, 3)
    cluster.grant(
        user, topic=name, operations=("CREATE", "DESCRIBE", "READ", "WRITE"), prefixed=True
    )
    cluster.grant(user, group="kresilient-dlq-", operations=("READ",), prefixed=True)
    cluster.grant(user, cluster=True, operations=("DESCRIBE_CONFIGS",))
    cluster.grant(user, topic=name, operations=("DESCRIBE_CONFIGS",), prefixed=True)
    argv = {
        "dlq inspect": ["dlq", "inspect", dlq, "--timeout", "30"],
        "dlq replay": ["dlq", "replay", "--from", dlq, "--to", target, "--timeout", "30"],
        "audit": ["audit", "--topic", dlq, "--timeout", "30"],
        "topic create": ["topic", "create", name + "-new", "--timeout", "30"],
    }[command]
    argv += ["-b", cluster.bootstrap_servers, "--command-config"]
    good = cluster.client_config(user)
    # control: the valid certificate connects (audit may report findings: exit 1, no KR065)
    code = cli([*argv, str(_cli_properties(tmp_path / "good.properties", good))])
    out = capfd.readouterr()
    assert code in ((0, 1) if command == "audit" else (0,)), out
    assert "KR065" not in out.out and "refused this client" not in out.out + out.err, out
    if fault == "expired_certificate":
        bad = _expired(cluster, user)
    else:
        bad = {**good, "ssl.ca.location": str(CertificateAuthority(tmp_path / "o").ca_path)}
    conf = _cli_properties(tmp_path / "bad.properties", bad)
    began = time.monotonic()
    code = cli([*argv, str(conf)])
    waited = time.monotonic() - began
    out = capfd.readouterr()
    text = out.out + out.err
    print(f"{command} {fault}: exit {code} after {waited:.1f} s (--timeout 30)")
    assert code == 2, text
    cause, setting = _CLI_CAUSE[fault]
    assert "refused this client's credentials or certificate [_SSL]" in text, text
    assert cause in text and setting in text, text
    assert bad["ssl.key.password"] not in text and good["ssl.key.password"] not in text
    # no raw librdkafka line of the CLI's clients: lines naming this cluster's addresses (a
    # client another test of this worker left behind may still log, raw, about its own stopped
    # cluster into this process's stderr: CI saw one, "Connect to ... :10495 failed")
    raw = [
        line
        for line in text.splitlines()
        if "|FAIL|" in line and any(a in line for a in cluster.bootstrap_servers.split(","))
    ]
    assert "PRIVATE KEY" not in text and not raw, raw


# --------------------------------------------------------------------------- Spark sink


@pytest.fixture(scope="module", name="spark")
def _spark() -> Iterator[Any]:
    # the session of tests/test_security_spark.py (local mode, the connector's jars)
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from kresilient.spark import register
    from kresilient.spark.connector import connector_jars

    spark = (
        SparkSession.builder.master("local[2,3]")
        .appName("kresilient-spark-mtls-tests")
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


@pytest.mark.timeout(900)
def test_mtls_spark_sink_expired_certificate_fails_the_job_as_auth(
    cluster: KafkaCluster, spark: Any
) -> None:
    """message.timeout.ms of ten minutes: the job fails on the refused certificate itself
    (AUTH, _SSL, naming it expired and ssl.certificate.location), writing nothing. Control:
    the same job with the user's valid certificate writes every row."""
    from pyspark.sql import functions as F

    user, topic = _name("spark"), cluster.create_topic(_name("t"), 1, 3)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    df = spark.range(50, numPartitions=2).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).cast("binary").alias("value")
    )

    def writer(config: dict[str, str]) -> Any:
        w = df.write.format("kresilient").option("topic", topic).mode("append")
        for key, value in config.items():
            w = w.option(f"kafka.{key}", value)
        return w.option("kafka.message.timeout.ms", "600000")

    good = cluster.client_config(user)
    writer(good).save()  # control
    assert len(_read(cluster, topic, 50)) == 50
    bad = _expired(cluster, user)
    began = time.monotonic()
    with pytest.raises(Exception) as refused:  # Spark wraps the task's DeliveryError
        writer(bad).save()
    waited = time.monotonic() - began
    text = str(refused.value)
    assert "not sent: the cluster refused this producer (AUTH, _SSL)" in text, text[-3000:]
    assert _EXPIRED_ALERT in text and "expired on" in text, text[-3000:]
    assert "ssl.certificate.location" in text
    assert bad["ssl.key.password"] not in text
    assert _end_offset(cluster, topic) == 50  # nothing more was written
    print(f"\nSpark job failed as AUTH after {waited:.1f} s (message.timeout.ms 600 s)")


def _raw_fail_lines(err: str, config: dict[str, object]) -> list[str]:
    """librdkafka's raw ``|FAIL|`` lines on stderr about THIS client's brokers: a client
    another test of this worker process left behind (its cluster gone) may print its own
    connection failures to the same file descriptor while this test runs."""
    brokers = [b.split("://")[-1] for b in str(config["bootstrap.servers"]).split(",")]
    return [
        line for line in err.splitlines() if "|FAIL|" in line and any(b in line for b in brokers)
    ]
