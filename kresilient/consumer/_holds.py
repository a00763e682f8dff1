"""Per-partition state of :class:`~kresilient.ResilientConsumer`: retry holds, pending dead letters,
and the loop state its collaborators share.

A partition is *held* while one of its messages waits for its next attempt: it is paused and
seeked back to that message, so the consumer keeps polling (no ``max.poll.interval.ms``
rebalance), other partitions keep flowing, and nothing after the held offset is processed or
committed before the message succeeds or is dead-lettered.

A dead-lettered message does not hold its partition: the messages after it are processed at
once, but the partition's stored offset stays at the dead-lettered offset until the dead-letter
write is ACKNOWLEDGED (:class:`PendingDeadLetters`), so a crash before the acknowledgement
re-delivers it.

A probe (:mod:`kresilient.consumer._outage`) that moved past records proving nothing (poison,
skipped duplicates) and then decided is followed by a *catch-up*: the partition is seeked back
to the first record after the held one and each record is handled in its turn; a probe handled
out of turn (:attr:`Holds.ahead`) is not handled again, its offset stored in its turn
(``Verdict.AHEAD``), so no offset passes a record not settled yet.
"""

from __future__ import annotations

import contextlib
import enum
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, TopicPartition

if TYPE_CHECKING:
    import tenacity

TP = tuple[str, int]


class Verdict(enum.Enum):
    """What to do with a message that arrives for a held partition."""

    SKIP = "skip"  #: stale (fetched before the pause/seek): drop, it will be fetched again
    RETRY = "retry"  #: the held message itself, redelivered after resume: run the handler
    RELEASE = "release"  #: the held offset is gone (retention, truncation): drop the hold
    PROBE = "probe"  #: a record after the held one, tried as evidence (see ``_outage``)
    #: catching up with a probe handled out of turn: a record before it, handled as any record
    TURN = "turn"
    #: the probe handled out of turn, in its turn: its offset is stored, it is not handled again
    AHEAD = "ahead"


@dataclass(slots=True, kw_only=True)
class Hold:
    """One partition whose message at ``offset`` waits for its next attempt."""

    tp: TP
    offset: int  #: the failed message (everything before it is done)
    attempts: int = 0  #: handler runs so far for the message at ``offset``
    due: float = 0.0  #: monotonic time the next attempt is due
    resumed: bool = False  #: resumed, waiting for the redelivery of ``offset``
    state: tenacity.RetryCallState | None = None
    first_failure: float = 0.0  #: monotonic time of the first failure of ``offset``
    #: of ``attempts``, those not counted by the RetryPolicy (made during an outage: after
    #: one the record gets its policy's whole budget again)
    retry_base: int = 0
    outages: int = 0  #: attempts made under the outage policy
    outage_state: tenacity.RetryCallState | None = None
    mark: int = 0  #: ``OutageDetector.mark()`` at the first failure
    #: the offset tried as evidence while this record is held (``Decision.PROBE``), or None
    probe: int | None = None
    probe_until: float = 0.0  #: monotonic time the probe gives way to a retry of ``offset``
    probes: int = 0  #: probes that proved nothing (moved on to the next record)
    probe_offset: int | None = None  #: the record ``probe_state`` / ``probe_attempts`` are of
    probe_attempts: int = 0  #: failed attempts of the probe record (its own RetryPolicy)
    probe_state: tenacity.RetryCallState | None = None
    failed: Any = None  #: the failed message (dead-lettered if a probe succeeds)
    exc: BaseException | None = None  #: its last exception
    batch: list[Any] | None = None  #: batch mode: the group that failed with it
    #: offsets of this partition handled out of turn (probes that succeeded after records
    #: that proved nothing), stored in their turn and not handled again; the one set of
    #: :attr:`Holds.ahead` for this partition, shared by its successive holds
    ahead: set[int] | None = None
    #: no failed record: the partition was seeked back to ``offset`` and catches up with the
    #: records handled out of turn (``ahead``) before it flows again
    catchup: bool = False

    def verdict(self, offset: int) -> Verdict:
        """Decide about a message at ``offset`` that arrived for this partition."""
        if not self.resumed:
            return Verdict.SKIP
        ahead = self.ahead
        if self.catchup:
            if ahead:
                if offset in ahead:
                    ahead.discard(offset)
                    return Verdict.AHEAD
                # records come in order: one handled out of turn before ``offset`` is gone
                # (compaction, retention), nothing to skip for it
                ahead.difference_update([o for o in ahead if o < offset])
                if not ahead:
                    return Verdict.RELEASE
            return Verdict.TURN
        probe = self.probe
        if probe is not None:
            if offset < probe or (ahead and offset in ahead):
                return Verdict.SKIP  # stale, or handled out of turn already: no new evidence
            self.probe = offset  # the probe offset itself may be gone (compaction)
            return Verdict.PROBE
        if offset == self.offset:
            return Verdict.RETRY
        return Verdict.RELEASE

    def position(self) -> int:
        """The offset the partition resumes at (the probe, or the held message)."""
        return self.probe if self.probe is not None else self.offset

    def snapshot(self) -> dict[str, Any]:
        """For ``health()``."""
        return {
            "topic": self.tp[0],
            "partition": self.tp[1],
            "offset": self.offset,
            "attempts": self.attempts,
            "resumed": self.resumed,
            "outage": self.outage_state is not None,
            "probe": self.probe,
        }


