"""Non-blocking retries through delayed retry topics (issue 17, item 1).

With ``ResilientConsumer(..., retry_topics=RetryTopicPolicy(delays=(5, 60, 600)))`` a record
whose failure the policy retries is moved aside instead of holding its partition:

* it is written to ``<topic>.retry.<delay>`` (``orders.retry.5s``, ``orders.retry.1m`` ...)
  with its original key, value and headers byte for byte, followed by ``kresilient.retry.*``
  headers (tier, due time, original coordinates, first failure, exception type);
* the source offset stays uncommitted until that write is ACKNOWLEDGED (the same mechanism as a
  dead letter: the partition flows on, its stored offset waits);
* the same consumer subscribes to the retry topics. A retry record that is not due yet pauses
  its partition and seeks back to it (a retry hold: the loop keeps polling, nothing sleeps in
  the handler, no rebalance); when it is due the partition resumes and the handler runs;
* a record failing its last tier goes to the dead-letter topic of its ORIGINAL topic, with its
  original key, value and headers (the retry headers stripped) and the original coordinates.

Order: a record moved to a retry topic no longer blocks its partition, so later records of
the same key are handled before it. Keep the in-place :class:`RetryPolicy` (no retry topics)
where per-key order matters.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Final, cast

import tenacity
from tenacity.retry import retry_base

from kresilient.consumer._support import NOT_RETRIED
from kresilient.errors import ConfigError

__all__ = ["RETRY_HEADER_PREFIX", "RetryTopicPolicy", "RetryView", "delay_name"]

RETRY_HEADER_PREFIX: Final = "kresilient.retry."
TIER: Final = RETRY_HEADER_PREFIX + "tier"
DUE: Final = RETRY_HEADER_PREFIX + "due"
ORIGINAL_TOPIC: Final = RETRY_HEADER_PREFIX + "original.topic"
ORIGINAL_PARTITION: Final = RETRY_HEADER_PREFIX + "original.partition"
ORIGINAL_OFFSET: Final = RETRY_HEADER_PREFIX + "original.offset"
ORIGINAL_TIMESTAMP: Final = RETRY_HEADER_PREFIX + "original.timestamp"
FIRST_FAILURE: Final = RETRY_HEADER_PREFIX + "first.failure"
EXCEPTION: Final = RETRY_HEADER_PREFIX + "exception.type"


def delay_name(seconds: float) -> str:
    """``2`` -> ``2s``, ``60`` -> ``1m``, ``3600`` -> ``1h``, ``0.5`` -> ``500ms``."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryTopicPolicy:
    """Retry tiers as delayed topics, then the dead-letter topic.

    Args:
        delays: seconds each tier waits before the record is handled again, in order
            (``(5, 60, 600)``: three more attempts, 5 s, 1 min and 10 min after the failures).
        retry: a tenacity retry predicate choosing the failures that go to the retry topics
            (default: all but :data:`NOT_RETRIED`, which go to the dead-letter topic at once).
        infix: topic names are ``<topic><infix><delay>`` (default ``.retry.`` ->
            ``orders.retry.5s``).

    Example::

        ResilientConsumer(conf, ["orders"], handle,
                          retry_topics=RetryTopicPolicy(delays=(5, 60, 600)))
        # create orders.retry.5s, orders.retry.1m, orders.retry.10m and orders.dlq first
    """

    delays: Sequence[float] = (5.0, 60.0, 600.0)
    retry: retry_base = dataclasses.field(
        default_factory=lambda: tenacity.retry_if_not_exception_type(NOT_RETRIED)
    )
    infix: str = ".retry."

    def __post_init__(self) -> None:
        if not self.delays or any(d <= 0 for d in self.delays):
            raise ConfigError("RetryTopicPolicy.delays must be positive seconds, at least one")
        names = [delay_name(d) for d in self.delays]
        if len(set(names)) != len(names):
            raise ConfigError(f"RetryTopicPolicy.delays name the same topic twice: {names}")

    def replace(self, **changes: Any) -> RetryTopicPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def topic(self, source: str, tier: int) -> str:
        """The retry topic of tier ``tier`` (0-based) for records of ``source``."""
        return f"{source}{self.infix}{delay_name(self.delays[tier])}"

    def topics(self, source: str) -> list[str]:
        """Every retry topic of ``source``."""
        return [self.topic(source, i) for i in range(len(self.delays))]

    def retries(self, exc: BaseException) -> bool:
        """Whether ``exc`` goes to the retry topics (the ``retry`` predicate)."""
        state = tenacity.RetryCallState(cast(Any, None), None, (), {})
        state.set_exception((type(exc), exc, exc.__traceback__))
        return bool(self.retry(state))


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class RetryView:
    """A record consumed from a retry topic, read back as its ORIGINAL record.

    ``topic()``/``partition()``/``offset()``/``timestamp()`` are the original coordinates;
    ``headers()`` the original headers (the ``kresilient.retry.*`` ones stripped), so the
    dead-letter record of a record failing its last tier is the original byte for byte.
    """

    __slots__ = ("_headers", "_msg", "_retry", "tier")

    def __init__(self, msg: Any) -> None:
        self._msg = msg
        headers = list(msg.headers() or [])
        self._headers = [(k, v) for k, v in headers if not k.startswith(RETRY_HEADER_PREFIX)]
        self._retry = {k: _text(v) for k, v in headers if k.startswith(RETRY_HEADER_PREFIX)}
        self.tier = int(self._retry.get(TIER) or 0)

    @staticmethod
    def is_retry(msg: Any) -> bool:
        """Whether ``msg`` carries the retry headers."""
        return any(k == TIER for k, _ in msg.headers() or [])

    def due_ms(self) -> int | None:
        due = self._retry.get(DUE)
        return int(due) if due else None

    def first_failure_ms(self) -> int | None:
        first = self._retry.get(FIRST_FAILURE)
        return int(first) if first else None

    def topic(self) -> str | None:
        return self._retry.get(ORIGINAL_TOPIC) or self._msg.topic()

    def partition(self) -> int | None:
        part = self._retry.get(ORIGINAL_PARTITION)
        return int(part) if part else self._msg.partition()

    def offset(self) -> int | None:
        off = self._retry.get(ORIGINAL_OFFSET)
        return int(off) if off else self._msg.offset()

    def timestamp(self) -> tuple[int, int]:
        ts = self._retry.get(ORIGINAL_TIMESTAMP)
        return (1, int(ts)) if ts else self._msg.timestamp()

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._headers)

    def key(self) -> Any:
        return self._msg.key()

    def value(self) -> Any:
        return self._msg.value()

    def leader_epoch(self) -> int | None:
        return self._msg.leader_epoch()  # type: ignore[no-any-return]


