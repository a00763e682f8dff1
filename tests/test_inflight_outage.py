"""A bad record or a bad dependency with many records of a partition in flight (issue 40,
acceptance 4), on the real cluster.

``ResilientConsumer(ordering="key")`` with its default outage detection: 1 % poison records
and a dependency outage in the same run. Distinct records failing with no success between
are a dependency outage: the records in hand are held (never dead-lettered, their
RetryPolicy not spent), nothing new starts, and one held record at a time is tried again
under ``outage_retry``; the first success ends the outage and the held records run again.
So exactly the poison records reach the DLQ, each key keeps its offset order, no committed
offset ever passes a record not handled yet (sampled during the run), and the outage, longer
than the consumer's 2 s stall bound, is reported as an outage and not as a stall.

The control runs the same workload beside it with ``outage_retry=None``: the outage's records
exhaust their RetryPolicy and are dead-lettered until its circuit breaker stops it (proof the
outage was real).

The outage lasts ``KRESILIENT_KEYED_OUTAGE_S`` seconds: 8 in CI, 30 for issue 40's literal
acceptance (``KRESILIENT_KEYED_OUTAGE_S=30 .venv/bin/python -m pytest
tests/test_inflight_outage.py``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import structlog
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import Runner, TopicFactory, config, produce, wait_for, with_dlq

from kresilient.clusterinfo import committed_offsets
from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.errors import CircuitBreakerOpenError
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

OUTAGE_S = float(os.environ.get("KRESILIENT_KEYED_OUTAGE_S", "8"))
RECORDS = 600
KEYS = 60
PARTITIONS = 3
IN_FLIGHT = 8
#: the outage starts once this many records were handled
OUTAGE_AFTER = 150
RETRY = RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.2))
#: short waits so the first probe after the outage's end is soon
OUTAGE_RETRY = RetryPolicy(
    stop=tenacity.stop_after_delay(600),
    wait=tenacity.wait_exponential(multiplier=0.2, max=1.0),
    retry=tenacity.retry_always,
)


class _Workload:
    """One topic's records, a handler with poison records and a dependency outage, and what
    it saw."""

    def __init__(self, cluster: KafkaCluster, topic_factory: TopicFactory) -> None:
        self.topic, self.dlq = with_dlq(topic_factory, partitions=PARTITIONS)
        items = []
        self.poison: set[bytes] = set()
        for i in range(RECORDS):
            value = b"poison-%d" % i if i % 100 == 57 else b"order-%d" % i
            if value.startswith(b"poison"):
                self.poison.add(value)
            items.append((b"k%d" % (i % KEYS), value, None, i % PARTITIONS))
        produce(cluster.bootstrap_servers, self.topic, items)
        self.lock = threading.Lock()
        self.handled: dict[tuple[int, int], bytes] = {}  #: (partition, offset) -> value
        self.by_key: dict[bytes, list[int]] = {}
        self.successes = 0
        self.failed_calls = 0  #: handler calls that failed because of the outage
        self.outage_start: float | None = None
        self.outage_reported = False

    def handle(self, msg: Message) -> None:
        value = msg.value() or b""
        if value.startswith(b"poison"):
            raise ValueError(f"not an order: {value!r}")  # not retried: dead-lettered at once
        now = time.monotonic()
        with self.lock:
            if self.outage_start is None and self.successes >= OUTAGE_AFTER:
                self.outage_start = now
            if self.outage_start is not None and now < self.outage_start + OUTAGE_S:
                self.failed_calls += 1
                raise ConnectionError("orders-db unreachable")
            key = (msg.partition(), msg.offset())
            assert key not in self.handled, f"handled twice: {key}"
            self.handled[key] = value  # type: ignore[index]
            self.by_key.setdefault(msg.key() or b"", []).append(msg.offset())  # type: ignore[arg-type]
            self.successes += 1

    def done(self) -> bool:
        with self.lock:
            return self.successes >= RECORDS - len(self.poison)


def _committed(cluster: KafkaCluster, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets (a partition it committed nothing on: 0); retried while
    the group's coordinator moves (kresilient.clusterinfo.committed_offsets)."""
    parts = committed_offsets(
        {"bootstrap.servers": cluster.bootstrap_servers},
        group,
        [(topic, p) for p in range(PARTITIONS)],
        timeout=30,
    )
    found = {p.partition: p.offset for p in parts}
    return {p: max(found.get(p, 0), 0) for p in range(PARTITIONS)}


