"""AsyncResilientConsumer with many records of one partition in flight, on the real cluster
(issue 40): ``ordering="key"`` runs each record as an asyncio task under the sync consumer's
window, so per key the handling order is the offset order while different keys overlap; the
committed offset never passes an unfinished record, the finished ones above it are listed in
its metadata and the next member skips them (control: ``in_flight_metadata=False`` redoes
more); a poison record is dead-lettered byte for byte without holding other keys; a member
joining and leaving keeps each key's order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Consumer, Message, TopicPartition
from test_consumer_integration import TopicFactory, ends, produce, with_dlq
from test_inflight_seams import _transactional_topic

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import RetryPolicy
from kresilient.consumer._inflight import finished_from
from kresilient.deadletter import CircuitBreakerPolicy
from kresilient.errors import CircuitBreakerOpenError, ConfigError
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

QUIET: dict[str, Any] = {"handle_signals": False, "outage_retry": None}


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


def _committed(cluster: KafkaCluster, group: str, topic: str) -> tuple[int, str | None]:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
    try:
        (part,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return part.offset, part.metadata
    finally:
        consumer.close()


async def _committed_async(cluster: KafkaCluster, group: str, topic: str) -> tuple[int, Any]:
    return await asyncio.to_thread(_committed, cluster, group, topic)


class _Recorder:
    """Handled records by key (in handling order), the most handlers and the most distinct
    keys at once, and the most handlers of one key at once."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[int, bytes | None], list[int]] = {}
        self.offsets: list[int] = []
        self.running = 0
        self.most = 0
        self.keys: dict[bytes | None, int] = {}  #: handlers in hand per key
        self.most_keys = 0
        self.most_per_key = 0

    def enter(self, msg: Message) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        n = self.keys[msg.key()] = self.keys.get(msg.key(), 0) + 1
        self.most_per_key = max(self.most_per_key, n)
        self.most_keys = max(self.most_keys, len(self.keys))

    def leave(self, msg: Message) -> None:
        self.running -= 1
        if self.keys[msg.key()] == 1:
            del self.keys[msg.key()]
        else:
            self.keys[msg.key()] -= 1
        key = (msg.partition() or 0, msg.key())
        self.by_key.setdefault(key, []).append(msg.offset())  # type: ignore[arg-type]
        self.offsets.append(msg.offset())  # type: ignore[arg-type]


async def test_orderings_are_checked_as_the_sync_consumer_checks_them() -> None:
    async def handle(msg: Message) -> None:
        pass

    conf = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    with pytest.raises(ConfigError, match="ordering must be one of") as info:
        AsyncResilientConsumer(conf, ["t"], handle, ordering="keys")  # type: ignore[arg-type]
    assert info.value.key == "ordering"
    with pytest.raises(ConfigError, match="max_in_flight") as info:
        AsyncResilientConsumer(conf, ["t"], handle, ordering="key", max_in_flight=0)
    assert info.value.key == "ordering"
    with pytest.raises(ConfigError, match="max_concurrency") as info:
        AsyncResilientConsumer(conf, ["t"], handle, ordering="key", max_concurrency=4)
    assert info.value.key == "max_concurrency"
    # control: each alone is taken
    AsyncResilientConsumer(conf, ["t"], handle, ordering="key")
    AsyncResilientConsumer(conf, ["t"], handle, max_concurrency=4)


