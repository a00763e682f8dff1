"""A consumer's statistics tick, pure logic (no Kafka): one parse feeds leadership and reach.

docs/performance.md measured the consumer's statistics path at twice the producer's at 10,000
partitions because the document was parsed twice (once by the leadership monitor, once for
the broker states). The sync consumer was changed to parse once; the asyncio consumer still
parsed twice. Now ``LeadershipMonitor.on_stats`` hands back the document it parsed and
``Reachability.on_stats`` reads the broker states from it, in both consumers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ResilientConsumer
from kresilient.leadership import LeadershipMonitor
from kresilient.reachability import Reachability


def _stats(topic: str, partitions: int, brokers: dict[str, str]) -> str:
    return json.dumps(
        {
            "brokers": {
                name: {"name": name, "nodeid": i, "state": state}
                for i, (name, state) in enumerate(brokers.items())
            },
            "topics": {
                topic: {
                    "metadata_age": 1000,
                    "partitions": {
                        "-1": {"partition": -1, "leader": -1},
                        **{str(p): {"partition": p, "leader": 1} for p in range(partitions)},
                    },
                }
            },
        }
    )


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``json.loads`` of a statistics document, wherever a consumer makes it."""
    seen: list[str] = []
    real: Callable[..., Any] = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str) and '"topics"' in text:  # librdkafka passes str
            seen.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    yield seen


def test_the_monitor_hands_back_the_document_it_parsed(parses: list[str]) -> None:
    monitor = LeadershipMonitor()
    doc = _stats("orders", 3, {"b1": "UP", "b2": "DOWN", "b3": "UP"})
    parsed = monitor.on_stats(doc)
    assert parses == [doc]
    assert parsed == json.loads(doc)
    assert [monitor.leader("orders", p) for p in range(3)] == [1, 1, 1]
    assert monitor.snapshot()["stats_ticks"] == 1
    mapping = {"topics": {}}
    assert monitor.on_stats(mapping) is mapping  # a mapping given is handed back as it is


@pytest.mark.parametrize(
    ("doc", "handed_back"),
    [
        ("not json", False),
        ("[1, 2]", False),
        ("[" * 100_000 + "]" * 100_000, False),
        ('{"topics": [1, 2]}', True),  # an object with odd fields: parsed, ignored, returned
    ],
    ids=["text", "array", "deeply-nested", "odd-topics"],
)
def test_a_bad_document_is_counted_and_only_an_object_handed_back(
    doc: str, handed_back: bool
) -> None:
    monitor = LeadershipMonitor()
    parsed = monitor.on_stats(doc)
    assert (parsed is not None) is handed_back
    snap = monitor.snapshot()
    assert snap["unparsable_stats"] + snap["stats_ticks"] == 1
    assert snap["unparsable_stats"] == (0 if handed_back else 1)


@pytest.mark.parametrize(
    ("brokers", "connected"),
    [
        ({"b1": "DOWN", "b2": "UP"}, True),
        ({"b1": "DOWN", "b2": "CONNECT"}, False),
        ({}, False),
        ([1, 2], False),  # odd shape: ignored, not raised
    ],
    ids=["one-up", "none-up", "no-brokers", "odd-shape"],
)
def test_reachability_reads_the_broker_states_of_a_parsed_document(
    brokers: Any, connected: bool
) -> None:
    reach = Reachability(structlog.get_logger())
    reach.all_brokers_down = True
    doc = json.loads(_stats("t", 1, brokers)) if isinstance(brokers, dict) else {"brokers": brokers}
    reach.on_stats(doc)
    assert reach.ever_connected is connected
    assert reach.all_brokers_down is not connected


def test_sync_consumer_parses_each_statistics_document_once(parses: list[str]) -> None:
    seen: list[str] = []
    consumer = ResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "stats_cb": seen.append},
        ["orders"],
        lambda msg: None,
        dead_letter=None,
        install_signal_handlers=False,
    )
    try:
        doc = _stats("orders", 2, {"b1": "UP"})
        consumer._events.on_stats(doc)
        assert parses == [doc]
        assert seen == [doc]
        assert consumer._events.reach.ever_connected
        leadership = consumer.health().leadership
        assert {p: v["leader"] for p, v in leadership["partitions"].items()} == {
            "orders[0]": 1,
            "orders[1]": 1,
        }
    finally:
        consumer.close()


async def _noop(msg: Any) -> None:
    pass


def test_asyncio_consumer_parses_each_statistics_document_once(parses: list[str]) -> None:
    seen: list[str] = []
    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "stats_cb": seen.append},
        ["orders"],
        _noop,
        dead_letter=None,
        handle_signals=False,
    )
    doc = _stats("orders", 2, {"b1": "UP"})
    consumer._on_stats(doc)
    assert parses == [doc]  # once, not once by the monitor and again for the brokers
    assert seen == [doc]  # the user's stats_cb still gets the text
    assert consumer._reach.ever_connected
    leadership = consumer.health().leadership
    assert leadership["stats_ticks"] == 1
    assert {p: v["leader"] for p, v in leadership["partitions"].items()} == {
        "orders[0]": 1,
        "orders[1]": 1,
    }
