"""Offset storing and committing for :class:`~kresilient.ResilientConsumer`.

The rule: an offset is stored (``store_offsets``; ``enable.auto.offset.store=false``) only
when every message before it was processed or dead-lettered with an ACKNOWLEDGED write. While a
partition has unacknowledged dead-letter writes its stored offset stays at the oldest one;
the processing progress made meanwhile is remembered and stored once they are acknowledged.
Commits: background (librdkafka auto-commit of stored offsets) or every interval when
``enable.auto.commit=false``, synchronous on revoke and on close; failures are classified and
logged, never raised (the offsets stay stored and the next commit carries them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kresilient.consumer._holds import TP, PendingDeadLetters
from kresilient.errors import CommitError, DeadLetterError, translate
from kresilient.redaction import redact_text
from kresilient.telemetry import Telemetry

__all__ = ["OffsetKeeper", "positions_ahead"]

_NO_OFFSET: Final = KafkaError._NO_OFFSET


class OffsetKeeper:
    """Stores offsets under the rule above and commits them."""

    def __init__(
        self,
        consumer: Consumer,
        log: Any,
        tel: Telemetry,
        dead_letter_topic: Callable[[str], str | None],
        redact: Callable[[str], str] = redact_text,
    ) -> None:
        self._consumer = consumer
        self._log = log
        self._tel = tel
        self._dlq_topic = dead_letter_topic
        self._redact = redact
        self.pending: dict[TP, PendingDeadLetters] = {}
        #: the offset stored (or committed with a marker) last, per partition of this owner
        self.stored: dict[TP, int] = {}
        #: offset metadata of the commits on revoke and close (crash-loop protection's clean
        #: marker); ``None``: those commits are librdkafka's commit of the stored offsets
        self.clean_marker: str | None = None
        self.dead_lettered = 0
        self.commit_failures = 0
        #: the lowest offset of a partition whose handler outputs (at-least-once Output
        #: records) are not delivered, after flushing them (``None``: none): no stored offset
        #: nor crash marker commit passes it (set by the consumer when it has outputs)
        self.output_floor: Callable[[TP], int | None] | None = None
        self.last_commit_error: CommitError | None = None

    # ------------------------------------------------------------------ storing

    def store(self, tp: TP, offset: int, epoch: int | None = None) -> None:
        """Everything of ``tp`` before ``offset`` is done (handled; with at-least-once
        outputs, stored no further than the first record whose outputs are not delivered)."""
        if self.output_floor is not None:
            undelivered = self.output_floor(tp)
            if undelivered is not None and undelivered < offset:
                offset, epoch = undelivered, None
        pending = self.pending.get(tp)
        if pending is not None:
            pending.high = max(pending.high, offset)
            return
        self._store_now(tp, offset, epoch)

    def store_last(self, last: Mapping[TP, Message]) -> None:
        """Batch end: ``last`` maps each partition to its last processed message."""
        store = self._consumer.store_offsets
        pending = self.pending
        stored = self.stored
        for tp, msg in last.items():
            if pending:
                waiting = pending.get(tp)
                if waiting is not None:
                    waiting.high = max(waiting.high, msg.offset() + 1)  # type: ignore[operator]
                    continue
            try:
                store(message=msg)
            except KafkaException as exc:
                self._store_failed(exc, tp)
            else:
                stored[tp] = msg.offset() + 1  # type: ignore[operator]

    def _store_now(self, tp: TP, offset: int, epoch: int | None = None) -> None:
        part = (
            TopicPartition(tp[0], tp[1], offset)
            if epoch is None
            else TopicPartition(tp[0], tp[1], offset, leader_epoch=epoch)
        )
        try:
            self._consumer.store_offsets(offsets=[part])
        except KafkaException as exc:
            self._store_failed(exc, tp)
        else:
            self.stored[tp] = offset

    def advance_idle(self, busy: Container[TP]) -> None:
        """Store each partition this owner stored before at the consumer's position when it
        is ahead: the position passes a transaction's commit or abort marker (and aborted
        records) that no record arrives for, so at a partition's end the committed offset
        would otherwise stay below the marker (lag 1 for good, a false stall). Called while
        idle; ``busy`` (records held for a retry or an outage) and partitions with dead
        letters in flight are left alone: their stored offset is held back on purpose."""
        asked = [tp for tp in self.stored if tp not in busy and tp not in self.pending]
        ahead = positions_ahead(self._consumer, asked, self.stored, self._log, self._redact)
        for tp, position in ahead.items():
            self._store_now(tp, position)

    def store_metadata(self, tp: TP, offset: int, metadata: str | None) -> None:
        """Store ``offset`` of ``tp`` with ``metadata`` (in-partition concurrency: the lowest
        unfinished offset, and the finished offsets above it in the metadata)."""
        part = (
            TopicPartition(tp[0], tp[1], offset)
            if metadata is None
            else TopicPartition(tp[0], tp[1], offset, metadata=metadata)
        )
        try:
            self._consumer.store_offsets(offsets=[part])
        except KafkaException as exc:
            self._store_failed(exc, tp)
        else:
            self.stored[tp] = offset

    def commit_marker(self, tp: TP, offset: int | None, metadata: str) -> None:
        """Commit ``tp`` synchronously with ``metadata`` (crash-loop protection).

        The committed offset is ``offset`` (``None``: the stored one), never past an
        unacknowledged dead letter nor past what was stored; a failure is logged (the handler
        still runs: the marker is a safety net, not a precondition of progress)."""
        floor = self.stored.get(tp)
        pending = self.pending.get(tp)
        if pending is not None:
            floor = pending.floor() if floor is None else min(floor, pending.floor())
        target = offset if floor is None or offset is None else min(offset, max(floor, 0))
        if target is None or target < 0:
            if offset is None:
                return  # nothing processed yet on this partition: nothing to commit
            target = offset
        if self.output_floor is not None:
            # the records before ``target`` are handled, but their outputs may still be in
            # the producer's queue: flushed first, and never committed past one not delivered
            undelivered = self.output_floor(tp)
            if undelivered is not None and undelivered < target:
                target = undelivered
        part = TopicPartition(tp[0], tp[1], target, metadata=metadata)
        try:
            # stored with the metadata too: librdkafka would otherwise commit its stored
            # offset again with the stored (empty) metadata, erasing the marker
            self._consumer.store_offsets(offsets=[part])
            result = self._consumer.commit(offsets=[part], asynchronous=False)
        except KafkaException as exc:
            self.commit_failed(exc, "crash_marker")
            return
        failed = [p for p in result or [] if p.error is not None]
        if failed:
            self.commit_failed(failed[0].error, "crash_marker")
            return
        self.stored[tp] = target

    def commit_markers(self, offsets: Mapping[TP, int], metadata: str) -> list[TP]:
        """Commit every partition of ``offsets`` at its offset with ``metadata`` in ONE
        synchronous commit; return those committed (a failure is logged).

        Crash-loop protection's seed of a new group's partitions, made in the assignment
        callback before they are fetched: nothing was stored for them, so nothing is stored
        here (librdkafka has no stored offset of theirs to commit over the marker). They are
        remembered as stored, so a clean end before their first record marks them clean."""
        if not offsets:
            return []
        parts = [TopicPartition(t, p, o, metadata=metadata) for (t, p), o in offsets.items()]
        try:
            result = self._consumer.commit(offsets=parts, asynchronous=False)
        except KafkaException as exc:
            self.commit_failed(exc, "crash_marker", partitions=len(parts))
            return []
        failed = [p for p in result or [] if p.error is not None]
        if failed:
            self.commit_failed(failed[0].error, "crash_marker", partitions=len(failed))
        done = [(p.topic, p.partition) for p in result or [] if p.error is None and p.offset >= 0]
        for tp in done:
            self.stored[tp] = offsets[tp]
        return done

    def _store_failed(self, exc: KafkaException, tp: TP) -> None:
        # _STATE / UNKNOWN_PARTITION: the partition was revoked meanwhile; its new owner starts
        # from the last commit (at-least-once).
        self._log.debug(
            "offset_store_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
        )

    # ------------------------------------------------------------------ dead letters

    def add_dead_letters(self, tp: TP, first: int, handles: list[Any], high: int) -> None:
        """Dead-letter writes for ``tp`` starting at source offset ``first`` were queued."""
        pending = self.pending.get(tp)
        if pending is None:
            pending = self.pending[tp] = PendingDeadLetters(tp=tp, high=high)
        pending.entries.append((first, handles))
        pending.high = max(pending.high, high)

    def release(self) -> None:
        """Store past every acknowledged dead letter; raise DeadLetterError on a failed one."""
        for tp, pending in list(self.pending.items()):
            released = False
            while pending.entries and all(h.done() for h in pending.entries[0][1]):
                first, handles = pending.entries.popleft()
                for handle in handles:
                    error = handle.exception(0)
                    if error is not None:
                        pending.entries.appendleft((first, handles))
                        reason = self._redact(str(error))
                        raise DeadLetterError(
                            f"dead-letter write for {tp[0]}[{tp[1]}]@{first} failed: {reason}; "
                            "the source offset is not committed",
                            topic=self._dlq_topic(tp[0]),
                            classification=error.classification,
                        ) from error
                self.dead_lettered += _dead_letters(handles)
                released = True
            if not pending.entries:
                del self.pending[tp]
                self._store_now(tp, pending.high)
            elif released:
                self._store_now(tp, pending.floor())

    def wait(self, producer: Any, tps: Iterable[TP] | None, timeout: float) -> None:
        """Wait up to ``timeout`` s for the writes of ``tps`` (all: ``None``); store what was
        acknowledged, stopping at the first write that failed or is still pending."""
        chosen = [p for tp, p in self.pending.items() if tps is None or tp in set(tps)]
        if not chosen:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not all(
            h.done() for p in chosen for _, handles in p.entries for h in handles
        ):
            producer.poll(0.05)
        for pending in chosen:
            while pending.entries and all(
                h.done() and h.exception(0) is None for h in pending.entries[0][1]
            ):
                self.dead_lettered += _dead_letters(pending.entries.popleft()[1])
            if pending.entries:
                self._log.warning(
                    "dead_letter_unacknowledged",
                    topic=pending.tp[0],
                    partition=pending.tp[1],
                    offset=pending.entries[0][0],
                    note="its offset is not committed: the message will be consumed again",
                )
            self._store_now(pending.tp, pending.floor())
            del self.pending[pending.tp]

    def drop(self, tps: Iterable[TP]) -> None:
        """Forget partitions that were lost (their new owner consumes them again)."""
        for tp in tps:
            self.pending.pop(tp, None)
            self.stored.pop(tp, None)

    def forget_stored(self, tps: Iterable[TP]) -> None:
        """Revoked partitions (committed on revoke) belong to their new owner now."""
        for tp in tps:
            self.stored.pop(tp, None)

    def pending_count(self) -> int:
        """Unacknowledged dead-letter records."""
        return sum(p.count() for p in list(self.pending.values()))

    # ------------------------------------------------------------------ commits

    def commit_async(self) -> None:
        """Commit stored offsets in the background (``enable.auto.commit=false``)."""
        try:
            self._consumer.commit(asynchronous=True)
        except KafkaException as exc:
            if not _no_offset(exc):
                self.commit_failed(exc, "interval")

    def commit_sync(self, reason: str) -> None:
        """Commit stored offsets and wait (on revoke and on close)."""
        start = time.perf_counter()
        marker = self.clean_marker
        try:
            if marker is not None and self.stored:
                # the stored offsets, stored again and committed with the clean-end marker
                parts = [
                    TopicPartition(tp[0], tp[1], offset, metadata=marker)
                    for tp, offset in self.stored.items()
                ]
                try:
                    self._consumer.store_offsets(offsets=parts)
                except KafkaException as exc:  # committed explicitly all the same
                    self._log.debug("offset_store_failed", error=self._redact(str(exc)))
                result = self._consumer.commit(offsets=parts, asynchronous=False)
            else:
                result = self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if not _no_offset(exc):
                self.commit_failed(exc, reason)
            return
        except RuntimeError:  # the consumer is closed
            return
        failed = [p for p in result or [] if p.error is not None]
        if failed:
            self.commit_failed(failed[0].error, reason, partitions=len(failed))
        self._tel.record_commit(result or [], duration_s=time.perf_counter() - start)

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's commit callback (background commits)."""
        if err is not None:
            if err.code() != _NO_OFFSET:  # nothing stored since the last commit: no commit
                self.commit_failed(err, "auto")
                self._tel.record_commit(partitions or [], err)
            return
        failed = [p for p in partitions if p.error is not None]
        if failed:
            self.commit_failed(failed[0].error, "auto", partitions=len(failed))
        self._tel.record_commit(partitions)

    def commit_failed(self, err: Any, reason: str, *, partitions: int | None = None) -> None:
        """Classify and log one failed commit."""
        translated = translate(err, operation="commit", redactor=self._redact)
        error = (
            translated
            if isinstance(translated, CommitError)
            else CommitError(str(translated), classification=translated.classification)
        )
        self.commit_failures += 1
        self.last_commit_error = error
        c = error.classification
        self._log.warning(
            "offset_commit_failed",
            reason=reason,
            error=c.name,
            category=c.category.value,
            retriable=c.retriable,
            partitions=partitions,
            remedy=c.remedy,
            note="offsets stay stored: the next commit carries them; a rebalance before "
            "then redelivers (at-least-once)",
        )


