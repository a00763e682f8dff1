"""``kresilient dlq inspect`` and ``kresilient dlq replay``: look at and bring back dead letters.

::

    kresilient dlq inspect orders.dlq -b 127.0.0.1:9092            # records, headers, counts
    kresilient dlq inspect orders.dlq --json                        # one JSON object per line
    kresilient dlq replay --from orders.dlq --to orders \\
        --filter category=poison --filter exception=JSONDecodeError --dry-run

Both read the dead-letter topic from its beginning (or a group's committed offsets with
``--group``) up to the end offsets seen at start, with a consumer that commits nothing (replay
``--group`` commits after every replayed record was acknowledged). Records of the kresilient,
Spring Kafka (``kafka_dlt-*``) and Kafka Streams (``__streams.errors.*``) formats are decoded.
Replay writes each selected record's ORIGINAL key, value and headers (the dead-letter headers
stripped) with a :class:`~kresilient.ResilientProducer`.

Filters (repeatable, all must match): ``FIELD=VALUE`` (equal, case-insensitive) or
``FIELD~TEXT`` (contains), FIELD one of ``category``, ``exception`` (full or short class
name), ``message``, ``topic`` (original), ``partition`` (original), ``group``, ``attempts``,
``format``.

Connection: ``-b/--bootstrap-servers`` (default ``$KRESILIENT_BOOTSTRAP_SERVERS``),
``--command-config FILE`` (client properties, e.g. security) and ``-X key=value``.
Exit codes: 0 done, 1 some records could not be replayed, 2 usage or connection error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import struct
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

from kresilient.deadletter import (
    SPRING_ORIGINAL_OFFSET,
    SPRING_ORIGINAL_PARTITION,
    SPRING_ORIGINAL_TIMESTAMP,
    DeadLetterInfo,
    parse_dead_letter_headers,
)
from kresilient.errors import ConfigError, DeliveryError, KResilientError

__all__ = ["main_inspect", "main_replay", "register"]

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


# --------------------------------------------------------------------------- CLI wiring


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``dlq inspect`` and ``dlq replay`` to the ``kresilient`` CLI."""
    dlq = subparsers.add_parser(
        "dlq", help="inspect or replay dead-letter topics", description=__doc__.split("\n")[0]
    )
    sub = dlq.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND")
    dlq.set_defaults(func=lambda _args: _usage(dlq))

    inspect = sub.add_parser(
        "inspect",
        help="show dead-letter records: decoded headers, sizes, counts by error",
        description="Show the records of a dead-letter topic and count them by error.",
    )
    inspect.add_argument("topic", metavar="TOPIC", help="the dead-letter topic")
    inspect.add_argument(
        "--limit", type=int, default=50, help="records to print (default 50; counts cover all)"
    )
    inspect.add_argument("--brief", action="store_true", help="no per-header listing")
    inspect.add_argument("--json", action="store_true", help="JSON lines: records, then counts")
    _connection(inspect)
    inspect.set_defaults(func=main_inspect)

    replay = sub.add_parser(
        "replay",
        help="write dead-letter records back (original key, value, headers)",
        description="Write selected dead-letter records back to a topic.",
    )
    replay.add_argument("--from", dest="source", required=True, metavar="TOPIC.dlq")
    replay.add_argument(
        "--to",
        dest="target",
        metavar="TOPIC",
        help="destination (default: each record's original topic)",
    )
    replay.add_argument(
        "--filter",
        dest="filters",
        action="append",
        default=[],
        metavar="FIELD=VALUE|FIELD~TEXT",
        help=f"select records (repeatable, AND); FIELD in {', '.join(_FIELDS)}",
    )
    replay.add_argument("--dry-run", action="store_true", help="only count what would be sent")
    replay.add_argument("--limit", type=int, default=None, help="replay at most N records")
    replay.add_argument(
        "--keep-timestamp", action="store_true", help="reuse the original record timestamp"
    )
    _connection(replay)
    replay.set_defaults(func=main_replay)


