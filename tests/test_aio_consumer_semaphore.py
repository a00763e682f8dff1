"""The concurrency slot of AsyncResilientConsumer when a wait that gave it up is cancelled
while taking it back (issue 35, suspicion: "_await_first cancelled while re-acquiring the
semaphore over-releases it").

Fake (no broker): the interleaving (a task cancelled exactly while it waits to get its slot
back) cannot be produced on demand through a real cluster. The consumer's own ``_work`` runs on
a real event loop with records built by confluent-kafka's ``Message`` constructor; no client
is opened.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import tenacity
from confluent_kafka import Message

from kresilient.aio import AsyncResilientConsumer
from kresilient.aio._consumer import _Partition
from kresilient.consumer import RetryPolicy
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator

pytestmark = pytest.mark.asyncio


async def _until(predicate: Any, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _free_slots(sem: asyncio.Semaphore) -> int:
    """How many acquisitions succeed at once (then given back)."""
    n = 0
    while not sem.locked():
        sem._value -= 1  # what a successful acquire() does, without awaiting
        n += 1
    sem._value += n
    return n


@pytest.mark.parametrize("wait", ["await_first", "retry_wait"])
async def test_fake_worker_cancelled_while_taking_its_slot_back_does_not_over_release_it(
    wait: str,
) -> None:
    """A partition's worker gives its slot up while it waits (for the first copy of its
    id in another partition's handler: ``_await_first``; for a retry: ``_idle``); another
    handler takes the slot; the wait ends and the worker queues for its slot again; then it is
    cancelled (a shutdown past ``shutdown_timeout``, a revoke). It never got the slot back, so
    it must not release one: with ``max_concurrency=1`` exactly one slot is left. On c15a167
    ``async with sem`` released it anyway: two slots, two handlers at once."""

    async def handle(msg: Message) -> None:
        if wait == "retry_wait":
            raise TimeoutError("downstream busy")  # retried after wait_fixed(0.01)

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
        ["t"],
        handle,
        max_concurrency=1,
        handle_signals=False,
        dedupe=Deduplicator() if wait == "await_first" else None,
        retry=RetryPolicy(stop=tenacity.stop_never, wait=tenacity.wait_fixed(0.01)),
    )
    consumer._loop = asyncio.get_running_loop()
    sem = consumer._sem = asyncio.Semaphore(1)
    part = consumer._parts[("t", 0)] = _Partition(("t", 0))
    first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    headers = [(MESSAGE_ID_HEADER, b"id-1"), (POSSIBLE_DUPLICATE_HEADER, b"true")]
    if wait == "await_first":  # the first copy of id-1 is in another partition's handler
        consumer._inflight[("t", b"id-1")] = first
    part.queue.append(Message(topic="t", partition=0, offset=0, value=b"v", headers=headers))
    consumer._queued = 1
    worker = asyncio.create_task(consumer._work(part))
    await asyncio.sleep(0)  # the worker runs to its first wait, having given its slot up
    assert not worker.done() and not sem.locked()
    await sem.acquire()  # another partition's handler takes it
    if wait == "await_first":
        first.set_result(None)  # the first copy's handler ended: the worker wants its slot
    await _until(lambda: bool(sem._waiters), "the worker to queue for its slot")
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    sem.release()  # the other handler ends
    assert _free_slots(sem) == 1, "max_concurrency=1 but two handlers may now run at once"
    assert list(part.queue) and part.queue[0].offset() == 0  # its record is not skipped
