"""``kresilient topic create --command-config FILE`` over SASL_SSL with ACLs enforced (issue 19),
and the Java-properties reading of ``--command-config`` that every command now shares.

One secured 3-node cluster for the module (the harness starts it; never the shared plaintext
cluster). Each test creates its own user with only the ACLs it needs, and each ACL test has
a negative control: the same command without the ACL is refused.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kresilient.cli import main as cli
from kresilient.cli import read_command_config
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

_DEBUG = "security,broker,protocol"


@pytest.fixture(scope="module")
def cluster(sasl_ssl_cluster: KafkaCluster) -> KafkaCluster:
    """The SASL_SSL cluster this file shares with the rest of the "security" group
    (tests/conftest.py): every test makes its own users, topics, groups and ACLs under unique
    names and asserts about those only."""
    return sasl_ssl_cluster


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _java_properties(path: Path, config: dict[str, str]) -> Path:
    """A ``--command-config`` file written the way Java tools' users write them: comments,
    ``key: value`` and a value continued over two lines with a backslash."""
    lines = ["# client.properties for the ops user\n", "! written by hand\n"]
    for key, value in config.items():
        if key == "bootstrap.servers":
            continue
        if key == "ssl.ca.location":
            half = len(value) // 2
            lines.append(f"{key}={value[:half]}\\\n    {value[half:]}\n")
        elif key == "sasl.mechanism":
            lines.append(f"{key}: {value}\n")
        else:
            lines.append(f"{key}={value}\n")
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path


def _topics(cluster: KafkaCluster) -> set[str]:
    admin = AdminClient(cluster.client_config())
    return set(admin.list_topics(timeout=30).topics)


def _listed_soon(cluster: KafkaCluster, names: set[str], timeout: float = 60) -> bool:
    """Whether every one of ``names`` appears in the metadata within ``timeout``: a created
    topic reaches each broker's metadata when that broker applies the controller's record,
    so the broker answering may lag behind (seen in CI under load)."""
    deadline = time.monotonic() + timeout
    while not names <= _topics(cluster):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)  # polling the metadata for a condition with a deadline
    return True


# --------------------------------------------------------------------------- no cluster needed


def test_read_command_config_reads_java_properties(tmp_path: Path) -> None:
    path = _java_properties(
        tmp_path / "c.properties",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.password": "p=1;x",
            "ssl.ca.location": "/etc/kafka/secrets/ca.pem",
        },
    )
    assert read_command_config(str(path)) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "p=1;x",
        "ssl.ca.location": "/etc/kafka/secrets/ca.pem",
    }


def test_topic_create_command_config_errors_name_the_file_never_its_values(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.properties"
    argv = ["topic", "create", "t", "-b", "127.0.0.1:9", "--command-config", str(missing)]
    assert cli(argv) == 2
    err = capfd.readouterr().err
    assert f"cannot read {missing}" in err and "No such file" in err
    assert cli(["topic", "create", "--help"]) == 0
    assert "--command-config FILE" in capfd.readouterr().out
    # a directory is not a properties file: refused, never read as an empty config
    assert cli([*argv[:-1], str(tmp_path)]) == 2
    assert f"cannot read {tmp_path}" in capfd.readouterr().err


def test_a_malformed_command_config_line_is_named_without_its_value(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("security.protocol=SASL_SSL\nsasl.password=s3cret-\\uZZZZ-value\n")
    with pytest.raises(ConfigError) as info:
        read_command_config(str(path))
    assert info.value.message == f"{path}:2: malformed \\uxxxx escape"
    for argv in (["topic", "create", "t"], ["dlq", "inspect", "t.dlq"]):
        assert cli([*argv, "-b", "127.0.0.1:9", "--command-config", str(path)]) == 2
        err = capfd.readouterr().err
        assert f"{path}:2: malformed" in err and "s3cret" not in err


# --------------------------------------------------------------------------- SASL_SSL


@pytest.mark.integration
def test_topic_create_over_sasl_ssl_with_command_config_and_create_acl(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 19: ``topic create`` connects as a non-super user from a ``--command-config``
    file; CREATE and DESCRIBE on the topic (prefixed, so ``NAME.dlq`` too) are all it needs.
    Negative control: the same command before the grant is refused as an authorization
    failure and creates nothing."""
    user = _name("u")
    password = cluster.create_user(user)
    conf = _java_properties(tmp_path / "ops.properties", cluster.client_config(user))
    name = _name("orders")
    argv = ["topic", "create", name, "--dlq", "--partitions", "2", "--replication-factor", "3"]
    argv += ["-b", cluster.bootstrap_servers, "--command-config", str(conf), "--timeout", "20"]

    assert cli(argv) == 1
    denied = capfd.readouterr()
    assert f"creating topic '{name}' failed: Authorization failed. " in denied.err, denied
    assert "[TOPIC_AUTHORIZATION_FAILED]: the user needs CREATE and DESCRIBE on topic" in denied.err
    assert f"{name} and {name}.dlq" in denied.err
    assert name not in _topics(cluster)

    cluster.grant(user, topic=name, operations=("CREATE", "DESCRIBE"), prefixed=True)
    assert cli(argv) == 0, capfd.readouterr()
    out = capfd.readouterr()
    assert f"created {name}: 2 partition(s), replication factor 3" in out.out
    assert f"created {name}.dlq: 2 partition(s), replication factor 3" in out.out
    assert _listed_soon(cluster, {name, name + ".dlq"}), _topics(cluster)
    # -X wins over the file: the same command with --if-not-exists leaves both as they are
    assert cli([*argv, "--if-not-exists", "-X", f"debug={_DEBUG}"]) == 0
    again = capfd.readouterr()
    assert f"exists (unchanged) {name}:" in again.out
    for text in (denied.out, denied.err, out.out, out.err, again.out, again.err):
        assert password not in text and password[-8:] not in text


