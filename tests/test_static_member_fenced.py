"""A static member whose ``group.instance.id`` another member took stops, in every consumer.

librdkafka (2.16) fences the older member for good and says so with a consume error
``_FATAL`` ("Static consumer fenced by other consumer with same group.instance.id") that is
NOT flagged fatal. Before, ``ResilientConsumer`` and ``AsyncResilientConsumer`` logged a
``consume_error`` WARNING and polled on, holding no partition, forever (found by the
consume-transform-produce work, issue 41; fixed there for ``transactions=`` only). Now
``run()`` raises, naming the fencing. Control: the newer member, same group and same id,
keeps running and handles the records.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Message, Producer

from kresilient import ResilientConsumer
from kresilient.aio import AsyncResilientConsumer
from kresilient.errors import KResilientError
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _wait(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class _Running:
    """``run()`` of a sync consumer in a thread, or of an asyncio one in its own loop."""

    def __init__(self, consumer: ResilientConsumer | AsyncResilientConsumer) -> None:
        self.consumer = consumer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if isinstance(self.consumer, AsyncResilientConsumer):
                asyncio.run(self.consumer.run())
            else:
                self.consumer.run()
        except BaseException as exc:  # what run() raised is the result
            self.error = exc


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_static_member_fenced_by_a_newer_one_with_its_id_stops_and_run_raises(
    kafka_cluster: KafkaCluster, kind: str
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = kafka_cluster.create_topic(f"static-fenced-{uuid.uuid4().hex[:8]}", partitions=2)
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"static-{uuid.uuid4().hex[:8]}",
        "group.instance.id": "member-1",
        "session.timeout.ms": 6000,
    }
    handled: dict[str, set[bytes]] = {"old": set(), "new": set()}

    def make(name: str) -> ResilientConsumer | AsyncResilientConsumer:
        if kind == "sync":

            def handle(msg: Message) -> None:
                handled[name].add(msg.value() or b"")

            return ResilientConsumer(
                config, [topic], handle, dead_letter=None, install_signal_handlers=False
            )

        async def ahandle(msg: Message) -> None:
            handled[name].add(msg.value() or b"")

        return AsyncResilientConsumer(config, [topic], ahandle, dead_letter=None)

    producer = Producer({"bootstrap.servers": bootstrap})

    def produce(values: list[bytes]) -> None:
        for v in values:
            producer.produce(topic, v)
        assert producer.flush(30) == 0

    old = _Running(make("old"))
    produce([b"before-%d" % i for i in range(4)])
    _wait("the first member handling records", lambda: len(handled["old"]) == 4)
    new = _Running(make("new"))
    old.thread.join(60)
    assert not old.thread.is_alive(), "the fenced member polls on"
    assert isinstance(old.error, KResilientError), old.error
    assert "group.instance.id" in str(old.error) or "FENCED" in str(old.error).upper()
    # control: the newer member with the same id is the group's member now
    produce([b"after-%d" % i for i in range(4)])
    _wait("the newer member handling the later records", lambda: len(handled["new"]) >= 4)
    assert new.thread.is_alive() and new.error is None
    new.consumer.stop()
    new.thread.join(60)
    assert new.error is None and not new.thread.is_alive()
