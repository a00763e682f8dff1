"""ResilientConsumer: commit only after processing, retry without rebalance storms, keep poison.

The full description is the docstring of :mod:`kresilient.consumer._consumer`; this package
re-exports its public names.
"""

from __future__ import annotations

from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._consumer import *  # noqa: F403
from kresilient.consumer._consumer import __all__ as _consumer_all
from kresilient.consumer._events import FATAL_CONSUME_CODES
from kresilient.consumer._failures import poison
from kresilient.consumer._inflight import (
    ORDERINGS,
    Finished,
    InflightWindow,
    Ordering,
    finished_from,
)
from kresilient.consumer._offsets import positions_ahead
from kresilient.consumer._outage import OutageDecision, OutageDetector
from kresilient.consumer._parallel import finished_taken_over
from kresilient.consumer._probes import ON_STALL, ConsumerProbes, ProbeSource
from kresilient.consumer._registry import is_outage, outage_classification, registry_classification
from kresilient.consumer._support import HEAL_TIMEOUT, retire_client

# CircuitBreaker (the running state of a CircuitBreakerPolicy), poison (the classification
# of a failure the retry policy does not retry), OutageDetector (record or dependency?),
# outage_classification/is_outage (a Schema Registry outage) and ConsumerProbes/ProbeSource
# (/live, /ready and the gauges) and positions_ahead (past a transaction's markers at a
# partition's end) and retire_client/HEAL_TIMEOUT (a heal's end of the replaced librdkafka
# consumer), FATAL_CONSUME_CODES (consume errors that end the client) and the in-flight
# window's bookkeeping (InflightWindow, Finished, finished_from, ORDERINGS, Ordering:
# ordering="key"/"none") are shared with kresilient.aio.
__all__ = [
    *_consumer_all,
    "FATAL_CONSUME_CODES",
    "HEAL_TIMEOUT",
    "ORDERINGS",
    "ON_STALL",
    "CircuitBreaker",
    "ConsumerProbes",
    "Finished",
    "InflightWindow",
    "OutageDecision",
    "Ordering",
    "OutageDetector",
    "ProbeSource",
    "finished_from",
    "finished_taken_over",
    "is_outage",
    "outage_classification",
    "poison",
    "positions_ahead",
    "registry_classification",
    "retire_client",
]
