"""AsyncResilientConsumer parity with ResilientConsumer, on the real cluster.

First the asyncio consumer's own parity features (health, leadership, callbacks, the
application's dead-letter producer); then ONE suite over both consumers (parametrised
``sync``/``aio``) for the guarantees promised for both (issue 37, acceptance 2): a lost
assignment never runs two handlers on one partition, the idle commit of the last stored
offset, retries then a dead letter byte for byte, nothing committed past an unhandled
record, a revoke waits for the handler in hand; a handler's own HTTP error follows the
RetryPolicy to the DLQ while a registry's is held as an outage; a failed dead-letter write
leaves its record uncommitted; the circuit breaker; dedupe; ``/ready`` after a lost
assignment that cannot rejoin (the network-fault cluster); a second signal interrupts the
handler in hand (real signals, a process).

The scenarios that mostly wait (a lost assignment, retries past ``max.poll.interval.ms``,
the signals to a consumer process) run in the background from the module's first test on
(the ``background`` fixture), while the others run; their tests come last and wait for their
own scenario's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest
import tenacity
from confluent_kafka import KafkaError, Message
from test_consumer_integration import TopicFactory, committed, ends, produce, with_dlq

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ConsumerHealth, RetryPolicy
from kresilient.deadletter import CircuitBreakerPolicy
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _conf(cluster: KafkaCluster, group: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": group or f"g-{uuid.uuid4().hex[:10]}",
        **extra,
    }


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.asyncio
async def test_health_reports_counts_holds_rebalances_breaker_and_leadership(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(None, b"%d-%d" % (p, i), None, p) for i in range(20) for p in (0, 1)],
    )
    attempts: dict[bytes, int] = defaultdict(int)
    release = asyncio.Event()
    stats: list[str] = []

    async def handle(msg: Message) -> None:
        value = msg.value() or b""
        attempts[value] += 1
        if value == b"1-3":
            raise ValueError("poison")  # dead-lettered at once
        if value == b"0-5" and not release.is_set():
            raise TimeoutError("downstream busy")  # retried: the partition is held

    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer = AsyncResilientConsumer(
        _conf(
            kafka_cluster,
            group,
            **{"statistics.interval.ms": 200, "stats_cb": stats.append},
        ),
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_never, wait=tenacity.wait_fixed(0.2)),
    )
    before = consumer.health()
    assert isinstance(before, ConsumerHealth) and not before.running
    task = asyncio.create_task(consumer.run())
    # partition 0 is held at offset 5 while the record keeps failing
    await _until(lambda: bool(consumer.health().held_partitions), 60, "a held partition")
    await _until(lambda: attempts[b"0-5"] >= 3, 60, "retries")
    held = consumer.health().held_partitions
    assert held[0]["topic"] == topic and held[0]["partition"] == 0 and held[0]["offset"] == 5
    assert held[0]["attempts"] >= 2
    release.set()
    await _until(lambda: consumer.processed + consumer.dead_lettered == 40, 60, "every record")
    # leadership from the consumer's own statistics (and the user's stats_cb still called)
    await _until(
        lambda: f"{topic}[0]" in consumer.health().leadership["partitions"], 60, "statistics"
    )
    health = consumer.health()
    consumer.stop()
    await asyncio.wait_for(task, 60)
    assert health.running and not health.stopping
    assert health.processed == 39 and health.dead_lettered == 1
    assert health.retries >= 2 and health.held_partitions == []
    assert health.dead_letters_pending == 0
    assert health.rebalances["assigned"] >= 1 and health.rebalances["lost"] == 0
    assert health.commit_failures == 0 and health.last_commit_error is None
    assert health.circuit_breaker is not None and not health.circuit_breaker["open"]
    lead = health.leadership
    assert lead["stats_ticks"] > 0 and lead["state"] == "stable"
    assert lead["partitions"][f"{topic}[0]"]["leader"] is not None
    assert stats, "the application's stats_cb was not called"
    after = consumer.health()
    assert not after.running and after.rebalances["revoked"] >= 1
    high = ends(kafka_cluster.bootstrap_servers, topic)
    assert committed(kafka_cluster.bootstrap_servers, group, topic, high) == high


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["async_producer", "sync_producer", "writer"])
async def test_dead_letters_through_the_applications_own_producer_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    from _producer_helpers import read_back
    from opentelemetry.sdk.trace import TracerProvider

    from kresilient.aio import AsyncResilientProducer
    from kresilient.deadletter import DeadLetterWriter, parse_dead_letter_headers
    from kresilient.producer import ResilientProducer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(
        bootstrap,
        topic,
        [
            (b"k%d" % i, b"bad-%d" % i if i in (3, 7) else b"ok", [("h", b"%d" % i)], None)
            for i in range(10)
        ],
    )

    async def handle(msg: Message) -> None:
        if (msg.value() or b"").startswith(b"bad"):
            raise ValueError("not an order")

    # a traced producer: it would add a traceparent header if asked to propagate
    tracing = TracerProvider()
    sink: Any
    if kind == "async_producer":
        sink = AsyncResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=tracing)
    elif kind == "sync_producer":
        sink = ResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=tracing)
    else:
        sink = DeadLetterWriter({"bootstrap.servers": bootstrap})
    group = f"g-{uuid.uuid4().hex[:10]}"
    consumer = AsyncResilientConsumer(
        _conf(kafka_cluster, group), [topic], handle, dead_letter_producer=sink
    )
    task = asyncio.create_task(consumer.run())
    await _until(lambda: consumer.processed + consumer.dead_lettered == 10, 60, "every record")
    consumer.stop()
    await asyncio.wait_for(task, 60)
    assert consumer.dead_lettered == 2
    assert consumer._writer is None  # no writer of its own: the application's client wrote
    records = sorted(read_back(bootstrap, dlq), key=lambda r: r.key() or b"")
    assert [(r.key(), r.value()) for r in records] == [(b"k3", b"bad-3"), (b"k7", b"bad-7")]
    for r in records:
        names = [name for name, _ in r.headers() or []]
        assert "traceparent" not in names  # byte for byte: nothing of the producer's added
        info = parse_dead_letter_headers(r.headers())
        assert info.original_topic == topic and info.consumer_group == group
        assert info.original_headers == (("h", r.key()[1:]),)  # type: ignore[index]
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high
    # the application's client is not closed by the consumer
    if kind == "async_producer":
        await (await sink.produce(dlq, b"still open"))
        await sink.close()
    elif kind == "sync_producer":
        sink.produce(dlq, b"still open").result(30)
        sink.close()
    else:
        sink.close()


# =========================================================================== one suite, both
# The guarantees promised for both consumers, checked by the SAME test bodies (issue 37,
# acceptance 2): each test below runs once with ResilientConsumer ("sync") and once with
# AsyncResilientConsumer ("aio"), through _Harness. Handlers are written once, as coroutines:
# the aio consumer awaits them; the sync consumer runs each to completion on an event loop of
# its own thread (an `await` there holds the consumer, as a blocking call would). Where the
# two consumers differ by design (the sync one runs one handler at a time), the scenario says
# so with `harness.concurrent`; the assertions are the same.

KINDS = ["sync", "aio"]


class _Harness:
    """Run a consumer of either kind in a thread of its own: ``stop()``, ``health()``,
    ``error`` (what ``run()`` raised)."""

    def __init__(
        self,
        kind: str,
        config: dict[str, Any],
        topics: list[str],
        handler: Any,
        *,
        max_concurrency: int = 2,
        batch: bool = False,
        **options: Any,
    ) -> None:
        from kresilient.consumer import ResilientConsumer

        self.kind = kind
        #: handlers of several partitions run at once (aio with max_concurrency > 1)
        self.concurrent = kind == "aio" and max_concurrency > 1
        self.error: BaseException | None = None
        self.consumer: Any
        if kind == "sync":
            loop = asyncio.new_event_loop()  # used by the consumer's thread only

            def handle(msg: Message) -> None:
                loop.run_until_complete(handler(msg))

            def handle_batch(msgs: list[Message]) -> None:  # the sync consumer's batch mode
                for msg in msgs:
                    handle(msg)

            self._loop = loop
            # a quicker stop when idle (one consume() call waits this long)
            options.setdefault("poll_timeout", 0.2)
            self.consumer = ResilientConsumer(
                config,
                topics,
                None if batch else handle,
                batch_handler=handle_batch if batch else None,
                install_signal_handlers=False,
                **options,
            )
        else:
            self._loop = None
            self.consumer = AsyncResilientConsumer(
                config,
                topics,
                handler,
                max_concurrency=max_concurrency,
                handle_signals=False,
                **options,
            )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.kind == "sync":
                self.consumer.run()
            else:
                asyncio.run(self.consumer.run())
        except BaseException as exc:
            self.error = exc
        finally:
            if self._loop is not None:
                self._loop.close()

    def health(self) -> ConsumerHealth:
        return self.consumer.health()  # type: ignore[no-any-return]

    @property
    def running(self) -> bool:
        """run() has not returned (or raised) yet."""
        return self._thread.is_alive()

    def join(self, timeout: float = 120) -> None:
        """Wait for run() to end by itself (it raised, or the handler stopped it)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the {self.kind} consumer did not end"

    def stop(self, timeout: float = 120) -> None:
        self.consumer.stop()
        self.join(timeout)