class MovedHandle:
    """The handle of a write to a retry topic: holds the source offset back like a dead
    letter, but is not counted as one."""

    __slots__ = ("handle",)

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def done(self) -> bool:
        return bool(self.handle.done())

    def exception(self, timeout: float | None = None) -> Any:
        return self.handle.exception(timeout)


def _dead_letters(handles: list[Any]) -> int:
    return sum(1 for h in handles if not isinstance(h, MovedHandle))


def _no_offset(exc: KafkaException) -> bool:
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.code() == _NO_OFFSET


def positions_ahead(
    consumer: Any,
    tps: Iterable[TP],
    floor: Mapping[TP, int | None],
    log: Any,
    redact: Callable[[str], str],
) -> dict[TP, int]:
    """The consumer's position of each of ``tps`` that is past ``floor[tp]`` (no floor: any
    known position): where an idle partition may move past a transaction's commit or abort
    markers and aborted records, offsets no record arrives for. The one position query of the
    sync, in-flight and asyncio consumers; a partition revoked meanwhile is left out."""
    asked = [TopicPartition(tp[0], tp[1]) for tp in tps]
    if not asked:
        return {}
    try:
        positions = consumer.position(asked)
    except KafkaException as exc:  # revoked meanwhile: nothing to move
        log.debug("position_unknown", error=redact(str(exc)))
        return {}
    ahead: dict[TP, int] = {}
    for part in positions:
        tp = (part.topic, part.partition)
        low = floor.get(tp, -1)
        if part.offset >= 0 and part.offset > (-1 if low is None else low):
            ahead[tp] = part.offset
    return ahead
