"""Tell a leadership burst (a restart, an election) from sustained churn (a flapping broker).

NotLeaderOrFollower / LeaderNotAvailable right after a restart, an election or a reassignment
is normal and harmless with retries; the same signals *repeating* point at a flapping broker
or an unhealthy controller and need a human. :class:`LeadershipMonitor` watches what a client
can observe and keeps one :class:`LeadershipState` per topic-partition:

- ``STABLE``: nothing for at least ``quiet_period_s``.
- ``TRANSIENT_BURST``: a leader move or a burst of leadership errors (one election).
- ``SUSTAINED_CHURN``: at least ``churn_leader_changes`` leader moves, or at least
  ``churn_bursts`` separate bursts, within ``window_s``. Stays until ``quiet_period_s`` passes
  without any signal, then returns to ``STABLE``.

Signals: librdkafka statistics (``statistics.interval.ms`` > 0, fed through ``stats_cb`` to
:meth:`LeadershipMonitor.on_stats`): each tick carries every partition's current leader and
each topic's metadata age; and leadership-class errors (``ErrorCategory.LEADERSHIP``) from
delivery reports, ``error_cb`` or librdkafka log lines (:meth:`~LeadershipMonitor.on_error`,
:meth:`~LeadershipMonitor.on_log`). A *burst* is a run of signals with gaps shorter than
``burst_gap_s``; a leader move and the errors around it are one burst. A leader of -1 (no
leader known) is a signal but not a move; the move is counted when a new leader appears.

Defaults (:class:`ChurnPolicy`): a rolling restart of a 3-broker cluster moves a partition's
leader at most about 3 times (once per broker that led it, plus a preferred election that the
broker runs every ``leader.imbalance.check.interval.seconds`` = 300 s, normally outside the
window), each move one burst, spread over the minutes the restart takes. That must not be
churn, so churn needs 4 moves or 4 separate bursts within 120 s.

Each state change emits one structlog event (``kafka_leadership_state_changed``: WARNING when
entering a burst or churn, INFO on the return to STABLE) and calls the listeners with a
:class:`LeadershipChange`. Nothing is logged per message above DEBUG. Time comes from an
injectable ``clock`` (``time.monotonic`` by default) so tests are deterministic; states are
re-evaluated on every stats tick and on every query.

Scale: a tick costs time linear in the partitions the statistics document lists (plus the few
partitions not STABLE); quiet partitions are not walked. A partition absent from the statistics
(its topic deleted, no longer produced to or subscribed) and without any signal for
``forget_after_s`` (default 600 s) while STABLE is forgotten, so a client rotating through many
topics keeps state only for the partitions it currently knows.

Example::

    monitor = LeadershipMonitor(metadata_max_age_ms=900_000)
    producer = Producer({..., "statistics.interval.ms": 1000, "stats_cb": monitor.on_stats,
                         "error_cb": monitor.on_error})
    monitor.add_listener(lambda change: alert(change) if change.state is
                         LeadershipState.SUSTAINED_CHURN else None)
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import structlog
from confluent_kafka import KafkaError

from kresilient.errors import Classification, Context, ErrorCategory, classify

__all__ = [
    "ChurnPolicy",
    "LeadershipChange",
    "LeadershipMonitor",
    "LeadershipState",
]

#: librdkafka's default ``metadata.max.age.ms``, used when none is configured.
LIBRDKAFKA_METADATA_MAX_AGE_MS: Final = 900_000

EVENT: Final = "kafka_leadership_state_changed"
STALE_EVENT: Final = "kafka_metadata_stale_changed"


class LeadershipState(enum.Enum):
    """Leadership health of one topic-partition, from best to worst."""

    STABLE = "stable"
    TRANSIENT_BURST = "transient_burst"
    SUSTAINED_CHURN = "sustained_churn"


_SEVERITY: Final[Mapping[LeadershipState, int]] = {
    LeadershipState.STABLE: 0,
    LeadershipState.TRANSIENT_BURST: 1,
    LeadershipState.SUSTAINED_CHURN: 2,
}


@dataclass(frozen=True, kw_only=True)
class ChurnPolicy:
    """Thresholds of the leadership monitor (all times in seconds).

    Attributes:
        window_s: sliding window in which moves and bursts are counted (default 120).
        churn_leader_changes: leader moves within the window that make churn (default 4).
        churn_bursts: separate bursts within the window that make churn (default 4).
        burst_gap_s: signals closer than this belong to the same burst (default 10; a
            SIGKILLed leader is replaced after ``broker.session.timeout.ms``, 9 s by default,
            and the errors of that one election arrive within that time).
        quiet_period_s: time without any signal after which a partition is STABLE again
            (default 60).
    """

    window_s: float = 120.0
    churn_leader_changes: int = 4
    churn_bursts: int = 4
    burst_gap_s: float = 10.0
    quiet_period_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("window_s", "burst_gap_s", "quiet_period_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"ChurnPolicy.{name} must be > 0, got {value!r}")
        for name in ("churn_leader_changes", "churn_bursts"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"ChurnPolicy.{name} must be an int >= 2, got {value!r}")

    def replace(self, **changes: Any) -> ChurnPolicy:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class LeadershipChange:
    """One state change of one topic-partition, as given to listeners."""

    topic: str
    partition: int
    previous: LeadershipState
    state: LeadershipState
    at: float
    """Monitor clock time of the change."""
    reason: str
    leader: int | None
    """Current leader broker id, when known."""
    leader_changes: int
    """Leader moves within the window."""
    bursts: int
    """Separate bursts within the window."""
    errors: int
    """Leadership errors within the window."""
    window_s: float
    classification: Classification | None = None
    """The last leadership error's classification, if an error was seen."""


