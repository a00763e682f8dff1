"""ResilientConsumer pieces that need no broker: config refusal, policies, bookkeeping.

The guarantees themselves (commit after processing, retries without rebalance, dead letters)
are proven on the real cluster in tests/test_consumer_integration.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import tenacity
from confluent_kafka import KafkaError, Message, TopicPartition
from confluent_kafka.error import KeyDeserializationError, ValueDeserializationError

from kresilient.consumer import NOT_RETRIED, ResilientConsumer, RetryPolicy
from kresilient.consumer._holds import Hold, Verdict
from kresilient.consumer._offsets import OffsetKeeper
from kresilient.consumer._support import BatchItemError, Deserializing
from kresilient.errors import CommitError, ConfigError, DeadLetterError, UnsafeConfigError
from kresilient.telemetry import Telemetry

NOWHERE = {"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"}


def _handler(_msg: Any) -> None:
    return None


@pytest.fixture(name="make")
def _make() -> Iterator[Any]:
    made: list[ResilientConsumer] = []

    def make(config: dict[str, Any], **kw: Any) -> ResilientConsumer:
        consumer = ResilientConsumer(config, ["t"], kw.pop("handler", _handler), **kw)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def test_safe_defaults(make: Any) -> None:
    cfg = make(dict(NOWHERE))._rdk_config
    assert cfg["enable.auto.offset.store"] == "false"
    assert cfg["auto.offset.reset"] == "earliest"
    assert cfg["partition.assignment.strategy"] == "cooperative-sticky"
    assert cfg["enable.auto.commit"] == "true"


def test_auto_offset_store_is_refused_even_when_allowed() -> None:
    for allow in ((), ("enable.auto.offset.store",)):
        with pytest.raises(UnsafeConfigError) as info:
            ResilientConsumer(
                {**NOWHERE, "enable.auto.offset.store": True}, ["t"], _handler, allow_unsafe=allow
            )
        assert info.value.key == "enable.auto.offset.store"


def test_latest_reset_is_refused_unless_allowed(make: Any) -> None:
    with pytest.raises(UnsafeConfigError) as info:
        make({**NOWHERE, "auto.offset.reset": "latest"})
    assert info.value.key == "auto.offset.reset"
    consumer = make({**NOWHERE, "auto.offset.reset": "latest"}, allow_unsafe=["auto.offset.reset"])
    assert consumer._rdk_config["auto.offset.reset"] == "latest"


def test_manual_commit_mode_is_accepted(make: Any) -> None:
    consumer = make({**NOWHERE, "enable.auto.commit": False})
    assert consumer._auto_commit is False


def test_group_id_required() -> None:
    with pytest.raises(ConfigError) as info:
        ResilientConsumer({"bootstrap.servers": "127.0.0.1:9"}, ["t"], _handler)
    assert info.value.key == "group.id"


def test_exactly_one_handler() -> None:
    with pytest.raises(ConfigError):
        ResilientConsumer(NOWHERE, ["t"])
    with pytest.raises(ConfigError):
        ResilientConsumer(NOWHERE, ["t"], _handler, batch_handler=lambda ms: None)


def test_config_is_not_mutated(make: Any) -> None:
    config = dict(NOWHERE)
    make(config)
    assert config == NOWHERE


def test_health_before_run(make: Any) -> None:
    health = make(dict(NOWHERE)).health()
    assert health.running is False and health.processed == 0
    assert health.rebalances == {"assigned": 0, "revoked": 0, "lost": 0}
    assert health.as_dict()["processed"] == 0
    with pytest.warns(DeprecationWarning, match="as_dict"):
        assert health["processed"] == 0  # the 0.1 dict access, for one minor version
    with pytest.warns(DeprecationWarning), pytest.raises(KeyError):
        health["nope"]
    with pytest.warns(DeprecationWarning):
        assert "processed" in health and health.get("retries") == 0
    with pytest.warns(DeprecationWarning):
        assert dict(health)["group_id"] == "unit"  # type: ignore[call-overload]


def test_batch_item_error_is_the_one_in_errors() -> None:
    import kresilient.consumer
    import kresilient.errors

    assert kresilient.consumer.BatchItemError is kresilient.errors.BatchItemError
    assert BatchItemError is kresilient.errors.BatchItemError


def test_no_mixins_in_the_consumer() -> None:
    import kresilient.consumer._consumer as module

    assert not [c.__name__ for c in module.ResilientConsumer.__mro__ if "Mixin" in c.__name__]
    assert module.ResilientConsumer.__mro__[1] is object


def _attempt(policy: RetryPolicy, exc: BaseException, attempt: int) -> tuple[bool, bool, float]:
    retrying = policy.retrying()
    state = tenacity.RetryCallState(retrying, None, (), {})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return bool(retrying.retry(state)), bool(retrying.stop(state)), float(retrying.wait(state))


def test_default_retry_policy() -> None:
    policy = RetryPolicy()
    for exc in (
        ValueError(),
        json.JSONDecodeError("x", "", 0),
        TypeError(),
        ValueDeserializationError(exception=ValueError()),
    ):
        assert isinstance(exc, NOT_RETRIED)
        assert _attempt(policy, exc, 1)[0] is False
    assert _attempt(policy, RuntimeError(), 1) == (True, False, 0.2)
    assert _attempt(policy, RuntimeError(), 4)[1] is False
    assert _attempt(policy, RuntimeError(), 5)[1] is True


def test_custom_retry_policy_composes() -> None:
    policy = RetryPolicy(
        stop=tenacity.stop_never,
        wait=tenacity.wait_fixed(3),
        retry=tenacity.retry_if_exception_type(TimeoutError),
    )
    assert _attempt(policy, TimeoutError(), 1000) == (True, False, 3.0)
    assert _attempt(policy, RuntimeError(), 1)[0] is False
    assert policy.replace(wait=tenacity.wait_fixed(1)).wait is not policy.wait


def _msg(offset: int = 0, key: bytes = b"k", value: bytes = b'{"a": 1}') -> Message:
    return Message(topic="t", partition=0, offset=offset, key=key, value=value, headers=None)


def test_deserializing_keeps_raw_bytes() -> None:
    seen: list[Any] = []
    wrapper = Deserializing(
        seen.append, lambda b, _c: (b or b"").decode(), lambda b, _c: json.loads(b or b"")
    )
    msg = _msg()
    wrapper(msg)
    assert seen[0].key() == "k" and seen[0].value() == {"a": 1}
    assert wrapper.raw_bytes(msg) == (b"k", b'{"a": 1}')
    assert wrapper.raw_bytes(_msg()) is None


def test_deserializer_failures_are_classified_serialization_errors() -> None:
    wrapper = Deserializing(_handler, None, lambda b, _c: json.loads(b or b""))
    bad = _msg(value=b"\x00not json")
    with pytest.raises(ValueDeserializationError):
        wrapper(bad)
    assert wrapper.raw_bytes(bad) == (b"k", b"\x00not json")
    keyed = Deserializing(_handler, lambda b, _c: 1 / 0, None)
    with pytest.raises(KeyDeserializationError):
        keyed(_msg())


def test_batch_deserialization_failure_names_the_item() -> None:
    handled: list[list[Any]] = []
    wrapper = Deserializing(handled.append, None, lambda b, _c: json.loads(b or b""))
    msgs = [_msg(0), _msg(1), _msg(2, value=b"bad"), _msg(3)]
    with pytest.raises(BatchItemError) as info:
        wrapper.call_batch(msgs)
    assert info.value.index == 2
    assert isinstance(info.value.failure(), ValueDeserializationError)
    assert [m.offset() for m in handled[0]] == [0, 1]  # the good prefix was handled
    assert wrapper.raw_bytes(msgs[2]) == (b"k", b"bad")


def test_hold_verdicts() -> None:
    hold = Hold(tp=("t", 0), offset=5)
    assert hold.verdict(5) is Verdict.SKIP  # still paused: anything is stale
    hold.resumed = True
    assert hold.verdict(5) is Verdict.RETRY
    assert hold.verdict(9) is Verdict.RELEASE


def test_dead_letter_producer_config_keeps_connection_settings_only() -> None:
    """The consumer's own dead-letter producer is configured by the one shared derivation."""
    from kresilient.deadletter import dead_letter_producer_config

    config = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "group.id": "g",
        "auto.offset.reset": "earliest",
        "error_cb": print,
        "client.id": "svc",
    }
    out = dead_letter_producer_config(config, client_id="svc")
    for key in ("bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.username"):
        assert out[key] == config[key]
    assert out["client.id"] == "svc-dlq" and out["acks"] == "all"
    assert not {"group.id", "auto.offset.reset", "error_cb"} & set(out)


