"""Mutual TLS (``KafkaCluster(security="ssl")``): the certificate's CN is the user (issue 19).

One mTLS cluster for the module: a round trip with a certificate user holding only its ACLs,
no certificate / an expired certificate refused at the handshake, a wrong key password
refused at construction, and neither the key password nor the private key ever printed.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kresilient.consumer import ResilientConsumer
from kresilient.errors import (
    ConfigError,
    ConsumeError,
    DeliveryError,
    ErrorCategory,
    KResilientError,
)
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

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
    assert _read(cluster, topic, 1) == []  # nothing was written


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