@dataclass(slots=True)
class _Partition:
    # Lists, not deques: an empty deque costs ~600 bytes and these hold a handful of times at
    # most (one per leader move / burst / error within the window), pruned from the front.
    state: LeadershipState = LeadershipState.STABLE
    since: float = 0.0
    seen: float = 0.0
    """Last time the partition was in a statistics document or had a signal."""
    leader: int | None = None
    leaderless: bool = False
    last_signal: float | None = None
    moves: list[float] = dataclasses.field(default_factory=list)
    bursts: list[float] = dataclasses.field(default_factory=list)
    errors: list[float] = dataclasses.field(default_factory=list)
    last_error: Classification | None = None
    last_reason: str = ""


def _prune(part: _Partition, horizon: float) -> None:
    """Drop the moves, bursts and errors older than *horizon* (the window's start)."""
    for q in (part.moves, part.bursts, part.errors):
        if q and q[0] < horizon:
            i = 1
            while i < len(q) and q[i] < horizon:
                i += 1
            del q[:i]


@dataclass(slots=True)
class _Topic:
    metadata_age_ms: float | None = None
    stale: bool = False
    seen: float = 0.0


Listener = Callable[[LeadershipChange], None]
_T = TypeVar("_T")

# "<topic> [<partition>]" as librdkafka writes it in log lines.
_TOPIC_PARTITION = re.compile(r'"?(?P<topic>[A-Za-z0-9._-]+)"? ?\[(?P<partition>-?\d+)\]')
_ERROR_NAME = re.compile(r"\b(?P<name>_?[A-Z][A-Z_]{3,})\b")


