"""Look at dead letters and bring them back: ``kresilient dlq inspect`` / ``dlq replay``, and
the same from Python with :func:`inspect_dead_letters` and :func:`replay_dead_letters`.

::

    kresilient dlq inspect orders.dlq -b 127.0.0.1:9092            # records, headers, counts
    kresilient dlq inspect orders.dlq --json --show-data            # JSON lines, keys and values
    kresilient dlq replay --from orders.dlq --to orders \\
        --filter category=poison --filter exception=JSONDecodeError --dry-run
    kresilient dlq replay --from orders.dlq --group orders-replayer --max-replays 5

From Python (no argument parsing involved)::

    from kresilient.deadletter_cli import inspect_dead_letters, replay_dead_letters

    seen = inspect_dead_letters("orders.dlq", bootstrap_servers="127.0.0.1:9092", limit=5)
    print(seen.read, seen.by_error)
    done = replay_dead_letters(
        "orders.dlq", bootstrap_servers="127.0.0.1:9092", target="orders",
        filters=["category=poison"], group="orders-replay",
    )
    assert done.ok, done.failures

Both read the dead-letter topic from its beginning (or a group's committed offsets with
``group``) up to the end offsets seen at start, with a consumer that commits nothing. They
read ``read_committed``, so a transactional dead-letter topic (the Spark exactly-once sink
writes dead letters in transactions) gives only committed records, and a partition is read
to its end once the consumer's position reached the end offset, past commit markers and
aborted records. Replay
writes each selected record's ORIGINAL key, value and headers (the dead-letter headers
stripped) with a :class:`~kresilient.ResilientProducer`. With ``group`` it then commits, per
partition, up to the first record it did not replay (cut by ``limit``, without an original
topic, or failed): nothing is ever skipped, and records after such a record in its partition
are held back for the next run instead of being sent twice. Records the filters exclude
count as done for the group. Records of the kresilient, Spring Kafka (``kafka_dlt-*``) and
Kafka Streams (``__streams.errors.*``) formats are decoded.

Replay loops end. Each replayed record carries a ``kresilient.replay.count`` header: its
value in the dead letter's original headers plus one (``1`` on a first replay), written in
place of the old one (or appended when there was none); every other original header is kept
byte for byte. A consumer that dead-letters the replayed record again keeps that header
among the original headers, so the count survives the round trip. A record already replayed
``max_replays`` times (``--max-replays``, 3 by default) is REFUSED: not sent, counted in
``refused`` with its coordinates, and (with ``group``) left behind like any record not
replayed, so the group's position stays before it and the run exits 1 until someone looks.
``force`` (``--force``) replays it anyway, counting on. A count that is not a whole number
is refused as well (nobody knows how often that record went round).

Filters (repeatable, all must match): ``FIELD=VALUE`` (equal, case-insensitive) or
``FIELD~TEXT`` (contains), FIELD one of ``category``, ``exception`` (full or short class
name), ``message``, ``topic`` (original), ``partition`` (original), ``group``, ``attempts``,
``format``; from Python also any ``Callable[[DeadLetterInfo], bool]``.

A cluster that cannot be reached is given up within ``timeout`` seconds (10 by default) with
one line naming each bootstrap host and why (connection refused, name not resolved, ...);
librdkafka's own log lines never reach the terminal. Results go to stdout, logs to stderr.
A cluster that refuses the login (wrong password, wrong CA, a client certificate the brokers
refuse) is named the same way, as soon as every broker refused: librdkafka's reason,
``[_AUTHENTICATION]`` or ``[_SSL]`` and the setting to check (``sasl.password``,
``ssl.ca.location``, ``ssl.certificate.location``); never a secret.
Exit codes: 0 done, 1 some records could not be replayed (failed, or refused at the replay
limit), 2 usage or connection error, a refused login included.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import logging
import re
import struct
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

import structlog
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from kresilient.deadletter import (
    SPRING_ORIGINAL_OFFSET,
    SPRING_ORIGINAL_PARTITION,
    SPRING_ORIGINAL_TIMESTAMP,
    DeadLetterInfo,
    parse_dead_letter_headers,
)
from kresilient.errors import (
    TOO_LARGE_CODES,
    ConfigError,
    DeliveryError,
    KafkaClientError,
    KResilientError,
    classify,
)
from kresilient.lint.commandconfig import read_command_config
from kresilient.lint.connect import ConnectionErrors, fetch_metadata, quiet_client_config

__all__ = [
    "DEFAULT_MAX_REPLAYS",
    "REPLAY_COUNT",
    "InspectResult",
    "InspectedRecord",
    "RefusedRecord",
    "ReplayResult",
    "counted_headers",
    "inspect_dead_letters",
    "main_inspect",
    "main_replay",
    "replay_count",
    "replay_dead_letters",
]

_BOOTSTRAP_ENV: Final = "KRESILIENT_BOOTSTRAP_SERVERS"
_FIELDS: Final = (
    "category",
    "exception",
    "message",
    "topic",
    "partition",
    "group",
    "attempts",
    "format",
)
_SPRING_BINARY: Final = frozenset(
    {SPRING_ORIGINAL_PARTITION, SPRING_ORIGINAL_OFFSET, SPRING_ORIGINAL_TIMESTAMP}
)
_MESSAGE_WIDTH: Final = 160
DEFAULT_TIMEOUT: Final = 10.0
REPLAY_COUNT: Final = "kresilient.replay.count"
"""The header counting how often a record was replayed (decimal ASCII)."""
DEFAULT_MAX_REPLAYS: Final = 3
"""How often :func:`replay_dead_letters` replays one record before it refuses."""
_REFUSED_KEPT: Final = 1000  # coordinates kept per run; the count covers every record
_REFUSED_SHOWN: Final = 20  # coordinates in the text summary

Filter = str | Callable[[DeadLetterInfo], bool]
Progress = Callable[[int, int], None]


# --------------------------------------------------------------------------- results


@dataclass(frozen=True, kw_only=True)
class InspectedRecord:
    """One dead-letter record as read: where it is, its bytes and its decoded headers."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    info: DeadLetterInfo

    @property
    def sizes(self) -> tuple[int, int, int]:
        """Bytes of key, value and headers (names and values)."""
        hsize = sum(len(k) + (len(v) if v is not None else 0) for k, v in self.headers)
        return len(self.key or b""), len(self.value or b""), hsize

    def as_dict(self, *, data: bool = False) -> dict[str, Any]:
        """The JSON form; ``data=True`` adds the key and value (see :func:`bytes_json`)."""
        info = self.info
        ksize, vsize, hsize = self.sizes
        out: dict[str, Any] = {
            "partition": self.partition,
            "offset": self.offset,
            "key_bytes": ksize,
            "value_bytes": vsize,
            "header_bytes": hsize,
            "format": info.format,
            "original_topic": info.original_topic,
            "original_partition": info.original_partition,
            "original_offset": info.original_offset,
            "original_timestamp": info.original_timestamp,
            "consumer_group": info.consumer_group,
            "exception_type": info.exception_type,
            "exception_message": info.exception_message,
            "error_category": info.error_category,
            "attempts": info.attempts,
            "failed_at": info.failed_at,
            "trace_context": dict(info.trace_context),
            "headers": [[k, _header_text(k, v)] for k, v in self.headers],
        }
        if data:
            out["key"] = bytes_json(self.key)
            out["value"] = bytes_json(self.value)
        return out


