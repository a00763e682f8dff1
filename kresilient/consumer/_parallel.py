"""Many records of one partition in flight for :class:`~kresilient.ResilientConsumer` (issue 40).

``ordering="key"`` or ``"none"``: the consumer's loop thread polls, offers each record to
its partition's :class:`~kresilient.consumer._inflight.InflightWindow`, and hands what may
start to a thread pool; it never calls a handler itself, so polling never stops
(no ``max.poll.interval.ms`` rebalance however long handlers take). Outcomes come back on
a queue and are dealt with on the loop thread:

* success: the record is finished (``dedupe`` records its id);
* failure: the :class:`~kresilient.RetryPolicy` decides, per record; a retry waits in the
  window (it blocks only its key in ``"key"`` mode), the partition keeps flowing; a record
  given up on is written to the dead-letter topic (the same record format and writer as the
  one-at-a-time path) and finished when the write is ACKNOWLEDGED;
* a bad record or a bad dependency (:mod:`._outage`, the same evidence and policies as the
  one-at-a-time path): distinct records failing with no success between, or a Schema
  Registry outage, is a dependency outage. Its records are held (dead-lettered never, their
  RetryPolicy not spent), nothing new starts, and ONE held record at a time is tried again
  under ``outage_retry``'s wait, each time the next held one (a bad record among them cannot
  keep the outage going): the first success ends it and every held record is retried at
  once, with its whole RetryPolicy again. A record exhausting its RetryPolicy while nothing
  succeeded since its first failure waits under ``outage_retry`` for the evidence the other
  records give (not dead-lettered yet);
* a full window pauses its partition (polling goes on) until it has room again, and so does
  a partition that went ``max_ahead`` offsets past its lowest unfinished record;
* dedupe is checked when a record's turn comes (not when polled): a re-sent copy behind its
  original of the same key is skipped;
* crash-loop protection (``guard``, :mod:`._crashloop`): a partition probed after an unclean
  end runs one record at a time, lowest offset first (its window is ``serial``); before each
  handler call the marker naming the record is committed synchronously with the finished
  list; a record that killed the process ``max_process_deaths`` times is dead-lettered
  without calling its handler. When the probe ends the partition runs concurrently again.
  Revoke and close commit the clean-end marker with the list; the periodic commits carry
  none (or the probed record's marker), so a death leaves the partition unclean.

Offsets: the lowest unfinished offset of each partition is stored, with the finished offsets
above it in the metadata (:func:`~kresilient.consumer._inflight.with_finished`), and
committed explicitly every ``commit_interval`` (both), on revoke and on close; a member taking a
partition over skips the records the metadata lists. On revoke the runner waits (up to
``revoke_timeout``) for the revoked partitions' running records, then stores what is safe;
on a lost assignment it stores nothing. Either way the partitions' records queued in the
shared pool and not started are dropped (their window is ``closed``): they never start after
the partition left. A fatal outcome leaves its record unfinished and not running.
"""

from __future__ import annotations

import math
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

import tenacity
from confluent_kafka import KafkaException, Message, TopicPartition

from kresilient.consumer._crashloop import CLEAN, PROBE_END
from kresilient.consumer._failures import (
    log_outage_ended,
    log_outage_started,
    next_wait,
    note_outage,
    poison,
    write_dead_letter,
)
from kresilient.consumer._holds import TP, LoopState
from kresilient.consumer._inflight import Finished, InflightWindow, Ordering, finished_from
from kresilient.consumer._offsets import positions_ahead
from kresilient.consumer._outage import OutageDecision, OutageDetector
from kresilient.consumer._registry import is_outage, outage_classification
from kresilient.consumer._retrytopics import RetryView, next_tier, retry_record
from kresilient.deadletter import DeadLetterPolicy
from kresilient.errors import CrashLoopError, DeadLetterError, classify

if TYPE_CHECKING:
    from kresilient.consumer._breaker import CircuitBreaker
    from kresilient.consumer._crashloop import CrashGuard, Probe
    from kresilient.consumer._failures import DeadLetterSink
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.consumer._retrytopics import RetryTopicPolicy
    from kresilient.consumer._support import Deserializing
    from kresilient.dedupe import Deduplicator
    from kresilient.telemetry import Telemetry

__all__ = ["ParallelRunner"]

#: The longest the loop waits for a finished record while records run (then it polls, without
#: waiting); also its poll timeout while dead letters wait for their acknowledgement.
_BUSY_POLL: Final = 0.005
#: The least backlog a window keeps before its partition is paused (see ``max_backlog``).
#: librdkafka drops a paused partition's prefetched records and fetches them again on resume,
#: so the backlog must outlast that round trip: at 500, one partition with 64 x 10 ms handlers
#: in flight spent about two thirds of its time with an empty window (1,787 records/s), at
#: 5,000 it ran 4,926 records/s (benchmarks/keyed.py, one round each, 2026-11-29).
_MIN_BACKLOG: Final = 5_000
#: The least distance (offsets) a partition may go past its lowest unfinished record before it
#: is paused (see ``max_ahead``).
_MIN_AHEAD: Final = 10_000
#: Why a record given up on by the outage policy is dead-lettered (its ``message_failed`` line).
_LIMIT_REASON: Final = "the dependency outage limit (outage_retry) was reached"
#: Committed-offset lookups on assignment (the finished-offset lists).
_COMMITTED_TIMEOUT: Final = 10.0


class _NotStarted(BaseException):
    """The outcome of a record whose partition was revoked or lost before a worker started
    it: the handler was not called."""


_NOT_STARTED: Final = _NotStarted()

#: a record's window, partition, message, outcome (None: handled) and when its handler started
_Outcome = tuple[InflightWindow[Message], TP, Message, BaseException | None, float]