def _connection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        "-b",
        default=os.environ.get(_BOOTSTRAP_ENV),
        metavar="HOSTS",
        help=f"default ${_BOOTSTRAP_ENV}",
    )
    parser.add_argument(
        "--command-config", metavar="FILE", help="client properties file (security settings)"
    )
    parser.add_argument(
        "-X",
        dest="property",
        action="append",
        metavar="KEY=VALUE",
        help="extra client property (repeatable)",
    )
    parser.add_argument(
        "--group",
        default=None,
        help="read from (and, for replay, commit to) this consumer group's offsets",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the cluster"
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _client_config(args: argparse.Namespace) -> dict[str, str]:
    if not args.bootstrap_servers:
        raise ConfigError(
            f"no bootstrap servers: pass -b HOSTS or set ${_BOOTSTRAP_ENV}",
            key="bootstrap.servers",
        )
    config: dict[str, str] = {}
    if args.command_config:
        with open(args.command_config, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                text = line.strip()
                if not text or text[0] in "#!":
                    continue
                key, sep, value = text.partition("=")
                if not sep:
                    raise ConfigError(
                        f"{args.command_config}:{number}: expected key=value", key=key.strip()
                    )
                config[key.strip()] = value.strip()
    for item in args.property or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"-X expects key=value, got {item!r}", key=key)
        config[key.strip()] = value.strip()
    config["bootstrap.servers"] = args.bootstrap_servers
    return config


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, kw_only=True)
class _Record:
    msg: Message
    info: DeadLetterInfo


