"""Readers keep real positions, tell kinds apart, and follow Python names through ast."""

from __future__ import annotations

import textwrap

import pytest

from kresilient.lint import ConfigUnit, lint_text
from kresilient.lint.engine import detect_kind
from kresilient.lint.readers import env_to_key, read_text


def _units(text: str, path: str, fmt: str) -> list[ConfigUnit]:
    result = read_text(textwrap.dedent(text), path, fmt)
    assert result.error is None, result.error
    return result.units


def test_properties_separators_continuations_and_escapes() -> None:
    (unit,) = _units(
        """\
        # comment
        ! also a comment
        bootstrap.servers = a:9092,\\
            b:9092
        acks:all
        client.id   my\\u0041pp
        linger.ms=5
        """,
        "p.properties",
        "properties",
    )
    assert unit.entries["bootstrap.servers"].text == "a:9092,b:9092"
    assert unit.entries["acks"].text == "all" and unit.entries["acks"].line == 5
    assert unit.entries["client.id"].text == "myApp"
    assert unit.entries["linger.ms"].line == 7


def test_properties_bad_unicode_escape_is_a_located_parse_error() -> None:
    result = read_text("acks=all\nclient.id=\\u12\n", "p.properties", "properties")
    assert result.error is not None and result.error.line == 2


def test_yaml_sections_kinds_and_positions() -> None:
    units = _units(
        """\
        kafka:
          producer:
            bootstrap.servers: a:1,b:1
            acks: 1
          consumer:
            group.id: g
            bootstrap:
              servers: a:1,b:1
        """,
        "app.yaml",
        "yaml",
    )
    kinds = {u.kind: u for u in units}
    assert kinds["producer"].entries["acks"].line == 4
    assert kinds["producer"].entries["acks"].col == 5
    assert kinds["consumer"].entries["bootstrap.servers"].text == "a:1,b:1"  # nested keys


def test_yaml_topic_list_with_spec_and_configs() -> None:
    (unit,) = _units(
        """\
        topics:
          - name: orders
            replicationFactor: 2
            configs:
              min.insync.replicas: 2
        """,
        "t.yaml",
        "yaml",
    )
    assert unit.kind == "topic" and unit.name == "orders"
    assert unit.entries["replication.factor"].text == "2"
    assert unit.entries["min.insync.replicas"].line == 5


def test_unrelated_yaml_is_not_linted() -> None:
    assert _units("name: ci\non:\n  push:\n    branches: [main]\n", "ci.yml", "yaml") == []


def test_json_positions() -> None:
    (unit,) = _units('{\n  "acks": 0,\n    "linger.ms": 5, "retries": 3\n}\n', "p.json", "json")
    assert (unit.entries["acks"].line, unit.entries["acks"].col) == (2, 3)
    assert (unit.entries["retries"].line, unit.entries["retries"].col) == (3, 21)


def test_toml_quoted_and_dotted_keys() -> None:
    units = _units(
        """\
        [producer]
        "bootstrap.servers" = "a:1,b:1"
        enable.idempotence = false
        acks = "all"
        """,
        "k.toml",
        "toml",
    )
    (unit,) = units
    assert unit.kind == "producer"
    assert unit.entries["enable.idempotence"].line == 3
    assert unit.entries["acks"].line == 4


def test_env_names_and_roles() -> None:
    assert env_to_key("KAFKA_ENABLE_IDEMPOTENCE") == ("enable.idempotence", None)
    assert env_to_key("KAFKA_CONSUMER_GROUP_ID") == ("group.id", "consumer")
    assert env_to_key("KAFKA_SOME__UNDER___DASH") == ("some_under-dash", None)
    (unit,) = _units("export KAFKA_ACKS='0'\nPATH=/bin\nKAFKA_LINGER_MS=5 # c\n", ".env", "env")
    assert unit.entries["acks"].text == "0" and unit.entries["linger.ms"].text == "5"


