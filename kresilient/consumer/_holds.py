"""Per-partition state of :class:`~kresilient.ResilientConsumer`: retry holds, pending dead letters.

A partition is *held* while one of its messages waits for its next attempt: it is paused and
seeked back to that message, so the consumer keeps polling (no ``max.poll.interval.ms``
rebalance), other partitions keep flowing, and nothing after the held offset is processed or
committed before the message succeeds or is dead-lettered.

A dead-lettered message does not hold its partition: the messages after it are processed at
once, but the partition's stored offset stays at the dead-lettered offset until the dead-letter
write is ACKNOWLEDGED (:class:`PendingDeadLetters`), so a crash before the acknowledgement
re-delivers it.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tenacity

TP = tuple[str, int]


class Verdict(enum.Enum):
    """What to do with a message that arrives for a held partition."""

    SKIP = "skip"  #: stale (fetched before the pause/seek): drop, it will be fetched again
    RETRY = "retry"  #: the held message itself, redelivered after resume: run the handler
    RELEASE = "release"  #: the held offset is gone (retention, truncation): drop the hold


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

    def verdict(self, offset: int) -> Verdict:
        """Decide about a message at ``offset`` that arrived for this partition."""
        if not self.resumed:
            return Verdict.SKIP
        if offset == self.offset:
            return Verdict.RETRY
        return Verdict.RELEASE

    def snapshot(self) -> dict[str, Any]:
        """For ``health()``."""
        return {
            "topic": self.tp[0],
            "partition": self.tp[1],
            "offset": self.offset,
            "attempts": self.attempts,
            "resumed": self.resumed,
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
