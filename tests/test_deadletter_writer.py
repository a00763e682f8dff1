"""DeadLetterWriter (kresilient.deadletter): the one dead-letter writer, its config, and its
failure paths. Config derivation is pure logic; every write is against the real 3-node cluster.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from _producer_helpers import read_back
from confluent_kafka import Producer
from structlog.testing import capture_logs

from kresilient.deadletter import (
    DeadLetterHandle,
    DeadLetterRecord,
    DeadLetterWriter,
    dead_letter_producer_config,
)
from kresilient.errors import ConfigError, DeadLetterError, DeliveryError, ErrorCategory
from kresilient.testing import KafkaCluster

# --------------------------------------------------------------------------- config (pure)

CONSUMER_CONFIG: dict[str, Any] = {
    "bootstrap.servers": "127.0.0.1:9092",
    "group.id": "orders",
    "client.id": "orders-consumer",
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "session.timeout.ms": 45000,
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "svc",
    "sasl.password": "very-secret-password",
    "on_commit": print,
}


def test_config_from_a_consumer_keeps_connection_and_security_drops_consumer_keys() -> None:
    cfg = dead_letter_producer_config(CONSUMER_CONFIG)
    for key in ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username"):
        assert cfg[key] == CONSUMER_CONFIG[key]
    assert cfg["sasl.password"] == "very-secret-password"  # needed to connect
    for key in ("group.id", "enable.auto.commit", "auto.offset.reset", "session.timeout.ms"):
        assert key not in cfg
    assert "on_commit" not in cfg
    assert (cfg["acks"], cfg["enable.idempotence"]) == ("all", "true")
    assert cfg["client.id"] == "orders-consumer-dlq"


def test_config_from_a_producer_forces_the_guarantees_and_drops_its_identity() -> None:
    cb = print
    user = {
        "bootstrap.servers": "h:1",
        "acks": "1",
        "enable.idempotence": False,
        "transactional.id": "tx-orders",  # sharing it would fence the user's producer
        "linger.ms": 20,
        "compression.type": "lz4",
        "error_cb": cb,
        "on_delivery": cb,
        "oauth_cb": cb,  # needed to authenticate: kept
    }
    cfg = dead_letter_producer_config(user, client_id="p", message_max_bytes=8_000_000)
    assert (cfg["acks"], cfg["enable.idempotence"]) == ("all", "true")
    assert "transactional.id" not in cfg and "error_cb" not in cfg and "on_delivery" not in cfg
    assert cfg["oauth_cb"] is cb
    assert cfg["linger.ms"] == "20" and cfg["compression.type"] == "lz4"
    assert cfg["message.max.bytes"] == "8000000" and cfg["client.id"] == "p-dlq"
    assert user["acks"] == "1" and "client.id" not in user  # the caller's dict is untouched


def test_overrides_apply_but_cannot_weaken_the_forced_settings() -> None:
    cfg = dead_letter_producer_config({"bootstrap.servers": "h:1"}, overrides={"linger.ms": 1})
    assert cfg["linger.ms"] == "1"
    for key, value in (("acks", 1), ("request.required.acks", "0"), ("enable.idempotence", False)):
        with pytest.raises(ConfigError) as info:
            dead_letter_producer_config({"bootstrap.servers": "h:1"}, overrides={key: value})
        assert info.value.key == key


def test_unsafe_settings_the_user_accepted_pass_through() -> None:
    user = {"bootstrap.servers": "h:1", "enable.ssl.certificate.verification": False}
    cfg = dead_letter_producer_config(user, allow_unsafe=("enable.ssl.certificate.verification",))
    assert cfg["enable.ssl.certificate.verification"] == "false"


def test_writer_config_and_repr_never_show_secrets(kafka_cluster: KafkaCluster) -> None:
    with DeadLetterWriter(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, "sasl.password": "pw-1234567890"}
    ) as writer:
        assert writer.config["sasl.password"] == "[REDACTED]"
        assert "pw-1234567890" not in repr(writer)


# --------------------------------------------------------------------------- real cluster


def _writer(cluster: KafkaCluster, **kw: Any) -> DeadLetterWriter:
    overrides = kw.pop("overrides", None)
    return DeadLetterWriter(
        {"bootstrap.servers": cluster.bootstrap_servers}, overrides=overrides, **kw
    )


def _record(topic: str, i: int = 0, **kw: Any) -> DeadLetterRecord:
    headers = kw.pop(
        "headers",
        [
            ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ("dup", b"1"),
            ("dup", b"2"),
            ("none", None),
            ("kresilient.original.topic", b"orders"),
        ],
    )
    return DeadLetterRecord(
        topic=topic, key=b"k%d" % i, value=b"\x00\xffvalue-%d" % i, headers=headers, **kw
    )


@pytest.mark.integration
def test_records_are_written_byte_for_byte_and_acknowledged(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    seen: list[DeadLetterHandle] = []
    # an hour ago: older than the topic's retention (7 days), a record is deleted by the next
    # retention check (every 60 s here) before it is read back
    hour_ago_ms = (int(time.time()) - 3600) * 1000
    with _writer(kafka_cluster) as writer:
        handles = [
            writer.write(_record(topic, i, timestamp=hour_ago_ms + i), on_delivery=seen.append)
            for i in range(20)
        ]
        assert writer.pending + sum(h.done() for h in handles) == 20
        writer.flush(30)
        assert writer.pending == 0 and writer.written == 20 and writer.failed == 0
        offsets = [h.result(0).offset for h in handles]
    assert offsets == list(range(20))
    assert seen == handles  # each callback once, in order, after acknowledgement
    records = read_back(kafka_cluster.bootstrap_servers, topic)
    assert [m.value() for m in records] == [b"\x00\xffvalue-%d" % i for i in range(20)]
    assert [m.key() for m in records] == [b"k%d" % i for i in range(20)]
    assert [m.timestamp()[1] for m in records] == [hour_ago_ms + i for i in range(20)]
    # headers exactly as given: order, duplicates, None values, the original traceparent
    assert records[0].headers() == _record(topic).headers


@pytest.mark.integration
def test_a_failed_write_is_reported_by_flush_with_its_topic_and_a_negative_control(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    missing = f"{topic}-never-created"
    # The missing topic is given up on after 1 s (UNKNOWN_TOPIC_OR_PART); the write to the existing
    # topic keeps the default delivery timeout (at 2 s a loaded machine could time it out).
    with _writer(kafka_cluster, overrides={"topic.metadata.propagation.max.ms": 1000}) as writer:
        ok = writer.write(_record(topic))
        writer.flush(30)  # negative control: the same writer, an existing topic: no error
        assert ok.result(0).topic == topic
        bad = writer.write(_record(missing))
        with pytest.raises(DeliveryError) as info:
            writer.flush(30)
        [failure] = info.value.failures
        assert failure.topic == missing
        assert failure.classification.name == "UNKNOWN_TOPIC_OR_PART"
        assert missing in str(info.value)
        error = bad.exception(0)
        assert isinstance(error, DeadLetterError) and error.topic == missing
        with pytest.raises(DeadLetterError):
            bad.result(0)
        writer.flush(5)  # reported once: the next flush is clean


@pytest.mark.integration
def test_flush_keeps_failures_when_the_underlying_flush_raises(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """Issue 11 defect 4, in the writer: failures served by a flush that then raises are in the
    DeliveryError raised from it, not dropped. The injected fault is the negative control:
    the raised error chains it (the fault was real)."""
    missing = f"{topic}-never-created"
    writer = _writer(kafka_cluster, overrides={"message.timeout.ms": 1500})
    real = writer._producer

    class Raising:
        def __init__(self) -> None:
            self.raised = 0

        def flush(self, timeout: float) -> int:
            real.flush(timeout)  # serves the failure report
            self.raised += 1
            raise RuntimeError("injected: flush failed after serving reports")

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def __len__(self) -> int:
            return len(real)

    handle = writer.write(_record(missing))
    raising = Raising()
    writer._producer = raising  # type: ignore[assignment]
    with pytest.raises(DeliveryError) as info:
        writer.flush(30)
    assert raising.raised == 1
    assert isinstance(info.value.__cause__, RuntimeError)
    assert [f.topic for f in info.value.failures] == [missing]
    assert "injected" in str(info.value)
    assert handle.done() and handle.exception(0) is not None
    writer._producer = real
    writer.close(5)


@pytest.mark.integration
def test_backpressure_is_bounded_then_classified_and_a_negative_control(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    missing = f"{topic}-never-created"
    overrides = {"queue.buffering.max.messages": 1}
    # negative control: a full queue that drains (existing topic) waits and succeeds
    with _writer(kafka_cluster, overrides=overrides, backpressure_timeout=30) as writer:
        handles = [writer.write(_record(topic, i)) for i in range(5)]
        writer.flush(30)
        assert all(h.result(0).topic == topic for h in handles)
    # a queue held full (the record waits for a topic that never comes): refused in bound
    writer = _writer(
        kafka_cluster,
        overrides={"queue.buffering.max.messages": 1, "message.timeout.ms": 60000},
        backpressure_timeout=0.5,
    )
    first = writer.write(_record(missing))
    with pytest.raises(DeadLetterError) as info:
        writer.write(_record(missing, 1))
    # refused while the first record still occupied the queue: the bound was
    # backpressure_timeout, not the record's 60 s message timeout
    assert not first.done() and writer.pending == 1
    assert info.value.classification.category is ErrorCategory.BACKPRESSURE
    assert info.value.topic == missing
    with pytest.raises(DeliveryError):
        writer.close(0.5)  # the first is purged and reported, not abandoned
    assert first.exception(0) is not None


@pytest.mark.integration
def test_close_reports_unacknowledged_writes_as_purged_never_silently(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    missing = f"{topic}-never-created"
    writer = _writer(kafka_cluster, overrides={"message.timeout.ms": 60000})
    handles = [writer.write(_record(missing, i)) for i in range(3)]
    with pytest.raises(DeliveryError) as info:
        writer.close(0.5)
    assert len(info.value.failures) == 3
    assert {f.classification.name for f in info.value.failures} <= {
        "_PURGE_QUEUE",
        "_PURGE_INFLIGHT",
    }
    assert all(h.done() and h.exception(0) is not None for h in handles)
    assert writer.pending == 0 and writer.failed == 3
    with pytest.raises(DeadLetterError, match="closed"):
        writer.write(_record(topic))
    writer.close()  # idempotent


@pytest.mark.integration
def test_oversized_record_is_refused_with_a_classified_error(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    with _writer(kafka_cluster, message_max_bytes=2000) as writer:
        with pytest.raises(DeadLetterError) as info:
            writer.write(DeadLetterRecord(topic=topic, key=None, value=b"x" * 5000, headers=[]))
        assert info.value.classification.name == "MSG_SIZE_TOO_LARGE"
        assert writer.pending == 0
        writer.write(DeadLetterRecord(topic=topic, key=None, value=b"x" * 500, headers=[]))


@pytest.mark.integration
def test_handle_result_waits_by_serving_the_writer(kafka_cluster: KafkaCluster, topic: str) -> None:
    with _writer(kafka_cluster) as writer:
        handle = writer.write(_record(topic))
        assert handle.result(30).offset == 0  # no explicit poll/flush
        results: list[int] = []
        threads = [
            threading.Thread(
                target=lambda: results.append(writer.write(_record(topic)).result(30).offset)
            )
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results) == [1, 2, 3, 4]


@pytest.mark.integration
def test_secrets_echoed_by_librdkafka_never_reach_the_writers_logs(
    kafka_cluster: KafkaCluster,
) -> None:
    """A malformed sasl.oauthbearer.config makes librdkafka echo its tail in error_cb; the
    negative control shows a raw client does receive the secret in that text."""
    secret = "Sup3rSecretExtensionValue"
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "OAUTHBEARER",
        "enable.sasl.oauthbearer.unsecure.jwt": True,
        "sasl.oauthbearer.config": f"principalXX=bob extension_a={secret}",
    }
    raw_errors: list[str] = []
    raw = Producer({**config, "error_cb": lambda e: raw_errors.append(e.str())})
    deadline = time.monotonic() + 30
    while not any(secret in e for e in raw_errors) and time.monotonic() < deadline:
        raw.poll(0.2)
    assert any(secret in e for e in raw_errors), raw_errors  # the fault is real
    with capture_logs() as logs:
        writer = DeadLetterWriter(config)
        deadline = time.monotonic() + 30
        while (
            not any(e.get("event") == "dead_letter_client_error" for e in logs)
            and time.monotonic() < deadline
        ):
            writer.poll(0.2)
        writer.close(0)
    errors = [e for e in logs if e.get("event") == "dead_letter_client_error"]
    assert errors, logs
    assert secret not in repr(logs)
    assert secret[:8] not in repr(logs)
    assert any("[REDACTED]" in str(e.get("reason")) for e in errors)