@dataclass(frozen=True, kw_only=True)
class InspectResult:
    """What :func:`inspect_dead_letters` read.

    ``read`` records in all (every count covers all of them); ``records`` holds the first
    ``limit`` of them and ``not_shown`` the rest. ``not_dead_letters`` had no dead-letter
    headers of a known format; ``read_errors`` counts errors the consumer reported instead
    of a record, by reason. ``by_error`` maps (category, exception type) to a count, most
    frequent first; ``by_source_topic`` maps each original topic to a count.
    """

    topic: str
    read: int
    records: tuple[InspectedRecord, ...]
    not_shown: int
    not_dead_letters: int
    read_errors: Mapping[str, int]
    key_bytes: int
    value_bytes: int
    header_bytes: int
    by_error: Mapping[tuple[str, str], int]
    by_source_topic: Mapping[str, int]

    def summary(self) -> dict[str, Any]:
        """The JSON summary (no records)."""
        return {
            "topic": self.topic,
            "records": self.read,
            "shown": len(self.records),
            "not_shown": self.not_shown,
            "not_dead_letters": self.not_dead_letters,
            "read_errors": dict(self.read_errors),
            "key_bytes": self.key_bytes,
            "value_bytes": self.value_bytes,
            "header_bytes": self.header_bytes,
            "by_error": [
                {"category": c, "exception": e, "count": n} for (c, e), n in self.by_error.items()
            ],
            "by_source_topic": dict(self.by_source_topic),
        }


@dataclass(frozen=True, kw_only=True)
class RefusedRecord:
    """A dead letter :func:`replay_dead_letters` refused to replay: where it is in the
    dead-letter topic, where it came from, and its ``kresilient.replay.count`` (``None``
    when that header was not a whole number)."""

    partition: int
    offset: int
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    replay_count: int | None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "partition": self.partition,
            "offset": self.offset,
            "original_topic": self.original_topic,
            "original_partition": self.original_partition,
            "original_offset": self.original_offset,
            "replay_count": self.replay_count,
        }

    def describe(self, source: str) -> str:
        """One line: ``orders.dlq[0]@41 (from orders[2]@1007), replayed 3 times``."""
        origin = (
            f"{self.original_topic}[{self.original_partition}]@{self.original_offset}"
            if self.original_topic
            else "no original topic"
        )
        times = (
            f"replayed {self.replay_count} times"
            if self.replay_count is not None
            else f"{REPLAY_COUNT} is not a number"
        )
        return f"{source}[{self.partition}]@{self.offset} (from {origin}), {times}"


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """What :func:`replay_dead_letters` did with each record it read.

    Every record read is counted exactly once: ``read == replayed + filtered_out + limited
    + no_topic + held_back + failed + refused``. ``refused`` had been replayed
    ``max_replays`` times already (see the module docstring); ``refused_records`` gives the
    coordinates of the first 1,000 of them. ``replayed`` were delivered (in a dry run: would be
    sent), ``filtered_out`` did not match the filters, ``limited`` matched but were over
    ``limit`` (left for a later run), ``no_topic`` had no original topic and no ``target``
    was given, ``held_back`` came after a record left behind in their partition (with
    ``group`` only: sent by the next run, not twice), ``failed`` could not be written, with
    ``failures`` counting them by reason. ``committed`` is the group's new position per
    partition (next offset to read), ``None`` without ``group``, in a dry run, or when the
    commit failed (``commit_error`` says why; a next run replays those records again).
    """

    source: str
    dry_run: bool
    read: int
    replayed: int
    by_target: Mapping[str, int]
    filtered_out: int
    limited: int
    no_topic: int
    held_back: int
    failed: int
    failures: Mapping[str, int]
    read_errors: Mapping[str, int]
    limit: int | None = None
    group: str | None = None
    committed: Mapping[int, int] | None = None
    commit_error: str | None = None
    refused: int = 0
    refused_records: tuple[RefusedRecord, ...] = ()
    max_replays: int = DEFAULT_MAX_REPLAYS
    force: bool = False

    @property
    def ok(self) -> bool:
        """True when no record failed or was refused at the replay limit, and the group's
        commit (if any) succeeded."""
        return self.failed == 0 and self.refused == 0 and self.commit_error is None

    def summary(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "source": self.source,
            "dry_run": self.dry_run,
            "read": self.read,
            "replayed": self.replayed,
            "by_target": dict(self.by_target),
            "filtered_out": self.filtered_out,
            "limited": self.limited,
            "limit": self.limit,
            "no_topic": self.no_topic,
            "held_back": self.held_back,
            "failed": self.failed,
            "failures": dict(self.failures),
            "refused": self.refused,
            "refused_records": [r.as_dict() for r in self.refused_records],
            "max_replays": self.max_replays,
            "force": self.force,
            "read_errors": dict(self.read_errors),
            "group": self.group,
            "commit_error": self.commit_error,
            "committed": None
            if self.committed is None
            else {str(p): o for p, o in sorted(self.committed.items())},
        }