def test_python_dict_literal_name_mutations_and_kwargs() -> None:
    units = _units(
        """\
        from confluent_kafka import Producer as P
        from kresilient import ResilientConsumer
        import os

        BASE = {"bootstrap.servers": "a:1,b:1"}

        def build():
            conf = {**BASE, "acks": 1}
            conf["linger.ms"] = 10
            conf.update({"retries": 0})
            return P(conf, error_cb=print, logger=None)

        consumer = ResilientConsumer(
            {"group.id": "g", "sasl.password": os.environ["PW"]}, allow_unsafe=["x"]
        )
        unrelated = dict(acks=0)
        """,
        "app.py",
        "python",
    )
    producer, consumer = units
    assert producer.kind == "producer" and consumer.kind == "consumer"
    assert producer.entries["bootstrap.servers"].line == 5
    assert producer.entries["acks"].line == 8
    assert producer.entries["linger.ms"].line == 9
    assert producer.entries["retries"].text == "0"
    assert "error_cb" in producer.entries and "allow_unsafe" not in consumer.entries
    assert consumer.entries["sasl.password"].dynamic
    assert consumer.context["resilient"] is True


def test_python_ignores_classes_not_from_kafka_modules() -> None:
    assert _units("class Producer: ...\nProducer({'acks': 0})\n", "x.py", "python") == []
    # kafka-python's KafkaProducer is read (tests/test_lint_dialects.py); a class of the same
    # name from another module is not.
    assert (
        _units("from mylib import KafkaProducer\nKafkaProducer(acks=0)\n", "k.py", "python") == []
    )


def test_python_syntax_error_is_located() -> None:
    result = read_text("import confluent_kafka\nx = {\n", "bad.py", "python")
    assert result.error is not None and result.error.line >= 2


@pytest.mark.parametrize(
    ("keys", "kind"),
    [
        ({"acks": "all", "linger.ms": "5"}, "producer"),
        ({"group.id": "g", "auto.offset.reset": "earliest"}, "consumer"),
        ({"bootstrap.servers": "a", "client.id": "x"}, "client"),
        ({"node.id": "1", "message.max.bytes": "1"}, "broker"),
        ({"cleanup.policy": "compact", "retention.ms": "1"}, "topic"),
        ({"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}, "topic"),
        # keys of both roles: a generic client file, judged per role (issue 36 #4)
        ({"acks": "all", "linger.ms": "5", "group.id": "g"}, "client"),
    ],
)
def test_detect_kind(keys: dict[str, str], kind: str) -> None:
    text = "".join(f"{k}={v}\n" for k, v in keys.items())
    (unit,) = read_text(text, "x.properties", "properties").units
    assert detect_kind(unit) == kind


def test_kind_flag_overrides_detection() -> None:
    from kresilient.lint import Settings

    findings = lint_text("linger.ms=5\nacks=all\n", "x.properties", Settings(kind="consumer"))
    assert {f.rule for f in findings} >= {"KR032"}


def test_catalog_like_json_with_section_names_is_not_a_config() -> None:
    text = '{"broker": [{"name": "x", "type": "int", "default": "1", "description": "d"}]}'
    assert _units(text, "catalog.json", "json") == []


def test_python_partially_resolved_config_skips_default_based_rules() -> None:
    text = textwrap.dedent(
        """\
        from confluent_kafka import Producer, Consumer

        def make(extra):
            Producer({**extra, "acks": 0})
            Consumer({"group.id": "g", "bootstrap.servers": "a,b"})
        """
    )
    rules = {(f.rule, f.line) for f in lint_text(text, "app.py")}
    assert ("KR006", 4) in rules  # explicit values are still checked
    assert not {r for r, line in rules if line == 4} & {"KR008", "KR013", "KR014", "KR038"}
    assert {"KR014", "KR021"} <= {r for r, line in rules if line == 5}


def test_python_suppression_text_inside_a_string_is_not_a_suppression() -> None:
    text = (
        "from confluent_kafka import Producer\n"
        "Producer({'acks': 0, 'client.id': '# kresilient: ignore[KR006] reason: a string'})\n"
    )
    assert "KR006" in {f.rule for f in lint_text(text, "app.py")}
