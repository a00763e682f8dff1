"""Crash-loop protection of :class:`~kresilient.ResilientConsumer` (issue 17, item 2).

A record that kills the process (OOM kill, a segfault in a C extension, ``os._exit`` in a
library) never fails in Python: without a persisted count it gets a fresh retry budget after
every restart and stalls its partition forever. The count is kept where the partition's
progress already is: the committed offset's metadata.

* A clean end (revoke, close) commits the stored offsets with the ``clean`` marker.
* The partitions of an assignment never committed (a new group) are *seeded*: ONE synchronous
  commit for all of them, without the clean marker, made in the assignment callback, before
  librdkafka fetches any of them (it starts them after the callback returns, from the
  committed offsets it then reads). Each is committed at the offset it starts from without a
  commit (``auto.offset.reset``'s earliest or latest offset, asked in one request), so the
  seed moves no start; a death from then on leaves them committed without the clean marker,
  and the next start probes them. Where that cannot be done (another reset policy, the
  offsets or the commit failed) a partition gets one commit of its first record's offset
  before that record is handled (the seed in :meth:`CrashGuard.wrap`).
* A partition assigned without the clean marker (the previous owner died or was cut off) is
  *probed*: for its next ``window`` records, before each handler call the
  record's offset, its deaths so far and the time of its first attempt are committed
  synchronously (the committed OFFSET is still only what was processed or durably
  dead-lettered; the metadata names the record in flight). When the probe ends, one commit
  without the record marker closes it.
* At the next assignment, a marker naming record ``x`` means the process died while ``x`` was
  in flight: one more death. Once ``max_deaths`` are counted, ``x`` is dead-lettered
  (``kresilient.error.category=crash_loop``) without calling the handler, and the partition
  continues.

Attribution: the death that made a partition suspect (unclean end, no record marker yet) is
attributed to the first record that dies while probed, so a record that kills the process on
every start is dead-lettered after exactly ``max_deaths`` deaths. A process killed for another
reason while a record was in flight (SIGKILL by an orchestrator) counts as a death of that
record too; the default of 3 absorbs one or two such coincidences.

A record whose handler FAILED (raised) is not in flight while it waits for its next attempt
(a retry hold of minutes, a dead-letter or retry-topic write): the guard commits a *waiting*
marker at once (its deaths so far, ``"w":1``), so a kill during the wait (a deploy, an
eviction) is not counted as a death of that record (issue 35), and the unclean end is not
attributed to the next record either: nothing of this partition was in flight.

Many records of a partition in flight (``ordering="key"``/``"none"``, issue 40): the runner
(:mod:`._parallel`) runs a probed partition's records one at a time, in offset order, as
here, and goes back to concurrency when the probe ends; it commits the steps' markers
(:meth:`CrashGuard.begin`, :meth:`CrashGuard.waiting`, :data:`PROBE_END`) itself, beside the
list of finished records, and the clean-end marker on revoke and close. An unprobed
partition costs nothing more than in ``"partition"`` mode.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaException,
    TopicPartition,
)

from kresilient.consumer._holds import TP
from kresilient.errors import Classification, CrashLoopError, classify

if TYPE_CHECKING:
    from confluent_kafka import Message

    from kresilient.consumer._offsets import OffsetKeeper

__all__ = [
    "CLEAN",
    "CRASH_LOOP",
    "PROBE_END",
    "CrashGuard",
    "Probe",
    "is_crash_loop",
    "parse_marker",
]

#: Prefix of every kresilient offset-metadata marker (other committers' metadata is ignored).
PREFIX: Final = "kresilient.v1 "
#: The marker of a clean end (revoke, close).
CLEAN: Final = PREFIX + '{"clean":1}'
#: The marker that closes a probe (the records after it were not probed).
PROBE_END: Final = PREFIX + "{}"
#: Committed-offset lookups on assignment.
_COMMITTED_TIMEOUT: Final = 10.0
#: Where librdkafka starts a never-committed partition, per ``auto.offset.reset`` (the logical
#: offset ``offsets_for_times`` resolves); a policy not listed (``error``) is seeded per record.
_RESET_OFFSETS: Final = {
    "smallest": OFFSET_BEGINNING,
    "earliest": OFFSET_BEGINNING,
    "beginning": OFFSET_BEGINNING,
    "largest": OFFSET_END,
    "latest": OFFSET_END,
    "end": OFFSET_END,
}
#: Up to this many probed partitions, each batch asks librdkafka which of them it holds
#: records of (one position() call); beyond it the guard checks every record (cheaper then).
_POSITION_CHECK_MAX: Final = 64

#: The classification of a record dead-lettered for killing the process (one definition:
#: :class:`~kresilient.errors.CrashLoopError`, category ``ErrorCategory.CRASH_LOOP``).
CRASH_LOOP: Final[Classification] = classify(CrashLoopError(deaths=0, max_deaths=0))


def is_crash_loop(exc: BaseException) -> bool:
    """Whether ``exc`` is the stand-in failure of a crash-loop record."""
    return isinstance(exc, CrashLoopError)


@dataclasses.dataclass(frozen=True, slots=True)
class Marker:
    """What the committed metadata says about a partition."""

    clean: bool = False
    offset: int | None = None  #: the record in flight when the marker was committed
    deaths: int = 0  #: deaths of that record counted before that attempt
    first_ms: int | None = None  #: wall-clock ms of its first attempt
    waiting: bool = False  #: the record failed and waits for its next attempt: not in flight


def parse_marker(metadata: str | None) -> Marker | None:
    """The kresilient marker in committed-offset metadata (``None``: none, or not ours)."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    try:
        data = json.loads(metadata[len(PREFIX) :])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    if data.get("clean"):
        return Marker(clean=True)
    x, d, t = data.get("x"), data.get("d", 0), data.get("t")
    if not isinstance(x, int) or not isinstance(d, int):
        return Marker()
    return Marker(
        offset=x,
        deaths=d,
        first_ms=t if isinstance(t, int) else None,
        waiting=data.get("w") == 1,
    )