# --------------------------------------------------------------------------- rendering bytes

_CONTROL: Final = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def show_bytes(data: bytes | None, width: int = _MESSAGE_WIDTH) -> str:
    """A one-line, terminal-safe rendering of a key or value: UTF-8 text as a JSON string
    (control characters and line separators escaped), anything else as hex; cut at
    ``width`` characters, saying how long the whole is."""
    if data is None:
        return "null"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        shown = data[: width // 3].hex(" ")
        more = " ..." if len(data) > width // 3 else ""
        return f"hex {shown}{more} ({len(data)} bytes, not UTF-8)"
    # json.dumps escapes what is below U+0020; C1 controls and U+2028/9 are escaped here.
    quoted = _CONTROL.sub(_json_escape, json.dumps(text[:width], ensure_ascii=False))
    return quoted if len(text) <= width else f"{quoted} ... ({len(data)} bytes)"


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def bytes_json(data: bytes | None) -> dict[str, str] | None:
    """A key or value for JSON output: ``{"text": ...}`` when it is UTF-8, else
    ``{"base64": ...}`` (byte for byte, never cut)."""
    if data is None:
        return None
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _header_text(name: str, value: bytes | None) -> str:
    if value is None:
        return "null"
    if name in _SPRING_BINARY and len(value) in (4, 8):
        return str(struct.unpack(">i" if len(value) == 4 else ">q", value)[0])
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + value.hex()
    if name.endswith("stacktrace"):
        lines = text.strip().splitlines()
        text = (lines[-1] if lines else "") + f"  [{len(lines)} lines]"
    text = _CONTROL.sub(_escape, text)
    return text if len(text) <= _MESSAGE_WIDTH else text[:_MESSAGE_WIDTH] + "..."


# --------------------------------------------------------------------------- filters


def _field(info: DeadLetterInfo, name: str) -> list[str]:
    table: dict[str, Callable[[DeadLetterInfo], list[str | None]]] = {
        "category": lambda i: [i.error_category],
        "exception": lambda i: [i.exception_type, i.exception_short_type],
        "message": lambda i: [i.exception_message],
        "topic": lambda i: [i.original_topic],
        "partition": lambda i: [
            None if i.original_partition is None else str(i.original_partition)
        ],
        "group": lambda i: [i.consumer_group],
        "attempts": lambda i: [None if i.attempts is None else str(i.attempts)],
        "format": lambda i: [i.format],
    }
    return [v for v in table[name](info) if v is not None]


def parse_filter(text: str) -> Callable[[DeadLetterInfo], bool]:
    """``"FIELD=VALUE"`` / ``"FIELD~TEXT"`` as a predicate; ConfigError for anything else."""
    for op in ("=", "~"):
        name, sep, wanted = text.partition(op)
        name = name.strip().lower()
        if sep and name in _FIELDS and "=" not in name:
            want = wanted.strip().lower()
            if op == "=":
                return lambda info: any(v.lower() == want for v in _field(info, name))
            return lambda info: any(want in v.lower() for v in _field(info, name))
    raise ConfigError(
        f"bad filter {text!r}: use FIELD=VALUE or FIELD~TEXT, FIELD in {', '.join(_FIELDS)}",
        key=None,
    )


def _predicates(filters: Sequence[Filter]) -> list[Callable[[DeadLetterInfo], bool]]:
    return [parse_filter(f) if isinstance(f, str) else f for f in filters]


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, kw_only=True)
class _Record:
    msg: Message
    info: DeadLetterInfo


