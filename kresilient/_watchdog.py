"""Stalls (issue 42): the one "no progress since" rule and the bounded call around a close.

* :class:`NoProgress`: since when a piece of work that is expected to move has not moved.
  The consumer's probes keep one per partition (``/ready``), the producer one for its
  delivery reports; both ask it the same question, :meth:`NoProgress.stalled`.
* :class:`StallReport`: a stall said once: one WARNING when it begins (what stopped, since
  when), one INFO when progress resumes, nothing in between however often it is checked.
* :func:`bounded_call`: run a call that librdkafka may never return from (``close()`` with a
  frozen broker or group coordinator: confluent-kafka-python #1667) in a daemon thread and
  wait for it at most a bound. A daemon thread left behind does not keep the process alive.

A leaf module: it imports nothing from kresilient, so every client may use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["NoProgress", "StallReport", "bounded_call"]

T = TypeVar("T")


class NoProgress:
    """Since when the work watched made no progress (monotonic seconds).

    ``moved(now)`` on every sign of progress, and also when nothing is expected of the work
    (caught up, nothing queued): an idle client is never stalled.
    """

    __slots__ = ("since",)

    def __init__(self, now: float | None = None) -> None:
        self.since = time.monotonic() if now is None else now

    def moved(self, now: float) -> None:
        """Progress (or nothing expected): the clock starts again."""
        self.since = now

    def quiet_for(self, now: float) -> float:
        """Seconds since the last progress."""
        return max(0.0, now - self.since)

    def stalled(self, now: float, limit: float) -> bool:
        """No progress for longer than ``limit`` seconds."""
        return now - self.since > limit


class StallReport:
    """One stall of one client, said once.

    ``begin(reason, quiet_s)`` logs ``event`` at WARNING the first time (``reason``: what
    stopped; ``stalled_since``: the wall-clock time progress stopped) and does nothing while
    the stall lasts; ``end()`` logs ``<event>_cleared`` at INFO once progress resumes.
    """

    __slots__ = ("_event", "_log", "reason", "since", "stalls")

    def __init__(self, log: Any, event: str) -> None:
        self._log = log
        self._event = event
        #: what stopped, while a stall lasts (``None``: no stall)
        self.reason: str | None = None
        #: wall-clock time (``time.time()``) progress stopped, while a stall lasts
        self.since: float | None = None
        #: stalls reported so far
        self.stalls = 0

    @property
    def active(self) -> bool:
        return self.reason is not None

    def begin(self, reason: str, quiet_s: float, **fields: Any) -> bool:
        """Report the stall unless already reported; True if this call reported it."""
        if self.reason is not None:
            return False
        self.reason = reason
        self.since = time.time() - quiet_s
        self.stalls += 1
        self._log.warning(
            self._event,
            reason=reason,
            stalled_since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since)),
            quiet_s=round(quiet_s, 1),
            **fields,
        )
        return True

    def end(self, **fields: Any) -> bool:
        """Progress resumed: say so once; True if a stall was cleared."""
        if self.reason is None:
            return False
        since = self.since or time.time()
        self.reason = self.since = None
        self._log.info(
            f"{self._event}_cleared", stalled_for_s=round(time.time() - since, 1), **fields
        )
        return True


def bounded_call(fn: Callable[[], T], timeout: float, *, name: str) -> tuple[bool, T | None]:
    """Call ``fn`` in a daemon thread; wait at most ``timeout`` seconds for it.

    Returns ``(True, result)`` when it returned in time (an exception it raised is raised
    here), ``(False, None)`` when it did not: it goes on in the background and the caller
    decides what to say. The thread is a daemon: a call librdkafka never returns from does
    not keep the process from exiting.
    """
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller's thread
            box.append((False, exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    try:
        thread.start()
    except RuntimeError:  # no new thread at interpreter shutdown: call it here
        run()
    else:
        thread.join(max(0.0, timeout))
    if not box:
        return False, None
    ok, value = box[0]
    if not ok:
        raise value
    return True, value
