"""The Spark sink at the seams issue 37 (Spark part) and issue 35 found, on the real cluster.

Most tests drive one task directly (``write_task`` / ``write_task_exactly_once``: exactly what a
Python worker runs, Arrow batches in, a ``TaskReport`` or an exception out), which keeps them
cheap; the few that need Spark itself share one local-mode session. Each test names the defect
it covers and was checked to fail on c15a167.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from kresilient.deadletter import ORIGINAL_TIMESTAMP  # noqa: E402
from kresilient.spark._eos import ensure_marker_topic, write_task_exactly_once  # noqa: E402
from kresilient.spark._options import column_layout, parse_options  # noqa: E402
from kresilient.spark._task import TaskInfo, TaskReport  # noqa: E402
from kresilient.spark._write import discard_producers, sink_producer_config, write_task  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TopicFactory = Any
_HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


# --------------------------------------------------------------------------- helpers
def _batch(ids: range, *, sizes: dict[int, int] | None = None, **columns: Any) -> Any:
    """Rows keyed by id (8-byte big-endian), 100-byte values except ``sizes``."""
    sizes = sizes or {}
    arrays = [
        pa.array([i.to_bytes(8, "big") for i in ids], pa.binary()),
        pa.array([b"v" * sizes.get(i, 100) for i in ids], pa.binary()),
    ]
    names = ["key", "value"]
    for name, data in columns.items():
        if name in names:
            arrays[names.index(name)] = data
        else:
            arrays.append(data)
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names)


def _spark_type(t: Any) -> str:
    if pa.types.is_list(t):
        return "array<struct<key:string,value:binary>>"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return {"binary": "binary", "string": "string", "int32": "int"}[str(t)]


def _run(
    bootstrap: str, batches: list[Any], *, info: TaskInfo | None = None, **options: str
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


def _records(bootstrap: str, topic: str, *, committed: bool = False) -> list[Any]:
    """Every record of ``topic`` (all partitions), read to the end."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kr-seams-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    try:
        parts = list(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        remaining = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + 60
        while remaining and time.monotonic() < deadline:
            out += [m for m in c.consume(num_messages=1000, timeout=0.5) if m.error() is None]
            for tp in c.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
        assert not remaining, f"could not read {topic} to its end"
        return out
    finally:
        c.close()


def _ids(bootstrap: str, topic: str, *, committed: bool = False) -> list[int]:
    return [int.from_bytes(m.key(), "big") for m in _records(bootstrap, topic, committed=committed)]


def _eos(
    bootstrap: str,
    batch: Any,
    *,
    topic: str,
    dlq: str,
    prefix: str,
    batch_id: int,
    attempt: int = 0,
    **options: str,
) -> TaskReport:
    info = TaskInfo(partition_id=0, attempt=attempt, batch_id=batch_id, query_id="q-seams")
    return _run(
        bootstrap,
        [batch],
        info=info,
        topic=topic,
        deadLetterTopic=dlq,
        guarantee="exactly_once",
        transactionalIdPrefix=prefix,
        **options,
    )


# --------------------------------------------------------------------------- issue 37 #1
def test_dead_letter_carries_its_own_rows_headers_when_an_earlier_row_has_the_same_value(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Rows 0 and 1 share a value (and key); row 0 goes to a topic that takes it, row 1 to one
    whose max.message.bytes refuses it (a delivery report, which carries neither headers nor
    timestamp). Row 1's dead letter must carry row 1's headers and timestamp. On c15a167 the
    report was matched by value to row 0: the dead letter said id=row-0."""
    bootstrap = kafka_cluster.bootstrap_servers
    roomy, small = topic_factory(), topic_factory(config={"max.message.bytes": 16384})
    dlq = topic_factory()
    n = 2
    value = pa.array([b"x" * 20_000] * n, pa.binary())
    key = pa.array([b"same-key"] * n, pa.binary())
    headers = pa.array([[{"key": "row", "value": b"row-%d" % i}] for i in range(n)], _HEADERS)
    stamps = pa.array([1_700_000_000_000_000 + i * 1000 for i in range(n)], pa.timestamp("us"))
    topics = pa.array([roomy, small], pa.string())
    batch = _batch(range(n), key=key, value=value, headers=headers, timestamp=stamps, topic=topics)
    report = _run(bootstrap, [batch], deadLetterTopic=dlq)
    assert (report.written, report.dead_lettered) == (1, 1)
    (written,) = _records(bootstrap, roomy)
    assert dict(written.headers())["row"] == b"row-0"  # control: row 0 is the one written
    (dead,) = _records(bootstrap, dlq)
    found = dict(dead.headers())
    assert found["row"] == b"row-1", "row 1's dead letter carries another row's headers"
    assert found[ORIGINAL_TIMESTAMP] == str(1_700_000_000_000 + 1).encode()


# --------------------------------------------------------------------------- issue 37 #5
def test_exactly_once_row_for_a_partition_the_topic_lacks_is_dead_lettered_not_aborting(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A ``partition`` the topic lacks, under exactly_once: the row is decided unproducible
    from the topic's metadata before the transaction, dead-lettered in it, the other rows
    committed. On c15a167 every attempt aborted ("the broker refused rows inside the
    transaction"): the new transactional producer learnt it only from a delivery report."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(partitions=2), topic_factory()
    prefix = f"kr-seams-{uuid.uuid4().hex[:8]}"
    parts = pa.array([7 if i == 5 else i % 2 for i in range(20)], pa.int32())
    report = _eos(
        bootstrap, _batch(range(20), partition=parts), topic=topic, dlq=dlq, prefix=prefix,
        batch_id=0,
    )  # fmt: skip
    assert (report.written, report.dead_lettered, report.skipped) == (19, 1, False)
    assert report.dead_letter_reasons == {"_UNKNOWN_PARTITION": 1}
    assert sorted(_ids(bootstrap, topic, committed=True)) == [i for i in range(20) if i != 5]
    assert _ids(bootstrap, dlq, committed=True) == [5]