class _Reader:
    """A non-committing consumer over one topic, from the beginning (or ``group``'s committed
    offsets) up to the end offsets seen at start; also answers "does topic X exist".

    Reads ``read_committed``: records of aborted transactions are never returned, and a
    partition is read to its end when the consumer's position reached the end offset, not
    when a record at ``end - 1`` arrived: on a transactional topic (the Spark exactly-once
    sink writes dead letters in transactions) the last offset is a commit marker no
    consumer ever sees, and the reader waited out ``timeout`` (issue 35 #7). ``reached``
    holds, per partition read, the position reached (next offset to read), which is what a
    group commits.
    """

    def __init__(
        self, config: Mapping[str, Any], topic: str, group: str | None, timeout: float
    ) -> None:
        self.topic, self.group, self.timeout = topic, group, timeout
        self.errors = ConnectionErrors(str(config.get("bootstrap.servers", "")))
        conf = dict(config)
        conf.update(
            {
                "group.id": group or f"kresilient-dlq-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                # The event that says the fetch position reached the partition's end (the
                # last stable offset under read_committed), markers and aborted records
                # included: the one signal that the end was reached on a transactional topic.
                "enable.partition.eof": True,
            }
        )
        self.consumer = Consumer(quiet_client_config(conf, self.errors, timeout))
        self.read_errors: Counter[str] = Counter()
        self.reached: dict[int, int] = {}
        self._exists: dict[str, str | None] = {}
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        metadata = fetch_metadata(self.consumer, self.errors, self.timeout, self.topic)
        meta = metadata.topics.get(self.topic)
        if meta is None or meta.error is not None:
            reason = meta.error.str() if meta is not None and meta.error is not None else "missing"
            raise ConfigError(f"topic {self.topic!r} cannot be read: {reason}", key=None)
        parts = [TopicPartition(self.topic, p) for p in sorted(meta.partitions)]
        self.starts: dict[int, int] = {}
        self.ends: dict[int, int] = {}
        for tp in parts:
            try:
                low, high = self.consumer.get_watermark_offsets(tp, timeout=self.timeout)
            except KafkaException as exc:
                raise KafkaClientError(
                    f"cannot read the offsets of {self.topic}[{tp.partition}]: "
                    f"{exc.args[0].str() if exc.args else exc}",
                    topic=self.topic,
                    partition=tp.partition,
                ) from None
            self.starts[tp.partition], self.ends[tp.partition] = low, high
        if self.group is not None:
            got = self._retrying(lambda: self.consumer.committed(parts, timeout=self.timeout))
            for tp in got:
                if tp.offset >= 0:
                    self.starts[tp.partition] = max(self.starts[tp.partition], tp.offset)
        self.total = sum(max(0, self.ends[p] - self.starts[p]) for p in self.ends)

    def records(self, progress: Progress | None = None) -> Iterator[_Record]:
        """Every record up to the end offsets seen at start, in offset order per partition."""
        todo = {p for p in self.ends if self.starts[p] < self.ends[p]}
        if not todo:
            return
        self.consumer.assign(
            [
                TopicPartition(
                    self.topic, p, self.starts[p] if self.group is not None else OFFSET_BEGINNING
                )
                for p in sorted(todo)
            ]
        )
        done = 0
        idle_deadline = time.monotonic() + self.timeout
        while todo:
            msgs = self.consumer.consume(500, 1.0)
            if not msgs:
                if time.monotonic() > idle_deadline:
                    raise KResilientError(
                        f"no records from {self.topic} for {self.timeout:g} s while "
                        f"partition(s) {sorted(todo)} were not read to their end offsets"
                    )
                continue
            idle_deadline = time.monotonic() + self.timeout
            for msg in msgs:
                p, offset = msg.partition(), msg.offset()
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if p in todo and offset is not None:
                            self._reach(p, offset)
                            todo.discard(p)
                        continue
                    self.read_errors[f"{err.name()}: {err.str()}"] += 1
                    continue
                assert p is not None and offset is not None
                if p not in todo:
                    continue
                if offset >= self.ends[p]:  # past the end seen at start: read to the end
                    self._reach(p, self.ends[p])
                    todo.discard(p)
                    continue
                self._reach(p, offset + 1)
                yield _Record(msg=msg, info=parse_dead_letter_headers(msg.headers()))
                done += 1
                if offset + 1 >= self.ends[p]:
                    todo.discard(p)
            if progress is not None:
                progress(done, self.total)

    def _reach(self, partition: int, position: int) -> None:
        """The position reached in ``partition``, never past the end seen at start (records
        after it were not read) nor back."""
        reached = min(position, self.ends[partition])
        self.reached[partition] = max(self.reached.get(partition, reached), reached)

    def missing(self, topic: str) -> str | None:
        """Why records cannot be written to ``topic`` (it does not exist), else None."""
        if topic not in self._exists:
            try:
                meta = self.consumer.list_topics(topic, timeout=self.timeout).topics.get(topic)
            except KafkaException as exc:
                self._exists[topic] = f"topic {topic} not checked: {exc.args[0].str()}"
            else:
                if meta is None or meta.error is not None:
                    why = meta.error.name() if meta is not None and meta.error else "missing"
                    self._exists[topic] = f"topic {topic} does not exist ({why})"
                else:
                    self._exists[topic] = None
        return self._exists[topic]

    def commit(self, positions: Mapping[int, int]) -> None:
        """Commit ``positions`` (partition -> next offset to read) for the group."""
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(positions.items())]
        self._retrying(lambda: self.consumer.commit(offsets=offsets, asynchronous=False))

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, retried while the group coordinator moves or loads (retriable errors
        such as NOT_COORDINATOR), for at most ``timeout`` seconds."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return call()
            except KafkaException as exc:
                if not classify(exc).retriable or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)  # the coordinator needs a moment; nothing else to wait on

    def close(self) -> None:
        with contextlib.suppress(KafkaException, RuntimeError):
            self.consumer.close()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _client_config(
    bootstrap_servers: str | None, config: Mapping[str, Any] | None
) -> dict[str, Any]:
    if not bootstrap_servers:
        raise ConfigError(
            f"no bootstrap servers: pass -b HOSTS or set ${_BOOTSTRAP_ENV}",
            key="bootstrap.servers",
        )
    conf = dict(config or {})
    conf["bootstrap.servers"] = bootstrap_servers
    return conf


# --------------------------------------------------------------------------- inspect


