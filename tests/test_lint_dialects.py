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
        (8, "KR051"),  # ... below linger.ms + request.timeout.ms: KafkaProducer refuses it
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


# ----------------------------------------------------------------------------- Terraform


def test_terraform_kafka_topic_resources_at_their_lines() -> None:
    """Issue 15: a kafka_topic with replication_factor = 1 was not read at all (exit 0)."""
    assert _found(DATA / "terraform" / "topics.tf") == [
        (18, "KR042"),  # replication_factor = 1
        (24, "KR043"),  # "min.insync.replicas" = "1"
        (34, "KR044"),  # min.insync.replicas 3 with replication_factor 3
        (35, "KR045"),  # "unclean.leader.election.enable" = true
        (36, "KR005"),  # "retension.ms": misspelt, the provider would send it to the broker
    ]


def test_terraform_expressions_are_dynamic_not_guessed() -> None:
    from kresilient.lint.hclreader import read_terraform

    text = (DATA / "terraform" / "topics.tf").read_text()
    units = read_terraform(text, "topics.tf").units
    assert [u.name for u in units] == ["orders", "orders.dlq", None]
    per_env = units[2]
    assert all(e.dynamic for e in per_env.entries.values())  # each.value..., "${var.min_isr}"
    assert units[0].entries["replication.factor"].key == "replication_factor"


def test_terraform_correct_file_and_confluent_topic_give_no_finding() -> None:
    path = DATA / "terraform" / "topics_good.tf"
    assert _found(path) == []
    from kresilient.lint.hclreader import read_terraform

    units = read_terraform(path.read_text(), str(path)).units
    assert [(u.name, sorted(u.entries)) for u in units] == [
        (
            "payments",
            [
                "cleanup.policy",
                "max.message.bytes",
                "min.insync.replicas",
                "partitions",
                "replication.factor",
            ],
        ),
        ("invoices", ["cleanup.policy", "partitions", "retention.ms"]),
    ]


def test_terraform_is_found_by_a_directory_walk() -> None:
    from kresilient.lint.model import LintStats

    stats = LintStats()
    lint_paths([str(DATA / "terraform")], stats=stats)
    assert stats.files_read == 2 and stats.with_config == 2


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('resource "kafka_topic" "x" {\n  name = "x"\n  replication_factor = \n}\n', 3),
        ('resource "kafka_topic" "x" {\n  config = {\n    "a" = "b"\n', 4),
        ('resource "kafka_topic" "x" {\n' + "  a = {\n" * 3000, 3002),
    ],
)
def test_terraform_malformed_hcl_is_a_located_kr000(text: str, line: int) -> None:
    findings = lint_text(text, "main.tf")
    assert [(f.rule, f.line) for f in findings] == [("KR000", line)]
    assert "Terraform" in findings[0].message


def test_terraform_deeply_nested_valid_value_is_a_kr000_or_read_never_a_crash() -> None:
    text = 'resource "kafka_topic" "x" {\n  config = ' + "{a = " * 2000 + "1" + "}" * 2000 + "\n}\n"
    findings = lint_text(text, "main.tf")
    assert all(f.rule in ("KR000",) for f in findings)


def test_terraform_without_kafka_resources_is_skipped_not_clean() -> None:
    from kresilient.lint.model import LintStats

    stats = LintStats()
    findings = lint_paths([str(DATA / "terraform" / "topics_good.tf")], stats=stats)
    assert findings == [] and stats.with_config == 1
    assert lint_text('resource "aws_s3_bucket" "b" {\n  bucket = "x"\n}\n', "s3.tf") == []


# ------------------------------------------------------------------------- Python keyword clients


