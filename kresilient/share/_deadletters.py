"""Which records of a share group already have a dead letter: a reader tailing the DLQ.

A share-group member writes a poison record's dead letter, waits for its acknowledgement and
then ACCEPTs the record. Nothing makes the two one step: a member that dies between them (a
SIGKILL, an OOM kill) leaves the dead letter written and the record acquired; once the lock
ends the broker delivers the record again, and another member would write a second dead
letter. KIP-1191 (a dead-letter queue kept by the broker) is in no client yet.

:class:`DeadLetterIndex` reads the group's dead-letter topics in a background thread, from
``lookback_s`` before the member started, and keeps every dead letter kresilient wrote *for
this group* (its own header block, the last one of the record, names the group), by the
record it names: topic, partition, offset, timestamp and value (byte-identical), never the
offset alone (a topic deleted and created again reuses offsets). A member about to
dead-letter a record that was delivered before asks :meth:`DeadLetterIndex.contains`: the
reader reads the high watermark of each dead-letter partition from the brokers then (one
ListOffsets request per leader, once per poll batch), and the answer waits until it has read
that far, within the caller's bound. When the reader keeps up there is no wait: the question
stays out of the record's lock (a lookup that read the topic itself, on the record's path,
took seconds of a lock shared by a whole batch and cascaded into expired locks; CHANGELOG).

Limits: a dead letter written more than ``lookback_s`` before this member started is not
known to it; partitions added to a dead-letter topic after the start are not read; the reader
is bounded to ``max_entries`` keys (the oldest go first). In each case :meth:`contains` answers
``False`` or ``None`` and the caller writes the dead letter: a duplicate, never a loss.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from kresilient import _catalog as catalog
from kresilient.deadletter import (
    CONSUMER_GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
)

__all__ = ["DEFAULT_LOOKBACK_S", "DeadLetterIndex", "Key", "reader_config", "record_key"]

#: How far back (s) before the member's start the reader begins.
DEFAULT_LOOKBACK_S: Final = 3600.0
#: Keys kept at most (about 150 bytes each).
_MAX_ENTRIES: Final = 1_000_000
#: The consumer settings the reader sets itself (a reader of its own, never a group member).
_OWN: Final = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "isolation.level": "read_committed",
    "fetch.wait.max.ms": 100,
}
#: Callbacks a reader may keep (authentication); the user's others are not its business.
_KEPT_CALLBACKS: Final = frozenset({"oauth_cb"})
#: Seconds between attempts to set the reader up (the topic may not exist yet).
_SETUP_EVERY: Final = 2.0

_QUIET = logging.getLogger("kresilient.share.deadletters")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

#: A record: topic, partition, offset, timestamp (ms) and a digest of its value. The offset
#: alone is not the record: a topic deleted and created again reuses offsets, and so does a
#: log truncated by an unclean leader election (a dead letter of the old record at the same
#: offset must not pass for the new one's).
Key = tuple[str, int, int, int, int]


def record_key(msg: Message) -> Key:
    """The :data:`Key` of a consumed record (its dead letter's value is its value, byte
    for byte, and its ``original.timestamp`` header its timestamp)."""
    _kind, stamp = msg.timestamp()
    return (
        str(msg.topic()),
        int(msg.partition() or 0),
        int(msg.offset() or 0),
        int(stamp),
        hash(msg.value()),
    )


def reader_config(config: Mapping[str, Any], client_id: str) -> dict[str, Any]:
    """A plain consumer's config for the same cluster: the connection and security settings
    of ``config`` (any client's), a group id of its own (nothing is ever committed)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if callable(value) and key not in _KEPT_CALLBACKS:
            continue
        prop = catalog.lookup(str(key))
        if prop is None or prop.scope != "*":
            continue  # consumer-, producer- or share-only keys: not a reader's
        out[key] = value
    out.pop("statistics.interval.ms", None)
    out.update(_OWN)
    # its errors end in the caller's answer (None: unknown), never in raw librdkafka lines
    out["error_cb"] = _ignore
    out["logger"] = _QUIET
    out["group.id"] = f"kresilient-dlq-index-{uuid.uuid4().hex[:12]}"
    out["client.id"] = f"{client_id}-dlq-index"
    return out


class DeadLetterIndex:
    """The dead letters kresilient wrote for ``group`` in ``topics``, read in the background.

    ``log`` gets ``share_dead_letter_index_*`` events (texts through ``redact``).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        group: str,
        *,
        client_id: str,
        log: Any,
        redact: Callable[[str], str],
        lookback_s: float = DEFAULT_LOOKBACK_S,
        max_entries: int = _MAX_ENTRIES,
    ) -> None:
        self._cfg = reader_config(config, client_id)
        self._topics = sorted(set(topics))
        self._group = group.encode()
        self._log = log
        self._redact = redact
        self._since_ms = int((time.time() - max(lookback_s, 0.0)) * 1000)
        self._max = max_entries
        self._seen: dict[Key, None] = {}  # insertion order: the oldest first
        self._read: dict[tuple[str, int], int] = {}  # next offset the reader will read
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._admin: AdminClient | None = None  # the reader thread's, for the ends
        #: questions asked (a counter) and the ends of the partitions read for the latest
        #: one the reader answered (``_ends_for``: its number)
        self._asked = 0
        self._ends_for = 0
        self._ends: dict[tuple[str, int], int] = {}
        self._ends_at = -1.0  # time.monotonic() just before ``_ends`` were asked
        self._thread = threading.Thread(
            target=self._run, name="kresilient-share-dlq-index", daemon=True
        )

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------ the question

    def contains(self, key: Key, timeout: float, *, since: float) -> bool | None:
        """Whether a dead letter of the record ``key`` (:func:`record_key`) is known.

        ``True``: written (for this group). ``False``: none, the reader having read every
        dead-letter partition to its high watermark read from the brokers at or after
        ``since`` (``time.monotonic()`` when the record was acquired: a dead letter of an
        earlier delivery was acknowledged before that). ``None``: unknown within ``timeout``
        (the reader not set up, behind, stopped at an open transaction, or the ends
        unreadable).

        The ends are read once for all questions with the same or an earlier ``since``: the
        records of one poll batch cost one request together."""
        deadline = time.monotonic() + max(timeout, 0.0)
        with self._cond:
            if key in self._seen:
                return True
            # the ends are asked by the reader's own thread: a librdkafka consumer asked for
            # watermarks from a second thread while consume() waits can hang both (measured)
            ask = self._asked
            if self._ends_at < since:
                self._asked += 1
                ask = self._asked
                self._cond.notify_all()
            while True:
                if key in self._seen:
                    return True
                ends = self._ends if self._ends_for >= ask else None
                if ends is not None and all(
                    self._read.get(tp, -1) >= end for tp, end in ends.items()
                ):
                    return False
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return None
                self._cond.wait(min(left, 0.1))

    # ------------------------------------------------------------------ the reader

    def _run(self) -> None:
        consumer: Consumer | None = None
        try:
            consumer = Consumer(dict(self._cfg))
            tries = 0
            while not self._setup(consumer, quiet=tries > 0):
                tries += 1
                if self._stop.wait(_SETUP_EVERY):
                    return
            while not self._stop.is_set():
                # a short wait: a question is answered after the call in progress
                msgs = consumer.consume(500, 0.05)
                with self._cond:
                    for msg in msgs:
                        if msg.error() is not None:
                            continue
                        self._add(msg)
                    # the position passes transaction markers too: read it after each call
                    for tp in consumer.position([TopicPartition(t, p) for t, p in self._read]):
                        if tp.offset >= 0:
                            self._read[(tp.topic, tp.partition)] = max(
                                self._read[(tp.topic, tp.partition)], tp.offset
                            )
                    self._cond.notify_all()
                    asked = self._asked if self._asked > self._ends_for else 0
                    parts = list(self._read)
                if asked:
                    at = time.monotonic()
                    ends = self._ends_now(parts)
                    with self._cond:
                        self._ends, self._ends_for, self._ends_at = ends, asked, at
                        self._cond.notify_all()
        except Exception as exc:  # the reader stops: every question is then answered None
            self._log.warning("share_dead_letter_index_stopped", error=self._redact(str(exc)))
        finally:
            with self._cond:
                self._consumer = None
            self._admin = None
            if consumer is not None:
                consumer.close()

    def _ends_now(self, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermark of each partition, asked from the brokers now in one
        ListOffsets request per leader. The HIGH watermark, not the last stable offset: a
        dead letter above an open transaction of the topic is written and acknowledged but
        not yet readable by this read_committed reader; the question then stays unanswered
        (``None``, a duplicate possible) instead of a wrong ``False``. A partition whose end
        cannot be read stays unreachable: its questions time out."""
        unknown = 1 << 62
        if self._admin is None:
            self._admin = AdminClient(admin_config(self._cfg))
        latest: Any = OffsetSpec.latest  # untyped in confluent-kafka
        asked = {TopicPartition(t, p): latest() for t, p in parts}
        try:
            futures = self._admin.list_offsets(
                asked, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=5
            )
        except KafkaException:
            return dict.fromkeys(parts, unknown)
        ends: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            try:
                ends[(tp.topic, tp.partition)] = int(future.result(timeout=6).offset)
            except Exception:  # a timeout, an error of that partition
                ends[(tp.topic, tp.partition)] = unknown
        return ends

    def _setup(self, consumer: Consumer, *, quiet: bool = False) -> bool:
        """Assign ``consumer`` every partition of the dead-letter topics, from the first
        record at or after the start less ``lookback_s``; ``False`` while a topic is missing
        or unreadable (tried again)."""
        try:
            asked: list[TopicPartition] = []
            for topic in self._topics:
                meta = consumer.list_topics(topic, timeout=5)
                info = meta.topics.get(topic)
                if info is None or info.error is not None or not info.partitions:
                    raise LookupError(f"dead-letter topic {topic} has no partitions yet")
                asked += [TopicPartition(topic, p, self._since_ms) for p in info.partitions]
            starts = consumer.offsets_for_times(asked, timeout=10)
            assign: list[TopicPartition] = []
            read: dict[tuple[str, int], int] = {}
            for tp in starts:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                offset = tp.offset
                if offset < 0:  # nothing stamped since: from the end
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=10
                    )
                    offset = high
                assign.append(TopicPartition(tp.topic, tp.partition, offset))
                read[(tp.topic, tp.partition)] = offset
            consumer.assign(assign)
        except (KafkaException, LookupError, RuntimeError) as exc:
            if not quiet:  # once: the next tries are every 2 s
                self._log.debug("share_dead_letter_index_waiting", error=self._redact(str(exc)))
            return False
        with self._cond:
            self._read = read
            self._consumer = consumer
            self._cond.notify_all()
        self._log.info("share_dead_letter_index_started", topics=self._topics, partitions=len(read))
        return True

    def _add(self, msg: Message) -> None:
        """Keep the record's key when its last kresilient header block names this group."""
        headers: list[tuple[str, bytes | None]] = msg.headers() or []  # type: ignore[assignment]
        start = None
        for i in range(len(headers) - 1, -1, -1):
            if headers[i][0] == ORIGINAL_TOPIC:
                start = i
                break
        if start is not None:
            found: dict[str, bytes | None] = {}
            for name, value in headers[start:]:
                found.setdefault(name, value)
            topic, part, off, stamp = (
                found.get(ORIGINAL_TOPIC),
                found.get(ORIGINAL_PARTITION),
                found.get(ORIGINAL_OFFSET),
                found.get(ORIGINAL_TIMESTAMP),
            )
            if found.get(CONSUMER_GROUP) == self._group and topic and part and off:
                try:
                    key: Key | None = (
                        topic.decode(),
                        int(part),
                        int(off),
                        int(stamp) if stamp else -1,  # no timestamp: record_key's -1 too
                        hash(msg.value()),
                    )
                except ValueError:
                    key = None
                if key is not None:
                    self._seen[key] = None
                    if len(self._seen) > self._max:
                        del self._seen[next(iter(self._seen))]
        at: int = msg.offset()  # type: ignore[assignment]
        tp = (str(msg.topic()), int(msg.partition()))  # type: ignore[arg-type]
        self._read[tp] = max(self._read.get(tp, 0), at + 1)


def admin_config(reader: Mapping[str, Any]) -> dict[str, Any]:
    """An admin client's config from :func:`reader_config`'s: its connection, security and
    quiet logging, without the consumer's own settings."""
    out = {k: v for k, v in reader.items() if k not in _OWN and k != "group.id"}
    out["client.id"] = f"{reader.get('client.id', 'kresilient')}-admin"
    return out


def _ignore(_err: Any) -> None:
    return None
