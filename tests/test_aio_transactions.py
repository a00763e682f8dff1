"""``AsyncResilientConsumer(transactions=)``: consume-transform-produce exactly once with an
``async def`` handler, on the real 3-node cluster (issue 41).

The sync engine (``ResilientConsumer(transactions=)``) runs in a worker thread and awaits the
handler on the test's event loop (kresilient/aio/_transactional.py). Every visibility check
reads with ``read_committed``; each fault carries a negative control read with
``read_uncommitted`` (the aborted records did reach the log), so no test passes because
nothing was written. The hostile cases: a handler that never returns when the consumer is
stopped or its run() cancelled, the event loop stopped under a handler, a handler stopping
its own consumer. Record counts are small: the cost is the group joins.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from structlog.testing import capture_logs
from test_consume_transform_produce import _committed, _high, _numbers, _seed, _uncommitted

from kresilient import (
    ConfigError,
    DeadLetterPolicy,
    Output,
    ProducerFencedError,
    RetryPolicy,
    TransactionPolicy,
)
from kresilient import parse_dead_letter_headers as parse_headers
from kresilient.aio import AsyncResilientConsumer
from kresilient.testing import KafkaCluster

TopicFactory = Callable[..., str]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "aio_exactly_once.py"


async def _until(what: str, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for ``condition`` (a blocking check, run off the loop) with a deadline."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)  # polling interval of a condition wait, not a fixed delay


def _visible_now(bootstrap: str, topic: str) -> list[bytes]:
    """What a read_committed reader sees now (partition 0 up to its end: the last stable
    offset while a transaction is open), without waiting for the high watermark."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, f"read_committed({topic}) timed out"
            for m in c.consume(100, 0.5):
                err = m.error()
                if err is None:
                    out.append(m.value() or b"")
                elif err.code() == KafkaError._PARTITION_EOF:
                    return out
    finally:
        c.close()


def _ids() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"actp-{suffix}", f"actp-{suffix}-0"


def _consumer(
    bootstrap: str,
    group: str,
    source: str,
    handler: Callable[[Message], Any],
    tid: str,
    **kwargs: Any,
) -> AsyncResilientConsumer:
    # a transaction commits at max_records: each test passes its record count
    policy = {"max_records": kwargs.pop("records"), "max_interval_s": 60}
    kwargs.setdefault("dead_letter", None)
    return AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [source],
        handler,
        transactions=TransactionPolicy(transactional_id=tid, **policy),
        **{"handle_signals": False, **kwargs},
    )


def _doubler(target: str) -> Callable[[Message], Any]:
    async def double(msg: Message) -> Output:
        await asyncio.sleep(0)
        return Output(target, value=b"%d" % (2 * int(msg.value() or b"")), key=msg.key())

    return double


# --------------------------------------------------------------------------- exactly once


