"""Safe defaults, validation and redaction (kresilient.config): pure logic, no cluster."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from kresilient import _catalog as catalog
from kresilient.config import (
    CONSUMER_DEFAULTS,
    PRODUCER_DEFAULTS,
    REDACTED,
    SECRET_KEYS,
    consumer_config,
    is_secret,
    producer_config,
    redact,
)
from kresilient.errors import ConfigError, UnsafeConfigError

BASE = {"bootstrap.servers": "127.0.0.1:9092"}
GROUP = {**BASE, "group.id": "g"}


def test_producer_defaults_are_applied_to_a_copy() -> None:
    user: dict[str, Any] = {**BASE, "linger.ms": 20}
    before = copy.deepcopy(user)
    cfg = producer_config(user)
    assert user == before
    assert cfg is not user
    assert cfg["acks"] == "all"
    assert cfg["enable.idempotence"] == "true"
    assert cfg["max.in.flight.requests.per.connection"] == "5"
    assert cfg["retries"] == "2147483647"
    assert cfg["partitioner"] == "murmur2_random"
    assert int(cfg["statistics.interval.ms"]) > 0
    assert 0 < int(cfg["message.timeout.ms"]) <= 300_000
    assert cfg["linger.ms"] == "20"


def test_every_default_key_is_a_known_property_of_the_right_scope() -> None:
    for defaults, other in ((PRODUCER_DEFAULTS, "C"), (CONSUMER_DEFAULTS, "P")):
        for key, value in defaults.items():
            prop = catalog.lookup(key)
            assert prop is not None, key
            assert prop.scope != other, key
            assert prop.check_value(value) is None, (key, value)


def test_user_value_under_an_alias_is_kept_and_no_default_is_added_beside_it() -> None:
    cfg = producer_config({**BASE, "request.required.acks": "all", "delivery.timeout.ms": 30000})
    assert "acks" not in cfg
    assert cfg["request.required.acks"] == "all"
    assert "message.timeout.ms" not in cfg
    assert cfg["delivery.timeout.ms"] == "30000"


@pytest.mark.parametrize(
    ("python_value", "text"),
    [(True, "true"), (False, "false"), (5, "5"), (2.5, "2.5"), ("true", "true")],
)
def test_python_typed_values_become_librdkafka_strings(python_value: Any, text: str) -> None:
    key = "socket.keepalive.enable" if isinstance(python_value, bool) or text == "true" else None
    key = key or "linger.ms"
    assert producer_config({**BASE, key: python_value})[key] == text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("acks", 0),
        ("acks", "1"),
        ("request.required.acks", 1),
        ("enable.idempotence", False),
        ("enable.idempotence", "false"),
        ("max.in.flight.requests.per.connection", 6),
        ("max.in.flight", "100"),
        ("retries", 0),
        ("message.timeout.ms", 0),
        ("delivery.timeout.ms", "0"),
        ("statistics.interval.ms", 0),
        ("enable.ssl.certificate.verification", False),
        ("ssl.endpoint.identification.algorithm", "none"),
    ],
)
def test_weakening_producer_settings_are_refused_naming_the_key(key: str, value: Any) -> None:
    with pytest.raises(UnsafeConfigError) as info:
        producer_config({**BASE, key: value})
    assert info.value.key == key
    assert key in str(info.value)
    assert "allow_unsafe" in str(info.value)


def test_allow_unsafe_accepts_the_key_with_exactly_one_warning() -> None:
    with capture_logs() as logs:
        cfg = producer_config(
            {**BASE, "acks": 1, "enable.idempotence": False},
            allow_unsafe=("acks", "enable.idempotence"),
        )
    assert cfg["acks"] == "1"
    assert cfg["enable.idempotence"] == "false"
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["settings"] == {"acks": "1", "enable.idempotence": "false"}


def test_allow_unsafe_for_one_key_does_not_allow_another() -> None:
    with pytest.raises(UnsafeConfigError) as info:
        producer_config(
            {**BASE, "acks": 1, "enable.idempotence": False, "retries": 0},
            allow_unsafe=["acks", "enable.idempotence"],
        )
    assert info.value.key == "retries"


def test_allowed_max_in_flight_still_conflicts_with_idempotence() -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, "max.in.flight": 10}, allow_unsafe=["max.in.flight"])
    assert not isinstance(info.value, UnsafeConfigError)
    assert info.value.key == "max.in.flight"
    assert "<= 5" in str(info.value)


def test_allow_unsafe_matches_aliases_and_a_plain_string() -> None:
    cfg = producer_config(
        {**BASE, "request.required.acks": 1, "enable.idempotence": False},
        allow_unsafe=("acks", "enable.idempotence"),
    )
    assert cfg["request.required.acks"] == "1"
    cfg = producer_config(
        {**BASE, "statistics.interval.ms": 0}, allow_unsafe="statistics.interval.ms"
    )
    assert cfg["statistics.interval.ms"] == "0"


def test_allow_unsafe_with_a_typo_is_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        producer_config(BASE, allow_unsafe=("akcs",))
    assert info.value.key == "akcs"


def test_no_warning_without_an_unsafe_value() -> None:
    with capture_logs() as logs:
        producer_config(BASE, allow_unsafe=("acks",))
    assert [e for e in logs if e["log_level"] == "warning"] == []


def test_allow_unsafe_acks_implies_idempotence_off_with_exactly_one_warning() -> None:
    """Issue 22.5: the documented opt-out raised ConfigError (acks must be all while
    idempotence is on). Allowing a weaker acks now turns the (default) idempotence off, and
    the one warning names both settings."""
    with capture_logs() as logs:
        cfg = producer_config({**BASE, "acks": 1}, allow_unsafe=("acks",))
    assert cfg["acks"] == "1"
    assert cfg["enable.idempotence"] == "false"
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert warnings[0]["settings"] == {"acks": "1", "enable.idempotence": "false"}
    assert "implied by acks=1" in warnings[0]["note"]


def test_allow_unsafe_acks_with_idempotence_already_off_is_one_warning_too() -> None:
    with capture_logs() as logs:
        cfg = producer_config(
            {**BASE, "request.required.acks": 0, "enable.idempotence": False},
            allow_unsafe=("acks",),
        )
    assert (cfg["request.required.acks"], cfg["enable.idempotence"]) == ("0", "false")
    [warning] = [e for e in logs if e["log_level"] == "warning"]
    assert warning["settings"] == {"request.required.acks": "0", "enable.idempotence": "false"}


def test_weaker_acks_with_explicit_idempotence_is_a_conflict_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, "acks": 1, "enable.idempotence": True}, allow_unsafe=("acks",))
    assert not isinstance(info.value, UnsafeConfigError)
    assert info.value.key == "acks"
    assert "enable.idempotence" in str(info.value)


def test_weaker_acks_without_allow_unsafe_is_still_refused() -> None:
    with pytest.raises(UnsafeConfigError) as info:
        producer_config({**BASE, "acks": 1})
    assert info.value.key == "acks"


def test_allowed_acks_does_not_silence_a_transactional_conflict() -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, "acks": 1, "transactional.id": "tx"}, allow_unsafe=("acks",))
    assert info.value.key == "enable.idempotence"


@pytest.mark.parametrize("build", [producer_config, consumer_config])
def test_missing_bootstrap_servers_is_refused_naming_the_key(build: Any) -> None:
    """Issue 22.8: ResilientProducer({}) was accepted and waited for a cluster it could not
    name."""
    user: dict[str, Any] = {} if build is producer_config else {"group.id": "g"}
    with pytest.raises(ConfigError) as info:
        build(user)
    assert info.value.key == "bootstrap.servers"
    assert "bootstrap.servers" in str(info.value)
    with pytest.raises(ConfigError) as info:
        build({**user, "metadata.broker.list": " "})
    assert info.value.key == "metadata.broker.list"


def test_mock_cluster_and_alias_need_no_bootstrap_servers() -> None:
    cfg = producer_config({"test.mock.num.brokers": 3})
    assert "bootstrap.servers" not in cfg
    assert producer_config({"metadata.broker.list": "h:1"})["metadata.broker.list"] == "h:1"
    assert consumer_config({"test.mock.num.brokers": 1, "group.id": "g"})["group.id"] == "g"


@pytest.mark.parametrize(
    ("user", "key", "fragment"),
    [
        ({"acks": "all", "bogus.setting": 1}, "bogus.setting", "unknown"),
        ({"enable.idempotense": True}, "enable.idempotense", "'enable.idempotence'"),
        ({"max.block.ms": 100}, "max.block.ms", "Java producer"),
        ({"group.id": "g"}, "group.id", "consumer property"),
        ({"enable.auto.commit": False}, "enable.auto.commit", "consumer property"),
        ({"linger.ms": "soon"}, "linger.ms", "invalid value"),
        ({"message.max.bytes": 10}, "message.max.bytes", "minimum"),
        ({"compression.type": "brotli"}, "compression.type", "expected one of"),
        ({"linger.ms": 200_000, "message.timeout.ms": 100_000}, "linger.ms", "lower than"),
        ({"queue.buffering.max.ms": 120_000}, "queue.buffering.max.ms", "lower than"),
        ({"queuing.strategy": "lifo"}, "queuing.strategy", "fifo"),
        ({"acks": 1, "request.required.acks": "all"}, "request.required.acks", "same property"),
        ({"topic.metadata.refresh.interval.ms": -1}, "topic.metadata.refresh.interval.ms", "-1"),
        ({"topic.metadata.refresh.interval.ms": 0}, "topic.metadata.refresh.interval.ms", "disab"),
        (
            {"topic.metadata.refresh.interval.ms": 4_000_000},
            "topic.metadata.refresh.interval.ms",
            "maximum",
        ),
        ({"metadata.max.age.ms": 0}, "metadata.max.age.ms", "minimum"),
        ({"metadata.max.age.ms": 60_000}, "metadata.max.age.ms", "shorter"),
        ({"delivery.report.only.error": True}, "delivery.report.only.error", "delivery report"),
        (
            {"reconnect.backoff.ms": 5000, "reconnect.backoff.max.ms": 100},
            "reconnect.backoff.max.ms",
            ">=",
        ),
        (
            {"transactional.id": "t", "message.timeout.ms": 90_000},
            "message.timeout.ms",
            "transaction.timeout.ms",
        ),
        ({"default.topic.config": {"acks": "all"}}, "default.topic.config", "top level"),
        ({"linger.ms": object()}, "linger.ms", "expected a string"),
    ],
)
def test_bad_producer_settings_raise_config_error_naming_the_key(
    user: dict[str, Any], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, **user})
    assert info.value.key == key
    assert fragment in str(info.value)


def test_metadata_settings_within_bounds_are_accepted() -> None:
    cfg = producer_config(
        {**BASE, "topic.metadata.refresh.interval.ms": 60_000, "metadata.max.age.ms": 180_000}
    )
    assert cfg["topic.metadata.refresh.interval.ms"] == "60000"
    assert cfg["metadata.max.age.ms"] == "180000"


def test_transactional_id_keeps_librdkafkas_derived_message_timeout() -> None:
    cfg = producer_config({**BASE, "transactional.id": "tx-1"})
    assert "message.timeout.ms" not in cfg
    with pytest.raises(ConfigError) as info:
        producer_config(
            {**BASE, "transactional.id": "tx-1", "enable.idempotence": False},
            allow_unsafe=["enable.idempotence"],
        )
    assert info.value.key == "enable.idempotence"


def test_callbacks_pass_through_untouched() -> None:
    def cb(*_args: Any) -> None:
        return None

    cfg = producer_config({**BASE, "error_cb": cb, "on_delivery": cb, "stats_cb": cb})
    assert cfg["error_cb"] is cb and cfg["on_delivery"] is cb and cfg["stats_cb"] is cb


def test_non_mapping_and_non_string_keys_are_refused() -> None:
    with pytest.raises(ConfigError):
        producer_config([("acks", "all")])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        producer_config({**BASE, 5: "x"})  # type: ignore[dict-item]


# --------------------------------------------------------------------------- consumer


def test_consumer_defaults_store_offsets_only_after_processing() -> None:
    user = dict(GROUP)
    cfg = consumer_config(user)
    assert user == GROUP
    assert cfg["enable.auto.offset.store"] == "false"
    assert cfg["enable.auto.commit"] == "true"
    assert cfg["auto.offset.reset"] == "earliest"
    assert cfg["partition.assignment.strategy"] == "cooperative-sticky"
    assert cfg["isolation.level"] == "read_committed"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("enable.auto.offset.store", True),
        ("auto.offset.reset", "latest"),
        ("auto.offset.reset", "largest"),
        ("isolation.level", "read_uncommitted"),
        ("statistics.interval.ms", 0),
    ],
)
def test_weakening_consumer_settings_are_refused(key: str, value: Any) -> None:
    with pytest.raises(UnsafeConfigError) as info:
        consumer_config({**GROUP, key: value})
    assert info.value.key == key


def test_auto_offset_store_is_fine_when_auto_commit_is_off() -> None:
    cfg = consumer_config({**GROUP, "enable.auto.commit": False, "enable.auto.offset.store": True})
    assert cfg["enable.auto.offset.store"] == "true"


@pytest.mark.parametrize(
    ("user", "key"),
    [
        ({"bootstrap.servers": "x"}, "group.id"),
        ({**GROUP, "acks": "all"}, "acks"),
        ({**GROUP, "linger.ms": 5}, "linger.ms"),
        (
            {**GROUP, "partition.assignment.strategy": "range,cooperative-sticky"},
            "partition.assignment.strategy",
        ),
        (
            {**GROUP, "group.protocol": "consumer", "session.timeout.ms": 10_000},
            "session.timeout.ms",
        ),
        (
            {**GROUP, "group.protocol": "consumer", "partition.assignment.strategy": "range"},
            "partition.assignment.strategy",
        ),
        (
            {**GROUP, "max.poll.interval.ms": 10_000, "session.timeout.ms": 45_000},
            "max.poll.interval.ms",
        ),
        ({**GROUP, "fetch.max.bytes": 1000, "message.max.bytes": 2000}, "fetch.max.bytes"),
        ({**GROUP, "topic.metadata.refresh.interval.ms": -1}, "topic.metadata.refresh.interval.ms"),
    ],
)
def test_bad_consumer_settings_raise_config_error_naming_the_key(
    user: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as info:
        consumer_config(user)
    assert info.value.key == key


def test_next_gen_group_protocol_gets_no_assignor_default() -> None:
    cfg = consumer_config({**GROUP, "group.protocol": "consumer"})
    assert "partition.assignment.strategy" not in cfg


# --------------------------------------------------------------------------- secrets

SECRETS = {
    "sasl.password": "hunter2-sasl",
    "ssl.key.password": "hunter2-sslkey",
    "sasl.oauthbearer.client.secret": "hunter2-oauth",
    "ssl.keystore.password": "hunter2-keystore",
}


def test_secret_keys_cover_the_documented_ones() -> None:
    for key in (*SECRETS, "sasl.oauthbearer.config", "ssl.key.pem", "sasl.jaas.config"):
        assert key in SECRET_KEYS
        assert is_secret(key)
    assert not is_secret("sasl.username")
    assert not is_secret("bootstrap.servers")


def test_redact_hides_every_secret_value() -> None:
    cfg = {**BASE, "sasl.username": "alice", **SECRETS}
    out = redact(cfg)
    assert out["sasl.username"] == "alice"
    for key, value in SECRETS.items():
        assert out[key] == REDACTED
        assert value not in repr(out)
    assert cfg["sasl.password"] == "hunter2-sasl"  # the input is untouched


def test_secret_values_never_appear_in_config_errors_or_warnings() -> None:
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, "sasl.password": "hunter2-sasl", "bogus.key": 1})
    assert "hunter2" not in str(info.value) and "hunter2" not in repr(info.value)
    with pytest.raises(ConfigError) as info:
        producer_config({**BASE, "sasl.oauthbearer.client.secret": object()})
    assert "object at" not in str(info.value)
    with capture_logs() as logs:
        producer_config(
            {**BASE, **SECRETS, "acks": 1, "enable.idempotence": False},
            allow_unsafe=["acks", "enable.idempotence"],
        )
    assert "hunter2" not in repr(logs)


def test_config_module_does_not_configure_structlog() -> None:
    before = structlog.get_config()
    producer_config(BASE)
    assert structlog.get_config() == before


def test_a_truncating_integer_value_is_judged_not_a_crash() -> None:
    """acks=0.0 passes check_value (librdkafka reads "0.0" as 0) but _parse called
    int("0.0") and raised a bare ValueError (found by the lint fuzz test once lint ran the
    runtime's refusal table): it is acks=0, refused as unsafe, naming the key."""
    from kresilient.errors import UnsafeConfigError

    with pytest.raises(UnsafeConfigError) as info:
        producer_config({"bootstrap.servers": "a:9092", "acks": 0.0})
    assert info.value.key == "acks"


def test_a_value_check_value_lets_through_never_raises_a_bare_valueerror() -> None:
    """ "0,none" passes librdkafka's strtol-style check (read as 0); _parse raised a bare
    ValueError on it (found by the lint fuzz test, a YAML list [0, null] for acks)."""
    from kresilient.errors import UnsafeConfigError

    with pytest.raises(UnsafeConfigError) as info:
        producer_config({"bootstrap.servers": "a:9092", "acks": "0,none"})
    assert info.value.key == "acks"
