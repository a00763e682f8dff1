"""ResilientProducer without a broker: refusal, backpressure, leftovers, size limit, secrets.

Nothing listens on the bootstrap address used here (a closed port on 127.0.0.1), so every
message stays in librdkafka's local queue: the behaviours under test are local ones.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from structlog.testing import capture_logs

from kresilient.errors import (
    ConfigError,
    DeliveryError,
    ErrorCategory,
    MessageTooLargeError,
    ProduceError,
    UnsafeConfigError,
)
from kresilient.producer import DeliveryHandle, ResilientProducer


@pytest.fixture(name="offline")
def _offline(closed_port: int) -> dict[str, Any]:
    return {"bootstrap.servers": f"127.0.0.1:{closed_port}", "log_level": 0}


@pytest.fixture(name="make")
def _make(offline: dict[str, Any]) -> Iterator[Any]:
    made: list[ResilientProducer] = []

    def make(extra: dict[str, Any] | None = None, **kwargs: Any) -> ResilientProducer:
        producer = ResilientProducer({**offline, **(extra or {})}, **kwargs)
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer._closed = True  # leftovers are the point of several tests; drop quietly
        producer._producer = None


def test_unsafe_setting_is_refused_before_a_client_exists(offline: dict[str, Any]) -> None:
    with pytest.raises(UnsafeConfigError) as info:
        ResilientProducer({**offline, "acks": "0"})
    assert info.value.key == "acks"


def test_unknown_key_is_refused_naming_it(offline: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as info:
        ResilientProducer({**offline, "linger.msec": 5})
    assert info.value.key == "linger.msec"
    assert "linger.ms" in str(info.value)


def test_allowed_unsafe_setting_reaches_librdkafka(offline: dict[str, Any]) -> None:
    with capture_logs() as logs:
        producer = ResilientProducer(
            {**offline, "acks": 1, "enable.idempotence": False},
            allow_unsafe=("acks", "enable.idempotence"),
        )
    producer.close(0)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["unsafe_config_accepted"]


def test_full_queue_waits_then_raises_backpressure_and_drops_nothing(make: Any) -> None:
    producer = make({"queue.buffering.max.messages": 3}, backpressure_timeout=0.3)
    handles = [producer.produce("t", b"%d" % i) for i in range(3)]
    with pytest.raises(ProduceError) as info:
        producer.produce("t", b"fourth")
    assert info.value.classification.category is ErrorCategory.BACKPRESSURE
    assert info.value.name == "_QUEUE_FULL"
    assert producer.health().backpressure_waits == 1
    with pytest.raises(DeliveryError) as closed:
        producer.close(timeout=0)
    # Exactly the three queued messages are purged and reported: the refused fourth was never
    # queued. (Not len(producer), which also counts client events: CI once saw 4, the
    # "brokers are down" error event queued after the last poll.)
    ids = sorted(f.message_id for f in closed.value.failures)
    assert ids == sorted(h.message_id for h in handles)
    assert all(h.done() for h in handles)
    for handle in handles:
        assert isinstance(handle.exception(), ProduceError)


def test_flush_with_messages_left_raises_instead_of_reporting_success(make: Any) -> None:
    producer = make()
    handle = producer.produce("t", b"x")
    with pytest.raises(DeliveryError) as info:
        producer.flush(timeout=0.2)
    assert "still queued" in str(info.value)
    assert info.value.failures == ()
    assert not handle.done()
    with pytest.raises(TimeoutError):
        handle.result(timeout=0.1)


def test_message_timeout_is_reported_per_message_at_flush_and_not_possibly_persisted(
    make: Any,
) -> None:
    # No broker ever answered: the messages were never assigned a partition, so never sent.
    producer = make({"message.timeout.ms": 1000, "linger.ms": 0})
    seen: list[Any] = []
    handles = [
        producer.produce(
            "t",
            b"v%d" % i,
            key=b"k",
            headers=[("h", b"1")],
            on_delivery=lambda e, m: seen.append(e),
        )
        for i in range(5)
    ]
    with pytest.raises(DeliveryError) as info:
        producer.flush()
    failures = info.value.failures
    assert [f.message_id for f in failures] == [h.message_id for h in handles]
    for f in failures:
        assert f.classification.category is ErrorCategory.DELIVERY_TIMEOUT
        assert not f.classification.possibly_persisted
        assert "never sent and was not written" in f.classification.remedy
        assert f.topic == "t" and f.key == b"k" and f.value_size == 2
        assert f.headers == [("h", b"1")]
    assert len(seen) == 5 and all(e is not None for e in seen)
    with pytest.raises(ProduceError) as result:
        handles[0].result()
    assert result.value.name == "_MSG_TIMED_OUT"
    producer.flush()  # the failures were reported once; nothing is left


def test_failing_user_callback_does_not_lose_the_report(make: Any) -> None:
    producer = make({"message.timeout.ms": 500, "linger.ms": 0})

    def broken(_err: Any, _msg: Any) -> None:
        raise RuntimeError("user bug")

    with capture_logs() as logs:
        producer.produce("t", b"x", on_delivery=broken)
        with pytest.raises(DeliveryError) as info:
            producer.flush()
    assert len(info.value.failures) == 1
    assert producer.health().callback_errors == 1
    assert any(e["event"] == "callback_failed" for e in logs)


def test_value_over_message_max_bytes_fails_at_once_naming_size_and_limit(make: Any) -> None:
    producer = make({"message.max.bytes": 10_000})
    with pytest.raises(MessageTooLargeError) as info:
        producer.produce("t", b"x" * 20_000)
    assert info.value.size == 20_000
    assert info.value.limit == 10_000
    assert "20000" in str(info.value) and "10000" in str(info.value)
    assert info.value.classification.category is ErrorCategory.CONFIG
    producer.flush(timeout=1)  # nothing was queued: nothing to report


def test_produce_after_close_is_refused(make: Any) -> None:
    producer = make()
    producer.close()
    producer.close()  # idempotent
    with pytest.raises(ProduceError):
        producer.produce("t", b"x")


def test_context_manager_does_not_mask_the_original_exception(offline: dict[str, Any]) -> None:
    with (
        pytest.raises(ValueError) as info,
        ResilientProducer({**offline, "message.timeout.ms": 300}) as producer,
    ):
        producer.produce("t", b"x")
        raise ValueError("app failure")
    assert any("while closing the producer" in note for note in info.value.__notes__)


def test_handle_is_the_delivery_callback_and_reports_pending(make: Any) -> None:
    producer = make()
    handle = producer.produce("t", b"x")
    assert isinstance(handle, DeliveryHandle)
    assert handle.message_id == 1
    assert not handle.done()
    assert "pending" in repr(handle)


def test_health_before_any_statistics_asks_the_cluster_and_sees_no_broker(make: Any) -> None:
    producer = make()
    producer.produce("t", b"x")
    health = producer.health()
    assert health.produced == 1
    assert health.in_flight >= 1  # outq_len: messages plus callbacks not served yet
    assert health.brokers_up == 0  # not None: nothing answered the metadata request
    assert health.as_dict()["healthy"] is False


SECRETS = {
    "sasl.password": "hunter2-sasl",
    "ssl.key.password": "hunter2-sslkey",
    "sasl.oauthbearer.client.secret": "hunter2-oauth",
    "ssl.keystore.password": "hunter2-keystore",
}


def test_secrets_never_reach_logs_repr_or_errors(
    offline: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = {**offline, "log_level": 7, "debug": "conf", "sasl.username": "alice", **SECRETS}
    with capture_logs() as logs:
        producer = ResilientProducer({**config, "message.timeout.ms": 300})
        producer.produce("t", b"x")
        producer.poll(0.5)
        with pytest.raises(DeliveryError) as info:
            producer.close()
    text = " ".join(
        [repr(logs), caplog.text, repr(producer), str(info.value), repr(info.value.failures)]
    )
    assert "hunter2" not in text
    assert any(e["event"] == "producer_created" for e in logs)
    created = next(e for e in logs if e["event"] == "producer_created")
    assert created["config"]["sasl.password"] == "[REDACTED]"
    assert created["config"]["sasl.username"] == "alice"


def test_user_callbacks_in_the_config_are_chained_after_kresilients(
    make: Any, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Any] = []
    stats: list[str] = []
    delivered: list[Any] = []
    rdkafka_logger = logging.getLogger("test.rdkafka")
    caplog.set_level(logging.DEBUG, logger="test.rdkafka")
    producer = make(
        {
            "error_cb": errors.append,
            "stats_cb": stats.append,
            "on_delivery": lambda err, msg: delivered.append(err),
            "logger": rdkafka_logger,
            "log_level": 6,
            "statistics.interval.ms": 1000,
            "message.timeout.ms": 1500,
            "linger.ms": 0,
        }
    )
    producer.produce("t", b"x")
    with pytest.raises(DeliveryError):
        producer.flush()
    producer.poll(1.2)
    assert any(e.name() in ("_TRANSPORT", "_ALL_BROKERS_DOWN") for e in errors)
    assert stats and stats[0].startswith("{")
    assert len(delivered) == 1 and delivered[0].name() == "_MSG_TIMED_OUT"
    assert producer.health().last_error in ("_TRANSPORT", "_ALL_BROKERS_DOWN")
    assert producer.health().brokers_up == 0
    assert not producer.health().healthy
    assert any(r.name == "test.rdkafka" for r in caplog.records)