@dataclass(slots=True, kw_only=True)
class PendingDeadLetters:
    """Dead-letter writes of one partition not yet acknowledged, oldest first.

    ``entries`` holds ``(first source offset, delivery handles)``; ``high`` is the offset to
    store once all are acknowledged (one past the last message processed or dead-lettered).
    """

    tp: TP
    entries: deque[tuple[int, list[Any]]] = field(default_factory=deque)
    high: int = 0

    def floor(self) -> int:
        """The highest offset that may be stored now (the oldest unacknowledged write)."""
        return self.entries[0][0] if self.entries else self.high

    def count(self) -> int:
        """Dead-letter records still unacknowledged."""
        return sum(len(handles) for _, handles in self.entries)


@dataclass(slots=True)
class LoopState:
    """The consume loop's per-batch state and counters, shared with its collaborators.

    One object (passed explicitly to :class:`~kresilient.consumer._failures.FailureHandler`,
    the batch processor and the client events) instead of attributes redeclared across
    mixins: each collaborator reads and writes only the fields named in its docstring.
    """

    batch: list[Any] = field(default_factory=list)  #: the batch being handled
    nonsuccess: int = 0  #: messages of ``batch`` not handled successfully so far
    reported: int = 0  #: successes of ``batch`` already reported to the outage detector
    credited: int = 0  #: successes of ``batch`` already credited to the breaker
    batch_errors: bool = False  #: ``batch`` holds error events
    stop_requested: bool = False
    interrupt: bool = False  #: stop handing out the rest of the batch
    overrun: bool = False  #: the watchdog saw the batch outlast its budget
    traced: bool = False  #: a tracer provider is active (checked once a second)
    processed: int = 0
    retries: int = 0
    duplicates: int = 0  #: possible duplicates skipped by ``dedupe`` (offset stored, no handler)
    revocations: int = 0  #: revoke + lost callbacks so far
    rebalances: dict[str, int] = field(
        default_factory=lambda: {"assigned": 0, "revoked": 0, "lost": 0}
    )


