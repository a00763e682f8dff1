"""Readers of the files teams keep Kafka settings in (Spring Boot, Strimzi, Terraform,
topicctl, Jikkou, aiokafka/kafka-python calls), and the client whose defaults judge them.

Each fixture under tests/data/lint/<format>/ is a realistic file; the expected findings are
listed at exact lines, and each format has a correct file that must give no finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kresilient.lint import lint_paths, lint_text
from kresilient.lint.model import ConfigUnit
from kresilient.lint.readers import read_text
from kresilient.lint.settings import Settings

DATA = Path(__file__).resolve().parent / "data" / "lint"


def _found(path: Path, settings: Settings | None = None) -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in lint_paths([str(path)], settings)]


def _units(path: Path) -> list[ConfigUnit]:
    result = read_text(
        path.read_text(), str(path), "yaml" if path.suffix == ".yml" else "properties"
    )
    assert result.error is None
    return result.units


# ----------------------------------------------------------------------------- Spring Boot


def test_spring_yaml_findings_at_their_lines() -> None:
    assert _found(DATA / "spring" / "application.yml") == [
        (12, "KR041"),  # password inside spring.kafka.properties.sasl.jaas.config
        (14, "KR007"),  # producer.acks: 1
        (14, "KR008"),  # acks=1 turns the Java default idempotence off (KAFKA-13673)
        (15, "KR010"),  # producer.retries: 0
        (20, "KR018"),  # consumer.enable-auto-commit: true (Spring would commit after processing)
        (21, "KR021"),  # consumer.auto-offset-reset: latest
    ]


def test_spring_properties_relaxed_names_and_properties_maps() -> None:
    assert _found(DATA / "spring" / "application.properties") == [
        (6, "KR008"),  # producer.properties.enable.idempotence=false
        (7, "KR009"),  # max.in.flight 5, Java's retries default, no idempotence
        (8, "KR011"),  # delivery.timeout.ms=10000
        (10, "KR021"),  # consumer.autoOffsetReset=latest (camelCase)
        (14, "KR041"),  # ssl.key-store-password literal
    ]


def test_spring_findings_name_the_key_as_written_and_never_the_secret() -> None:
    findings = lint_paths([str(DATA / "spring")])
    keys = {f.key for f in findings}
    assert "spring.kafka.consumer.autoOffsetReset" in keys
    assert "spring.kafka.producer.acks" in keys
    text = " ".join(f.message for f in findings)
    assert "s3cr3t-Pa55" not in text and "changeit-for-real-9" not in text


def test_spring_correct_file_relying_on_java_and_spring_defaults_is_clean() -> None:
    """Negative control: a producer with only serializers (Java: acks=all, idempotence on,
    murmur2) and a consumer without enable-auto-commit (Spring: false) give no finding,
    though librdkafka's defaults would give KR026 (eager assignor) and KR038 (partitioner)."""
    path = DATA / "spring" / "application-good.yml"
    assert _found(path) == []
    forced = _found(path, Settings(client="librdkafka"))
    assert {"KR026", "KR038"} <= {rule for _, rule in forced}


def test_spring_units_roles_values_and_dialect() -> None:
    units = _units(DATA / "spring" / "application-good.yml")
    by = {(u.name, u.line): u for u in units}
    kinds = sorted(u.kind for u in units)
    assert kinds == ["consumer", "consumer", "producer"]  # the local profile is its own document
    consumer = next(u for u in units if u.kind == "consumer")
    assert consumer.context["client"] == "java" and consumer.context["framework"] == "Spring Kafka"
    assert consumer.entries["heartbeat.interval.ms"].value == 3000  # "3s"
    assert consumer.entries["bootstrap.servers"].text.count(",") == 2  # a YAML list
    local = [u for u in by.values() if u.kind == "consumer"][1]
    assert local.entries["max.poll.interval.ms"].value == 600000  # "PT10M"
    producer = next(u for u in units if u.kind == "producer")
    assert producer.entries["transactional.id"].key == "spring.kafka.producer.transaction-id-prefix"


def test_spring_duration_that_cannot_be_read_is_dynamic_not_a_wrong_number() -> None:
    text = "spring.kafka.consumer.heartbeat-interval=soon\nspring.kafka.consumer.group-id=g\n"
    (unit,) = read_text(text, "application.properties", "properties").units
    assert unit.entries["heartbeat.interval.ms"].dynamic


def test_spring_malformed_yaml_is_a_located_kr000() -> None:
    text = "spring:\n  kafka:\n    producer:\n      acks: [1\n"
    (finding,) = lint_text(text, "application.yml")
    assert finding.rule == "KR000" and finding.line == 5


def test_spring_keys_do_not_leak_into_a_generic_config_of_the_same_file() -> None:
    """The spring.kafka tree is read once, as Spring; before, its consumer.properties map
    was also read as a bare librdkafka consumer."""
    units = _units(DATA / "spring" / "application.yml")
    assert {u.source for u in units} == {"spring"}


# ----------------------------------------------------------------------------- Java client


JAVA_PRODUCER = """\
bootstrap.servers=kafka-0:9092,kafka-1:9092,kafka-2:9092
key.serializer=org.apache.kafka.common.serialization.StringSerializer
value.serializer=io.confluent.kafka.serializers.KafkaAvroSerializer
schema.registry.url=http://schema-registry:8081
"""


def test_java_producer_properties_relying_on_java_defaults_is_clean() -> None:
    """Issue 15: a Java producer holding only bootstrap.servers and serializers got
    'enable.idempotence is unset' and 'partitioner is unset' - both false for Java."""
    assert lint_text(JAVA_PRODUCER, "producer.properties") == []


