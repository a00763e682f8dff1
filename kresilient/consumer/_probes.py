"""Liveness/readiness probes and per-partition lag metrics (issue 17, item 5).

``ResilientConsumer(..., health_port=8080)`` and ``AsyncResilientConsumer(...,
health_port=8080)`` serve, over plain HTTP (one implementation, :class:`ConsumerProbes`; each
consumer tells it its state through a :class:`ProbeSource`):

* ``GET /live``: 200 while the consume loop polled within ``max.poll.interval.ms`` (a retry
  hold keeps polling, so it stays live); 503 once the loop stopped polling (a hanging handler,
  a deadlock) or the consumer stopped;
* ``GET /ready``: 200 once the consumer joined its group and no partition is stalled; 503
  with the stalled partitions named when a batch has been in a handler for longer than
  ``stall_after_s``, a retry hold is overdue by that long, or a partition with lag made no
  progress for that long (racecar #309: a consumer-wide check misses one stuck partition);
  503 too when the member LOST its partitions (session timed out: the group coordinator
  unreachable ...) and has not been given an assignment again for that long (issue 35): its
  lost partitions have no lag figures any more, so nothing else would say it does no work.

The same stalls are said without anyone polling (issue 42): a watcher thread (started by the
first :meth:`ConsumerProbes.tick`, stopped by :meth:`ConsumerProbes.close`) checks them once a
second and logs one ``consumer_stalled`` WARNING when a stall begins (the partitions, why, since
when), nothing while it lasts, one ``consumer_stalled_cleared`` INFO when it ends; and one
``consumer_rebalance_loop`` WARNING for a member that holds no partition for ``stall_after_s``
while its rebalances repeat (librdkafka #3866). ``health()`` is not healthy meanwhile. A
thread, not the loop's own tick: the sync consumer runs its handler on the loop thread, so a
handler that never returns would stop the tick that should report it. A dependency outage is
not a stall (it has its own WARNING; its held partitions are expected not to move).

The body is JSON (``status``, ``reasons``, per-partition ``lag`` and ``since_progress_s``).
The thread that calls librdkafka (the sync consume loop; the asyncio consumer's worker thread)
updates the per-partition figures once a second (cheap: cached watermarks, no request); the
server thread only reads them.

Metrics (observable gauges, with ``messaging.destination.partition.id``):
``messaging.kafka.consumer.lag`` (``{message}``: high watermark minus the stored offset) and
``kresilient.consumer.time_since_progress`` (``s``); and the observable counter
``kresilient.consumer.duplicates_skipped`` (``{message}``, per group: possible duplicates
``dedupe=`` skipped); the gauge ``kresilient.consumer.dependency_outage`` (``s``, per group:
how long the dependency outage in progress has lasted, 0 when none). ``/ready`` is 503 during
a dependency outage (the records are held: the consumer makes no progress). The observable
counter ``kresilient.consumer.stalls`` (``{stall}``, per group and ``kresilient.stall.kind``:
``progress`` or ``rebalance_loop``) counts the stalls reported, and
``kresilient.consumer.recreations`` (``{recreation}``, same attributes) the heals.

A fetch that never returns (a hung connection, librdkafka #5153; a leader that stopped
answering) is a ``progress`` stall too, read from librdkafka's statistics: the client cannot
see the log grow then (its high watermarks come in the fetch responses, so the cached ones
stand still), so the stall is what it can see: the partition's leader connection up, a
request waiting on it and nothing received for longer than ``stall_after_s`` plus
``fetch.wait.max.ms`` (a fetch is answered within ``fetch.wait.max.ms`` even when there is
nothing to read). With ``on_stall="heal"`` a ``progress`` or ``assignment`` stall (nothing
in hand, nothing held) or a rebalance loop is handed to the consumer
(:attr:`ConsumerProbes.remedy`), which recreates its librdkafka client at its next step and
calls :meth:`ConsumerProbes.healed`.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Protocol

import structlog
from confluent_kafka import KafkaException, TopicPartition

from kresilient._watchdog import NoProgress, StallReport
from kresilient.consumer._holds import TP
from kresilient.redaction import redact_text

if TYPE_CHECKING:
    from kresilient.consumer._holds import Holds, LoopState
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.consumer._outage import OutageDetector

__all__ = [
    "DUPLICATES_METRIC",
    "HEALS_METRIC",
    "LAG_METRIC",
    "ON_STALL",
    "OUTAGE_METRIC",
    "PROGRESS_METRIC",
    "STALLS_METRIC",
    "ConsumerProbes",
    "ProbeSource",
    "Probes",
]

#: The consumer-lag gauge (the name the issue and older OTel Kafka conventions use; the current
#: messaging semantic conventions define no lag metric).
LAG_METRIC: Final = "messaging.kafka.consumer.lag"
PROGRESS_METRIC: Final = "kresilient.consumer.time_since_progress"
DUPLICATES_METRIC: Final = "kresilient.consumer.duplicates_skipped"
OUTAGE_METRIC: Final = "kresilient.consumer.dependency_outage"
STALLS_METRIC: Final = "kresilient.consumer.stalls"
HEALS_METRIC: Final = "kresilient.consumer.recreations"
#: What a consumer does on a stall (the producer's ``on_stall`` values).
ON_STALL: Final = ("report", "heal")
#: A rebalance loop: at least this many rebalances (assign or lost callbacks) of a member
#: holding no partition, within LOOP_WINDOW x ``stall_after_s``.
LOOP_REBALANCES: Final = 3
LOOP_WINDOW: Final = 3.0
#: How often the watcher thread checks for stalls (seconds).
CHECK_INTERVAL_S: Final = 1.0
#: Checks of the watcher that raise in a row before it says so (one WARNING).
_CHECK_FAILURES_SAID: Final = 5
_INSTRUMENTATION: Final = "kresilient"
_DECODER: Final = json.JSONDecoder()
#: the stall kinds a heal recreates the client for (reported under ``progress``)
_HEALED: Final = frozenset({"progress", "assignment"})
#: Heals back off: after the n-th heal within _HEAL_WINDOW_S, the next waits
#: max(stall_after_s, _HEAL_BACKOFF_MIN_S) x 2^(n-1) seconds, at most _HEAL_BACKOFF_MAX_S (a heal
#: that did not help the first time will not help the sixth; each is a group rebalance).
_HEAL_BACKOFF_MIN_S: Final = 30.0
_HEAL_BACKOFF_MAX_S: Final = 600.0
_HEAL_WINDOW_S: Final = 3600.0


class _Partition(NoProgress):
    """Lag and stored offset of one assigned partition, and since when it made no progress
    (the shared rule of :mod:`kresilient._watchdog`: the producer's watchdog asks the same)."""

    __slots__ = ("lag", "stored")

    def __init__(self, now: float) -> None:
        super().__init__(now)
        self.lag: int | None = None
        self.stored: int | None = None


def _in_hand(running: Iterable[tuple[float, Collection[str]]]) -> set[TP]:
    """The partitions the handler calls in hand (``ProbeSource.handlers()``) work on."""
    busy: set[TP] = set()
    for _, names in running:
        for name in names:
            topic, _, rest = name.rpartition("[")
            if topic and rest.endswith("]") and rest[:-1].isdigit():
                busy.add((topic, int(rest[:-1])))
    return busy


class ProbeSource(Protocol):
    """What a consumer tells its probes. Called from the server thread too: each method
    returns a copy (or a view read once), never blocks, and takes no lock."""

    def stored_offsets(self) -> Mapping[TP, int]:
        """The offset stored (to be committed) per partition: the next record to handle."""

    def handlers(self) -> Iterable[tuple[float, Collection[str]]]:
        """The handler calls in hand: the monotonic time each began (or last made progress)
        and the partitions it works on (``topic[partition]``)."""

    def retry_waits(self) -> Iterable[tuple[TP, int, float]]:
        """Records waiting for their next attempt: ``(partition, offset, monotonic due)``."""

    def held(self) -> Collection[TP]:
        """The partitions held (a retry wait, an outage): no progress is expected of them."""

    def duplicates(self) -> int:
        """Possible duplicates skipped by ``dedupe`` so far."""


class ConsumerProbes:
    """The figures behind ``/live``, ``/ready`` and the gauges of one consumer (either kind).

    The consumer sets :attr:`last_poll` at every poll, :attr:`running` while it runs, calls
    :meth:`on_assign` / :meth:`forget` / :meth:`on_lost` from its rebalance callbacks and
    :meth:`tick` about once a second from the thread that calls librdkafka.
    """

    def __init__(
        self,
        consumer: Any,
        source: ProbeSource,
        *,
        stall_after_s: float,
        max_poll_s: float,
        group: str,
        outage: OutageDetector | None = None,
        log: Any = None,
        redact: Callable[[str], str] = redact_text,
        clock: Callable[[], float] = time.monotonic,
        on_stall: str = "report",
        fetch_wait_s: float = 0.5,
    ) -> None:
        #: the librdkafka consumer (``None`` until it is created: no lag figures meanwhile)
        self.consumer = consumer
        self._source = source
        self.stall_after_s = stall_after_s
        self.max_poll_s = max_poll_s
        self._group = group
        self._outage = outage
        self.last_poll = 0.0  #: set by the loop at every iteration
        self.running = False
        self.joined = False
        #: monotonic time the member lost its assignment, until it is assigned again
        self.lost_since: float | None = None
        self.parts: dict[TP, _Partition] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._clock = clock
        self._redact = redact
        if log is None:
            log = structlog.get_logger("kresilient.consumer").bind(
                group_id=group, kafka_role="consumer"
            )
        #: the stall in progress (handler, retry, progress, assignment) and the rebalance loop
        self._log = log
        self.stall = StallReport(log, "consumer_stalled")
        self.loop = StallReport(log, "consumer_rebalance_loop")
        #: the watcher's checks that raised in a row (reset by one that did not)
        self.check_failures = 0
        #: checks made so far (the watcher thread's, or a caller's :meth:`check`)
        self.checks = 0
        #: monotonic time since which the member holds no partition (after a rebalance)
        self._empty_since: float | None = None
        #: monotonic times of the rebalances (assign, lost) while the member holds none
        self._churn: deque[float] = deque()
        self._check_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        #: the partitions held at the last tick (see tick: a released one starts anew)
        self._held_at_tick: set[TP] = set()
        self._closed = threading.Event()
        self.on_stall = on_stall
        self._fetch_wait_s = fetch_wait_s
        #: partitions whose leader connection is silent with a request waiting, from the
        #: latest statistics: ``(node, seconds since it received anything, requests waiting)``
        self._silent: dict[TP, tuple[int, float, int]] = {}
        #: why the consumer should recreate its client (``on_stall="heal"``), read by the
        #: consumer's own thread at its next step; ``(kind, reason)``, ``None``: nothing to do
        self.remedy: tuple[str, str] | None = None
        #: heals so far per kind (``progress``, ``rebalance_loop``)
        self.heals = {"progress": 0, "rebalance_loop": 0}
        #: monotonic time of the last heal while no progress has been seen since (the stall
        #: stays reported until the new client proves it works), else None
        self.healed_at: float | None = None
        #: monotonic times of the heals within _HEAL_WINDOW_S (the backoff)
        self._heal_times: deque[float] = deque()
        #: brokers the latest statistics count up (None: no statistics yet): no broker up is
        #: an outage, which a new client cannot heal
        self.brokers_up: int | None = None

    @staticmethod
    def max_poll_interval(cfg: Mapping[str, Any]) -> float:
        """``max.poll.interval.ms`` of a consumer configuration, in seconds (``/live``)."""
        return float(cfg.get("max.poll.interval.ms", 300000)) / 1000.0

    # ------------------------------------------------------------------ loop thread

    def on_assign(self, partitions: Iterable[TopicPartition]) -> None:
        now = self._clock()
        self.joined = True
        self.lost_since = None  # a completed rebalance (cooperative: even an empty one)
        for p in partitions:
            self.parts[(p.topic, p.partition)] = _Partition(now)
        self._rebalanced(now, counts=True)

    def forget(self, tps: Iterable[TP]) -> None:
        """The partitions were revoked (a rebalance begins: its assign callback ends it)."""
        for tp in tps:
            self.parts.pop(tp, None)
        self._rebalanced(self._clock(), counts=False)

    def on_lost(self, tps: Iterable[TP]) -> None:
        """The member's partitions were lost (not revoked): it is out of the group until the
        next assignment."""
        for tp in tps:
            self.parts.pop(tp, None)
        now = self._clock()
        if self.lost_since is None:
            self.lost_since = now
        self._rebalanced(now, counts=True)

    def _rebalanced(self, now: float, *, counts: bool) -> None:
        """After a rebalance callback: since when the member holds no partition, and the
        rebalances meanwhile (a revoke only begins one: its assign is counted)."""
        if self.parts:
            self._empty_since = None
            self._churn.clear()
            return
        if self._empty_since is None:
            self._empty_since = now
        churn = self._churn
        if counts:
            churn.append(now)
        window = LOOP_WINDOW * self.stall_after_s
        while churn and now - churn[0] > window:
            churn.popleft()

    def on_stats(self, stats_json: str) -> None:
        """librdkafka's statistics (the thread calling librdkafka): the partitions whose
        leader connection is up, has a request waiting and received nothing for longer than
        ``fetch.wait.max.ms`` (a fetch is answered within it). Only the ``brokers`` object is
        decoded (small: the big ``topics`` object follows it)."""
        start = stats_json.find('"brokers":')
        if start < 0:
            return
        start += len('"brokers":')
        while stats_json[start : start + 1].isspace():
            start += 1
        try:
            brokers, _ = _DECODER.raw_decode(stats_json, start)
        except ValueError:
            return
        silent: dict[TP, tuple[int, float, int]] = {}
        wait = self._fetch_wait_s
        up = 0
        for broker in brokers.values() if isinstance(brokers, dict) else ():
            try:
                if broker.get("source") == "logical" or broker.get("state") != "UP":
                    continue
                up += 1
                waiting = int(broker.get("waitresp_cnt", 0))
                idle_s = float(broker.get("rxidle", -1)) / 1e6
                if waiting <= 0 or idle_s <= wait:
                    continue
                node = int(broker.get("nodeid", -1))
                for tp in (broker.get("toppars") or {}).values():
                    silent[(str(tp["topic"]), int(tp["partition"]))] = (node, idle_s, waiting)
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
        self._silent = silent
        self.brokers_up = up

    def tick(self, now: float) -> None:
        """Lag and progress per partition (the thread calling librdkafka, about once a
        second). The first call starts the watcher thread that reports stalls."""
        if self._watcher is None and not self._closed.is_set():
            self._watcher = threading.Thread(
                target=self._watch, name="kresilient-consumer-stalls", daemon=True
            )
            self._watcher.start()
        consumer = self.consumer
        if consumer is None:
            return
        stored = self._source.stored_offsets()
        # a partition released by a hold (a retry wait, an outage) starts its quiet time
        # anew: the time it was held is no stall (the stall check skips it until then)
        held = set(self._source.held())
        released, self._held_at_tick = self._held_at_tick - held, held
        proof = False  # after a heal: the new client handles records, or fetched to the end
        busy = _in_hand(self._source.handlers())
        for tp, part in list(self.parts.items()):
            offset = stored.get(tp)
            if tp in busy:
                # a handler in hand on it: its progress is the handler's (the handler rule
                # watches it); the partition's quiet time starts when the handler returns
                part.moved(now)
            if (offset is not None and offset != part.stored) or tp in released:
                if offset is not None:
                    proof = proof or part.stored is not None
                    part.stored = offset
                part.moved(now)
            try:
                _, high = consumer.get_watermark_offsets(TopicPartition(tp[0], tp[1]), cached=True)
                if offset is None:  # nothing stored yet: the position handed out so far
                    (pos,) = consumer.position([TopicPartition(tp[0], tp[1])])
                    offset = pos.offset if pos.offset >= 0 else None
            except (KafkaException, RuntimeError):
                continue
            if high is None or high < 0 or offset is None:
                continue
            lag = max(high - offset, 0)
            if lag == 0 or part.lag == 0:
                part.moved(now)  # caught up, or work just arrived: not stalled yet
            proof = proof or lag == 0  # watermarks known: a fetch was answered
            part.lag = lag
        if proof and self.healed_at is not None:
            self._proven()

    def _proven(self) -> None:
        """The client made after a heal works: the stall (or loop) healed is cleared."""
        with self._check_lock:
            self.healed_at = None
            if self.stall.active:
                self.stall.end(healed=True)
            if self.loop.active:
                self.loop.end(healed=True)

    # ------------------------------------------------------------------ any thread

    def live(self, now: float | None = None) -> tuple[bool, list[str]]:
        now = self._clock() if now is None else now
        if not self.running:
            return False, ["the consume loop is not running"]
        quiet = now - self.last_poll
        if quiet > self.max_poll_s:
            return False, [
                f"the loop has not polled for {quiet:.1f} s (max.poll.interval.ms "
                f"{self.max_poll_s * 1000:.0f})"
            ]
        return True, []

    def ready(self, now: float | None = None) -> tuple[bool, list[str]]:
        now = self._clock() if now is None else now
        alive, reasons = self.live(now)
        if not alive:
            return False, reasons
        if not self.joined:
            return False, ["not yet joined the consumer group"]
        if self.healed_at is not None:
            reasons.append(
                f"recreated by on_stall='heal' {max(0.0, now - self.healed_at):.1f} s ago, no "
                f"progress seen since ({self.stall.reason or self.loop.reason or 'a stall'})"
            )
        loop = self.rebalance_loop(now)
        if loop is not None:
            reasons.append(loop[0])
        stalls = self.stalled(now)
        reasons.extend(text for kind, text, _, _ in stalls if kind != "progress")
        outage = self._outage
        if outage is not None and outage.active:
            reasons.append(
                f"dependency outage for {outage.duration():.1f} s ({outage.error_type}): "
                f"{len(self._source.held())} partition(s) held, retried, nothing dead-lettered"
            )
        reasons.extend(text for kind, text, _, _ in stalls if kind == "progress")
        return not reasons, reasons

    def stalled(self, now: float) -> list[tuple[str, str, float, list[str]]]:
        """What stopped for longer than ``stall_after_s``: ``(kind, reason, seconds since it
        stopped, partitions)`` with ``kind`` one of ``assignment`` (lost, not given back),
        ``handler`` (running that long), ``retry`` (a hold overdue by that long),
        ``progress`` (lag and no progress). A dependency outage is none of these: its held
        partitions are expected not to move (it is reported as an outage)."""
        limit = self.stall_after_s
        found: list[tuple[str, str, float, list[str]]] = []
        lost = self.lost_since
        # a stalled member that then loses its partitions (its heartbeats hang too) is the
        # same stall going on, not a new one after a rejoin grace
        if lost is not None and (now - lost > limit or self.stall.active):
            found.append(
                (
                    "assignment",
                    f"the member lost its partitions {now - lost:.1f} s ago and has not "
                    "rejoined the group (group coordinator unreachable? see the "
                    "kafka_unreachable logs)",
                    now - lost,
                    [],
                )
            )
        source = self._source
        running = list(source.handlers())
        busy = _in_hand(running)
        for started, names in running:
            if started and now - started > limit:
                found.append(
                    (
                        "handler",
                        f"a handler has been running for {now - started:.1f} s on "
                        f"{', '.join(sorted(names))}",
                        now - started,
                        sorted(names),
                    )
                )
        for tp, offset, due in source.retry_waits():
            if now - due > limit:
                found.append(
                    (
                        "retry",
                        f"{tp[0]}[{tp[1]}] held at {offset}, retry overdue by {now - due:.1f} s",
                        now - due,
                        [f"{tp[0]}[{tp[1]}]"],
                    )
                )
        held = set(source.held()) | self._held_at_tick  # released since the tick: not yet
        silent = self._silent
        for tp, part in list(self.parts.items()):
            if tp in held:
                continue
            # a partition a handler works on is the handler's stall, not a fetch's (a slow
            # handler must not look like a consumer to heal)
            if part.lag and part.stalled(now, limit) and tp not in busy:
                quiet = part.quiet_for(now)
                found.append(
                    (
                        "progress",
                        f"{tp[0]}[{tp[1]}] lag {part.lag} without progress for {quiet:.1f} s",
                        quiet,
                        [f"{tp[0]}[{tp[1]}]"],
                    )
                )
                continue
            hung = silent.get(tp)
            if hung is not None and hung[1] > limit + self._fetch_wait_s:
                node, quiet, waiting = hung
                found.append(
                    (
                        "progress",
                        f"{tp[0]}[{tp[1]}] fetch not answered for {quiet:.1f} s (leader "
                        f"{node}: {waiting} request(s) waiting, nothing received; the log "
                        "may grow unseen)",
                        quiet,
                        [f"{tp[0]}[{tp[1]}]"],
                    )
                )
        return found

    def rebalance_loop(self, now: float) -> tuple[str, float, int] | None:
        """A member holding no partition for longer than ``stall_after_s`` while its
        rebalances repeat (at least LOOP_REBALANCES within LOOP_WINDOW x ``stall_after_s``;
        librdkafka #3866): ``(reason, seconds without a partition, rebalances)``. A member
        idle because the group has more members than partitions is none: its rebalances
        stop."""
        since = self._empty_since
        limit = self.stall_after_s
        if since is None or self.parts or now - since <= limit:
            return None
        window = LOOP_WINDOW * limit
        count = sum(1 for t in list(self._churn) if now - t <= window)
        if count < LOOP_REBALANCES:
            return None
        return (
            f"no partition for {now - since:.1f} s while the group rebalanced {count} times "
            f"in {window:.0f} s (a rebalance loop? librdkafka #3866)",
            now - since,
            count,
        )

    def check(self, now: float | None = None) -> None:
        """Report a stall once when it begins and once when it ends (the watcher thread,
        once a second; callable directly with a clock of one's own)."""
        now = self._clock() if now is None else now
        with self._check_lock:
            self.checks += 1
            if not self.running:
                return  # stopped or stopping: not a stall (``/live`` says it)
            limit = self.stall_after_s
            redact = self._redact
            found = self.stalled(now)
            stall = self.stall
            heal = self.on_stall == "heal"
            kinds = {kind for kind, *_ in found}
            if found and not stall.active:
                partitions = sorted({name for *_, names in found for name in names})
                stall.begin(
                    redact("; ".join(text for _, text, _, _ in found)),
                    max(quiet for _, _, quiet, _ in found),
                    kinds=sorted(kinds),
                    partitions=[redact(name) for name in partitions],
                    stall_after_s=limit,
                    remedy=(
                        "on_stall='heal': the librdkafka consumer is recreated once nothing "
                        "is in hand (a 'progress' or 'assignment' stall); see docs/stalls.md"
                        if heal
                        else "reported only: /ready is 503 meanwhile (an orchestrator "
                        "restarting the pod on it, or on_stall='heal', is the remedy); see "
                        "docs/stalls.md"
                    ),
                )
            elif not found and stall.active and self.healed_at is None:
                stall.end()  # after a heal: only progress ends it (see tick)
            loop = self.rebalance_loop(now)
            if loop is not None and not self.loop.active:
                reason, without, count = loop
                self.loop.begin(
                    redact(reason),
                    without,
                    rebalances=count,
                    without_partitions_s=round(without, 1),
                    stall_after_s=limit,
                    remedy=(
                        "on_stall='heal': the librdkafka consumer is recreated (a new member)"
                        if heal
                        else "look at the group's other members (one joining and leaving, "
                        "or exceeding max.poll.interval.ms) and the coordinator's logs"
                    ),
                )
            elif loop is None and self.loop.active and self.healed_at is None:
                self.loop.end()
            # heal a fetch that does not move, or a member lost and not rejoined (a hung
            # coordinator connection); not a handler or a retry: a new client would not help
            remedy: tuple[str, str] | None = None
            if heal and self.loop.active and self.loop.reason is not None:
                remedy = ("rebalance_loop", self.loop.reason)
            elif heal and kinds and kinds <= _HEALED and stall.reason is not None:
                remedy = ("progress", stall.reason)
            if remedy is not None and not self._may_heal(now):
                remedy = None
            self.remedy = remedy

    def _may_heal(self, now: float) -> bool:
        """Not while no broker is up (an outage: a new client cannot help, the stall stays
        reported), and not sooner than the backoff after the last heals."""
        if self.brokers_up == 0:
            return False
        times = self._heal_times
        while times and now - times[0] > _HEAL_WINDOW_S:
            times.popleft()
        if not times:
            return True
        base = max(self.stall_after_s, _HEAL_BACKOFF_MIN_S)
        backoff = min(_HEAL_BACKOFF_MAX_S, base * 2 ** (len(times) - 1))
        return bool(now - times[-1] >= backoff)

    def healed(self, kind: str) -> None:
        """The consumer recreated its client for ``kind``: its partitions forgotten (the new
        member is assigned anew), the heal counted. The stall (or loop) reported stays
        reported, ``/ready`` 503, until the new client makes progress (:meth:`tick`); then
        it is cleared with ``healed=True``."""
        with self._check_lock:
            now = self._clock()
            self.remedy = None
            self.healed_at = now
            self._heal_times.append(now)
            self.brokers_up = None  # the new client's statistics will say
            self.heals[kind] = self.heals.get(kind, 0) + 1
            self.parts.clear()
            self._silent = {}
            self._held_at_tick = set()
            self.joined = False
            self.lost_since = None
            self._empty_since = None
            self._churn.clear()

    def stall_fields(self) -> dict[str, Any]:
        """The :class:`~kresilient.consumer.ConsumerHealth` fields ``stalled`` (what stopped,
        ``None``: nothing), ``stalled_since`` (wall clock) and ``stalls`` (reported so far,
        rebalance loops included)."""
        reports = [r for r in (self.stall, self.loop) if r.active]
        return {
            "stalled": "; ".join(r.reason or "" for r in reports) or None,
            "stalled_since": min((r.since for r in reports if r.since is not None), default=None),
            "stalls": self.stall.stalls + self.loop.stalls,
            "recreations": sum(self.heals.values()),
        }

    def _watch(self) -> None:
        closed = self._closed
        while not closed.wait(CHECK_INTERVAL_S):
            try:
                self.check()
            except Exception as exc:  # a check never kills the watcher (figures read while moving)
                self.check_failures += 1
                if self.check_failures == _CHECK_FAILURES_SAID:
                    # one in passing is figures read while they moved; this many in a row
                    # means no stall can be reported: say it once (it was silent before)
                    self._log.warning(
                        "consumer_stall_check_failed",
                        failures=self.check_failures,
                        error_type=type(exc).__name__,
                        error=self._redact(str(exc)),
                        note="the stall watcher's checks keep failing: stalls are not "
                        "reported until one succeeds",
                    )
            else:
                self.check_failures = 0

    def report(self, now: float | None = None) -> dict[str, Any]:
        now = self._clock() if now is None else now
        return {
            "partitions": {
                f"{tp[0]}[{tp[1]}]": {
                    "lag": part.lag,
                    "since_progress_s": round(part.quiet_for(now), 3),
                }
                for tp, part in list(self.parts.items())
            }
        }

    # ------------------------------------------------------------------ metrics

    def register_metrics(self, meter_provider: Any) -> None:
        """Observable gauges on ``meter_provider`` (the global one when ``None``)."""
        try:
            from opentelemetry import metrics

            provider = (
                meter_provider if meter_provider is not None else metrics.get_meter_provider()
            )
            meter = provider.get_meter(_INSTRUMENTATION)
            meter.create_observable_gauge(
                LAG_METRIC,
                callbacks=[self._observe_lag],
                unit="{message}",
                description="High watermark minus the offset stored after processing",
            )
            meter.create_observable_gauge(
                PROGRESS_METRIC,
                callbacks=[self._observe_progress],
                unit="s",
                description="Seconds since the partition last made progress (0 when caught up)",
            )
            meter.create_observable_gauge(
                OUTAGE_METRIC,
                callbacks=[self._observe_outage],
                unit="s",
                description="Seconds the dependency outage in progress has lasted (0: none)",
            )
            meter.create_observable_counter(
                STALLS_METRIC,
                callbacks=[self._observe_stalls],
                unit="{stall}",
                description="Stalls reported (consumer_stalled, consumer_rebalance_loop)",
            )
            meter.create_observable_counter(
                HEALS_METRIC,
                callbacks=[self._observe_heals],
                unit="{recreation}",
                description="Librdkafka consumers recreated by on_stall='heal', per stall kind",
            )
            meter.create_observable_counter(
                DUPLICATES_METRIC,
                callbacks=[self._observe_duplicates],
                unit="{message}",
                description="Possible duplicates skipped by dedupe (their id was processed)",
            )
        except Exception:  # telemetry never breaks the consumer
            return

    def _attrs(self, tp: TP) -> dict[str, Any]:
        return {
            "messaging.system": "kafka",
            "messaging.destination.name": tp[0],
            "messaging.destination.partition.id": str(tp[1]),
            "messaging.consumer.group.name": self._group,
        }

    def _observe_lag(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        return [
            Observation(part.lag, self._attrs(tp))
            for tp, part in list(self.parts.items())
            if part.lag is not None
        ]

    def _observe_duplicates(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        attrs = {"messaging.system": "kafka", "messaging.consumer.group.name": self._group}
        return [Observation(self._source.duplicates(), attrs)]

    def _observe_stalls(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        base = {"messaging.system": "kafka", "messaging.consumer.group.name": self._group}
        return [
            Observation(report.stalls, {**base, "kresilient.stall.kind": kind})
            for kind, report in (("progress", self.stall), ("rebalance_loop", self.loop))
        ]

    def _observe_heals(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        base = {"messaging.system": "kafka", "messaging.consumer.group.name": self._group}
        return [
            Observation(count, {**base, "kresilient.stall.kind": kind})
            for kind, count in list(self.heals.items())
        ]

    def _observe_outage(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        attrs = {"messaging.system": "kafka", "messaging.consumer.group.name": self._group}
        outage = self._outage
        return [Observation(outage.duration() if outage is not None else 0.0, attrs)]

    def _observe_progress(self, _options: Any) -> list[Any]:
        from opentelemetry.metrics import Observation

        now = time.monotonic()
        return [
            Observation(0.0 if not part.lag else round(part.quiet_for(now), 3), self._attrs(tp))
            for tp, part in list(self.parts.items())
        ]

    # ------------------------------------------------------------------ HTTP

    def serve(self, host: str, port: int) -> int:
        """Start the HTTP server on ``host:port`` (0: any free port); return the port."""
        probes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0].rstrip("/")
                if path == "/live":
                    ok, reasons = probes.live()
                elif path == "/ready":
                    ok, reasons = probes.ready()
                else:
                    self._send(404, {"status": "not found", "paths": ["/live", "/ready"]})
                    return
                body: dict[str, Any] = {"status": "ok" if ok else "unavailable"}
                body["reasons"] = reasons
                body.update(probes.report())
                self._send(200 if ok else 503, body)

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:  # probes are polled every few seconds
                pass

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="kresilient-probes", daemon=True
        )
        self._thread.start()
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop the watcher thread and the HTTP server (idempotent)."""
        self._closed.set()
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(5)
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)


class _SyncSource:
    """:class:`ResilientConsumer`'s state as a :class:`ProbeSource`."""

    __slots__ = ("_batch_started", "_held", "_holds", "_offsets", "_state")

    def __init__(
        self,
        offsets: OffsetKeeper,
        holds: Holds,
        state: LoopState,
        batch_started: Callable[[], float],
        held: Callable[[], Collection[TP]] | None = None,
    ) -> None:
        self._offsets = offsets
        self._holds = holds
        self._state = state
        self._batch_started = batch_started
        self._held = held

    def stored_offsets(self) -> Mapping[TP, int]:
        return self._offsets.stored

    def handlers(self) -> list[tuple[float, Collection[str]]]:
        started = self._batch_started()
        if not started:
            return []
        return [(started, {f"{m.topic()}[{m.partition()}]" for m in list(self._state.batch)})]

    def retry_waits(self) -> list[tuple[TP, int, float]]:
        return [(h.tp, h.offset, h.due) for h in list(self._holds.by_tp.values()) if not h.resumed]

    def held(self) -> Collection[TP]:
        held = self._held() if self._held is not None else ()
        return self._holds.by_tp.keys() | held if held else self._holds.by_tp.keys()

    def duplicates(self) -> int:
        return self._state.duplicates


class Probes(ConsumerProbes):
    """:class:`ConsumerProbes` of a :class:`~kresilient.ResilientConsumer`, from its offset
    keeper, holds and loop state (``batch_started``: when the batch in hand began, 0: none)."""

    def __init__(
        self,
        consumer: Any,
        offsets: OffsetKeeper,
        holds: Holds,
        state: LoopState,
        *,
        stall_after_s: float,
        max_poll_s: float,
        batch_started: Callable[[], float],
        group: str,
        outage: OutageDetector | None = None,
        log: Any = None,
        redact: Callable[[str], str] = redact_text,
        held: Callable[[], Collection[TP]] | None = None,
        on_stall: str = "report",
        fetch_wait_s: float = 0.5,
    ) -> None:
        super().__init__(
            consumer,
            _SyncSource(offsets, holds, state, batch_started, held),
            stall_after_s=stall_after_s,
            max_poll_s=max_poll_s,
            group=group,
            outage=outage,
            log=log,
            redact=redact,
            on_stall=on_stall,
            fetch_wait_s=fetch_wait_s,
        )