# --------------------------------------------------------------------------- OffsetKeeper


class _FakeConsumer:
    def __init__(self) -> None:
        self.stored: list[tuple[str, int, int]] = []
        self.commit_error: KafkaError | None = None

    def store_offsets(self, message: Any = None, offsets: Any = None) -> None:
        if message is not None:
            self.stored.append((message.topic(), message.partition(), message.offset() + 1))
        for tp in offsets or ():
            self.stored.append((tp.topic, tp.partition, tp.offset))

    def commit(self, asynchronous: bool = True) -> list[TopicPartition]:
        from confluent_kafka import KafkaException

        if self.commit_error is not None:
            raise KafkaException(self.commit_error)
        return []


class _Handle:
    def __init__(self) -> None:
        self.state: str = "pending"

    def done(self) -> bool:
        return self.state != "pending"

    def exception(self, timeout: float | None = None) -> Any:
        if self.state == "failed":
            from kresilient.errors import ProduceError

            return ProduceError("nope", code=KafkaError._MSG_TIMED_OUT)
        return None


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append((event, kw))


def _keeper() -> tuple[OffsetKeeper, _FakeConsumer, _Log]:
    consumer, log = _FakeConsumer(), _Log()
    keeper = OffsetKeeper(consumer, log, Telemetry(), lambda t: t + ".dlq")  # type: ignore[arg-type]
    return keeper, consumer, log


