"""One Spark task of the ``kresilient`` sink, driven directly against the real cluster.

``write_task`` / ``write_task_exactly_once`` are exactly what a Python worker runs for a task
(Arrow batches in, a ``TaskReport`` out or an exception that fails the task); calling them
without Spark keeps these failure-path tests fast. Each test is one row of the Spark part of
docs/failure-modes.md: the step, the fault, what escapes, where the rows in flight end up.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from kresilient.errors import (  # noqa: E402
    DeadLetterError,
    DeliveryError,
    KResilientError,
    ReplayMismatchError,
)
from kresilient.spark._eos import ensure_marker_topic, write_task_exactly_once  # noqa: E402
from kresilient.spark._options import column_layout, parse_options  # noqa: E402
from kresilient.spark._task import TaskInfo, TaskReport  # noqa: E402
from kresilient.spark._write import discard_producers, sink_producer_config, write_task  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TopicFactory = Any


def _batch(ids: range, *, sizes: dict[int, int] | None = None, **columns: Any) -> Any:
    """Rows keyed by id (8-byte big-endian), 100-byte values except ``sizes``."""
    sizes = sizes or {}
    keys = [i.to_bytes(8, "big") for i in ids]
    values = [b"v" * sizes.get(i, 100) for i in ids]
    arrays = [pa.array(keys, pa.binary()), pa.array(values, pa.binary())]
    names = ["key", "value"]
    for name, data in columns.items():
        arrays.append(data)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)


def _spark_type(t: Any) -> str:
    """The Spark type name (``simpleString``) Spark would hand the sink for Arrow type ``t``."""
    if pa.types.is_list(t):
        return "array<struct<key:string,value:binary>>"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return {"binary": "binary", "string": "string", "int32": "int"}[str(t)]


def _run(
    bootstrap: str,
    batches: list[Any],
    *,
    info: TaskInfo | None = None,
    **options: str,
) -> TaskReport:
    opts = parse_options({"kafka.bootstrap.servers": bootstrap, **options})
    layout = column_layout(
        [(f.name, _spark_type(f.type)) for f in batches[0].schema], topic_option=opts.topic
    )
    cfg = sink_producer_config(opts)
    task = info or TaskInfo(partition_id=0, attempt=0)
    try:
        if opts.guarantee == "exactly_once":
            ensure_marker_topic(cfg, opts.marker_topic_name)
            return write_task_exactly_once(
                opts, layout, iter(batches), config=cfg, context=lambda: task
            )
        return write_task(opts, layout, iter(batches), config=cfg, context=lambda: task)
    finally:
        discard_producers()


def _ids(bootstrap: str, topic: str, *, committed: bool = False) -> list[int]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-paths-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[int] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=0.5):
                if m.error() is None:
                    out.append(int.from_bytes(m.key(), "big"))
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        assert not remaining, f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def _headers_of(bootstrap: str, topic: str) -> list[dict[str, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kr-h-{uuid.uuid4().hex[:6]}"})
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[dict[str, bytes | None]] = []
        deadline = time.monotonic() + 60
        while len(out) < end and time.monotonic() < deadline:
            out += [dict(m.headers() or []) for m in c.consume(100, 0.5) if m.error() is None]
        return out
    finally:
        c.close()


# --------------------------------------------------------------------------- at-least-once
def test_topic_not_created_rows_fail_the_task_not_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A topic that does not exist yet (auto-creation off) past message.timeout.ms: the rows
    time out, which is not their fault: the task fails, the dead-letter topic stays empty.
    On 9c6e9f3 the timed-out rows were dead-lettered and the task succeeded."""
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = topic_factory()
    missing = f"t-not-created-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DeliveryError) as info:
        _run(
            bootstrap,
            [_batch(range(50))],
            topic=missing,
            deadLetterTopic=dlq,
            **{"kafka.message.timeout.ms": "2000"},
        )
    assert {f.classification.name for f in info.value.failures} <= {
        "_MSG_TIMED_OUT",
        "UNKNOWN_TOPIC_OR_PART",
    }
    assert _ids(bootstrap, dlq) == []
    # Control: the same rows to a topic that exists are written, nothing dead-lettered.
    topic = topic_factory()
    report = _run(bootstrap, [_batch(range(50))], topic=topic, deadLetterTopic=dlq)
    assert (report.written, report.dead_lettered) == (50, 0)
    assert sorted(_ids(bootstrap, topic)) == list(range(50))


