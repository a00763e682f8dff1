"""ProducerHealth: what :meth:`ResilientProducer.health` reports, and broker counts from stats."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BrokerStats", "ProducerHealth", "broker_stats"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerStats:
    """Brokers of the cluster (from librdkafka statistics): how many are connected."""

    up: int
    total: int


def broker_stats(stats: Mapping[str, Any]) -> BrokerStats:
    """Count real brokers (bootstrap placeholders excluded) and those in state ``UP``."""
    brokers = stats.get("brokers") or {}
    real = [b for b in brokers.values() if int(b.get("nodeid", -1)) >= 0]
    return BrokerStats(up=sum(1 for b in real if b.get("state") == "UP"), total=len(real))


@dataclass(frozen=True, kw_only=True)
class ProducerHealth:
    """A point-in-time view of a :class:`~kresilient.ResilientProducer` for health checks.

    ``in_flight`` is librdkafka's queue length: messages queued, in flight or awaiting their
    delivery report, plus callbacks not served yet. ``brokers_up``/``brokers_total`` are
    ``None`` until the first statistics arrive (``statistics.interval.ms``); librdkafka
    connects on demand, so an idle broker may not count as up. ``leadership`` maps
    ``"topic[partition]"`` to the :class:`~kresilient.LeadershipState` name. ``healthy`` is
    False when the producer is closed, hit a fatal error, sees no broker up, or a partition
    is in sustained churn.
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
    monitor: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def healthy(self) -> bool:
        """True unless closed, fatally failed, cut off from every broker, or churning."""
        return (
            not self.closed
            and self.fatal_error is None
            and self.brokers_up != 0
            and not self.sustained_churn
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (for a health endpoint), including ``healthy``."""
        out = dataclasses.asdict(self)
        out["healthy"] = self.healthy
        return out
