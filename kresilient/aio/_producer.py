"""AsyncResilientProducer: the ResilientProducer's guarantees for asyncio code.

Built by composition on :class:`kresilient.producer.ResilientProducer`, which keeps every rule
in one place (config refusal, classification, the dead-letter writer for oversized values,
telemetry spans and ``traceparent`` headers, fatal-error handling, health). This module adds
only the asyncio bridge:

* a poll thread serves delivery reports (the event loop never blocks in librdkafka) and wakes
  the loop once per batch of reports, not once per message;
* a full local queue is awaited (an :class:`asyncio.Event` set as reports drain it), never
  spun on;
* ``flush``/``close`` run in a worker thread;
* every message handed to librdkafka is tracked by the sync producer, so cancelling a task
  that awaits a handle (or ``flush``) never loses it: it is still acknowledged, or listed by
  the next ``flush()``.

Why not ``confluent_kafka.aio.AIOProducer`` (read in 2.16.1): its ``produce()`` refuses
headers (``NotImplementedError``: it batches through ``produce_batch``), so neither the
caller's headers, nor the ``traceparent`` header, nor dead-letter headers could be sent; it
resolves asyncio futures from executor threads; a full queue fails the message
(``_QUEUE_FULL``) instead of waiting; and delivery reports are served only when a batch is
sent or its 1 s buffer timer fires. See docs/asyncio.md.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import weakref
from collections.abc import Generator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Final, Literal

import structlog
from confluent_kafka import KafkaError

from kresilient.errors import (
    DeliveryError,
    KResilientError,
    ProduceError,
    classify,
)
from kresilient.producer import (
    DEFAULT_STALL_AFTER,
    DEFAULT_UNREACHABLE_TIMEOUT,
    RELEASE_TIMEOUT,
    DeliveryHandle,
    DeliveryResult,
    ProducerHealth,
    ResilientProducer,
    delivered_result,
)

__all__ = ["AsyncDeliveryHandle", "AsyncResilientProducer"]

_new_handle = object.__new__

#: close() waits this long at most for the poll thread (its poll calls last 0.1 s).
_POLLER_JOIN_TIMEOUT: Final = RELEASE_TIMEOUT

#: librdkafka's default ``queue.buffering.max.messages`` / ``.kbytes``.
_DEFAULT_MAX_MESSAGES: Final = 100_000
_DEFAULT_MAX_KBYTES: Final = 1_048_576
#: produce() waits for room once the local queue is this full (of either limit): the sync
#: producer's own BufferError path polls on the calling thread, which here is the event loop.
_HIGH_WATER: Final = 0.9


class AsyncDeliveryHandle:
    """The outcome of one :meth:`AsyncResilientProducer.produce`: ``await handle``.

    ``await handle`` returns the :class:`~kresilient.DeliveryResult` (where the message was
    written) or raises the classified :class:`~kresilient.ProduceError`. Awaiting is optional:
    a message nobody awaits is still accounted for by :meth:`AsyncResilientProducer.flush`.
    Cancelling the awaiting task cancels only the wait, never the message.
    """

    __slots__ = ("__weakref__", "_err", "_future", "_msg", "_owner", "_reported", "_size", "_sync")

    # AsyncResilientProducer.produce() sets these slots itself, without this __init__ (its hot
    # path): a slot read before the delivery report must be set there too.
    def __init__(self, owner: _Bridge, size: int) -> None:
        self._owner = owner
        self._size = size
        self._sync: DeliveryHandle | None = None
        self._future: asyncio.Future[DeliveryResult] | None = None
        self._reported = False  # the delivery report reached the event loop
        self._err: KafkaError | None = None
        self._msg: Any = None

    # librdkafka's delivery report (through the sync producer's handle), on whatever thread
    # served it: only record it; the event loop settles the handle.
    def __call__(self, err: KafkaError | None, msg: Any) -> None:
        self._err = err
        self._msg = msg
        self._owner._arrived.append(self)  # the loop settles it (_Bridge.settle)

    @property
    def message_id(self) -> int:
        """Sequence number of this message in its producer (also in ``DeliveryFailure``)."""
        return self._sync.message_id if self._sync is not None else 0

    def done(self) -> bool:
        """True once the delivery report (success or failure) reached the event loop."""
        return self._reported

    def _outcome(self) -> DeliveryResult | ProduceError | None:
        """The settled outcome, or ``None`` while the failure is still being classified."""
        sync = self._sync
        assert sync is not None
        if self._err is None:
            # The report the sync handle also got (its result() would build the same, slower).
            return delivered_result(self._msg)
        error = sync.exception(0)
        return error  # None: another thread is classifying it right now

    def __await__(self) -> Generator[Any, None, DeliveryResult]:
        if self._future is None:
            if self._reported:
                outcome = self._outcome()
                if isinstance(outcome, DeliveryResult):
                    return outcome
                if outcome is not None:
                    raise outcome
            self._future = asyncio.get_running_loop().create_future()
            if self._reported:
                self._owner.settle_later(self)
        # shield: a cancelled awaiter cancels its own wait, not the other awaiters' future
        return (yield from asyncio.shield(self._future).__await__())

    def __repr__(self) -> str:
        state = "pending" if not self._reported else ("failed" if self._err else "delivered")
        return f"<AsyncDeliveryHandle #{self.message_id} {state}>"


class _Bridge:
    """Delivery reports from librdkafka threads to the event loop, one wake-up per batch."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._arrived: collections.deque[AsyncDeliveryHandle] = collections.deque()
        self._unclassified: list[AsyncDeliveryHandle] = []
        self._scheduled = False
        self._lock = threading.Lock()
        self.in_flight = 0  # messages handed to librdkafka and not yet settled on the loop
        self.in_flight_bytes = 0
        self.room = asyncio.Event()
        self.room.set()
        self.low_messages = 0
        self.low_bytes = 0

    def wake(self) -> None:
        """Called by the poll thread after a poll returned (failures are classified by then)."""
        loop = self.loop
        if loop is None or not (self._arrived or self._unclassified):
            return
        with self._lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            loop.call_soon_threadsafe(self.settle)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            with self._lock:
                self._scheduled = False

    def settle_later(self, handle: AsyncDeliveryHandle) -> None:
        self._unclassified.append(handle)
        assert self.loop is not None
        self.loop.call_soon(self.settle)

    def settle(self) -> None:
        """On the event loop: settle every arrived handle, release room in the queue."""
        with self._lock:
            self._scheduled = False
        arrived = self._arrived
        retry, self._unclassified = self._unclassified, []
        while arrived:
            try:
                handle = arrived.popleft()
            except IndexError:
                break
            if not handle._reported:
                handle._reported = True
                self.in_flight -= 1
                self.in_flight_bytes -= handle._size
            if handle._future is not None:  # awaited already; else __await__ settles it
                retry.append(handle)
        for handle in retry:
            future = handle._future
            if future is None or future.done():
                continue
            outcome = handle._outcome()
            if outcome is None:
                self._unclassified.append(handle)
            elif isinstance(outcome, DeliveryResult):
                future.set_result(outcome)
            else:
                future.set_exception(outcome)
        if self.in_flight <= self.low_messages and self.in_flight_bytes <= self.low_bytes:
            self.room.set()