@pytest.mark.integration
def test_topic_create_wrong_password_names_authentication_not_the_password(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    user = _name("u")
    cluster.create_user(user)
    wrong = "Wr0ng-" + uuid.uuid4().hex
    bad = {**cluster.client_config(user), "sasl.password": wrong}
    conf = _java_properties(tmp_path / "bad.properties", bad)
    argv = ["topic", "create", _name("t"), "-b", cluster.bootstrap_servers]
    argv += ["--command-config", str(conf), "--timeout", "15", "-X", f"debug={_DEBUG}"]
    assert cli(argv) != 0
    out = capfd.readouterr()
    text = out.out + out.err
    assert "authentication" in text.lower(), text
    assert wrong not in text and wrong[-12:] not in text


@pytest.mark.integration
def test_dlq_inspect_reads_a_java_properties_command_config(
    cluster: KafkaCluster, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The dlq commands read ``--command-config`` with the same parser: ``key: value`` and
    continued lines work (the hand-written reader before took ``key: value`` for a missing
    ``=`` and cut continued values)."""
    user = _name("u")
    cluster.create_user(user)
    topic = cluster.create_topic(_name("t") + ".dlq", 1, 3, {"min.insync.replicas": 2})
    cluster.grant(user, topic=topic, operations=("READ", "DESCRIBE"))
    conf = _java_properties(tmp_path / "dlq.properties", cluster.client_config(user))
    argv = ["dlq", "inspect", topic, "-b", cluster.bootstrap_servers]
    assert cli([*argv, "--command-config", str(conf), "--timeout", "20"]) == 0, capfd.readouterr()
    assert f"0  records in {topic}" in capfd.readouterr().out


@pytest.mark.integration
def test_doctor_topic_without_describe_names_the_missing_acl_not_a_missing_topic(
    cluster: KafkaCluster,
) -> None:
    """Issue 35 suspicion, confirmed: the doctor's metadata listing silently leaves out the
    topics the user may not DESCRIBE, and ``doctor --topic T`` said "topic does not exist —
    create it" for a topic that exists. Asked for by name, the broker says
    TOPIC_AUTHORIZATION_FAILED: the finding names the missing ACL. Controls: with DESCRIBE
    the topic is checked as usual; a topic that really does not exist (DESCRIBE granted on
    its prefix) is still "does not exist"."""
    from kresilient.doctor import Severity, diagnose

    user = _name("u")
    cluster.create_user(user)
    topic = cluster.create_topic(_name("acl"), 1, 3, {"min.insync.replicas": 2})
    conf = cluster.client_config(user)

    def topic_findings(name: str) -> list[tuple[Severity, str, str]]:
        report = diagnose(conf, topics=[name], groups=["none"], probe=False, timeout=15)
        assert report.reachable, report.findings
        return [
            (f.severity, f.symptom, f.message)
            for f in report.by_section("topics")
            if f.subject == name
        ]

    denied = topic_findings(topic)
    assert [s for s, *_ in denied] == [Severity.ERROR], denied
    assert "not authorized to DESCRIBE topic" in denied[0][2], denied
    assert "does not exist" not in denied[0][2]

    cluster.grant(user, topic=topic, operations=("DESCRIBE",))
    allowed = topic_findings(topic)
    assert allowed and not any(
        "not authorized" in m or "does not exist" in m for *_, m in allowed
    ), allowed

    prefix = _name("gone")
    cluster.grant(user, topic=prefix, operations=("DESCRIBE",), prefixed=True)
    missing = topic_findings(prefix + "-x")
    assert [m for *_, m in missing] == ["topic does not exist"], missing
