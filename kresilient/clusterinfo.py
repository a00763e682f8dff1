"""Cluster facts that confluent-kafka's Admin API does not hand out directly.

Shared by ``kresilient doctor`` (one incident-time diagnosis) and ``kresilient audit`` (a
live-cluster check with rule ids), so both read the cluster the same way:

- :func:`describe_log_dirs`: each log dir of one broker with its volume's total and usable
  bytes (DescribeLogDirs v4, KIP-827). confluent-kafka has no DescribeLogDirs call, so the
  request is written by hand, over PLAINTEXT only;
- :func:`max_timestamps`: the largest record timestamp of each partition (ListOffsets with
  ``OffsetSpec.max_timestamp``, KIP-734), to find records stamped in the future;
- :func:`committed_record_timestamps` and :func:`newest_committed_record_ms`: the
  timestamp of the newest record a group committed
  past, the estimate of how long the group has been idle (Kafka does not expose the commit
  time itself through the Admin API; old producer timestamps overstate the idle time);
- :func:`permissive_future_bound`: whether a topic accepts records far in the future;
- :func:`committed_offsets`: the offsets a group committed, read by a consumer of the group
  instead of the Admin API's ListConsumerGroupOffsets, which crashes the process when the
  group's coordinator is not ready (librdkafka issue 5040; see the function).

What the Admin API does NOT expose, and these helpers therefore cannot report: a follower's
log end offset or its lag behind the high watermark (only the ISR, which a follower leaves
after ``replica.lag.time.max.ms``, and the broker's JMX ``ReplicaFetcherManager MaxLag``),
and the time of a group's last offset commit.

Example::

    from kresilient.clusterinfo import describe_log_dirs

    for d in describe_log_dirs("127.0.0.1", 9092, timeout=5):
        print(d.path, f"{1 - d.usable_bytes / d.total_bytes:.0%} used")
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]  # untyped re-export

__all__ = [
    "DISK_USAGE_THRESHOLD",
    "FUTURE_BOUND_MS",
    "FUTURE_TOLERANCE_MS",
    "LOG_DIR_ERRORS",
    "LogDir",
    "committed_offsets",
    "committed_record_timestamps",
    "describe_log_dirs",
    "max_timestamps",
    "newest_committed_record_ms",
    "permissive_future_bound",
]

#: Log-dir usage at or above this share of the volume is reported (the guides alert at 80%).
DISK_USAGE_THRESHOLD: Final = 0.80
#: A record timestamp this far ahead of the local clock is "in the future" by default.
FUTURE_TOLERANCE_MS: Final = 3_600_000
#: ``message.timestamp.after.max.ms`` above this (one day) lets far-future records in;
#: Kafka 4's own default is one hour (KIP-1030), Kafka 3's was unbounded.
FUTURE_BOUND_MS: Final = 86_400_000

_MAX_TIMESTAMP: Final[Any] = OffsetSpec.max_timestamp  # untyped in confluent-kafka
#: The group's coordinator is being created, loaded or moved: asking again will do.
_COORDINATOR_NOT_READY: Final = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError._WAIT_COORD,
    }
)
#: What a failed admin future raises (KafkaException, or TimeoutError from ``result()``).
_ADMIN_ERRORS: Final = (KafkaException, TimeoutError, ValueError, TypeError)


class LogDir(NamedTuple):
    """One log dir of a broker and the volume it lives on (bytes; -1 when not known)."""

    path: str
    total_bytes: int
    usable_bytes: int

    @property
    def used(self) -> float | None:
        """Share of the volume in use, or None when the broker did not report its size."""
        if self.total_bytes <= 0 or self.usable_bytes < 0:
            return None
        return 1 - self.usable_bytes / self.total_bytes


# --------------------------------------------------------------------------- DescribeLogDirs


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _skip_tags(buf: bytes, pos: int) -> int:
    count, pos = _varint(buf, pos)
    for _ in range(count):
        _, pos = _varint(buf, pos)
        size, pos = _varint(buf, pos)
        pos += size
    return pos


def _compact_str(buf: bytes, pos: int) -> tuple[str, int]:
    n, pos = _varint(buf, pos)
    if n == 0:
        return "", pos
    return buf[pos : pos + n - 1].decode("utf-8", "replace"), pos + n - 1


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def describe_log_dirs(host: str, port: int, timeout: float) -> list[LogDir]:
    """Each log dir of the broker at ``host:port`` with its volume's total and usable bytes.

    Sends DescribeLogDirs (API key 35, version 4, which carries the volume sizes since Kafka
    3.3, KIP-827) over a PLAINTEXT connection: confluent-kafka has no such call. Log dirs the
    broker reports with an error (an offline dir) are left out. Raises ``OSError`` when the
    broker cannot be reached, ``ValueError``/``struct.error``/``IndexError`` when it does not
    answer the request as expected.
    """
    header = struct.pack(">hhih", 35, 4, 1, 9) + b"kresilien" + b"\x00"
    body = b"\x00" + b"\x00"  # topics: null (all), no tagged fields
    request = header + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        buf = _recv_exact(sock, size)
    pos = 4  # correlation id
    pos = _skip_tags(buf, pos)
    pos += 4  # throttle_time_ms
    (error,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if error:
        raise ValueError(f"DescribeLogDirs error code {error}")
    count, pos = _varint(buf, pos)
    dirs = []
    for _ in range(max(count - 1, 0)):
        (dir_error,) = struct.unpack_from(">h", buf, pos)
        pos += 2
        path, pos = _compact_str(buf, pos)
        topics, pos = _varint(buf, pos)
        for _ in range(max(topics - 1, 0)):
            _, pos = _compact_str(buf, pos)
            parts, pos = _varint(buf, pos)
            for _ in range(max(parts - 1, 0)):
                pos += 4 + 8 + 8 + 1  # partition, size, offset lag, is-future
                pos = _skip_tags(buf, pos)
            pos = _skip_tags(buf, pos)
        total, usable = struct.unpack_from(">qq", buf, pos)
        pos += 16
        pos = _skip_tags(buf, pos)
        if not dir_error:
            dirs.append(LogDir(path, total, usable))
    return dirs


#: What :func:`describe_log_dirs` raises for a broker that cannot answer it.
LOG_DIR_ERRORS: Final = (OSError, ValueError, struct.error, IndexError)


# --------------------------------------------------------------------------- timestamps


def max_timestamps(
    admin: Any, partitions: Iterable[tuple[str, int]], timeout: float
) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], str]]:
    """The largest record timestamp (ms) of each non-empty partition, and why a partition
    could not be read: ``(timestamps, failures)``.

    One ListOffsets request with ``OffsetSpec.max_timestamp`` (brokers 3.0+, KIP-734);
    ``admin`` is an ``AdminClient``. An empty partition is in neither dict.
    """
    spec = {TopicPartition(t, p): _MAX_TIMESTAMP() for t, p in sorted(set(partitions))}
    found: dict[tuple[str, int], int] = {}
    failed: dict[tuple[str, int], str] = {}
    if not spec:
        return found, failed
    try:
        futures = admin.list_offsets(spec, request_timeout=timeout)
    except _ADMIN_ERRORS as exc:
        return found, dict.fromkeys(((tp.topic, tp.partition) for tp in spec), str(exc))
    for tp, future in futures.items():
        key = (tp.topic, tp.partition)
        try:
            info = future.result(timeout=timeout)
        except _ADMIN_ERRORS as exc:
            failed[key] = str(exc)
            continue
        if info.offset >= 0:
            found[key] = int(info.timestamp)
    return found, failed


def permissive_future_bound(conf: Mapping[str, str | None]) -> int | None:
    """``message.timestamp.after.max.ms`` when a topic with these configs accepts producer
    timestamps more than :data:`FUTURE_BOUND_MS` ahead of the broker's clock, else None.

    Only ``CreateTime`` topics keep the producer's timestamp; ``LogAppendTime`` replaces it.
    """
    after = conf.get("message.timestamp.after.max.ms")
    if conf.get("message.timestamp.type") != "CreateTime" or after is None:
        return None
    if not after.lstrip("-").isdigit() or int(after) <= FUTURE_BOUND_MS:
        return None
    return int(after)


# --------------------------------------------------------------------------- groups


class _QuietLogger:
    """Drops librdkafka's log lines (a producer-only key in a client config is logged)."""

    def log(self, *args: object, **kwargs: object) -> None:
        return None


