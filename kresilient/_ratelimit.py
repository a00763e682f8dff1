"""Rate-limited logging: one line per key per interval, and a count of what was held back.

The one helper behind every "log this error, but not 4,000 times a second" in kresilient
(the producer's ``error_cb``/callback failures, the consumer's per-code consume errors, the
librdkafka log bridge). A suppressed event is never silent: the next line logged for that key
carries ``suppressed=N``, the number of events held back since the previous line.

Example::

    limiter = RateLimiter(5.0)

    def on_error(err):
        allowed, suppressed = limiter.check(err.code())
        if allowed:
            log.warning("kafka_client_error", error=err.name(), suppressed=suppressed)

Thread-safe (a lock around a small dict); cheap enough for error paths, not meant for the
per-message success path.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["DEFAULT_INTERVAL", "RateLimiter"]

#: The interval kresilient's clients use for identical errors (seconds).
DEFAULT_INTERVAL: Final = 5.0


class RateLimiter:
    """Allows one event per ``key`` every ``interval_s`` seconds and counts the rest.

    ``clock`` is ``time.monotonic`` unless a test passes its own.
    """

    __slots__ = ("_clock", "_lock", "_state", "interval_s")

    def __init__(
        self, interval_s: float = DEFAULT_INTERVAL, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if interval_s < 0:
            raise ValueError("interval_s must be >= 0")
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # key -> [time of the last allowed event, events suppressed since then]
        self._state: dict[Hashable, list[float]] = {}

    def check(self, key: Hashable) -> tuple[bool, int]:
        """``(allowed, suppressed)``: log now? and how many events of ``key`` were held back
        since the last allowed one (report it in the line you log; reset on every allow)."""
        now = self._clock()
        with self._lock:
            state = self._state.get(key)
            if state is None:
                self._state[key] = [now, 0]
                return True, 0
            if now - state[0] >= self.interval_s:
                suppressed = int(state[1])
                state[0], state[1] = now, 0
                return True, suppressed
            state[1] += 1
            return False, 0

    def allow(self, key: Hashable) -> bool:
        """True when an event of ``key`` may be logged now (see :meth:`check` for the count)."""
        return self.check(key)[0]

    def suppressed(self, key: Hashable) -> int:
        """Events of ``key`` held back since its last allowed one."""
        with self._lock:
            state = self._state.get(key)
            return int(state[1]) if state is not None else 0

    def total_suppressed(self) -> int:
        """Events held back since their key's last allowed one, over every key."""
        with self._lock:
            return sum(int(s[1]) for s in self._state.values())

    def reset(self, key: Hashable | None = None) -> None:
        """Forget ``key`` (or every key): its next event is logged at once."""
        with self._lock:
            if key is None:
                self._state.clear()
            else:
                self._state.pop(key, None)
