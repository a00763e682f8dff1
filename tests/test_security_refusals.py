"""A refused login (wrong password, wrong CA) named as AUTH by every component (issue 19,
acceptance 3), and the producer failing fast on it (no wait for ``message.timeout.ms``).

One secured 3-node cluster (SASL_SSL, SCRAM-SHA-512, ACLs enforced) for the module. Each
fault test carries its control: the same user, topic and group with the right settings work,
so the refusal really comes from the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Message

from kresilient.admin import create_topic
from kresilient.aio import AsyncResilientConsumer
from kresilient.cli import main as cli
from kresilient.errors import (
    ConsumeError,
    DeliveryError,
    ErrorCategory,
    KafkaClientError,
    ProduceError,
)
from kresilient.producer import ResilientProducer
from kresilient.testing import CertificateAuthority, KafkaCluster

pytestmark = pytest.mark.integration

#: what librdkafka says for each fault (named in the error) and the setting the remedy names
_CAUSE = {"wrong_password": "SASL authentication error", "wrong_ca": "certificate verify failed"}
_SETTING = {"wrong_password": "sasl.password", "wrong_ca": "ssl.ca.location"}
_CODE = {"wrong_password": "_AUTHENTICATION", "wrong_ca": "_SSL"}
_FAULTS = ["wrong_password", "wrong_ca"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    c = KafkaCluster(security="sasl_ssl")
    try:
        c.start_cluster()
        yield c
    finally:
        c.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic(cluster: KafkaCluster, name: str | None = None) -> str:
    return cluster.create_topic(name or _name("t"), 1, 3, {"min.insync.replicas": 2})


def _bad(cluster: KafkaCluster, user: str, fault: str, tmp_path: Path) -> dict[str, str]:
    config = dict(cluster.client_config(user))
    if fault == "wrong_password":
        config["sasl.password"] = "Wr0ng-pass-" + uuid.uuid4().hex
    else:  # a CA that did not sign the brokers' certificates
        config["ssl.ca.location"] = str(CertificateAuthority(tmp_path / "other").ca_path)
    return config


def _properties(path: Path, config: dict[str, str]) -> Path:
    lines = [f"{k}={v}\n" for k, v in config.items() if k != "bootstrap.servers"]
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- asyncio consumer


async def _consume(config: dict[str, str], topic: str, deadline: float) -> list[int]:
    """Run an AsyncResilientConsumer until it handled one record (then stop) or raised."""
    seen: list[int] = []
    consumer: AsyncResilientConsumer

    async def handle(msg: Message) -> None:
        seen.append(msg.offset() or 0)
        consumer.stop()

    consumer = AsyncResilientConsumer(config, [topic], handle, handle_signals=False)
    await asyncio.wait_for(consumer.run(), deadline)
    return seen


@pytest.mark.parametrize("fault", _FAULTS)
def test_aio_consumer_refused_login_raises_auth_naming_the_setting(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    user, topic, group = _name("u"), _topic(cluster), _name("g")
    cluster.create_user(user)
    _topic(cluster, topic + ".dlq")
    with ResilientProducer(cluster.client_config()) as producer:
        producer.produce(topic, b"one")
        producer.flush(30)
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    cluster.grant(user, topic=topic + ".dlq", operations=("WRITE", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    # control: the same user, topic and group with the right settings consume the record
    good = {**cluster.client_config(user), "group.id": group}
    assert asyncio.run(_consume(good, topic, 60)) == [0]
    # the fault: run() ends with the refusal, well before the 30 s dead-letter topic check
    # would give up (a deadline, not a speed measurement: the old code never ended in time)
    bad = {**_bad(cluster, user, fault, tmp_path), "group.id": group}
    began = time.monotonic()
    with pytest.raises(ConsumeError) as exc:
        asyncio.run(_consume(bad, topic, 25))
    print(f"aio consumer {fault}: AUTH error after {time.monotonic() - began:.1f} s")
    assert exc.value.classification.category is ErrorCategory.AUTH, exc.value
    assert not exc.value.classification.retriable
    assert exc.value.name == _CODE[fault]
    assert _CAUSE[fault] in str(exc.value)
    assert _SETTING[fault] in exc.value.remedy
    if fault == "wrong_password":
        assert bad["sasl.password"] not in str(exc.value)
    # librdkafka's lines went through the consumer's (redacting) structlog logger, never raw
    # to stderr; the refusal is logged once as an error naming the cause
    out = capfd.readouterr()
    assert "|FAIL|" not in out.err, out.err[-2000:]
    assert "kafka_authentication_failed" in out.out and _CAUSE[fault] in out.out


# --------------------------------------------------------------------------- admin and CLI


@pytest.mark.parametrize("fault", _FAULTS)
def test_admin_create_topic_refused_login_raises_auth_naming_the_setting(
    cluster: KafkaCluster, tmp_path: Path, fault: str
) -> None:
    user = _name("u")
    cluster.create_user(user)
    name = _name("adm")
    cluster.grant(user, topic=name, operations=("CREATE", "DESCRIBE"), prefixed=True)
    # control: the right settings create the topic
    (made,) = create_topic(
        cluster.bootstrap_servers,
        name,
        replication_factor=3,
        timeout=30,
        client_config=cluster.client_config(user),
    )
    assert made.name == name and not made.existed
    bad = _bad(cluster, user, fault, tmp_path)
    began = time.monotonic()
    with pytest.raises(KafkaClientError) as exc:
        # a generous timeout: the refusal must end the call, not the timeout
        create_topic(
            cluster.bootstrap_servers,
            name + "-2",
            replication_factor=3,
            timeout=60,
            client_config=bad,
        )
    print(f"admin {fault}: AUTH error after {time.monotonic() - began:.1f} s (timeout 60 s)")
    assert exc.value.classification.category is ErrorCategory.AUTH, exc.value
    assert not exc.value.classification.retriable
    assert exc.value.name == _CODE[fault]
    assert _CAUSE[fault] in str(exc.value)
    assert _SETTING[fault] in exc.value.remedy
    if fault == "wrong_password":
        assert bad["sasl.password"] not in str(exc.value)


@pytest.mark.parametrize("fault", _FAULTS)
def test_topic_create_cli_refused_login_names_cause_and_setting(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    user = _name("u")
    cluster.create_user(user)
    name = _name("cli")
    cluster.grant(user, topic=name, operations=("CREATE", "DESCRIBE"), prefixed=True)
    argv = ["topic", "create", name, "--replication-factor", "3", "-b", cluster.bootstrap_servers]
    argv += ["--timeout", "60", "--command-config"]
    good = _properties(tmp_path / "good.properties", cluster.client_config(user))
    assert cli([*argv, str(good)]) == 0, capfd.readouterr()  # control
    capfd.readouterr()
    bad = _properties(tmp_path / "bad.properties", _bad(cluster, user, fault, tmp_path))
    assert cli([*argv, str(bad), "--if-not-exists"]) != 0
    out = capfd.readouterr()
    text = out.out + out.err
    assert f"[{_CODE[fault]}]" in text, text
    assert _CAUSE[fault] in text and _SETTING[fault] in text, text


# --------------------------------------------------------------------------- producer fails fast


@pytest.mark.parametrize("fault", _FAULTS)
def test_producer_refused_login_fails_queued_messages_as_auth_before_the_timeout(
    cluster: KafkaCluster, tmp_path: Path, fault: str
) -> None:
    """message.timeout.ms is 120 s; flush(30) must end with every message failed as AUTH
    (not "still queued"): the refusal of a producer that never connected fails them."""
    user, topic = _name("u"), _topic(cluster)
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    good = {**cluster.client_config(user), "message.timeout.ms": "120000"}
    with ResilientProducer(good) as producer:  # control: the right password delivers
        producer.produce(topic, b"ok")
        producer.flush(30)
    bad = {**_bad(cluster, user, fault, tmp_path), "message.timeout.ms": "120000"}
    producer = ResilientProducer(bad)
    try:
        handles = [producer.produce(topic, b"m%d" % i) for i in range(5)]
        began = time.monotonic()
        with pytest.raises(DeliveryError) as exc:
            producer.flush(30)
        print(
            f"producer {fault}: DeliveryError after {time.monotonic() - began:.1f} s "
            "(message.timeout.ms 120 s)"
        )
        assert "still queued" not in str(exc.value), exc.value
        assert len(exc.value.failures) == 5
        for failure in exc.value.failures:
            c = failure.classification
            assert c.category is ErrorCategory.AUTH and not c.retriable, c
            assert not c.possibly_persisted
            assert _SETTING[fault] in c.remedy
        assert _CAUSE[fault] in str(exc.value)
        for handle in handles:  # each message's own error says the same
            with pytest.raises(ProduceError) as one:
                handle.result(0)
            assert one.value.classification.category is ErrorCategory.AUTH
        # produced after the refusal is known: failed by the next flush, just as promptly
        producer.produce(topic, b"later")
        with pytest.raises(DeliveryError) as again:
            producer.flush(30)
        assert [f.classification.category for f in again.value.failures] == [ErrorCategory.AUTH]
        assert len(producer) == 0
    finally:
        with contextlib.suppress(DeliveryError):  # the messages above, reported already
            producer.close(5)


# --------------------------------------------------------------------------- the decision


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, event: str, **_kw: object) -> None:
        self.lines.append(event)


_REFUSED = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
)


def test_final_refusal_only_for_a_client_that_never_connected() -> None:
    """Pure logic of when a refusal ends an operation (the producer also needs every broker
    down): a client that was connected before (a rotated password) keeps retrying, and a
    refusal without a broker (an OAUTHBEARER token not acquired) is retried too."""
    from confluent_kafka import KafkaError

    from kresilient.producer import Reachability

    reach = Reachability(_Log())
    assert reach.final_refusal() is None
    reach.refusal(_REFUSED, KafkaError._AUTHENTICATION)
    found = reach.final_refusal()
    assert found is not None and found.cause == "password" and found.host == "127.0.0.1:9093"
    assert reach.final_refusal(all_down=True) is None  # one refusing broker is not all
    reach.all_down("3/3 brokers are down")
    assert reach.final_refusal(all_down=True) is found
    # connected before: the same refusals no longer end anything
    rotated = Reachability(_Log())
    rotated.up(3)
    rotated.refusal(_REFUSED, KafkaError._AUTHENTICATION)
    rotated.all_down("3/3 brokers are down")
    assert rotated.refused is not None
    assert rotated.final_refusal() is None and rotated.final_refusal(all_down=True) is None
    # a local failure, no broker's verdict: librdkafka retries it
    local = Reachability(_Log())
    local.refusal("Failed to acquire SASL OAUTHBEARER token: idp down", KafkaError._AUTHENTICATION)
    assert local.refused is not None and local.final_refusal() is None
    # a connection coming up clears both the refusal and the all-down state
    reach.connected()
    assert reach.refused is None and not reach.all_brokers_down