class _Tracker:
    """What the handlers did: calls per record, handlers in hand per partition, and every
    time a handler started on a partition that already had one in hand (an overlap)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active: dict[int, int] = defaultdict(int)
        self.started: dict[tuple[int, int], int] = defaultdict(int)
        self.finished: dict[tuple[int, int], int] = defaultdict(int)  # returned normally
        self.overlaps: list[tuple[int, int]] = []
        self.problems: list[str] = []  # a handler's own wait that timed out

    @contextlib.contextmanager
    def handling(self, msg: Message) -> Iterator[int]:
        """Around a handler's body; yields which call of this record it is (1: the first)."""
        p, o = msg.partition() or 0, msg.offset() or 0
        with self._lock:
            self.active[p] += 1
            if self.active[p] > 1:
                self.overlaps.append((p, o))
            self.started[(p, o)] += 1
            call = self.started[(p, o)]
        try:
            yield call
            with self._lock:
                self.finished[(p, o)] += 1
        finally:
            with self._lock:
                self.active[p] -= 1

    async def until(self, predicate: Any, timeout: float, what: str) -> bool:
        """Await ``predicate()`` (checked in a thread: it may call the cluster)."""
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(predicate):
            if time.monotonic() > deadline:
                self.problems.append(f"a handler waited {timeout} s in vain for {what}")
                return False
            await asyncio.sleep(0.05)
        return True

    def hold_until(self, predicate: Any, timeout: float, what: str) -> None:
        """Wait for ``predicate()`` WITHOUT awaiting: holds the consumer's thread (sync) or
        the event loop (aio), so the consumer does not poll meanwhile."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                self.problems.append(f"a handler held on {timeout} s in vain for {what}")
                return
            time.sleep(0.1)


class _Group:
    """The group as the cluster sees it (members, state, committed offsets): one admin
    client and one offsets client for the test, not one per check."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        self.group, self.topic = group, topic
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._offsets = Consumer({"bootstrap.servers": bootstrap, "group.id": group})

    def describe(self) -> Any:
        return self._admin.describe_consumer_groups([self.group])[self.group].result(timeout=30)

    def members(self) -> int:
        return len(self.describe().members)

    def rebalancing(self) -> bool:
        from confluent_kafka import ConsumerGroupState

        desc = self.describe()
        return len(desc.members) > 1 or desc.state != ConsumerGroupState.STABLE

    def committed(self, partitions: Any) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        got = self._offsets.committed(
            [TopicPartition(self.topic, p) for p in partitions], timeout=30
        )
        return {tp.partition: tp.offset for tp in got}

    def close(self) -> None:
        self._offsets.close()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _lost_assignment(kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str) -> None:
    """The body of test_parity_a_lost_assignment_never_runs_two_handlers_on_one_partition
    (below; run in the background)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    cluster = _Group(bootstrap, group, topic)
    track = _Tracker()
    harness: _Harness

    async def handle(msg: Message) -> None:
        with track.handling(msg) as call:
            if call > 1:
                return
            if msg.value() == b"blocker":  # no poll: the member is thrown out of the group
                track.hold_until(lambda: cluster.members() == 0, 120, "the group to empty")
            elif msg.value() == b"in-hand" and harness.concurrent:
                # in hand through the loss, until its record is handed out again (the
                # defect) or the consumer cancels it (after shutdown_timeout)
                key = (msg.partition() or 0, msg.offset() or 0)
                await track.until(lambda: track.started[key] > 1, 180, "a second call")

    harness = _Harness(
        kind,
        _conf(
            kafka_cluster,
            group,
            **{
                "max.poll.interval.ms": 7000,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
            },
        ),
        [topic],
        handle,
        shutdown_timeout=5,
    )
    try:
        produce(bootstrap, topic, [(b"k0", b"in-hand", None, 0)])
        _wait(lambda: track.started[(0, 0)] >= 1, 90, "the handler on p0")
        produce(bootstrap, topic, [(b"k1", b"blocker", None, 1)])
        _wait(lambda: harness.health().rebalances["lost"] >= 1, 120, "the loss")
        # both handled to the end and committed after the partitions came back (what was
        # handled before the loss could not be committed: it is handled again)
        _wait(lambda: cluster.committed([0, 1]) == {0: 1, 1: 1}, 120, "both committed")
    finally:
        harness.stop()
        cluster.close()
    assert harness.error is None, harness.error
    assert track.problems == []
    assert track.overlaps == [], f"two handlers at once on one partition: {track.overlaps}"
    assert harness.health().rebalances["lost"] >= 1  # the fault was real
    assert track.finished[(0, 0)] >= 1 and track.finished[(1, 0)] >= 1


@pytest.mark.parametrize("kind", KINDS)
def test_parity_idle_consumer_commits_the_last_stored_offset_on_its_interval(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """enable.auto.commit=false: what was handled is committed every auto.commit.interval.ms,
    also when nothing arrives after it (issue 37 #7: on c15a167 the asyncio consumer committed
    only in a poll step that stored something, so the offsets stored within an interval of
    the previous commit stayed uncommitted while idle: a crash then redid handled work)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    cluster = _Group(bootstrap, group, topic)
    track = _Tracker()

    async def handle(msg: Message) -> None:
        with track.handling(msg):
            pass

    harness = _Harness(
        kind,
        _conf(
            kafka_cluster, group, **{"enable.auto.commit": False, "auto.commit.interval.ms": 5000}
        ),
        [topic],
        handle,
    )
    try:
        produce(bootstrap, topic, [(b"k", b"first", None, 0)])
        _wait(lambda: cluster.committed([0]) == {0: 1}, 60, "the first record committed")
        # the next record comes within the interval of that commit, then nothing more
        produce(bootstrap, topic, [(b"k", b"last", None, 0)])
        _wait(lambda: track.finished[(0, 1)] == 1, 60, "the last record handled")
        _wait(lambda: cluster.committed([0]) == {0: 2}, 60, "the idle commit of the last one")
    finally:
        harness.stop()
        cluster.close()
    assert harness.error is None, harness.error