def inspect_dead_letters(
    topic: str,
    *,
    bootstrap_servers: str,
    config: Mapping[str, Any] | None = None,
    group: str | None = None,
    limit: int = 50,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Progress | None = None,
) -> InspectResult:
    """Read the dead-letter ``topic`` and count its records by error and source topic.

    Keeps the first ``limit`` records (all counts cover every record). ``config``: extra
    client properties (security settings). ``group``: start from its committed offsets
    (nothing is committed). ``timeout``: seconds to wait for the cluster, and without
    records while reading. ``progress(done, total)`` is called as records arrive.

    Raises :class:`~kresilient.errors.KafkaClientError` (its ``message`` one line naming each
    host and why) when the cluster cannot be reached, :class:`~kresilient.errors.ConfigError`
    for a missing topic or bad input.
    """
    conf = _client_config(bootstrap_servers, config)
    by_error: Counter[tuple[str, str]] = Counter()
    by_source: Counter[str] = Counter()
    kept: list[InspectedRecord] = []
    total = key_bytes = value_bytes = header_bytes = not_dead = 0
    with _Reader(conf, topic, group, timeout) as reader:
        for record in reader.records(progress):
            total += 1
            msg, info = record.msg, record.info
            item = InspectedRecord(
                topic=topic,
                partition=msg.partition() or 0,
                offset=msg.offset() or 0,
                key=msg.key(),
                value=msg.value(),
                headers=tuple(_headers(msg)),
                info=info,
            )
            k, v, h = item.sizes
            key_bytes, value_bytes, header_bytes = key_bytes + k, value_bytes + v, header_bytes + h
            if not info.is_dead_letter:
                not_dead += 1
            by_error[(info.error_category or "-", info.exception_type or "-")] += 1
            by_source[info.original_topic or "-"] += 1
            if len(kept) < limit:
                kept.append(item)
        read_errors = dict(reader.read_errors)
    return InspectResult(
        topic=topic,
        read=total,
        records=tuple(kept),
        not_shown=total - len(kept),
        not_dead_letters=not_dead,
        read_errors=read_errors,
        key_bytes=key_bytes,
        value_bytes=value_bytes,
        header_bytes=header_bytes,
        by_error=dict(by_error.most_common()),
        by_source_topic=dict(by_source.most_common()),
    )


def _headers(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode("utf-8") if isinstance(v, str) else v) for k, v in items]


# --------------------------------------------------------------------------- replay


def replay_dead_letters(
    source: str,
    *,
    bootstrap_servers: str,
    target: str | None = None,
    filters: Sequence[Filter] = (),
    group: str | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    keep_timestamp: bool = False,
    config: Mapping[str, Any] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    logger: Any = None,
    progress: Progress | None = None,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    force: bool = False,
) -> ReplayResult:
    """Write the selected dead letters of ``source`` back: each record's original key, value
    and headers, to ``target`` or to the record's original topic.

    ``filters``: ``"FIELD=VALUE"``/``"FIELD~TEXT"`` strings or predicates on
    :class:`~kresilient.deadletter.DeadLetterInfo`, all of which must match. ``limit``: at
    most this many records are sent; the rest stay for a later run. ``group``: start from its
    committed offsets and commit, per partition, up to the first record not replayed (see
    the module docstring). ``keep_timestamp``: reuse the original record timestamp.
    ``config``: extra client properties (security settings). ``timeout``: seconds to wait for
    the cluster, and without progress while reading or delivering. ``logger``: a structlog
    logger for the producer (default: the library's). ``progress(done, total)`` is called as
    records are read. ``max_replays``: a record whose ``kresilient.replay.count`` header
    says it was replayed that often already is refused (counted in ``refused``, left behind
    for the group); ``force=True`` replays it anyway. Each replayed record's count goes up
    by one.

    Returns a :class:`ReplayResult` (records that failed are counted there, with reasons);
    raises :class:`~kresilient.errors.KafkaClientError` (``message``: one line naming each
    host and why) when the cluster cannot be reached and
    :class:`~kresilient.errors.ConfigError` for a bad filter or a missing source topic.
    """
    conf = _client_config(bootstrap_servers, config)
    predicates = _predicates(filters)
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}", key=None)
    if isinstance(max_replays, bool) or not isinstance(max_replays, int) or max_replays < 0:
        raise ConfigError(f"max_replays must be a whole number >= 0, got {max_replays!r}", key=None)
    refused: list[RefusedRecord] = []
    counts: Counter[str] = Counter()
    # The group's commit may only pass records this run is done with: replayed (delivery
    # acknowledged) or excluded by the filters. Per partition: the position the reader
    # reached and the first offset left behind (limit, no original topic, failed).
    left_at: dict[int, int] = {}
    sender = _Sender(conf, left_at, timeout=timeout, keep_timestamp=keep_timestamp, logger=logger)
    committed: dict[int, int] | None = None
    commit_error: str | None = None
    with _Reader(conf, source, group, timeout) as reader, sender:
        for record in reader.records(progress):
            counts["read"] += 1
            info, msg = record.info, record.msg
            part, offset = msg.partition() or 0, msg.offset() or 0
            if not all(p(info) for p in predicates):
                counts["filtered_out"] += 1
                continue
            count = replay_count(info.original_headers)
            if not force and (count is None or count >= max_replays):
                # Left behind like a record without a topic: the group never moves past a
                # record nobody replayed, and the run exits 1 until someone decides.
                counts["refused"] += 1
                left_at.setdefault(part, offset)
                if len(refused) < _REFUSED_KEPT:
                    refused.append(
                        RefusedRecord(
                            partition=part,
                            offset=offset,
                            original_topic=info.original_topic,
                            original_partition=info.original_partition,
                            original_offset=info.original_offset,
                            replay_count=count,
                        )
                    )
                continue
            if limit is not None and counts["selected"] >= limit:
                counts["limited"] += 1
                left_at.setdefault(part, offset)
                continue
            to = target or info.original_topic
            if not to:
                counts["no_topic"] += 1
                left_at.setdefault(part, offset)
                continue
            if group is not None and part in left_at:
                # The group's offset stays before the record left behind; sending the ones
                # after it now would send them again on the next run.
                counts["held_back"] += 1
                continue
            counts["selected"] += 1
            missing = reader.missing(to)
            if missing is not None:
                sender.fail(part, offset, to, missing)
            elif dry_run:
                sender.by_target[to] += 1
            else:
                headers = counted_headers(info.original_headers, count, max_replays)
                sender.send(part, offset, to, msg, headers, info.original_timestamp)
        sender.settle()
        if group is not None and not dry_run and reader.reached:
            # The position reached, not "last record read + 1": on a transactional topic the
            # end is past a commit marker (or aborted records) no consumer is given, and a
            # commit before it would make every run start there again.
            positions = {p: left_at.get(p, pos) for p, pos in reader.reached.items()}
            try:
                reader.commit(positions)
                committed = positions
            except KafkaException as exc:  # replayed, but the group did not move
                commit_error = f"{exc.args[0].str() if exc.args else exc}"
        read_errors = dict(reader.read_errors)
    return ReplayResult(
        source=source,
        dry_run=dry_run,
        read=counts["read"],
        replayed=sum(sender.by_target.values()),
        by_target=dict(sender.by_target.most_common()),
        filtered_out=counts["filtered_out"],
        limited=counts["limited"],
        no_topic=counts["no_topic"],
        held_back=counts["held_back"],
        failed=sum(sender.failures.values()),
        failures=dict(sender.failures.most_common()),
        read_errors=read_errors,
        limit=limit,
        group=group,
        committed=committed,
        commit_error=commit_error,
        refused=counts["refused"],
        refused_records=tuple(refused),
        max_replays=max_replays,
        force=force,
    )


