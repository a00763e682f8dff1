"""Many records of one partition in flight: which may start, what may be committed (issue 40).

Pure bookkeeping, no client calls: the consumer feeds an :class:`InflightWindow` per partition
with the records it polled (in offset order), starts what :meth:`InflightWindow.ready` gives,
reports each record finished (handled, dead-lettered, moved to a retry topic, skipped) or
waiting for a retry, pauses the partition while :attr:`InflightWindow.blocked`, and commits
:meth:`InflightWindow.committable` with the finished records above it in the metadata.

Ordering modes (which records may run at the same time):

* ``"partition"``: one record of the partition at a time, in offset order (the consumer's
  behaviour without this module);
* ``"key"``: records with the same key one at a time, in offset order; different keys at
  once. Records WITHOUT a key (``None``) are ordered among themselves like one key: a
  keyless record may come from a producer that relied on partition order, and this mode
  never reorders what it cannot tell apart (use ``"none"`` for keyless topics);
* ``"none"``: any record may run as soon as the window has room.

A record waiting for its retry stays the head of its chain: it blocks the later records of
its key (``"key"``), of the partition (``"partition"``), or nothing else (``"none"``).
A ``serial`` window (crash-loop protection's probe) starts only its lowest unfinished
record, and only while nothing runs, whatever the mode.

Window: at most ``max_records`` records and ``max_bytes`` bytes are *admitted* (started or
startable, running, or waiting for a retry) per partition. A record over ``max_bytes`` on
its own is admitted when the window is empty (it would never run otherwise). Records polled
beyond the window wait in a backlog; over ``max_backlog`` of them, or over
``max_backlog_bytes`` of their bytes, the partition is ``blocked`` (until no more than half
of each limit waits): the consumer pauses it, keeps polling, and resumes it when it is not.
The records held are at most the window, the backlog's limits and one poll.
A record waiting for its retries lets the rest of its partition flow (``"key"``, ``"none"``):
the finished offsets above it are kept as merged ranges (memory grows with the unfinished
records, not with the distance), and past ``max_ahead`` offsets beyond the lowest unfinished
one the partition is ``blocked`` too, until that record finishes.

Gap-safe commits: the committable offset is the lowest unfinished offset offered (or the
offset after the last one when all finished), so a commit never passes an unfinished record.
The finished offsets above it go into the commit metadata (:func:`with_finished`) and a
member that takes the partition over skips them (:func:`finished_from`): a record redone
after a crash is one that was unfinished, never one that had finished, unless the list
did not fit (then the metadata is bare and everything from the committed offset is redone).

Metadata format: kresilient's marker (``kresilient.v1 <json object>``, the crash-loop
protection's :data:`~kresilient.consumer._crashloop.PREFIX`) with one more field, ``"g"``::

    kresilient.v1 {"clean":1,"g":{"o":1200,"r":"2.3.0.1"}}
    kresilient.v1 {"x":1201,"d":0,"t":1764403200000,"g":{"o":1200,"b":"Dg"}}

``"o"`` is the committed offset the list belongs to (a list whose ``"o"`` is not the committed
offset is ignored: a commit that did not carry it moved the offset). The finished offsets
above ``o``, from ``o + 1``, are either run lengths ``"r"`` (base 36, ``.``-separated,
alternating not-finished / finished, starting with not-finished, which may be ``0``), or a
bitmap ``"b"`` (unpadded URL-safe base64, bit ``i`` of byte ``i // 8``, least significant bit
first, is offset ``o + 1 + i``), whichever is shorter. ``parse_marker`` ignores fields it does
not know, so a marker with ``"g"`` parses as it did, and a marker without it (older versions)
has no finished records above its offset. The whole metadata string stays within
``offset.metadata.max.bytes`` (4096 by default on brokers): when it would not, the list is
left out (bare offset).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import dataclasses
import heapq
import json
import math
from collections import deque
from collections.abc import Hashable, Iterable, Iterator
from typing import Final, Generic, Literal, TypeVar, get_args

from kresilient.consumer._crashloop import PREFIX

__all__ = [
    "METADATA_MAX_BYTES",
    "ORDERINGS",
    "Finished",
    "InflightWindow",
    "OffsetTracker",
    "Ordering",
    "encode_finished",
    "encode_ranges",
    "finished_from",
    "with_finished",
]

Ordering = Literal["partition", "key", "none"]
#: The ordering modes, for validation.
ORDERINGS: Final[tuple[str, ...]] = get_args(Ordering)
#: The brokers' default ``offset.metadata.max.bytes``: a longer metadata string fails the
#: commit with OFFSET_METADATA_TOO_LARGE.
METADATA_MAX_BYTES: Final = 4096
#: The field of the kresilient marker that carries the finished offsets.
_FIELD: Final = "g"

T = TypeVar("T")


class _Partition:
    """The chain of every record in ``"partition"`` mode (no key compares equal to it)."""

    __slots__ = ()


_WHOLE_PARTITION: Final = _Partition()


# ---------------------------------------------------------------------- offsets


class OffsetTracker:
    """The lowest unfinished offset of a partition, and the finished offsets above it.

    Offsets are offered in increasing order (not necessarily contiguous: transaction markers
    and compaction leave holes) and finished in any order. Memory is bounded by the
    unfinished offsets, not by how far the partition went past the lowest one: the finished
    offsets above it are kept as merged ``[start, end)`` ranges (a hole between two offered
    offsets counts as finished: no record has it), at most one more range than unfinished
    offsets, updated as records finish (never sorted again).
    """

    __slots__ = ("_low", "_next", "_ranges", "_unfinished")

    def __init__(self) -> None:
        #: offered and not finished, in offset order (insertion order: offered ascending)
        self._unfinished: dict[int, None] = {}
        self._low: int | None = None  #: the lowest unfinished offset (``None``: none)
        #: finished offsets above ``_low``: disjoint ``[start, end)`` ranges, ascending
        self._ranges: list[list[int]] = []
        self._next: int | None = None  #: the offset after the last one offered

    def offer(self, offset: int) -> None:
        """``offset`` was polled (it is unfinished until :meth:`finish`)."""
        if self._next is not None and offset < self._next:
            raise ValueError(f"offset {offset} offered after {self._next - 1}")
        if self._low is None:
            self._low = offset
        elif self._next is not None and offset > self._next:
            self._add(self._next, offset)  # a hole above an unfinished record: no record
        self._unfinished[offset] = None
        self._next = offset + 1

    def finish(self, offset: int) -> None:
        """``offset`` is done (handled, dead-lettered, moved, or skipped)."""
        if offset not in self._unfinished:
            return  # finished twice, or never offered here (a seek reset): nothing to do
        del self._unfinished[offset]
        if offset != self._low:
            self._add(offset, offset + 1)
            return
        low = next(iter(self._unfinished), None)
        self._low = low
        ranges = self._ranges
        if low is None:
            ranges.clear()
            return
        drop = 0
        while drop < len(ranges) and ranges[drop][1] <= low:
            drop += 1
        if drop:
            del ranges[:drop]

    def _add(self, start: int, end: int) -> None:
        """Mark ``[start, end)`` finished (above ``_low``, not finished before)."""
        ranges = self._ranges
        i = bisect.bisect_right(ranges, [start, _INF])
        if i and ranges[i - 1][1] == start:
            ranges[i - 1][1] = end
            if i < len(ranges) and ranges[i][0] == end:
                ranges[i - 1][1] = ranges[i][1]
                del ranges[i]
        elif i < len(ranges) and ranges[i][0] == end:
            ranges[i][0] = start
        else:
            ranges.insert(i, [start, end])

    def advance(self, position: int) -> bool:
        """The consumer's position went to ``position`` with nothing unfinished: the offsets
        between the last one offered and it held no record for this consumer (transaction
        markers, aborted records under ``read_committed``); :meth:`committable` moves there.
        ``False`` (nothing changes) when a record is unfinished or ``position`` is not ahead."""
        if self._low is not None or (self._next is not None and position <= self._next):
            return False
        self._next = position
        self._ranges.clear()
        return True

    @property
    def next_offset(self) -> int | None:
        """The offset after the last one offered (``None``: none offered)."""
        return self._next

    def lowest(self) -> int | None:
        """The lowest unfinished offset (``None``: none unfinished)."""
        return self._low

    def committable(self) -> int | None:
        """The offset a commit may carry: the lowest unfinished one (``None``: none offered)."""
        return self._next if self._low is None else self._low

    def ahead(self) -> int:
        """How far the partition went past the lowest unfinished offset (0: none unfinished)."""
        if self._low is None or self._next is None:
            return 0
        return self._next - 1 - self._low

    def finished_ranges(self) -> list[tuple[int, int]]:
        """The finished offsets above :meth:`committable`: ``[start, end)`` ranges, ascending
        (holes between offered offsets included)."""
        return [(start, end) for start, end in self._ranges]

    def finished(self) -> list[int]:
        """The finished offsets above :meth:`committable`, ascending (tests, small lists)."""
        return [o for start, end in self._ranges for o in range(start, end)]

    def unfinished(self) -> int:
        """How many offered offsets are not finished."""
        return len(self._unfinished)

    def reset(self) -> None:
        """Forget everything (a seek moved the partition; revoke; loss)."""
        self._unfinished.clear()
        self._ranges.clear()
        self._low = None
        self._next = None


# ---------------------------------------------------------------------- scheduling


@dataclasses.dataclass(slots=True, eq=False)
class _Entry(Generic[T]):
    offset: int
    chain: Hashable
    size: int
    item: T
    running: bool = False
    due: float = 0.0  #: earliest start (a retry's backoff)


def _drain(entries: deque[_Entry[T]]) -> Iterator[_Entry[T]]:
    """Pop ``entries`` from the left until it is empty."""
    while entries:
        yield entries.popleft()


class InflightWindow(Generic[T]):
    """Which records of one partition may start now, under an ordering mode and a window.

    ``item`` is what the consumer gets back from :meth:`ready` (its message). The caller
    offers records in offset order and reports each started record either finished
    (:meth:`finish`) or waiting for its next attempt (:meth:`retry`).
    """

    def __init__(
        self,
        ordering: Ordering,
        *,
        max_records: int,
        max_bytes: int,
        max_backlog: int = 0,
        max_backlog_bytes: int = 0,
        max_ahead: int = 0,
        skip: Finished | None = None,
    ) -> None:
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS}, not {ordering!r}")
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be at least 1")
        self.ordering: Ordering = ordering
        self.max_records = 1 if ordering == "partition" else max_records
        self.max_bytes = max_bytes
        #: ``blocked`` from more than this many records waiting outside the window, until
        #: half of them went in (0: from the first one until none waits)
        self.max_backlog = max(max_backlog, 0)
        #: the same for the bytes of the records waiting (0: no byte limit)
        self.max_backlog_bytes = max(max_backlog_bytes, 0)
        self._blocked = False
        #: ``blocked`` while the partition went more than this many offsets past its lowest
        #: unfinished record (0: no limit): what a crash may redo when the list of finished
        #: records does not fit the metadata, and what a record waiting for its retries
        #: lets through behind it
        self.max_ahead = max(max_ahead, 0)
        self.offsets = OffsetTracker()
        self.skip = skip
        self.skipped = 0  #: records finished from the metadata without running
        self._backlog: deque[_Entry[T]] = deque()
        self._entries: dict[int, _Entry[T]] = {}  #: admitted, by offset
        self._chains: dict[Hashable, deque[_Entry[T]]] = {}
        self._ready: deque[_Entry[T]] = deque()  #: chain heads that may start now
        self._delayed: list[tuple[float, int, _Entry[T]]] = []  #: heads waiting for a retry
        self._bytes = 0
        self._backlog_bytes = 0  #: bytes of the records in the backlog
        self._running = 0
        #: set when the partition is revoked or lost (and by :meth:`clear`): records handed
        #: to a worker and not started yet are not to run (the consumer checks it)
        self.closed = False
        #: one record at a time, in offset order, whatever the ordering mode: the crash-loop
        #: probe of a partition taken over after an unclean end (:meth:`ready`)
        self.serial = False

    # ------------------------------------------------------------------ feeding

    def offer(self, offset: int, key: bytes | None, size: int, item: T) -> bool:
        """A polled record, in offset order. ``False``: it finished before (the metadata of
        the committed offset lists it) and is not to run; it is finished here already."""
        self.offsets.offer(offset)
        skip = self.skip
        if skip is not None:
            if offset in skip:
                self.offsets.finish(offset)
                self.skipped += 1
                return False
            if offset > skip.last:
                self.skip = None
        if self.ordering == "key":
            chain: Hashable = key
        elif self.ordering == "none":
            chain = offset
        else:
            chain = _WHOLE_PARTITION
        entry = _Entry(offset=offset, chain=chain, size=max(size, 0), item=item)
        self._backlog.append(entry)
        self._backlog_bytes += entry.size
        self._admit()
        return True

    def _admit(self) -> None:
        backlog = self._backlog
        try:
            while backlog:
                entry = backlog[0]
                if self._entries and (
                    len(self._entries) >= self.max_records
                    or self._bytes + entry.size > self.max_bytes
                ):
                    return
                entry = backlog.popleft()
                self._backlog_bytes -= entry.size
                self._admit_one(entry)
        finally:
            waiting = len(backlog)
            limit = self.max_backlog_bytes
            if waiting > self.max_backlog or 0 < limit < self._backlog_bytes:
                self._blocked = True
            elif waiting <= self.max_backlog // 2 and (
                not limit or self._backlog_bytes <= limit // 2
            ):
                self._blocked = False

    def _admit_one(self, entry: _Entry[T]) -> None:
        self._entries[entry.offset] = entry
        self._bytes += entry.size
        chain = self._chains.get(entry.chain)
        if chain is None:
            self._chains[entry.chain] = deque((entry,))
            self._ready.append(entry)
        else:
            chain.append(entry)

    # ------------------------------------------------------------------ starting

    def ready(self, now: float, *, new: bool = True) -> list[T]:
        """The records that may start now (each returned once; they count as running).

        ``new=False``: only records whose retry is due (a dependency outage starts nothing
        new: the records in hand are held, and only its probe is retried).

        :attr:`serial`: at most the lowest unfinished record, and only while nothing runs, so
        a record starts only after every record before it finished: one in flight, as in
        ``"partition"`` mode (the record that started is always the lowest unfinished one,
        so a record waiting for its retry or held by an outage is that one)."""
        if self.serial:
            return self._ready_serial(now, new)
        delayed, entries = self._delayed, self._entries
        due: list[_Entry[T]] = []
        while delayed and delayed[0][0] <= now:
            at, _, entry = heapq.heappop(delayed)
            if entry.due == at:  # else rescheduled while it waited (a stale heap item)
                due.append(entry)
        if new:
            self._ready.extend(due)
            pending: Iterable[_Entry[T]] = _drain(self._ready)
        else:
            pending = due
        out: list[T] = []
        for entry in pending:
            if entry.running or entries.get(entry.offset) is not entry:
                continue  # finished while it waited (a dead letter of a held record)
            entry.running = True
            self._running += 1
            out.append(entry.item)
        return out

    def serial_ready(self, now: float, *, new: bool = True) -> bool:
        """:attr:`serial`: whether :meth:`ready` would start a record now (nothing started)."""
        return self._serial_entry(now, new) is not None

    def _serial_entry(self, now: float, new: bool) -> _Entry[T] | None:
        if self._running:
            return None
        low = self.offsets.lowest()
        entry = self._entries.get(low) if low is not None else None
        if entry is None or entry.running or entry.due > now or (not new and not entry.due):
            # not admitted yet, running, waiting for its retry (or held: ``inf``); during an
            # outage (``new=False``) only a retry that came due (``due`` set) starts
            return None
        return entry

    def _ready_serial(self, now: float, new: bool) -> list[T]:
        entry = self._serial_entry(now, new)
        if entry is None:
            return []
        if entry.due:
            entry.due = 0.0  # its heap item is stale from now on (see next_due)
        else:
            with contextlib.suppress(ValueError):  # a chain head not started yet is queued
                self._ready.remove(entry)
        entry.running = True
        self._running += 1
        return [entry.item]

    def ready_new(self) -> T | None:
        """One record that never started and may start now (``None``: none), for a dependency
        outage's probe by a new record (a held record failing every probe cannot end one).
        :attr:`serial`: only the lowest unfinished record, only while nothing runs."""
        entries = self._entries
        if self.serial:
            if self._running:
                return None
            low = self.offsets.lowest()
            entry = entries.get(low) if low is not None else None
            if entry is None or entry.running or entry.due:
                return None
            with contextlib.suppress(ValueError):
                self._ready.remove(entry)
        else:
            while True:
                if not self._ready:
                    if not self._backlog:
                        return None
                    # the window is full of held records: one more admitted past its limit
                    # (the probe; a record of a held key queues behind it, admitted)
                    entry = self._backlog.popleft()
                    self._backlog_bytes -= entry.size
                    self._admit_one(entry)
                    continue
                entry = self._ready.popleft()
                if not entry.running and entries.get(entry.offset) is entry and not entry.due:
                    break
        entry.running = True
        self._running += 1
        return entry.item

    def next_due(self) -> float | None:
        """When the earliest record waiting for its retry may start (``None``: none waits)."""
        delayed, entries = self._delayed, self._entries
        while delayed and (
            entries.get(delayed[0][1]) is not delayed[0][2] or delayed[0][2].due != delayed[0][0]
        ):
            heapq.heappop(delayed)  # finished or rescheduled while it waited
        return delayed[0][0] if delayed else None

    # ------------------------------------------------------------------ outcomes

    def finish(self, offset: int) -> None:
        """The record at ``offset`` (returned by :meth:`ready`) is done."""
        entry = self._entries.get(offset)
        chain = self._chains[entry.chain] if entry is not None else None
        if entry is None or chain is None or chain[0] is not entry:
            # only a chain's head can have started: a later record finishing first is a bug
            raise KeyError(f"offset {offset} is not in flight")
        del self._entries[offset]
        if entry.running:
            self._running -= 1
        self._bytes -= entry.size
        chain.popleft()
        if chain:
            self._ready.append(chain[0])
        else:
            del self._chains[entry.chain]
        self.offsets.finish(offset)
        self._admit()

    def abandon(self, offset: int) -> None:
        """The record at ``offset`` stopped running without an outcome (a fatal error in its
        handler, its partition revoked before it started): it no longer counts as running,
        and stays unfinished (a commit stays below it) and blocks its chain."""
        entry = self._entries.get(offset)
        if entry is not None and entry.running:
            entry.running = False
            self._running -= 1

    def retry(self, offset: int, due: float) -> None:
        """The record at ``offset`` failed and waits until ``due`` for its next attempt; it
        keeps its place, so it still blocks its chain."""
        entry = self._entries.get(offset)
        if entry is None or not entry.running:
            raise KeyError(f"offset {offset} is not running")
        entry.running = False
        self._running -= 1
        self.reschedule(offset, due)

    def waiting(self, offset: int) -> bool:
        """Whether the record at ``offset`` waits for its next attempt (admitted, not
        running)."""
        entry = self._entries.get(offset)
        return entry is not None and not entry.running

    def reschedule(self, offset: int, due: float) -> None:
        """The record at ``offset``, waiting for its next attempt, waits until ``due`` instead
        (``math.inf``: until rescheduled again: a record held by a dependency outage)."""
        entry = self._entries.get(offset)
        if entry is None or entry.running:
            raise KeyError(f"offset {offset} is not waiting")
        entry.due = due
        if due != math.inf:
            heapq.heappush(self._delayed, (due, offset, entry))

    # ------------------------------------------------------------------ state

    @property
    def blocked(self) -> bool:
        """Whether the partition must be paused: more than ``max_backlog`` records (or
        ``max_backlog_bytes`` bytes) wait outside the full window (until no more than half of
        each waits: a fetch restarted
        after a pause takes a while, the window keeps running meanwhile); or more than
        ``max_ahead`` offsets were offered past the lowest unfinished one (until its record
        finishes)."""
        return self._blocked or (0 < self.max_ahead < self.offsets.ahead())

    @property
    def running(self) -> int:
        """Records started and not finished nor waiting for a retry."""
        return self._running

    @property
    def admitted(self) -> int:
        """Records in the window (running, startable, or waiting for a retry)."""
        return len(self._entries)

    @property
    def admitted_bytes(self) -> int:
        """Bytes of the records in the window."""
        return self._bytes

    @property
    def idle(self) -> bool:
        """Nothing offered is unfinished."""
        return not self._entries and not self._backlog

    def advance(self, position: int) -> bool:
        """See :meth:`OffsetTracker.advance`: only while the window is idle (nothing admitted
        nor in the backlog), so no polled record lies below ``position`` unfinished."""
        return self.idle and self.offsets.advance(position)

    def unstarted(self) -> Iterator[T]:
        """Records offered but not running (startable, waiting for a retry, or in the
        backlog), in offset order: what a revoke abandons."""
        for entry in sorted(
            [e for e in self._entries.values() if not e.running] + list(self._backlog),
            key=lambda e: e.offset,
        ):
            yield entry.item

    def clear(self) -> None:
        """Forget every record (revoke, loss, a seek)."""
        self._backlog.clear()
        self._backlog_bytes = 0
        self._entries.clear()
        self._chains.clear()
        self._ready.clear()
        self._delayed.clear()
        self._bytes = 0
        self._running = 0
        self._blocked = False
        self.offsets.reset()
        self.skip = None
        self.closed = True

    def committable(self) -> int | None:
        """See :meth:`OffsetTracker.committable`."""
        return self.offsets.committable()

    def metadata(self, marker: str | None, limit: int = METADATA_MAX_BYTES) -> str | None:
        """``marker`` (kresilient's, or ``None``) with the finished offsets above the
        committable one (see :func:`with_finished`)."""
        base = self.offsets.committable()
        if base is None:
            return marker
        ranges = self.offsets.finished_ranges()
        skip, upcoming = self.skip, self.offsets.next_offset
        if skip is not None and upcoming is not None:
            # listed by the previous owner and not fetched again yet: still finished (a list
            # without them would make the next crash redo them); all above the tracker's
            ranges += [(max(s, upcoming), e) for s, e in skip.ranges if e > upcoming]
        return _with_value(marker, encode_ranges(base, ranges), limit)


# ---------------------------------------------------------------------- metadata


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """Offsets above ``base`` that finished before the commit: ``[start, end)`` ranges,
    ascending, disjoint, every offset ``> base``."""

    base: int
    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, offset: object) -> bool:
        if not isinstance(offset, int) or not self.ranges:
            return False
        i = bisect.bisect_right(self.ranges, (offset, _INF)) - 1
        return i >= 0 and self.ranges[i][0] <= offset < self.ranges[i][1]

    @property
    def last(self) -> int:
        """The highest finished offset (``base`` when there is none)."""
        return self.ranges[-1][1] - 1 if self.ranges else self.base

    def __len__(self) -> int:
        return sum(end - start for start, end in self.ranges)

    def offsets(self) -> list[int]:
        """Every finished offset (tests, small lists)."""
        return [o for start, end in self.ranges for o in range(start, end)]


_INF: Final = 1 << 63
_DIGITS: Final = "0123456789abcdefghijklmnopqrstuvwxyz"


def _b36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS[r])
    return "".join(reversed(out))


def _to_ranges(base: int, finished: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct offsets above ``base`` as merged ``[start, end)`` ranges."""
    ranges: list[tuple[int, int]] = []
    for offset in sorted({o for o in finished if o > base}):
        if ranges and ranges[-1][1] == offset:
            ranges[-1] = (ranges[-1][0], offset + 1)
        else:
            ranges.append((offset, offset + 1))
    return ranges


def encode_finished(base: int, finished: Iterable[int]) -> dict[str, int | str] | None:
    """The ``"g"`` value for the finished offsets above ``base`` (``None``: none)."""
    return encode_ranges(base, _to_ranges(base, finished))


def encode_ranges(base: int, ranges: Iterable[tuple[int, int]]) -> dict[str, int | str] | None:
    """The ``"g"`` value for finished ``[start, end)`` ranges above ``base`` (ascending,
    disjoint; ``None``: none). Linear in the number of ranges: the bitmap, whose size is the
    span, is built only when the span is short enough for it to win."""
    runs: list[int] = []
    cursor = base + 1
    for start, end in ranges:
        start = max(start, cursor)
        if end <= start:
            continue
        if runs and start == cursor:
            runs[-1] += end - start
        else:
            runs.append(start - cursor)
            runs.append(end - start)
        cursor = end
    if not runs:
        return None
    text = ".".join(_b36(n) for n in runs)
    span = cursor - 1 - base
    if span <= 6 * (len(text) + 2):  # a bitmap could be shorter: build it
        bits = bytearray((span + 7) // 8)
        i = 0
        for n_not, n_done in zip(runs[::2], runs[1::2], strict=True):
            i += n_not
            for j in range(i, i + n_done):
                bits[j >> 3] |= 1 << (j & 7)
            i += n_done
        bitmap = base64.urlsafe_b64encode(bytes(bits)).decode().rstrip("=")
        if len(bitmap) < len(text):
            return {"o": base, "b": bitmap}
    return {"o": base, "r": text}


def with_finished(
    marker: str | None,
    base: int,
    finished: Iterable[int],
    *,
    limit: int = METADATA_MAX_BYTES,
) -> str | None:
    """The metadata to commit at ``base``: ``marker`` (kresilient's marker, or ``None``)
    carrying the finished offsets above ``base``. When they would not fit in ``limit``
    bytes, or ``marker`` is not kresilient's, ``marker`` is returned unchanged (bare)."""
    return _with_value(marker, encode_finished(base, finished), limit)


def _with_value(marker: str | None, value: dict[str, int | str] | None, limit: int) -> str | None:
    if value is None:
        return marker
    if marker:
        if not marker.startswith(PREFIX):
            return marker
        try:
            data = json.loads(marker[len(PREFIX) :])
        except ValueError:
            return marker
        if not isinstance(data, dict):
            return marker
    else:
        data = {}
    data[_FIELD] = value
    out = PREFIX + json.dumps(data, separators=(",", ":"))
    if len(out.encode()) > limit:
        return marker
    return out


def finished_from(metadata: str | None, committed: int) -> Finished | None:
    """The finished offsets above ``committed`` that ``metadata`` lists (``None``: none,
    the metadata is not kresilient's, malformed, or belongs to another offset)."""
    if not metadata or not metadata.startswith(PREFIX) or committed < 0:
        return None
    try:
        data = json.loads(metadata[len(PREFIX) :])
    except ValueError:
        return None
    value = data.get(_FIELD) if isinstance(data, dict) else None
    if not isinstance(value, dict) or value.get("o") != committed:
        return None
    runs, bitmap = value.get("r"), value.get("b")
    try:
        if isinstance(runs, str):
            ranges = _decode_runs(committed, runs)
        elif isinstance(bitmap, str):
            ranges = _decode_bitmap(committed, bitmap)
        else:
            return None
    except ValueError:
        return None
    return Finished(base=committed, ranges=tuple(ranges)) if ranges else None


def _decode_runs(base: int, text: str) -> list[tuple[int, int]]:
    lengths = [int(part, 36) for part in text.split(".")]  # ValueError on junk
    if any(n < 0 for n in lengths):
        raise ValueError("negative run")
    ranges: list[tuple[int, int]] = []
    cursor = base + 1
    for i, n in enumerate(lengths):
        if i % 2 and n:
            if ranges and ranges[-1][1] == cursor:
                ranges[-1] = (ranges[-1][0], cursor + n)
            else:
                ranges.append((cursor, cursor + n))
        cursor += n
    return ranges


def _decode_bitmap(base: int, text: str) -> list[tuple[int, int]]:
    try:
        bits = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError("bad bitmap") from exc
    ranges: list[tuple[int, int]] = []
    for i in range(len(bits) * 8):
        if bits[i >> 3] >> (i & 7) & 1:
            offset = base + 1 + i
            if ranges and ranges[-1][1] == offset:
                ranges[-1] = (ranges[-1][0], offset + 1)
            else:
                ranges.append((offset, offset + 1))
    return ranges