@pytest.mark.parametrize("kind", KINDS)
def test_parity_retried_then_dead_lettered_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """A record failing with a retriable error is retried (RetryPolicy), then dead-lettered
    byte for byte (key, value, headers, original coordinates); one failing once is handled
    by its retry and not dead-lettered; everything committed."""
    from _producer_helpers import read_back

    from kresilient.deadletter import parse_dead_letter_headers

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    track = _Tracker()
    headers = [("h", b"\x00\xffbin"), ("h", b"twice"), ("empty", None)]
    produce(
        bootstrap,
        topic,
        [
            (b"k0", b"ok", None, 0),
            (b"\x00key", b"\xfe\xffalways", headers, 0),
            (b"k2", b"once", [("x", b"1")], 0),
            (b"k3", b"ok", None, 0),
        ],
    )

    async def handle(msg: Message) -> None:
        with track.handling(msg) as call:
            if msg.value() == b"\xfe\xffalways" or (msg.value() == b"once" and call == 1):
                raise TimeoutError("downstream busy")

    harness = _Harness(
        kind,
        _conf(kafka_cluster, group),
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.05)),
    )
    try:
        _wait(lambda: harness.health().dead_lettered == 1, 60, "the dead letter")
        _wait(lambda: track.finished[(0, 3)] == 1, 60, "every record")
    finally:
        harness.stop()
    assert harness.error is None, harness.error
    assert track.started[(0, 1)] == 3 and track.finished[(0, 1)] == 0  # 3 attempts, then DLQ
    assert track.started[(0, 2)] == 2 and track.finished[(0, 2)] == 1  # retried, handled
    [letter] = read_back(bootstrap, dlq)
    assert (letter.key(), letter.value()) == (b"\x00key", b"\xfe\xffalways")
    info = parse_dead_letter_headers(letter.headers())
    assert info.original_headers == tuple(headers)
    assert (info.original_topic, info.original_partition, info.original_offset) == (topic, 0, 1)
    assert info.consumer_group == group and info.attempts == 3
    assert committed(bootstrap, group, topic, [0]) == {0: 4}


@pytest.mark.parametrize("kind", KINDS)
def test_parity_nothing_committed_past_an_unhandled_record(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """A handler in hand on p0 offset 3 (the records before it handled, the other partition
    flowing and committed meanwhile): the committed offset of p0 stays at 3 while it is in
    hand, with commits going on; after it returns, everything is committed."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    cluster = _Group(bootstrap, group, topic)
    track = _Tracker()
    release = threading.Event()
    produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(8)])

    async def handle(msg: Message) -> None:
        with track.handling(msg):
            if msg.partition() == 0 and msg.offset() == 3:
                await track.until(release.is_set, 180, "the release")

    harness = _Harness(
        kind, _conf(kafka_cluster, group, **{"auto.commit.interval.ms": 500}), [topic], handle
    )
    try:
        _wait(lambda: track.started[(0, 3)] == 1, 60, "the handler in hand")
        if kind == "aio":
            # it stores each record's offset once handled, and polls on meanwhile: what came
            # before is committed, and the other partition flows and is committed (commits
            # go on while the record is in hand). The sync consumer stores a batch's offsets
            # once the batch is done and does not poll while a handler runs: it commits
            # nothing meanwhile (checked below: not past 3).
            _wait(lambda: cluster.committed([0])[0] == 3, 60, "what came before committed")
            produce(bootstrap, topic, [(b"k", b"p1-%d" % i, None, 1) for i in range(5)])
            _wait(lambda: cluster.committed([1])[1] == 5, 60, "p1 committed meanwhile")
        committed_p0 = cluster.committed([0])[0]
        release.set()
        _wait(lambda: track.finished[(0, 7)] == 1, 60, "every record")
    finally:
        release.set()
        harness.stop()
        cluster.close()
    assert harness.error is None, harness.error
    assert committed_p0 <= 3 if kind == "sync" else committed_p0 == 3
    assert track.overlaps == [] and track.problems == []
    assert committed(bootstrap, group, topic, [0])[0] == 8


@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_revoke_waits_for_the_handler_in_hand(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """A second member joins while the first has a handler in hand on each partition (still
    working when the rebalance begins): the revoked partition's record in hand is finished
    and committed before the partition moves, so every record is handled exactly once and
    never by two handlers at once."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    cluster = _Group(bootstrap, group, topic)
    track = _Tracker()
    produce(
        bootstrap, topic, [(b"k", b"%d-%d" % (p, i), None, p) for i in range(20) for p in (0, 1)]
    )

    async def handle(msg: Message) -> None:
        with track.handling(msg):
            if msg.offset() == 5:
                await track.until(cluster.rebalancing, 120, "the second member")
                # the handler's own work goes on after the rebalance began: the revoke must
                # wait for it (a scenario length, not a wait for a condition)
                await asyncio.sleep(2)

    first = _Harness(kind, _conf(kafka_cluster, group), [topic], handle)
    second: _Harness | None = None
    try:
        _wait(lambda: any(track.started[(p, 5)] for p in (0, 1)), 60, "a handler in hand")
        second = _Harness(kind, _conf(kafka_cluster, group), [topic], handle)
        _wait(lambda: sum(track.finished.values()) >= 40, 120, "every record")
        _wait(lambda: second.health().rebalances["assigned"] >= 1, 60, "the second member")
    finally:
        first.stop()
        if second is not None:
            second.stop()
        cluster.close()
    assert first.error is None and second.error is None
    assert track.overlaps == [] and track.problems == []
    assert first.health().rebalances["revoked"] >= 1  # the fault (a revoke) was real
    assert {k: n for k, n in track.started.items() if n != 1} == {}  # each exactly once
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high


# --------------------------------------------------------------------------- failures
# A handler's failure, a dead-letter write that fails, the circuit breaker, dedupe: each
# moved here from a test of one consumer (tests/test_consumer_seams.py,
# tests/test_consumer_failure_paths.py, tests/test_consumer_integration.py,
# tests/test_aio_consumer.py, tests/test_dedupe_consumer.py, tests/test_aio_dedupe.py), with
# its assertions and controls, now run on both.

THREE_TRIES = RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.05))
#: an outage policy that retries fast, so a record wrongly held shows many attempts at once
FAST_OUTAGE = RetryPolicy(
    stop=tenacity.stop_never, wait=tenacity.wait_fixed(0.05), retry=tenacity.retry_always
)


