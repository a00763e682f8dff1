"""A bad record or a bad dependency? The evidence across records (issue 36, item 1).

A handler that fails can mean two very different things: the *record* is bad (dead-letter it,
move on) or a *dependency* is down (every record fails, none is bad: dead-lettering them empties
the topic into the DLQ). One failure cannot tell them apart; several records can:

* a record the retry policy does not retry (poison: deserialization, validation) is bad;
* a record that **keeps failing while other records succeed** is bad: it is dead-lettered once
  its :class:`~kresilient.RetryPolicy` is exhausted;
* **distinct records failing in a row** with a retriable error and no success between is a
  dependency outage: the consumer holds the records (paused, polling on) and retries the SAME
  record under its outage policy (capped exponential backoff) until a success or the outage
  limit, dead-letters nothing meanwhile, and reports it (``health().outage``, ``/ready``, the
  ``kresilient.consumer.dependency_outage`` gauge, one WARNING when it starts and one when it
  ends, a reminder at most once a minute);
* a classified outage (a Schema Registry 5xx/429/timeout, :mod:`._registry`) is an outage at
  its first failure: the classification is the evidence.

A record of the consumer's retry topics failed before and comes due when its tier says, often
together with others: its failure is no new evidence and starts no outage (the consumer does
not report it), but during an outage it is held like any record; the tiers are its retry policy.

The undecided case: a record whose retry policy is exhausted while nothing else was handled
since its first failure (one partition, everything behind it waiting). It may be poison, or
the first victim of an outage. :meth:`OutageDetector.exhausted` answers
:attr:`OutageDecision.PROBE`: the consumer tries the NEXT record of that partition once,
keeping the failed one held (its offset is not passed). The probe succeeding is the evidence
that the failed record is bad (dead-lettered; the partition goes back to the record after it,
each record in its turn, and the probe, handled out of turn, is not handled again); the probe
failing too (a distinct record) is the evidence of an outage (the failed record is held and
retried; the probe record is fetched again after it). A probe that proves nothing (itself
poison, a skipped duplicate) moves the probe on to the record after it; when there is no next
record, the failed record is retried under the outage policy and probed again.

:class:`OutageDetector` is pure state (no I/O, no logging, an injectable clock) shared by the
sync and asyncio consumers; the consumer owns the holds, the logs and the probe mechanics.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Hashable
from typing import Any, Final

__all__ = ["OutageDecision", "OutageDetector"]

#: How often a lasting outage is logged again (with the failures held back meanwhile).
REMINDER_S: Final = 60.0


class OutageDecision(enum.Enum):
    """What to do with a record whose :class:`~kresilient.RetryPolicy` is exhausted."""

    DEAD_LETTER = "dead_letter"  #: other records succeeded since its first failure: it is bad
    HOLD = "hold"  #: an outage is on: hold it under the outage policy, dead-letter nothing
    PROBE = "probe"  #: no evidence yet: try the next record of its partition, keep it held


class OutageDetector:
    """Decides *record* vs *dependency* from the failures and successes of all records.

    Call :meth:`success` when a record (or a batch of records) was handled, :meth:`failure`
    for every retriable failure (not for poison, which is no evidence either way), and
    :meth:`exhausted` when a record's retry policy gave up. Records are any hashable identity
    (``(topic, partition, offset)``). Thread-safety: one thread calls the mutators; other
    threads may read :meth:`snapshot` and :attr:`active`.

    Example (what a consumer does)::

        detector = OutageDetector()
        mark = detector.mark()                      # at a record's first failure
        started = detector.failure(key, error_type="ConnectionError", error=text)
        if detector.active: ...                     # hold it under the outage policy
        elif retry_policy_exhausted:
            decision = detector.exhausted(mark)     # DEAD_LETTER / HOLD / PROBE
        ended = detector.success()                  # True: log the end, resume the holds
    """

    __slots__ = (
        "_clock",
        "_last",
        "_logged_at",
        "_successes",
        "active",
        "error",
        "error_type",
        "failures",
        "held_back",
        "last_duration",
        "last_failures",
        "outages",
        "record",
        "reminder_s",
        "since",
    )

    def __init__(
        self, *, reminder_s: float = REMINDER_S, clock: Callable[[], float] | None = None
    ) -> None:
        self.reminder_s = reminder_s
        self._clock = clock or time.monotonic
        self._successes = 0  #: success events so far (a sequence number, see :meth:`mark`)
        self._last: Hashable | None = None  #: last record failed since the last success
        self._logged_at = 0.0
        self.active = False  #: a dependency outage is on
        self.since: float | None = None  #: clock time it started
        self.error_type: str | None = None  #: the exception type that started it
        self.error: str | None = None  #: its text (as given: the caller redacts)
        self.record: Hashable | None = None  #: the record whose failure started it
        self.failures = 0  #: failed attempts during the current outage
        self.held_back = 0  #: failures since the last log line (for a reminder)
        self.outages = 0  #: outages so far
        self.last_duration: float | None = None  #: seconds the last ended outage lasted
        self.last_failures = 0  #: failed attempts during the last ended outage

    # ------------------------------------------------------------------ evidence

    def mark(self) -> int:
        """The success sequence number now: keep it with a record's first failure and give
        it to :meth:`exhausted` (successes after it are evidence the record is bad)."""
        return self._successes

    def success(self) -> bool:
        """Records were handled. True when this ends an outage (log it, resume the holds)."""
        self._successes += 1
        self._last = None
        if not self.active:
            return False
        now = self._clock()
        self.active = False
        self.last_duration = now - (self.since if self.since is not None else now)
        self.last_failures = self.failures
        return True

    def failure(
        self,
        record: Hashable,
        *,
        error_type: str = "",
        error: str = "",
        classified: bool = False,
    ) -> bool:
        """A retriable failure of ``record``. True when this starts an outage.

        ``classified``: the error itself says the dependency is down (a Schema Registry
        outage): an outage at once. Otherwise it starts when ``record`` differs from the
        record that failed last, with no success between.
        """
        if self.active:
            self.failures += 1
            self.held_back += 1
            return False
        distinct = self._last is not None and self._last != record
        self._last = record
        if not (classified or distinct):
            return False
        self._start(record, error_type, error)
        return True

    def exhausted(self, mark: int) -> OutageDecision:
        """A record's retry policy gave up; ``mark``: :meth:`mark` at its first failure."""
        if self.active:
            return OutageDecision.HOLD
        if self._successes != mark:
            return OutageDecision.DEAD_LETTER  # it kept failing while other records succeeded
        return OutageDecision.PROBE

    def _start(self, record: Hashable, error_type: str, error: str) -> None:
        now = self._clock()
        self.active = True
        self.since = self._logged_at = now
        self.error_type, self.error, self.record = error_type, error, record
        self.failures = 1
        self.held_back = 0
        self.outages += 1

    # ------------------------------------------------------------------ reporting

    def reminder(self) -> int | None:
        """During an outage, at most once per ``reminder_s``: the failures held back since the
        last line (log a reminder with it); ``None`` otherwise."""
        if not self.active:
            return None
        now = self._clock()
        if now - self._logged_at < self.reminder_s:
            return None
        self._logged_at = now
        held, self.held_back = self.held_back, 0
        return held

    def duration(self) -> float:
        """Seconds the current outage has lasted (0 when there is none)."""
        since = self.since
        if not self.active or since is None:
            return 0.0
        return max(self._clock() - since, 0.0)

    def snapshot(self) -> dict[str, Any] | None:
        """For ``health()``: the current outage, or ``None``."""
        if not self.active:
            return None
        return {
            "since_s": round(self.duration(), 3),
            "error_type": self.error_type,
            "error": self.error,
            "failures": self.failures,
            "outages": self.outages,
        }
