"""The shipped config catalog matches the installed librdkafka and the real Kafka 4.1 cluster."""

from __future__ import annotations

import ctypes
import json
from importlib import resources
from typing import Any

import pytest

from kresilient import _catalog as catalog


def _shipped() -> dict[str, Any]:
    text = resources.files("kresilient").joinpath("_data", "librdkafka_properties.json")
    data: dict[str, Any] = json.loads(text.read_text("utf-8"))
    return data


def test_shipped_catalog_matches_installed_librdkafka() -> None:
    version, table = catalog.installed_properties_table()
    shipped = _shipped()
    hint = "regenerate with: python kresilient/_data/generate_catalog.py"
    assert shipped["librdkafka_version"] == version, hint
    sensitive = catalog.installed_sensitive_properties()  # librdkafka's own secret flag
    assert shipped["properties"] == catalog.parse_properties_table(table, sensitive), hint


@pytest.fixture(scope="module")
def rdkafka_conf_set() -> Any:
    lib = catalog._librdkafka_library()
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_conf_set.restype = ctypes.c_int

    def conf_set(name: str, value: str) -> int:
        conf = lib.rd_kafka_conf_new()
        err = ctypes.create_string_buffer(512)
        try:
            return int(lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), err, 512))
        finally:
            lib.rd_kafka_conf_destroy(conf)

    return conf_set


def _samples(prop: catalog.Property) -> list[str]:
    values = ["", "abc", "true", "false", "1", "-1", "0", "2147483648", "1.5"]
    if prop.default is not None:
        values.append(prop.default)
    if prop.minimum is not None and prop.maximum is not None:
        lo, hi = int(prop.minimum), int(prop.maximum)
        values += [str(lo), str(hi), str(lo - 1), str(hi + 1)]
    values += list(prop.allowed) + [a.upper() for a in prop.allowed] + ["bogus"]
    if prop.type == "csv flags" and len(prop.allowed) > 1:
        values += [f"{prop.allowed[0]},{prop.allowed[1]}", f"{prop.allowed[0]},bogus"]
    return values


TYPED = [
    p
    for p in catalog.all_properties()
    if p.source == "librdkafka"
    and p.type in ("integer", "boolean", "enum", "csv flags", "float")
    and p.name != "builtin.features"
]


@pytest.mark.parametrize("prop", TYPED, ids=lambda p: p.name)
def test_check_value_agrees_with_rd_kafka_conf_set(
    prop: catalog.Property, rdkafka_conf_set: Any
) -> None:
    disagreements = []
    for value in _samples(prop):
        accepted = rdkafka_conf_set(prop.name, value) == 0
        if accepted != (prop.check_value(value) is None):
            disagreements.append((value, accepted, prop.check_value(value)))
    assert not disagreements


def test_every_catalog_name_is_known_to_librdkafka(rdkafka_conf_set: Any) -> None:
    unknown = [
        p.name
        for p in catalog.all_properties()
        if p.source == "librdkafka" and rdkafka_conf_set(p.name, "x") == -2
    ]
    assert not unknown
    assert rdkafka_conf_set("enable.idempotense", "true") == -2  # the probe can fail


def test_lookup_aliases_scope_and_secrets() -> None:
    acks = catalog.lookup("acks")
    assert acks is not None and acks.canonical == "request.required.acks" and acks.scope == "P"
    canonical = catalog.lookup("request.required.acks")
    assert canonical is not None and "acks" in canonical.aliases
    group = catalog.lookup("group.id")
    assert group is not None and group.scope == "C"
    assert catalog.lookup("no.such.key") is None
    password = catalog.lookup("sasl.password")
    assert password is not None and password.is_secret
    assert not catalog.lookup("bootstrap.servers").is_secret  # type: ignore[union-attr]
    assert catalog.is_secret_key("listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config")
    assert catalog.lookup("error_cb") is not None  # binding keys are known too
    assert catalog.lookup("queuing.strategy").deprecated  # type: ignore[union-attr]


def test_suggest_did_you_mean() -> None:
    assert catalog.suggest("enable.idempotense")[0] == "enable.idempotence"
    assert catalog.suggest("enable_idempotence")[0] == "enable.idempotence"
    assert catalog.suggest("bootstrap.server")[0] == "bootstrap.servers"
    assert catalog.suggest("zzzzzz") == []
    topics = [k.name for k in catalog.all_kafka_configs("topic")]
    assert catalog.suggest("min.insync.replica", among=topics) == ["min.insync.replicas"]


def test_kafka_catalog_knows_broker_and_topic_keys() -> None:
    assert catalog.kafka_version().startswith("4.1")
    max_bytes = catalog.topic_config("max.message.bytes")
    assert max_bytes is not None and max_bytes.synonym == "message.max.bytes"
    rack = catalog.broker_config("broker.rack")
    assert rack is not None and rack.type == "string"
    assert catalog.broker_config("ssl.keystore.password").is_secret  # type: ignore[union-attr]
    assert catalog.java_client_kinds("max.poll.records") == ("consumer",)


@pytest.mark.integration
def test_kafka_catalog_covers_the_live_cluster(kafka_cluster: Any, topic: str) -> None:
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    resources_ = [ConfigResource(ResourceType.TOPIC, topic)]
    topic_keys = set(next(iter(admin.describe_configs(resources_).values())).result(30))
    broker_id = str(sorted(kafka_cluster.node_ids)[0])
    broker_res = [ConfigResource(ResourceType.BROKER, broker_id)]
    broker_keys = set(next(iter(admin.describe_configs(broker_res).values())).result(30))
    known_topic = {k.name for k in catalog.all_kafka_configs("topic")}
    known_broker = {k.name for k in catalog.all_kafka_configs("broker")}
    assert topic_keys and topic_keys <= known_topic, sorted(topic_keys - known_topic)
    missing = {k for k in broker_keys - known_broker if not k.startswith("listener.name.")}
    assert broker_keys and not missing, sorted(missing)