def _captured_log() -> tuple[Any, list[str]]:
    """A structlog logger keeping each event's name (and dropping the line): the consumer's
    ``logger=``, so a test waits for what the consumer says, not for a time."""
    import structlog

    events: list[str] = []

    def capture(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(str(event["event"]))
        raise structlog.DropEvent

    return structlog.wrap_logger(None, processors=[capture]), events


def _held_attempts(harness: _Harness) -> int:
    held = harness.health().held_partitions
    return max((h["attempts"] for h in held), default=0)


@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_handlers_own_http_error_follows_the_retry_policy_to_the_dlq(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, closed_port: int, kind: str
) -> None:
    """The handler's HTTP dependency refuses connections (a real ``requests`` error): three
    attempts (the user's RetryPolicy), then the DLQ, and the partition flows on (issue 35
    #1: it was held as a Schema Registry outage, retried without end, never dead-lettered).
    Controls: test_parity_a_registry_transport_error_is_still_held_as_an_outage."""
    import requests
    from _producer_helpers import read_back

    from kresilient.deadletter import parse_dead_letter_headers

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k", b"call-the-api", None, None), (b"k", b"ok", None, None)])
    calls: list[bytes] = []

    async def handle(msg: Message) -> None:
        calls.append(msg.value())  # type: ignore[arg-type]
        if msg.value() == b"call-the-api":
            url = f"http://127.0.0.1:{closed_port}/price"
            await asyncio.to_thread(requests.get, url, timeout=5)

    harness = _Harness(
        kind,
        _conf(kafka_cluster),
        [topic],
        handle,
        retry=THREE_TRIES,
        outage_retry=FAST_OUTAGE,
    )
    try:
        # either outcome ends the wait: "ok" handled (the fix), or far more attempts than the
        # policy allows (held as an outage)
        _wait(
            lambda: b"ok" in calls or calls.count(b"call-the-api") >= 10,
            90,
            "the record after the failing one, or many attempts of the failing one",
        )
        _wait(
            lambda: (
                harness.health().dead_lettered == 1 and harness.health().dead_letters_pending == 0
            ),
            30,
            "the dead letter acknowledged",
        )
    finally:
        harness.stop()
    assert harness.error is None, harness.error
    assert calls.count(b"call-the-api") == 3, calls
    assert calls[-1] == b"ok"
    (record,) = read_back(bootstrap, dlq)
    info = parse_dead_letter_headers(record.headers())
    assert record.value() == b"call-the-api"
    assert info.exception_type == "requests.exceptions.ConnectionError"
    assert info.attempts == 3 and info.original_topic == topic


@pytest.mark.parametrize(
    ("kind", "where"),
    [
        ("sync", "deserializer"),  # the asyncio consumer takes no deserializer
        ("sync", "handler-calls-registry-client"),
        ("aio", "handler-calls-registry-client"),
    ],
)
def test_parity_a_registry_transport_error_is_still_held_as_an_outage(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    closed_port: int,
    kind: str,
    where: str,
) -> None:
    """Control of the test above: the same kind of error (a refused connection), raised by
    the registry client (through the deserializer, or called by the handler itself), is held
    well past the user's three attempts and never dead-lettered."""
    from _producer_helpers import read_back

    sr = pytest.importorskip("confluent_kafka.schema_registry")
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    framed = b"\x00" + (1).to_bytes(4, "big") + b'{"n": 1}'  # schema id 1
    produce(bootstrap, topic, [(b"k", framed, None, None)])
    client = sr.SchemaRegistryClient({"url": f"http://127.0.0.1:{closed_port}", "max.retries": 0})
    calls: list[Any] = []

    async def handle(msg: Message) -> None:
        calls.append(msg.value())
        if where == "handler-calls-registry-client":
            await asyncio.to_thread(client.get_schema, 1)

    extra: dict[str, Any] = {}
    if where == "deserializer":
        extra["value_deserializer"] = JSONDeserializer(None, schema_registry_client=client)
    harness = _Harness(
        kind,
        _conf(kafka_cluster),
        [topic],
        handle,
        retry=THREE_TRIES,
        outage_retry=FAST_OUTAGE,
        **extra,
    )
    try:
        _wait(lambda: _held_attempts(harness) >= 6, 90, "the outage hold past 3 attempts")
        health = harness.health()
    finally:
        harness.stop()
    assert harness.error is None, harness.error
    assert health.dead_lettered == 0 and health.dead_letters_pending == 0
    assert read_back(bootstrap, dlq) == []
    if where == "deserializer":
        assert calls == []  # never deserialized, never handed to the handler


@pytest.mark.parametrize("how", ["refused", "failing-later"])
@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_failed_dead_letter_write_leaves_the_record_uncommitted(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str, how: str
) -> None:
    """Offset 6 is poison (dead-lettered at once) and its dead-letter write fails:
    ``refused`` at once by the dead-letter producer (larger than its message.max.bytes), or
    ``failing-later``: accepted but never acknowledged (its topic does not exist;
    message.timeout.ms 1 s). Both consumers: the committed offset stays at the poison
    offset 6 (docs/consumer.md, docs/asyncio.md: never committed past a record neither
    handled nor dead-lettered). How they get there differs by design: the sync consumer
    stops with DeadLetterError (with ``failing-later`` the partition flowed past the dead
    letter meanwhile: 7-9 handled, not committed); the asyncio consumer retries the write
    with the partition held at 6 (0.5 s .. 10 s apart), nothing after it handled, until
    stopped."""
    from kresilient.deadletter import DeadLetterPolicy
    from kresilient.errors import DeadLetterError

    bootstrap = kafka_cluster.bootstrap_servers
    options: dict[str, Any]
    if how == "refused":
        topic, _ = with_dlq(topic_factory)
        options = {"dead_letter_producer_config": {"message.max.bytes": 2000}}
    else:
        topic = topic_factory(partitions=1)  # no .dlq topic
        options = {
            "dead_letter": DeadLetterPolicy(require_topic=False),
            "dead_letter_producer_config": {"message.timeout.ms": 1000},
        }
    produce(
        bootstrap, topic, [(b"k", b"x" * 5000 if i == 6 else b"%d" % i, None, 0) for i in range(10)]
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    handled: list[int] = []
    log, events = _captured_log()

    async def handle(msg: Message) -> None:
        if len(msg.value() or b"") > 100:
            raise ValueError("poison")
        handled.append(msg.offset())  # type: ignore[arg-type]

    harness = _Harness(
        kind,
        _conf(kafka_cluster, group, **{"enable.auto.commit": False}),
        [topic],
        handle,
        logger=log,
        **options,
    )
    held: list[dict[str, Any]] = []
    try:
        if kind == "sync":
            harness.join(120)  # run() ends by itself, raising DeadLetterError
        else:
            _wait(
                lambda: events.count("dead_letter_failed") >= 2,
                120,
                "the dead-letter write failed, then failed again when retried",
            )
            held = harness.health().held_partitions
            assert harness.health().dead_letters_pending == 1
    finally:
        harness.stop()
    if kind == "sync":
        assert isinstance(harness.error, DeadLetterError), harness.error
        if how == "failing-later":
            assert handled == [0, 1, 2, 3, 4, 5, 7, 8, 9]  # flowed past the dead letter
    else:
        assert harness.error is None, harness.error
        assert [(h["partition"], h["offset"]) for h in held] == [(0, 6)]
        assert handled == [0, 1, 2, 3, 4, 5]  # held at the record being dead-lettered
        assert harness.health().dead_lettered == 0
    assert committed(bootstrap, group, topic, [0]) == {0: 6}


@pytest.mark.parametrize("kind", KINDS)
def test_parity_one_percent_poison_goes_to_the_dlq_byte_for_byte(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """10,000 records on 3 partitions, 1 % poison (the handler's ValueError: dead-lettered
    at once, not retried): every poison record in the DLQ with identical key, value and
    headers (binary, empty, in order) plus the kresilient headers (original coordinates,
    group, POISON, one attempt, timestamps); every other record handled once; no offset
    committed ahead of its handling or of its dead letter's acknowledgement (the commits seen
    by ``on_commit``, the acknowledgements by the application's dead-letter producer's
    ``on_delivery``); everything committed at the end."""
    from _producer_helpers import read_back
    from confluent_kafka import TopicPartition

    from kresilient.deadletter import parse_dead_letter_headers
    from kresilient.producer import ResilientProducer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=3)
    n = 10_000
    items: list[Any] = []
    for i in range(n):
        headers: list[tuple[str, bytes | None]] = [
            ("id", b"%d" % i),
            ("bin", bytes([i % 256, 0, 255])),
            ("empty", None),
        ]
        if i % 100 == 42:
            items.append((b"\x00key%d" % i, b"\xff\xfepoison%d" % i, headers, None))
        else:
            items.append((b"key%d" % i, json.dumps({"i": i}).encode(), headers, None))
    where = produce(bootstrap, topic, items)
    poison = {where[i]: items[i] for i in range(n) if i % 100 == 42}
    good = {where[i] for i in range(n) if i % 100 != 42}
    where_of_value = {item[1]: at for at, item in poison.items()}
    # appended by the handler, the consumer's commit callback and the dead-letter producer's
    # delivery callback (list.append is atomic); each event follows what caused it
    events: list[tuple[str, Any]] = []
    handled: set[tuple[int, int]] = set()

    def acked(err: Any, msg: Message) -> None:  # delivery reports carry no headers
        assert err is None
        events.append(("dlq-acked", where_of_value[msg.value()]))  # type: ignore[index]

    def on_commit(err: Any, partitions: list[TopicPartition]) -> None:
        if err is None:
            events.append(
                ("commit", [(p.partition, p.offset) for p in partitions if p.offset >= 0])
            )

    async def handle(msg: Message) -> None:
        value = json.loads(msg.value() or b"")  # poison: ValueError, not retried
        assert isinstance(value, dict)
        handled.add((msg.partition(), msg.offset()))  # type: ignore[arg-type]
        events.append(("handled", (msg.partition(), msg.offset())))

    group = f"g-{uuid.uuid4().hex[:10]}"
    dlq_producer = ResilientProducer({"bootstrap.servers": bootstrap, "on_delivery": acked})
    harness = _Harness(
        kind,
        _conf(kafka_cluster, group, on_commit=on_commit, **{"auto.commit.interval.ms": 200}),
        [topic],
        handle,
        dead_letter_producer=dlq_producer,
        retry=THREE_TRIES,
    )
    try:
        _wait(
            lambda: len(handled) == len(good) and harness.health().dead_lettered == len(poison),
            180,
            "every record handled or dead-lettered",
        )
    finally:
        harness.stop()
        dlq_producer.close()
    assert harness.error is None, harness.error
    assert handled == good
    records = read_back(bootstrap, dlq)
    assert len(records) == len(poison) == 100
    for record in records:
        info = parse_dead_letter_headers(record.headers())
        at = (info.original_partition, info.original_offset)
        key, value, headers, _ = poison[at]  # type: ignore[index]
        assert record.key() == key and record.value() == value
        assert list(info.original_headers) == headers
        assert record.headers()[: len(headers or [])] == headers
        assert info.original_topic == topic and info.consumer_group == group
        # json.loads(b"\xff\xfe...") guesses UTF-16 from the BOM; either way a ValueError
        assert info.exception_type in ("UnicodeDecodeError", "json.decoder.JSONDecodeError")
        assert info.exception_short_type in ("UnicodeDecodeError", "JSONDecodeError")
        assert info.error_category == "poison" and info.attempts == 1
        assert info.original_timestamp is not None and info.failed_at is not None
    # no offset committed ahead of its handling or its dead letter's acknowledgement
    done: set[tuple[int, int]] = set()
    commits = 0
    for what, data in list(events):
        if what in ("handled", "dlq-acked"):
            done.add(data)
        else:
            commits += 1
            for partition, offset in data:
                below = {(partition, o) for o in range(offset)}
                assert below <= done, f"committed {partition}@{offset} ahead of its handling"
    assert commits > 0
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high
    assert harness.health().dead_lettered == 100


@pytest.mark.parametrize(
    ("policy", "dead_lettered"),
    [
        (CircuitBreakerPolicy(max_consecutive=20), 20),
        # 50 good, then every message poison: the 49th dead letter makes 50/100 > 0.2
        (
            CircuitBreakerPolicy(max_consecutive=None, max_ratio=0.2, window=600, min_messages=100),
            49,
        ),
    ],
    ids=["consecutive", "ratio"],
)
@pytest.mark.parametrize("kind", KINDS)
def test_parity_the_circuit_breaker_opens_on_a_poison_flood_and_commits_first(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    kind: str,
    policy: CircuitBreakerPolicy,
    dead_lettered: int,
) -> None:
    """50 good records, 300 poison, 50 good: the breaker opens (at most ``max_consecutive``
    dead letters in a row, or the ratio over the window), run() raises
    CircuitBreakerOpenError after committing what was handled and dead-lettered; the record
    that opened it is neither dead-lettered nor committed."""
    from _producer_helpers import read_back

    from kresilient.deadletter import parse_dead_letter_headers
    from kresilient.errors import CircuitBreakerOpenError

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    values = [b"{}"] * 50 + [b"poison"] * 300 + [b"{}"] * 50
    produce(bootstrap, topic, [(None, v, None, None) for v in values])
    handled: list[int] = []

    async def handle(msg: Message) -> None:
        json.loads(msg.value() or b"")  # poison: a ValueError, dead-lettered at once
        handled.append(msg.offset())  # type: ignore[arg-type]

    group = f"g-{uuid.uuid4().hex[:10]}"
    harness = _Harness(kind, _conf(kafka_cluster, group), [topic], handle, circuit_breaker=policy)
    harness.join(120)
    assert isinstance(harness.error, CircuitBreakerOpenError), harness.error
    assert "circuit breaker open" in str(harness.error)
    assert handled == list(range(50))
    records = read_back(bootstrap, dlq)
    assert [parse_dead_letter_headers(r.headers()).original_offset for r in records] == list(
        range(50, 50 + dead_lettered)
    )
    # the message that tripped the breaker was neither dead-lettered nor committed
    assert committed(bootstrap, group, topic, [0]) == {0: 50 + dead_lettered}
    health = harness.health()
    assert health.dead_lettered == dead_lettered
    assert health.circuit_breaker is not None and health.circuit_breaker["open"] is True


def _max_poll(kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str) -> None:
    """The body of test_parity_failing_longer_than_max_poll_interval_causes_no_rebalance
    (below; run in the background)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=3)
    produce(bootstrap, topic, [(None, b"p0-%d" % i, None, 0) for i in range(50)])
    produce(bootstrap, topic, [(None, b"p1-%d" % i, None, 1) for i in range(10)])
    produce(bootstrap, topic, [(None, b"p2-%d" % i, None, 2) for i in range(3)])
    max_poll_s = 7.0
    awaits = kind == "aio"  # a handler awaiting past max.poll.interval.ms (partition 2)
    events: list[tuple[int, int, bytes]] = []
    errors: list[int] = []
    failing_since: list[float] = []
    failed_attempts: list[float] = []
    succeeded_at: list[float] = []
    waited: list[float] = []

    async def handle(msg: Message) -> None:
        p, o = msg.partition(), msg.offset()
        if p == 0 and o == 10:
            if not failing_since:
                failing_since.append(time.monotonic())
            if time.monotonic() - failing_since[0] < max_poll_s + 3:
                failed_attempts.append(time.monotonic())
                raise ConnectionError("downstream unavailable")
            succeeded_at.append(time.monotonic())
        if awaits and p == 2 and o == 0:
            began = time.monotonic()
            await _until(lambda: bool(succeeded_at), 120, "record 10 to succeed")
            waited.append(time.monotonic() - began)
        events.append((p, o, msg.value() or b""))  # type: ignore[arg-type]

    harness = _Harness(
        kind,
        _conf(
            kafka_cluster,
            **{
                "max.poll.interval.ms": int(max_poll_s * 1000),
                "session.timeout.ms": 6000,
                "error_cb": lambda err: errors.append(err.code()),
            },
        ),
        [topic],
        handle,
        max_concurrency=3,
        retry=RetryPolicy(stop=tenacity.stop_after_delay(120), wait=tenacity.wait_fixed(0.5)),
    )
    try:
        _wait(lambda: bool(failing_since), 60, "the hold of record 10")
        # partition 1 gets new records while partition 0 is held
        produce(bootstrap, topic, [(None, b"p1-late-%d" % i, None, 1) for i in range(20)])
        _wait(lambda: len(events) == 50 + 10 + 20 + 3, 120, "every record")
        rebalances = dict(harness.health().rebalances)
    finally:
        harness.stop()
    assert harness.error is None, harness.error
    assert rebalances == {"assigned": 1, "revoked": 0, "lost": 0}  # the one join
    assert harness.health().rebalances["revoked"] == 1  # the final leave
    assert KafkaError._MAX_POLL_EXCEEDED not in errors, errors
    p0 = [o for p, o, _ in events if p == 0]
    assert p0 == list(range(50))  # order kept, nothing skipped
    held_done = events.index((0, 10, b"p0-10"))
    late = [i for i, (p, _, v) in enumerate(events) if p == 1 and v.startswith(b"p1-late")]
    assert len(late) == 20 and max(late) < held_done  # partition 1 flowed during the hold
    # held past max.poll.interval.ms by retries made from the poll loop, each counted; how
    # many fit in the 10 s depends on the machine's load, not on the consumer
    assert succeeded_at[0] - failed_attempts[0] > max_poll_s
    assert harness.health().retries == len(failed_attempts) >= 2
    assert [o for p, o, _ in events if p == 2] == [0, 1, 2]
    if awaits:
        assert waited and waited[0] > max_poll_s  # the await really outlived the interval


# --------------------------------------------------------------------------- dedupe


def _dedupe_items() -> list[Any]:
    """(key, value, headers, partition): ids a..e; the ones dedupe must skip end in -skip."""
    from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER

    m: list[Any] = [(POSSIBLE_DUPLICATE_HEADER, b"true")]
    u: list[Any] = []

    def rec(name: str, ident: bytes, extra: list[Any], part: int) -> Any:
        return (ident, name.encode(), [(MESSAGE_ID_HEADER, ident), *extra], part)

    return [
        rec("a1", b"a", u, 0),
        rec("b1", b"b", u, 0),
        rec("a2-skip", b"a", m, 0),  # marked copy of a handled id
        rec("c1-marked-unseen", b"c", m, 0),  # marked, first copy lost: handled
        rec("c2-skip", b"c", m, 0),  # marked copy of c, handled just before
        rec("b2-unmarked", b"b", u, 0),  # unmarked repeat: never skipped
        rec("a3-skip", b"a", m, 0),  # skipped every time it comes again
        rec("d1", b"d", u, 1),
        rec("d2-skip", b"d", m, 1),
        (b"e", b"e-no-id", m, 1),  # marked without an id: nothing to compare, handled
    ]


def _consume_all(
    kind: str,
    cluster: KafkaCluster,
    topic: str,
    total: int,
    *,
    dedupe: Any,
    batch: bool = False,
    max_concurrency: int = 1,
    meter_provider: Any = None,
) -> tuple[list[bytes], _Harness, str]:
    """Run until handled + skipped == ``total``; return the values the handler saw."""
    seen: list[bytes] = []

    async def handle(msg: Message) -> None:
        await asyncio.sleep(0)
        seen.append(msg.value() or b"")

    group = f"dedupe-{uuid.uuid4().hex[:10]}"
    harness = _Harness(
        kind,
        _conf(cluster, group),
        [topic],
        handle,
        batch=batch,
        max_concurrency=max_concurrency,
        dedupe=dedupe,
        dead_letter=None,  # the handler never fails
        meter_provider=meter_provider,
    )
    try:
        _wait(
            lambda: len(seen) + harness.health().duplicates_skipped >= total or not harness.running,
            180,
            f"{total} records handled or skipped",
        )
    finally:
        harness.stop()
    assert harness.error is None, harness.error
    return seen, harness, group


@pytest.mark.parametrize(
    ("kind", "variant"),
    [("sync", "per-message"), ("sync", "batch"), ("aio", "one-at-a-time"), ("aio", "concurrent")],
)
def test_parity_marked_copies_of_handled_ids_are_skipped_and_committed_past(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str, variant: str
) -> None:
    """``dedupe=`` (issue 20; the sync consumer per message and with a batch handler, the
    asyncio one with max_concurrency 1 and 4): marked copies of handled ids are skipped (the
    handler never sees them), unmarked repeats and marked records with an unseen id are
    handled; the skips are counted (``health()``, the ``...duplicates_skipped`` gauge) and
    logged at DEBUG with their ids, and offsets are committed past them. Control: the same
    records without ``dedupe`` are all handled."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from structlog.testing import capture_logs

    from kresilient.consumer._probes import DUPLICATES_METRIC
    from kresilient.dedupe import Deduplicator

    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(partitions=2)
    items = _dedupe_items()
    produce(bootstrap, topic, items)
    dedupe = Deduplicator(window=100)
    reader = InMemoryMetricReader()
    batch = variant == "batch"
    concurrency = 4 if variant == "concurrent" else 1
    with capture_logs() as logs:
        seen, harness, group = _consume_all(
            kind,
            kafka_cluster,
            topic,
            len(items),
            dedupe=dedupe,
            batch=batch,
            max_concurrency=concurrency,
            meter_provider=MeterProvider(metric_readers=[reader]),
        )
    expected = sorted(value for _, value, _, _ in items if not value.endswith(b"-skip"))
    assert sorted(seen) == expected
    skipped = [e for e in logs if e["event"] == "duplicate_skipped"]
    assert sorted(e["message_id"] for e in skipped) == ["a", "a", "c", "d"]
    assert all(e["log_level"] == "debug" for e in skipped)
    health = harness.health()
    assert health.duplicates_skipped == 4 == dedupe.dropped
    assert health.processed == len(expected)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        point.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == DUPLICATES_METRIC
        for point in metric.data.data_points
    ]
    assert points == [4]
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high  # past the skips

    # control: without dedupe every record is handled, the marked copies included
    seen2, harness2, _ = _consume_all(
        kind, kafka_cluster, topic, len(items), dedupe=None, batch=batch
    )
    assert sorted(seen2) == sorted(value for _, value, _, _ in items)
    assert harness2.health().duplicates_skipped == 0


# --------------------------------------------------------------------------- /ready


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.chaos
@pytest.mark.parametrize("kind", KINDS)
def test_parity_ready_turns_503_when_the_member_lost_its_partitions_and_cannot_rejoin(
    kafka_network_cluster: KafkaCluster, background: dict[str, Future[None]], kind: str
) -> None:
    """Every node is cut from the clients (the group coordinator unreachable): the session
    times out, the member loses its partitions (the fault is real: ``rebalances["lost"]``)
    and cannot rejoin. ``/live`` stays 200 (the loop polls), ``/ready`` must turn 503 within
    ``stall_after_s`` of the loss, naming it; after the heal it rejoins and is ready again
    (issue 35 suspicion: ``/ready`` stayed 200 with no partition)."""
    # The network cluster's fault proxies are threads of this process: no background
    # scenario competes with them for the interpreter (with some beside it, this test once
    # waited 90 s in vain for the loss)
    _settled(background)
    cluster = kafka_network_cluster
    topic = f"ready-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=2)
    produce(cluster.bootstrap_servers, topic, [(b"k", b"v", None, None)])

    async def handle(msg: Message) -> None:
        pass

    harness = _Harness(
        kind,
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        },
        [topic],
        handle,
        dead_letter=None,
        health_port=0,
        stall_after_s=3.0,
    )
    try:
        _wait(lambda: harness.consumer.health_port is not None, 60, "probe server")
        port = harness.consumer.health_port
        assert port is not None
        _wait(lambda: _get(port, "/ready")[0] == 200, 60, "ready before the fault")
        net = cluster.network
        for node in cluster.node_ids:
            net.isolate(node, peers=False)
        try:
            _wait(lambda: harness.health().rebalances["lost"] >= 1, 90, "partitions lost")
            _wait(lambda: _get(port, "/ready")[0] == 503, 30, "/ready 503 after the loss")
            status, body = _get(port, "/ready")
            assert status == 503 and any("lost its partitions" in r for r in body["reasons"])
            assert _get(port, "/live")[0] == 200  # the loop polls on: live, not ready
        finally:
            net.heal()
        _wait(lambda: _get(port, "/ready")[0] == 200, 120, "ready again after the heal")
    finally:
        harness.stop()
    assert harness.error is None, harness.error