@pytest.mark.integration
@pytest.mark.asyncio
async def test_async_outputs_and_offsets_commit_in_one_transaction_and_an_abort_hides_them(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The handler raising on record 12 aborts the transaction holding records 0-12: their
    outputs reached the log (read_uncommitted, the negative control) but a read_committed
    reader sees exactly one output per input after the redo, and the group's committed
    offset is the end of the source."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    _seed(bootstrap, source, [b"%d" % i for i in range(20)])
    group, tid = _ids()
    calls: Counter[int] = Counter()

    async def double(msg: Message) -> Output:
        n = int(msg.value() or b"")
        calls[n] += 1
        if n == 12 and calls[n] == 1:
            # the outputs of 0-11 are in the log, inside the open transaction
            await _until("the open transaction's outputs", lambda: _high(bootstrap, target) >= 12)
            raise RuntimeError("a dependency hiccup")
        await asyncio.sleep(0)
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    consumer = _consumer(bootstrap, group, source, double, tid, records=20)
    task = asyncio.create_task(consumer.run())
    await _until("the 20 offsets committed", lambda: _committed(bootstrap, group, source) >= 20)
    health = consumer.health()
    consumer.stop()
    await asyncio.wait_for(task, 60)
    assert _numbers(read_back(bootstrap, target)) == [2 * i for i in range(20)]
    assert [n for n, c in calls.items() if c == 2] == list(range(13))
    raw = _uncommitted(bootstrap, target)
    assert len(raw) == 20 + 12 and raw[:12] == [b"%d" % (2 * i) for i in range(12)]
    assert _committed(bootstrap, group, source) == 20
    txn = health.transactions
    assert txn is not None and txn["aborted"] == 1 and txn["committed"] == 1
    assert health.processed == 20 and consumer.processed == 20


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_poison_record_is_dead_lettered_in_the_transaction_visible_at_its_commit(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Record 2 cannot be doubled: its dead letter (byte for byte) is written inside the open
    transaction; while a later handler still awaits it is in the log (read_uncommitted) but
    invisible to read_committed, and nothing is committed; once the handler returns it
    commits with the outputs and the offsets."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    dlq = topic_factory(name=source + ".dlq")
    _seed(bootstrap, source, [b"0", b"1", b"x", b"3", b"4"])
    group, tid = _ids()
    release, waiting = asyncio.Event(), asyncio.Event()

    async def double(msg: Message) -> Output:
        n = int(msg.value() or b"")  # ValueError for b"x": poison
        if n == 4:
            waiting.set()
            await release.wait()
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    consumer = _consumer(
        bootstrap, group, source, double, tid, records=5, dead_letter=DeadLetterPolicy()
    )
    task = asyncio.create_task(consumer.run())
    await asyncio.wait_for(waiting.wait(), 60)
    await _until("the dead letter in the log", lambda: _high(bootstrap, dlq) >= 1)
    assert await asyncio.to_thread(_visible_now, bootstrap, dlq) == []
    assert await asyncio.to_thread(_committed, bootstrap, group, source) == 0
    release.set()
    await _until("the 5 offsets committed", lambda: _committed(bootstrap, group, source) >= 5)
    consumer.stop()
    await asyncio.wait_for(task, 60)
    dead = read_back(bootstrap, dlq)
    assert [(m.key(), m.value()) for m in dead] == [(b"x", b"x")]
    info = parse_headers(dead[0].headers())
    assert (info.original_topic, info.original_partition, info.original_offset) == (source, 0, 2)
    assert _numbers(read_back(bootstrap, target)) == [0, 2, 6, 8]
    assert consumer.health().dead_lettered == 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_handler_timing_out_is_retried_then_dead_lettered_like_any_failure(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Record 2's handler times out (``asyncio.wait_for``: on 3.11 the built-in
    ``TimeoutError``, which ``concurrent.futures.TimeoutError`` also is): the bridge waiting
    for the handler must not take it for its own "not done yet" (it spun forever: nothing
    retried, dead-lettered or committed). It is retried (2 attempts), then dead-lettered in
    the transaction; the control beside it, record 5 raising ``ValueError``, is dead-lettered
    at once; the other records commit once each. Record 8 is a marked copy of an id the
    ``Deduplicator`` knows: skipped, and ``consumer.duplicates_skipped`` (copied from
    ``health()`` when run() ends) says so."""
    from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator

    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    dlq = topic_factory(name=source + ".dlq")
    _seed(bootstrap, source, [b"%d" % i for i in range(8)])
    copy = [(MESSAGE_ID_HEADER, b"id-seen"), (POSSIBLE_DUPLICATE_HEADER, b"true")]
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(source, b"8", key=b"8", headers=copy)
    assert producer.flush(30) == 0
    group, tid = _ids()
    calls: Counter[int] = Counter()

    async def double(msg: Message) -> Output:
        n = int(msg.value() or b"")
        calls[n] += 1
        if n == 2:
            await asyncio.wait_for(asyncio.sleep(60), 0.01)  # raises TimeoutError
        if n == 5:
            raise ValueError("the control: poison")
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    consumer = _consumer(
        bootstrap,
        group,
        source,
        double,
        tid,
        records=9,
        shutdown_timeout=0.5,
        dead_letter=DeadLetterPolicy(),
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.05)),
        dedupe=Deduplicator(ids=[(source, b"id-seen")]),
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until("the 9 offsets committed", lambda: _committed(bootstrap, group, source) >= 9)
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert calls[2] == 2 and calls[5] == 1 and 8 not in calls  # retried; not; skipped
    dead = read_back(bootstrap, dlq)
    assert [m.value() for m in dead] == [b"2", b"5"]
    assert [parse_headers(m.headers()).original_offset for m in dead] == [2, 5]
    assert _numbers(read_back(bootstrap, target)) == [0, 2, 6, 8, 12, 14]
    assert consumer.dead_lettered == 2 and consumer.processed == 6
    assert consumer.duplicates_skipped == 1 == consumer.health().duplicates_skipped


def test_an_event_loop_driven_in_phases_keeps_its_consumer(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """An application that drives its loop in phases (``run_until_complete`` twice, sync
    work between) while a handler awaits: the pause is not the loop's end (it was taken for
    it: the handler cut, the transaction aborted and the consumer ended for good). The
    bridge sees the loop not running (the condition waited for), the handler goes on in
    phase 2, every record commits once and run() returns after stop(). The cut of a loop
    paused for longer than ``shutdown_timeout`` is the ``loop`` case of the cut test."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    _seed(bootstrap, source, [b"%d" % i for i in range(4)])
    group, tid = _ids()
    loop = asyncio.new_event_loop()
    inhand, release = asyncio.Event(), asyncio.Event()

    async def double(msg: Message) -> Output:
        n = int(msg.value() or b"")
        if n == 1 and not release.is_set():
            inhand.set()
            await release.wait()
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    consumer = _consumer(bootstrap, group, source, double, tid, records=4, shutdown_timeout=30.0)
    runner = consumer._txn
    assert runner is not None
    task = loop.create_task(consumer.run())
    try:
        with capture_logs() as logs:
            loop.run_until_complete(asyncio.wait_for(inhand.wait(), 60))  # phase 1
            deadline = time.monotonic() + 30  # the sync step: until the bridge saw the pause
            while runner._loop_idle_since is None:
                assert time.monotonic() < deadline, "the bridge never saw the loop paused"
                time.sleep(0.01)  # polling interval of a condition wait, not a fixed delay
            assert not task.done()
            release.set()

            async def phase_2() -> None:
                await _until("the commit", lambda: _committed(bootstrap, group, source) >= 4)
                consumer.stop()
                await asyncio.wait_for(task, 60)

            loop.run_until_complete(phase_2())
        assert task.result() is None
        assert not [e for e in logs if e["event"] == "handler_cut"]
        assert _numbers(read_back(bootstrap, target)) == [0, 2, 4, 6]
        assert consumer.processed == 4
    finally:
        if not task.done():
            release.set()
            consumer.stop()
            loop.run_until_complete(asyncio.wait_for(task, 60))
        loop.close()


# --------------------------------------------------------------------------- cut short


async def _run_stuck_then_redo(
    bootstrap: str, source: str, target: str, how: str
) -> tuple[BaseException | None, bool]:
    """A first consumer whose handler never returns on record 3 is stopped (``stop``), has
    its run() cancelled (``cancel``) or its event loop stopped under it (``loop``); returns
    what its run() raised and whether the handler's coroutine was cancelled. Checks that
    nothing of its transaction is visible or committed, then (``stop``, ``loop``) that a
    second consumer of the group redoes every record exactly once."""
    group, tid = _ids()
    stuck = threading.Event()
    handler_cancelled = threading.Event()

    async def hang(msg: Message) -> Output:
        n = int(msg.value() or b"")
        if n == 3:
            stuck.set()
            try:
                await asyncio.Event().wait()  # never set
            except asyncio.CancelledError:
                handler_cancelled.set()
                raise
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    # a record failure would be dead-lettered at once (and committed by the graceful stop):
    # the cut must not reach the engine as one
    first = _consumer(
        bootstrap,
        group,
        source,
        hang,
        tid,
        records=6,
        # the signals' cut is the 2nd signal's, not the shutdown's timeout
        shutdown_timeout=60.0 if how == "signal" else 0.5,
        dead_letter=DeadLetterPolicy(),
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(1)),
        outage_retry=None,
    )
    error: BaseException | None = None
    if how == "signal":
        # a KeyboardInterrupt out of run() leaves the event loop (asyncio re-raises it from
        # the task): the consumer gets a loop of its own, in a thread; the loop's signal
        # handler is called as add_signal_handler calls it (a real SIGINT would reach
        # pytest's loop, not this one)
        loop = asyncio.new_event_loop()
        raised: list[BaseException] = []

        def serve() -> None:
            try:
                loop.run_until_complete(first.run())
            except BaseException as exc:  # what run() raised is the result
                raised.append(exc)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        await asyncio.to_thread(stuck.wait, 60)
        await _until("outputs 0-2 in the log", lambda: _high(bootstrap, target) >= 3)
        runner = first._txn
        assert runner is not None
        loop.call_soon_threadsafe(runner._on_signal, signal.SIGINT)  # the 1st stops
        await _until("the 1st signal's stop", lambda: first.health().stopping)
        assert thread.is_alive()  # the handler hangs on: shutdown_timeout is 60 s
        loop.call_soon_threadsafe(runner._on_signal, signal.SIGINT)  # the 2nd cuts
        await asyncio.to_thread(thread.join, 60)
        assert not thread.is_alive() and raised
        error = raised[0]
    elif how == "loop":
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        asyncio.run_coroutine_threadsafe(first.run(), loop)
        await asyncio.to_thread(stuck.wait, 60)
        await _until("outputs 0-2 in the log", lambda: _high(bootstrap, target) >= 3)
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 60)
        await _until("the first consumer's end", lambda: not first.health().running)
    else:
        task = asyncio.create_task(first.run())
        await asyncio.to_thread(stuck.wait, 60)
        await _until("outputs 0-2 in the log", lambda: _high(bootstrap, target) >= 3)
        if how == "stop":
            first.stop()
        else:
            task.cancel()
        try:
            await asyncio.wait_for(task, 60)
        except BaseException as exc:  # what run() raised is the result
            error = exc
    # the first consumer's transaction (outputs 0-2) was aborted, nothing committed
    assert await asyncio.to_thread(_visible_now, bootstrap, target) == []
    assert await asyncio.to_thread(_committed, bootstrap, group, source) == 0
    assert await asyncio.to_thread(_uncommitted, bootstrap, target) == [b"0", b"2", b"4"]
    assert await asyncio.to_thread(_high, bootstrap, source + ".dlq") == 0
    if how in ("stop", "loop"):  # the redo (the same for every cut: a group join each)
        second = _consumer(bootstrap, group, source, _doubler(target), tid, records=6)
        task = asyncio.create_task(second.run())
        await _until("the redo committed", lambda: _committed(bootstrap, group, source) >= 6)
        second.stop()
        await asyncio.wait_for(task, 60)
        assert _numbers(read_back(bootstrap, target)) == [2 * i for i in range(6)]
    if how in ("loop", "signal"):
        loop.close()
    return error, handler_cancelled.is_set()


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["stop", "cancel", "loop", "signal"])
async def test_a_handler_cut_short_commits_nothing_of_its_transaction_and_is_redone(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, how: str
) -> None:
    """stop() or a cancelled run() waits shutdown_timeout for the handler in hand, then cuts
    it (its coroutine cancelled): the open transaction aborts (the outputs of records 0-2
    reached the log, none is visible) and no offset is committed; run() returns (stop) or
    raises CancelledError (cancel). A 2nd SIGINT cuts it at once (run() raises
    KeyboardInterrupt; shutdown_timeout is 60 s there). An event loop stopped under a
    pending handler ends the same way (the sync loop does not wait for it forever).
    Another consumer of the group then writes exactly one output per input (checked after
    stop and the stopped loop: the redo is the same after every cut)."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    topic_factory(name=source + ".dlq")
    _seed(bootstrap, source, [b"%d" % i for i in range(6)])
    error, handler_cancelled = await _run_stuck_then_redo(bootstrap, source, target, how)
    if how == "stop":
        assert error is None and handler_cancelled
    elif how == "cancel":
        assert isinstance(error, asyncio.CancelledError) and handler_cancelled
    elif how == "signal":
        assert isinstance(error, KeyboardInterrupt) and handler_cancelled
    else:  # its loop no longer runs: the coroutine stays pending, never resumed
        assert error is None and not handler_cancelled


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_handler_stopping_its_own_consumer_commits_what_was_handled(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A handler calling consumer.stop() and returning: no deadlock, its record and those
    before it commit with their outputs (the graceful stop), the rest stays uncommitted."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    _seed(bootstrap, source, [b"%d" % i for i in range(5)])
    group, tid = _ids()
    holder: list[AsyncResilientConsumer] = []

    async def double(msg: Message) -> Output:
        n = int(msg.value() or b"")
        if n == 2:
            holder[0].stop()
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    holder.append(_consumer(bootstrap, group, source, double, tid, records=5))
    await asyncio.wait_for(holder[0].run(), 60)
    assert _numbers(read_back(bootstrap, target)) == [0, 2, 4]
    assert _committed(bootstrap, group, source) == 3


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_fenced_zombie_writes_nothing_visible_and_run_raises(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Two async consumers with the same transactional_id: the second one's start fences the
    first while its handler awaits. The zombie's outputs reached the log (the negative
    control) but none is visible; its run() raises ProducerFencedError; the new instance
    writes exactly one output per input."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(), topic_factory()
    _seed(bootstrap, source, [b"%d" % i for i in range(10)])
    group, tid = _ids()
    blocked, new_ready = asyncio.Event(), asyncio.Event()

    async def zombie_double(msg: Message) -> Output:
        n = int(msg.value() or b"")
        if n == 5 and not blocked.is_set():
            await _until("the zombie's outputs", lambda: _high(bootstrap, target) >= 5)
            blocked.set()
            await new_ready.wait()
        return Output(target, value=b"%d" % (2 * n), key=msg.key())

    zombie = _consumer(bootstrap, group, source, zombie_double, tid, records=10)
    zombie_task = asyncio.create_task(zombie.run())
    await asyncio.wait_for(blocked.wait(), 60)
    new = _consumer(bootstrap, group, source, _doubler(target), tid, records=10)
    new_task = asyncio.create_task(new.run())
    await _until("the new instance's init", lambda: new.health().transactions is not None)
    new_ready.set()
    with pytest.raises(ProducerFencedError):
        await asyncio.wait_for(zombie_task, 60)
    health = zombie.health()
    assert health.transactions is not None and health.transactions["fenced"]
    await _until("the new instance's commit", lambda: _committed(bootstrap, group, source) >= 10)
    new.stop()
    await asyncio.wait_for(new_task, 60)
    assert _numbers(read_back(bootstrap, target)) == [2 * i for i in range(10)]
    assert len(_uncommitted(bootstrap, target)) >= 15  # the zombie's 0-4 (at least), hidden


# --------------------------------------------------------------------------- the bridge


class _Record:
    """The few Message methods the bridge reads (it names a record it cuts)."""

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7


def test_the_bridge_turns_a_dead_loop_or_a_cancelled_handler_into_a_cut_not_a_failure() -> None:
    """Seam test (no broker: the interleavings are forced, not awaited): what reaches the
    sync engine from the bridge. A handler's own exception is the record's failure (retried,
    dead-lettered), whatever its type: a ``TimeoutError`` (the bridge's own wait raised that
    type and spun on it forever) and a ``concurrent.futures.CancelledError`` it raises
    itself included. A closed event loop, a loop not running for longer than
    ``shutdown_timeout`` under a pending handler, a handler cancelled from outside and one
    letting ``asyncio.CancelledError`` out are a BaseException (the open transaction
    aborts), never an Exception, which the engine would retry, dead-letter and commit."""
    from kresilient.aio._transactional import _HandlerCut

    async def handle(msg: Message) -> Output:
        if msg.offset() == 7:
            raise ValueError("not a number")
        if msg.offset() == 5:
            await asyncio.wait_for(asyncio.sleep(60), 0.01)
        if msg.offset() == 4:
            raise concurrent.futures.CancelledError("the handler's own")
        if msg.offset() == 3:
            raise asyncio.CancelledError("let out by the handler")
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("unreachable")

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
        ["orders"],
        handle,
        transactions=TransactionPolicy(transactional_id="orders-0"),
        shutdown_timeout=0.5,
    )
    runner = consumer._txn
    assert runner is not None
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def record(offset: int) -> Message:
        class At(_Record):
            def offset(self) -> int:
                return offset

        return At()  # type: ignore[return-value]

    try:
        runner._loop = loop
        with pytest.raises(ValueError, match="not a number"):
            runner._bridge(record(7))
        with pytest.raises(TimeoutError):
            runner._bridge(record(5))
        with pytest.raises(concurrent.futures.CancelledError, match="the handler's own"):
            runner._bridge(record(4))
        with pytest.raises(_HandlerCut, match="cancelled"):
            runner._bridge(record(3))

        # cancelled by someone else (the handler's task): a cut, not a record failure
        def cancel_soon() -> None:
            for task in asyncio.all_tasks(loop):
                task.cancel()

        threading.Timer(0.3, lambda: loop.call_soon_threadsafe(cancel_soon)).start()
        with pytest.raises(_HandlerCut):
            runner._bridge(record(8))
        # the loop stopped while the handler is pending, for longer than shutdown_timeout:
        # cut, not waited for forever
        threading.Timer(0.3, lambda: loop.call_soon_threadsafe(loop.stop)).start()
        with pytest.raises(_HandlerCut, match="has not run for longer than shutdown_timeout"):
            runner._bridge(record(8))
        thread.join(10)
        assert runner._loop_idle_since is not None
        # the loop closed under a pending handler: cut at once (the loop's pause alone
        # would take 30 s here, and names another reason)
        runner._shutdown_timeout = 30.0
        threading.Timer(0.3, loop.close).start()
        with pytest.raises(_HandlerCut, match="event loop is closed with the handler"):
            runner._bridge(record(8))
        # the loop closed: the coroutine cannot even be submitted
        with pytest.raises(_HandlerCut, match="closed"):
            runner._bridge(record(8))
        assert not issubclass(_HandlerCut, Exception)
    finally:
        runner.consumer.close()
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def test_a_handler_holding_the_event_loop_is_named_one_that_awaits_is_not() -> None:
    """Seam test (no broker): blocking_warning_s with transactions= names a handler that
    runs 0.3 s without awaiting (handler_blocked_event_loop, its record); the control
    awaiting 0.3 s is not warned about."""

    async def handle(msg: Message) -> None:
        if msg.offset() == 7:
            time.sleep(0.3)  # holds the loop: what the warning is for
        else:
            await asyncio.sleep(0.3)

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
        ["orders"],
        handle,
        transactions=TransactionPolicy(transactional_id="orders-0"),
        blocking_warning_s=0.1,
    )
    runner = consumer._txn
    assert runner is not None
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    class Awaiting(_Record):
        def offset(self) -> int:
            return 8

    try:
        runner._loop = loop
        loop.call_soon_threadsafe(runner._heartbeat)
        with capture_logs() as logs:
            runner._bridge(Awaiting())  # type: ignore[arg-type]
            assert runner.blocked_warnings == 0
            runner._bridge(_Record())  # type: ignore[arg-type]
        blocked = [e for e in logs if e["event"] == "handler_blocked_event_loop"]
        assert len(blocked) == 1 and runner.blocked_warnings == 1
        assert blocked[0]["offset"] == 7 and blocked[0]["blocked_s"] >= 0.3
    finally:
        runner.consumer.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"ordering": "key"}, "ordering"),
        ({"ordering": "none"}, "ordering"),
        ({"max_concurrency": 4}, "max_concurrency"),
        ({"dead_letter_producer": object()}, "dead_letter_producer"),
        ({"dead_letter_producer_config": {"acks": "all"}}, "dead_letter_producer_config"),
        ({"transactions": "orders-0"}, "transactions"),
        ({"config": {"isolation.level": "read_uncommitted"}}, "isolation.level"),
        ({"max_process_deaths": 0}, "max_process_deaths"),
        ({"crash_probe_records": 0}, "crash_probe_records"),
        # no crash-loop protection without transactions=: a value would do nothing
        ({"transactions": None, "max_process_deaths": 5}, "max_process_deaths"),
        ({"transactions": None, "crash_probe_records": 50}, "crash_probe_records"),
    ],
)
def test_what_transactions_do_not_combine_with_is_refused_naming_the_argument(
    kwargs: dict[str, Any], key: str
) -> None:
    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **kwargs.pop("config", {})}
    kwargs.setdefault("transactions", TransactionPolicy(transactional_id="orders-0"))

    async def handle(msg: Message) -> None:
        return None

    with pytest.raises(ConfigError) as info:
        AsyncResilientConsumer(config, ["orders"], handle, **kwargs)
    assert info.value.key == key


@pytest.mark.parametrize(
    ("kwargs", "deaths", "window"),
    [
        ({}, 3, 20),  # the sync engine's defaults: on in transactions mode
        ({"max_process_deaths": 5, "crash_probe_records": 7}, 5, 7),
        ({"max_process_deaths": None}, None, None),  # off
    ],
)
def test_crash_loop_protection_options_reach_the_transactional_engine(
    kwargs: dict[str, Any], deaths: int | None, window: int | None
) -> None:
    """Seam test (no broker): max_process_deaths / crash_probe_records are the sync
    engine's crash guard's, one to one (they could not be set, nor the guard switched off)."""

    async def handle(msg: Message) -> None:
        return None

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
        ["orders"],
        handle,
        transactions=TransactionPolicy(transactional_id="orders-0"),
        **kwargs,
    )
    assert consumer._txn is not None
    engine = consumer._txn.consumer
    try:
        guard = engine._crash
        if deaths is None:
            assert guard is None
        else:
            assert guard is not None and (guard.max_deaths, guard.window) == (deaths, window)
    finally:
        engine.close()


def test_crash_loop_protection_off_is_accepted_without_transactions() -> None:
    """The control of the refusals: without transactions= there is no protection, so
    max_process_deaths=None (off) asks for what happens and is accepted, as are the
    defaults."""

    async def handle(msg: Message) -> None:
        return None

    config = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    AsyncResilientConsumer(config, ["orders"], handle, max_process_deaths=None)
    AsyncResilientConsumer(config, ["orders"], handle, max_process_deaths=3, crash_probe_records=20)


def test_a_plain_function_handler_is_refused_with_transactions_too() -> None:
    def handle(msg: Message) -> None:
        return None

    with pytest.raises(TypeError, match="not an async function"):
        AsyncResilientConsumer(
            {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
            ["orders"],
            handle,  # type: ignore[arg-type]
            transactions=TransactionPolicy(transactional_id="orders-0"),
        )


# --------------------------------------------------------------------------- the example


@pytest.mark.integration
@pytest.mark.asyncio
async def test_the_aio_exactly_once_example_doubles_each_record_exactly_once(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    source, target = topic_factory(partitions=3), topic_factory(partitions=3)
    dlq = topic_factory(name=source + ".dlq")
    _seed(bootstrap, source, [b"%d" % i for i in range(30)] + [b"not a number"])
    spec = importlib.util.spec_from_file_location("aio_exactly_once", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    group, tid = _ids()
    code = await asyncio.wait_for(
        example.run(bootstrap, source, target, group, tid, stop_after=31), 120
    )
    assert code == 0
    assert sorted(_numbers(read_back(bootstrap, target))) == [2 * i for i in range(30)]
    assert [m.value() for m in read_back(bootstrap, dlq)] == [b"not a number"]
    assert _committed(bootstrap, group, source, 3) == 31