def replay_count(headers: Sequence[tuple[str, bytes | None]]) -> int | None:
    """The ``kresilient.replay.count`` of a record's headers: 0 without the header, ``None``
    when it is not a whole number >= 0. The last occurrence wins, as with Java's
    ``Headers.lastHeader()``."""
    value: bytes | None = b"0"
    for name, raw in headers:
        if name == REPLAY_COUNT:
            value = raw
    try:
        text = (value or b"").decode("ascii")
    except UnicodeDecodeError:
        return None
    if not text.isdigit():  # also refuses "", "-1", " 2" and non-ASCII digits
        return None
    return int(text)


def counted_headers(
    headers: Sequence[tuple[str, bytes | None]], count: int | None, max_replays: int
) -> list[tuple[str, bytes | None]]:
    """``headers`` with the replay count set to ``count + 1``, in place of its last
    occurrence (appended when there was none); every other header byte for byte. An
    unreadable count (``None``, replayed with ``force``) becomes ``max_replays + 1``: it was
    refused at the limit, so it is at least past it now."""
    new = str((max_replays if count is None else count) + 1).encode("ascii")
    out = list(headers)
    for i in range(len(out) - 1, -1, -1):
        if out[i][0] == REPLAY_COUNT:
            out[i] = (REPLAY_COUNT, new)
            return out
    out.append((REPLAY_COUNT, new))
    return out


@dataclass(frozen=True, kw_only=True)
class _Sent:
    part: int
    offset: int
    target: str
    msg: Message
    headers: list[tuple[str, bytes | None]]
    timestamp: int | None
    handle: Any  # a DeliveryHandle


class _Sender:
    """Writes replayed records with one :class:`~kresilient.ResilientProducer` (made on first
    use), settling them in windows so memory stays bounded: each record's outcome counts
    into ``by_target`` or ``failures``, and a failed one marks ``left_at`` for the group."""

    WINDOW: Final = 10_000

    def __init__(
        self,
        conf: Mapping[str, Any],
        left_at: dict[int, int],
        *,
        timeout: float,
        keep_timestamp: bool,
        logger: Any,
    ) -> None:
        self.conf, self.left_at, self.timeout = conf, left_at, timeout
        self.keep_timestamp, self.logger = keep_timestamp, logger
        self.producer: Any = None
        self.window: list[_Sent] = []
        self.by_target: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()

    def _produce(
        self,
        to: str,
        msg: Message,
        headers: list[tuple[str, bytes | None]],
        timestamp: int | None,
    ) -> Any:
        if self.producer is None:
            from kresilient.producer import ResilientProducer

            self.producer = ResilientProducer(dict(self.conf), logger=self.logger)
        return self.producer.produce(
            to,
            msg.value(),
            key=msg.key(),
            headers=list(headers),
            timestamp=timestamp if self.keep_timestamp else None,
        )

    def send(
        self,
        part: int,
        offset: int,
        to: str,
        msg: Message,
        headers: list[tuple[str, bytes | None]],
        timestamp: int | None,
    ) -> None:
        try:
            handle = self._produce(to, msg, headers, timestamp)
        except KafkaClientError as exc:
            self.fail(part, offset, to, f"{exc.name}: {exc.remedy}")
            return
        self.window.append(
            _Sent(
                part=part,
                offset=offset,
                target=to,
                msg=msg,
                headers=headers,
                timestamp=timestamp,
                handle=handle,
            )
        )
        if len(self.window) >= self.WINDOW:
            self.settle()

    def fail(self, part: int, offset: int, to: str, why: str) -> None:
        self.failures[f"{to}: {why}"] += 1
        self.left_at[part] = min(self.left_at.get(part, offset), offset)

    def settle(self) -> None:
        """Wait for the window's deliveries and count each outcome. A record failed as too
        large is sent again alone once: librdkafka fails a whole batch when the broker
        refuses one of its records, and the others would fit."""
        if not self.window:
            return
        _deliver(self.producer, self.timeout)
        window, self.window = self.window, []
        for item in window:
            error = self._outcome(item.handle)
            if isinstance(error, KafkaClientError) and error.code in TOO_LARGE_CODES:
                error = self._alone(item)
            if error is None:
                self.by_target[item.target] += 1
            elif isinstance(error, KafkaClientError):
                self.fail(item.part, item.offset, item.target, f"{error.name}: {error.remedy}")
            else:
                self.fail(item.part, item.offset, item.target, error)

    def _outcome(self, handle: Any) -> KafkaClientError | str | None:
        if not handle.done():
            return f"not acknowledged within {self.timeout:g} s (--timeout)"
        error: KafkaClientError | None = handle.exception(0)
        return error

    def _alone(self, item: _Sent) -> KafkaClientError | str | None:
        try:
            handle = self._produce(item.target, item.msg, item.headers, item.timestamp)
        except KafkaClientError as exc:
            return exc
        _deliver(self.producer, self.timeout)
        return self._outcome(handle)

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.producer is not None:
            with contextlib.suppress(DeliveryError):  # every outcome was counted already
                self.producer.close(0)