def _consumer(cluster: KafkaCluster, work: _Workload, **options: Any) -> ResilientConsumer:
    return ResilientConsumer(
        config(cluster),
        [work.topic],
        work.handle,
        ordering="key",
        max_in_flight=IN_FLIGHT,
        max_process_deaths=None,
        install_signal_handlers=False,
        retry=RETRY,
        **options,
    )


def test_poison_and_an_outage_with_keys_in_flight_dead_letter_exactly_the_poison(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    work = _Workload(kafka_cluster, topic_factory)
    control = _Workload(kafka_cluster, topic_factory)
    with structlog.testing.capture_logs() as logs:
        # a 2 s stall bound: an outage is no stall (its partitions are held, not stuck)
        consumer = _consumer(kafka_cluster, work, outage_retry=OUTAGE_RETRY, stall_after_s=2.0)
        group = consumer.group_id
        unchecked = _consumer(kafka_cluster, control, outage_retry=None)
        runners = [Runner(consumer), Runner(unchecked)]
        try:
            samples = 0
            deadline = time.monotonic() + 120 + 2 * OUTAGE_S
            while not (work.done() and consumer.health().dead_lettered == len(work.poison)):
                assert time.monotonic() < deadline, "the keyed consumer did not finish"
                assert runners[0].error is None, runners[0].error
                if consumer.health().outage is not None:
                    work.outage_reported = True
                # nothing committed past a record not handled yet: the committed offset is
                # read first, the records handled (which only grow) after it
                committed = _committed(kafka_cluster, group, work.topic)
                with work.lock:
                    handled = set(work.handled)
                for partition, offset in committed.items():
                    for below in range(max(offset, 0)):
                        assert (partition, below) in handled or _is_poison(
                            work, partition, below
                        ), f"committed {offset} on partition {partition} past {below}"
                samples += 1
            wait_for(
                lambda: (
                    control.outage_start is not None
                    and time.monotonic() > control.outage_start + OUTAGE_S
                    and unchecked.health().dead_lettered > len(control.poison)
                ),
                60 + OUTAGE_S,
                "the control's outage records dead-lettered",
            )
        finally:
            for runner in runners:
                runner.stop()
    assert runners[0].error is None, runners[0].error
    # the control dead-lettered the outage's records until its circuit breaker stopped it
    assert runners[1].error is None or isinstance(runners[1].error, CircuitBreakerOpenError)
    assert samples > 0
    # exactly the poison records in the DLQ, byte for byte
    letters = read_back(kafka_cluster.bootstrap_servers, work.dlq)
    assert sorted(m.value() or b"" for m in letters) == sorted(work.poison)
    # every other record handled once, each key in offset order
    assert len(work.handled) == RECORDS - len(work.poison)
    for key, offsets in work.by_key.items():
        assert offsets == sorted(offsets), key
    assert work.outage_start is not None and work.failed_calls > 0
    # the outage was reported once, started and ended; /health said so while it lasted
    events = [e["event"] for e in logs]
    assert events.count("dependency_outage_started") == 1, events
    assert events.count("dependency_outage_ended") == 1, events
    stalls = [e for e in logs if e["event"] == "consumer_stalled"]
    assert stalls == [], stalls
    assert work.outage_reported
    # held, not hammered: the records in hand when it started, then one probe at a time
    # (an 8 s outage with 0.2..1 s waits: a few dozen probes at most)
    assert work.failed_calls <= PARTITIONS * IN_FLIGHT + 4 * OUTAGE_S + 10, work.failed_calls
    # the committed offsets reach the end of every partition
    ends = _committed(kafka_cluster, group, work.topic)
    assert sum(ends.values()) == RECORDS, ends
    # the control: without outage detection the outage's records were dead-lettered
    control_letters = read_back(kafka_cluster.bootstrap_servers, control.dlq)
    outage_letters = [m for m in control_letters if m.value() not in control.poison]
    assert outage_letters, "the control dead-lettered no outage record: no outage happened"
    assert control.failed_calls > work.failed_calls


def _is_poison(work: _Workload, partition: int, offset: int) -> bool:
    """Whether the record at ``(partition, offset)`` is a poison record (records go to
    partition ``i % PARTITIONS`` in order, so its offset is ``i // PARTITIONS``)."""
    i = offset * PARTITIONS + partition
    return i % 100 == 57