def _poll_forever(
    producer_ref: weakref.ref[ResilientProducer], bridge: _Bridge, stop: threading.Event
) -> None:
    """The poll thread: serve delivery reports until stopped (or the producer is gone)."""
    log = structlog.get_logger("kresilient.aio")
    while not stop.is_set():
        producer = producer_ref()
        if producer is None:
            return
        began = time.monotonic()
        try:
            if not producer.poll(0.1) and time.monotonic() - began < 0.01:
                stop.wait(0.05)  # closed underneath us (poll returns at once): do not spin
        except KResilientError as exc:  # fatal: produce()/flush() raise it to the caller
            log.warning("producer_poll_failed", error=type(exc).__name__)
            stop.wait(0.1)
        except Exception as exc:  # never let the thread die with reports unserved
            log.error("producer_poll_failed", error=type(exc).__name__)
            stop.wait(0.1)
        del producer
        bridge.wake()


class AsyncResilientProducer:
    """A :class:`~kresilient.ResilientProducer` for asyncio: ``await produce()``, ``await flush()``.

    Same arguments, rules and guarantees as the sync producer (it is one, composed): safe
    defaults and refusal of unsafe settings (naming the key), classified failures, oversized
    values to ``dead_letter_topic``, OpenTelemetry spans and ``traceparent`` headers parented
    to the calling task's context, ``health()``.

    * ``handle = await producer.produce(topic, value, ...)`` returns once the message is in
      librdkafka's queue (it waits, without blocking the loop, while the queue is full, up to
      ``backpressure_timeout`` s, then raises a BACKPRESSURE :class:`~kresilient.ProduceError`);
      ``await handle`` gives the :class:`~kresilient.DeliveryResult` or raises the error.
    * ``await producer.flush(timeout)`` raises :class:`~kresilient.DeliveryError` listing every
      message that failed since the previous flush, and when messages remain at the timeout.
    * ``async with AsyncResilientProducer(...) as producer:`` closes (flushing) at the end.

    Example::

        async with AsyncResilientProducer({"bootstrap.servers": BOOTSTRAP}) as producer:
            handle = await producer.produce("orders", b"...", key=b"42")
            print(await handle)          # DeliveryResult(topic='orders', partition=0, ...)
            await producer.flush()       # DeliveryError if anything failed

    Args:
        config, allow_unsafe, dead_letter_topic, recreate_on_fatal, logger, tracer_provider,
        meter_provider, propagator, record_message_key, dead_letter_max_bytes, exit_timeout,
        unreachable_timeout, stall_after_s, on_stall: as :class:`~kresilient.ResilientProducer`
            (a producer that never reached a broker fails its messages after
            ``unreachable_timeout`` s, naming the address and the cause; ``None`` waits
            ``message.timeout.ms``). The progress watchdog runs on the poll thread, so a stall
            is noticed even while nothing is awaited (docs/stalls.md).
        backpressure_timeout: seconds ``produce()`` awaits room in a full local queue.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        allow_unsafe: Iterable[str] = (),
        dead_letter_topic: str | None = None,
        recreate_on_fatal: bool = False,
        logger: Any = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        propagator: Any = None,
        record_message_key: bool = False,
        backpressure_timeout: float = 60.0,
        dead_letter_max_bytes: int = 16 * 1024 * 1024,
        exit_timeout: float = 10.0,
        unreachable_timeout: float | None = DEFAULT_UNREACHABLE_TIMEOUT,
        stall_after_s: float | None = DEFAULT_STALL_AFTER,
        on_stall: Literal["report", "heal"] = "report",
    ) -> None:
        # The sync producer waits out a full queue by polling on the calling thread (the event
        # loop here): 0 makes that fallback short; this class awaits room before it is needed.
        self._sync = ResilientProducer(
            config,
            allow_unsafe=allow_unsafe,
            dead_letter_topic=dead_letter_topic,
            recreate_on_fatal=recreate_on_fatal,
            logger=logger,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=propagator,
            record_message_key=record_message_key,
            backpressure_timeout=0.0,
            dead_letter_max_bytes=dead_letter_max_bytes,
            exit_timeout=exit_timeout,
            unreachable_timeout=unreachable_timeout,
            stall_after_s=stall_after_s,
            on_stall=on_stall,
        )
        self._backpressure_timeout = float(backpressure_timeout)
        max_messages = int(config.get("queue.buffering.max.messages", _DEFAULT_MAX_MESSAGES))
        max_bytes = 1024 * int(config.get("queue.buffering.max.kbytes", _DEFAULT_MAX_KBYTES))
        self._high_messages = max(1, int(max_messages * _HIGH_WATER))
        self._high_bytes = max(1, int(max_bytes * _HIGH_WATER))
        self._bridge = _Bridge()
        self._bridge.low_messages = self._high_messages * 3 // 4
        self._bridge.low_bytes = self._high_bytes * 3 // 4
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        # flush/close block in librdkafka: one worker thread of our own, so they never queue
        # behind the application's use of the default executor.
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="kresilient-aio-producer")
        self._closed = False
        self.client_id: str = self._sync.client_id
        #: produce() calls that awaited room in a full local queue.
        self.backpressure_waits = 0

    # ------------------------------------------------------------------ plumbing

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        bridge = self._bridge
        if bridge.loop is None:
            bridge.loop = loop
            self._poller = threading.Thread(
                target=_poll_forever,
                args=(weakref.ref(self._sync), bridge, self._stop),
                name=f"kresilient-aio-poll-{self.client_id}",
                daemon=True,
            )
            self._poller.start()
        elif bridge.loop is not loop:
            raise RuntimeError(
                "AsyncResilientProducer is bound to the event loop it was first used on; "
                "create one producer per event loop"
            )
        return loop

    async def _await_room(self, topic: str) -> None:
        bridge = self._bridge
        self.backpressure_waits += 1
        deadline = time.monotonic() + self._backpressure_timeout
        while bridge.in_flight >= self._high_messages or bridge.in_flight_bytes >= self._high_bytes:
            bridge.room.clear()
            remaining = deadline - time.monotonic()
            try:
                if remaining <= 0:
                    raise TimeoutError
                await asyncio.wait_for(bridge.room.wait(), remaining)
            except TimeoutError:
                raise ProduceError(
                    f"local producer queue stayed full for {self._backpressure_timeout:g} s "
                    f"({bridge.in_flight} messages queued); the message was not queued",
                    code=KafkaError._QUEUE_FULL,
                    name="_QUEUE_FULL",
                    topic=topic,
                    classification=classify(BufferError()),
                ) from None

    # ------------------------------------------------------------------ public API

    async def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        propagate: bool = True,
    ) -> AsyncDeliveryHandle:
        """Queue one message; return its :class:`AsyncDeliveryHandle` once it is queued.

        ``propagate=False`` sends ``headers`` exactly as given (no ``traceparent`` injected),
        as :meth:`kresilient.ResilientProducer.produce`.

        Awaits (without blocking the loop) while the local queue is full. Raises what
        :meth:`kresilient.ResilientProducer.produce` raises (``MessageTooLargeError`` without a
        dead-letter topic, ``FatalProducerError``, a closed-producer ``ProduceError``,
        ``TypeError`` for a bad key/value/headers), and a BACKPRESSURE ``ProduceError`` after
        ``backpressure_timeout`` s of a full queue. If the task is cancelled while waiting
        for room, nothing was queued.
        """
        bridge = self._bridge
        if bridge.loop is not asyncio.get_running_loop():  # first use (or another loop: raises)
            self._start()
        if bridge.in_flight >= self._high_messages or bridge.in_flight_bytes >= self._high_bytes:
            await self._await_room(topic)
        # bytes, as librdkafka counts them (a str is sent UTF-8 encoded: issue 35 counted a
        # str's characters, so multibyte text overfilled the queue budget); bytes are counted
        # inline (two _size() calls cost 0.2 µs a message)
        size = len(value) if type(value) is bytes else _size(value)
        if key is not None:
            size += len(key) if type(key) is bytes else _size(key)
        # AsyncDeliveryHandle.__init__ inline (its frame cost 0.1 µs a message); _err and _msg
        # are set by the report before anything reads them
        handle: AsyncDeliveryHandle = _new_handle(AsyncDeliveryHandle)
        handle._owner = bridge
        handle._size = size
        handle._sync = None
        handle._future = None
        handle._reported = False
        # No await between here and the return: once the sync producer has the message, this
        # coroutine cannot be cancelled before the caller has the handle. Positional
        # arguments: a keyword call costs more per message.
        if propagate:
            handle._sync = self._sync.produce(
                topic, value, key, headers, partition, timestamp, handle
            )
        else:
            handle._sync = self._sync.produce(
                topic, value, key, headers, partition, timestamp, handle, propagate=False
            )
        bridge.in_flight += 1
        bridge.in_flight_bytes += size
        return handle

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is delivered or failed (``timeout``: seconds).

        Raises :class:`~kresilient.DeliveryError` listing every message that failed since the
        previous flush (each classified), also when messages remain at the timeout, exactly
        like :meth:`kresilient.ResilientProducer.flush`. Cancelling the awaiting task does not
        stop the flush already running in the worker thread, nor lose any failure: the next
        ``flush()`` lists it.
        """
        loop = self._start()
        try:
            await loop.run_in_executor(self._worker, self._sync.flush, timeout)
        finally:
            self._bridge.settle()

    async def poll(self, timeout: float = 0) -> int:
        """Serve delivery reports now (the poll thread does this continuously)."""
        loop = self._start()
        served = await loop.run_in_executor(self._worker, self._sync.poll, timeout)
        self._bridge.settle()
        return int(served)

    async def close(self, timeout: float | None = None) -> None:
        """Flush, then release the producer; raises ``DeliveryError`` like ``flush()``.

        Idempotent. Messages still queued at ``timeout`` are purged and reported failed.
        Bounded as :meth:`kresilient.ResilientProducer.close` is, whatever the brokers do: it
        runs on this producer's own worker thread, never on the event loop.
        """
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._worker, self._sync.close, timeout)
        finally:
            self._stop.set()
            poller = self._poller
            if poller is not None:
                # its poll calls last 0.1 s at most; bounded all the same
                await loop.run_in_executor(self._worker, poller.join, _POLLER_JOIN_TIMEOUT)
            if self._bridge.loop is loop:
                self._bridge.settle()
            self._worker.shutdown(wait=False)

    async def health(self) -> ProducerHealth:
        """:meth:`kresilient.ResilientProducer.health`, computed off the event loop.

        Before the first statistics it asks the cluster for metadata (bounded at one second),
        which would otherwise block the loop.
        """
        if self._closed:  # no metadata request when closed: nothing blocks
            return self._sync.health()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._sync.health)

    @property
    def sync(self) -> ResilientProducer:
        """The composed :class:`~kresilient.ResilientProducer` (leadership monitor, etc.).

        Do not call its blocking methods (``flush``, ``close``) from the event loop.
        """
        return self._sync

    def __len__(self) -> int:
        """Messages queued, in flight, or awaiting their delivery report."""
        return len(self._sync)

    async def __aenter__(self) -> AsyncResilientProducer:
        self._start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except DeliveryError as delivery:  # do not mask the exception already propagating
            exc.add_note(f"kresilient: while closing the producer: {delivery}")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<AsyncResilientProducer {state} {self._sync!r}>"


def _size(data: bytes | str | None) -> int:
    """Bytes of a key or value on the wire: a str counts its UTF-8 encoding (ASCII text,
    the common case, without encoding it)."""
    if data is None:
        return 0
    if isinstance(data, str) and not data.isascii():
        return len(data.encode("utf-8", "surrogatepass"))
    return len(data)
