"""Is a record's dead letter already written? (share groups: one dead letter per record).

A share-group member writes a poison record's dead letter, waits for its acknowledgement and
then ACCEPTs the record. Nothing makes the two one step: a member that dies between them (a
SIGKILL, an OOM kill) leaves the dead letter written and the record acquired, and once its
lock ends the broker delivers the record again, to another member, which would write a
second dead letter. KIP-1191 (a dead-letter queue kept by the broker) is in no client yet.

So a member about to dead-letter a record that was delivered before (``delivery_count() >
1``) first looks for its dead letter: every partition of the dead-letter topic, read from
the first record stamped at or after the record's own timestamp (less a margin for clocks)
to the end as it stands now, for the headers ``kresilient.original.topic``/``partition``/
``offset`` naming it. A dead letter is stamped when it is written, after the record was
produced, so it cannot lie before that point. Found: the record is ACCEPTed without a second
dead letter. The read is made only for redelivered poison records, and it costs what the
dead-letter topic received since the record was produced.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from kresilient import _catalog as catalog
from kresilient.deadletter import ORIGINAL_OFFSET, ORIGINAL_PARTITION, ORIGINAL_TOPIC

__all__ = ["dead_letter_exists", "lookup_config"]

#: How far before the record's timestamp the search starts (producers' clocks differ).
CLOCK_MARGIN_MS: Final = 60_000
#: The consumer settings the lookup sets itself (a reader of its own, never a group member).
_OWN: Final = {
    "enable.auto.commit": False,
    "enable.partition.eof": False,
    "isolation.level": "read_committed",
}
#: Callbacks a lookup may keep (authentication); the user's others are not its business.
_KEPT_CALLBACKS: Final = frozenset({"oauth_cb"})


def lookup_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A plain consumer's config for the same cluster: the connection and security settings
    of ``config`` (any client's), a group id of its own (nothing is ever committed)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if callable(value) and key not in _KEPT_CALLBACKS:
            continue
        prop = catalog.lookup(str(key))
        if prop is None or prop.scope != "*":
            continue  # consumer-, producer- or share-only keys: not a lookup's
        out[key] = value
    out.pop("statistics.interval.ms", None)
    out.update(_OWN)
    # a reader of a few seconds: its errors end in the caller's exception, never in raw
    # librdkafka lines on stderr
    out["error_cb"] = _ignore
    out["logger"] = _QUIET
    out["group.id"] = f"kresilient-dlq-lookup-{uuid.uuid4().hex[:12]}"
    out["client.id"] = f"{config.get('client.id', 'kresilient')}-dlq-lookup"
    return out


def dead_letter_exists(
    config: Mapping[str, Any], dlq_topic: str, msg: Message, *, timeout: float
) -> bool:
    """Whether ``dlq_topic`` holds a dead letter of ``msg`` (its topic, partition, offset).

    ``config``: from :func:`lookup_config`. Raises :class:`KafkaException` or
    :class:`TimeoutError` when the topic's partitions, offsets or records cannot be read
    within ``timeout`` seconds: the caller then writes the dead letter (a duplicate is
    better than a loss).
    """
    deadline = time.monotonic() + timeout
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    want = (str(topic).encode(), str(partition).encode(), str(offset).encode())
    _kind, stamp = msg.timestamp()
    since = max(0, int(stamp) - CLOCK_MARGIN_MS) if stamp and stamp > 0 else 0
    consumer = Consumer(dict(config))
    try:
        meta = consumer.list_topics(dlq_topic, timeout=_left(deadline))
        parts = meta.topics.get(dlq_topic)
        if parts is None or parts.error is not None or not parts.partitions:
            return False  # no dead-letter topic yet: nothing written to it
        asked = [TopicPartition(dlq_topic, p, since) for p in parts.partitions]
        starts = consumer.offsets_for_times(asked, timeout=_left(deadline))
        todo: dict[int, int] = {}  # partition -> the end to read up to
        assign: list[TopicPartition] = []
        for tp in starts:
            if tp.error is not None:
                raise KafkaException(tp.error)
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(dlq_topic, tp.partition), timeout=_left(deadline)
            )
            if tp.offset < 0 or tp.offset >= high:
                continue  # nothing stamped since: no dead letter of it there
            todo[tp.partition] = high
            assign.append(TopicPartition(dlq_topic, tp.partition, tp.offset))
        if not todo:
            return False
        consumer.assign(assign)
        while todo:
            left = _left(deadline)
            for record in consumer.consume(500, min(left, 1.0)):
                if record.error() is not None:
                    continue  # partition EOF and the like: the ends are counted below
                if _names(record, want):
                    return True
                part: int = record.partition()  # type: ignore[assignment]
                at: int = record.offset()  # type: ignore[assignment]
                if at + 1 >= todo.get(part, 0):
                    todo.pop(part, None)
            for p in list(todo):
                position = consumer.position([TopicPartition(dlq_topic, p)])[0].offset
                if position >= todo[p]:
                    todo.pop(p)  # read to the end (a transaction marker may be the last)
        return False
    finally:
        consumer.close()


def _ignore(_err: Any) -> None:
    return None


_QUIET = logging.getLogger("kresilient.share.lookup")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _names(record: Message, want: tuple[bytes, bytes, bytes]) -> bool:
    found: dict[str, bytes] = {}
    headers: list[tuple[str, bytes | None]] = record.headers() or []  # type: ignore[assignment]
    for name, value in headers:
        if name in (ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET) and value is not None:
            found.setdefault(name, value)
    return (
        found.get(ORIGINAL_TOPIC),
        found.get(ORIGINAL_PARTITION),
        found.get(ORIGINAL_OFFSET),
    ) == want


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the dead-letter lookup ran out of time")
    return left
