"""Deduplicator: drop re-sent copies of records a consumer already processed.

A spooled :class:`~kresilient.ResilientProducer` (and the :mod:`kresilient.outbox` relay)
give every record a stable ``kresilient.message.id`` header and mark a re-sent copy that may
already be in Kafka with ``kresilient.possible.duplicate: true``. A consumer remembers the
ids of the records it processed in a bounded window and drops a *marked* record whose id is
in it. Unmarked records are never dropped (the producer guarantees they are first copies), so
the window only has to span the distance between a record and its re-sent copy: the
producer's in-flight window at a crash, or an outage's backlog.

Example::

    dedupe = Deduplicator(window=1_000_000)
    for msg in consumer:
        if dedupe.is_duplicate(msg):
            continue                     # a re-sent copy of a record processed already
        process(msg)
        dedupe.processed(msg)            # after processing: a crash before re-delivers it

:class:`~kresilient.ResilientConsumer` does this itself with ``dedupe=Deduplicator(...)``
(per-message and batch handlers; docs/durability.md).

The window is in memory: after a consumer restart it is empty, so a copy re-sent across the
restart is processed again (make the handler idempotent or persist the window with
:meth:`Deduplicator.snapshot` / ``Deduplicator(..., ids=...)``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Final

__all__ = ["MESSAGE_ID_HEADER", "POSSIBLE_DUPLICATE_HEADER", "Deduplicator", "record_id"]

MESSAGE_ID_HEADER: Final = "kresilient.message.id"
POSSIBLE_DUPLICATE_HEADER: Final = "kresilient.possible.duplicate"
_TRUE: Final = (b"true", "true")


def record_id(msg: Any) -> tuple[bytes | None, bool]:
    """``(message id, possibly duplicate)`` from a record's headers (``msg.headers()``).

    kresilient's producers (the spool, the outbox relay) append the id, then the mark, after
    the record's own headers: only that last block is theirs. A service that forwards an
    upstream record's headers passes the upstream id and mark on before it, so the LAST id
    counts, and a mark only when it follows that id (issue 35, defect 6: a forwarded
    ``possible.duplicate`` does not mark the record a producer wrote for this topic).
    """
    headers = msg.headers() if callable(getattr(msg, "headers", None)) else None
    ident: bytes | None = None
    marked = False
    for name, value in headers or ():
        if name == MESSAGE_ID_HEADER and value is not None:
            ident = value.encode() if isinstance(value, str) else bytes(value)
            marked = False  # a mark before this id belonged to a forwarded block
        elif name == POSSIBLE_DUPLICATE_HEADER:
            marked = value in _TRUE
    return ident, marked


class Deduplicator:
    """A bounded window of processed ``kresilient.message.id`` values, per topic.

    Args:
        window: how many ids are remembered (least recently seen forgotten first). Size it
            above the number of records a producer can re-send after a crash or an outage:
            its spool's content (``Spool.max_bytes`` / record size) is a safe bound.
        ids: ids to start with (from :meth:`snapshot`).

    Thread-safe. Ids are kept per topic (the same id in two topics is not a duplicate).
    """

    def __init__(self, window: int = 1_000_000, *, ids: Iterable[tuple[str, bytes]] = ()) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.window = window
        self._seen: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._lock = threading.Lock()
        #: Records dropped as duplicates so far.
        self.dropped = 0
        #: Marked records whose id was not in the window (processed: first copy lost, or
        #: remembered no longer).
        self.marked_unseen = 0
        for item in ids:
            self._remember(item)

    def _remember(self, key: tuple[str, bytes]) -> None:
        seen = self._seen
        seen[key] = None
        seen.move_to_end(key)
        if len(seen) > self.window:
            seen.popitem(last=False)

    def is_duplicate(self, msg: Any) -> bool:
        """True if ``msg`` is marked as a possible duplicate and its id was processed."""
        ident, marked = record_id(msg)
        if ident is None or not marked:
            return False
        key = (str(msg.topic()), ident)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                self.dropped += 1
                return True
            self.marked_unseen += 1
            return False

    def processed(self, msg: Any) -> None:
        """Remember ``msg``'s id (call once it was processed). No id: nothing to remember."""
        ident, _ = record_id(msg)
        if ident is not None:
            with self._lock:
                self._remember((str(msg.topic()), ident))

    def check(self, msg: Any) -> bool:
        """``is_duplicate`` and, if not, ``processed`` in one call (for at-most-once handlers
        that cannot fail); True means drop."""
        if self.is_duplicate(msg):
            return True
        self.processed(msg)
        return False

    def split(self, msgs: Iterable[Any]) -> tuple[list[Any], list[Any]]:
        """``(to process, duplicates)`` of a batch, in order (for batch handlers).

        A marked record is a duplicate if its id was processed OR an earlier record of the same
        batch carries it (the batch is handled as one: its first copy is in it). Nothing is
        remembered: call :meth:`processed` for each record of the first list once the batch
        handler succeeded.
        """
        kept: list[Any] = []
        dropped: list[Any] = []
        in_batch: set[tuple[str, bytes]] = set()
        with self._lock:
            for msg in msgs:
                ident, marked = record_id(msg)
                if ident is None:
                    kept.append(msg)
                    continue
                key = (str(msg.topic()), ident)
                if marked and (key in in_batch or key in self._seen):
                    if key in self._seen:
                        self._seen.move_to_end(key)
                    self.dropped += 1
                    dropped.append(msg)
                    continue
                if marked:
                    self.marked_unseen += 1
                in_batch.add(key)
                kept.append(msg)
        return kept, dropped

    def snapshot(self) -> list[tuple[str, bytes]]:
        """The remembered ``(topic, id)`` pairs, oldest first (to persist the window)."""
        with self._lock:
            return list(self._seen)

    def __len__(self) -> int:
        return len(self._seen)

    def __repr__(self) -> str:
        return f"<Deduplicator window={self.window} remembered={len(self)} dropped={self.dropped}>"