class Holds:
    """The partitions held for a retry: pause/seek/resume them on the client.

    ``by_tp`` maps each held partition to its :class:`Hold` (read directly on the hot path);
    ``excluded`` are partitions whose offsets the current batch must not store.
    """

    def __init__(
        self, consumer: Any, log: Any, redact: Callable[[str], str], seek_retry: float = 0.5
    ) -> None:
        self._consumer = consumer
        self._log = log
        self._redact = redact
        self._seek_retry = seek_retry
        self.by_tp: dict[TP, Hold] = {}
        self.excluded: set[TP] = set()
        #: per partition, the offsets handled out of turn (probes) not yet stored: each is
        #: stored when its turn comes (``Verdict.AHEAD``), never before the records before it
        #: are settled; forgotten on revoke (handled again by the next owner: at-least-once)
        self.ahead: dict[TP, set[int]] = {}

    def pause(self, tp: TP, offset: int) -> None:
        """Pause ``tp`` and seek it to ``offset`` (drops what was fetched beyond it)."""
        part = TopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([part])
        try:
            self._consumer.seek(part)
        except KafkaException as exc:  # seeked again before resume
            self._log.debug(
                "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
            )

    def resume(self, tp: TP, offset: int) -> bool:
        """Seek ``tp`` to ``offset`` and resume it; False (still paused) if the seek failed."""
        part = TopicPartition(tp[0], tp[1], offset)
        try:
            self._consumer.seek(part)
        except KafkaException as exc:  # resuming without it could skip the held message
            self._log.warning(
                "seek_failed",
                topic=tp[0],
                partition=tp[1],
                offset=offset,
                error=self._redact(str(exc)),
                note="the partition stays paused; retried shortly",
            )
            return False
        self._consumer.resume([part])
        return True

    def service(self, timeout: float) -> float:
        """Resume partitions whose retry is due; return the poll timeout to use.

        A probe (``Hold.probe``) that found no record by ``probe_until`` gives way to the next
        attempt of the held message itself (nothing after it to learn from yet)."""
        now = time.monotonic()
        caught_up: list[TP] = []
        for tp, hold in self.by_tp.items():
            if hold.resumed:
                if hold.probe is None:
                    continue
                if hold.probe_until > now:
                    timeout = min(timeout, hold.probe_until - now)
                    continue
                hold.probe = None
                hold.resumed = False
                self.pause(tp, hold.offset)
            if hold.due <= now:
                if self.resume(tp, hold.position()):
                    hold.resumed = True
                    if hold.catchup and not hold.ahead:
                        caught_up.append(tp)  # seeked back, nothing to skip: it flows
                else:
                    hold.due = now + self._seek_retry
                    timeout = min(timeout, self._seek_retry)
            else:
                timeout = min(timeout, hold.due - now)
        for tp in caught_up:
            self.done(tp)
        return max(timeout, 0.0)

    def new(self, tp: TP, offset: int, **kw: Any) -> Hold:
        """A hold for the record at ``offset`` that failed (it knows what is ``ahead``)."""
        hold = self.by_tp[tp] = Hold(tp=tp, offset=offset, ahead=self.ahead.get(tp), **kw)
        return hold

    def catch_up(self, tp: TP, offset: int, ahead: Iterable[int] = ()) -> None:
        """The record(s) held before ``offset`` are settled, but a probe ran past records that
        proved nothing (poison, skipped duplicates): seek ``tp`` back to ``offset``; those
        records are handled in their turn, and the ``ahead`` offsets (handled out of turn)
        are stored, not handled, in theirs. What was fetched beyond ``offset`` is skipped."""
        known = self.ahead.setdefault(tp, set())
        known.update(ahead)
        self.by_tp[tp] = Hold(tp=tp, offset=offset, ahead=known, catchup=True, due=time.monotonic())
        self.excluded.add(tp)  # nothing of it stored by this batch (its offset is behind)
        self.pause(tp, offset)

    def done(self, tp: TP) -> None:
        """The hold of ``tp`` ended (its record handled or dead-lettered, or the last record
        handled out of turn reached in its turn): the partition flows, catching up with what
        is still ``ahead`` first."""
        hold = self.by_tp.pop(tp, None)
        ahead = self.ahead.get(tp)
        if not ahead:
            self.ahead.pop(tp, None)
            return
        offset = hold.offset + 1 if hold is not None else min(ahead)
        self.by_tp[tp] = Hold(tp=tp, offset=offset, ahead=ahead, catchup=True, resumed=True)

    def release(self, tps: Iterable[TP]) -> None:
        """Forget the holds of ``tps`` (revoked or lost) and resume them: librdkafka keeps an
        application pause across unassign/assign, so a re-assigned partition would otherwise
        never be fetched again (issue 11, defect 2)."""
        for tp in tps:
            self.ahead.pop(tp, None)
            if self.by_tp.pop(tp, None) is not None:
                with contextlib.suppress(KafkaException):
                    self._consumer.resume([TopicPartition(tp[0], tp[1])])

    def resume_unheld(self, partitions: Iterable[TopicPartition]) -> None:
        """Newly assigned partitions have no hold: make sure none of them stays paused."""
        unheld = [
            TopicPartition(p.topic, p.partition)
            for p in partitions
            if (p.topic, p.partition) not in self.by_tp
        ]
        if unheld:
            with contextlib.suppress(KafkaException):
                self._consumer.resume(unheld)

    def give_back(self, rest: list[Any]) -> None:
        """Seek partitions back to their first unprocessed message in ``rest``."""
        first: dict[TP, int] = {}
        for m in rest:
            if m.error() is None:
                first.setdefault((m.topic(), m.partition()), m.offset())
        for tp, offset in first.items():
            hold = self.by_tp.get(tp)
            if hold is not None and not (hold.catchup and hold.resumed):
                continue  # seeked to its held record (or its catch-up point) already
            try:
                self._consumer.seek(TopicPartition(tp[0], tp[1], offset))
            except KafkaException as exc:
                self._log.warning(
                    "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
                )
