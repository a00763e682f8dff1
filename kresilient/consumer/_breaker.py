"""The running state of a :class:`~kresilient.CircuitBreakerPolicy` (see kresilient.deadletter)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kresilient.errors import CircuitBreakerOpenError

if TYPE_CHECKING:
    from kresilient.deadletter import CircuitBreakerPolicy

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """The running state of a :class:`CircuitBreakerPolicy` (not thread-safe).

    Successes are recorded in bulk (once per consumed batch) so the hot path stays cheap.
    Time is divided into 20 buckets per window.
    """

    __slots__ = (
        "_buckets",
        "_clock",
        "_dead",
        "_msgs",
        "_width",
        "consecutive",
        "opened",
        "policy",
    )

    def __init__(
        self, policy: CircuitBreakerPolicy, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.policy = policy
        self._clock = clock or time.monotonic
        self._width = policy.window / 20
        self._buckets: deque[list[float]] = deque()  # [start, messages, dead letters]
        self._msgs = 0
        self._dead = 0
        self.consecutive = 0
        self.opened = False

    def _bucket(self, now: float) -> list[float]:
        buckets = self._buckets
        horizon = now - self.policy.window
        while buckets and buckets[0][0] + self._width <= horizon:
            old = buckets.popleft()
            self._msgs -= int(old[1])
            self._dead -= int(old[2])
        if not buckets or now >= buckets[-1][0] + self._width:
            buckets.append([now, 0, 0])
        return buckets[-1]

    def record_successes(self, count: int = 1) -> None:
        """``count`` messages were handled successfully."""
        if count <= 0:
            return
        self.consecutive = 0
        if self.policy.max_ratio is not None:
            self._bucket(self._clock())[1] += count
            self._msgs += count

    def check(self) -> None:
        """Raise :class:`~kresilient.CircuitBreakerOpenError` if one more dead letter is too
        many."""
        policy = self.policy
        if policy.max_consecutive is not None and self.consecutive + 1 > policy.max_consecutive:
            self.opened = True
            raise CircuitBreakerOpenError(
                f"{self.consecutive} consecutive dead letters: circuit breaker open "
                f"(max_consecutive={policy.max_consecutive}); the consumer stops so a bad "
                "deploy does not dead-letter a whole topic. Inspect the dead-letter topic "
                "(kresilient dlq inspect), fix, restart",
                dead_letters=self.consecutive + 1,
                window=policy.window,
            )
        if policy.max_ratio is not None:
            self._bucket(self._clock())
            msgs, dead = self._msgs + 1, self._dead + 1
            if msgs >= policy.min_messages and dead / msgs > policy.max_ratio:
                self.opened = True
                raise CircuitBreakerOpenError(
                    f"{dead} of {msgs} messages dead-lettered within {policy.window:g} s: "
                    f"circuit breaker open (max_ratio={policy.max_ratio:g}); inspect the "
                    "dead-letter topic (kresilient dlq inspect), fix, restart",
                    dead_letters=dead,
                    window=policy.window,
                )

    def record_dead_letter(self) -> None:
        """One message was dead-lettered (call :meth:`check` first)."""
        self.consecutive += 1
        if self.policy.max_ratio is not None:
            bucket = self._bucket(self._clock())
            bucket[1] += 1
            bucket[2] += 1
            self._msgs += 1
            self._dead += 1

    def snapshot(self) -> dict[str, Any]:
        """State for ``health()``."""
        return {
            "open": self.opened,
            "consecutive_dead_letters": self.consecutive,
            "window_messages": self._msgs,
            "window_dead_letters": self._dead,
        }
