"""AsyncResilientConsumer parity with ResilientConsumer, on the real cluster.

First the asyncio consumer's own parity features (health, leadership, callbacks, the
application's dead-letter producer); then ONE suite over both consumers (parametrised
``sync``/``aio``) for the guarantees promised for both: a lost assignment never runs two
handlers on one partition, the idle commit of the last stored offset, retries then a dead
letter byte for byte, nothing committed past an unhandled record, a revoke waits for the
handler in hand, a second signal interrupts the handler in hand (real signals, a process).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tenacity
from confluent_kafka import Message
from test_consumer_integration import TopicFactory, committed, ends, produce, with_dlq

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ConsumerHealth, RetryPolicy
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

            self._loop = loop
            self.consumer = ResilientConsumer(
                config, topics, handle, install_signal_handlers=False, **options
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

    def stop(self, timeout: float = 120) -> None:
        self.consumer.stop()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the {self.kind} consumer did not stop"


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


@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_lost_assignment_never_runs_two_handlers_on_one_partition(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """The assignment is lost (a handler holds the consumer past max.poll.interval.ms: the
    group throws the member out) while a handler is in hand on p0; the partitions come back
    to the same member. The record in hand is handled again only after its first handler
    ended: never two handlers on one partition (issue 37 #6: on c15a167 the asyncio
    consumer's _on_lost neither waited for nor cancelled it, and a second worker ran the same
    offset at once). The sync consumer runs one handler at a time: the handler in hand at the
    loss is the one holding it."""
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


# --------------------------------------------------------------------------- signals

WORKER = Path(__file__).with_name("test_consumer_parity_worker.py")


class _Worker:
    """A consumer process (tests/test_consumer_parity_worker.py) and its output so far."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["plain", "turn", "control"])
@pytest.mark.parametrize("kind", KINDS)
def test_parity_a_second_signal_interrupts_the_handler_in_hand(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, kind: str, mode: str
) -> None:
    """Real SIGINTs to a consumer process whose handler hangs on offset 1 (shutdown_timeout
    600 s): the 1st stops it (the handler still hangs), the 2nd interrupts the handler. Its
    record is left uncommitted and never dead-lettered, also when the handler turns the
    interruption into a ValueError (``turn``); offset 0 is committed, the group is left,
    run() raises KeyboardInterrupt (issue 37 #8: on c15a167 the asyncio consumer ignored the
    2nd signal and waited the whole shutdown_timeout). ``control``: the same ValueError
    raised by the handler itself after the 1st signal (no 2nd) is dead-lettered, so the
    dead-letter path is live and the interruption is what keeps it out."""
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
