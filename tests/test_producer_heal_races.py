"""A recreation of the librdkafka instance (on_stall="heal", recreate_on_fatal) racing
produce() and close() on other threads (review 2, defects 2 and 6).

The interleavings are forced, on the shared real cluster, by patching: ``drain`` of the
producer module (what the heal calls on the old instance) runs the other thread's call at the
worst moment, or the producer's ``_produce`` is replaced by a stand-in for a thread that read
the old instance's ``produce`` before the swap and queues after it. The heal itself is
triggered the way the watchdog does it (``_heal_wanted``): a real stall is tests/test_stalls.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _producer_helpers import read_back
from confluent_kafka import KafkaError, KafkaException
from structlog.testing import capture_logs

import kresilient.producer._producer as producer_module
from kresilient.aio import AsyncResilientProducer
from kresilient.errors import DeliveryError, FatalProducerError, ProduceError
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture(name="topic")
def _topic(kafka_cluster: KafkaCluster) -> str:
    return kafka_cluster.create_topic(f"heal-race-{uuid.uuid4().hex[:8]}", 1, 3, {})


@pytest.fixture(name="producer")
def _producer(kafka_cluster: KafkaCluster, topic: str) -> Iterator[ResilientProducer]:
    producer = ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers}, on_stall="heal"
    )
    producer.produce(topic, b"before").result(30)
    yield producer
    producer.close(5)


# The raced message must still be in the old instance's queue when the drain purges it: with
# the default linger, a calling thread descheduled a few milliseconds on a loaded machine let
# librdkafka send it first (_PURGE_INFLIGHT, possibly written). A linger far beyond any such
# pause keeps it queued; flush() sends at once whatever the linger.
_LINGERING = {"linger.ms": 10_000}


@pytest.fixture(name="lingering")
def _lingering(kafka_cluster: KafkaCluster, topic: str) -> Iterator[ResilientProducer]:
    producer = ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers, **_LINGERING}, on_stall="heal"
    )
    producer.produce(topic, b"before")
    assert producer.flush(30) is None
    yield producer
    producer.close(5)


def _heal_on_another_thread(producer: ResilientProducer) -> None:
    """What the watchdog asks for on a stall, served by a poll on another thread (joined)."""
    producer._heal_wanted = True
    healer = threading.Thread(target=producer.poll, args=(0,))
    healer.start()
    healer.join(60)
    assert not healer.is_alive()


class _StaleProduce:
    """A thread's ``produce`` read before the swap and called after it: the heal runs (on
    another thread, to its end: drained and released the old instance) between the read and
    the call. ``__self__`` as on the bound method it stands in for."""

    def __init__(self, owner: ResilientProducer, heal: Callable[[], None]) -> None:
        self._real = owner._produce
        self.__self__ = self._real.__self__  # type: ignore[attr-defined]
        self._heal = heal
        self.left_in_old: int | None = None

    def __call__(self, *args: Any) -> None:
        self._heal()
        self._real(*args)
        self.left_in_old = len(self.__self__)  # type: ignore[attr-defined]


def test_a_message_produced_on_another_thread_right_after_the_heals_drain_is_delivered(
    kafka_cluster: KafkaCluster, topic: str, producer: ResilientProducer, monkeypatch: Any
) -> None:
    """The review's probe: another thread's produce() runs right after drain(old) returned
    (drain patched to run it, on its own thread). It was queued into the drained old
    instance and destroyed with it: handle never done, flush() None, close() failed=0."""
    real_drain = producer_module.drain
    raced: list[Any] = []

    def drain_then_race(old: Any) -> int:
        n = real_drain(old)
        other = threading.Thread(target=lambda: raced.append(producer.produce(topic, b"raced")))
        other.start()
        other.join(30)
        return n

    monkeypatch.setattr(producer_module, "drain", drain_then_race)
    _heal_on_another_thread(producer)
    monkeypatch.setattr(producer_module, "drain", real_drain)
    assert producer.health().recreations == 1
    assert producer.flush(30) is None
    (handle,) = raced
    assert handle.done() and handle.exception() is None  # delivered by the new instance
    with capture_logs() as logs:
        producer.close(10)
    (closed,) = [e for e in logs if e["event"] == "producer_closed"]
    assert closed["unaccounted"] == 0 and closed["failed"] == 0
    assert sorted(m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)) == [
        b"before",
        b"raced",
    ]


def test_a_produce_that_read_the_old_instance_before_the_heal_is_reported_never_lost(
    kafka_cluster: KafkaCluster, topic: str, lingering: ResilientProducer
) -> None:
    """``_produce`` patched: the calling thread holds the old instance's produce while the
    heal runs to its end on another thread, then queues into the drained, released instance
    (the asyncio producer's loop thread against its poll thread). The message must get a
    report (failed _PURGE_QUEUE, classified) listed by flush(); before the fix its handle
    never completed and flush() reported success."""
    stale = _StaleProduce(lingering, lambda: _heal_on_another_thread(lingering))
    lingering._produce = stale
    handle = lingering.produce(topic, b"raced")
    # control: the interleaving happened, the message was queued into the old instance
    # after the heal had drained it (one message left in it)
    assert stale.left_in_old == 1
    assert lingering.health().recreations == 1
    with pytest.raises(DeliveryError) as info:
        lingering.flush(30)
    assert [f.message_id for f in info.value.failures] == [handle.message_id]
    (failure,) = info.value.failures
    assert failure.error is not None and failure.error.name() == "_PURGE_QUEUE"
    assert failure.classification is not None
    assert handle.done() and handle.exception() is not None
    after = lingering.produce(topic, b"after")  # the new instance is the one in use
    assert lingering.flush(30) is None and after.exception() is None
    with capture_logs() as logs:
        lingering.close(10)
    (closed,) = [e for e in logs if e["event"] == "producer_closed"]
    assert closed["failed"] == 1 and closed["unaccounted"] == 0
    assert sorted(m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)) == [
        b"after",
        b"before",
    ]


def test_the_asyncio_producer_reports_a_message_queued_while_its_poll_thread_heals(
    topic: str, kafka_cluster: KafkaCluster
) -> None:
    """The loop thread is inside produce() (``_produce`` patched to wait there) while the poll
    thread heals (``_heal_wanted`` set as the watchdog does): the message lands in the old
    instance after its drain. Awaiting its handle must end (failed, classified), not hang."""

    async def run() -> None:
        async with AsyncResilientProducer(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers, **_LINGERING}, on_stall="heal"
        ) as producer:
            await producer.produce(topic, b"before")
            await producer.flush(30)
            sync = producer.sync

            def poll_thread_heals() -> None:
                sync._heal_wanted = True
                wait_for(lambda: sync.health().recreations == 1, 60, "the poll thread's heal")

            stale = _StaleProduce(sync, poll_thread_heals)
            sync._produce = stale
            handle = await producer.produce(topic, b"raced")
            assert stale.left_in_old == 1  # control: queued into the drained instance
            with pytest.raises(ProduceError, match="_PURGE_QUEUE"):
                await asyncio.wait_for(handle, 30)
            with pytest.raises(DeliveryError) as info:
                await producer.flush(30)
            assert [f.error.name() for f in info.value.failures if f.error] == ["_PURGE_QUEUE"]
            after = await producer.produce(topic, b"after")
            await producer.flush(30)
            await after

    asyncio.run(run())
    assert sorted(m.value() for m in read_back(kafka_cluster.bootstrap_servers, topic)) == [
        b"after",
        b"before",
    ]


def test_a_close_during_the_heal_leaves_the_producer_closed_with_no_instance(
    topic: str, producer: ResilientProducer, monkeypatch: Any
) -> None:
    """close() runs inside the heal's drain(old) (drain patched; same thread, as from a
    delivery callback). The heal used to install a new librdkafka instance after the close:
    never closed, accepting produce()."""
    real_drain = producer_module.drain
    calls: list[int] = []

    def drain_with_close(old: Any) -> int:
        n = real_drain(old)
        calls.append(n)
        if len(calls) == 1:
            producer.close(5)
        return n

    monkeypatch.setattr(producer_module, "drain", drain_with_close)
    producer._heal_wanted = True
    producer.poll(0)
    monkeypatch.setattr(producer_module, "drain", real_drain)
    assert calls  # control: the close did run inside the heal
    assert producer._closed and producer._producer is None
    with pytest.raises(ProduceError, match="closed"):
        producer.produce(topic, b"after close")


class _WatchedLock:
    """The producer's recreate lock, saying when ``thread`` asks for it."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self.thread: threading.Thread | None = None
        self.asked = threading.Event()

    def __enter__(self) -> Any:
        if threading.current_thread() is self.thread:
            self.asked.set()
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._lock.__exit__(*exc)


