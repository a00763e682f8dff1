"""Pure parts of the ``kresilient`` Spark sink: options, input schema, summaries (no cluster)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from kresilient.errors import ConfigError, UnsafeConfigError
from kresilient.spark._options import SchemaError, column_layout, parse_options
from kresilient.spark._summary import WriteSummary, latest_summary, store_summary, summarize

BS = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_options_mirror_the_builtin_sink() -> None:
    o = parse_options({**BS, "Topic": "orders", "kafka.linger.ms": "20", "includeHeaders": "true"})
    assert o.topic == "orders"
    assert dict(o.producer) == {"bootstrap.servers": "127.0.0.1:9092", "linger.ms": "20"}
    assert o.dead_letter_topic_for("orders") == "orders.dlq"
    assert o.guarantee == "at_least_once"


def test_bootstrap_servers_required() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options({"topic": "t"})
    assert info.value.key == "kafka.bootstrap.servers"


@pytest.mark.parametrize(
    ("key", "fragment"),
    [
        ("kafka.key.serializer", "serialize in the DataFrame"),
        ("kafka.transactional.id", "guarantee=exactly_once"),
        ("kafka.max.request.size", "kafka.message.max.bytes"),
        ("linger.ms", "'kafka.' prefix"),
    ],
)
def test_refused_options_name_the_key(key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_options({**BS, key: "x"})
    assert info.value.key == key
    assert fragment in str(info.value)


def test_exactly_once_needs_the_topic_option() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options({**BS, "guarantee": "exactly_once"})
    assert info.value.key == "topic"
    o = parse_options(
        {**BS, "topic": "t", "guarantee": "Exactly-Once", "transactionalIdPrefix": "orders-job"}
    )
    assert (o.guarantee, o.transactional_id_prefix) == ("exactly_once", "orders-job")
    with pytest.raises(ConfigError) as info:
        parse_options({**BS, "topic": "t", "guarantee": "at_most_once"})
    assert info.value.key == "guarantee"


def test_dead_letters_explicit_or_disabled() -> None:
    assert parse_options({**BS, "deadLetterTopic": "bad"}).dead_letter_topic_for("t") == "bad"
    assert parse_options({**BS, "deadLetterTopic": "none"}).dead_letter_topic_for("t") is None
    assert parse_options(BS).dead_letter_topic_for(None) is None  # null topic, no DLQ option


def test_repr_hides_producer_values() -> None:
    o = parse_options({**BS, "kafka.sasl.password": "hunter2", "topic": "t"})
    assert "hunter2" not in repr(o)
    assert "sasl.password" in repr(o)


def test_layout_locates_columns_and_ignores_others() -> None:
    lay = column_layout(
        [
            ("id", "bigint"),
            ("key", "binary"),
            ("value", "string"),
            ("topic", "string"),
            ("partition", "int"),
            ("headers", "array<struct<key:string,value:binary>>"),
            ("timestamp", "timestamp"),
        ],
        topic_option=None,
    )
    assert (lay.key, lay.value, lay.topic, lay.partition, lay.headers, lay.timestamp) == (
        1,
        2,
        3,
        4,
        5,
        6,
    )


@pytest.mark.parametrize(
    ("fields", "column"),
    [
        ([("key", "binary")], "value"),
        ([("value", "int")], "value"),
        ([("value", "binary"), ("key", "bigint")], "key"),
        ([("value", "binary"), ("partition", "string")], "partition"),
        ([("value", "binary"), ("headers", "map<string,binary>")], "headers"),
    ],
)
def test_bad_schema_names_the_column(fields: list[tuple[str, str]], column: str) -> None:
    with pytest.raises(SchemaError) as info:
        column_layout(fields, topic_option="t")
    assert info.value.key == column
    assert repr(column) in str(info.value)


def test_topic_needed_from_option_or_column() -> None:
    with pytest.raises(SchemaError) as info:
        column_layout([("value", "binary")], topic_option=None)
    assert info.value.key == "topic"
    assert column_layout([("value", "binary"), ("topic", "string")], topic_option=None).topic == 1


def _report(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = {
        "rows": 10,
        "written": 10,
        "dead_lettered": 0,
        "attempt": 0,
        "dead_letter_reasons": {},
        "dead_letter_topics": [],
    }
    base.update(kw)
    return SimpleNamespace(**base)


def test_summary_adds_up_tasks_and_round_trips(tmp_path: object) -> None:
    reports = [
        _report(),
        None,  # a task that failed (abort() sees these)
        _report(
            rows=5,
            written=3,
            dead_lettered=2,
            attempt=1,
            dead_letter_reasons={"MSG_SIZE_TOO_LARGE": 2},
            dead_letter_topics=["t.dlq"],
        ),
    ]
    s = summarize(reports, mode="batch", batch_id=None, topic="t", guarantee="at_least_once")
    assert (s.tasks, s.rows, s.written, s.dead_lettered, s.retried_tasks) == (2, 15, 13, 2, 1)
    assert dict(s.dead_letter_reasons) == {"MSG_SIZE_TOO_LARGE": 2}
    assert s.dead_letter_topics == ("t.dlq",)
    assert WriteSummary.from_json(s.to_json()) == s
    directory = str(tmp_path)
    assert latest_summary(directory) is None
    store_summary(directory, s)
    later = summarize([_report()], mode="streaming", batch_id=7, topic="t", guarantee="x")
    store_summary(directory, later)
    assert latest_summary(directory) == later


def test_forced_settings_refused_when_weakened() -> None:
    pytest.importorskip("pyspark")
    from kresilient.spark._write import sink_producer_config

    cfg = sink_producer_config(parse_options({**BS, "kafka.acks": "-1"}))
    assert cfg["acks"] == "all" and cfg["enable.idempotence"] == "true"
    for key, value in (("kafka.acks", "1"), ("kafka.enable.idempotence", "false")):
        with pytest.raises(UnsafeConfigError) as info:
            sink_producer_config(parse_options({**BS, key: value}))
        assert info.value.key == key


def test_unknown_producer_key_refused_on_the_driver() -> None:
    pytest.importorskip("pyspark")
    from kresilient.spark._write import sink_producer_config

    with pytest.raises(ConfigError) as info:
        sink_producer_config(parse_options({**BS, "kafka.lingr.ms": "5"}))
    assert "lingr.ms" in str(info.value)


def test_import_kresilient_does_not_import_pyspark() -> None:
    code = "import sys, kresilient; print('pyspark' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_failed_task_discards_its_cached_producer_mock_cluster() -> None:
    """A retry must never inherit the producer of a failed attempt (SPARK-27042)."""
    pytest.importorskip("pyspark")
    pa = pytest.importorskip("pyarrow")
    from kresilient.spark import _write as sw

    options = parse_options({**BS, "topic": "t", "kafka.test.mock.num.brokers": "1"})
    layout = column_layout([("value", "binary")], topic_option="t")
    cfg = sw.sink_producer_config(options)
    batch = pa.record_batch([pa.array([b"v"] * 10, pa.binary())], names=["value"])

    def info() -> sw.TaskInfo:
        return sw.TaskInfo(partition_id=0, attempt=0)

    def failing() -> Iterator[object]:
        yield batch
        raise RuntimeError("the input failed mid-task")

    try:
        report = sw.write_task(options, layout, iter([batch]), config=cfg, context=info)
        assert (report.rows, report.written) == (10, 10)
        (first,) = sw._PRODUCERS.values()
        assert sw.write_task(options, layout, iter([batch]), config=cfg, context=info).written
        assert list(sw._PRODUCERS.values()) == [first]  # reused across tasks
        with pytest.raises(RuntimeError, match="mid-task"):
            sw.write_task(options, layout, failing(), config=cfg, context=info)
        assert not sw._PRODUCERS  # discarded with the failed attempt
        sw.write_task(options, layout, iter([batch]), config=cfg, context=info)
        (second,) = sw._PRODUCERS.values()
        assert second.producer is not first.producer
    finally:
        sw.discard_producers()


class _RefusedProducerId:
    """A producer whose idempotent producer id was refused: confluent-kafka raises the fatal
    error from ``poll()``/``flush()`` itself (error_cb never sees it; checked against a
    SASL_SSL cluster, tests/test_security_spark.py races into it by chance)."""

    def __init__(self, secret: str) -> None:
        from confluent_kafka import KafkaError

        self.error = KafkaError(
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
            f"Failed to acquire idempotence PID (login {secret}): Broker: Cluster "
            "authorization failed",
            fatal=True,
        )
        self.queued = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if self.queued >= 100_000:
            raise BufferError("Local: Queue full")  # the writer then waits for room: poll()
        self.queued += 1

    def _raise(self, *args: Any, **kwargs: Any) -> int:
        from confluent_kafka import KafkaException

        raise KafkaException(self.error)

    poll = flush = _raise

    def purge(self, *args: Any, **kwargs: Any) -> None:
        self.queued = 0

    def __len__(self) -> int:
        return self.queued


@pytest.mark.parametrize("rows", [10, 200_000], ids=["raised_by_flush", "raised_by_poll"])
def test_task_whose_producer_goes_fatal_fails_naming_the_cause_redacted(rows: int) -> None:
    """poll() and flush() raise a fatal error as a bare KafkaException: the task fails with a
    FatalProducerError naming CLUSTER_AUTHORIZATION_FAILED and its remedy, the secret in the
    text redacted, the producer discarded. At 200,000 rows the fake's queue is full at 100,000,
    so the writer waits for room (poll) before it would flush."""
    pytest.importorskip("pyspark")
    pa = pytest.importorskip("pyarrow")
    from kresilient.errors import ErrorCategory, FatalProducerError
    from kresilient.spark import _write as sw

    secret = "Sup3r-secret-pw-0420"
    options = parse_options({**BS, "topic": "t", "kafka.sasl.password": secret})
    layout = column_layout([("value", "binary")], topic_option="t")
    cfg = sw.sink_producer_config(options)
    fake = _RefusedProducerId(secret)
    sw._PRODUCERS[sw._cache_key(cfg)] = sw._Entry(cfg, fake, sw._Collector())  # type: ignore[arg-type]
    batch = pa.record_batch([pa.array([b"v"] * rows, pa.binary())], names=["value"])
    try:
        with pytest.raises(FatalProducerError) as info:
            sw.write_task(
                options, layout, iter([batch]), config=cfg,
                context=lambda: sw.TaskInfo(partition_id=0, attempt=0),
            )  # fmt: skip
        error = info.value
        assert error.name == "CLUSTER_AUTHORIZATION_FAILED"
        assert error.classification.category is ErrorCategory.FATAL_PRODUCER
        assert "an idempotent producer needs WRITE on a topic" in str(error)
        assert secret not in str(error) and error.__cause__ is None
        assert not sw._PRODUCERS  # discarded
    finally:
        sw.discard_producers()


def _close_in_forked_child_then_talk(close: Callable[[Any], None]) -> bytes:
    """A py4j connection over one end of a socket pair is closed (with ``close``) in a child
    forked to run Python before exec (as ``subprocess.Popen(preexec_fn=...)`` does); then the
    parent sends through it and returns what arrives at the other end."""
    import socket

    from py4j.clientserver import ClientServerConnection, JavaParameters, PythonParameters

    ours, theirs = socket.socketpair()
    conn = ClientServerConnection(
        JavaParameters(), PythonParameters(), SimpleNamespace(pool=None), None
    )
    conn.socket, conn.stream = ours, ours.makefile("rb")
    try:
        subprocess.run(["true"], preexec_fn=lambda: close(conn), check=True)
        theirs.settimeout(10)
        try:
            ours.sendall(b"still here")
        except OSError:
            return b""
        return theirs.recv(64)
    finally:
        conn.close()
        theirs.close()


def test_py4j_connection_closed_in_a_forked_child_stays_usable_in_the_driver() -> None:
    """Issue 16: a forked child garbage-collecting the driver's py4j connections shut the
    shared sockets down, and the driver thread reconnected to a JVM thread without its active
    session (DATA_SOURCE_NOT_FOUND). With the guard, close() in the child leaves the driver's
    socket working. Control: py4j's own close() in the child cuts it."""
    from py4j.clientserver import ClientServerConnection

    from kresilient.spark import _fork_guard

    _fork_guard.install()
    assert _close_in_forked_child_then_talk(ClientServerConnection.close) == b"still here"
    assert _close_in_forked_child_then_talk(_fork_guard.original_close) == b""
