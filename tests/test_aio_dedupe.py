"""``AsyncResilientConsumer(dedupe=...)`` (issue 20 on the asyncio consumer, issue 14).

* bad input: anything but a :class:`~kresilient.dedupe.Deduplicator` is a ConfigError naming
  ``dedupe``;
* marked copies of handled ids skipped, unmarked repeats handled, skips counted and committed
  past (control: without ``dedupe``): for both consumers in tests/test_aio_consumer_parity.py;
* two copies of one id in hand at once (``max_concurrency=2``, first copy on partition 0 still
  in its handler when the marked copy on partition 1 comes up): the copy waits and is skipped;
  the negative control (the in-hand registry disabled) handles the id twice, so the
  interleaving the test builds is real.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Message
from test_consumer_integration import TopicFactory, committed, ends, produce

from kresilient.aio import AsyncResilientConsumer
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.asyncio]

MARK = (POSSIBLE_DUPLICATE_HEADER, b"true")


async def _noop(msg: Message) -> None:
    pass


async def test_dedupe_must_be_a_deduplicator() -> None:
    with pytest.raises(
        ConfigError, match=r"dedupe must be a kresilient\.dedupe\.Deduplicator"
    ) as info:
        AsyncResilientConsumer(
            {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
            ["t"],
            _noop,
            dedupe=100_000,  # type: ignore[arg-type]
        )
    assert info.value.key == "dedupe"


# --------------------------------------------------------------------------- real cluster


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


class _NoRegistry(dict[Any, Any]):
    """An in-hand registry that forgets everything (the negative control)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        value.set_result(None)

    def pop(self, key: Any, *default: Any) -> Any:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return done  # the consumer resolves it: nobody waits on it


@pytest.mark.integration
@pytest.mark.parametrize("registry", [True, False], ids=["in-hand-registry", "control-without"])
async def test_a_marked_copy_waits_for_its_first_copy_in_hand_on_another_partition(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, registry: bool
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(partitions=2)
    x = [(MESSAGE_ID_HEADER, b"x")]
    produce(
        bootstrap,
        topic,
        [
            (b"x", b"x1", x, 0),
            (b"p", b"p1-before", [(MESSAGE_ID_HEADER, b"p")], 1),
            (b"x", b"x2-copy", [*x, MARK], 1),
        ],
    )
    seen: list[bytes] = []
    consumer: AsyncResilientConsumer | None = None

    def copy_reached() -> bool:
        """Partition 1's worker holds the copy: popped (queue empty, the worker still on it),
        or already handed to the handler."""
        assert consumer is not None
        part = consumer._parts.get((topic, 1))
        in_hand = part is not None and not part.queue and part.task is not None
        return b"p1-before" in seen and (in_hand or b"x2-copy" in seen)

    async def handle(msg: Message) -> None:
        seen.append(msg.value() or b"")
        if msg.value() == b"p1-before":  # partition 1 goes on once x1 is in hand
            await _until(lambda: b"x1" in seen, 60, "x1 in hand")
        if msg.value() == b"x1":  # the first copy stays in hand until the copy came up
            await _until(copy_reached, 60, "the marked copy on partition 1 to come up")

    group = f"adedupe-{uuid.uuid4().hex[:10]}"
    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [topic],
        handle,
        dedupe=Deduplicator(window=100),
        dead_letter=None,
        max_concurrency=2,
        handle_signals=False,
    )
    if not registry:
        consumer._inflight = _NoRegistry()
    task = asyncio.create_task(consumer.run())
    try:
        await _until(
            lambda: len(seen) + consumer.health().duplicates_skipped >= 3 or task.done(),
            120,
            "3 records handled or skipped",
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    if registry:
        assert sorted(seen) == [b"p1-before", b"x1"]
        assert consumer.health().duplicates_skipped == 1
        high = ends(bootstrap, topic)
        assert committed(bootstrap, group, topic, high) == high
    else:  # the copy came up while x1 was in hand: without the registry both are handled
        assert sorted(seen) == [b"p1-before", b"x1", b"x2-copy"]
        assert consumer.health().duplicates_skipped == 0