@pytest.mark.parametrize("ordering", ["key", "partition"])
async def test_key_order_is_offset_order_and_keys_overlap(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, ordering: str
) -> None:
    """Keys really run at once in "key" mode; "partition" (the control) never overlaps."""
    topic, _ = with_dlq(topic_factory)
    n, keys = 400, 20
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % keys), b"%d" % i, None, 0) for i in range(n)],
    )
    rec = _Recorder()

    async def handle(msg: Message) -> None:
        rec.enter(msg)
        await asyncio.sleep(0.002 * ((msg.offset() or 0) * 7 % 3))  # end out of order
        rec.leave(msg)

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf,
        [topic],
        handle,
        ordering=ordering,
        max_in_flight=16,
        **QUIET,  # type: ignore[arg-type]
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: len(rec.offsets) >= n, 120, "every record handled")
        await _until(
            lambda: _committed(kafka_cluster, conf["group.id"], topic)[0] == n, 60, "the commit"
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert sorted(rec.offsets) == list(range(n))  # each once
    for key, offsets in rec.by_key.items():
        assert offsets == sorted(offsets), key
    if ordering == "key":
        assert 1 < rec.most <= 16  # concurrent, within the window
        assert rec.most_keys > 1  # several keys in flight at once
        assert rec.most_per_key == 1  # one record of a key at a time
        assert rec.offsets != sorted(rec.offsets)  # keys overtook each other
    else:
        assert rec.most == 1 and rec.most_keys == 1  # never two at once
        assert rec.offsets == sorted(rec.offsets)


async def _stuck_run(
    cluster: KafkaCluster, topic: str, group: str, *, stuck: set[int], metadata: bool
) -> tuple[AsyncResilientConsumer, asyncio.Task[None], list[int]]:
    """A consumer whose handler never returns for the offsets in ``stuck``."""
    handled: list[int] = []
    never = asyncio.Event()

    async def handle(msg: Message) -> None:
        if msg.offset() in stuck:
            await never.wait()  # cancelled at the stop, after shutdown_timeout
        handled.append(msg.offset())  # type: ignore[arg-type]

    consumer = AsyncResilientConsumer(
        _conf(cluster, group, **{"auto.commit.interval.ms": 200}),
        [topic],
        handle,
        ordering="key",
        max_in_flight=32,
        shutdown_timeout=0.5,  # the stuck records are abandoned at the stop
        in_flight_metadata=metadata,
        **QUIET,
    )
    return consumer, asyncio.create_task(consumer.run()), handled


@pytest.mark.parametrize("metadata", [True, False], ids=["metadata", "control-bare"])
async def test_commit_stops_at_an_unfinished_record_and_a_restart_redoes_only_it(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, metadata: bool
) -> None:
    topic, _ = with_dlq(topic_factory)
    n, stuck = 60, {5, 9}
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % i, b"%d" % i, None, 0) for i in range(n)],  # distinct keys
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    first, task, handled = await _stuck_run(
        kafka_cluster, topic, group, stuck=stuck, metadata=metadata
    )
    try:
        await _until(lambda: len(handled) == n - len(stuck), 60, "every other record handled")
        seen: list[Any] = []

        async def listed() -> bool:
            offset, meta = await _committed_async(kafka_cluster, group, topic)
            seen[:] = [offset, meta]
            got = finished_from(meta, offset)
            return offset == 5 and (not metadata or (got is not None and len(got) == n - 7))

        deadline = time.monotonic() + 60
        while not await listed():  # the slow record holds the commit; the list grows
            assert time.monotonic() < deadline, f"committed {seen}"
            await asyncio.sleep(0.1)
        offset, meta = seen
        got = finished_from(meta, offset)
        if metadata:
            assert got is not None and got.offsets() == [o for o in range(6, n) if o != 9]
        else:
            assert got is None
    finally:
        first.stop()
        await asyncio.wait_for(task, 60)  # 5 and 9 cancelled after shutdown_timeout
    assert (await _committed_async(kafka_cluster, group, topic))[0] == 5

    # a new instance, same group: the unfinished records only (without the list: all above 5)
    second, task2, redone = await _stuck_run(
        kafka_cluster, topic, group, stuck=set(), metadata=metadata
    )
    expected = sorted(stuck) if metadata else list(range(5, n))
    try:
        await _until(lambda: len(redone) >= len(expected), 60, "the redo")
        await _until(lambda: _committed(kafka_cluster, group, topic)[0] == n, 60, "the end commit")
    finally:
        second.stop()
        await asyncio.wait_for(task2, 60)
    assert sorted(redone) == expected