def test_aiokafka_keyword_arguments_judged_by_aiokafka_defaults() -> None:
    findings = lint_paths([str(DATA / "python" / "aio_pipeline.py")])
    assert [(f.line, f.rule) for f in findings] == [
        (11, "KR018"),  # AIOKafkaConsumer: background auto-commit (default True)
        (15, "KR021"),  # auto_offset_reset="latest"
        (17, "KR008"),  # AIOKafkaProducer: no idempotence by default
        (19, "KR007"),  # acks=1
        (24, "KR041"),  # sasl_plain_password literal
        (26, "KR007"),  # audit producer: acks unset, aiokafka's default is 1
        (26, "KR008"),
    ]
    unset = [f for f in findings if f.key is None]
    assert unset and all(f.message.endswith("(aiokafka defaults)") for f in unset)
    assert all("Xk9-rt55-live" not in f.message for f in findings)
    # value_serializer, sasl_mechanism ... are not called unknown librdkafka properties
    assert not [f for f in findings if f.rule == "KR005"]


def test_kafka_python_follows_java_defaults() -> None:
    """kafka-python 2.1+ defaults to acks=all with idempotence (turned off by conflicting
    user settings, as in Java): the bare `safe` producer gives no finding."""
    findings = lint_paths([str(DATA / "python" / "kafka_python_worker.py")])
    assert [(f.line, f.rule) for f in findings] == [(5, "KR006"), (5, "KR008"), (6, "KR010")]


def test_python_keyword_clients_correct_file_is_clean() -> None:
    assert lint_paths([str(DATA / "python" / "aio_good.py")]) == []


def test_aiokafka_positional_topics_are_not_a_config_and_kwargs_dicts_are_partial() -> None:
    text = (
        "from aiokafka import AIOKafkaConsumer\n"
        "opts = {'enable_auto_commit': False}\n"
        "c = AIOKafkaConsumer('a', 'b', bootstrap_servers='x:1,y:1', **opts)\n"
    )
    (unit,) = read_text(text, "c.py", "python").units
    assert sorted(unit.entries) == ["bootstrap.servers"]
    assert unit.context["config_known"] is False
    # Unknown **options: no finding that depends on a default (auto-commit, offset reset),
    # and the config is said to be partly understood (KR055, issue 38), not silently clean.
    assert [f.rule for f in lint_text(text, "c.py")] == ["KR055"]


def test_confluent_aioproducer_thread_pool_argument_is_not_a_config_key() -> None:
    """Issue 15: AIOProducer(max_workers=...) was called an unknown config key."""
    text = (
        "from confluent_kafka.aio import AIOProducer\n"
        "p = AIOProducer({'bootstrap.servers': 'a:1,b:1', 'enable.idempotence': True,"
        " 'error_cb': print, 'on_delivery': print}, max_workers=4)\n"
    )
    assert [f.rule for f in lint_text(text, "p.py")] == ["KR038"]  # an info, no KR005


def test_python_file_with_syntax_error_naming_aiokafka_is_a_located_kr000() -> None:
    text = "from aiokafka import AIOKafkaProducer\np = AIOKafkaProducer(acks=1,\n"
    (finding,) = lint_text(text, "p.py")
    assert finding.rule == "KR000" and finding.line == 2


# ----------------------------------------------------------------------------- Kafka Connect


def test_connect_worker_prefixed_clients_and_internal_topics() -> None:
    """Issue 15: a worker with producer.acks=1 and producer.enable.idempotence=false gave 0
    findings (the file was not read as a Kafka config at all)."""
    assert _found(DATA / "connect" / "connect-distributed.properties") == [
        (7, "KR042"),  # offset.storage.replication.factor=1
        (9, "KR042"),  # config.storage.replication.factor=1
        (11, "KR042"),  # status.storage.replication.factor=1
        (14, "KR007"),  # producer.acks=1
        (15, "KR008"),  # producer.enable.idempotence=false
    ]


def test_connect_sink_connector_tolerance_without_dlq_and_overrides() -> None:
    findings = lint_paths([str(DATA / "connect" / "jdbc-sink.properties")])
    assert [(f.line, f.rule) for f in findings] == [(7, "KR050"), (9, "KR021"), (9, "KR030")]
    assert findings[1].key == "consumer.override.auto.offset.reset"
    assert "Kafka Connect / Java client" in findings[2].message


