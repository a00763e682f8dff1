"""``flush(timeout)`` past its deadline is a stall (issue 42), on a real cluster.

Messages to a topic that does not exist stay queued (no metadata, no partition) until
``message.timeout.ms``: a ``flush(timeout)`` shorter than that returns with them left. A flush
that waited at least 5 s (or ``stall_after_s`` when shorter) with no delivery report at all is
reported once (``producer_flush_stalled``, naming the count), ``health()`` is false while they
stay, and the stall clears once they are reported (failed at ``message.timeout.ms``) or a
``flush()`` leaves nothing. The negative controls: a flush that completes reports nothing, and
the topic is checked to be missing (an external cluster could create it on first use).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from structlog.testing import capture_logs

from kresilient.aio import AsyncResilientProducer
from kresilient.errors import DeliveryError
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration]

EVENT = "producer_flush_stalled"
#: how long the stuck messages wait before librdkafka fails them: past a flush long enough to
#: be a stall (5 s with the default stall_after_s)
TIMEOUT_MS = 12000
#: a flush that waits long enough to tell a stall
STALL_FLUSH_S = 5.5


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")


def _events(logs: list[dict[str, Any]], event: str, client_id: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == event and e.get("client_id") == client_id]


def _config(cluster: KafkaCluster) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "client.id": f"flush-stall-{uuid.uuid4().hex[:6]}",
        "message.timeout.ms": TIMEOUT_MS,
    }


def _missing_topic(cluster: KafkaCluster) -> str:
    name = f"missing-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    assert name not in admin.list_topics(timeout=10).topics  # negative control: not there
    return name


def test_flush_past_its_deadline_is_one_stall_until_the_messages_are_reported(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    missing = _missing_topic(kafka_cluster)
    config = _config(kafka_cluster)
    producer = ResilientProducer(config)
    try:
        with capture_logs() as logs:
            # negative control: a flush that completes is no stall
            producer.produce(topic, b"delivered")
            producer.flush(30)
            assert _events(logs, EVENT, config["client.id"]) == []
            assert producer.health().healthy

            for i in range(3):
                producer.produce(missing, b"stuck-%d" % i)
            with pytest.raises(DeliveryError, match="still queued or in flight"):
                producer.flush(0.5)  # too short to tell: no stall
            assert _events(logs, EVENT, config["client.id"]) == []
            with pytest.raises(DeliveryError, match="still queued or in flight"):
                producer.flush(STALL_FLUSH_S)
            with pytest.raises(DeliveryError):
                producer.flush(0.2)  # still stuck: not said again
            stalled = _events(logs, EVENT, config["client.id"])
            assert len(stalled) == 1, stalled
            assert stalled[0]["log_level"] == "warning"
            assert stalled[0]["left"] == 3
            health = producer.health()
            assert not health.healthy
            assert health.stalled is not None and "3 message(s)" in health.stalled
            assert health.stalls == 1

            # message.timeout.ms fails them: reported, so the stall is over
            def reported() -> bool:
                producer.poll(0.2)
                return len(producer) == 0

            wait_for(reported, TIMEOUT_MS / 1000 + 30, "the stuck messages' reports")
            health = producer.health()
            assert health.stalled is None and health.healthy, health
            assert len(_events(logs, EVENT + "_cleared", config["client.id"])) == 1
            with pytest.raises(DeliveryError) as failed:
                producer.flush(30)
            assert len(failed.value.failures) == 3
            assert {f.topic for f in failed.value.failures} == {missing}
    finally:
        producer.close(0)


def test_close_past_its_deadline_is_not_reported_as_a_flush_stall(
    kafka_cluster: KafkaCluster,
) -> None:
    missing = _missing_topic(kafka_cluster)
    config = _config(kafka_cluster)
    producer = ResilientProducer(config)
    with capture_logs() as logs:
        producer.produce(missing, b"stuck")
        with pytest.raises(DeliveryError) as closed:
            producer.close(0.5)  # what close() leaves is purged and listed, not stuck
    assert len(closed.value.failures) == 1
    assert _events(logs, EVENT, config["client.id"]) == []


def test_the_asyncio_producer_reports_a_flush_past_its_deadline(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    missing = _missing_topic(kafka_cluster)
    config = _config(kafka_cluster)

    async def main() -> list[dict[str, Any]]:
        async with AsyncResilientProducer(config) as producer:
            await (await producer.produce(topic, b"delivered"))
            assert (await producer.health()).healthy  # negative control
            with capture_logs() as logs:
                await producer.produce(missing, b"stuck")
                with pytest.raises(DeliveryError):
                    await producer.flush(STALL_FLUSH_S)
                health = await producer.health()
                assert not health.healthy
                assert health.stalled is not None and "1 message(s)" in health.stalled
                # once reported (failed at message.timeout.ms) the stall is over
                deadline = time.monotonic() + TIMEOUT_MS / 1000 + 30
                while (await producer.health()).stalled is not None:
                    assert time.monotonic() < deadline, "the stall never cleared"
                    await asyncio.sleep(0.2)
                with pytest.raises(DeliveryError):
                    await producer.flush(30)
            return logs

    logs = asyncio.run(main())
    assert len(_events(logs, EVENT, config["client.id"])) == 1


def test_short_flushes_in_a_loop_on_a_healthy_producer_are_no_stall(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    """Review finding (D1): ``flush(0.01)`` polled in a loop while messages stream returned
    with messages left at almost every call and each was reported as a stall (7-10 WARNINGs
    in 8 s, ``health()`` flapping). Messages keep being delivered: no stall."""
    config = _config(kafka_cluster)
    producer = ResilientProducer(config)
    try:
        with capture_logs() as logs:
            left_over = 0
            for i in range(400):
                producer.produce(topic, b"m%d" % i)
                try:
                    producer.flush(0.01)
                except DeliveryError:
                    left_over += 1  # returned with messages still in flight, as asked
                assert producer.health().stalled is None
            producer.flush(30)
        assert left_over > 0, "no flush returned early: the loop proved nothing"
        assert _events(logs, EVENT, config["client.id"]) == []
    finally:
        producer.close(0)
