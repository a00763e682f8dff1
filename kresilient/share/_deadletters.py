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
dead-letter a record asks :meth:`DeadLetterIndex.contains` with the record's own dead-letter
topic: the reader reads the high watermark of each partition of *that* topic from the brokers
then (one ListOffsets request per leader, once per poll batch) and its partition count (a
partition added since is read from its beginning), and the answer waits until it has read that
far, within the caller's bound. When the reader keeps up there is no wait: the question stays
out of the record's lock (a lookup that read the topic itself, on the record's path, took
seconds of a lock shared by a whole batch and cascaded into expired locks; CHANGELOG).

Each dead-letter topic is set up on its own: one that does not exist yet is retried every 2 s
without holding up the others, and one the member may not read (no READ ACL: its fetches are
refused) is reported once as a WARNING and answered ``None`` at once. :meth:`state` says which
(``ResilientShareConsumer.health()`` shows it). The reader reads uncommitted records: a share
group's own dead letters are never transactional, and an open transaction of another writer
on a shared dead-letter topic (kresilient's exactly-once services write theirs in
transactions) must not hold every answer back.

Limits: a dead letter written more than ``lookback_s`` before this member started is not
known to it; one written longer ago than ``lookback_s + keep_s`` (the caller's delivery-count
limit times its lock: no delivery of its record can still be pending) is forgotten while the
member runs; one written by an earlier run of the group within that time counts (a group
reset to reprocess its records finds the earlier run's dead letters: the record is ACCEPTed,
not dead-lettered again). The reader keeps at most ``max_entries`` keys (the oldest go first;
about 260 bytes each with the dead letter's timestamp, ~250 MiB at the default cap, per
consumer; the age limit keeps it to the dead letters of that window). When a key was dropped
or the topic cannot be read, :meth:`contains` answers ``False`` or ``None`` and the caller
writes the dead letter: a duplicate, never a loss.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from kresilient import _catalog as catalog
from kresilient.deadletter import (
    CONSUMER_GROUP,
    ORIGINAL_OFFSET,
    ORIGINAL_PARTITION,
    ORIGINAL_TIMESTAMP,
    ORIGINAL_TOPIC,
)
from kresilient.errors import ConfigError

__all__ = ["DEFAULT_LOOKBACK_S", "DeadLetterIndex", "Key", "reader_config", "record_key"]

#: How far back (s) before the member's start the reader begins.
DEFAULT_LOOKBACK_S: Final = 3600.0
#: Keys kept at most (about 260 bytes each: ~250 MiB at the cap, measured with tracemalloc).
_MAX_ENTRIES: Final = 1_000_000
#: The consumer settings the reader sets itself (a reader of its own, never a group member).
#: read_uncommitted: the group's own dead letters are never transactional, and a transaction
#: open on a shared dead-letter topic would hold every answer back for its whole timeout;
#: earliest: a position out of range (retention, truncation) reads again, never skips.
_OWN: Final = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": False,
    "isolation.level": "read_uncommitted",
    "auto.offset.reset": "earliest",
    "fetch.wait.max.ms": 100,
}
#: Callbacks a reader keeps: those the dead-letter writer keeps (authentication, how to reach
#: and verify the brokers); the user's others are not its business.
_KEPT_CALLBACKS: Final = frozenset(
    {"oauth_cb", "ssl.certificate.verify_cb", "resolve_cb", "connect_cb"}
)
#: Seconds between attempts to set a dead-letter topic up (it may not exist yet).
_SETUP_EVERY: Final = 2.0
#: Errors that say the member may not read (or describe) a dead-letter topic: its answers are
#: then ``None`` at once, and one WARNING names the topic and the missing ACL.
_REFUSED: Final = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)
#: An end no reader reaches: that partition's questions stay unanswered (``None``).
_UNKNOWN: Final = 1 << 62

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
    out["logger"] = _QUIET  # its errors are kept by the index (error_cb) and reported there
    out["group.id"] = f"kresilient-dlq-index-{uuid.uuid4().hex[:12]}"
    out["client.id"] = f"{client_id}-dlq-index"
    return out