# --------------------------------------------------------------------------- signals

WORKER = Path(__file__).with_name("test_consumer_parity_worker.py")


class _Worker:
    """A consumer process (tests/test_consumer_parity_worker.py, or ``script``) and its
    output so far."""

    def __init__(self, *args: str, script: Path = WORKER) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.lines: list[str] = []

    def read_until(self, needle: str, timeout: float) -> None:
        found = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if needle in line:
                    found.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if not found.is_set():
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"no {needle!r} within {timeout} s:\n{self.text}")

    def finish(self, timeout: float) -> int:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            self.lines.append(out or "")
            raise AssertionError(
                f"the worker did not exit within {timeout} s:\n{self.text}"
            ) from None
        self.lines.append(out)
        return self.proc.returncode

    @property
    def text(self) -> str:
        return "".join(self.lines)


def _second_signal(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, kind: str, mode: str
) -> None:
    """The body of test_parity_a_second_signal_interrupts_the_handler_in_hand
    (below; run in the background)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(3)])
    out = tmp_path / "out"
    worker = _Worker(
        "--kind", kind, "--bootstrap", bootstrap, "--topic", topic, "--group", group,
        "--out", str(out), "--mode", mode,
    )  # fmt: skip
    worker.read_until("stuck", 120)
    worker.proc.send_signal(signal.SIGINT)
    worker.read_until("stopping", 60)
    if mode != "control":
        worker.proc.send_signal(signal.SIGINT)
    code = worker.finish(120)  # far below shutdown_timeout: the handler did not end by itself
    text = worker.text
    assert "consumer_closed" in text, text
    handled = out.read_text().split("\n")[:-1] if out.exists() else []
    assert handled == ["handled 0 0"], text  # offset 2 never handed out after the stop
    if mode == "control":
        assert code == 0, text
        assert ends(bootstrap, dlq) == {0: 1}
        assert committed(bootstrap, group, topic, [0]) == {0: 2}
    else:
        assert code == 3 and "interrupted" in text, text
        assert ends(bootstrap, dlq) == {0: 0}, text  # never dead-lettered
        assert committed(bootstrap, group, topic, [0]) == {0: 1}, text  # 1 comes again


def _third_signal(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    tmp_path: Path,
    kind: str,
    third_signal: bool,
) -> None:
    """The body of test_parity_a_third_signal_aborts_a_held_shutdown
    (below; run in the background)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    out = str(tmp_path / "out")
    common = ("--bootstrap", bootstrap, "--topic", topic, "--group", group, "--out", out)
    if kind == "sync":
        produce(
            bootstrap,
            topic,
            [(b"k", b"poison" if i == 5 else b"%d" % i, None, 0) for i in range(10)],
        )
        worker = _Worker(
            *common, "--poison", "poison", "--slow-dead-letters", "--announce-after", "10",
            script=Path(__file__).with_name("consumer_worker.py"),
        )  # fmt: skip
        worker.read_until("handled-all", 120)
        worker.proc.send_signal(signal.SIGINT)
        worker.read_until("waiting-for-dead-letters", 60)
        worker.proc.send_signal(signal.SIGINT)
        if third_signal:
            worker.read_until("shutdown_signal_received", 60)  # the 2nd: only logged
    else:
        produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(3)])
        worker = _Worker(
            "--kind", "aio", *common, "--mode", "deaf" if third_signal else "plain",
            "--commit-interval-ms", "600000",
        )  # fmt: skip
        worker.read_until("stuck", 120)
        worker.proc.send_signal(signal.SIGINT)
        worker.read_until("stopping", 60)
        worker.proc.send_signal(signal.SIGINT)
        if third_signal:
            worker.read_until("deaf", 60)  # it ignored the cancellation: the shutdown waits
    if third_signal:
        worker.proc.send_signal(signal.SIGINT)
    code = worker.finish(120)
    text = worker.text
    if kind == "aio":  # the 2nd signal interrupted the handler in hand (the deaf one too)
        assert code == 3 and "interrupted" in text, text
        assert "handlers_interrupted" in text, text
    if third_signal:
        assert code != 0, text
        assert "shutdown_aborted" in text and "consumer_closed" not in text, text
        assert committed(bootstrap, group, topic, [0]) == {0: -1001}, text
    else:
        assert "shutdown_aborted" not in text and "consumer_closed" in text, text
        if kind == "sync":
            assert code == 0 and "shutdown_signal_received" in text, text
            # 0-4 handled, 5 dead-lettered but unacknowledged at the commit: 5 is committed
            assert committed(bootstrap, group, topic, [0]) == {0: 5}, text
        else:
            assert committed(bootstrap, group, topic, [0]) == {0: 1}, text  # 0 handled