def _read(
    config: dict[str, str], topic: str, group: str | None, timeout: float
) -> Iterator[_Record]:
    """Every record of ``topic`` up to the end offsets seen at start (from the group's
    committed offsets when ``group`` is given, else from the beginning)."""
    conf: dict[str, Any] = dict(config)
    conf.update(
        {
            "group.id": group or f"kresilient-dlq-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    consumer = Consumer(conf)
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            reason = meta.error.str() if meta is not None and meta.error is not None else "missing"
            raise ConfigError(f"topic {topic!r} is not readable: {reason}", key=None)
        parts = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            starts[tp.partition], ends[tp.partition] = low, high
        if group is not None:
            for tp in consumer.committed(parts, timeout=timeout):
                if tp.offset >= 0:
                    starts[tp.partition] = max(starts[tp.partition], tp.offset)
        todo = {p for p in ends if starts[p] < ends[p]}
        if not todo:
            return
        consumer.assign(
            [
                TopicPartition(topic, p, starts[p] if group is not None else OFFSET_BEGINNING)
                for p in sorted(todo)
            ]
        )
        idle_deadline = time.monotonic() + timeout
        while todo:
            msgs = consumer.consume(500, 1.0)
            if not msgs:
                if time.monotonic() > idle_deadline:
                    raise KResilientError(
                        f"no records from {topic} for {timeout:g} s while "
                        f"{sorted(todo)} were not read to their end offsets"
                    )
                continue
            idle_deadline = time.monotonic() + timeout
            for msg in msgs:
                if msg.error() is not None:
                    continue
                p, offset = msg.partition(), msg.offset()
                assert p is not None and offset is not None
                if p not in todo or offset >= ends[p]:
                    continue
                yield _Record(msg=msg, info=parse_dead_letter_headers(msg.headers()))
                if offset + 1 >= ends[p]:
                    todo.discard(p)
    finally:
        consumer.close()


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


def _parse_filter(text: str) -> Callable[[DeadLetterInfo], bool]:
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


# --------------------------------------------------------------------------- inspect


def _decode(name: str, value: bytes | None) -> str:
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
        return (lines[-1] if lines else "") + f"  [{len(lines)} lines]"
    return text if len(text) <= _MESSAGE_WIDTH else text[:_MESSAGE_WIDTH] + "..."


def _headers(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    items = raw.items() if isinstance(raw, dict) else raw
    return [(k, v.encode("utf-8") if isinstance(v, str) else v) for k, v in items]


def _sizes(msg: Message) -> tuple[int, int, int]:
    key, value, headers = msg.key(), msg.value(), _headers(msg)
    hsize = sum(len(k) + (len(v) if v is not None else 0) for k, v in headers)
    return len(key or b""), len(value or b""), hsize


def _as_json(record: _Record) -> dict[str, Any]:
    msg, info = record.msg, record.info
    ksize, vsize, hsize = _sizes(msg)
    return {
        "partition": msg.partition(),
        "offset": msg.offset(),
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
        "headers": [[k, _decode(k, v)] for k, v in _headers(msg)],
    }


def _print_record(out: TextIO, record: _Record, brief: bool) -> None:
    msg, info = record.msg, record.info
    ksize, vsize, hsize = _sizes(msg)
    headers = _headers(msg)
    out.write(
        f"{msg.topic()}[{msg.partition()}]@{msg.offset()}  key {ksize} B  value {vsize} B  "
        f"headers {len(headers)} ({hsize} B)  format {info.format or '-'}\n"
    )
    if info.is_dead_letter:
        out.write(
            f"  source     {info.original_topic}[{info.original_partition}]"
            f"@{info.original_offset}  group {info.consumer_group or '-'}\n"
            f"  error      {info.error_category or '-'}  {info.exception_type or '-'}: "
            f"{_decode('message', (info.exception_message or '').encode())}\n"
            f"  attempts   {info.attempts if info.attempts is not None else '-'}  "
            f"failed at {info.failed_at or '-'}\n"
        )
    if not brief:
        for name, value in headers:
            out.write(f"    {name} = {_decode(name, value)}\n")


def _error_key(info: DeadLetterInfo) -> tuple[str, str]:
    return (info.error_category or "-", info.exception_type or "-")


def main_inspect(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``kresilient dlq inspect``."""
    out = out or sys.stdout
    try:
        config = _client_config(args)
        by_error: Counter[tuple[str, str]] = Counter()
        by_source: Counter[str] = Counter()
        total = key_bytes = value_bytes = header_bytes = 0
        for record in _read(config, args.topic, args.group, args.timeout):
            total += 1
            k, v, h = _sizes(record.msg)
            key_bytes, value_bytes, header_bytes = key_bytes + k, value_bytes + v, header_bytes + h
            by_error[_error_key(record.info)] += 1
            by_source[record.info.original_topic or "-"] += 1
            if total <= args.limit:
                if args.json:
                    out.write(json.dumps({"record": _as_json(record)}) + "\n")
                else:
                    _print_record(out, record, args.brief)
    except (KResilientError, KafkaException, OSError) as exc:
        sys.stderr.write(f"kresilient dlq inspect: {exc}\n")
        return 2
    if args.json:
        out.write(
            json.dumps(
                {
                    "summary": {
                        "topic": args.topic,
                        "records": total,
                        "key_bytes": key_bytes,
                        "value_bytes": value_bytes,
                        "header_bytes": header_bytes,
                        "by_error": [
                            {"category": c, "exception": e, "count": n}
                            for (c, e), n in by_error.most_common()
                        ],
                        "by_source_topic": dict(by_source.most_common()),
                    }
                }
            )
            + "\n"
        )
        return 0
    if total > args.limit:
        out.write(f"... {total - args.limit} more records not shown (--limit)\n")
    out.write(
        f"\n{args.topic}: {total} records; keys {key_bytes} B, values {value_bytes} B, "
        f"headers {header_bytes} B\n"
    )
    if by_error:
        out.write("\ncount  category          exception\n")
        for (category, exception), n in by_error.most_common():
            out.write(f"{n:>5}  {category:<16}  {exception}\n")
        out.write("\ncount  source topic\n")
        for source, n in by_source.most_common():
            out.write(f"{n:>5}  {source}\n")
    return 0


# --------------------------------------------------------------------------- replay


def main_replay(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``kresilient dlq replay``."""
    out = out or sys.stdout
    try:
        config = _client_config(args)
        predicates = [_parse_filter(f) for f in args.filters]
        return _replay(args, config, predicates, out)
    except (KResilientError, KafkaException, OSError) as exc:
        sys.stderr.write(f"kresilient dlq replay: {exc}\n")
        return 2


def _replay(
    args: argparse.Namespace,
    config: dict[str, str],
    predicates: Sequence[Callable[[DeadLetterInfo], bool]],
    out: TextIO,
) -> int:
    from kresilient.producer import DeliveryHandle, ResilientProducer

    producer = None if args.dry_run else ResilientProducer(dict(config))
    seen = selected = 0
    skipped_no_topic = held_back = 0
    by_target: Counter[str] = Counter()
    # The group's commit may only pass records this run is done with: replayed (delivery
    # acknowledged) or excluded by the filters. Per partition: the last offset read, the first
    # offset left behind (cut by --limit, no original topic, or failed), and what was sent.
    last_read: dict[int, int] = {}
    left_at: dict[int, int] = {}
    sent: list[tuple[int, int, DeliveryHandle]] = []
    failed = 0
    try:
        for record in _read(config, args.source, args.group, args.timeout):
            seen += 1
            info, msg = record.info, record.msg
            part, offset = msg.partition() or 0, msg.offset() or 0
            last_read[part] = offset
            if not all(p(info) for p in predicates):
                continue
            if args.limit is not None and selected >= args.limit:
                left_at.setdefault(part, offset)
                continue
            target = args.target or info.original_topic
            if not target:
                skipped_no_topic += 1
                left_at.setdefault(part, offset)
                continue
            if args.group is not None and part in left_at:
                # The group's offset stays before the record left behind; sending the ones
                # after it now would send them again on the next run.
                held_back += 1
                continue
            selected += 1
            by_target[target] += 1
            if producer is not None:
                timestamp = info.original_timestamp if args.keep_timestamp else None
                handle = producer.produce(
                    target,
                    msg.value(),
                    key=msg.key(),
                    headers=list(info.original_headers),
                    timestamp=timestamp,
                )
                sent.append((part, offset, handle))
        if producer is not None:
            try:
                producer.flush(args.timeout)
            except DeliveryError as exc:
                sys.stderr.write(f"kresilient dlq replay: {exc}\n")
            for part, offset, handle in sent:
                if not handle.done() or handle.exception(0) is not None:
                    failed += 1
                    left_at[part] = min(left_at.get(part, offset), offset)
            if args.group is not None and last_read:
                commit = {p: left_at.get(p, last + 1) for p, last in last_read.items()}
                _commit(config, args.source, args.group, commit, args.timeout)
    finally:
        if producer is not None:
            with contextlib.suppress(DeliveryError):
                producer.close(args.timeout)
    verb = "would replay" if args.dry_run else "replayed"
    targets = ", ".join(f"{n} to {t}" for t, n in by_target.most_common()) or "nothing"
    out.write(
        f"{verb} {selected - failed} of {seen} records from {args.source} ({targets}); "
        f"{seen - selected - skipped_no_topic - held_back} filtered out"
        + (
            f", {skipped_no_topic} without an original topic (pass --to)"
            if skipped_no_topic
            else ""
        )
        + (f", {held_back} held back behind it (--group)" if held_back else "")
        + (f", {failed} FAILED" if failed else "")
        + "\n"
    )
    return 1 if failed else 0


def _commit(
    config: dict[str, str], topic: str, group: str, positions: dict[int, int], timeout: float
) -> None:
    """Commit ``positions`` (partition -> next offset to read) for ``group``."""
    conf: dict[str, Any] = dict(config)
    conf.update({"group.id": group, "enable.auto.commit": False})
    consumer = Consumer(conf)
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in sorted(positions.items())],
            asynchronous=False,
        )
    finally:
        consumer.close()


def _main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - manual use
    parser = argparse.ArgumentParser(prog="kresilient")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_main())