def _deliver(producer: Any, timeout: float) -> None:
    """Wait until every replayed record is acknowledged or failed, giving up after
    ``timeout`` seconds without progress (what is left then is reported as failed)."""
    waiting = len(producer)
    quiet_since = time.monotonic()
    while True:
        # poll, not flush(1.0): each record's outcome reaches its handle either way, but a
        # flush that times out with records still on their way raised a DeliveryError and
        # logged `delivery_failures failed=0 remaining=N` at WARNING on stderr for every second
        # the acknowledgements took (a slow cluster): a warning about nothing.
        producer.poll(1.0)
        left = len(producer)
        if left == 0:
            return
        now = time.monotonic()
        if left < waiting:
            waiting, quiet_since = left, now
        elif now - quiet_since >= timeout:
            return


# --------------------------------------------------------------------------- CLI


def _arg(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    """Namespaces built by hand (older examples) may lack the newer options."""
    return getattr(args, name, default)


def _properties(args: argparse.Namespace) -> dict[str, str]:
    """Client properties from ``--command-config`` and ``-X`` (``-X`` wins)."""
    config: dict[str, str] = {}
    path = _arg(args, "command_config")
    if path:
        # Java properties, as the Kafka tools read --command-config, with the one reader
        # lint, audit, doctor and topic create use (UTF-8, or Latin-1 as Java reads it).
        config.update(read_command_config(path)[0])
    for item in _arg(args, "property") or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"-X expects key=value, got {item!r}", key=key)
        config[key.strip()] = value.strip()
    return config


def _fail(command: str, exc: BaseException) -> int:
    message = getattr(exc, "message", None) or str(exc)
    sys.stderr.write(f"kresilient dlq {command}: {message}\n")
    return 2


