"""Share groups (KIP-932): a worker queue on Kafka with kresilient's guarantees.

:class:`ResilientShareConsumer` handles each record of a share group with a handler and
acknowledges it after the outcome: ACCEPT, RELEASE for a retry (the broker's delivery count is
the attempt number), the dead letter then ACCEPT (or REJECT without a dead-letter policy), an
outage hold, and handlers that outlive the acquisition lock reported. See docs/share-groups.md.
"""

from __future__ import annotations

from kresilient.share._consumer import (
    ResilientShareConsumer,
    ShareConsumerStats,
    configure_share_group,
    share_consumer_config,
)

__all__ = [
    "ResilientShareConsumer",
    "ShareConsumerStats",
    "configure_share_group",
    "share_consumer_config",
]