class LeadershipMonitor:
    """Per-partition leadership state from librdkafka statistics and leadership errors.

    Thread-safe: the feeding callbacks run on the client's poll thread while health checks
    query from others. Listeners and log events run outside the lock, after the change.

    Args:
        policy: thresholds (:class:`ChurnPolicy`).
        metadata_max_age_ms: the client's ``metadata.max.age.ms``; a topic whose metadata is
            older is reported by :meth:`stale_metadata`. ``None``: librdkafka's default
            (900000).
        logger: a structlog logger (bound once per client); default
            ``structlog.get_logger("kresilient.leadership")``.
        clock: monotonic seconds; inject a fake one in tests.
        forget_after_s: a STABLE partition (or topic) absent from the statistics and without
            any signal for this long is forgotten (default 600; it must exceed the policy's
            ``quiet_period_s``, or a partition could be forgotten before it settles).
    """

    def __init__(
        self,
        policy: ChurnPolicy | None = None,
        *,
        metadata_max_age_ms: int | None = None,
        logger: Any = None,
        clock: Callable[[], float] = time.monotonic,
        forget_after_s: float = 600.0,
    ) -> None:
        self.policy = policy if policy is not None else ChurnPolicy()
        if not forget_after_s > self.policy.quiet_period_s:
            raise ValueError(
                f"forget_after_s must be > policy.quiet_period_s "
                f"({self.policy.quiet_period_s:g}), got {forget_after_s!r}"
            )
        self.forget_after_s = float(forget_after_s)
        self.metadata_max_age_ms = (
            metadata_max_age_ms
            if metadata_max_age_ms is not None
            else LIBRDKAFKA_METADATA_MAX_AGE_MS
        )
        self._log = logger if logger is not None else structlog.get_logger("kresilient.leadership")
        self._clock = clock
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, int], _Partition] = {}
        # topic -> its partitions: a topic-wide error touches them without walking all
        self._by_topic: dict[str, dict[int, _Partition]] = {}
        # partitions not STABLE: the only ones a tick or a query must re-evaluate
        self._unsettled: dict[tuple[str, int], _Partition] = {}
        self._topics: dict[str, _Topic] = {}
        self._next_sweep = clock() + self.forget_after_s / 2
        self._forgotten = 0
        self._listeners: list[Listener] = []
        self._unattributed = 0
        self._ticks = 0
        self._bad_stats = 0

    # ------------------------------------------------------------------ listeners
    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(change)`` on every state change (telemetry hooks in here)."""
        with self._lock:
            self._listeners.append(callback)

    def remove_listener(self, callback: Listener) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with self._lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    # ------------------------------------------------------------------ feeding
    def on_stats(self, stats: str | bytes | Mapping[str, Any]) -> Mapping[str, Any] | None:
        """Feed one librdkafka statistics document (use as ``stats_cb``).

        Tolerates missing fields, partitions without a leader (-1) and malformed input (the
        tick is ignored, counted in :meth:`snapshot` as ``unparsable_stats``): invalid or deeply
        nested JSON, odd types. Never raises (it runs inside librdkafka's callback).

        Returns the document as parsed when it is a JSON object (even one whose fields the
        monitor could not use), else ``None``: a caller that reads other fields of the same
        document (broker states, say) need not parse it again. A document of 10,000 partitions
        takes about 50 ms to parse.
        """
        doc: Any = None
        try:
            doc = json.loads(stats) if isinstance(stats, str | bytes) else stats
            if not isinstance(doc, Mapping):
                raise TypeError("a statistics document is a JSON object")
            self._on_stats(doc)
        except Exception as exc:  # RecursionError from json, a Mapping that raises ...
            with self._lock:
                self._bad_stats += 1
            with contextlib.suppress(Exception):  # a logger that raises: nothing left to do
                self._log.debug("kafka_stats_unparsable", error=type(exc).__name__)
        return doc if isinstance(doc, Mapping) else None

    def _on_stats(self, doc: Mapping[str, Any]) -> None:
        now = self._clock()
        changes: list[LeadershipChange] = []
        stale_changes: list[tuple[str, bool, float]] = []
        with self._lock:
            self._ticks += 1
            topics = doc.get("topics")
            if isinstance(topics, Mapping):
                for name, tdoc in topics.items():
                    if isinstance(name, str) and isinstance(tdoc, Mapping):
                        self._stats_topic(name, tdoc, now, changes, stale_changes)
            self._evaluate_all(now, changes)
            self._maybe_sweep(now)
        self._emit(changes, stale_changes)

    def on_error(
        self,
        err: object,
        topic: str | None = None,
        partition: int | None = None,
        *,
        classification: Classification | None = None,
        context: Context | None = None,
    ) -> None:
        """Feed an error (``KafkaError``, exception or code) seen for ``topic``/``partition``.

        Only leadership-class errors count. Without a partition (or -1) the error counts for
        every known partition of the topic; without a topic it is only counted in
        :meth:`snapshot` (``unattributed_errors``). Usable as ``error_cb``.

        The monitor classifies *err* itself with ``classify(err, context=context)``; a caller
        that already classified it passes *classification*, which wins. A delivery report's
        ``UNKNOWN_TOPIC_OR_PART`` is a missing topic (CONFIG), not a leader move: pass
        ``context="delivery"`` (or the delivery-context classification) so that deleting a
        topic is not reported as leadership trouble. :meth:`on_delivery` does this itself.
        """
        c = classification if classification is not None else classify(err, context=context)
        if c.category is not ErrorCategory.LEADERSHIP:
            return
        now = self._clock()
        changes: list[LeadershipChange] = []
        with self._lock:
            keys: list[tuple[str, int]]
            if topic is None:
                self._unattributed += 1
                keys = []
            elif partition is not None and partition >= 0:
                keys = [(topic, partition)]
            else:
                keys = [(topic, p) for p in self._by_topic.get(topic, ())]
                if not keys:
                    self._unattributed += 1
            for key in keys:
                part = self._part(key, now)
                part.last_error = c
                part.errors.append(now)
                self._signal(key, part, now, c.name, changes)
            self._maybe_sweep(now)
        self._emit(changes, [])

    def on_delivery(self, err: object, msg: Any) -> None:
        """Feed a delivery report (``on_delivery(err, msg)``); successes are ignored.

        The error is classified in delivery context (``UNKNOWN_TOPIC_OR_PART`` after
        librdkafka's own retries is a missing topic, not leadership trouble).
        """
        if err is None:
            return
        try:
            topic, partition = msg.topic(), msg.partition()
        except AttributeError:
            topic, partition = None, None
        self.on_error(err, topic, partition, context="delivery")

    def on_log(self, message: str) -> None:
        """Feed one librdkafka log line; counted when it names a leadership error.

        Recognises ``KafkaError`` names (``NOT_LEADER_FOR_PARTITION``) and librdkafka's
        descriptions ("Broker: Not leader for partition"), with a ``topic [partition]``
        when present.
        """
        code = _leadership_code_in(message)
        if code is None:
            return
        m = _TOPIC_PARTITION.search(message)
        if m is None:
            self.on_error(code)
        else:
            self.on_error(code, m.group("topic"), int(m.group("partition")))

    # ------------------------------------------------------------------ queries
    def state(self, topic: str, partition: int) -> LeadershipState:
        """Current state of one partition (STABLE when never seen)."""
        return self._query(lambda: self._state_of(topic, partition))

    def states(self) -> dict[tuple[str, int], LeadershipState]:
        """Current state of every partition known (seen and not forgotten)."""
        return self._query(lambda: {k: p.state for k, p in self._parts.items()})

    def worst_state(self) -> LeadershipState:
        """The most severe state over all partitions (for a one-word health check)."""
        return self._query(
            lambda: max(
                (p.state for p in self._unsettled.values()),
                key=_SEVERITY.__getitem__,
                default=LeadershipState.STABLE,
            )
        )

    def leader(self, topic: str, partition: int) -> int | None:
        """Last leader seen in statistics (``None`` when unknown or leaderless)."""
        with self._lock:
            part = self._parts.get((topic, partition))
            return None if part is None or part.leaderless else part.leader

    def metadata_age_ms(self, topic: str) -> float | None:
        """Age of the client's metadata for ``topic`` at the last stats tick (ms)."""
        with self._lock:
            t = self._topics.get(topic)
            return None if t is None else t.metadata_age_ms

    def stale_metadata(self) -> list[str]:
        """Topics whose metadata age exceeds ``metadata_max_age_ms``, sorted."""
        with self._lock:
            return sorted(name for name, t in self._topics.items() if t.stale)

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready view for ``health()``: states, counts, metadata ages and the policy."""

        def build() -> dict[str, Any]:
            now = self._clock()
            horizon = now - self.policy.window_s
            for p in self._parts.values():
                _prune(p, horizon)
            parts = {
                f"{topic}[{partition}]": {
                    "topic": topic,
                    "partition": partition,
                    "state": p.state.value,
                    "since_s": round(now - p.since, 3),
                    "leader": None if p.leaderless else p.leader,
                    "leader_changes": len(p.moves),
                    "bursts": len(p.bursts),
                    "errors": len(p.errors),
                    "reason": p.last_reason,
                }
                for (topic, partition), p in sorted(self._parts.items())
            }
            worst = max(
                (p.state for p in self._unsettled.values()),
                key=_SEVERITY.__getitem__,
                default=LeadershipState.STABLE,
            )
            return {
                "state": worst.value,
                "partitions": parts,
                "topics": {
                    name: {"metadata_age_ms": t.metadata_age_ms, "stale": t.stale}
                    for name, t in sorted(self._topics.items())
                },
                "metadata_max_age_ms": self.metadata_max_age_ms,
                "unattributed_errors": self._unattributed,
                "stats_ticks": self._ticks,
                "unparsable_stats": self._bad_stats,
                "forgotten_partitions": self._forgotten,
                "policy": dataclasses.asdict(self.policy),
            }

        return self._query(build)

    def refresh(self) -> None:
        """Re-evaluate every partition now (quiet periods end without new input)."""
        self._query(lambda: None)

    # ------------------------------------------------------------------ internals
    def _query(self, read: Callable[[], _T]) -> _T:
        now = self._clock()
        changes: list[LeadershipChange] = []
        with self._lock:
            self._evaluate_all(now, changes)
            self._maybe_sweep(now)
            result = read()
        self._emit(changes, [])
        return result

    def _state_of(self, topic: str, partition: int) -> LeadershipState:
        part = self._parts.get((topic, partition))
        return LeadershipState.STABLE if part is None else part.state

    def _part(self, key: tuple[str, int], now: float) -> _Partition:
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Partition(since=now, seen=now)
            self._by_topic.setdefault(key[0], {})[key[1]] = part
        return part

    def _maybe_sweep(self, now: float) -> None:
        """Forget STABLE partitions and topics unseen for ``forget_after_s`` (under the lock).

        Runs at most every ``forget_after_s / 2``, so its walk over every known partition is
        amortised over many ticks and the tick stays linear in the live partitions.
        """
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.forget_after_s / 2
        cutoff = now - self.forget_after_s
        gone = [
            key
            for key, p in self._parts.items()
            if p.seen < cutoff and p.state is LeadershipState.STABLE
        ]
        for key in gone:
            del self._parts[key]
            same_topic = self._by_topic[key[0]]
            del same_topic[key[1]]
            if not same_topic:
                del self._by_topic[key[0]]
        self._forgotten += len(gone)
        for name in [n for n, t in self._topics.items() if t.seen < cutoff]:
            del self._topics[name]

    def _stats_topic(
        self,
        name: str,
        tdoc: Mapping[str, Any],
        now: float,
        changes: list[LeadershipChange],
        stale_changes: list[tuple[str, bool, float]],
    ) -> None:
        age = tdoc.get("metadata_age")
        if isinstance(age, int | float) and not isinstance(age, bool):
            t = self._topics.get(name)
            if t is None:
                t = self._topics[name] = _Topic()
            t.seen = now
            t.metadata_age_ms = float(age)
            stale = age > self.metadata_max_age_ms
            if stale != t.stale:
                t.stale = stale
                stale_changes.append((name, stale, float(age)))
        partitions = tdoc.get("partitions")
        if not isinstance(partitions, Mapping):
            return
        parts = self._parts
        for pid, pdoc in partitions.items():
            try:
                partition = int(pid)
            except (TypeError, ValueError):
                continue
            if partition < 0 or not isinstance(pdoc, Mapping):
                continue  # -1 is librdkafka's internal UA (unassigned) partition
            leader = pdoc.get("leader")
            if not isinstance(leader, int) or isinstance(leader, bool):
                continue
            key = (name, partition)
            part = parts.get(key)
            # the common case on every tick: a known partition, same leader as last time
            if part is not None and leader == part.leader and leader >= 0 and not part.leaderless:
                part.seen = now
                continue
            self._observe_leader(key, leader, now, changes)

    def _observe_leader(
        self, key: tuple[str, int], leader: int, now: float, changes: list[LeadershipChange]
    ) -> None:
        part = self._part(key, now)
        part.seen = now
        if leader < 0:
            if not part.leaderless and part.leader is not None:
                part.leaderless = True
                self._signal(key, part, now, f"no leader (was {part.leader})", changes)
            return
        previous, was_leaderless = part.leader, part.leaderless
        part.leader, part.leaderless = leader, False
        if previous is None:
            return  # first sighting: not a move
        if leader != previous:
            part.moves.append(now)
            self._signal(key, part, now, f"leader {previous} -> {leader}", changes)
        elif was_leaderless:
            self._signal(key, part, now, f"leader {leader} back", changes)

    def _signal(
        self,
        key: tuple[str, int],
        part: _Partition,
        now: float,
        reason: str,
        changes: list[LeadershipChange],
    ) -> None:
        if part.last_signal is None or now - part.last_signal > self.policy.burst_gap_s:
            part.bursts.append(now)
        part.last_signal = now
        part.seen = now
        part.last_reason = reason
        self._evaluate(key, part, now, changes)

    def _evaluate_all(self, now: float, changes: list[LeadershipChange]) -> None:
        # Only partitions out of STABLE can change without a new signal (their quiet period
        # ends); a STABLE one changes only through _signal, which evaluates it.
        for key, part in list(self._unsettled.items()):
            self._evaluate(key, part, now, changes)

    def _evaluate(
        self,
        key: tuple[str, int],
        part: _Partition,
        now: float,
        changes: list[LeadershipChange],
    ) -> None:
        policy = self.policy
        _prune(part, now - policy.window_s)
        quiet = part.last_signal is None or now - part.last_signal >= policy.quiet_period_s
        churn = (
            len(part.moves) >= policy.churn_leader_changes
            or len(part.bursts) >= policy.churn_bursts
        )
        if quiet:
            new = LeadershipState.STABLE
        elif churn or part.state is LeadershipState.SUSTAINED_CHURN:
            new = LeadershipState.SUSTAINED_CHURN
        else:
            new = LeadershipState.TRANSIENT_BURST
        if new is part.state:
            return
        if new is LeadershipState.STABLE:
            reason = f"quiet for {policy.quiet_period_s:g} s"
        elif new is LeadershipState.SUSTAINED_CHURN:
            reason = (
                f"{len(part.moves)} leader changes and {len(part.bursts)} bursts within "
                f"{policy.window_s:g} s (last: {part.last_reason})"
            )
        else:
            reason = part.last_reason
        changes.append(
            LeadershipChange(
                topic=key[0],
                partition=key[1],
                previous=part.state,
                state=new,
                at=now,
                reason=reason,
                leader=None if part.leaderless else part.leader,
                leader_changes=len(part.moves),
                bursts=len(part.bursts),
                errors=len(part.errors),
                window_s=policy.window_s,
                classification=part.last_error,
            )
        )
        part.state = new
        part.since = now
        if new is LeadershipState.STABLE:
            self._unsettled.pop(key, None)
        else:
            self._unsettled[key] = part

    def _emit(
        self, changes: list[LeadershipChange], stale_changes: list[tuple[str, bool, float]]
    ) -> None:
        for topic, stale, age in stale_changes:
            log = self._log.warning if stale else self._log.info
            log(
                STALE_EVENT,
                topic=topic,
                stale=stale,
                metadata_age_ms=age,
                metadata_max_age_ms=self.metadata_max_age_ms,
            )
        if not changes:
            return
        with self._lock:
            listeners = list(self._listeners)
        for change in changes:
            log = self._log.info if change.state is LeadershipState.STABLE else self._log.warning
            log(
                EVENT,
                topic=change.topic,
                partition=change.partition,
                state=change.state.value,
                previous_state=change.previous.value,
                reason=change.reason,
                leader=change.leader,
                leader_changes=change.leader_changes,
                bursts=change.bursts,
                errors=change.errors,
                window_s=change.window_s,
            )
            for listener in listeners:
                try:
                    listener(change)
                except Exception:  # a listener must not break the client's callback
                    self._log.warning("leadership_listener_failed", exc_info=True)


# Every Kafka error code kresilient classifies as LEADERSHIP, from the public API only: the
# codes confluent-kafka names, their names and librdkafka's description text.
_LEADERSHIP_CODES: Final[tuple[int, ...]] = tuple(
    sorted(
        {
            code
            for code in vars(KafkaError).values()
            if isinstance(code, int)
            and not isinstance(code, bool)
            and classify(code).category is ErrorCategory.LEADERSHIP
        }
    )
)
_LEADERSHIP_NAMES: Final[Mapping[str, int]] = {
    classify(code).name: code for code in _LEADERSHIP_CODES
}
_LEADERSHIP_DESCRIPTIONS: Final[tuple[tuple[str, int], ...]] = tuple(
    (KafkaError(code).str(), code) for code in _LEADERSHIP_CODES
)


def _leadership_code_in(message: str) -> int | None:
    for m in _ERROR_NAME.finditer(message):
        code = _LEADERSHIP_NAMES.get(m.group("name"))
        if code is not None:
            return code
    for desc, code in _LEADERSHIP_DESCRIPTIONS:
        if desc in message:
            return code
    return None
