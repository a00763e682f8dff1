"""Every client and command over SASL_SSL (SCRAM-SHA-512) with ACLs enforced (issue 19).

One secured 3-node cluster for the module. Each test creates its own user holding only the
ACLs its component needs (the list is docs/security.md); each ACL test has a negative
control (the same step without the ACL fails as AUTH), so the cluster really enforces them.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from kresilient.cli import main as cli
from kresilient.config import credentials_from_env
from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import DeadLetterRecord, DeadLetterWriter
from kresilient.errors import (
    ConsumeError,
    DeadLetterError,
    DeliveryError,
    ErrorCategory,
    ProduceError,
)
from kresilient.producer import ResilientProducer
from kresilient.testing import CertificateAuthority, KafkaCluster

pytestmark = pytest.mark.integration

_DEBUG = "security,broker,protocol"


@pytest.fixture(scope="module")
def cluster(sasl_ssl_cluster: KafkaCluster) -> KafkaCluster:
    """The SASL_SSL cluster this file shares with the rest of the "security" group
    (tests/conftest.py): every test makes its own users, topics, groups and ACLs under unique
    names and asserts about those only."""
    return sasl_ssl_cluster


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _user(cluster: KafkaCluster) -> str:
    name = _name("u")
    cluster.create_user(name)
    return name


def _topic(cluster: KafkaCluster, name: str | None = None) -> str:
    return cluster.create_topic(name or _name("t"), 1, 3, {"min.insync.replicas": 2})


def _read_all(
    cluster: KafkaCluster, topic: str, expected: int, timeout: float = 30.0
) -> list[bytes]:
    """Every value of ``topic`` read as the super user (until ``expected`` or the deadline)."""
    consumer = Consumer(
        {**cluster.client_config(), "group.id": _name("reader"), "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
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


def _committed(cluster: KafkaCluster, group: str, topic: str) -> int:
    consumer = Consumer({**cluster.client_config(), "group.id": group})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=15)
    finally:
        consumer.close()
    return int(tp.offset)


def _end_offset(cluster: KafkaCluster, topic: str) -> int:
    """The high watermark of partition 0: every record ever written to it, read or not."""
    consumer = Consumer({**cluster.client_config(), "group.id": _name("hwm")})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)[1])
    finally:
        consumer.close()


def _produce_super(cluster: KafkaCluster, topic: str, values: list[bytes]) -> None:
    with ResilientProducer(cluster.client_config()) as producer:
        for v in values:
            producer.produce(topic, v)
        producer.flush(30)


def _wait(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _properties(path: Path, config: dict[str, str]) -> Path:
    """A ``--command-config`` file like the Kafka tools take (everything but the brokers)."""
    lines = [f"{k}={v}\n" for k, v in config.items() if k != "bootstrap.servers"]
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------- harness


def test_secured_listener_refuses_plaintext_and_unknown_users(cluster: KafkaCluster) -> None:
    plain = {"bootstrap.servers": cluster.bootstrap_servers, "socket.timeout.ms": 3000}
    wrong = {**cluster.client_config(), "sasl.username": "nobody", "socket.timeout.ms": 3000}
    # Both refusals at once: each waits out its own 3 s (a list_topics that is never answered).
    with ThreadPoolExecutor(2) as pool:
        attempts = [pool.submit(AdminClient(c).list_topics, timeout=3) for c in (plain, wrong)]
    for attempt in attempts:  # any failure: the listener is TLS, the user unknown
        assert attempt.exception() is not None, attempt.result()
    assert cluster.client_config()["security.protocol"] == "SASL_SSL"
    assert AdminClient(cluster.client_config()).list_topics(timeout=15).brokers


def test_security_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="security must be"):
        KafkaCluster(security="tls")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="users need"):
        KafkaCluster(users={"a": "b"})
    with pytest.raises(ValueError, match="not an external one"):
        KafkaCluster(security="ssl", bootstrap_servers="127.0.0.1:1")
    with pytest.raises(ValueError, match="plain words"):
        KafkaCluster(security="sasl_ssl", users={"a,b": "x"})
    assert "admin" in KafkaCluster(security="sasl_ssl").users


# --------------------------------------------------------------------------- producer


def test_producer_round_trip_with_write_acl_only(cluster: KafkaCluster, tmp_path: Path) -> None:
    user, topic = _user(cluster), _topic(cluster)
    # credentials the way a deployment hands them over: a password file named by a variable
    secret = tmp_path / "password"
    secret.write_text(cluster.password(user) + "\n")
    config = {k: v for k, v in cluster.client_config(user).items() if k != "sasl.password"}
    config.update(credentials_from_env({"KAFKA_SASL_PASSWORD_FILE": str(secret)}))
    config["message.timeout.ms"] = "20000"
    # negative control: no ACL yet -> the broker refuses, classified AUTH, not retried
    with ResilientProducer(config) as producer:
        producer.produce(topic, b"denied")
        with pytest.raises(DeliveryError) as denied:
            producer.flush(30)
    assert [f.classification.name for f in denied.value.failures] == ["TOPIC_AUTHORIZATION_FAILED"]
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    with ResilientProducer(config) as producer:
        for i in range(50):
            producer.produce(topic, b"m%02d" % i)
        producer.flush(30)
    assert _read_all(cluster, topic, 50) == [b"m%02d" % i for i in range(50)]


def test_producer_write_revoked_mid_stream_fails_fast_as_auth_and_regrant_recovers(
    cluster: KafkaCluster,
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    # the default 120 s delivery timeout: a retried AUTH error would still be pending when
    # flush(60) returns, and would end as _MSG_TIMED_OUT, not TOPIC_AUTHORIZATION_FAILED
    with ResilientProducer(cluster.client_config(user)) as producer:
        for i in range(5):
            producer.produce(topic, b"before-%d" % i)
        producer.flush(30)
        cluster.revoke(user, topic=topic, operations=("WRITE",))
        # Brokers apply ACL changes from the metadata log asynchronously: a write may still
        # pass for a moment. Produce one at a time until the first refusal (with a deadline).
        passed: list[bytes] = []
        deadline = time.monotonic() + 30
        while True:
            value = b"window-%d" % len(passed)
            producer.produce(topic, value)
            try:
                producer.flush(30)
            except DeliveryError as first:
                assert [f.classification.name for f in first.failures] == [
                    "TOPIC_AUTHORIZATION_FAILED"
                ]
                break
            passed.append(value)
            assert time.monotonic() < deadline, "Write ACL revoked but writes still pass"
        # the next messages: refused at once by produce() (librdkafka now knows the topic is
        # not authorized) or failed delivery, each AUTH, none retried until the timeout
        refused: list[ProduceError] = []
        for i in range(5):
            try:
                producer.produce(topic, b"denied-%d" % i)
            except ProduceError as exc:
                refused.append(exc)
        failures = []
        if len(refused) < 5:
            with pytest.raises(DeliveryError) as raised:
                producer.flush(60)
            failures = raised.value.failures
            assert "still unacknowledged" not in str(raised.value)
            assert "TOPIC_AUTHORIZATION_FAILED" in str(raised.value)
            assert "ACL" in str(raised.value)
        classes = [e.classification for e in refused] + [f.classification for f in failures]
        assert len(classes) == 5
        assert {c.name for c in classes} == {"TOPIC_AUTHORIZATION_FAILED"}
        assert all(c.category is ErrorCategory.AUTH and not c.retriable for c in classes)
        # re-granted: the same producer (no restart) delivers again once it has learnt it
        cluster.grant(user, topic=topic, operations=("WRITE",))
        after = 0
        deadline = time.monotonic() + 90
        granted_at = time.monotonic()
        while after < 5:
            assert time.monotonic() < deadline, "Write ACL re-granted but writes still fail"
            try:
                producer.produce(topic, b"after-%d" % after)
                producer.flush(30)
            except (ProduceError, DeliveryError):
                time.sleep(0.5)  # librdkafka refreshes the topic's metadata meanwhile
                continue
            after += 1
        assert producer.health().failed_since_flush == 0
        print(f"re-grant: writes pass again after {time.monotonic() - granted_at:.1f} s")
    values = _read_all(cluster, topic, 10 + len(passed))
    before = [b"before-%d" % i for i in range(5)]
    assert values == before + passed + [b"after-%d" % i for i in range(5)]


# --------------------------------------------------------------------------- consumer


class _Run:
    """A ResilientConsumer running in a thread, its handled offsets and its outcome."""

    def __init__(self, config: dict[str, Any], topic: str, poison: bytes = b"poison") -> None:
        self.seen: list[int] = []
        self.error: BaseException | None = None

        def handle(msg: Message) -> None:
            self.seen.append(msg.offset())
            if msg.value() == poison:
                raise ValueError("not an order")

        # Auto-commits every second instead of every 5 s: the tests wait for commits (and
        # for a refused one), and the interval only sets how soon the next one comes.
        config = {"auto.commit.interval.ms": 1000, **config}
        self.consumer = ResilientConsumer(config, [topic], handle, install_signal_handlers=False)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:  # handed to the test
            self.error = exc

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(60)
        assert not self.thread.is_alive()


def _consumer_acls(cluster: KafkaCluster, user: str, topic: str, group: str) -> None:
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    cluster.grant(user, topic=topic + ".dlq", operations=("WRITE", "DESCRIBE"))


def test_consumer_dead_letters_then_replay_cli_brings_it_back(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    user, topic, group = _user(cluster), _topic(cluster), _name("g")
    dlq = _topic(cluster, topic + ".dlq")
    values = [b"ok-%d" % i if i != 4 else b"poison" for i in range(10)]
    _produce_super(cluster, topic, values)
    _consumer_acls(cluster, user, topic, group)
    run = _Run({**cluster.client_config(user), "group.id": group}, topic)
    _wait("10 records handled", lambda: len(run.seen) >= 10 or run.error is not None)
    _wait("the commit of offset 10", lambda: _committed(cluster, group, topic) == 10)
    run.stop()
    assert run.error is None and run.consumer.health().dead_lettered == 1
    assert _read_all(cluster, dlq, 1) == [b"poison"]

    # replay as another user: Read on the DLQ, Write on the source topic, nothing else
    replayer = _user(cluster)
    conf = _properties(tmp_path / "replay.properties", cluster.client_config(replayer))
    argv = ["dlq", "replay", "--from", dlq, "--to", topic, "-b", cluster.bootstrap_servers]
    argv += ["--command-config", str(conf), "--timeout", "20"]
    assert cli(argv) != 0  # negative control: no ACL yet
    denied = capfd.readouterr()
    assert "authorization failed" in (denied.out + denied.err).lower()
    cluster.grant(replayer, topic=dlq, operations=("READ", "DESCRIBE"))
    cluster.grant(replayer, topic=topic, operations=("WRITE", "DESCRIBE"))
    assert cli(argv) == 0, capfd.readouterr()
    assert _read_all(cluster, topic, 11)[10] == b"poison"


def test_consumer_group_read_revoked_is_surfaced_and_regrant_resumes_commits(
    cluster: KafkaCluster,
) -> None:
    user, topic, group = _user(cluster), _topic(cluster), _name("g")
    _topic(cluster, topic + ".dlq")
    _produce_super(cluster, topic, [b"a-%d" % i for i in range(5)])
    _consumer_acls(cluster, user, topic, group)
    run = _Run({**cluster.client_config(user), "group.id": group}, topic)
    try:
        _wait("the commit of offset 5", lambda: _committed(cluster, group, topic) == 5)
        cluster.revoke(user, group=group, operations=("READ",))
        _produce_super(cluster, topic, [b"b-%d" % i for i in range(5)])
        # surfaced, not a silent stall: commit failures counted with the broker's reason
        _wait(
            "a GROUP_AUTHORIZATION_FAILED commit failure in health()",
            lambda: (
                "GROUP_AUTHORIZATION_FAILED" in str(run.consumer.health().last_commit_error or "")
            ),
            timeout=60,
        )
        assert run.consumer.health().commit_failures > 0
        assert _committed(cluster, group, topic) == 5  # nothing committed without the ACL
        cluster.grant(user, group=group, operations=("READ",))
        _wait("commits to resume", lambda: _committed(cluster, group, topic) == 10, 60)
    finally:
        run.stop()
    assert run.error is None and sorted(set(run.seen)) == list(range(10))


def test_consumer_dead_letter_write_denied_leaves_the_record_uncommitted(
    cluster: KafkaCluster,
) -> None:
    user, topic, group = _user(cluster), _topic(cluster), _name("g")
    _topic(cluster, topic + ".dlq")
    _produce_super(cluster, topic, [b"ok-0", b"ok-1", b"poison", b"ok-3"])
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    cluster.grant(user, topic=topic + ".dlq", operations=("DESCRIBE",))  # no WRITE
    run = _Run({**cluster.client_config(user), "group.id": group}, topic)
    _wait("run() to end", lambda: not run.thread.is_alive(), 60)
    assert isinstance(run.error, DeadLetterError), run.error
    assert _committed(cluster, group, topic) == 2  # the poison record (offset 2) is not
    assert _end_offset(cluster, topic + ".dlq") == 0  # and nothing reached the dead letters


def test_consumer_dead_letter_write_denied_names_the_acl(cluster: KafkaCluster) -> None:
    user, topic, group = _user(cluster), _topic(cluster), _name("g")
    _topic(cluster, topic + ".dlq")
    _produce_super(cluster, topic, [b"poison"])
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    cluster.grant(user, group=group, operations=("READ",))
    cluster.grant(user, topic=topic + ".dlq", operations=("DESCRIBE",))
    run = _Run({**cluster.client_config(user), "group.id": group}, topic)
    _wait("run() to end", lambda: not run.thread.is_alive(), 60)
    assert isinstance(run.error, DeadLetterError), run.error
    assert run.error.classification.category is ErrorCategory.AUTH
    assert "AUTHORIZATION_FAILED" in str(run.error)


def test_dead_letter_writer_fatal_init_refusal_names_the_acl_both_ways(
    cluster: KafkaCluster,
) -> None:
    """InitProducerId refused (the principal may write no topic): confluent-kafka raises the
    fatal error once from poll(). A write queued before it and a write attempted after it both
    fail with a DeadLetterError naming CLUSTER_AUTHORIZATION_FAILED, category AUTH; poll()
    itself never raises it raw (CI run of 2026-11-26 08:49: the consumer's run() died with it).
    """
    user, topic = _user(cluster), _topic(cluster)
    dlq = _topic(cluster, topic + ".dlq")
    cluster.grant(user, topic=dlq, operations=("DESCRIBE",))
    writer = DeadLetterWriter(cluster.client_config(user))
    try:
        before = writer.write(DeadLetterRecord(topic=dlq, key=None, value=b"a", headers=[]))
        _wait("the queued write to fail", lambda: (writer.poll(0.1) >= 0) and before.done())
        error = before.exception(0)
        assert isinstance(error, DeadLetterError), error
        assert "CLUSTER_AUTHORIZATION_FAILED" in str(error)
        assert error.classification.category is ErrorCategory.AUTH
        with pytest.raises(DeadLetterError, match="CLUSTER_AUTHORIZATION_FAILED") as after:
            writer.write(DeadLetterRecord(topic=dlq, key=None, value=b"b", headers=[]))
        assert after.value.classification.category is ErrorCategory.AUTH
    finally:
        with contextlib.suppress(DeliveryError):
            writer.close(5)
    # produce() after the fatal error but before anything served it (no poll in between)
    # says only _FATAL: the writer asks librdkafka for the cause (CI, 2026-11-26 10:13: this
    # order gave FATAL_PRODUCER instead of AUTH)
    writer = DeadLetterWriter(cluster.client_config(user))
    refused: list[DeadLetterError] = []

    def write_until_refused() -> bool:
        try:
            writer.write(DeadLetterRecord(topic=dlq, key=None, value=b"x", headers=[]))
        except DeadLetterError as exc:
            refused.append(exc)
        return bool(refused)

    try:
        _wait("a write refused after the fatal error", write_until_refused)
        assert "CLUSTER_AUTHORIZATION_FAILED" in str(refused[0]), refused[0]
        assert refused[0].classification.category is ErrorCategory.AUTH
    finally:
        with contextlib.suppress(DeliveryError):
            writer.close(5)
    # negative control: with WRITE granted, the same principal's writer writes
    cluster.grant(user, topic=dlq, operations=("WRITE",))
    writer = DeadLetterWriter(cluster.client_config(user))
    try:
        ok = writer.write(DeadLetterRecord(topic=dlq, key=None, value=b"c", headers=[]))
        _wait("the granted write", lambda: (writer.poll(0.1) >= 0) and ok.done())
        assert ok.exception(0) is None
    finally:
        writer.close(5)
    assert _read_all(cluster, dlq, 1) == [b"c"]


# --------------------------------------------------------------------------- CLI


def test_audit_cli_over_sasl_ssl_with_describe_acls(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    conf = _properties(tmp_path / "audit.properties", cluster.client_config(user))
    argv = ["audit", "-b", cluster.bootstrap_servers, "--command-config", str(conf)]
    argv += ["--topic", topic, "--timeout", "20"]
    cluster.grant(user, topic=topic, operations=("DESCRIBE", "DESCRIBE_CONFIGS"))
    assert cli(argv) == 1  # negative control: broker configs need a cluster ACL
    assert "CLUSTER_AUTHORIZATION_FAILED" in capfd.readouterr().out
    cluster.grant(user, cluster=True, operations=("DESCRIBE_CONFIGS",))
    cli(argv)  # exit 1 on warnings: the test cluster itself draws some (KR046)
    out = capfd.readouterr()
    assert "(0 error," in out.out, out
    assert "AUTHORIZATION" not in out.out + out.err


def test_doctor_cli_over_sasl_ssl(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    probe = _topic(cluster)
    cluster.grant(user, topic=topic, operations=("DESCRIBE", "DESCRIBE_CONFIGS"))
    cluster.grant(user, topic=probe, operations=("READ", "WRITE", "DESCRIBE"))
    cluster.grant(user, cluster=True, operations=("DESCRIBE_CONFIGS",))
    conf = _properties(tmp_path / "doctor.properties", cluster.client_config(user))
    argv = ["doctor", "-b", cluster.bootstrap_servers, "--command-config", str(conf)]
    argv += ["--topic", topic, "--probe-topic", probe]
    cli(argv)
    out = capfd.readouterr().out
    assert "[probe]" in out and "AUTHORIZATION" not in out, out
    # the only failure is the literal password in the file (KR041), which is right
    fails = [line for line in out.splitlines() if line.strip().startswith("FAIL")]
    assert all("KR041" in line for line in fails), out


@pytest.mark.parametrize("command", ["audit", "dlq", "dlq replay", "topic create", "doctor"])
def test_cli_wrong_password_names_authentication(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], command: str
) -> None:
    """Every command: a refused login exits 2 (as an unreachable cluster), naming the
    refusal ([_AUTHENTICATION]) and sasl.password, never the password."""
    bad = {**cluster.client_config(_user(cluster)), "sasl.password": "Wr0ng-" + "x" * 12}
    conf = _properties(tmp_path / "bad.properties", bad)
    argv = {
        "audit": ["audit", "--timeout", "15"],
        "dlq": ["dlq", "inspect", _topic(cluster), "--timeout", "15"],
        "dlq replay": ["dlq", "replay", "--from", _topic(cluster), "--dry-run", "--timeout", "15"],
        "topic create": ["topic", "create", _name("t"), "--timeout", "15"],
        "doctor": ["doctor", "--timeout", "15", "--no-probe"],
    }[command]
    argv += ["-b", cluster.bootstrap_servers, "--command-config", str(conf)]
    assert cli(argv) == 2
    out = capfd.readouterr()
    text = out.out + out.err
    assert "authentication" in text.lower()
    assert "[_AUTHENTICATION]" in text and "sasl.password" in text, text
    assert "Wr0ng-" not in text


# --------------------------------------------------------------------------- wrong credentials


def _bad_config(
    cluster: KafkaCluster, fault: str, tmp_path: Path, user: str | None = None
) -> dict[str, str]:
    config = {**cluster.client_config(user or _user(cluster)), "debug": _DEBUG}
    if fault == "wrong_password":
        config["sasl.password"] = "Wr0ng-pass-" + uuid.uuid4().hex
    else:
        config["ssl.ca.location"] = str(CertificateAuthority(tmp_path / "other").ca_path)
    return config


_CAUSE = {"wrong_password": "SASL authentication error", "wrong_ca": "certificate verify failed"}


@pytest.mark.parametrize("fault", ["wrong_password", "wrong_ca"])
def test_producer_bad_credentials_are_seen_as_auth(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    config = {**_bad_config(cluster, fault, tmp_path), "message.timeout.ms": "8000"}
    with ResilientProducer(config) as producer:
        producer.produce("any-topic", b"x")
        with pytest.raises(DeliveryError):
            producer.flush(30)
        last = producer.health().last_error
    assert last in ("_AUTHENTICATION", "_SSL"), last
    assert _CAUSE[fault] in capfd.readouterr().out  # logged at error level, naming the cause


@pytest.mark.parametrize("fault", ["wrong_password", "wrong_ca"])
def test_producer_bad_credentials_error_names_the_cause(
    cluster: KafkaCluster, tmp_path: Path, fault: str
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    good = {**cluster.client_config(user), "message.timeout.ms": "8000"}
    with ResilientProducer(good) as producer:  # negative control: the right settings deliver
        producer.produce(topic, b"ok")
        producer.flush(30)
    config = {**_bad_config(cluster, fault, tmp_path, user), "message.timeout.ms": "8000"}
    del config["debug"]
    with ResilientProducer(config) as producer:
        handle = producer.produce(topic, b"x")
        with pytest.raises(DeliveryError) as exc:
            producer.flush(30)
    (failure,) = exc.value.failures
    assert failure.classification.category is ErrorCategory.AUTH
    assert failure.classification.name == {"wrong_password": "_AUTHENTICATION"}.get(fault, "_SSL")
    assert not failure.classification.possibly_persisted  # never sent: no broker accepted it
    assert _CAUSE[fault] in str(exc.value)
    remedy = {"wrong_password": "sasl.password", "wrong_ca": "ssl.ca.location"}[fault]
    assert remedy in str(exc.value)
    with pytest.raises(ProduceError) as one:  # the message's own error says the same
        handle.result()
    assert one.value.classification.category is ErrorCategory.AUTH
    assert _CAUSE[fault] in str(one.value)


@pytest.mark.parametrize("fault", ["wrong_password", "wrong_ca"])
def test_consumer_bad_credentials_fail_run_within_the_connection_timeout(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str], fault: str
) -> None:
    config = {**_bad_config(cluster, fault, tmp_path), "group.id": _name("g")}
    consumer = ResilientConsumer(
        config, ["any-topic"], lambda m: None, install_signal_handlers=False
    )
    with pytest.raises(ConsumeError):
        consumer.run()
    assert _CAUSE[fault] in capfd.readouterr().out


@pytest.mark.parametrize("fault", ["wrong_password", "wrong_ca"])
def test_consumer_bad_credentials_error_names_the_cause(
    cluster: KafkaCluster, tmp_path: Path, fault: str
) -> None:
    user, topic, group = _user(cluster), _topic(cluster), _name("g")
    _topic(cluster, topic + ".dlq")
    _produce_super(cluster, topic, [b"one"])
    _consumer_acls(cluster, user, topic, group)
    # negative control: the same user, group and topic with the right settings consume
    run = _Run({**cluster.client_config(user), "group.id": group}, topic)
    _wait("the record handled", lambda: bool(run.seen) or run.error is not None)
    run.stop()
    assert run.error is None and run.seen == [0]
    config = {**_bad_config(cluster, fault, tmp_path, user), "group.id": group}
    del config["debug"]
    consumer = ResilientConsumer(config, [topic], lambda m: None, install_signal_handlers=False)
    with pytest.raises(ConsumeError) as exc:
        consumer.run()
    assert exc.value.classification.category is ErrorCategory.AUTH
    assert not exc.value.classification.retriable
    assert _CAUSE[fault] in str(exc.value)
    remedy = {"wrong_password": "sasl.password", "wrong_ca": "ssl.ca.location"}[fault]
    assert remedy in str(exc.value)


# --------------------------------------------------------------------------- secrets


def test_secrets_never_appear_in_logs_exceptions_repr_or_lint(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    password = cluster.password(user)
    wrong = "Wr0ng-pass-" + uuid.uuid4().hex
    secrets = [password, wrong]
    captured: list[str] = []
    config = {**cluster.client_config(user), "debug": _DEBUG, "message.timeout.ms": "8000"}
    # 1. a working connection with debug logging, denied by ACL (error path), then allowed.
    # The user may write one topic from the start: an idempotent producer whose user may write
    # no topic at all is refused at InitProducerId, a fatal error (docs/security.md).
    allowed = _topic(cluster)
    cluster.grant(user, topic=allowed, operations=("WRITE", "DESCRIBE"))
    with ResilientProducer(config) as producer:
        captured.append(repr(producer))
        producer.produce(topic, b"x")
        with pytest.raises(DeliveryError) as denied:
            producer.flush(30)
        captured += [str(denied.value), repr(denied.value), repr(denied.value.failures)]
        producer.produce(allowed, b"y")
        producer.flush(30)
        captured.append(repr(producer.health()))
    # 2. wrong password: producer, consumer
    bad = {**config, "sasl.password": wrong}
    with ResilientProducer(bad) as producer:
        producer.produce(topic, b"z")
        with pytest.raises(DeliveryError) as exc:
            producer.flush(30)
        captured += [str(exc.value), repr(exc.value), repr(producer)]
    bad_consumer = {k: v for k, v in bad.items() if k != "message.timeout.ms"}
    consumer = ResilientConsumer(
        {**bad_consumer, "group.id": _name("g")},
        [topic],
        lambda m: None,
        install_signal_handlers=False,
    )
    captured.append(repr(consumer))
    with pytest.raises(ConsumeError) as cexc:
        consumer.run()
    captured += [str(cexc.value), repr(cexc.value)]
    # 3. the CLI and the linter on a properties file holding the password
    conf = _properties(tmp_path / "client.properties", bad)
    cli(["audit", "-b", cluster.bootstrap_servers, "--command-config", str(conf)])
    cli(["lint", str(conf)])
    out = capfd.readouterr()
    captured += [out.out, out.err]
    assert "SASL authentication error" in out.out  # the error paths really ran
    assert "SASL" in out.out and "SEND" in out.out  # debug=security,broker,protocol was on
    blob = "\n".join(captured)
    for secret in secrets:
        assert secret not in blob
        assert secret[len(secret) // 2 - 5 : len(secret) // 2 + 5] not in blob


# --------------------------------------------------------------------------- lint


def test_lint_accepts_the_real_client_config_and_flags_verification_off(
    cluster: KafkaCluster,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user, topic = _user(cluster), _topic(cluster)
    cluster.grant(user, topic=topic, operations=("WRITE", "DESCRIBE"))
    settings = {k: v for k, v in cluster.client_config(user).items() if k != "sasl.password"}
    body = "".join(f"    {k!r}: {v!r},\n" for k, v in settings.items())
    source = (
        "import os\n\nfrom kresilient import ResilientProducer\n\nCONFIG = {\n"
        + body
        + "    'sasl.password': os.environ['KAFKA_SASL_PASSWORD'],\n}\n\n\n"
        "def make_producer() -> ResilientProducer:\n    return ResilientProducer(CONFIG)\n"
    )
    app = tmp_path / "app_config.py"
    app.write_text(source)
    assert cli(["lint", str(app)]) == 0, capfd.readouterr()
    # the very file that was linted connects and writes
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", cluster.password(user))
    namespace: dict[str, Any] = {}
    exec(compile(source, str(app), "exec"), namespace)
    with namespace["make_producer"]() as producer:
        producer.produce(topic, b"linted")
        producer.flush(30)
    assert _read_all(cluster, topic, 1) == [b"linted"]
    capfd.readouterr()
    for key, value in (
        ("enable.ssl.certificate.verification", "false"),
        ("ssl.endpoint.identification.algorithm", "none"),
    ):
        unsafe = tmp_path / f"unsafe_{key.replace('.', '_')}.py"
        unsafe.write_text(source.replace("CONFIG = {\n", f"CONFIG = {{\n    {key!r}: {value!r},\n"))
        assert cli(["lint", str(unsafe)]) == 1
        out = capfd.readouterr().out
        assert key in out and "[error]" in out, out


def test_credentials_from_env_reads_variables_and_files(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-from-file\n")
    env = {
        "KAFKA_SASL_USERNAME": "alice",
        "KAFKA_SASL_PASSWORD_FILE": str(secret),
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "UNRELATED": "x",
    }
    assert credentials_from_env(env) == {
        "sasl.username": "alice",
        "sasl.password": "s3cret-from-file",
        "security.protocol": "SASL_SSL",
    }
    assert credentials_from_env({}) == {}
    from kresilient.errors import ConfigError

    with pytest.raises(ConfigError, match="both KAFKA_SASL_PASSWORD and") as both:
        credentials_from_env({"KAFKA_SASL_PASSWORD": "p1-visible", "KAFKA_SASL_PASSWORD_FILE": "f"})
    assert "p1-visible" not in str(both.value)
    with pytest.raises(ConfigError, match="cannot read") as missing:
        credentials_from_env({"KAFKA_SSL_KEY_PASSWORD_FILE": str(tmp_path / "nope")})
    assert missing.value.key == "ssl.key.password"
    with pytest.raises(ConfigError, match="is empty"):
        credentials_from_env({"KAFKA_SASL_PASSWORD": ""})


def test_certificate_authority_issues_valid_and_expired_client_certificates(
    tmp_path: Path,
) -> None:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    ca = CertificateAuthority(tmp_path)
    good = ca.client_certificate("alice", "key-pass-123456")
    old = ca.client_certificate("alice", "key-pass-123456", expired=True)
    now = dt.datetime.now(dt.UTC)
    cert = x509.load_pem_x509_certificate(good.certificate.read_bytes())
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc
    assert cert.subject.rfc4514_string() == "CN=alice"
    assert x509.load_pem_x509_certificate(old.certificate.read_bytes()).not_valid_after_utc < now
    key = good.key.read_bytes()
    assert b"ENCRYPTED PRIVATE KEY" in key  # the key password really protects it
    with pytest.raises((TypeError, ValueError)):
        load_pem_private_key(key, password=None)
    load_pem_private_key(key, password=b"key-pass-123456")
    assert "key-pass" not in repr(good) and "key-pass" not in repr(ca)
    assert good.key.stat().st_mode & 0o077 == 0


def test_share_dead_letter_index_reports_an_unreadable_topic_and_still_answers_for_the_other(
    cluster: KafkaCluster,
) -> None:
    """The share consumer's dead-letter reader (a plain consumer: any broker version) run as a
    principal that may WRITE one dead-letter topic but not READ it, and READ another. The real
    refusal (the fetch's per-partition error, not a client error) refuses that topic only: one
    WARNING naming it and the missing READ, its questions answered unknown at once, while the
    readable topic is read and answered (review14 F6: no test drove this path, and a refusal
    through the client error callback refused every topic). The password is in no event."""
    from kresilient.redaction import Redactor
    from kresilient.share._deadletters import DeadLetterIndex

    user = _user(cluster)
    unreadable, readable = _topic(cluster), _topic(cluster)
    cluster.grant(user, topic=unreadable, operations=("WRITE", "DESCRIBE"))
    cluster.grant(user, topic=readable, operations=("READ", "DESCRIBE"))
    config = cluster.client_config(user)
    events: list[tuple[str, str, dict[str, Any]]] = []

    class _Log:
        def __getattr__(self, level: str) -> Any:
            return lambda event, **fields: events.append((level, event, fields))

    index = DeadLetterIndex(
        config,
        [unreadable, readable],
        "share-g",
        client_id=_name("dlq-index"),
        log=_Log(),
        redact=Redactor.for_config(config),
    )
    index.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            topics = index.state()["topics"]
            if topics[unreadable].startswith("refused") and topics[readable] == "reading":
                break
            assert time.monotonic() < deadline, index.state()
            time.sleep(0.1)  # polling the reader's state, with a deadline
        key = ("jobs", 0, 7, 1700000000000, hash(b"v"))
        started = time.monotonic()
        assert index.contains(key, 30.0, since=started, topic=unreadable) is None
        assert index.contains(key, 30.0, since=time.monotonic(), topic=readable) is False
        state = index.state()
    finally:
        index.close()
    assert state["state"] == "refused", state
    assert "TOPIC_AUTHORIZATION_FAILED" in state["topics"][unreadable], state
    refused = [e for e in events if e[1] == "share_dead_letter_index_refused"]
    assert [e[2]["topic"] for e in refused] == [unreadable], events
    assert "READ" in str(refused[0][2]["remedy"])
    assert config["sasl.password"] not in repr(events) + repr(state)