# --------------------------------------------------------------------------- background
# The scenarios that mostly wait (for a poll interval, a rebalance, a consumer process) run
# in the background from the module's first test on, while the tests above run: the tests
# checking them come last and wait for their own scenario's end.

#: The background scenarios, by the test that checks each (its parameters are the
#: scenario's).
BACKGROUND: dict[str, Any] = {
    "test_parity_a_lost_assignment_never_runs_two_handlers_on_one_partition": _lost_assignment,
    "test_parity_failing_longer_than_max_poll_interval_causes_no_rebalance": _max_poll,
    "test_parity_a_second_signal_interrupts_the_handler_in_hand": _second_signal,
    "test_parity_a_third_signal_aborts_a_held_shutdown": _third_signal,
}
#: Background scenarios running at once: each takes 2 to 15 s, mostly waiting, so a few
#: side by side barely slow each other (or the test in front).
BACKGROUND_WORKERS = 3


@pytest.fixture(scope="module", autouse=True, name="background")
def _background(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[None]]]:
    """The background scenarios of the tests selected in this run, started at the module's
    first test, in the order of their tests. Nothing is shared but the cluster: own topics,
    groups, consumers and processes. A scenario's failure is its own test's (``result()``
    raises it there); leaving the fixture waits for every scenario to end."""
    items = [item for item in request.session.items if item.module is request.module]
    wanted = [i for i in items if getattr(i, "originalname", None) in BACKGROUND]
    if not wanted:
        yield {}
        return
    cluster: KafkaCluster = request.getfixturevalue("kafka_cluster")

    def topic_factory(partitions: int = 1, *, name: str | None = None) -> str:
        topic = name or f"t-parity-{uuid.uuid4().hex[:10]}"
        return cluster.create_topic(topic, partitions, 3, {"min.insync.replicas": 2})

    futures: dict[str, Future[None]] = {}
    with ThreadPoolExecutor(BACKGROUND_WORKERS, thread_name_prefix="parity") as pool:
        for item in wanted:
            run = BACKGROUND[item.originalname]  # type: ignore[attr-defined]
            params = dict(item.callspec.params)  # type: ignore[attr-defined]
            if "tmp_path" in inspect.signature(run).parameters:
                params["tmp_path"] = tmp_path_factory.mktemp("parity")
            futures[item.name] = pool.submit(run, cluster, topic_factory, **params)
        yield futures