async def test_a_retrying_key_blocks_only_itself_and_poison_is_dead_lettered_as_is(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, dlq = with_dlq(topic_factory)
    n = 200
    headers = [("trace", b"\x00\xffraw"), ("h", b"v")]
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [
            (b"k%d" % (i % 10), b"poison\xff" if i == 30 else b"%d" % i, headers, 0)
            for i in range(n)
        ],
    )
    flaky: list[int] = []
    rec = _Recorder()

    async def handle(msg: Message) -> None:
        if msg.value() == b"poison\xff":
            raise ValueError("not a number")  # not retried: dead-lettered at once
        if msg.offset() == 3 and len(flaky) < 2:
            flaky.append(3)
            raise ConnectionError("flaky")  # retried twice, then handled
        rec.enter(msg)
        await asyncio.sleep(0)
        rec.leave(msg)

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf,
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_fixed(0.3)),
        ordering="key",
        max_in_flight=8,
        **QUIET,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: len(rec.offsets) >= n - 1, 60, "every record but the poison")
        await _until(lambda: consumer.health().dead_lettered == 1, 30, "the dead letter")
        await _until(
            lambda: _committed(kafka_cluster, conf["group.id"], topic)[0] == n, 60, "the commit"
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert flaky == [3, 3]
    for key, offsets in rec.by_key.items():
        assert offsets == sorted(offsets), key
    # key k3 waited behind its retrying record, the other keys did not; nor behind the poison
    assert rec.offsets.index(3) > rec.offsets.index(4)
    assert rec.offsets.index(31) < rec.offsets.index(13)
    (letter,) = await asyncio.to_thread(read_back, kafka_cluster.bootstrap_servers, dlq)
    assert (letter.key(), letter.value()) == (b"k0", b"poison\xff")  # byte for byte
    assert [h for h in letter.headers() or [] if h[0] in ("trace", "h")] == headers


async def test_key_order_holds_across_a_member_joining_and_leaving(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A second member joins (the first's revoke waits for its records in hand and commits
    below the unfinished ones), then leaves: per key, handling order is offset order."""
    topic, _ = with_dlq(topic_factory, partitions=4)
    n, keys = 4000, 50
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % keys), b"%d" % i, None, None) for i in range(n)],
    )
    group = f"g-{uuid.uuid4().hex[:10]}"
    order: dict[tuple[int, bytes | None], list[int]] = {}
    handled = {"a": 0, "b": 0}

    def member(name: str) -> AsyncResilientConsumer:
        async def handle(msg: Message) -> None:
            await asyncio.sleep(0.01)  # slow enough for the rebalances to land mid-stream
            key = (msg.partition() or 0, msg.key())
            order.setdefault(key, []).append(msg.offset())  # type: ignore[arg-type]
            handled[name] += 1

        return AsyncResilientConsumer(
            _conf(kafka_cluster, group), [topic], handle, ordering="key", max_in_flight=4, **QUIET
        )

    a, b = member("a"), member("b")
    run_a = asyncio.create_task(a.run())
    try:
        await _until(lambda: handled["a"] >= 300, 60, "member A to start")
        run_b = asyncio.create_task(b.run())
        try:
            await _until(lambda: handled["b"] >= 200, 60, "member B to get partitions")
        finally:
            b.stop()  # B leaves: A takes its partitions back
            await asyncio.wait_for(run_b, 60)
        await _until(lambda: sum(map(len, order.values())) >= n, 120, "every record handled")
    finally:
        a.stop()
        await asyncio.wait_for(run_a, 60)
    assert a.health().rebalances["revoked"] >= 1
    everything = sorted(o for (p, _), offsets in order.items() for o in set(offsets))
    assert len(everything) == n  # every record (each partition's offsets are distinct)
    failures = a.health().commit_failures + b.health().commit_failures
    for key, offsets in order.items():
        firsts = list(dict.fromkeys(offsets))
        assert firsts == sorted(firsts), key
        assert offsets == firsts or failures > 0, key


async def test_a_transactional_topic_is_committed_to_its_end_past_the_last_marker(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The last record is at 206, its commit marker at 207: only the idle window's move to
    the consumer's position (past the marker) commits 208, lag 0."""
    topic, _ = with_dlq(topic_factory)
    committed = _transactional_topic(kafka_cluster, topic)  # 8 transactions, 3 aborted
    await _until(lambda: ends(kafka_cluster.bootstrap_servers, topic)[0] == 208, 60, "8 markers")
    seen: list[tuple[bytes, bytes]] = []

    async def handle(msg: Message) -> None:
        await asyncio.sleep(0)
        seen.append((msg.key() or b"", msg.value() or b""))

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf, [topic], handle, ordering="key", max_in_flight=8, **QUIET
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: len(seen) >= len(committed), 60, "every committed record")
        await _until(
            lambda: _committed(kafka_cluster, conf["group.id"], topic)[0] == 208,
            60,
            "the commit past the last marker",
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert sorted(seen) == sorted(committed)  # each committed record once, no aborted one
    for key in {k for k, _ in committed}:
        assert [v for k, v in seen if k == key] == [v for k, v in committed if k == key]


@pytest.mark.parametrize("outage", [True, False], ids=["outage-held", "control-no-outage-rule"])
async def test_a_dependency_outage_holds_records_and_only_poison_is_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, outage: bool
) -> None:
    """The dependency fails for its first 24 calls (distinct records of several keys): held,
    never dead-lettered, and handled once it is back; the poison record alone goes to the
    DLQ. Once every record in hand is held (at most 2 failing calls each of the 6 keys in
    flight before), ONE held record at a time is tried again: failing calls never overlap.
    Control (``outage_retry=None``): the same failures exhaust their RetryPolicy and are
    dead-lettered."""
    topic, dlq = with_dlq(topic_factory)
    n = 60
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % (i % 6), b"poison" if i == 40 else b"%d" % i, None, 0) for i in range(n)],
    )
    calls = {"failed": 0, "failing": 0, "most_late": 0}
    rec = _Recorder()

    async def handle(msg: Message) -> None:
        if msg.value() == b"poison":
            raise ValueError("not a number")
        if calls["failed"] < 24:
            calls["failed"] += 1
            calls["failing"] += 1
            if calls["failed"] > 12:  # every record in hand held: the probes
                calls["most_late"] = max(calls["most_late"], calls["failing"])
            try:
                await asyncio.sleep(0.01)  # a call that takes a while: overlaps would show
            finally:
                calls["failing"] -= 1
            raise ConnectionError("dependency down")
        rec.enter(msg)
        await asyncio.sleep(0)
        rec.leave(msg)

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf,
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.02)),
        outage_retry=(
            RetryPolicy(stop=tenacity.stop_after_delay(60), wait=tenacity.wait_fixed(0.2))
            if outage
            else None
        ),
        circuit_breaker=None,
        ordering="key",
        max_in_flight=8,
        handle_signals=False,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: calls["failed"] >= 24, 60, "the outage's failures")
        done = (lambda: len(rec.offsets) == n - 1) if outage else (lambda: True)
        await _until(done, 60, "every record but the poison handled")
        await _until(
            lambda: _committed(kafka_cluster, conf["group.id"], topic)[0] == n, 60, "the commit"
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    for key, offsets in rec.by_key.items():
        assert offsets == sorted(offsets), key
    letters = [
        m.value() for m in await asyncio.to_thread(read_back, kafka_cluster.bootstrap_servers, dlq)
    ]
    if outage:
        assert letters == [b"poison"]
        assert consumer.health().dead_lettered == 1
        assert calls["most_late"] == 1  # one held record tried at a time
    else:
        assert b"poison" in letters and len(letters) > 1  # the outage's records too
        assert len(rec.offsets) + len(letters) == n


async def test_each_record_gets_its_own_process_span_child_of_its_producer(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A span per record with many in flight: each handler runs inside the process span
    whose parent is its own record's producer context (the traceparent header), never a
    neighbour's."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topic, _ = with_dlq(topic_factory)
    n = 40
    parents = {i: 0x1000 + i for i in range(n)}
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [
            (
                b"k%d" % (i % 8),
                b"%d" % i,
                [("traceparent", f"00-{0xABC + i:032x}-{parents[i]:016x}-01".encode())],
                0,
            )
            for i in range(n)
        ],
    )
    seen: dict[int, int] = {}  #: offset -> the span id current in its handler
    rec = _Recorder()

    async def handle(msg: Message) -> None:
        rec.enter(msg)
        await asyncio.sleep(0.005)  # overlapping handlers: a context leak would show
        seen[msg.offset() or 0] = trace.get_current_span().get_span_context().span_id
        rec.leave(msg)

    consumer = AsyncResilientConsumer(
        _conf(kafka_cluster),
        [topic],
        handle,
        tracer_provider=provider,
        ordering="key",
        max_in_flight=8,
        **QUIET,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: len(seen) >= n, 60, "every record")
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert rec.most > 1  # spans of records in flight at once
    process = {
        s.context.span_id: s for s in exporter.get_finished_spans() if s.name.startswith("process")
    }
    assert len(process) == n
    for offset, span_id in seen.items():
        span = process[span_id]
        assert span.parent is not None and span.parent.span_id == parents[offset], offset


async def test_the_circuit_breaker_stops_the_consumer_and_nothing_past_it_is_committed(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Every record poison, 8 in flight: the breaker opens at its 4th dead letter in a row,
    ``run()`` raises it, and the committed offset never passes a record that was neither
    handled nor acknowledged in the DLQ."""
    topic, dlq = with_dlq(topic_factory)
    n = 40
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k%d" % i, b"bad-%d" % i, None, 0) for i in range(n)],
    )

    async def handle(msg: Message) -> None:
        raise ValueError("poison")

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf,
        [topic],
        handle,
        circuit_breaker=CircuitBreakerPolicy(max_consecutive=3, max_ratio=None),
        ordering="key",
        max_in_flight=8,
        **QUIET,
    )
    with pytest.raises(CircuitBreakerOpenError):
        await asyncio.wait_for(consumer.run(), 60)
    letters = await asyncio.to_thread(read_back, kafka_cluster.bootstrap_servers, dlq)
    assert 3 <= len(letters) < n
    offset, _ = await _committed_async(kafka_cluster, conf["group.id"], topic)
    lettered = {int((m.value() or b"").split(b"-")[1]) for m in letters}
    # every record below the committed offset is in the DLQ; the one at it is not
    assert set(range(max(offset, 0))) <= lettered
    assert offset not in lettered


@pytest.mark.parametrize("ordering", ["none", "key"])
async def test_none_runs_records_of_one_key_at_once_and_key_does_not(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, ordering: str
) -> None:
    """Every record has the same key: ``"none"`` still overlaps them; ``"key"`` (the control)
    handles them one at a time, in offset order. Both commit to the end."""
    topic, _ = with_dlq(topic_factory)
    n = 120
    produce(
        kafka_cluster.bootstrap_servers, topic, [(b"same", b"%d" % i, None, 0) for i in range(n)]
    )
    rec = _Recorder()

    async def handle(msg: Message) -> None:
        rec.enter(msg)
        await asyncio.sleep(0.002)
        rec.leave(msg)

    conf = _conf(kafka_cluster)
    consumer = AsyncResilientConsumer(
        conf,
        [topic],
        handle,
        ordering=ordering,  # type: ignore[arg-type]
        max_in_flight=8,
        **QUIET,
    )
    task = asyncio.create_task(consumer.run())
    try:
        await _until(lambda: len(rec.offsets) >= n, 60, "every record handled")
        await _until(
            lambda: _committed(kafka_cluster, conf["group.id"], topic)[0] == n, 60, "the commit"
        )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert sorted(rec.offsets) == list(range(n))
    if ordering == "none":
        assert 1 < rec.most_per_key <= 8
    else:
        assert rec.most_per_key == 1 and rec.offsets == list(range(n))
