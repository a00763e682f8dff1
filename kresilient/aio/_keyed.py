"""Many records of one partition in flight for :class:`~kresilient.aio.AsyncResilientConsumer`.

``ordering="key"`` or ``"none"`` (issue 40), the asyncio counterpart of the sync consumer's
thread-pool runner: the same :class:`InflightWindow` per partition decides which records may
start (per key one at a time, in offset order; different keys at once), and each record that
may start becomes an asyncio task on the event loop, never a thread. Everything here runs on
the event loop, except :meth:`KeyedRunner.on_assign` (the consumer's worker thread, inside
``consume()``: a committed-offset lookup and dict stores).

Offsets: a partition's lowest unfinished offset is its committable one, with the finished
offsets above it in the commit metadata (the sync consumer's encoding, read back by
``finished_from`` on assignment: a member taking a partition over skips them). The worker
thread stores and commits what :meth:`KeyedRunner.due_offsets` gives once per interval,
and what :meth:`KeyedRunner.offsets` gives on revoke and at close. A full window, a backlog
over its limits or a partition too far past its lowest unfinished record pauses the
partition (:meth:`KeyedRunner.blocked`); polling goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Final

from confluent_kafka import Message, TopicPartition

# The sync consumer's pure bookkeeping (no client calls), reused as it is: the windows, the
# commit-metadata encoding and its decoding.
from kresilient.consumer import (
    ORDERINGS,
    Finished,
    InflightWindow,
    Ordering,
    finished_taken_over,
)

__all__ = ["ORDERINGS", "KeyedRunner", "Ordering"]

TP = tuple[str, int]
Window = InflightWindow

#: As the sync runner's limits (docs/parallel.md): records polled beyond a full window before
#: the partition is paused (librdkafka drops a paused partition's prefetched records, so the
#: backlog must outlast the fetch's restart), and how far a partition may go past its lowest
#: unfinished record (what a crash redoes when the finished list does not fit the metadata).
_MIN_BACKLOG: Final = 5_000
_MIN_AHEAD: Final = 10_000
#: Committed-offset lookups on assignment (the finished-offset lists).
_COMMITTED_TIMEOUT: Final = 10.0

#: What runs one record: ``(tp, msg)`` -> True once the record finished (handled,
#: dead-lettered, skipped), False when it did not (stopping, revoked, a fatal outcome).
RunRecord = Callable[[TP, Message], Coroutine[Any, Any, bool]]


class KeyedRunner:
    """The windows of every assigned partition and the task of every record in flight."""

    def __init__(
        self,
        *,
        ordering: Ordering,
        max_records: int,
        max_bytes: int,
        metadata: bool,
        run_record: RunRecord,
        may_start: Callable[[bool], bool],
        commit_interval: float,
        log: Any,
        redact: Callable[[str], str],
    ) -> None:
        self.ordering = ordering
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.metadata = metadata
        self.max_backlog = max(2 * max_records, _MIN_BACKLOG)
        self.max_backlog_bytes = max_bytes
        self.max_ahead = max(20 * max_records, _MIN_AHEAD)
        self._run_record = run_record
        #: may new records start? (False during a dependency outage while a record is in
        #: flight: its held records tell when it ends); the argument: is any record in flight
        self._may_start = may_start
        self._interval = commit_interval
        self._next_store = time.monotonic() + commit_interval
        self._log = log
        self._redact = redact
        self.windows: dict[TP, InflightWindow[Message]] = {}
        #: record tasks by partition and offset (a partition's are awaited on revoke)
        self.tasks: dict[TP, dict[int, asyncio.Task[None]]] = {}
        #: finished-offset lists read at assignment (worker thread), taken by the window
        self._skips: dict[TP, Finished] = {}
        self._dirty: set[TP] = set()
        self.skipped = 0  #: records finished before a restart, skipped from the metadata

    # ------------------------------------------------------------------ records

    def offer(self, msgs: Iterable[Message]) -> None:
        """Polled records (no error events), in offset order per partition: into their
        windows; then start what may start."""
        windows = self.windows
        for msg in msgs:
            tp: TP = (msg.topic(), msg.partition())  # type: ignore[assignment]
            window = windows.get(tp)
            if window is None:
                window = windows[tp] = InflightWindow(
                    self.ordering,
                    max_records=self.max_records,
                    max_bytes=self.max_bytes,
                    max_backlog=self.max_backlog,
                    max_backlog_bytes=self.max_backlog_bytes,
                    max_ahead=self.max_ahead,
                    skip=self._skips.pop(tp, None),
                )
            offset: int = msg.offset()  # type: ignore[assignment]
            expected = window.offsets.next_offset
            if expected is not None and offset < expected:
                continue  # fetched again after a resume: offered already
            key = msg.key()
            size = len(msg.value() or b"") + len(key or b"")
            headers: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
            if headers:  # memory too: a record's headers may outweigh its value
                for name, value in headers:
                    size += len(name) + len(value or b"")
            self._dirty.add(tp)
            if not window.offer(offset, key if isinstance(key, bytes) else None, size, msg):
                self.skipped += 1
        self.start()

    def start(self, tps: Iterable[TP] | None = None) -> None:
        """Start the records that may start now (of ``tps``; every partition when None)."""
        if not self._may_start(self.in_flight > 0):
            return
        now = time.monotonic()
        windows = self.windows
        for tp in list(windows) if tps is None else tps:
            window = windows.get(tp)
            if window is None or window.closed:
                continue
            tasks = self.tasks.setdefault(tp, {})
            for msg in window.ready(now):
                offset: int = msg.offset()  # type: ignore[assignment]
                tasks[offset] = asyncio.create_task(
                    self._record(tp, window, msg), name=f"kresilient {tp[0]}[{tp[1]}]@{offset}"
                )

    async def _record(self, tp: TP, window: InflightWindow[Message], msg: Message) -> None:
        offset: int = msg.offset()  # type: ignore[assignment]
        done = False
        try:
            done = await self._run_record(tp, msg)
        finally:
            tasks = self.tasks.get(tp)
            if tasks is not None and tasks.get(offset) is asyncio.current_task():
                del tasks[offset]
            if self.windows.get(tp) is window:  # else revoked or lost meanwhile
                if done:
                    window.finish(offset)
                    self._dirty.add(tp)
                    self.start((tp,))
                else:
                    window.abandon(offset)  # unfinished: a commit stays below it

    @property
    def in_flight(self) -> int:
        """Record tasks not finished, every partition."""
        return sum(len(t) for t in self.tasks.values())

    def idle(self) -> bool:
        """Nothing admitted nor waiting in any window, no task."""
        return not self.in_flight and all(w.idle for w in self.windows.values())

    def blocked(self, tp: TP) -> bool:
        """Whether ``tp`` must be paused (see :attr:`InflightWindow.blocked`)."""
        window = self.windows.get(tp)
        return window is not None and window.blocked

    # ------------------------------------------------------------------ offsets

    def advance(self, tp: TP, position: int) -> None:
        """The consumer's position of ``tp`` is ``position``: an idle window moves there (past
        a transaction's commit or abort markers at the partition's end, which no record
        arrives for), so the committed offset reaches the end; a busy one stays."""
        window = self.windows.get(tp)
        if window is not None and window.advance(position):
            self._dirty.add(tp)

    def _offset(self, tp: TP) -> TopicPartition | None:
        window = self.windows.get(tp)
        offset = window.committable() if window is not None else None
        if window is None or offset is None:
            return None
        meta = window.metadata(None) if self.metadata else None
        if meta is None:
            return TopicPartition(tp[0], tp[1], offset)
        return TopicPartition(tp[0], tp[1], offset, metadata=meta)

    def due_offsets(self, now: float) -> list[TopicPartition]:
        """Once per interval: the committable offsets (with their lists) of the partitions
        that moved, to store and commit. Encoded once per interval, not per step."""
        if now < self._next_store or not self._dirty:
            return []
        self._next_store = now + self._interval
        out = [part for tp in self._dirty if (part := self._offset(tp)) is not None]
        self._dirty.clear()
        return out

    def offsets(self, tps: Iterable[TP]) -> list[TopicPartition]:
        """The committable offsets of ``tps`` now (revoke, close, heal)."""
        return [part for tp in tps if (part := self._offset(tp)) is not None]

    # ------------------------------------------------------------------ rebalance, close

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Worker thread: read the finished-offset lists of the committed offsets taken over."""
        if self.metadata and partitions:
            self._skips.update(finished_taken_over(consumer, partitions, self._log, self._redact))

    def close_windows(self, tps: Iterable[TP]) -> list[asyncio.Task[None]]:
        """Revoke, loss or shutdown begins: nothing more starts on ``tps``; their tasks."""
        tasks: list[asyncio.Task[None]] = []
        for tp in tps:
            window = self.windows.get(tp)
            if window is not None:
                window.closed = True
            tasks.extend(self.tasks.get(tp, {}).values())
        return tasks

    def forget(self, tps: Iterable[TP]) -> None:
        """Drop ``tps``' windows (after their offsets were taken, or lost)."""
        for tp in tps:
            window = self.windows.pop(tp, None)
            if window is not None:
                window.clear()
            self.tasks.pop(tp, None)
            self._skips.pop(tp, None)
            self._dirty.discard(tp)