def _verdict(background: dict[str, Future[None]], request: pytest.FixtureRequest) -> None:
    """Wait for this test's background scenario to end; raise what failed there (its own
    waits bound it; queued behind the others)."""
    background[request.node.name].result(timeout=600)


def _settled(background: dict[str, Future[None]]) -> None:
    """Wait for every background scenario to end (their failures are their own tests')."""
    wait(list(background.values()), timeout=600)


@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_lost_assignment_never_runs_two_handlers_on_one_partition(
    background: dict[str, Future[None]], request: pytest.FixtureRequest, kind: str
) -> None:
    """The assignment is lost (a handler holds the consumer past max.poll.interval.ms: the
    group throws the member out) while a handler is in hand on p0; the partitions come back
    to the same member. The record in hand is handled again only after its first handler
    ended: never two handlers on one partition (issue 37 #6: on c15a167 the asyncio
    consumer's _on_lost neither waited for nor cancelled it, and a second worker ran the same
    offset at once). The sync consumer runs one handler at a time: the handler in hand at the
    loss is the one holding it."""
    _verdict(background, request)


@pytest.mark.parametrize("kind", KINDS)
def test_parity_failing_longer_than_max_poll_interval_causes_no_rebalance(
    background: dict[str, Future[None]], request: pytest.FixtureRequest, kind: str
) -> None:
    """Partition 0's record 10 fails for 10 s (max.poll.interval.ms=7 s: retries made from
    the poll loop, the partition paused), then succeeds: no rebalance, no
    MAX_POLL_EXCEEDED, partition 1 keeps flowing meanwhile, partition 0's order is kept.
    The asyncio consumer also polls on while a handler awaits: in its run, partition 2's
    first handler awaits until record 10 succeeded (longer than max.poll.interval.ms), still
    without a rebalance (the sync consumer cannot: a handler holds its poll loop). The fault
    is real (control, tests/test_aio_consumer.py): confluent-kafka's AIOConsumer awaiting as
    long between polls gets _MAX_POLL_EXCEEDED."""
    _verdict(background, request)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["plain", "turn", "control"])
