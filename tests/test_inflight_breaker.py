"""The dead-letter circuit breaker with many records in flight (issue 40), on the real cluster.

The in-flight consumer (``ordering="key"``) writes its dead letters through the same
``write_dead_letter`` as the per-partition consumer, and a breaker that opens says so with the
same notable event (``kafka_dead_letter_circuit_breaker_opened``, which the keyed path did not
emit before). Control: the same flood without a breaker dead-letters every poison record and
emits no such event.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _producer_helpers import read_back
from confluent_kafka import Message
from structlog.testing import capture_logs
from test_consumer_integration import (
    Runner,
    TopicFactory,
    config,
    ends,
    produce,
    wait_for,
    with_dlq,
)

from kresilient import CircuitBreakerOpenError, CircuitBreakerPolicy
from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.telemetry.names import LOG_CIRCUIT_BREAKER_OPENED
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

KEYED: dict[str, Any] = {
    "ordering": "key",
    "max_in_flight": 8,
    "max_process_deaths": None,
    "outage_retry": None,
    "install_signal_handlers": False,
}


def _handle(msg: Message) -> None:
    json.loads(msg.value() or b"")


def test_keyed_breaker_opens_on_a_poison_flood_and_says_so(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    values = [b"{}"] * 20 + [b"poison"] * 200
    produce(bootstrap, topic, [(str(i % 7).encode(), v, None, None) for i, v in enumerate(values)])
    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        _handle,
        circuit_breaker=CircuitBreakerPolicy(max_consecutive=10),
        **KEYED,
    )
    with capture_logs() as logs:
        runner = Runner(consumer)
        runner.join(120)
    assert isinstance(runner.error, CircuitBreakerOpenError), runner.error
    opened = [e for e in logs if e.get("event") == LOG_CIRCUIT_BREAKER_OPENED]
    assert len(opened) >= 1, [e.get("event") for e in logs]
    assert opened[0]["topic"] == topic and opened[0]["offset"] >= 20
    letters = read_back(bootstrap, dlq)
    # the breaker stopped the flood well before its end; every letter is a poison record
    assert 10 <= len(letters) < 200
    for record in letters:
        origin = parse_dead_letter_headers(record.headers())
        assert origin.original_offset >= 20 and record.value() == b"poison"


def test_keyed_flood_without_a_breaker_dead_letters_all_control(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    values = [b"{}"] * 20 + [b"poison"] * 200
    produce(bootstrap, topic, [(str(i % 7).encode(), v, None, None) for i, v in enumerate(values)])
    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        _handle,
        circuit_breaker=None,
        **KEYED,
    )
    with capture_logs() as logs:
        runner = Runner(consumer)
        wait_for(lambda: sum(ends(bootstrap, dlq).values()) >= 200, 120, "200 dead letters")
        runner.stop()
    assert runner.error is None
    assert not [e for e in logs if e.get("event") == LOG_CIRCUIT_BREAKER_OPENED]
    offsets = sorted(
        parse_dead_letter_headers(r.headers()).original_offset for r in read_back(bootstrap, dlq)
    )
    assert offsets == list(range(20, 220))
