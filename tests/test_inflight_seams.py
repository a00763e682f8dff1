"""The in-flight consumer (``ordering="key"``) on a transactional topic (issue 40 x issue 35).

Every topic may be transactional: commit and abort markers take offsets that no record
arrives for, and aborted records are never delivered under ``read_committed`` (the default).
The gap-safe commit must still reach the partition's end (the committed offset equals the high
watermark, lag 0, not stuck below a marker), handle each committed record once in its key's
order, and hand none of the aborted ones to the handler. The per-partition consumer and the
batch handler get the same checks. Before the fix, each of them committed the offset of the
last marker (207 of 208): lag 1 for good, which a stall probe reads as a stuck partition.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from test_consumer_integration import Runner, TopicFactory, config, ends, wait_for, with_dlq

from kresilient.consumer import ResilientConsumer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _transactional_topic(cluster: KafkaCluster, topic: str) -> list[tuple[bytes, bytes]]:
    """Eight transactions of 25 records over 5 keys, every third one aborted; returns the
    committed (key, value) pairs in offset order."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "transactional.id": f"seam-{uuid.uuid4().hex[:8]}",
        }
    )
    producer.init_transactions(30)
    committed: list[tuple[bytes, bytes]] = []
    n = 0
    for txn in range(8):
        producer.begin_transaction()
        batch = []
        for _ in range(25):
            key, value = f"k{n % 5}".encode(), f"{txn}-{n}".encode()
            producer.produce(topic, key=key, value=value, partition=0)
            batch.append((key, value))
            n += 1
        producer.flush(30)
        if txn % 3 == 2:
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            committed.extend(batch)
    return committed


def _committed_offset(cluster: KafkaCluster, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": group})
    try:
        (part,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return part.offset
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "mode",
    [
        {"ordering": "key", "max_in_flight": 8},
        {},
        {"batch": True},
    ],
    ids=["keyed", "per_partition", "batch_handler"],
)
def test_transactional_topic_handled_once_in_key_order_and_committed_to_its_end(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, mode: dict[str, Any]
) -> None:
    topic, _ = with_dlq(topic_factory)
    committed = _transactional_topic(kafka_cluster, topic)
    # 200 records and 8 markers: the markers take offsets no record arrives for (written by
    # the coordinator after commit/abort returned, so waited for)
    wait_for(lambda: ends(kafka_cluster.bootstrap_servers, topic)[0] == 208, 60, "8 markers")
    high = 208
    lock = threading.Lock()
    seen: list[tuple[bytes, bytes]] = []

    def handle(msg: Message) -> None:
        with lock:
            seen.append((msg.key() or b"", msg.value() or b""))

    def handle_batch(msgs: list[Message]) -> None:
        for msg in msgs:
            handle(msg)

    mode = dict(mode)
    calls: dict[str, Any] = (
        {"batch_handler": handle_batch} if mode.pop("batch", False) else {"handler": handle}
    )
    cfg = config(kafka_cluster)
    consumer = ResilientConsumer(
        cfg,
        [topic],
        **calls,
        max_process_deaths=None,
        outage_retry=None,
        install_signal_handlers=False,
        **mode,
    )
    runner = Runner(consumer)
    try:
        wait_for(
            lambda: len(seen) >= len(committed) or runner.error is not None,
            120,
            "every committed record handled",
        )
        assert runner.error is None, repr(runner.error)
        # the commit reaches the end of the partition, past the last commit marker
        last: list[int] = []

        def at_end() -> bool:
            last.append(_committed_offset(kafka_cluster, cfg["group.id"], topic))
            return last[-1] == high

        try:
            wait_for(at_end, 30, f"the group committed at the high watermark {high}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; committed: {last[-1]}") from None
    finally:
        runner.stop()
    assert runner.error is None
    assert sorted(seen) == sorted(committed) and len(seen) == len(committed)  # each once
    assert not any(v.split(b"-")[0] in (b"2", b"5") for _, v in seen)  # no aborted record
    for key in {k for k, _ in committed}:
        assert [v for k, v in seen if k == key] == [v for k, v in committed if k == key]


def test_tracker_advances_only_when_nothing_is_unfinished() -> None:
    from kresilient.consumer._inflight import InflightWindow

    window: InflightWindow[int] = InflightWindow("key", max_records=4, max_bytes=1 << 20)
    window.offer(10, b"a", 1, 10)
    assert not window.advance(12)  # 10 is unfinished: a marker after it changes nothing
    assert window.committable() == 10
    (started,) = window.ready(0.0)
    window.finish(started)
    assert window.committable() == 11
    assert window.advance(12) and window.committable() == 12  # past the marker at 11
    assert not window.advance(12) and not window.advance(5)  # never backwards
    window.offer(12, b"a", 1, 12)
    assert window.committable() == 12


@pytest.mark.asyncio
async def test_asyncio_consumer_commits_a_transactional_topic_to_its_end(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The same on :class:`~kresilient.aio.AsyncResilientConsumer` (it committed 207 of 208)."""
    import asyncio

    from kresilient.aio import AsyncResilientConsumer

    topic, _ = with_dlq(topic_factory)
    committed = _transactional_topic(kafka_cluster, topic)
    wait_for(lambda: ends(kafka_cluster.bootstrap_servers, topic)[0] == 208, 60, "8 markers")
    seen: list[tuple[bytes, bytes]] = []

    async def handle(msg: Message) -> None:
        seen.append((msg.key() or b"", msg.value() or b""))

    cfg = config(kafka_cluster)
    consumer = AsyncResilientConsumer(cfg, [topic], handle)
    task = asyncio.create_task(consumer.run())
    last: list[int] = []
    try:
        deadline = asyncio.get_running_loop().time() + 90
        while len(seen) < len(committed) or not last or last[-1] != 208:
            assert asyncio.get_running_loop().time() < deadline, (len(seen), last[-1:])
            assert not task.done(), task
            await asyncio.sleep(0.5)
            if len(seen) >= len(committed):
                last.append(
                    await asyncio.to_thread(
                        _committed_offset, kafka_cluster, cfg["group.id"], topic
                    )
                )
    finally:
        consumer.stop()
        await asyncio.wait_for(task, 60)
    assert sorted(seen) == sorted(committed) and len(seen) == len(committed)