def test_offsets_wait_for_dead_letter_acknowledgement() -> None:
    keeper, consumer, _ = _keeper()
    tp = ("t", 0)
    keeper.store(tp, 10)  # processed up to 9, 10 failed
    first, second = _Handle(), _Handle()
    keeper.add_dead_letters(tp, 10, [first], 11)
    keeper.store_last({tp: _msg(20)})  # 11..20 processed meanwhile
    keeper.store(tp, 25)  # 21..24 processed, 25 failed
    keeper.add_dead_letters(tp, 25, [second], 26)
    keeper.store_last({tp: _msg(30)})
    assert consumer.stored == [("t", 0, 10)]  # nothing past the unacknowledged dead letter
    keeper.release()
    assert consumer.stored == [("t", 0, 10)]
    second.state = "ok"
    keeper.release()
    assert consumer.stored == [("t", 0, 10)]  # the older one still holds the offset
    first.state = "ok"
    keeper.release()
    assert consumer.stored[-1] == ("t", 0, 31) and not keeper.pending
    assert keeper.dead_lettered == 2
    keeper.store_last({tp: _msg(40)})
    assert consumer.stored[-1] == ("t", 0, 41)


def test_offsets_partial_release_stores_up_to_the_oldest_pending() -> None:
    keeper, consumer, _ = _keeper()
    tp = ("t", 0)
    first, second = _Handle(), _Handle()
    keeper.add_dead_letters(tp, 3, [first], 4)
    keeper.add_dead_letters(tp, 8, [second], 9)
    first.state = "ok"
    keeper.release()
    assert consumer.stored == [("t", 0, 8)]


def test_failed_dead_letter_write_raises_and_keeps_the_offset() -> None:
    keeper, consumer, _ = _keeper()
    handle = _Handle()
    keeper.add_dead_letters(("t", 1), 5, [handle], 6)
    handle.state = "failed"
    with pytest.raises(DeadLetterError) as info:
        keeper.release()
    assert info.value.topic == "t.dlq"
    assert consumer.stored == []


def test_commit_failures_are_classified_and_logged() -> None:
    keeper, consumer, log = _keeper()
    consumer.commit_error = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
    keeper.commit_sync("revoke")
    assert keeper.commit_failures == 1
    assert isinstance(keeper.last_commit_error, CommitError)
    event, fields = log.events[-1]
    assert event == "offset_commit_failed" and fields["reason"] == "revoke"
    assert fields["error"] == "REBALANCE_IN_PROGRESS"
    consumer.commit_error = KafkaError(KafkaError._NO_OFFSET)  # nothing to commit: benign
    keeper.commit_sync("close")
    keeper.on_commit(KafkaError(KafkaError._NO_OFFSET), [])
    assert keeper.commit_failures == 1
    keeper.on_commit(None, [TopicPartition("t", 0, 5)])
    failed = TopicPartition("t", 0, 5)
    keeper.on_commit(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE), [failed])
    assert keeper.commit_failures == 2
