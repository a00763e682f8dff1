"""A consumer's statistics tick, pure logic (no Kafka): one parse feeds leadership and reach.

docs/performance.md measured the consumer's statistics path at twice the producer's at 10,000
partitions because the document was parsed twice (once by the leadership monitor, once for
the broker states). The sync consumer was changed to parse once; the asyncio consumer still
parsed twice. Both now go through ``feed_stats``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

import kresilient.consumer._events as events
from kresilient.aio import AsyncResilientConsumer
from kresilient.leadership import LeadershipMonitor
from kresilient.reachability import Reachability


def _stats(topic: str, partitions: int, brokers: dict[str, str]) -> str:
    return json.dumps({
        "brokers": {name: {"name": name, "nodeid": i, "state": state}
                    for i, (name, state) in enumerate(brokers.items())},
        "topics": {
            topic: {
                "metadata_age": 1000,
                "partitions": {
                    "-1": {"partition": -1, "leader": -1},
                    **{str(p): {"partition": p, "leader": 1} for p in range(partitions)},
                },
            }
        },
    })


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``json.loads`` of a statistics document, wherever a consumer makes it."""
    seen: list[str] = []
    real: Callable[..., Any] = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str | bytes) and b'"topics"' in (
            text if isinstance(text, bytes) else text.encode()
        ):
            seen.append(text if isinstance(text, str) else text.decode())
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    yield seen


def test_feed_stats_parses_once_and_feeds_the_monitor_and_reach(parses: list[str]) -> None:
    monitor = LeadershipMonitor()
    reach = Reachability(structlog.get_logger())
    reach.all_brokers_down = True
    doc = _stats("orders", 3, {"b1": "UP", "b2": "DOWN", "b3": "UP"})
    events.feed_stats(doc, monitor, reach)
    assert parses == [doc]
    assert [monitor.leader("orders", p) for p in range(3)] == [1, 1, 1]
    assert monitor.snapshot()["stats_ticks"] == 1
    assert reach.ever_connected and not reach.all_brokers_down


def test_feed_stats_with_no_broker_up_leaves_reach_alone(parses: list[str]) -> None:
    reach = Reachability(structlog.get_logger())
    reach.all_brokers_down = True
    events.feed_stats(_stats("t", 1, {"b1": "DOWN"}), LeadershipMonitor(), reach)
    assert not reach.ever_connected and reach.all_brokers_down
    assert len(parses) == 1


@pytest.mark.parametrize(
    "doc",
    ["not json", "[1, 2]", '{"brokers": [1, 2], "topics": {}}', "[" * 100_000 + "]" * 100_000],
    ids=["text", "array", "odd-brokers", "deeply-nested"],
)
def test_feed_stats_counts_a_bad_document_and_never_raises(doc: str) -> None:
    monitor = LeadershipMonitor()
    reach = Reachability(structlog.get_logger())
    events.feed_stats(doc, monitor, reach)
    snap = monitor.snapshot()
    # A document that parses to an object is the monitor's to judge; anything else is
    # unparsable: counted, not raised.
    parsed_object = doc.startswith("{")
    assert snap["unparsable_stats"] == (0 if parsed_object else 1)
    assert not reach.ever_connected


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
    leadership = consumer.health().leadership
    assert leadership["stats_ticks"] == 1
    assert {p: v["leader"] for p, v in leadership["partitions"].items()} == {
        "orders[0]": 1,
        "orders[1]": 1,
    }