def check_lookback(lookback_s: float) -> float:
    """``lookback_s`` if it is a finite number of seconds >= 0, else a ConfigError."""
    try:
        value = float(lookback_s)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"dead_letter_lookback_s must be a finite number of seconds >= 0 (or None: no "
            f"dead-letter reader), got {lookback_s!r}",
            key="dead_letter_lookback_s",
        )
    return value


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
        keep_s: float = 0.0,
    ) -> None:
        lookback_s = check_lookback(lookback_s)
        self._cfg = reader_config(config, client_id)
        self._cfg["error_cb"] = self._on_error
        self._topics = sorted(set(topics))
        self._group = group.encode()
        self._log = log
        self._redact = redact
        self._since_ms = int((time.time() - lookback_s) * 1000)
        self._max = max_entries
        #: a dead letter older than this (ms before now, by its timestamp) is forgotten: it
        #: cannot be an earlier delivery's of a record still delivered (``keep_s``: the
        #: caller's delivery-count limit times its lock)
        self._horizon_ms = int((lookback_s + max(keep_s, 0.0)) * 1000)
        #: key -> the dead letter's timestamp (ms); insertion order: the oldest first
        self._seen: dict[Key, int] = {}
        self._read: dict[tuple[str, int], int] = {}  # next offset the reader will read
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._admin: AdminClient | None = None  # the reader thread's, for the ends
        #: partitions assigned per topic set up; why each other topic is not (yet) read
        self._ready: dict[str, int] = {}
        self._waiting: dict[str, str] = dict.fromkeys(self._topics, "not set up yet")
        self._refused: dict[str, str] = {}  # topics the member may not read: the reason
        self._error: str | None = None  # the reader's last client error (error_cb)
        self._stopped: str | None = None  # why the reader thread ended, if it did
        #: questions asked (a counter); per topic: the question whose ends it waits for, the
        #: latest question its ends answer and when (``time.monotonic()``) they were asked
        self._asked = 0
        self._want: dict[str, int] = {}
        self._ends_for: dict[str, int] = {}
        self._ends_at: dict[str, float] = {}
        self._ends: dict[tuple[str, int], int] = {}
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

    def state(self) -> dict[str, Any]:
        """What the reader does: ``state`` ``reading`` (every topic read), ``waiting`` (a
        topic not set up yet: missing, or its metadata unreadable), ``refused`` (a topic the
        member may not read), ``stopped`` (the reader ended: every answer is ``None``) or
        ``starting``; ``topics``: each topic's own; ``error``: the last client error."""
        with self._cond:
            topics: dict[str, str] = {}
            for topic in self._topics:
                if topic in self._refused:
                    topics[topic] = f"refused: {self._refused[topic]}"
                elif topic in self._ready:
                    topics[topic] = "reading"
                else:
                    topics[topic] = f"waiting: {self._waiting.get(topic, 'not set up yet')}"
            if self._stopped is not None:
                state = "stopped"
            elif not self.started:
                state = "starting"
            elif self._refused:
                state = "refused"
            elif len(self._ready) < len(self._topics):
                state = "waiting"
            else:
                state = "reading"
            return {
                "state": state,
                "topics": topics,
                "error": self._stopped or self._error,
                "entries": len(self._seen),
            }

    # ------------------------------------------------------------------ the question

    def contains(
        self, key: Key, timeout: float, *, since: float, topic: str | None = None
    ) -> bool | None:
        """Whether a dead letter of the record ``key`` (:func:`record_key`) is known.

        ``topic``: the record's dead-letter topic (default: every topic of the index); only
        its partitions are waited for. ``True``: written (for this group). ``False``: none,
        the reader having read every partition of ``topic`` to its high watermark read from
        the brokers at or after ``since`` (``time.monotonic()`` when the record may have been
        acquired: a dead letter of an earlier delivery was acknowledged before that; one
        still in flight then is the caller's to know, see ResilientShareConsumer). ``None``:
        unknown within ``timeout`` (the topic not set up, refused, the reader behind or
        stopped, or the ends unreadable).

        The ends of a topic are read once for all questions with the same or an earlier
        ``since``: the records of one poll batch cost one request together."""
        deadline = time.monotonic() + max(timeout, 0.0)
        topics = [topic] if topic is not None else self._topics
        with self._cond:
            if key in self._seen:
                return True
            if any(t in self._refused for t in topics):
                return None
            # the ends are asked by the reader's own thread: a librdkafka consumer asked for
            # watermarks from a second thread while consume() waits can hang both (measured)
            need: dict[str, int] = {}
            stale = [t for t in topics if self._ends_at.get(t, -1.0) < since]
            if stale:
                self._asked += 1
                for t in stale:
                    self._want[t] = self._asked
                self._cond.notify_all()
            for t in topics:
                need[t] = self._asked if t in stale else self._ends_for.get(t, 0)
            while True:
                if key in self._seen:
                    return True
                if any(t in self._refused for t in topics):
                    return None
                if self._answered(need):
                    return False
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return None
                self._cond.wait(min(left, 0.1))

    def _answered(self, need: Mapping[str, int]) -> bool:
        """Every topic of ``need`` set up, its ends at least that question's, and read that
        far (under ``_cond``)."""
        for topic, asked in need.items():
            if topic not in self._ready or self._ends_for.get(topic, 0) < max(asked, 1):
                return False
        return all(self._read.get(tp, -1) >= end for tp, end in self._ends.items() if tp[0] in need)

    # ------------------------------------------------------------------ the reader

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's client errors (from consume(), on the reader thread): kept for
        :meth:`state`. A refusal refuses only the topics its text names: a fetch refused for
        one topic arrives as that partition's error message (:meth:`_run`), and one unreadable
        dead-letter topic must not stop the answers for the others (review14 F6)."""
        if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            return  # its own group id (librdkafka looks its coordinator up): never used
        text = self._redact(str(err))
        with self._cond:
            self._error = text
        if err.code() in _REFUSED:
            named = [t for t in self._topics if t in str(err)]
            if named:
                self._refuse(named, text)

    def _refuse(self, topics: list[str], reason: str) -> None:
        """``topics`` may not be read by this member: report each once, answer None."""
        with self._cond:
            new = [t for t in topics if t not in self._refused]
            for t in new:
                self._refused[t] = reason
            self._cond.notify_all()
        for t in new:
            self._log.warning(
                "share_dead_letter_index_refused",
                topic=t,
                error=reason,
                remedy=(
                    "grant the consumer's principal READ and DESCRIBE on the dead-letter "
                    "topic; until then a redelivered poison record of it is dead-lettered "
                    "again (a duplicate is possible, counted in dead_letters_unconfirmed)"
                ),
            )

    def _run(self) -> None:
        consumer: Consumer | None = None
        try:
            consumer = Consumer(dict(self._cfg))
            next_setup = 0.0
            while not self._stop.is_set():
                pending = [
                    t for t in self._topics if t not in self._ready and t not in self._refused
                ]
                if pending and time.monotonic() >= next_setup:
                    for topic in pending:
                        self._setup(consumer, topic)
                    next_setup = time.monotonic() + _SETUP_EVERY
                # a short wait: a question is answered after the call in progress
                msgs = consumer.consume(500, 0.05)
                refused: dict[str, str] = {}
                with self._cond:
                    for msg in msgs:
                        err = msg.error()
                        if err is not None:
                            text = self._redact(str(err))
                            self._error = text
                            if err.code() in _REFUSED and msg.topic():
                                refused[str(msg.topic())] = text
                            continue
                        self._add(msg)
                    # the position passes transaction markers too: read it after each call;
                    # never a max with the last one: a position reset (out of range) goes down
                    parts = [TopicPartition(t, p) for t, p in self._read]
                    for tp in consumer.position(parts) if parts else ():
                        if tp.offset >= 0:
                            self._read[(tp.topic, tp.partition)] = tp.offset
                    self._cond.notify_all()
                    want = {t: n for t, n in self._want.items() if t in self._ready}
                    for t in want:
                        del self._want[t]
                if refused:
                    self._drop(consumer, refused)
                if want:
                    at = time.monotonic()
                    self._grow(consumer, list(want))
                    with self._cond:
                        parts_of = [key for key in self._read if key[0] in want]
                    ends = self._ends_now(parts_of)
                    with self._cond:
                        # (topic, -1): _grow's mark of a partition count it could not read
                        for key in [k for k in self._ends if k[0] in want and k[1] >= 0]:
                            del self._ends[key]
                        self._ends.update(ends)
                        for t, n in want.items():
                            self._ends_for[t] = max(self._ends_for.get(t, 0), n)
                            self._ends_at[t] = at
                        self._cond.notify_all()
        except Exception as exc:  # the reader stops: every question is then answered None
            text = self._redact(str(exc))
            with self._cond:
                self._stopped = text
                self._cond.notify_all()
            self._log.warning("share_dead_letter_index_stopped", error=text)
        finally:
            self._admin = None
            if consumer is not None:
                consumer.close()

    def _drop(self, consumer: Consumer, refused: Mapping[str, str]) -> None:
        """Stop reading topics whose fetches were refused (no READ)."""
        with self._cond:
            gone = [TopicPartition(t, p) for t, p in self._read if t in refused]
            for tp in gone:
                self._read.pop((tp.topic, tp.partition), None)
            for t in refused:
                self._ready.pop(t, None)
        if gone:
            consumer.incremental_unassign(gone)
        for topic, reason in refused.items():
            self._refuse([topic], reason)

    def _grow(self, consumer: Consumer, topics: list[str]) -> None:
        """Partitions added to ``topics`` since they were set up: read from their beginning
        (every dead letter in them is newer than the start). A topic whose partition count
        cannot be read gets an end no reader reaches: its questions are answered ``None``."""
        for topic in topics:
            try:
                info = consumer.list_topics(topic, timeout=5).topics.get(topic)
                count = len(info.partitions) if info is not None and info.error is None else 0
            except KafkaException:
                count = 0
            with self._cond:
                known = self._ready.get(topic, 0)
                if count == 0:
                    self._ends[(topic, -1)] = _UNKNOWN
                    continue
                self._ends.pop((topic, -1), None)
                if count <= known:
                    continue
                added = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(known, count)]
                for tp in added:
                    self._read[(topic, tp.partition)] = 0
                self._ready[topic] = count
            consumer.incremental_assign(added)
            self._log.info(
                "share_dead_letter_index_partitions_added", topic=topic, added=len(added)
            )

    def _ends_now(self, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermark of each partition, asked from the brokers now in one
        ListOffsets request per leader. A partition whose end cannot be read stays
        unreachable: its questions time out."""
        if not parts:
            return {}
        if self._admin is None:
            self._admin = AdminClient(admin_config(self._cfg))
        latest: Any = OffsetSpec.latest  # untyped in confluent-kafka
        asked = {TopicPartition(t, p): latest() for t, p in parts}
        try:
            futures = self._admin.list_offsets(
                asked, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=5
            )
        except KafkaException:
            return dict.fromkeys(parts, _UNKNOWN)
        ends: dict[tuple[str, int], int] = {}
        for tp, future in futures.items():
            try:
                ends[(tp.topic, tp.partition)] = int(future.result(timeout=6).offset)
            except Exception:  # a timeout, an error of that partition
                ends[(tp.topic, tp.partition)] = _UNKNOWN
        return ends

    def _setup(self, consumer: Consumer, topic: str) -> None:
        """Assign ``consumer`` every partition of ``topic``, from the first record at or after
        the start less ``lookback_s``; left for the next try while the topic is missing or
        unreadable, refused for good when the member may not describe it."""
        try:
            info = consumer.list_topics(topic, timeout=5).topics.get(topic)
            err = info.error if info is not None else None
            if err is not None and err.code() in _REFUSED:
                self._refuse([topic], self._redact(str(err)))
                return
            if info is None or err is not None or not info.partitions:
                raise LookupError(
                    f"dead-letter topic {topic} has no partitions"
                    + (f" ({err})" if err is not None else " (it does not exist yet)")
                )
            parts = sorted(info.partitions)
            # the high watermarks first: a dead letter appended after them is read from
            # there on, one appended before offsets_for_times is found by it
            highs = {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in parts
            }
            asked = [TopicPartition(topic, p, self._since_ms) for p in parts]
            starts = consumer.offsets_for_times(asked, timeout=10)
            assign: list[TopicPartition] = []
            for tp in starts:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                offset = tp.offset if tp.offset >= 0 else highs[tp.partition]
                assign.append(TopicPartition(topic, tp.partition, offset))
        except (KafkaException, LookupError, RuntimeError) as exc:
            text = self._redact(str(exc))
            with self._cond:
                first = self._waiting.get(topic) == "not set up yet"
                self._waiting[topic] = text
            if first:  # once a topic: the next tries are every 2 s
                self._log.warning("share_dead_letter_index_waiting", topic=topic, error=text)
            return
        consumer.incremental_assign(assign)
        with self._cond:
            for tp in assign:
                self._read[(topic, tp.partition)] = tp.offset
            self._ready[topic] = len(parts)
            self._waiting.pop(topic, None)
            self._cond.notify_all()
        self._log.info("share_dead_letter_index_started", topic=topic, partitions=len(parts))

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
                        sys.intern(topic.decode()),  # one str a topic, not one a key
                        int(part),
                        int(off),
                        int(stamp) if stamp else -1,  # no timestamp: record_key's -1 too
                        hash(msg.value()),
                    )
                except ValueError:
                    key = None
                if key is not None:
                    seen = self._seen
                    seen[key] = int(msg.timestamp()[1])
                    if len(seen) > self._max:
                        del seen[next(iter(seen))]
                    # forget by age, from the front (read order is about time order: an old
                    # one behind a newer one is kept a while longer, never dropped early)
                    oldest = int(time.time() * 1000) - self._horizon_ms
                    while seen:
                        first = next(iter(seen))
                        if not 0 <= seen[first] < oldest:
                            break
                        del seen[first]
        at: int = msg.offset()  # type: ignore[assignment]
        self._read[(str(msg.topic()), int(msg.partition()))] = at + 1  # type: ignore[arg-type]


def admin_config(reader: Mapping[str, Any]) -> dict[str, Any]:
    """An admin client's config from :func:`reader_config`'s: its connection, security and
    quiet logging, without the consumer's own settings."""
    out = {k: v for k, v in reader.items() if k not in _OWN and k not in ("group.id", "error_cb")}
    out["client.id"] = f"{reader.get('client.id', 'kresilient')}-admin"
    return out