class _ProgressLine:
    """``read 12,345 of 200,000 records`` on stderr, rewritten in place at most 4 times a
    second; only when stdout and stderr are terminals (scripts get clean output)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.shown = 0.0
        self.used = False

    @staticmethod
    def wanted() -> bool:
        return sys.stdout.isatty() and sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.shown < 0.25:
            return
        self.shown, self.used = now, True
        sys.stderr.write(f"\r{self.label} {done:,} of {total:,} records")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.used:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _stderr_logger() -> Any:
    """A structlog logger for the replay producer: warnings and errors only, to stderr
    (the CLI's stdout carries results; ``producer_created`` with the config is not one)."""
    return structlog.wrap_logger(
        structlog.PrintLogger(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.KeyValueRenderer(key_order=["level", "event"]),
        ],
    )


def _width(*numbers: int) -> int:
    return max(len(f"{n:,}") for n in numbers) if numbers else 1


def main_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``kresilient dlq inspect``: print the records and counts; returns the exit code."""
    out = out or sys.stdout
    progress = _ProgressLine("read") if _ProgressLine.wanted() else None
    try:
        result = inspect_dead_letters(
            args.topic,
            bootstrap_servers=args.bootstrap_servers,
            config=_properties(args),
            group=_arg(args, "group"),
            limit=_arg(args, "limit", 50),
            timeout=_arg(args, "timeout", DEFAULT_TIMEOUT),
            progress=progress,
        )
    except (KResilientError, KafkaException, OSError) as exc:
        return _fail("inspect", exc)
    finally:
        if progress is not None:
            progress.clear()
    data = bool(_arg(args, "show_data", False))
    if _arg(args, "json", False):
        for record in result.records:
            out.write(json.dumps({"record": record.as_dict(data=data)}) + "\n")
        out.write(json.dumps({"summary": result.summary()}) + "\n")
        return 0
    for record in result.records:
        _print_record(out, record, brief=bool(_arg(args, "brief", False)), data=data)
    _print_inspect_summary(out, result, _arg(args, "limit", 50))
    return 0


def _print_record(out: TextIO, record: InspectedRecord, *, brief: bool, data: bool) -> None:
    info = record.info
    ksize, vsize, hsize = record.sizes
    out.write(
        f"{record.topic}[{record.partition}]@{record.offset}  key {ksize} B  value {vsize} B  "
        f"headers {len(record.headers)} ({hsize} B)  format {info.format or '-'}\n"
    )
    if info.is_dead_letter:
        message = _header_text("message", (info.exception_message or "").encode())
        attempts = info.attempts if info.attempts is not None else "-"
        out.write(
            f"  source     {info.original_topic}[{info.original_partition}]"
            f"@{info.original_offset}  group {info.consumer_group or '-'}\n"
            f"  error      {info.error_category or '-'}  {info.exception_type or '-'}: "
            f"{message}\n"
            f"  attempts   {attempts}  failed at {info.failed_at or '-'}\n"
        )
    if data:
        out.write(f"  key        {show_bytes(record.key)}\n")
        out.write(f"  value      {show_bytes(record.value)}\n")
    if not brief:
        for name, value in record.headers:
            out.write(f"    {name} = {_header_text(name, value)}\n")


def _print_inspect_summary(out: TextIO, result: InspectResult, limit: int) -> None:
    rows: list[tuple[int, str]] = [(result.read, f"records in {result.topic}")]
    rows.append((len(result.records), "shown"))
    if result.not_shown:
        rows.append((result.not_shown, f"not shown (--limit {limit})"))
    if result.not_dead_letters:
        rows.append((result.not_dead_letters, "without dead-letter headers"))
    for reason, n in result.read_errors.items():
        rows.append((n, f"read errors: {reason}"))
    w = _width(*(n for n, _ in rows))
    out.write("\n")
    for n, what in rows:
        out.write(f"{n:>{w},}  {what}\n")
    out.write(
        f"keys {result.key_bytes:,} B, values {result.value_bytes:,} B, "
        f"headers {result.header_bytes:,} B\n"
    )
    if result.by_error:
        w = max(5, _width(*result.by_error.values()))
        out.write(f"\n{'count':>{w}}  {'category':<16}  exception\n")
        for (category, exception), n in result.by_error.items():
            out.write(f"{n:>{w},}  {category:<16}  {exception}\n")
        w = max(5, _width(*result.by_source_topic.values()))
        out.write(f"\n{'count':>{w}}  source topic\n")
        for source, n in result.by_source_topic.items():
            out.write(f"{n:>{w},}  {source}\n")


def main_replay(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``kresilient dlq replay``: replay and print the summary; returns the exit code."""
    out = out or sys.stdout
    progress = _ProgressLine("replay: read") if _ProgressLine.wanted() else None
    try:
        result = replay_dead_letters(
            args.source,
            bootstrap_servers=args.bootstrap_servers,
            target=_arg(args, "target"),
            filters=list(_arg(args, "filters", []) or []),
            group=_arg(args, "group"),
            limit=_arg(args, "limit"),
            dry_run=bool(_arg(args, "dry_run", False)),
            keep_timestamp=bool(_arg(args, "keep_timestamp", False)),
            config=_properties(args),
            timeout=_arg(args, "timeout", DEFAULT_TIMEOUT),
            logger=_stderr_logger(),
            progress=progress,
            max_replays=_arg(args, "max_replays", DEFAULT_MAX_REPLAYS),
            force=bool(_arg(args, "force", False)),
        )
    except (KResilientError, KafkaException, OSError) as exc:
        return _fail("replay", exc)
    finally:
        if progress is not None:
            progress.clear()
    if _arg(args, "json", False):
        out.write(json.dumps({"summary": result.summary()}) + "\n")
    else:
        _print_replay_summary(out, result)
    if result.group is None and not result.dry_run and result.replayed:
        # Issue 36: a second run without --group replayed the same records again, silently.
        # Warned, not made idempotent with a default group: see docs/deadletter.md.
        sys.stderr.write(
            f"kresilient dlq replay: warning: without --group nothing records this run, so "
            f"running it again replays these {result.replayed:,} record(s) again; use "
            "--group NAME for runs that continue where the last one stopped\n"
        )
    return 0 if result.ok else 1


def _print_replay_summary(out: TextIO, r: ReplayResult) -> None:
    verb = "would be replayed (dry run)" if r.dry_run else "replayed"
    targets = ", ".join(f"{n:,} to {t}" for t, n in r.by_target.items())
    rows: list[tuple[int, str]] = [
        (r.read, f"records read from {r.source}"),
        (r.replayed, verb + (f": {targets}" if targets else "")),
    ]
    optional = [
        (r.filtered_out, "filtered out (--filter)"),
        (r.limited, f"left for a later run (--limit {r.limit})"),
        (r.no_topic, "without an original topic, not replayed (pass --to TOPIC)"),
        (r.held_back, "held back behind a record not replayed (replayed by the next run)"),
        (
            r.refused,
            f"REFUSED: replayed {r.max_replays} times already (--max-replays "
            f"{r.max_replays}; --force replays them anyway)",
        ),
        (r.failed, "FAILED"),
    ]
    rows += [(n, what) for n, what in optional if n]
    rows += [(n, f"read errors: {why}") for why, n in r.read_errors.items()]
    w = _width(*(n for n, _ in rows), *r.failures.values())
    for n, what in rows:
        out.write(f"{n:>{w},}  {what}\n")
    for why, n in r.failures.items():
        out.write(f"{'':>{w}}  {n:>{w},} x {why}\n")
    for refused in r.refused_records[:_REFUSED_SHOWN]:
        out.write(f"{'':>{w}}  refused {refused.describe(r.source)}\n")
    if r.refused > _REFUSED_SHOWN:
        out.write(
            f"{'':>{w}}  ... and {r.refused - _REFUSED_SHOWN:,} more refused (--json lists "
            f"the first {_REFUSED_KEPT:,})\n"
        )
    if r.commit_error is not None:
        out.write(
            f"group {r.group}: COMMIT FAILED ({r.commit_error}); the next run with --group "
            "sends these records again\n"
        )
    if r.committed is not None:
        positions = ", ".join(
            f"partition {p} at offset {o:,}" for p, o in sorted(r.committed.items())
        )
        out.write(f"group {r.group} committed: {positions}\n")
