"""ProducerHealth: what :meth:`ResilientProducer.health` reports, and broker counts from stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["BrokerStats", "ProducerHealth", "broker_stats"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerStats:
    """Brokers of the cluster (from librdkafka statistics): how many are connected."""

    up: int
    total: int


#: Broker states that do not mean "down": connected, or never needed yet. librdkafka connects
#: on demand, so a broker leading none of the partitions produced to stays in INIT; counting
#: it down made a healthy 3-node cluster read "1 of 2 up".
_NOT_DOWN: Final = frozenset({"UP", "INIT"})


def broker_stats(stats: Mapping[str, Any]) -> BrokerStats:
    """Count real brokers (bootstrap placeholders excluded) and those not down.

    A broker is up when connected (``UP``) or idle (``INIT``: never needed yet, as librdkafka
    connects on demand); one whose connection failed or dropped (``DOWN``, ``CONNECT``,
    ``TRY_CONNECT`` ...) is not.
    """
    brokers = stats.get("brokers") or {}
    real = [b for b in brokers.values() if int(b.get("nodeid", -1)) >= 0]
    return BrokerStats(up=sum(1 for b in real if b.get("state") in _NOT_DOWN), total=len(real))


@dataclass(frozen=True, kw_only=True)
class ProducerHealth:
    """A point-in-time view of a :class:`~kresilient.ResilientProducer` for health checks.

    ``in_flight`` is librdkafka's queue length: messages queued, in flight or awaiting their
    delivery report, plus callbacks not served yet. ``brokers_up``/``brokers_total`` come
    from the latest statistics (``statistics.interval.ms``): connected and idle brokers
    (librdkafka connects on demand) count as up, brokers whose connection failed do not.
    Before the first statistics, ``health()`` asks the cluster for its metadata (bounded at
    one second): the brokers listed there are the live ones; no answer gives ``brokers_up=0``
    and ``brokers_total=None``. Both are ``None`` once closed. ``leadership`` maps
    ``"topic[partition]"`` to the :class:`~kresilient.LeadershipState` name. ``healthy`` is
    False when the producer is closed, hit a fatal error, sees no broker up, or a partition
    is in sustained churn, or while the progress watchdog reports a stall (``stalled``: what
    stopped; ``stalled_since``: wall-clock time the last delivery report was seen;
    ``stalls``: stalls reported so far; docs/stalls.md), or after a ``flush(timeout)`` that
    returned with messages left, until a ``flush()`` leaves nothing or the queue is seen
    empty (``stalled`` names the count; ``stalled_since``: when that flush began).
    """

    client_id: str
    closed: bool
    fatal_error: str | None
    brokers_up: int | None
    brokers_total: int | None
    in_flight: int
    produced: int
    failed_total: int
    failed_since_flush: int
    backpressure_waits: int
    recreations: int
    callback_errors: int
    leadership: dict[str, str]
    sustained_churn: tuple[str, ...]
    stale_metadata: tuple[str, ...]
    metadata_age_ms: dict[str, float]
    last_error: str | None
    last_error_at: float | None
    #: With a spool: messages stored and not acknowledged yet (``None`` without a spool).
    spooled: int | None = None
    #: The progress watchdog (or a timed-out flush): what stopped while a stall lasts
    #: (``None``: no stall).
    stalled: str | None = None
    #: Wall-clock time (``time.time()``) of the last progress, while a stall lasts.
    stalled_since: float | None = None
    #: Stalls reported over the producer's life (the watchdog's and timed-out flushes).
    stalls: int = 0
    monitor: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def healthy(self) -> bool:
        """True unless closed, fatally failed, cut off from every broker, churning, or
        stalled."""
        return (
            not self.closed
            and self.fatal_error is None
            and self.brokers_up != 0
            and not self.sustained_churn
            and self.stalled is None
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (for a health endpoint), including ``healthy``."""
        out = dataclasses.asdict(self)
        out["healthy"] = self.healthy
        return out