def test_same_keys_judged_by_librdkafka_flag_its_defaults_negative_control() -> None:
    findings = lint_text(JAVA_PRODUCER, "producer.properties", Settings(client="librdkafka"))
    rules = {f.rule for f in findings}
    assert {"KR008", "KR038"} <= rules
    assert all("(librdkafka defaults)" in f.message for f in findings if f.key is None)


def test_java_acks_with_explicit_idempotence_is_refused_but_default_is_only_turned_off() -> None:
    explicit = lint_text(JAVA_PRODUCER + "enable.idempotence=true\nacks=1\n", "p.properties")
    assert [(f.line, f.rule) for f in explicit if f.rule in ("KR001", "KR008")] == [(6, "KR001")]
    implicit = lint_text(JAVA_PRODUCER + "acks=1\n", "p.properties")
    assert [(f.line, f.rule) for f in implicit if f.rule in ("KR001", "KR008")] == [(5, "KR008")]


def test_java_misspelt_key_is_reported_plugin_keys_are_not() -> None:
    findings = lint_text(JAVA_PRODUCER + "enable.idempotense=true\n", "p.properties")
    assert [(f.line, f.rule) for f in findings] == [(5, "KR005")]
    assert "enable.idempotence" in findings[0].message


def test_cli_client_flag_overrides_detection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kresilient.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "producer.properties").write_text("bootstrap.servers=a:9092,b:9092\nlinger.ms=10\n")
    assert main(["lint", "--fail-on", "warning", "producer.properties"]) == 1  # librdkafka
    out = capsys.readouterr().out
    assert "KR008" in out and "(librdkafka defaults)" in out
    assert main(["lint", "--fail-on", "warning", "--client", "java", "producer.properties"]) == 0
    assert "KR008" not in capsys.readouterr().out
    assert main(["lint", "--client", "python", "producer.properties"]) == 2  # usage error
    assert "--client" in capsys.readouterr().err


def test_client_setting_in_pyproject_is_validated() -> None:
    from kresilient.errors import ConfigError
    from kresilient.lint.settings import settings_from_mapping

    assert settings_from_mapping({"client": "java"}, "pyproject.toml").client == "java"
    with pytest.raises(ConfigError, match="client must be java or librdkafka"):
        settings_from_mapping({"client": "jvm"}, "pyproject.toml")


# ----------------------------------------------------------------------------- Strimzi


def test_strimzi_kafkatopic_replicas_and_config_at_their_lines() -> None:
    assert _found(DATA / "strimzi" / "topics.yaml") == [
        (10, "KR042"),  # spec.replicas: 2 (issue 15: was not flagged)
        (13, "KR044"),  # min.insync.replicas 2 with 2 replicas: one broker down stops writes
        (27, "KR043"),  # payments-audit: min.insync.replicas 1
        (28, "KR045"),  # unclean.leader.election.enable: true
    ]


def test_strimzi_topic_units_name_kind_and_spelling() -> None:
    units = read_text((DATA / "strimzi" / "topics.yaml").read_text(), "t.yaml", "yaml").units
    assert [(u.name, u.kind, u.source) for u in units] == [
        ("payments", "topic", "strimzi"),
        ("payments.audit.v1", "topic", "strimzi"),  # spec.topicName wins over metadata.name
    ]
    assert units[0].entries["replication.factor"].key == "spec.replicas"


def test_strimzi_kafka_broker_config() -> None:
    assert _found(DATA / "strimzi" / "kafka.yaml") == [
        (9, "KR047"),  # no spec.kafka.rack: located at the spec.kafka block
        (20, "KR042"),  # default.replication.factor: 2
        (21, "KR044"),  # min.insync.replicas 2 = default.replication.factor
        (22, "KR045"),
    ]


@pytest.mark.parametrize("name", ["topics-good.yaml", "kafka-good.yaml"])
def test_strimzi_correct_resources_give_no_finding(name: str) -> None:
    """Negative control (with a KafkaUser, a Strimzi resource holding no Kafka config)."""
    assert _found(DATA / "strimzi" / name) == []


# ----------------------------------------------------------------------------- Jikkou, topicctl


def test_jikkou_topic_list() -> None:
    assert _found(DATA / "jikkou" / "topics.yaml") == [
        (9, "KR042"),  # clickstream: replicas 1
        (18, "KR044"),  # clickstream-dlq: min.insync.replicas 3 with 3 replicas
    ]


def test_topicctl_topic_spec_and_retention_minutes() -> None:
    path = DATA / "topicctl" / "topic-events.yaml"
    assert _found(path) == [(11, "KR042"), (16, "KR044")]
    (unit,) = read_text(path.read_text(), str(path), "yaml").units
    assert unit.name == "events" and unit.entries["retention.ms"].value == 1440 * 60_000


@pytest.mark.parametrize("path", ["jikkou/topic-good.yaml", "topicctl/topic-good.yaml"])
def test_topic_spec_correct_files_give_no_finding(path: str) -> None:
    assert _found(DATA / path) == []


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\nspec: [1, 2]\n",
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\nspec:\n  replicas: {a: 1}\n",
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: Kafka\nspec:\n  kafka: 3\n",
        "apiVersion: kafka.jikkou.io/v1\nkind: KafkaTopicList\nitems: 7\n",
        "meta:\n  name: [x]\nspec:\n  partitions: many\n  replicationFactor: null\n",
    ],
)
def test_odd_resource_shapes_never_crash(text: str) -> None:
    findings = lint_text(text, "r.yaml")
    assert all(f.rule != "KR000" for f in findings)


def test_malformed_strimzi_yaml_is_a_located_kr000() -> None:
    text = (
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\n"
        "spec:\n  replicas: 2\n  config: {a: 1\n"
    )
    (finding,) = lint_text(text, "topic.yaml")
    assert finding.rule == "KR000" and finding.line >= 5
