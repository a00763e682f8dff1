"""AsyncResilientConsumer._dispatch, pure logic (no Kafka): which partition queue a record joins.

A batch can hold the same partition number of two topics back to back while only one of them
is assigned (a partition revoked inside the consume that returned the batch). The record-by-
record path once looked the partition up again only when *several topics were assigned*, so
the assigned topic's records following the unassigned one's were dropped from the batch
without being handled or stored (later records' offsets then committed past them).
"""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka import Message

from kresilient.aio import AsyncResilientConsumer
from kresilient.aio._consumer import _Partition

pytestmark = [pytest.mark.asyncio]


async def _noop(msg: Message) -> None:
    pass


def _consumer(topics: list[str], assigned: list[tuple[str, int]]) -> AsyncResilientConsumer:
    c = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
        topics,
        _noop,
        dead_letter=None,
        handle_signals=False,
    )
    c._loop = asyncio.get_running_loop()
    c._sem = asyncio.Semaphore(1)
    c._running = True
    for tp in assigned:
        c._parts[tp] = _Partition(tp)
    return c


async def _handled(c: AsyncResilientConsumer) -> None:
    while c._queued:
        await c._drained.wait()


async def test_records_of_an_assigned_topic_after_an_unassigned_one_are_queued() -> None:
    c = _consumer(["a", "b"], [("b", 0)])  # a-0 revoked meanwhile: only b-0 assigned
    batch = [Message(topic="a", partition=0, offset=i) for i in range(3)] + [
        Message(topic="b", partition=0, offset=i) for i in range(5)
    ]
    c._dispatch(batch)
    await _handled(c)
    assert c.processed == 5  # every b-0 record handled, none of a-0
    (store,) = c._pending_ops()[0]
    assert (store.topic, store.partition, store.offset) == ("b", 0, 5)


@pytest.mark.parametrize("topics", [["t"], ["t", "u"]], ids=["one-topic-fast-path", "by-record"])
async def test_runs_of_partitions_keep_their_order_and_skip_unassigned_ones(
    topics: list[str],
) -> None:
    c = _consumer(topics, [("t", 0), ("t", 2)])
    seen: list[tuple[int, int]] = []

    async def record(msg: Message) -> None:
        seen.append((msg.partition(), msg.offset()))  # type: ignore[arg-type]

    c._handler = record
    order = [0, 0, 1, 1, 2, 0, 2, 2, 1, 0]  # runs of partitions, 1 not assigned
    c._dispatch([Message(topic="t", partition=p, offset=i) for i, p in enumerate(order)])
    await _handled(c)
    assert [o for p, o in seen if p == 0] == [0, 1, 5, 9]
    assert [o for p, o in seen if p == 2] == [4, 6, 7]
    assert not [o for p, o in seen if p == 1]
    stored = {(tp.topic, tp.partition): tp.offset for tp in c._pending_ops()[0]}
    assert stored == {("t", 0): 10, ("t", 2): 8}