def test_partition_the_topic_lacks_and_null_topic_are_dead_letters(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A ``partition`` column naming a partition the topic lacks, and a null ``topic``, can
    never be produced: only those rows are dead letters (_UNKNOWN_PARTITION, INVALID_RECORD,
    the one definition in kresilient.errors.is_unproducible)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(partitions=2), topic_factory()
    topics = pa.array([None if i == 3 else topic for i in range(20)], pa.string())
    parts = pa.array([7 if i == 5 else i % 2 for i in range(20)], pa.int32())
    report = _run(
        bootstrap, [_batch(range(20), topic=topics, partition=parts)], deadLetterTopic=dlq
    )
    assert (report.written, report.dead_lettered) == (18, 2)
    assert report.dead_letter_reasons == {"_UNKNOWN_PARTITION": 1, "INVALID_RECORD": 1}
    assert sorted(_ids(bootstrap, topic)) == [i for i in range(20) if i not in (3, 5)]
    assert sorted(_ids(bootstrap, dlq)) == [3, 5]


def test_dead_letter_topic_missing_fails_the_task_rows_already_written_stay(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """The dead letter of an oversized row cannot be written (its topic does not exist): the
    task fails with DeadLetterError naming it, so Spark retries; the good rows are in the
    topic already (a retry re-sends them: at-least-once, never lost)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()
    missing = f"t-dlq-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(DeadLetterError) as info:
        _run(
            bootstrap,
            [_batch(range(30), sizes={7: 2_000_000})],  # > message.max.bytes: refused locally
            topic=topic,
            deadLetterTopic=missing,
            # The missing topic is given up on after 1 s (_UNKNOWN_TOPIC); the good rows keep
            # the default delivery timeout: at 2 s a loaded machine timed them out too.
            **{"kafka.topic.metadata.propagation.max.ms": "1000"},
        )
    assert missing in str(info.value)
    assert sorted(_ids(bootstrap, topic)) == [i for i in range(30) if i != 7]


def test_dead_letters_disabled_an_unproducible_row_fails_the_task(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()
    with pytest.raises(DeliveryError, match="dead letters are disabled") as info:
        _run(
            bootstrap,
            [_batch(range(10), sizes={4: 2_000_000})],
            topic=topic,
            deadLetterTopic="none",
        )
    assert info.value.failures[0].classification.name == "MSG_SIZE_TOO_LARGE"


def test_input_failing_mid_task_fails_it_and_discards_the_producer(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Spark's input iterator raises after the first batch: the exception escapes unchanged,
    rows already produced may be in Kafka (the retry re-sends the partition)."""
    from kresilient.spark import _write as sw

    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()

    def failing() -> Iterator[Any]:
        yield _batch(range(10))
        raise RuntimeError("the input failed mid-task")

    opts = parse_options({"kafka.bootstrap.servers": bootstrap, "topic": topic})
    layout = column_layout([("key", "binary"), ("value", "binary")], topic_option=topic)
    try:
        with pytest.raises(RuntimeError, match="mid-task"):
            write_task(
                opts,
                layout,
                failing(),
                config=sink_producer_config(opts),
                context=lambda: TaskInfo(partition_id=0, attempt=0),
            )
        assert not sw._PRODUCERS  # a retry never inherits the failed attempt's producer
    finally:
        discard_producers()


# --------------------------------------------------------------------------- exactly-once
def _eos(
    bootstrap: str,
    topic: str,
    dlq: str,
    prefix: str,
    batch_id: int,
    rows: int,
    query: str = "q-1",
) -> TaskReport:
    info = TaskInfo(partition_id=0, attempt=0, batch_id=batch_id, query_id=query)
    return _run(
        bootstrap,
        [_batch(range(batch_id * 1000, batch_id * 1000 + rows))],
        info=info,
        topic=topic,
        deadLetterTopic=dlq,
        guarantee="exactly_once",
        transactionalIdPrefix=prefix,
    )


def test_exactly_once_replay_tripwires_and_durable_marker(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """One partition's task of micro-batch 0, then its replays: same rows -> skipped; other
    row count -> ReplayMismatchError; another query's marker -> ReplayMismatchError; and with
    the marker group's offsets deleted (what the broker's offsets.retention.minutes expiry of
    a member-less group leaves) the durable marker record still makes the replay skip."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(), topic_factory()
    prefix = f"kr-eos-{uuid.uuid4().hex[:8]}"
    first = _eos(bootstrap, topic, dlq, prefix, 0, 20)
    assert (first.written, first.skipped) == (20, False)
    assert _eos(bootstrap, topic, dlq, prefix, 0, 20).skipped
    with pytest.raises(ReplayMismatchError, match="not deterministic"):
        _eos(bootstrap, topic, dlq, prefix, 0, 19)
    with pytest.raises(ReplayMismatchError, match="was used by streaming query"):
        _eos(bootstrap, topic, dlq, prefix, 0, 20, query="q-2")

    group = f"{prefix}-0"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_consumer_groups([group], request_timeout=30)[group].result()
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
    finally:
        c.close()
    assert tp.offset == -1001, "the simulated expiry did not remove the marker offset"
    replay = _eos(bootstrap, topic, dlq, prefix, 0, 20)
    assert replay.skipped, "batch 0 was written again after its group offset expired"
    with pytest.raises(ReplayMismatchError, match="not deterministic"):
        _eos(bootstrap, topic, dlq, prefix, 0, 21)  # tripwires survive the expiry too
    nxt = _eos(bootstrap, topic, dlq, prefix, 1, 10)
    assert (nxt.written, nxt.skipped) == (10, False)
    assert sorted(_ids(bootstrap, topic, committed=True)) == [*range(20), *range(1000, 1010)]


def test_exactly_once_marker_topic_with_delete_policy_is_refused(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    markers = topic_factory(config={"cleanup.policy": "delete"})
    with pytest.raises(KResilientError, match=r"cleanup\.policy=compact") as info:
        ensure_marker_topic({"bootstrap.servers": bootstrap}, markers)
    assert getattr(info.value, "key", None) == "markertopic"
    created = f"t-markers-{uuid.uuid4().hex[:8]}"
    ensure_marker_topic({"bootstrap.servers": bootstrap}, created)  # created compacted
    ensure_marker_topic({"bootstrap.servers": bootstrap}, created)  # and accepted as it is


# --------------------------------------------------------------------------- lean path
def test_header_lists_from_sliced_arrow_with_nulls_and_empties() -> None:
    from kresilient.spark._write import _header_lists

    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = [[{"key": "a", "value": b"1"}], None, [], [{"key": "b", "value": None}] * 2]
    column = pa.array(rows * 3, htype).slice(2, 6)  # an offset into the child arrays
    assert _header_lists(column) == [
        None,
        [("b", None), ("b", None)],
        [("a", b"1")],
        None,
        None,
        [("b", None), ("b", None)],
    ]
    uniform = pa.array([[{"key": "k", "value": b"%d" % i}] * 2 for i in range(6)], htype)
    assert _header_lists(uniform.slice(3, 2)) == [[("k", b"3")] * 2, [("k", b"4")] * 2]
    assert _header_lists(pa.array([[], []], htype)) == [None, None]


def test_broker_refused_row_dead_letter_keeps_its_headers_and_timestamp(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A row with headers and a timestamp refused by the broker (too large for the topic, so
    reported by a delivery report, which carries neither): its dead letter still has the
    row's own headers and original timestamp, recovered from the Arrow batch."""
    from kresilient.deadletter import ORIGINAL_TIMESTAMP

    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(config={"max.message.bytes": 16384})
    dlq = topic_factory()
    ids = range(40)
    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    headers = pa.array([[{"key": "id", "value": str(i).encode()}] for i in ids], htype)
    # an hour ago: older than the topics' retention (7 days), a record is deleted by the next
    # retention check (every 60 s here) before it is read back
    hour_ago_ms = (int(time.time()) - 3600) * 1000
    stamps = pa.array([(hour_ago_ms + i) * 1000 for i in ids], pa.timestamp("us"))
    batch = _batch(ids, sizes={17: 20_000}, headers=headers, timestamp=stamps)
    report = _run(
        bootstrap, [batch], topic=topic, deadLetterTopic=dlq, **{"kafka.batch.size": "8192"}
    )
    assert (report.written, report.dead_lettered) == (39, 1)
    assert report.dead_letter_reasons == {"MSG_SIZE_TOO_LARGE": 1}
    (found,) = _headers_of(bootstrap, dlq)
    assert found["id"] == b"17"
    assert found[ORIGINAL_TIMESTAMP] == str(hour_ago_ms + 17).encode()