def test_a_close_on_another_thread_during_the_heal_leaves_no_instance(
    topic: str, producer: ResilientProducer, monkeypatch: Any
) -> None:
    """close() on another thread while the heal is inside drain(old): drain patched to start
    that thread and return only once its close() has finished or waits for the recreate
    lock (``_recreate_lock`` wrapped to tell; no sleep). The close used to complete inside
    the drain, then the heal installed a new instance into the closed producer."""
    real_drain = producer_module.drain
    watched = _WatchedLock(producer._recreate_lock)
    producer._recreate_lock = watched
    closer = threading.Thread(target=producer.close, args=(5,))
    watched.thread = closer

    def drain_with_close(old: Any) -> int:
        if not closer.is_alive() and not watched.asked.is_set():
            closer.start()
            wait_for(
                lambda: watched.asked.is_set() or not closer.is_alive(),
                30,
                "the other thread's close() to finish or wait for the lock",
            )
        return real_drain(old)

    monkeypatch.setattr(producer_module, "drain", drain_with_close)
    producer._heal_wanted = True
    producer.poll(0)
    closer.join(60)
    monkeypatch.setattr(producer_module, "drain", real_drain)
    assert not closer.is_alive()
    assert producer._closed and producer._producer is None
    with pytest.raises(ProduceError, match="closed"):
        producer.produce(topic, b"after close")


def test_a_fatal_error_met_before_close_and_handled_after_does_not_recreate(
    kafka_cluster: KafkaCluster,
) -> None:
    """A thread met a fatal error, then close() ran before it took the recreate lock
    (``_handle_fatal`` called directly after close(): the interleaving). With
    recreate_on_fatal it used to install a new instance into the closed producer."""
    producer = ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers}, recreate_on_fatal=True
    )
    generation = producer._recreations
    producer.close(5)
    fatal = KafkaException(KafkaError(KafkaError._FATAL, "fatal for the test", fatal=True))
    with pytest.raises((FatalProducerError, ProduceError)):
        producer._handle_fatal(fatal, generation)
    assert producer._producer is None and producer._recreations == generation