def committed_offsets(
    config: Mapping[str, Any], group: str, partitions: Iterable[tuple[str, int]], timeout: float
) -> list[TopicPartition]:
    """The offsets ``group`` committed on ``partitions``, sorted; a partition the group
    committed nothing on (or whose offset the broker refused to give) is left out.

    Read with ``Consumer.committed()`` by a consumer whose ``group.id`` is ``group`` and
    that never subscribes: it does not join the group (no member, no rebalance, nothing
    committed). NOT with ``AdminClient.list_consumer_group_offsets()``: when the answer to
    its OffsetFetch request says ``NOT_COORDINATOR`` or ``COORDINATOR_NOT_AVAILABLE`` (the
    group's coordinator is being created, loaded or moved: a fresh cluster, a broker restart,
    a leader election of ``__consumer_offsets``), librdkafka (up to 2.16.0 at least) asks the
    client's consumer-group handle to look the coordinator up again, and an AdminClient has
    none: a NULL dereference in ``rd_kafka_cgrp_op()`` on librdkafka's own thread kills the
    process with SIGSEGV (librdkafka issue 5040, confluent-kafka-python issue 1982). Its
    threads block signals, so the kernel kills the process without running
    ``faulthandler``: no traceback, no output. A consumer has that handle, so the same answer
    makes it find the coordinator again, and the request is asked again until ``timeout``.

    ``config`` is a client config (its ``group.id`` is replaced). Raises
    :class:`~confluent_kafka.KafkaException` when the group's offsets cannot be read within
    ``timeout`` seconds (``_TIMED_OUT``) or the broker refuses them.
    """
    wanted = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
    if not wanted:
        return []
    conf = dict(config)
    conf.setdefault("logger", _QuietLogger())
    conf.update({"group.id": group, "enable.auto.commit": False})
    deadline = time.monotonic() + timeout
    pause = 0.05
    consumer = Consumer(conf)
    try:
        while True:
            try:
                got = consumer.committed(wanted, timeout=max(0.1, deadline - time.monotonic()))
                break
            except KafkaException as exc:
                # The consumer looks the coordinator up again on these but does not retry
                # the request itself (a fresh cluster answered NOT_COORDINATOR for a few
                # seconds to 5 of 20 groups asked at once): ask again until the deadline.
                err = exc.args[0] if exc.args else None
                code = err.code() if isinstance(err, KafkaError) else None
                pause = min(pause * 2, 1.0, deadline - time.monotonic())
                if code not in _COORDINATOR_NOT_READY or pause <= 0:
                    raise
                time.sleep(pause)
    finally:
        consumer.close()
    return [tp for tp in got if tp.error is None and tp.offset >= 0]


