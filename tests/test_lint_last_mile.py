"""Issue 38: findings right for the file's reader, messages that say what the file holds,
the recall misses, and honesty about what lint could not read. Each test fails on the code
before the fix (c15a167) and has a control where the finding must stay."""

from __future__ import annotations

import json
from pathlib import Path

from kresilient.lint import lint_paths
from kresilient.lint.model import Finding, LintStats, Severity


def _lint(tmp_path: Path, name: str, text: str, stats: LintStats | None = None) -> list[Finding]:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return lint_paths([str(path)], stats=stats)


def _by_rule(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


# ------------------------------------------------------------------ messages (issue 38 #8)


def test_kr034_yaml_null_is_shown_empty_not_none(tmp_path: Path) -> None:
    findings = _lint(
        tmp_path,
        "client.yaml",
        "bootstrap.servers: a:9092,b:9092\nsasl.jaas.config: x\n"
        "ssl.endpoint.identification.algorithm:\n",
    )
    kr034 = _by_rule(findings, "KR034")
    assert len(kr034) == 1 and "(empty)" in kr034[0].message
    assert "None" not in kr034[0].message


def test_kr023_names_a_default_as_a_default(tmp_path: Path) -> None:
    findings = _lint(
        tmp_path,
        "consumer.properties",
        "bootstrap.servers=a:9092,b:9092\ngroup.id=g\nheartbeat.interval.ms=20000\n",
    )
    kr023 = _by_rule(findings, "KR023")
    assert len(kr023) == 1
    assert "session.timeout.ms/3 (45000 (the default)/3)" in kr023[0].message
    assert "heartbeat.interval.ms=20000 exceeds" in kr023[0].message  # set: no "default"


def test_kr047_on_strimzi_names_spec_kafka_rack(tmp_path: Path) -> None:
    text = """\
apiVersion: kafka.strimzi.io/v1beta2
kind: Kafka
metadata:
  name: prod
spec:
  kafka:
    replicas: 3
    config:
      default.replication.factor: 3
      min.insync.replicas: 2
"""
    kr047 = _by_rule(_lint(tmp_path, "kafka.yaml", text), "KR047")
    assert kr047 and "spec.kafka.rack" in kr047[0].message
    assert "broker.rack" not in kr047[0].message
    # control: a plain broker file still names broker.rack
    plain = _lint(
        tmp_path,
        "server.properties",
        "node.id=1\nprocess.roles=broker\ndefault.replication.factor=3\n"
        "controller.quorum.voters=1@a:9093,2@b:9093,3@c:9093\n",
    )
    assert any("broker.rack is unset" in f.message for f in _by_rule(plain, "KR047"))


# ------------------------------------------------------------------ recall misses (#7)


def test_topic_spec_json_top_level_replication_factor_is_read(tmp_path: Path) -> None:
    spec = {
        "name": "orders",
        "partitions": 6,
        "replication.factor": 1,
        "config": {"cleanup.policy": "delete", "min.insync.replicas": "1"},
    }
    findings = _lint(tmp_path, "topics/orders.json", json.dumps(spec, indent=2))
    assert ("KR042", Severity.ERROR) in [(f.rule, f.severity) for f in findings]
    spec["replication.factor"] = 2
    spec["config"] = {"min.insync.replicas": "2"}
    findings = _lint(tmp_path, "topics/orders.json", json.dumps(spec, indent=2))
    assert "KR044" in [f.rule for f in findings if f.severity == Severity.ERROR]
    # control: rf 3 with min ISR 2 is clean
    spec["replication.factor"] = 3
    findings = _lint(tmp_path, "topics/orders.json", json.dumps(spec, indent=2))
    assert not [f for f in findings if f.severity == Severity.ERROR]


def test_spring_properties_poll_interval_below_session_timeout(tmp_path: Path) -> None:
    text = (
        "spring.kafka.bootstrap-servers=a:9092,b:9092\n"
        "spring.kafka.consumer.group-id=orders\n"
        "spring.kafka.consumer.properties.max.poll.interval.ms=10000\n"
        "spring.kafka.consumer.properties.session.timeout.ms=45000\n"
    )
    kr022 = _by_rule(_lint(tmp_path, "application.properties", text), "KR022")
    assert len(kr022) == 1 and kr022[0].line == 3
    # control: a poll interval above the session timeout is fine
    ok = text.replace("=10000", "=300000")
    assert not _by_rule(_lint(tmp_path, "application.properties", ok), "KR022")


# ------------------------------------------------------------------ reader identity (#1, #2, #4)


def test_a_file_naming_producerconfig_is_read_by_the_java_client(tmp_path: Path) -> None:
    text = (
        "# see org.apache.kafka.clients.producer.ProducerConfig for more details\n"
        "bootstrap.servers=a:9092,b:9092\ncompression.type=lz4\nlinger.ms=5\n"
    )
    findings = _lint(tmp_path, "producer.properties", text)
    assert not _by_rule(findings, "KR008")  # Java enables idempotence by default
    # control: the same keys without the Java evidence are librdkafka's (default off)
    plain = _lint(tmp_path, "producer.properties", text.split("\n", 1)[1])
    assert _by_rule(plain, "KR008")


def test_a_shared_snippet_gets_no_unset_key_advice_for_one_key(tmp_path: Path) -> None:
    """acks (a producer key) and session.timeout.ms (a consumer key) in one connection
    snippet: judged per role on what it sets, no KR032, no KR018/KR021 for unset keys."""
    text = (
        "bootstrap.servers=a:9092,b:9092\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
        "acks=all\nsession.timeout.ms=45000\n"
    )
    rules = {f.rule for f in _lint(tmp_path, "common.properties", text)}
    assert not rules & {"KR032", "KR018", "KR021", "KR008"}, rules


def test_aiokafka_consumer_without_group_gets_no_commit_advice(tmp_path: Path) -> None:
    text = """\
from aiokafka import AIOKafkaConsumer

consumer = AIOKafkaConsumer("t", bootstrap_servers="a:9092,b:9092")
"""
    rules = {f.rule for f in _lint(tmp_path, "c.py", text)}
    assert not rules & {"KR018", "KR021"}
    # control: with a group, the auto-commit and reset advice stands
    grouped = text.replace('"a:9092,b:9092"', '"a:9092,b:9092", group_id="g"')
    assert {"KR018", "KR021"} <= {f.rule for f in _lint(tmp_path, "c.py", grouped)}


# ------------------------------------------------------------------ not understood (issue 38)


def test_a_config_built_at_run_time_is_listed_as_not_understood_in_every_format(
    tmp_path: Path,
) -> None:
    from kresilient.lint.output import render

    text = (
        "from confluent_kafka import Producer\n\n"
        "conf = read_ccloud_config('client.properties')\n"
        "producer = Producer(conf)\n"
    )
    stats = LintStats()
    findings = _lint(tmp_path, "producer.py", text, stats)
    assert [(f.rule, f.line, f.severity) for f in findings] == [("KR055", 4, Severity.INFO)]
    assert "not understood" in findings[0].message
    assert len(stats.not_understood) == 1
    assert "1 config(s) not understood (KR055)" in render(findings, "text", stats=stats)
    assert '"rule": "KR055"' in render(findings, "json", stats=stats)
    sarif = json.loads(render(findings, "sarif", stats=stats))
    invocation = sarif["runs"][0]["invocations"][0]
    assert invocation["properties"]["configsNotUnderstood"] == 1
    (note,) = invocation["toolExecutionNotifications"]
    assert note["level"] == "note" and note["descriptor"]["id"] == "KR055"
    assert "::notice" in render(findings, "github", stats=stats)
    # control: a literal config is understood
    literal = "from confluent_kafka import Producer\n\np = Producer({'bootstrap.servers': 'a:1'})\n"
    assert not [f for f in _lint(tmp_path, "p2.py", literal) if f.rule == "KR055"]


def test_other_images_environment_variables_are_not_broker_keys(tmp_path: Path) -> None:
    """Issue 38 #5: Debezium's image reads NODE_ID/CLUSTER_ID; they were read as broker keys
    (KR005 "unknown broker config 'NODE_ID'")."""
    text = """\
services:
  kafka:
    image: quay.io/debezium/kafka:2.7
    environment:
      CLUSTER_ID: abc
      NODE_ID: 1
      NODE_ROLE: combined
      KAFKA_CONTROLLER_QUORUM_VOTERS: 1@kafka:9093
      KAFKA_LISTENERS: PLAINTEXT://kafka:9092,CONTROLLER://kafka:9093
"""
    findings = _lint(tmp_path, "docker-compose.yml", text)
    assert not _by_rule(findings, "KR005"), findings
    # control: the KAFKA_* variables beside them are read (a broker of a one-voter quorum)
    assert _by_rule(findings, "KR053")


def test_a_connect_standalone_worker_is_read_as_such(tmp_path: Path) -> None:
    """Issue 38: connect-standalone.properties was "no Kafka settings found"."""
    text = (
        "bootstrap.servers=k1:9092,k2:9092\nsecurity.protocol=SASL_PLAINTEXT\n"
        "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "offset.storage.file.filename=/tmp/connect.offsets\n"
    )
    stats = LintStats()
    findings = _lint(tmp_path, "connect-standalone.properties", text, stats)
    assert stats.with_config == 1 and not stats.skipped
    assert [(f.rule, f.line) for f in findings if f.severity == Severity.ERROR] == [("KR040", 2)]
