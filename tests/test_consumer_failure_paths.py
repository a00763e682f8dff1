"""Failure-path audit of ResilientConsumer (issue 11, acceptance 2): one test per row of
docs/failure-modes.md (consumer part) that no other test covers.

Each test makes the fault happen for real on the 3-node cluster and checks what happened to
the data in flight: the committed offset never passes a message that was neither handled nor
acknowledged in the dead-letter topic.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Message
from test_consumer_integration import (
    Runner,
    TopicFactory,
    committed,
    config,
    produce,
    with_dlq,
)

from kresilient.consumer import ResilientConsumer
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _ten(kafka_cluster: KafkaCluster, topic: str, poison_at: int, size: int = 10) -> None:
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k", b"x" * size if i == poison_at else b"%d" % i, None, 0) for i in range(10)],
    )


def test_handler_raising_a_base_exception_commits_exactly_what_was_processed(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """handler raises SystemExit on offset 4: run() re-raises it after the shutdown, which
    committed 0-3 (4 is not done: redelivered to the next owner)."""
    topic, _ = with_dlq(topic_factory)
    _ten(kafka_cluster, topic, -1)
    group = f"g-{uuid.uuid4().hex[:10]}"

    def handle(msg: Message) -> None:
        if msg.offset() == 4:
            raise SystemExit(3)

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    runner.join(120)
    assert isinstance(runner.error, SystemExit)
    assert committed(kafka_cluster.bootstrap_servers, group, topic, [0]) == {0: 4}


def test_rebalance_listener_raising_stops_the_consumer_after_the_revoke_commit(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A user's on_revoke listener raising (here at close, inside the client's close): it runs
    after kresilient's synchronous commit, so what was processed is committed; the failure is
    logged as a shutdown step, not hidden, and the group is left."""
    topic, _ = with_dlq(topic_factory)
    _ten(kafka_cluster, topic, -1)
    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer: ResilientConsumer
    seen: list[int] = []

    def handle(msg: Message) -> None:
        seen.append(msg.offset())  # type: ignore[arg-type]
        if len(seen) == 10:
            consumer.stop()

    def on_revoke(_parts: Any) -> None:
        raise RuntimeError("listener bug")

    events: list[dict[str, Any]] = []

    def capture(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(dict(event))
        return event

    import structlog

    log = structlog.wrap_logger(
        structlog.PrintLogger(open("/dev/null", "w")),  # noqa: SIM115
        processors=[capture, structlog.processors.KeyValueRenderer()],
    )
    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        on_revoke=on_revoke,
        logger=log,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    runner.join(120)
    assert runner.error is None
    assert committed(kafka_cluster.bootstrap_servers, group, topic, [0]) == {0: 10}
    failed = [e for e in events if e.get("event") == "shutdown_step_failed"]
    assert failed and "listener bug" in failed[0]["error"], events
    assert any(e.get("event") == "consumer_closed" for e in events)


def test_client_close_failing_still_closes_the_dead_letter_producer(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The client's close() raising is logged; the commit before it happened and the
    consumer's own dead-letter producer is still flushed and closed (its dead letter lands)."""
    from _producer_helpers import read_back

    topic, dlq = with_dlq(topic_factory)
    _ten(kafka_cluster, topic, 3, size=500)
    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer: ResilientConsumer
    seen: list[int] = []

    def handle(msg: Message) -> None:
        seen.append(msg.offset())  # type: ignore[arg-type]
        if len(seen) == 10:
            consumer.stop()
        if len(msg.value() or b"") > 100:
            raise ValueError("poison")

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        install_signal_handlers=False,
    )

    class _FailingClose:
        def __init__(self, real: Any) -> None:
            self._real = real

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

        def close(self) -> None:
            self._real.close()
            raise RuntimeError("close failed")

    consumer._consumer = _FailingClose(consumer._consumer)  # type: ignore[assignment]
    runner = Runner(consumer)
    runner.join(120)
    assert runner.error is None
    assert committed(kafka_cluster.bootstrap_servers, group, topic, [0]) == {0: 10}
    assert len(read_back(kafka_cluster.bootstrap_servers, dlq)) == 1
    assert consumer.health().dead_lettered == 1


def test_bad_dead_letter_producer_override_is_refused_at_construction() -> None:
    """A dead-letter producer override that would weaken it is a ConfigError naming the key
    when the consumer is built, not when run() starts."""
    with pytest.raises(ConfigError) as info:
        ResilientConsumer(
            {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            ["t"],
            print,
            dead_letter_producer_config={"acks": "1"},
            install_signal_handlers=False,
        )
    assert info.value.key == "acks"
