"""All three brokers stopped for longer than the delivery timeout while a spooled producer
keeps producing: nothing is reported lost, everything is delivered after the restart.

Issue 20 acceptance 2 (down for 3 minutes): the cluster is down while the producer keeps
producing (~1,000 messages a second) for eighteen delivery timeouts. librdkafka never times
a spooled message out (the spool hands it ``message.timeout.ms=0``); the delivery timeout is
when the spool reports the outage (``spool_delivery_deferred``) and when the unspooled control
fails its messages. What the test proves is an outage past that timeout, not its length: CI
runs 18 s at ``message.timeout.ms=1000`` (3 minutes at 10 s took 264 s of a CI run, issue 39;
then 36 s at 2 s); ``KRESILIENT_SPOOL_OUTAGE_S=180`` runs the acceptance's 3 minutes, the
timeout scaled to keep eighteen. A producer without a spool in the same outage is the negative
control: it reports the messages failed.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import structlog
import structlog.testing
from _cluster_helpers import start_side_by_side
from _producer_helpers import header_dict, read_back
from confluent_kafka import KafkaError, KafkaException

from kresilient.dedupe import Deduplicator
from kresilient.errors import DeliveryError, ErrorCategory
from kresilient.producer import ResilientProducer, Spool
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

DOWN_S = float(os.environ.get("KRESILIENT_SPOOL_OUTAGE_S", "18"))
TIMEOUT_MS = round(DOWN_S * 1000 / 18)
KEYS = 20


def _restart_all(cluster: KafkaCluster, topic: str) -> None:
    """Start every stopped node. In parallel: a combined KRaft node alone has no controller
    quorum and gives up. ``KafkaCluster.start`` checks every node while it waits, so a
    sibling caught between "expected up" and its new process can make one call raise; the
    node it started is running anyway, and a node that did not come up is started again once
    the others form a quorum (then ``heal`` waits for full ISRs)."""
    start_side_by_side(cluster, [n for n in cluster.node_ids if not cluster.running(n)])
    cluster.heal([topic], timeout=180)


_LEADER_NOT_BACK = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._UNKNOWN_PARTITION,
)


def _later_written(bootstrap: str, topic: str) -> int:
    """How many ``later-`` records the topic holds; 0 while the restarted leader does not
    answer for its partition yet (the watermark request can meet NOT_LEADER_FOR_PARTITION
    right after ``start``: seen once on a machine at a load of 12)."""
    try:
        return sum(m.value().startswith(b"later-") for m in read_back(bootstrap, topic))
    except KafkaException as exc:
        if exc.args[0].code() not in _LEADER_NOT_BACK:
            raise
        return 0


def test_cluster_down_longer_than_delivery_timeout_loses_nothing(
    kafka_cluster, topic_factory, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=3)
    control_topic = topic_factory(partitions=1)
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "message.timeout.ms": TIMEOUT_MS,
    }
    captured = structlog.testing.CapturingLogger()
    spooled = ResilientProducer(
        config,
        spool=Spool(tmp_path / "spool.db"),
        logger=structlog.wrap_logger(captured, processors=[]),
    )
    control = ResilientProducer(config)
    produced = 0
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_producing() -> None:
        nonlocal produced
        try:
            while not stop.is_set():
                for _ in range(100):
                    spooled.produce(topic, b"%07d" % produced, key=b"k%02d" % (produced % KEYS))
                    produced += 1
                spooled.poll(0.1)  # paces the stream: ~1,000 messages a second
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=keep_producing)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while produced < 3_000:
            assert time.monotonic() < deadline and not errors, errors
            time.sleep(0.05)  # waiting for the producer thread's progress (a condition)
        *first, last = kafka_cluster.node_ids
        for node in first:
            kafka_cluster.stop(node)
        # The last node has no controller quorum left to shut down under: SIGTERM waited
        # stop()'s 60 s timeout and then SIGKILLed it anyway.
        kafka_cluster.kill(last)
        down_at = time.monotonic()
        for i in range(100):
            control.produce(control_topic, b"c%d" % i)
        with pytest.raises(DeliveryError) as lost:  # negative control: the outage is real
            control.flush(TIMEOUT_MS / 1000 + 10)
        assert {f.classification.category for f in lost.value.failures} == {
            ErrorCategory.DELIVERY_TIMEOUT
        }
        while time.monotonic() - down_at < DOWN_S:
            assert not errors, errors
            time.sleep(0.5)  # the outage lasts DOWN_S; the producer thread keeps producing
        during = produced
        # The outage was noticed and reported, and nothing was reported failed.
        deferred = [
            c.kwargs for c in captured.calls if c.kwargs["event"] == "spool_delivery_deferred"
        ]
        assert deferred and deferred[0]["category"] == "DELIVERY_TIMEOUT", deferred
        assert spooled.health().failed_total == 0 and spooled.health().spooled > 0
    finally:
        _restart_all(kafka_cluster, topic)
        stop.set()
        worker.join(60)
    assert not errors, errors
    result = spooled.flush(180)
    assert result is not None and result.complete, result
    spooled.close()
    control.close(0)
    assert produced > during > 3_000

    records = read_back(kafka_cluster.bootstrap_servers, topic)
    seen: dict[int, int] = defaultdict(int)
    order: dict[bytes, list[int]] = defaultdict(list)
    dedupe = Deduplicator()
    for msg in records:
        i = int(msg.value())
        seen[i] += 1
        if seen[i] > 1:
            assert header_dict(msg).get("kresilient.possible.duplicate") == b"true"
        if not dedupe.is_duplicate(msg):
            dedupe.processed(msg)
            order[msg.key()].append(i)
    assert set(seen) == set(range(produced))
    for key, indices in order.items():
        assert indices == sorted(indices) and len(indices) == len(set(indices)), key


def test_messages_queued_past_the_delivery_timeout_keep_their_order(
    kafka_cluster: KafkaCluster, topic_factory, tmp_path: Path
) -> None:
    """A partition without a leader for longer than ``message.timeout.ms``: the messages
    queued for it before the outage are written before the ones queued after, even when the
    application does not poll while the partition comes back.

    Before the fix librdkafka timed the first messages out inside its queue and sent the
    later ones as soon as the leader returned; the spool took the first ones back only when
    the application next polled and re-sent them after the later ones (the CI run of
    2026-11-26 12:15 saw one key reordered this way in the 3-minute outage above).
    """
    timeout_ms = 4_000
    topic = topic_factory(partitions=1, replication_factor=1)
    leader = kafka_cluster.leader(topic)
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "message.timeout.ms": timeout_ms,
    }
    spooled = ResilientProducer(config, spool=Spool(tmp_path / "order.db"))
    control = ResilientProducer(config)
    try:
        spooled.produce(topic, b"warm", key=b"k")
        control.produce(topic, b"control-warm", key=b"k")
        assert spooled.flush(60).complete  # type: ignore[union-attr]
        control.flush(60)
        kafka_cluster.stop(leader)
        down_at = time.monotonic()
        first = [b"first-%03d" % i for i in range(100)]
        for value in first:
            spooled.produce(topic, value, key=b"k")
        for i in range(10):
            control.produce(topic, b"control-%d" % i, key=b"k")
        # Negative control: an unspooled producer reports the outage as delivery timeouts.
        with pytest.raises(DeliveryError) as lost:
            control.flush(timeout_ms / 1000 + 30)
        assert len(lost.value.failures) == 10
        assert {f.classification.category for f in lost.value.failures} == {
            ErrorCategory.DELIVERY_TIMEOUT
        }
        assert time.monotonic() - down_at > timeout_ms / 1000  # the outage outlasted it
        kafka_cluster.start(leader)
        # The spooled producer is not polled from here until every message is in the topic.
        later = [b"later-%03d" % i for i in range(100)]
        for value in later:
            spooled.produce(topic, value, key=b"k")
        # Wait (without polling the producer) until librdkafka has written the later ones.
        deadline = time.monotonic() + 120
        while _later_written(kafka_cluster.bootstrap_servers, topic) < len(later):
            assert time.monotonic() < deadline, "the later messages were never written"
            time.sleep(0.5)  # polling the topic for a condition with a deadline
        result = spooled.flush(120)
        assert result is not None and result.complete, result
    finally:
        if not kafka_cluster.running(leader):
            kafka_cluster.start(leader)
        spooled.close(10)
        control.close(0)
    values = [
        m.value()
        for m in read_back(kafka_cluster.bootstrap_servers, topic)
        if not m.value().startswith(b"control-")
    ]
    firsts = list(dict.fromkeys(values))  # first copies, in topic order
    assert firsts == [b"warm", *first, *later], "the re-sent messages came after later ones"