class ParallelRunner:
    """Runs handlers of many records per partition on a thread pool (see the module)."""

    def __init__(
        self,
        *,
        consumer: Any,
        call: Callable[[Any], object],
        ordering: Ordering,
        max_records: int,
        max_bytes: int,
        metadata: bool,
        retrying: tenacity.Retrying,
        policy: DeadLetterPolicy | None,
        breaker: CircuitBreaker | None,
        dedupe: Deduplicator | None,
        deser: Deserializing | None,
        tel: Telemetry,
        state: LoopState,
        offsets: OffsetKeeper,
        consume_error: Callable[[Message], None],
        group: str,
        log: Any,
        redact: Callable[[str], str],
        commit_interval: float,
        revoke_timeout: float,
        detector: OutageDetector | None = None,
        outage_retrying: tenacity.Retrying | None = None,
        guard: CrashGuard | None = None,
        retry_topics: RetryTopicPolicy | None = None,
        retry_map: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        self._consumer = consumer
        self._call = call
        self.ordering = ordering
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.metadata = metadata
        #: records polled beyond a full window before its partition is paused: a paused
        #: partition's fetch restarts from the broker when resumed, so resuming only once the
        #: backlog is empty would leave the window idle for that round trip at every cycle
        self.max_backlog = max(2 * max_records, _MIN_BACKLOG)
        #: and at most one window's bytes of them (large records: memory, not the count)
        self.max_backlog_bytes = max_bytes
        #: offsets a partition may go past its lowest unfinished record (one waiting for its
        #: retries while the other keys flow) before it is paused: bounds what a crash redoes
        #: when the finished list does not fit the metadata
        self.max_ahead = max(20 * max_records, _MIN_AHEAD)
        self._retrying = retrying
        self._policy = policy
        self._breaker = breaker
        self._dedupe = dedupe
        self._deser = deser
        self._tel = tel
        self._state = state
        self._offsets = offsets
        self._consume_error = consume_error
        self._group = group
        self._log = log
        self._redact = redact
        self._commit_interval = commit_interval
        self._revoke_timeout = revoke_timeout
        self.sink: DeadLetterSink | None = None
        self.windows: dict[TP, InflightWindow[Message]] = {}
        self._skips: dict[TP, Any] = {}  #: finished-offset lists read at assignment
        self._attempts: dict[tuple[TP, int], tenacity.RetryCallState] = {}
        #: writes a record's finish waits for (dead letters and moves to a retry topic)
        self._dead_letters: list[tuple[InflightWindow[Message], TP, int, Any]] = []
        #: the moves among them: id of the write's handle -> its retry topic
        self._moves: dict[int, str] = {}
        #: retry topics (``RetryTopicPolicy(ordered=False)``): a failure the policy takes is
        #: moved to its tier; ``retry_map``: retry topic -> (source topic, 0-based tier)
        self._retry_topics = retry_topics
        self._retry_map: dict[str, tuple[str, int]] = retry_map or {}
        self.moved = 0  #: records written to a retry topic (counted at the acknowledgement)
        self._paused: set[TP] = set()
        self._dirty: set[TP] = set()  #: partitions whose committable state changed
        self._uncommitted: set[TP] = set()  #: stored since the last explicit commit
        self._next_commit = time.monotonic() + commit_interval
        self._done: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
        #: records handed to the pool, by window and offset, until their outcome is dealt with
        self._futures: dict[tuple[InflightWindow[Message], int], Future[None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max_records, thread_name_prefix="kresilient")
        self.skipped = 0  #: records finished before a restart, skipped from the metadata
        self.fatal: BaseException | None = None
        self._detector = detector if outage_retrying is not None else None
        self._outage_retrying = outage_retrying
        #: the detector's mark at each failing record's first failure (see OutageDetector)
        self._marks: dict[tuple[TP, int], int] = {}
        #: per held record, its outage policy's state (its ``stop`` is the outage limit)
        self._outage_states: dict[tuple[TP, int], tenacity.RetryCallState] = {}
        #: records held by the outage in progress, oldest first (the next probe is the first)
        self._held: dict[tuple[TP, int], InflightWindow[Message]] = {}
        self._probe: tuple[TP, int] | None = None  #: the held record being tried again
        self._probe_wait: tenacity.RetryCallState | None = None  #: the probes' backoff
        #: a held probe failed: the next probe is ONE new record (a held record failing every
        #: probe, or two bad ones, cannot end the outage; as partition mode probes the next)
        self._probe_new = False
        self._new_probe: tuple[TP, int] | None = None  #: the new record probing, running
        #: records held by an outage that a record NOT held ended: they failed while others
        #: succeed, so their failures are no evidence of an outage any more (else two bad
        #: ones start one again at once, for ever); their RetryPolicy decides
        self._suspects: set[tuple[TP, int]] = set()
        #: crash-loop protection: a partition it probes runs one record at a time (its window
        #: is ``serial``), each record's marker committed before its handler call
        self._guard = guard
        #: the probed records started, until their outcome is dealt with
        self._probed: dict[tuple[InflightWindow[Message], int], Probe] = {}
        #: per probed partition, the marker of its record in flight (or waiting for its retry):
        #: the periodic commits carry it, so they never erase what a death must find
        self._markers: dict[TP, str] = {}
        self._last_probed: TP | None = None  #: the probed partition started last

    # ------------------------------------------------------------------ the loop

    def process(self, msgs: list[Message]) -> None:
        """Offer polled records to their windows and start what may start."""
        for msg in msgs:
            if msg.error() is not None:
                self._consume_error(msg)
                continue
            tp: TP = (msg.topic(), msg.partition())  # type: ignore[assignment]
            window = self.windows.get(tp)
            if window is None:
                window = self.windows[tp] = InflightWindow(
                    self.ordering,
                    max_records=self.max_records,
                    max_bytes=self.max_bytes,
                    max_backlog=self.max_backlog,
                    max_backlog_bytes=self.max_backlog_bytes,
                    max_ahead=self.max_ahead,
                    skip=self._skips.pop(tp, None),
                )
                guard = self._guard
                if guard is not None and guard.probes:
                    if guard.seeded(tp):  # never committed: a commit before its first record
                        self._offsets.commit_marker(tp, msg.offset(), PROBE_END)
                    else:
                        window.serial = tp in guard.probes
            offset: int = msg.offset()  # type: ignore[assignment]
            expected = window.offsets.next_offset
            if expected is not None and offset < expected:
                continue  # delivered again (a fetch restarted behind us): already offered
            key = msg.key()
            size = len(msg.value() or b"") + len(key or b"")
            headers: list[tuple[str, bytes | None]] | None = msg.headers()  # type: ignore[assignment]
            if headers:  # memory too: a record's headers may outweigh its value
                for name, value in headers:
                    size += len(name) + len(value or b"")
            self._dirty.add(tp)
            if not window.offer(offset, key if isinstance(key, bytes) else None, size, msg):
                self.skipped += 1
        self._start_ready()

    def service(self, timeout: float) -> float:
        """Deal with finished records, due retries and acknowledged dead letters; store and
        commit; pause and resume; return how long the next poll may wait."""
        if self.fatal is not None:
            raise self.fatal
        # while records run, wait for the next outcome HERE (woken at once by it), not in
        # consume(): a finished record frees its window's room without a poll timeout's delay
        busy = any(w.running for w in self.windows.values())
        self._drain(block=_BUSY_POLL if busy else 0.0)
        if self._dead_letters:
            self._check_dead_letters()
        self._start_ready()
        now = time.monotonic()
        if now >= self._next_commit:
            # stored and committed once per interval, not per outcome: the list is encoded
            # once a second instead of once per loop turn (a crash redoes what finished since)
            self._next_commit = now + self._commit_interval
            self._advance_idle()
            self._store()
            if self._uncommitted:
                self._commit(list(self._uncommitted), asynchronous=True)
        running = False
        due: float | None = None
        for window in self.windows.values():
            if window.running:
                running = True
            d = window.next_due()
            if d is not None and (due is None or d < due):
                due = d
        if running:
            return 0.0  # waited for outcomes above
        if self._dead_letters:
            return min(timeout, _BUSY_POLL)
        if due is not None:
            return max(0.0, min(timeout, due - now))
        return timeout

    def held_partitions(self) -> set[TP]:
        """The partitions a dependency outage keeps from moving (all of them: nothing new
        starts during one), and the retry-topic partitions whose records wait for their due
        time, for the stall report (neither is a stall)."""
        detector = self._detector
        if detector is not None and detector.active:
            return set(self.windows)
        retry_map = self._retry_map
        return {
            tp
            for tp, w in self.windows.items()
            if tp[0] in retry_map and not w.running and w.next_due() is not None
        }

    @property
    def pending_writes(self) -> int:
        """Dead-letter and retry-topic writes not acknowledged yet (``health()``)."""
        return len(self._dead_letters)

    @property
    def in_flight(self) -> int:
        """Records admitted and not finished, every partition."""
        return sum(w.admitted for w in self.windows.values())

    # ------------------------------------------------------------------ records

    def _start_ready(self) -> None:
        now = time.monotonic()
        detector = self._detector
        new = detector is None or not detector.active  # an outage starts nothing new
        if not new:
            if self._probe is None and self._held:
                # the probe left (dead-lettered as poison or at its outage limit, skipped as a
                # duplicate): the next held record is the probe
                self._next_probe(backoff=False)
            if not self._held and not any(w.running for w in self.windows.values()):
                # nothing held nor running (every held record dead-lettered at its limit, or
                # its partition revoked): only a new record can tell the outage ended
                new = True
        if self._probe_new and self._new_probe is None:
            self._start_new_probe()
        if self._guard is not None and self._probe_gate(now, new):
            for tp, window in self.windows.items():
                self._flow(tp, window)
            return
        for tp, window in self.windows.items():
            for msg in window.ready(now, new=new):
                self._submit(window, tp, msg)
            self._flow(tp, window)

    def _probe_gate(self, now: float, new: bool) -> bool:
        """Crash-loop probes run alone in the process, as in ``"partition"`` mode: a probed
        record starts only when no handler runs, and nothing starts while it runs, so the
        marker of a death names only the record that was in flight. True: start nothing
        else now (a probed record runs, or one waits for the running handlers to end)."""
        if self._probed:
            return True
        windows = self.windows
        waiting = [
            (tp, w) for tp, w in windows.items() if w.serial and w.serial_ready(now, new=new)
        ]
        if not waiting:
            return False
        if any(w.running for w in windows.values()):
            return True  # nothing new starts: the running handlers end, then the probe
        # the probed partitions take turns (else the first could starve the others)
        waiting.sort(key=lambda item: item[0] == self._last_probed)
        for tp, window in waiting:
            self._last_probed = tp
            for msg in window.ready(now, new=new):
                self._submit(window, tp, msg)
            if self._probed or any(w.running for w in windows.values()):
                return True  # started (or its dead letter is being written)
        return False

    def _start_new_probe(self) -> None:
        """During an outage, after a held probe failed: start ONE record that never ran (any
        partition); its success ends the outage, its failure holds it like the others."""
        if self._probed:
            return  # a crash-loop probe runs alone (see _probe_gate)
        busy = any(w.running for w in self.windows.values())
        for tp, window in self.windows.items():
            if window.serial and busy:
                continue  # a crash-loop probe runs alone (see _probe_gate)
            while (msg := window.ready_new()) is not None:
                offset: int = msg.offset()  # type: ignore[assignment]
                self._submit(window, tp, msg)
                if (window, offset) in self._futures:  # started (not deferred nor skipped)
                    self._probe_new = False
                    self._new_probe = (tp, offset)
                    return

    def _submit(self, window: InflightWindow[Message], tp: TP, msg: Message) -> None:
        if self._retry_map and tp[0] in self._retry_map and self._defer(window, msg):
            return
        if self._dedupe is not None and self._dedupe.is_duplicate(self._original(msg)):
            # checked at its turn, not when polled: in "key" mode the earlier records of its
            # key (a re-sent copy's original) finished and were recorded by now
            offset: int = msg.offset()  # type: ignore[assignment]
            self._state.duplicates += 1
            self._forget_record((tp, offset))  # a held record (an outage's probe) too
            window.finish(offset)
            self._dirty.add(tp)
            return
        offset = msg.offset()  # type: ignore[assignment]
        if window.serial and not self._probe_start(window, tp, msg, offset):
            return
        self._futures[(window, offset)] = self._pool.submit(self._run, window, tp, msg)

    def _defer(self, window: InflightWindow[Message], msg: Message) -> bool:
        """A retry-topic record not due yet waits in its window until its due time, like a
        retry's backoff (it keeps its place: in ``"key"`` mode it blocks only its key); True
        if deferred. Nothing sleeps and nothing is paused: polling goes on, and the window's
        limits pause the partition if too much waits behind it."""
        if not RetryView.is_retry(msg, self._retry_map):
            return False
        due_ms = RetryView(msg).due_ms()
        if due_ms is None:
            return False
        wait = due_ms / 1000.0 - time.time()
        if wait <= 0:
            return False
        window.retry(msg.offset(), time.monotonic() + wait)  # type: ignore[arg-type]
        return True

    def _original(self, msg: Message) -> Any:
        """``msg``, or for a record of this consumer's retry topics the original it stands
        for (dedupe keys on its topic and headers; a last tier dead-letters it)."""
        return RetryView(msg) if self._retry_map and msg.topic() in self._retry_map else msg

    # ------------------------------------------------------------------ crash-loop probes

    def _probe_start(
        self, window: InflightWindow[Message], tp: TP, msg: Message, offset: int
    ) -> bool:
        """Commit the marker naming ``msg`` (the only record of its partition in flight)
        before its handler call; ``False``: it killed the process ``max_process_deaths``
        times and is dead-lettered instead (its handler is not called)."""
        guard = self._guard
        probe = guard.probes.get(tp) if guard is not None else None
        if guard is None or probe is None:  # forgotten meanwhile: concurrent again
            window.serial = False
            return True
        try:
            marker = guard.begin(probe, msg)
        except CrashLoopError as exc:
            if guard.settle(probe):
                self._probe_ended(window, tp)
            self._give_up(window, tp, msg, exc, exc.classification, attempts=exc.deaths)
            return False
        self._markers[tp] = marker
        self._commit_marker(window, tp, marker)
        self._probed[(window, offset)] = probe
        return True

    def _probe_outcome(
        self, probe: Probe, window: InflightWindow[Message], tp: TP, error: BaseException | None
    ) -> None:
        """A probed record's handler returned or raised (before the outcome is dealt with)."""
        guard = self._guard
        assert guard is not None
        if error is None:
            self._markers.pop(tp, None)  # handled: no longer in flight
            if guard.settle(probe):
                self._probe_ended(window, tp)
            else:
                # committed past it at once: the next probed record (of any partition) may
                # kill the process, and its marker must be the only one naming a record
                self._commit_marker(window, tp, PROBE_END)
            return
        elif isinstance(error, Exception):
            waiting = guard.waiting(probe)
            if waiting is not None:
                # it waits for its next attempt (or its dead letter): not in flight
                self._markers[tp] = waiting[1]
                self._commit_marker(window, tp, waiting[1])
        if guard.settle(probe):
            self._probe_ended(window, tp)

    def _probe_ended(self, window: InflightWindow[Message], tp: TP) -> None:
        """The probe of ``tp`` is over: concurrent again; one commit closes it."""
        window.serial = False
        self._markers.pop(tp, None)
        self._commit_marker(window, tp, PROBE_END)

    def _commit_marker(self, window: InflightWindow[Message], tp: TP, marker: str) -> None:
        """Commit the window's committable offset synchronously with ``marker`` and the list
        of finished records (stored first: the commit never goes below what is stored)."""
        offset = window.committable()
        if offset is None:
            return
        meta = window.metadata(marker) if self.metadata else marker
        assert meta is not None
        self._offsets.store_metadata(tp, offset, meta)
        self._offsets.commit_marker(tp, offset, meta)
        self._uncommitted.discard(tp)

    def _run(self, window: InflightWindow[Message], tp: TP, msg: Message) -> None:
        """A worker thread: the handler, inside its process span when traced."""
        error: BaseException | None = None
        started = time.monotonic()
        if window.closed:  # revoked or lost while queued: its new owner handles it
            self._done.put((window, tp, msg, _NOT_STARTED, 0.0))
            return
        try:
            if self._state.traced:
                with self._tel.process_span(msg, group=self._group):
                    try:
                        self._call(msg)
                    except Exception as exc:
                        self._tel.set_error(exc, classify(exc))
                        raise
            else:
                self._call(msg)
        except BaseException as exc:
            error = exc
        self._done.put((window, tp, msg, error, started))

    def _drain(self, block: float) -> bool:
        """Deal with the outcomes queued; wait up to ``block`` s for the first."""
        done = self._done
        try:
            outcome = done.get(timeout=block) if block > 0 else done.get_nowait()
        except queue.Empty:
            return False
        successes = 0
        detector = self._detector
        while True:
            window, tp, msg, error, started = outcome
            self._futures.pop((window, msg.offset()), None)  # type: ignore[arg-type]
            if self._new_probe == (tp, msg.offset()):
                self._new_probe = None  # its outcome: a success ends the outage, else held
            probe = (
                self._probed.pop((window, msg.offset()), None)  # type: ignore[arg-type]
                if self._probed
                else None
            )
            if error is _NOT_STARTED:
                window.abandon(msg.offset())  # type: ignore[arg-type]
            elif self.windows.get(tp) is window:  # else revoked or lost meanwhile
                if error is None:
                    successes += 1
                    # evidence the dependency works, in the order the outcomes came, unless
                    # its handler started before the outage began (it may end after the
                    # outage's first failures)
                    if (
                        detector is not None
                        and not (detector.active and started < (detector.since or 0.0))
                        and detector.success()
                    ):
                        self._outage_ended(detector, (tp, msg.offset()) not in self._held)
                    self._finished(window, tp, msg)
                    if probe is not None:  # finished first: the probe's end commits past it
                        self._probe_outcome(probe, window, tp, error)
                else:
                    if probe is not None:  # its waiting marker before a retry or dead letter
                        self._probe_outcome(probe, window, tp, error)
                    self._failed(window, tp, msg, error)
            try:
                outcome = done.get_nowait()
            except queue.Empty:
                break
        if successes:
            self._state.processed += successes
            if self._breaker is not None:
                self._breaker.record_successes(successes)
        return True

    def _finished(self, window: InflightWindow[Message], tp: TP, msg: Message) -> None:
        offset: int = msg.offset()  # type: ignore[assignment]
        self._forget_record((tp, offset))
        window.finish(offset)
        self._dirty.add(tp)
        if self._dedupe is not None:
            self._dedupe.processed(self._original(msg))

    def _failed(
        self, window: InflightWindow[Message], tp: TP, msg: Message, exc: BaseException
    ) -> None:
        offset: int = msg.offset()  # type: ignore[assignment]
        if not isinstance(exc, Exception):
            # KeyboardInterrupt, SystemExit from a handler: stop; the record ran, it is not
            # running any more (close() does not wait for it) and stays uncommitted
            self._fatal(window, offset, exc)
            return
        retrying = self._retrying
        record = (tp, offset)
        state = self._attempts.get(record)
        if state is None:
            state = self._attempts[record] = tenacity.RetryCallState(retrying, None, (), {})
            if self._detector is not None:
                self._marks[record] = self._detector.mark()
        else:
            state.attempt_number += 1
        state.set_exception((type(exc), exc, exc.__traceback__))
        detector = self._detector
        # only the registry's own failures (its client, the deserialization step): the same
        # transport error from the handler's own HTTP dependency is judged by the evidence
        registry = outage_classification(exc) if detector is not None else None
        classification = registry if registry is not None else classify(exc)
        # a retriable failure the retry topics take is moved to its tier (not retried here)
        topics = self._retry_topics
        to_topic = topics is not None and registry is None and topics.retries(exc)
        if registry is not None and not is_outage(registry):
            pass  # the registry said 4xx (schema unknown): poison, at once
        elif registry is None and not to_topic and not retrying.retry(state):
            classification = poison(classification)  # no evidence of an outage either way
        else:
            if detector is not None:
                if self._probe == record:
                    self._probe = None
                    self._probe_new = detector.active  # the next probe: a new record
                # a record of our retry topics failed before and comes due when its tier
                # says, often with others: no new evidence (it starts no outage), held during
                # one like any record (as the one-at-a-time path does)
                if (
                    tp[0] not in self._retry_map
                    and record not in self._suspects
                    and detector.failure(
                        (tp[0], tp[1], offset),
                        error_type=type(exc).__name__,
                        error=self._error_text(exc),
                        classified=registry is not None,
                    )
                ):
                    log_outage_started(self._log, detector, tp, offset)
                if detector.active:
                    # held, its RetryPolicy not spent: after the outage it has it whole again;
                    # never moved to a retry topic during one (its next tier would fail the
                    # same way)
                    note_outage(self._log, detector, held_records=len(self._held) + 1)
                    state.attempt_number -= 1
                    if not self._hold(window, record, exc):
                        self._give_up(window, tp, msg, exc, classification, limit=True)
                    return
            if to_topic:
                self._move(window, tp, msg, exc, state.attempt_number)
                return
            delay = float(retrying.wait(state))
            state.upcoming_sleep = delay
            if not retrying.stop(state):
                state.idle_for += delay
                self._state.retries += 1
                window.retry(offset, time.monotonic() + delay)
                self._log.debug(
                    "message_retry_scheduled",
                    topic=tp[0],
                    partition=tp[1],
                    offset=offset,
                    attempt=state.attempt_number,
                    delay_s=round(delay, 3),
                )
                return
            if detector is not None:
                decision = detector.exhausted(self._marks.get(record, detector.mark()))
                if decision is OutageDecision.HOLD:
                    if self._hold(window, record, exc):
                        return
                    self._give_up(window, tp, msg, exc, classification, limit=True)
                    return
                if decision is OutageDecision.PROBE:
                    # nothing succeeded since its first failure: the records after it (other
                    # keys, in flight meanwhile) give the evidence; it waits for it
                    wait = self._outage_wait(record, exc)
                    if wait is not None:
                        window.retry(offset, time.monotonic() + wait)
                        self._probe_new = True  # one more record, past a full window
                        return
                    self._give_up(window, tp, msg, exc, classification, limit=True)
                    return
        self._give_up(window, tp, msg, exc, classification)

    def _error_text(self, exc: BaseException) -> str:
        return self._redact(str(exc) or type(exc).__name__)[:500]

    def _forget_record(self, record: tuple[TP, int]) -> None:
        self._attempts.pop(record, None)
        self._marks.pop(record, None)
        self._outage_states.pop(record, None)
        self._held.pop(record, None)
        self._suspects.discard(record)
        if self._probe == record:
            self._probe = None
        if self._new_probe == record:
            self._new_probe = None

    # ------------------------------------------------------------------ outages

    def _outage_wait(self, record: tuple[TP, int], exc: BaseException) -> float | None:
        """The outage policy's next wait for ``record``; None once its limit is reached."""
        retrying = self._outage_retrying
        assert retrying is not None
        state = self._outage_states.get(record)
        if state is None:
            state = self._outage_states[record] = tenacity.RetryCallState(retrying, None, (), {})
        else:
            state.attempt_number += 1
        return next_wait(retrying, state, exc)

    def _hold(
        self, window: InflightWindow[Message], record: tuple[TP, int], exc: Exception
    ) -> bool:
        """Hold ``record`` during the outage; False: its outage limit was reached."""
        if self._outage_wait(record, exc) is None:
            return False
        window.retry(record[1], math.inf)  # waits until it is the probe or the outage ends
        self._held.pop(record, None)
        self._held[record] = window  # the last to be tried again
        if self._probe is None:
            self._next_probe()
        return True

    def _next_probe(self, *, backoff: bool = True) -> None:
        """Try the first held record again after the outage policy's next wait (``backoff``:
        a probe failed, the wait grows; else the probed partition left, the same wait)."""
        retrying = self._outage_retrying
        assert retrying is not None
        state = self._probe_wait
        if state is None:
            state = self._probe_wait = tenacity.RetryCallState(retrying, None, (), {})
        elif backoff:
            state.attempt_number += 1
        for record, window in self._held.items():
            if self.windows.get(record[0]) is window and window.waiting(record[1]):
                self._probe = record
                window.reschedule(record[1], time.monotonic() + float(retrying.wait(state)))
                return

    def _outage_ended(self, detector: OutageDetector, by_new: bool = False) -> None:
        """The first success after an outage: every held record is retried at once, each with
        its RetryPolicy's whole budget again (``by_new``: a record not held ended it, the
        held ones are suspects, see ``_suspects``)."""
        now = time.monotonic()
        mark = detector.mark()
        for record, window in self._held.items():
            if by_new:
                self._suspects.add(record)
            self._attempts.pop(record, None)
            self._outage_states.pop(record, None)
            self._marks[record] = mark
            # the probe may be running: its own outcome comes
            if self.windows.get(record[0]) is window and window.waiting(record[1]):
                window.reschedule(record[1], now)
        self._held.clear()
        self._probe = None
        self._probe_wait = None
        self._probe_new = False
        log_outage_ended(self._log, detector)

    def _give_up(
        self,
        window: InflightWindow[Message],
        tp: TP,
        msg: Message,
        exc: Exception,
        classification: Any,
        *,
        limit: bool = False,
        attempts: int | None = None,
    ) -> None:
        """Dead-letter ``msg``; it is finished when the write is acknowledged (``attempts``:
        the attempts to report, else the RetryPolicy's count)."""
        offset: int = msg.offset()  # type: ignore[assignment]
        if attempts is None:
            state = self._attempts.get((tp, offset))
            attempts = state.attempt_number if state is not None else 1
        self._forget_record((tp, offset))
        self._log.warning(
            "message_failed",
            topic=tp[0],
            partition=tp[1],
            offset=offset,
            attempts=attempts,
            error_type=type(exc).__name__,
            error=self._error_text(exc),
            category=classification.category.value,
            **(
                {"reason": "the dependency outage limit (outage_retry) was reached"}
                if limit
                else {}
            ),
        )
        policy, sink = self._policy, self.sink
        if policy is None or sink is None:
            self._log.error(
                "message_failed_without_dead_letter_topic",
                topic=tp[0],
                partition=tp[1],
                offset=offset,
                note="the consumer stops; the offset is not committed",
            )
            self._fatal(window, offset, exc)
            return
        if self._breaker is not None:
            try:
                self._breaker.check()
            except Exception as opened:
                self._tel.circuit_breaker_opened(
                    topic=tp[0], partition=tp[1], offset=offset, **self._breaker.snapshot()
                )
                self._fatal(window, offset, opened)
                return
        try:
            handle = write_dead_letter(
                self._tel,
                self._deser,
                policy,
                sink,
                # a record of our retry topics: its ORIGINAL record, to the original's DLQ
                self._original(msg),
                exc,
                classification,
                attempts,
                group=self._group,
                redact=self._redact,
            )
        except Exception as refused:
            self._fatal(window, offset, refused)
            return
        if self._breaker is not None:
            self._breaker.record_dead_letter()
        self._dead_letters.append((window, tp, offset, handle))

    def _move(
        self,
        window: InflightWindow[Message],
        tp: TP,
        msg: Message,
        exc: Exception,
        attempts: int,
    ) -> None:
        """Write ``msg`` to its next retry tier (after the last: dead-letter the original);
        it is finished when the write is acknowledged, like a dead letter, so the gap-safe
        commit and the finished list cover it (a crash before the ack redoes the record: at
        most a duplicate in the retry topic)."""
        policy, sink = self._retry_topics, self.sink
        assert policy is not None
        offset: int = msg.offset()  # type: ignore[assignment]
        source, tier = next_tier(tp[0], self._retry_map)
        if tier >= len(policy.delays):
            self._give_up(window, tp, msg, exc, classify(exc), attempts=tier + 1)
            return
        if sink is None:  # cannot happen: the consumer makes the writer for retry topics
            self._fatal(window, offset, exc)
            return
        self._forget_record((tp, offset))
        raw = self._deser.raw_bytes(msg) if self._deser is not None else None
        try:
            record = retry_record(
                msg,
                policy,
                source=source,
                tier=tier,
                exc=exc,
                retry_topics=self._retry_map,
                raw=raw,
            )
            handle = sink.send(record)
        except Exception as refused:
            self._fatal(window, offset, refused)
            return
        self._dead_letters.append((window, tp, offset, handle))
        self._moves[id(handle)] = record.topic
        self._log.info(
            "message_moved_to_retry_topic",
            topic=tp[0],
            partition=tp[1],
            offset=offset,
            retry_topic=record.topic,
            delay_s=policy.delays[tier],
            attempts=attempts,
            error_type=type(exc).__name__,
        )

    def _fatal(self, window: InflightWindow[Message], offset: int, exc: BaseException) -> None:
        """Stop the consumer at its next turn; the record stays unfinished, not running."""
        window.abandon(offset)
        if self.fatal is None:
            self.fatal = exc

    def _check_dead_letters(self) -> None:
        if self.sink is not None:
            self.sink.poll(0)
        waiting = []
        pending = self._dead_letters
        for i, (window, tp, offset, handle) in enumerate(pending):
            if not handle.done():
                waiting.append((window, tp, offset, handle))
                continue
            moved = self._moves.pop(id(handle), None) if self._moves else None
            error = handle.exception(0)
            if error is not None:
                # raised once: later calls (a revoke, the close) go on with the others not
                # dealt with yet (those finished in this pass are not finished again)
                self._dead_letters = waiting + pending[i + 1 :]
                # unfinished (the commit stays below it) and no longer running: the close
                # does not wait its whole timeout for it
                window.abandon(offset)
                what = "retry-topic" if moved is not None else "dead-letter"
                raise DeadLetterError(
                    f"{what} write for {tp[0]}[{tp[1]}]@{offset} failed: "
                    f"{self._redact(str(error))}; the source offset is not committed",
                    topic=moved
                    if moved is not None
                    else self._policy.topic_for(self._original_topic(tp[0]))
                    if self._policy is not None
                    else None,
                    classification=error.classification,
                ) from error
            if self.windows.get(tp) is window:
                window.finish(offset)
                self._dirty.add(tp)
            if moved is None:
                self._offsets.dead_lettered += 1
            else:
                self.moved += 1
        self._dead_letters = waiting

    def _original_topic(self, topic: str) -> str:
        """The source topic of a retry topic (``topic`` itself for any other)."""
        retried = self._retry_map.get(topic)
        return retried[0] if retried is not None else topic

    # ------------------------------------------------------------------ offsets

    def _flow(self, tp: TP, window: InflightWindow[Message]) -> None:
        """Pause a partition whose window is full, resume it once it has room."""
        if window.blocked:
            if tp not in self._paused:
                self._pause_resume(tp, pause=True)
        elif tp in self._paused:
            self._pause_resume(tp, pause=False)

    def _pause_resume(self, tp: TP, *, pause: bool) -> None:
        part = [TopicPartition(tp[0], tp[1])]
        try:
            if pause:
                self._consumer.pause(part)
                self._paused.add(tp)
            else:
                self._consumer.resume(part)
                self._paused.discard(tp)
        except KafkaException as exc:  # revoked meanwhile: its new owner fetches it
            self._log.debug("pause_resume_failed", topic=tp[0], partition=tp[1], error=str(exc))

    def _meta(self, tp: TP, window: InflightWindow[Message], clean: bool = False) -> str | None:
        """The metadata of a commit of ``tp``: the finished list (``metadata``), in the
        crash-loop marker when protection is on: the clean-end one on revoke and close
        (``clean``), else the marker of a probed record in flight or waiting (none: a death
        now leaves the partition unclean, so its next owner probes it)."""
        if self._guard is None:
            marker = None
        elif clean:
            marker = CLEAN
        else:
            marker = self._markers.get(tp)
        return window.metadata(marker) if self.metadata else marker

    def _advance_idle(self) -> None:
        """Idle windows move to the consumer's position: past a transaction's commit or abort
        marker (and aborted records) at a partition's end, which no record arrives for, so the
        committed offset reaches the end (lag 0) instead of stopping below the marker."""
        idle = [tp for tp, w in self.windows.items() if w.idle]
        ahead = positions_ahead(self._consumer, idle, {}, self._log, self._redact)
        for tp, position in ahead.items():
            window = self.windows.get(tp)
            if window is not None and window.advance(position):
                self._dirty.add(tp)

    def _store(self, clean: frozenset[TP] | set[TP] = frozenset()) -> None:
        for tp in self._dirty:
            window = self.windows.get(tp)
            if window is None:
                continue
            offset = window.committable()
            if offset is None:
                continue
            self._offsets.store_metadata(tp, offset, self._meta(tp, window, tp in clean))
            self._uncommitted.add(tp)
        self._dirty.clear()

    def _commit(self, tps: list[TP], *, asynchronous: bool, clean: bool = False) -> None:
        parts = []
        for tp in tps:
            window = self.windows.get(tp)
            offset = window.committable() if window is not None else None
            if window is None or offset is None:
                continue
            meta = self._meta(tp, window, clean)
            parts.append(
                TopicPartition(tp[0], tp[1], offset)
                if meta is None
                else TopicPartition(tp[0], tp[1], offset, metadata=meta)
            )
        self._uncommitted.difference_update(tps)
        if not parts:
            return
        try:
            self._consumer.commit(offsets=parts, asynchronous=asynchronous)
        except KafkaException as exc:
            self._offsets.commit_failed(exc, "in_flight")

    # ------------------------------------------------------------------ rebalance, close

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        """Read the finished-offset lists of the committed offsets being taken over."""
        if self.metadata and partitions:
            self._skips.update(
                finished_taken_over(self._consumer, partitions, self._log, self._redact)
            )

    def revoke(self, tps: set[TP], timeout: float | None = None) -> None:
        """Wait (bounded) for the running records of ``tps``, store what is safe, forget them."""
        deadline = time.monotonic() + (self._revoke_timeout if timeout is None else timeout)
        windows = [(tp, w) for tp, w in self.windows.items() if tp in tps]
        for _, w in windows:
            w.closed = True  # records queued in the shared pool and not started: not run
        self._cancel_closed()
        try:
            self._settle(tps, windows, deadline)
        finally:
            self._dirty.update(tp for tp, _ in windows)
            try:
                # the clean-end marker (crash-loop protection): the process did not die
                self._store(clean={tp for tp, _ in windows})
                self._commit([tp for tp, _ in windows], asynchronous=False, clean=True)
            finally:
                self._forget([tp for tp, _ in windows])
                for tp in tps:  # read at assignment, never fetched: not for a later one
                    self._skips.pop(tp, None)

    def _settle(
        self, tps: set[TP], windows: list[tuple[TP, InflightWindow[Message]]], deadline: float
    ) -> None:
        while time.monotonic() < deadline and (
            any(w.running for _, w in windows) or any(d[1] in tps for d in self._dead_letters)
        ):
            self._drain(block=0.05)
            if self._dead_letters:
                self._check_dead_letters()
        if self._dead_letters:
            self._check_dead_letters()
        left = sum(w.running for _, w in windows)
        if left:
            self._log.warning(
                "in_flight_abandoned",
                records=left,
                partitions=sorted(f"{tp[0]}[{tp[1]}]" for tp, w in windows if w.running),
                note="still running after the revoke timeout: their new owner handles them again",
            )

    def lost(self, tps: set[TP]) -> None:
        """Lost partitions: nothing is stored, their new owner starts from the last commit."""
        self._forget([tp for tp in self.windows if tp in tps])
        for tp in tps:
            self._skips.pop(tp, None)

    def _cancel_closed(self) -> None:
        """Take the records of closed windows out of the pool's queue (not started)."""
        for (window, offset), future in list(self._futures.items()):
            if window.closed and future.cancel():
                window.abandon(offset)
                del self._futures[(window, offset)]

    def _forget(self, tps: list[TP]) -> None:
        for tp in tps:
            window = self.windows.pop(tp, None)
            if window is not None:
                window.clear()  # closed: its records queued in the pool do not start
            self._skips.pop(tp, None)
            self._paused.discard(tp)
            self._dirty.discard(tp)
            self._uncommitted.discard(tp)
            self._markers.pop(tp, None)
        if self._probed:
            self._probed = {k: v for k, v in self._probed.items() if v.tp not in tps}
        self._attempts = {k: v for k, v in self._attempts.items() if k[0] not in tps}
        self._marks = {k: v for k, v in self._marks.items() if k[0] not in tps}
        self._outage_states = {k: v for k, v in self._outage_states.items() if k[0] not in tps}
        self._held = {k: v for k, v in self._held.items() if k[0] not in tps}
        self._suspects = {k for k in self._suspects if k[0] not in tps}
        if self._new_probe is not None and self._new_probe[0] in tps:
            self._new_probe = None
        if self._probe is not None and self._probe[0] in tps:
            self._probe = None
            if self._held and self._probe_wait is not None:
                self._next_probe(backoff=False)
        self._dead_letters = [d for d in self._dead_letters if d[1] not in tps]
        if self._moves:
            self._moves = {
                id(d[3]): self._moves[id(d[3])]
                for d in self._dead_letters
                if id(d[3]) in self._moves
            }
        self._cancel_closed()

    def close(self, timeout: float) -> None:
        """The shutdown: wait for every running record, store and commit what is safe."""
        try:
            self.revoke(set(self.windows), timeout)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)


def finished_taken_over(
    consumer: Any,
    partitions: list[TopicPartition],
    log: Any,
    redact: Callable[[str], str],
) -> dict[TP, Finished]:
    """The finished offsets the committed offsets' metadata lists for ``partitions`` (taken
    over in an assignment), each logged once; none when the committed offsets cannot be read
    (the records are redone: at-least-once). Shared by the sync runner and the asyncio one."""
    asked = [TopicPartition(p.topic, p.partition) for p in partitions]
    try:
        committed = consumer.committed(asked, timeout=_COMMITTED_TIMEOUT)
    except KafkaException as exc:
        log.warning("committed_unknown", error=redact(str(exc)))
        return {}
    skips: dict[TP, Finished] = {}
    for part in committed:
        skip = finished_from(part.metadata, part.offset)
        if skip is not None:
            skips[(part.topic, part.partition)] = skip
            log.info(
                "finished_records_skipped",
                topic=part.topic,
                partition=part.partition,
                committed=part.offset,
                finished=len(skip),
                note="finished before the previous owner stopped: not handled again",
            )
    return skips