@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_second_signal_interrupts_the_handler_in_hand(
    background: dict[str, Future[None]], request: pytest.FixtureRequest, kind: str, mode: str
) -> None:
    """Real SIGINTs to a consumer process whose handler hangs on offset 1 (shutdown_timeout
    600 s): the 1st stops it (the handler still hangs), the 2nd interrupts the handler. Its
    record is left uncommitted and never dead-lettered, also when the handler turns the
    interruption into a ValueError (``turn``); offset 0 is committed, the group is left,
    run() raises KeyboardInterrupt (issue 37 #8: on c15a167 the asyncio consumer ignored the
    2nd signal and waited the whole shutdown_timeout). ``control``: the same ValueError
    raised by the handler itself after the 1st signal (no 2nd) is dead-lettered, so the
    dead-letter path is live and the interruption is what keeps it out."""
    _verdict(background, request)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("third_signal", [True, False], ids=["aborted", "control"])
@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_third_signal_aborts_a_held_shutdown(
    background: dict[str, Future[None]],
    request: pytest.FixtureRequest,
    kind: str,
    third_signal: bool,
) -> None:
    """Real SIGINTs to a consumer process whose shutdown is held, each consumer by what its
    shutdown waits for: the sync one (tests/consumer_worker.py) by a dead letter of offset 5
    whose write is held back (``--slow-dead-letters``: the shutdown awaits its
    acknowledgement); the asyncio one by a handler hanging on offset 1 that ignores the
    cancellation a 2nd signal sends it (``deaf``). Commits only at close. The 1st signal
    stops; the 2nd does not end the shutdown (sync: only logged; asyncio: it interrupts the
    handlers, which the deaf one ignores); the 3rd aborts it: no final commit (nothing
    committed), no close, ``shutdown_aborted`` and no ``consumer_closed`` in the log, a
    non-zero exit (run() raised KeyboardInterrupt; issue 37 #8: on c15a167 every signal only
    called the asyncio consumer's stop()). Control, no 3rd signal (asyncio: the handler obeys
    the 2nd): the shutdown commits what was done and closes, so the abort is what skipped the
    commit."""
    _verdict(background, request)