def _fields(metadata: str | None) -> dict[str, Any] | None:
    """The JSON fields of kresilient's ``metadata``; ``None``: not ours, or unreadable."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    try:
        data = json.loads(metadata[len(PREFIX) :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _without_clean(metadata: str | None) -> str:
    """``metadata`` (kresilient's, with the clean flag) less that flag, its other fields
    kept (the finished list of ``ordering="key"``); :data:`PROBE_END` if unreadable."""
    data = _fields(metadata)
    if data is None:
        return PROBE_END
    data.pop("clean", None)
    return PREFIX + json.dumps(data, separators=(",", ":"))


def _as_clean(metadata: str | None) -> str:
    """The clean-end marker for a partition committed with ``metadata`` whose records this
    member never handled: ``metadata``'s fields other than a record marker (the finished
    list of ``ordering="key"``) kept beside the clean flag."""
    data = _fields(metadata)
    if data is None:
        return CLEAN
    kept = {k: v for k, v in data.items() if k not in ("x", "d", "t", "w", "clean")}
    return PREFIX + json.dumps({"clean": 1, **kept}, separators=(",", ":"))


def _marker(offset: int, deaths: int, first_ms: int, *, waiting: bool = False) -> str:
    data: dict[str, int] = {"x": offset, "d": deaths, "t": first_ms}
    if waiting:
        data["w"] = 1
    return PREFIX + json.dumps(data, separators=(",", ":"))


@dataclasses.dataclass(slots=True, kw_only=True)
class Probe:
    """A partition whose next records are handled with a persisted in-flight marker."""

    tp: TP
    remaining: int  #: records still to probe
    base: int  #: deaths attributed to the first record that dies (see the module docstring)
    suspect: int | None = None  #: the record that was in flight at the last death
    deaths: int = 0  #: the suspect's deaths, this one included
    first_ms: int | None = None
    #: never committed, and not seeded on assignment: commit the first record's offset, then stop
    seed: bool = False
    position: int = OFFSET_INVALID  #: the consumer's position at the last batch check
    #: (offset, deaths of its own, first attempt ms) of the record whose marker is committed
    inflight: tuple[int, int, int] | None = None


class CrashGuard:
    """Probes partitions after an unclean end and dead-letters crash-loop records.

    ``probes`` is read on the hot path (empty in steady state); ``wrap`` wraps the handler,
    needed only for a batch holding records of a probed partition (:meth:`in_batch`).
    """

    def __init__(
        self,
        consumer: Any,
        offsets: OffsetKeeper,
        *,
        max_deaths: int,
        window: int,
        log: Any,
        redact: Callable[[str], str],
        offset_reset: str = "latest",
    ) -> None:
        self._consumer = consumer
        self._offsets = offsets
        #: the start of a never-committed partition (``None``: seeded per record)
        self._reset_to: int | None = _RESET_OFFSETS.get(str(offset_reset).lower())
        self.max_deaths = max_deaths
        self.window = window
        self._log = log
        self._redact = redact
        self.probes: dict[TP, Probe] = {}
        self.crash_loops = 0
        #: each assigned partition's committed offset and metadata as read at its assignment:
        #: one this member never commits (no record came) is committed back clean at a clean
        #: end (:meth:`clean_end`)
        self.assigned_at: dict[TP, TopicPartition] = {}

    # ------------------------------------------------------------------ assignment

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        """Read the committed markers of newly assigned partitions; probe the unclean ones."""
        if not partitions:
            return
        asked = [TopicPartition(p.topic, p.partition) for p in partitions]
        try:
            committed = self._consumer.committed(asked, timeout=_COMMITTED_TIMEOUT)
        except KafkaException as exc:
            # cannot tell how the previous owner ended: probe (costs a commit per record)
            self._log.warning("crash_marker_unknown", error=self._redact(str(exc)), note="probing")
            committed = [TopicPartition(p.topic, p.partition, 0) for p in asked]
        seeds: list[TP] = []
        cleaned: list[TopicPartition] = []
        for part in committed:
            tp = (part.topic, part.partition)
            if part.offset >= 0 and part.error is None:
                self.assigned_at[tp] = part
            marker = parse_marker(part.metadata)
            if marker is not None and marker.clean:
                self.probes.pop(tp, None)
                if part.offset >= 0:
                    cleaned.append(part)
                continue
            if part.offset < 0 and marker is None:
                # never committed (a new group): no probe, a commit without the clean marker,
                # so a death before the first regular commit makes the next start probe (a
                # per-record probe here would cost every new group a synchronous commit per
                # record); seeded below, all at once, or else at its first record
                self.probes[tp] = Probe(tp=tp, remaining=0, base=0, seed=True)
                seeds.append(tp)
                continue
            probe = Probe(tp=tp, remaining=self.window, base=1)
            if (
                marker is not None
                and marker.offset is not None
                and marker.waiting
                and marker.offset >= part.offset
            ):
                # the process ended while the record waited for its next attempt: nothing of
                # this partition was in flight, no death to count or to attribute
                probe.base = 0
                probe.suspect = marker.offset
                probe.deaths = marker.deaths
                probe.first_ms = marker.first_ms
            elif marker is not None and marker.offset is not None and marker.offset >= part.offset:
                probe.base = 0
                probe.suspect = marker.offset
                probe.deaths = marker.deaths + 1
                probe.first_ms = marker.first_ms
                self._log.warning(
                    "process_died_handling_record",
                    topic=tp[0],
                    partition=tp[1],
                    offset=marker.offset,
                    deaths=probe.deaths,
                    max_process_deaths=self.max_deaths,
                )
            self.probes[tp] = probe
        if seeds and self._reset_to is not None:
            self._seed(seeds, self._reset_to)
        if cleaned:
            self._unclean(cleaned)

    def _unclean(self, parts: list[TopicPartition]) -> None:
        """The partitions the previous owner ended cleanly start unprobed (nothing per
        record), but their clean marker must not outlive this start: a record killing the
        process before their next commit would leave it in place, and every restart would
        run unprobed into the same record for ever (review 11, #10: the "deploy, then the
        new version dies" case). One synchronous commit of all of them, here in the
        assignment callback, at the committed offset just read with its metadata less the
        clean flag (the finished list of ``ordering="key"`` kept): a death from now on
        leaves them unclean, and the next start probes them. The offsets do not move.
        A failure is logged; the partitions then keep the hole until their next commit."""
        self._commit_all(
            [
                TopicPartition(p.topic, p.partition, p.offset, metadata=_without_clean(p.metadata))
                for p in parts
            ]
        )

    def _commit_all(self, parts: list[TopicPartition]) -> None:
        """One synchronous commit of ``parts`` (offsets and metadata as given); a failure is
        logged (``crash_marker_commit_failed``), never raised."""
        try:
            result = self._consumer.commit(offsets=parts, asynchronous=False)
        except (KafkaException, RuntimeError) as exc:
            self._log.warning(
                "crash_marker_commit_failed", error=self._redact(str(exc)), partitions=len(parts)
            )
            return
        failed = [p for p in result or [] if p.error is not None]
        if failed:
            self._log.warning(
                "crash_marker_commit_failed",
                error=self._redact(str(failed[0].error)),
                partitions=len(failed),
            )

    def _seed(self, tps: list[TP], reset_to: int) -> None:
        """One synchronous commit of every never-committed partition of this assignment, at
        the offset librdkafka would start it from (we are in the assignment callback: it
        starts them after we return, from these commits). What fails stays seeded per record."""
        asked = [TopicPartition(t, p, reset_to) for t, p in tps]
        try:
            found = self._consumer.offsets_for_times(asked, timeout=_COMMITTED_TIMEOUT)
        except KafkaException as exc:
            self._log.warning(
                "crash_seed_offsets_unknown",
                error=self._redact(str(exc)),
                partitions=len(tps),
                note="each partition is seeded at its first record instead",
            )
            return
        starts = {
            (p.topic, p.partition): p.offset for p in found if p.error is None and p.offset >= 0
        }
        for tp in self._offsets.commit_markers(starts, PROBE_END):
            del self.probes[tp]

    def in_batch(self) -> bool:
        """Whether the batch just consumed may hold records of a probed partition.

        A probed or seeded partition that gets no records (an empty partition of a new group,
        a drained one after an unclean end) would otherwise route every record of every other
        partition through the guard for as long as the consumer lives (~0.1 us a record). The
        consumer's position of a partition moves whenever a batch holds its records (and on a
        seek): a partition whose position did not move since the last check has none.
        """
        probes = self.probes
        if not probes:
            return False
        if len(probes) > _POSITION_CHECK_MAX:
            return True
        try:
            positions = self._consumer.position([TopicPartition(t, p) for t, p in probes])
        except KafkaException:
            return True
        moved = False
        for part in positions:
            probe = probes.get((part.topic, part.partition))
            if probe is not None and part.offset != probe.position:
                probe.position = part.offset
                moved = True
        return moved

    def probing(self, tp: TP) -> bool:
        """``tp`` is probed after an unclean end (a seeded partition is not)."""
        probe = self.probes.get(tp)
        return probe is not None and not probe.seed

    def forget(self, tps: list[TP]) -> None:
        """Revoked or lost partitions are no longer probed here."""
        for tp in tps:
            self.probes.pop(tp, None)
            self.assigned_at.pop(tp, None)

    def clean_end(self, tps: Iterable[TP], committed_here: Callable[[TP], bool]) -> None:
        """A clean end (revoke, close) of ``tps``: those this member never committed
        (``committed_here`` false: no record came, nothing stored) are committed back at the
        offset read at their assignment with the clean-end marker (a keyed finished list
        kept), in one synchronous commit. Else they would keep what the assignment left (its
        metadata without the clean flag, :meth:`_unclean`) or what a dead previous owner left,
        and the next start would probe them although this member ended cleanly (review 12,
        D2). No record of theirs came, so none was in flight: the clean marker is true."""
        parts = []
        for tp in tps:
            read = self.assigned_at.pop(tp, None)
            if read is not None and not committed_here(tp):
                meta = _as_clean(read.metadata)
                parts.append(TopicPartition(tp[0], tp[1], read.offset, metadata=meta))
        if parts:
            self._commit_all(parts)

    # ------------------------------------------------------------------ per record

    def wrap(self, call: Callable[[Any], object]) -> Callable[[Any], object]:
        """``call`` with the probe around it (use only while ``probes`` is not empty)."""

        def guarded(msg: Message) -> object:
            tp = (msg.topic(), msg.partition())
            probe = self.probes.get(tp)  # type: ignore[arg-type]
            if probe is None:
                return call(msg)
            if probe.seed:
                del self.probes[probe.tp]
                self._offsets.commit_marker(probe.tp, msg.offset(), PROBE_END)
                return call(msg)
            try:
                offset: int = msg.offset()  # type: ignore[assignment]
                self._offsets.commit_marker(probe.tp, offset, self.begin(probe, msg))
                try:
                    result = call(msg)
                except Exception:
                    waiting = self.waiting(probe)
                    if waiting is not None:
                        self._offsets.commit_marker(probe.tp, waiting[0], waiting[1])
                    raise
                # stored at once: the next record's marker commit carries exact progress
                self._offsets.store(probe.tp, offset + 1, msg.leader_epoch())
                return result
            finally:
                if self.settle(probe):
                    self._offsets.commit_marker(probe.tp, None, PROBE_END)

        return guarded

    # The steps of a probed record, without client calls: :meth:`wrap` (one record at a time
    # on the loop thread) and the in-flight runner (``ordering="key"``/``"none"``: a probed
    # partition runs one record at a time, and the runner commits each marker with its list
    # of finished records) commit what they return.

    def begin(self, probe: Probe, msg: Message) -> str:
        """The marker to commit before ``msg``'s handler call (it names ``msg`` as in flight).

        Raises :class:`~kresilient.errors.CrashLoopError` for a record that killed the process
        ``max_deaths`` times: dead-letter it without calling the handler."""
        offset = msg.offset()
        assert offset is not None
        now_ms = int(time.time() * 1000)
        if probe.suspect is not None and offset > probe.suspect:
            probe.suspect = None  # the suspect was handled (or dead-lettered) without a death
        if probe.suspect is not None and offset == probe.suspect:
            deaths, first = probe.deaths, probe.first_ms or now_ms
            if deaths >= self.max_deaths:
                probe.suspect = None
                self.crash_loops += 1
                raise CrashLoopError(
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=offset,
                    deaths=deaths,
                    max_deaths=self.max_deaths,
                )
            own = deaths
        elif probe.suspect is not None and offset < probe.suspect:
            deaths, first = 0, now_ms  # handled again before the suspect (pending dead letters)
            own = 0
        else:
            # the unclean end is attributed to this record only if it dies too (base)
            deaths, first, own = probe.base, now_ms, 0
        probe.inflight = (offset, own, first)
        return _marker(offset, deaths, first)

    def waiting(self, probe: Probe) -> tuple[int, str] | None:
        """The handler raised: the process survived the record, which now waits (a retry hold,
        a dead-letter or retry-topic write) and is no longer in flight. Its marker (returned
        with its offset) says so, keeping only the deaths it really caused: a kill during the
        wait is not its death."""
        inflight, probe.inflight = probe.inflight, None
        if inflight is None:
            return None
        offset, deaths, first = inflight
        return offset, _marker(offset, deaths, first, waiting=True)

    def settle(self, probe: Probe) -> bool:
        """A probed record's call ended (or it was dead-lettered as a crash loop): count it.
        ``True``: the probe is over (forgotten here); commit :data:`PROBE_END` to close it."""
        if probe.suspect is not None:
            return False
        probe.remaining -= 1
        if probe.remaining <= 0 and self.probes.get(probe.tp) is probe:
            del self.probes[probe.tp]
            return True
        return False

    def seeded(self, tp: TP) -> bool:
        """``tp`` is seeded at its first record (see the module): forget it. ``True``: commit
        the first record's offset with :data:`PROBE_END` before its handler call."""
        probe = self.probes.get(tp)
        if probe is None or not probe.seed:
            return False
        del self.probes[tp]
        return True
