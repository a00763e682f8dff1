"""Helpers of the exactly-once tests: read a topic back as ``read_committed`` readers see it.

``_producer_helpers.read_back`` with a short poll: librdkafka's ``consume(n, timeout)`` waits
out its whole timeout unless ``n`` records arrive, so each read-back cost two of its 0.5 s
polls (about 1 s), and the tests of ``test_consume_transform_produce.py`` read back two or
three topics each. Polled every 0.1 s, a read-back of a few records takes about 0.2 s; what
is read and the end it reads to are the same (the high watermark asked as
``_producer_helpers`` asks it). To fold into ``_producer_helpers.read_back`` (not this
session's file), then this module goes.
"""

from __future__ import annotations

import time
import uuid

from _producer_helpers import _high_watermark
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

__all__ = ["read_back"]

POLL_S = 0.1


def read_back(bootstrap: str, topic: str, *, timeout: float = 120.0) -> list[Message]:
    """Every record of ``topic`` visible to ``read_committed`` readers, from offset 0 to each
    partition's high watermark, in each partition's order."""
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
            for msg in consumer.consume(5000, timeout=POLL_S):
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