def committed_record_timestamps(
    config: Mapping[str, Any], committed: Iterable[tuple[str, int, int]], timeout: float
) -> dict[tuple[str, int, int], int]:
    """(topic, partition, committed offset) -> timestamp of the record just before it.

    Reads with ONE throw-away consumer built from ``config`` (a client config; nothing is
    committed): every partition is assigned at once and read until each gave its record or
    ``timeout`` seconds passed (per distinct offset of a partition shared by several groups).
    A position whose record is gone (deleted by retention) or never arrives is left out; when
    the record before the committed offset is a transaction marker, the next record stands
    in, as a consumer would see it.
    """
    by_partition: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in sorted(set(committed)):
        if offset > 0:
            by_partition.setdefault((topic, partition), []).append(offset - 1)
    found: dict[tuple[str, int, int], int] = {}
    if not by_partition:
        return found
    conf = dict(config)
    conf.setdefault("logger", _QuietLogger())
    conf.update(
        {
            "group.id": f"kresilient-clusterinfo-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # A deleted record is an error for its partition, not a wait at the log end.
            "auto.offset.reset": "error",
            # One record per partition is wanted: keep fetches small.
            "max.partition.fetch.bytes": 65536,
        }
    )
    consumer = Consumer(conf)
    try:
        depth = max(len(offsets) for offsets in by_partition.values())
        for i in range(depth):
            pending = {k: v[i] for k, v in by_partition.items() if len(v) > i}
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in pending.items()])
            deadline = time.monotonic() + timeout
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                got_topic, got_partition, got_offset = msg.topic(), msg.partition(), msg.offset()
                key = (str(got_topic), got_partition if got_partition is not None else -1)
                if key not in pending:
                    continue
                if msg.error() is not None:
                    del pending[key]  # out of range: the record is gone
                    continue
                if got_offset is not None and got_offset >= pending[key]:
                    found[(key[0], key[1], pending.pop(key) + 1)] = int(msg.timestamp()[1])
            consumer.unassign()
    finally:
        consumer.close()
    return found


def newest_committed_record_ms(
    config: Mapping[str, Any], committed: Iterable[TopicPartition], timeout: float
) -> int | None:
    """The timestamp of the newest record a group committed past, or None when none is read.

    An estimate of when the group last committed: the Admin API does not give the commit
    time. A group commits after reading, so now minus this is an UPPER bound of its idle
    time as long as record timestamps tell when records were written: a group that just
    committed past records with old producer timestamps (replayed data, a fixed timestamp in
    a test) looks idle since then. Reads with :func:`committed_record_timestamps`.
    """
    stamps = committed_record_timestamps(
        config, [(tp.topic, tp.partition, tp.offset) for tp in committed], min(timeout, 3.0)
    )
    return max(stamps.values()) if stamps else None
