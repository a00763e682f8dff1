"""Shared helpers of the producer tests: read a topic back completely."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient


def _high_watermark(consumer: Consumer, topic: str, partition: int) -> int:
    """The partition's high watermark, asked again while the client's own metadata does not
    know the partition or its leader yet (CI at a load of 20-37, a topic of a broker thawed a
    moment before: ``_UNKNOWN_PARTITION`` although ``list_topics`` had listed it)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return int(
                consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1]
            )
        except KafkaException as exc:
            code = exc.args[0].code()
            retriable = code in (
                KafkaError._UNKNOWN_PARTITION,
                KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.NOT_LEADER_FOR_PARTITION,  # asked of a leader restarted a moment ago
            )
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # until the client's metadata names the partition's leader


def read_back(bootstrap: str, topic: str, *, timeout: float = 120.0) -> list[Message]:
    """Every record of ``topic`` from offset 0 to each partition's high watermark, in order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-back-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=30)
        parts = sorted(meta.topics[topic].partitions)
        ends = {p: _high_watermark(consumer, topic, p) for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Message] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        while len(done) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"read_back({topic}) timed out with {len(out)} records")
            # consume(n, timeout) waits out its whole timeout unless n records arrive: 0.1 s,
            # not 0.5 (about 1 s per read-back, 150 read-backs in the suite)
            for msg in consumer.consume(5000, timeout=0.1):
                err = msg.error()
                if err is None:
                    out.append(msg)
                    if msg.offset() + 1 >= ends[msg.partition()]:
                        done.add(msg.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    if msg.offset() >= ends[msg.partition()]:
                        done.add(msg.partition())
                else:
                    raise AssertionError(f"consume error: {err}")
        return out
    finally:
        consumer.close()


def header_dict(msg: Any) -> dict[str, bytes | None]:
    """A record's headers as a dict (last value wins)."""
    return dict(msg.headers() or [])


def broker_answers(bootstrap: str) -> bool:
    """Does the cluster answer a metadata request from a new client within 3 s? (The
    negative control of a frozen broker.)"""
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=3)
    except KafkaException:
        return False
    return True
