"""A bad record or a bad dependency, asyncio consumer (issue 36, item 1; acceptance 1).

The same mechanism as ``ResilientConsumer`` (tests/test_consumer_outage.py): the
:class:`kresilient.consumer.OutageDetector`, DEFAULT policies, on the real cluster. A handler
whose dependency is down for a while (every record fails with a ``ConnectionError``), then
back:

* nothing is dead-lettered, every record is handled exactly once afterwards;
* ``health().outage`` and ``/ready`` (HTTP on 127.0.0.1: 503 naming the outage, ``/live``
  200) show the outage while it lasts, and ``/ready`` is 200 again once it is over;
* the whole outage logs at most 5 lines at WARNING or above, none with the secret;
* with poison records mixed in (``ValueError``), exactly those are dead-lettered;
* three partitions at once (``max_concurrency=3``: records of different partitions failing in
  a row, one detector shared) and one partition (the probe path: the first record's
  RetryPolicy exhausted with nothing else handled, the next record probed).

The checks are the sync consumer's own (``_check_common`` of tests/test_consumer_outage.py,
one body for both). The two outages run side by side (a module fixture starts them
together, each in its own thread and event loop). The negative control
(``outage_retry=None``) dead-letters records of the same outage: the fault is real.
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import TopicFactory, produce, with_dlq
from test_consumer_outage import Dependency, LogRecorder, _check_common, _get, _items

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import RetryPolicy
from kresilient.deadletter import CircuitBreakerPolicy
from kresilient.testing import KafkaCluster


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Scenario:
    def __init__(self, dependency: Dependency) -> None:
        self.dep = dependency
        self.handled: list[bytes] = []
        self.attempts: dict[tuple[int, int], int] = collections.Counter()

    async def handle(self, msg: Message) -> None:
        self.attempts[(msg.partition(), msg.offset())] += 1  # type: ignore[index]
        value: bytes = msg.value()  # type: ignore[assignment]
        if value.startswith(b"poison"):
            raise ValueError(f"invalid order {value!r}")
        self.dep.call()
        self.handled.append(value)


async def _run_outage(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    *,
    partitions: int,
    per_partition: int,
    down_for: float,
    poison_every: int | None,
) -> dict[str, Any]:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=partitions)
    items = _items(partitions, per_partition, poison_every)
    produce(bootstrap, topic, items)
    good = {v for _, v, _, _ in items if v.startswith(b"ok")}
    poison = {v for _, v, _, _ in items if v.startswith(b"poison")}
    scenario = Scenario(Dependency(down_for))
    log = LogRecorder()
    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:10]}"},
        [topic],
        scenario.handle,
        logger=log,
        handle_signals=False,
        max_concurrency=partitions,
        health_port=0,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: consumer.health().outage is not None or task.done(), 90, "the outage")
        port = consumer.health_port
        assert port is not None
        outage_during = consumer.health().outage
        # the probe server runs in its own thread: the request must not block the loop
        ready_during = await asyncio.to_thread(_get, port, "/ready")
        live_during = await asyncio.to_thread(_get, port, "/live")
        assert not scenario.dep.up, "the outage was reported only after the dependency was up"
        await _until(
            lambda: good <= set(scenario.handled) or task.done(),
            down_for + 120,
            "every good record",
        )
        await _until(
            lambda: (
                consumer.health().dead_letters_pending == 0 and consumer.health().outage is None
            ),
            60,
            "dead letters acknowledged, the outage over",
        )
        deadline = time.monotonic() + 60  # /ready 200 once the outage is over
        while (ready_after := await asyncio.to_thread(_get, port, "/ready"))[0] != 200:
            if time.monotonic() > deadline:
                break  # _check_common names the reasons
            await asyncio.sleep(0.1)
        health = consumer.health()
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    dead = read_back(bootstrap, dlq)
    return {
        "scenario": scenario,
        "log": log,
        "good": good,
        "poison": poison,
        "dead": dead,
        "health": health,
        "outage_during": outage_during,
        "ready_during": ready_during,
        "live_during": live_during,
        "ready_after": ready_after,
    }


#: The two outages on the real cluster, by the test that checks each.
OUTAGES: dict[str, dict[str, Any]] = {
    "test_aio_dependency_down_three_partitions_nothing_dead_lettered": {
        "partitions": 3,
        "per_partition": 50,
        "down_for": 15.0,
        "poison_every": None,
    },
    "test_aio_dependency_down_one_partition_with_poison": {
        "partitions": 1,
        "per_partition": 200,
        "down_for": 20.0,
        "poison_every": 100,
    },
}


#: The negative control (below) runs beside them too.
CONTROL = "test_aio_control_without_outage_detection_the_same_outage_dead_letters"


@pytest.fixture(scope="module", name="outages")
def _outages(
    kafka_cluster: KafkaCluster, request: pytest.FixtureRequest
) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """The outages of the tests selected in this run (and the control's), started together
    (each in a thread with its own event loop) when the first of those tests asks: each
    mostly waits, so side by side they take about the longest one's time. Nothing is shared
    but the cluster (own topics, group, consumer, health port, logger, dependency clock). A
    scenario's failure is its own test's; leaving the fixture waits for every scenario to
    end."""

    def topic_factory(partitions: int = 1, *, name: str | None = None) -> str:
        topic = name or f"t-aio-outage-{uuid.uuid4().hex[:10]}"
        return kafka_cluster.create_topic(topic, partitions, 3, {"min.insync.replicas": 2})

    def run(name: str) -> dict[str, Any]:
        if name == CONTROL:
            return asyncio.run(_run_control(kafka_cluster, topic_factory))
        return asyncio.run(_run_outage(kafka_cluster, topic_factory, **OUTAGES[name]))

    selected = {item.name for item in request.session.items if item.module is request.module}
    wanted = [name for name in [*OUTAGES, CONTROL] if name in selected]
    with ThreadPoolExecutor(max(1, len(wanted)), thread_name_prefix="aio-outage") as pool:
        yield {name: pool.submit(run, name) for name in wanted}


def _outage(outages: dict[str, Future[dict[str, Any]]], request: pytest.FixtureRequest) -> Any:
    """This test's outage, once it is over."""
    down_for = OUTAGES[request.node.name]["down_for"] if request.node.name in OUTAGES else 6.0
    return outages[request.node.name].result(timeout=down_for + 400)


@pytest.mark.integration
def test_aio_dependency_down_three_partitions_nothing_dead_lettered(
    outages: dict[str, Future[dict[str, Any]]], request: pytest.FixtureRequest
) -> None:
    """Records of different partitions (handled at once) fail in a row: an outage; the
    records held in every partition resume at the first success."""
    result = _outage(outages, request)
    _check_common(result)
    assert result["dead"] == []


@pytest.mark.integration
def test_aio_dependency_down_one_partition_with_poison(
    outages: dict[str, Future[dict[str, Any]]], request: pytest.FixtureRequest
) -> None:
    """One partition: the probe path (the first probe is poison: proves nothing, the probe
    moves on; the next fails too under its own RetryPolicy: an outage). Exactly the poison
    records dead-lettered."""
    result = _outage(outages, request)
    _check_common(result)
    assert len(result["poison"]) == 2
    assert result["scenario"].attempts[(0, 1)] == 2  # the poison probe, then its own turn


async def _run_control(kafka_cluster: KafkaCluster, topic_factory: TopicFactory) -> dict[str, Any]:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"k", b"ok-%d" % i, None, 0) for i in range(20)])
    dep = Dependency(down_for=6.0)
    handled: list[bytes] = []

    async def handle(msg: Message) -> None:
        dep.call()
        handled.append(msg.value())  # type: ignore[arg-type]

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:10]}"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.2)),
        outage_retry=None,
        circuit_breaker=CircuitBreakerPolicy(max_consecutive=None, max_ratio=None),
        handle_signals=False,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(
            lambda: len(handled) + consumer.health().dead_lettered >= 20 or task.done(), 90, "all"
        )
        await _until(lambda: consumer.health().dead_letters_pending == 0, 30, "acks")
        outage = consumer.health().outage
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    return {"outage": outage, "dead": read_back(bootstrap, dlq)}


@pytest.mark.integration
def test_aio_control_without_outage_detection_the_same_outage_dead_letters(
    outages: dict[str, Future[dict[str, Any]]], request: pytest.FixtureRequest
) -> None:
    """Negative control: ``outage_retry=None`` dead-letters good records of the same kind of
    outage (the fault is real)."""
    result = _outage(outages, request)
    assert result["outage"] is None
    assert len(result["dead"]) >= 3  # good records dead-lettered: the fault is real
