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
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from kresilient.admin import create_topic
from kresilient.aio import AsyncResilientConsumer
from kresilient.cli import main as cli
from kresilient.deadletter import DeadLetterRecord, DeadLetterWriter
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
def cluster(sasl_ssl_cluster: KafkaCluster) -> KafkaCluster:
    """The SASL_SSL cluster this file shares with the rest of the "security" group
    (tests/conftest.py): every test makes its own users, topics, groups and ACLs under unique
    names and asserts about those only."""
    return sasl_ssl_cluster


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
    assert not _raw_fail_lines(out.err, bad), out.err[-2000:]
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
    # a refused login is an input error, exit 2 like dlq, audit and doctor (an ACL denial: 1)
    assert cli([*argv, str(bad), "--if-not-exists"]) == 2
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
        # Nothing left in librdkafka. len() is its queue length, which also counts client
        # events not served yet: the refusal's error and log lines of each reconnect attempt
        # (one landed between flush() and len() under load in CI: "2 == 0"). poll() serves
        # those; a message would stay.
        deadline = time.monotonic() + 30
        while len(producer) and time.monotonic() < deadline:
            producer.poll(0.1)
        assert len(producer) == 0
    finally:
        with contextlib.suppress(DeliveryError):  # the messages above, reported already
            producer.close(5)


# --------------------------------------------------------------------------- dead-letter writer


def _end_offset(cluster: KafkaCluster, topic: str) -> int:
    consumer = Consumer({**cluster.client_config(), "group.id": _name("w")})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


@pytest.mark.parametrize("fault", _FAULTS)
def test_dead_letter_writer_refused_login_fails_fast_as_auth(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    """The writer behind every dead letter (consumer, producer, replay, Spark) fails a dead
    letter as AUTH once no broker ever accepted it and every broker is down, as the producer
    does: flush(30) raises listing it (message.timeout.ms 120 s), never sent."""
    user, topic = _name("u"), _topic(cluster, _name("t") + ".dlq")
    cluster.create_user(user)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    record = DeadLetterRecord(topic=topic, key=b"k", value=b"poison", headers=[])
    good = {**cluster.client_config(user), "message.timeout.ms": "120000"}
    with DeadLetterWriter(good) as writer:  # control: the right settings write it
        handle = writer.write(record)
        writer.flush(30)
        assert handle.result(0).offset == 0
    bad = {**_bad(cluster, user, fault, tmp_path), "message.timeout.ms": "120000"}
    writer = DeadLetterWriter(bad)
    try:
        handles = [writer.write(record) for _ in range(3)]
        began = time.monotonic()
        with pytest.raises(DeliveryError) as exc:
            writer.flush(30)
        print(f"dead-letter writer {fault}: AUTH after {time.monotonic() - began:.1f} s")
        assert "still unacknowledged" not in str(exc.value), exc.value
        assert len(exc.value.failures) == 3
        for failure in exc.value.failures:
            c = failure.classification
            assert c.category is ErrorCategory.AUTH and not c.retriable, c
            assert c.name == _CODE[fault] and not c.possibly_persisted
            assert _SETTING[fault] in c.remedy
        for handle in handles:
            error = handle.exception(0)
            assert error is not None and error.classification.category is ErrorCategory.AUTH
            assert _CAUSE[fault] in str(error)
        # written after the refusal is known: failed by the next flush, as promptly
        later = writer.write(record)
        with pytest.raises(DeliveryError) as again:
            writer.flush(30)
        assert [f.classification.category for f in again.value.failures] == [ErrorCategory.AUTH]
        assert later.done() and writer.pending == 0
    finally:
        with contextlib.suppress(DeliveryError):
            writer.close(5)
    out = capfd.readouterr()
    assert "kafka_authentication_failed" in out.out
    text = out.out + out.err + str(exc.value) + repr(exc.value)
    if fault == "wrong_password":
        assert bad["sasl.password"] not in text
    assert _end_offset(cluster, topic) == 1  # only the control's dead letter


# --------------------------------------------------------------------------- aio error_cb


def test_aio_consumer_error_callback_lines_are_rate_limited() -> None:
    """librdkafka reports every failed reconnect (several a second): AsyncResilientConsumer
    logs them as ResilientConsumer does, connection failures summarised (kafka_unreachable,
    once per minute), other codes once per code per interval with the count held back.
    Negative control: the application's error_cb got every one of them. No broker needed:
    nothing listens on the port."""
    import socket

    from structlog.testing import capture_logs

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    seen: list[str] = []
    consumer: AsyncResilientConsumer

    def error_cb(err: KafkaError) -> None:
        seen.append(err.name())
        if len(seen) >= 30:
            consumer.stop()

    async def handle(_msg: Message) -> None:
        return None

    consumer = AsyncResilientConsumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": _name("g"),
            "reconnect.backoff.ms": 10,
            "reconnect.backoff.max.ms": 50,
            "error_cb": error_cb,
        },
        [_name("t")],
        handle,
        dead_letter=None,
        handle_signals=False,
    )
    with capture_logs() as logs:
        asyncio.run(asyncio.wait_for(consumer.run(), 120))
    assert len(seen) >= 30 and "_TRANSPORT" in seen, seen  # the flood was real
    lines = [e for e in logs if e["event"] in ("kafka_client_error", "kafka_unreachable")]
    assert len(lines) <= 2, lines  # one kafka_unreachable (and at most one other line)
    assert any(e["event"] == "kafka_unreachable" for e in lines), lines
    # any other code: once per interval, the next line carrying how many were held back
    from kresilient._ratelimit import RateLimiter

    now = [0.0]
    consumer._limiter = RateLimiter(5.0, clock=lambda: now[0])
    with capture_logs() as logs:
        for _ in range(50):
            consumer._on_error(KafkaError(KafkaError._TIMED_OUT, "request timed out"))
        now[0] = 6.0
        consumer._on_error(KafkaError(KafkaError._TIMED_OUT, "request timed out"))
    errors = [e for e in logs if e["event"] == "kafka_client_error"]
    assert [e.get("suppressed") for e in errors] == [None, 49], errors


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


def _raw_fail_lines(err: str, config: dict[str, object]) -> list[str]:
    """librdkafka's raw ``|FAIL|`` lines on stderr about THIS client's brokers: a client
    another test of this worker process left behind (its cluster gone) may print its own
    connection failures to the same file descriptor while this test runs."""
    brokers = [b.split("://")[-1] for b in str(config["bootstrap.servers"]).split(",")]
    return [
        line for line in err.splitlines() if "|FAIL|" in line and any(b in line for b in brokers)
    ]