def retry_headers(
    msg: Any, *, tier: int, delay: float, exc: BaseException, now_ms: int | None = None
) -> list[tuple[str, bytes | None]]:
    """The headers of ``msg`` moved to retry tier ``tier``: its original headers byte for
    byte, then the ``kresilient.retry.*`` block (the original coordinates are kept from an
    earlier tier)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if RetryView.is_retry(msg):
        view = RetryView(msg)
        original: list[tuple[str, bytes | None]] = view.headers()
        first = view.first_failure_ms() or now_ms
        src: Any = view
    else:
        original = list(msg.headers() or [])
        first = now_ms
        src = msg
    ts_type, ts = src.timestamp()
    block = [
        (TIER, str(tier + 1)),
        (DUE, str(now_ms + round(delay * 1000))),
        (ORIGINAL_TOPIC, src.topic()),
        (ORIGINAL_PARTITION, str(src.partition())),
        (ORIGINAL_OFFSET, str(src.offset())),
        (ORIGINAL_TIMESTAMP, str(ts) if ts_type != 0 else ""),
        (FIRST_FAILURE, str(first)),
        (EXCEPTION, f"{type(exc).__module__}.{type(exc).__qualname__}"),
    ]
    return original + [(k, v.encode("utf-8")) for k, v in block if v]