@pytest.mark.parametrize(
    "name", ["connect-distributed-good.properties", "jdbc-sink-good.properties"]
)
def test_connect_correct_files_give_no_finding(name: str) -> None:
    """Negative control: Connect's own producer defaults (idempotence off, one request in
    flight) and RF -1 (the broker's default) are not findings; a DLQ satisfies KR050."""
    assert _found(DATA / "connect" / name) == []


def test_connect_source_connector_tolerance_all_is_not_kr050() -> None:
    text = (
        "name=src\nconnector.class=io.debezium.connector.postgresql.PostgresConnector\n"
        "errors.tolerance=all\n"
    )
    assert [f.rule for f in lint_text(text, "src.properties")] == []


# ----------------------------------------------------------------------------- relation rules


def test_java_delivery_timeout_below_linger_plus_request_is_refused_librdkafka_untouched() -> None:
    java = JAVA_PRODUCER + "delivery.timeout.ms=30000\nlinger.ms=50\n"
    assert [(f.line, f.rule) for f in lint_text(java, "p.properties") if f.rule == "KR051"] == [
        (5, "KR051")
    ]
    fixed = JAVA_PRODUCER + "delivery.timeout.ms=30050\nlinger.ms=50\n"  # exactly enough
    assert not [f for f in lint_text(fixed, "p.properties") if f.rule == "KR051"]
    librdkafka = "bootstrap.servers=a:1,b:1\ndelivery.timeout.ms=30000\nlinger.ms=50\n"
    assert not [f for f in lint_text(librdkafka, "p.properties") if f.rule == "KR051"]


def test_transaction_timeout_against_the_broker_linted_alongside(tmp_path: Path) -> None:
    producer = tmp_path / "producer.properties"
    producer.write_text("acks=all\ntransactional.id=tx-1\ntransaction.timeout.ms=600000\n")
    broker = tmp_path / "server.properties"
    broker.write_text("node.id=1\nprocess.roles=broker\ntransaction.max.timeout.ms=300000\n")
    found = [f for f in lint_paths([str(tmp_path)]) if f.rule == "KR052"]
    assert [(Path(f.path).name, f.line) for f in found] == [("producer.properties", 3)]
    assert "server.properties" in found[0].message
    # Negative control: alone, 600000 is within the brokers' 900000 default.
    assert not [f for f in lint_paths([str(producer)]) if f.rule == "KR052"]


def test_unset_key_finding_in_properties_points_at_the_first_setting_not_a_comment() -> None:
    """Issue 15: errors about unset keys were located on line 1, a licence comment."""
    text = "# Licensed to the Apache Software Foundation\n#\n\nbootstrap.servers=a:1,b:1\n"
    text += "linger.ms=5\n"
    findings = lint_text(text, "producer.properties")
    unset = [f for f in findings if f.key is None]
    assert unset and all((f.line, f.col) == (4, 1) for f in unset)


FIXTURES = sorted(
    p
    for d in ("spring", "strimzi", "jikkou", "topicctl", "terraform", "connect", "python")
    for p in (DATA / d).iterdir()
)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_truncation_and_mangling_of_a_fixture_is_findings_or_kr000_never_a_crash(
    path: Path,
) -> None:
    """Hostile variants of each new format (cut anywhere, a bracket or quote or tab
    inserted): lint_text returns located findings; an exception would fail the test."""
    text = path.read_text()
    step = max(1, len(text) // 40)
    for cut in range(0, len(text), step):
        for variant in (text[:cut], text[:cut] + "{[\"'\t" + text[cut:], text[cut:]):
            for finding in lint_text(variant, path.name):
                assert finding.line >= 0 and finding.col >= 0
                if finding.rule == "KR000":
                    assert 1 <= finding.line <= variant.count("\n") + 2
