"""ResilientConsumer on the real 3-node cluster (issue 5, test 7e and more).

7a (consumer SIGKILL) and 7d (leader SIGKILL) are in tests/test_consumer_chaos.py, 7g (dlq
inspect and replay) in tests/test_deadletter_cli.py; 7b (1 % poison to the DLQ byte for
byte), 7c (failing longer than max.poll.interval.ms) and 7f (the circuit breaker) run for
both consumers in tests/test_aio_consumer_parity.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from kresilient.consumer import BatchItemError, ResilientConsumer, RetryPolicy
from kresilient.deadletter import (
    DeadLetterPolicy,
    parse_dead_letter_headers,
)
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Item = tuple[bytes | None, bytes, list[tuple[str, bytes | None]] | None, int | None]


# --------------------------------------------------------------------------- helpers


def produce(bootstrap: str, topic: str, items: Iterable[Item]) -> list[tuple[int, int]]:
    """Produce ``(key, value, headers, partition)`` items; return each one's (partition, offset)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}
    )
    items = list(items)
    where: list[tuple[int, int]] = [(-1, -1)] * len(items)

    def report(i: int) -> Callable[[Any, Message], None]:
        def done(err: Any, msg: Message) -> None:
            assert err is None, err
            where[i] = (msg.partition(), msg.offset())  # type: ignore[assignment]

        return done

    for i, (key, value, headers, partition) in enumerate(items):
        kwargs: dict[str, Any] = {"key": key, "headers": headers, "on_delivery": report(i)}
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, value, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        if not i % 2000:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert all(p >= 0 for p, _ in where)
    return where


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends-" + uuid.uuid4().hex})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in parts
        }
    finally:
        consumer.close()


def committed(bootstrap: str, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


class Runner:
    """Run a ResilientConsumer in a thread; keep what run() raised."""

    def __init__(self, consumer: ResilientConsumer) -> None:
        self.consumer = consumer
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.consumer.run()
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 60) -> None:
        self.consumer.stop()
        self.join(timeout)

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "consumer did not stop"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def config(cluster: KafkaCluster, group: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": group or f"g-{uuid.uuid4().hex[:10]}",
        **extra,
    }


def with_dlq(topic_factory: TopicFactory, partitions: int = 1) -> tuple[str, str]:
    topic = topic_factory(partitions=partitions)
    return topic, topic_factory(partitions=partitions, name=topic + ".dlq")


FAST_RETRY = RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.05))


# --------------------------------------------------------------------------- basics


def test_processes_everything_and_commits_it_on_close(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic, _ = with_dlq(topic_factory, partitions=3)
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"%d" % i, b"%d" % i, None, None) for i in range(3000)],
    )
    seen: list[int] = []
    cfg = config(kafka_cluster, **{"enable.auto.commit": False})  # commits: ours only
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        seen.append(int(msg.value() or b""))
        if len(seen) == 3000:
            consumer.stop()

    consumer = ResilientConsumer(cfg, [topic], handle, install_signal_handlers=False)
    Runner(consumer).join(120)
    assert sorted(seen) == list(range(3000))
    high = ends(kafka_cluster.bootstrap_servers, topic)
    assert committed(kafka_cluster.bootstrap_servers, cfg["group.id"], topic, high) == high
    assert consumer.health().processed == 3000


def test_missing_dead_letter_topic_fails_fast(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    topic = topic_factory()
    consumer = ResilientConsumer(
        config(kafka_cluster), [topic], print, install_signal_handlers=False
    )
    with pytest.raises(ConfigError, match=r"\.dlq"):
        consumer.run()


# --------------------------------------------------------------------------- headers


def test_java_header_sets_and_trace_context_on_the_real_record(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    topic, dlq = with_dlq(topic_factory)
    original_tp = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    produce(
        kafka_cluster.bootstrap_servers,
        topic,
        [(b"k", b"not json", [("traceparent", original_tp)], None), (b"k", b"{}", None, None)],
    )
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        if msg.offset() == 1:
            consumer.stop()
        json.loads(msg.value() or b"")

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        install_signal_handlers=False,
        dead_letter=DeadLetterPolicy(compat=("spring", "streams")),
        tracer_provider=provider,
    )
    Runner(consumer).join(60)
    (record,) = read_back(kafka_cluster.bootstrap_servers, dlq)
    headers = record.headers() or []
    assert headers[0] == ("traceparent", original_tp)  # the original parent, untouched
    names = [k for k, _ in headers]
    assert names.count("traceparent") == 1
    assert {
        "kafka_dlt-original-topic",
        "kafka_dlt-exception-fqcn",
        "__streams.errors.topic",
        "__streams.errors.offset",
        "kresilient.traceparent",
    } <= set(names)
    info = parse_dead_letter_headers(headers)
    process = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
    assert f"{process[0].context.trace_id:032x}" in info.trace_context["traceparent"]
    spring = parse_dead_letter_headers([h for h in headers if h[0].startswith("kafka_dlt-")])
    assert (spring.original_topic, spring.original_partition, spring.original_offset) == (
        topic,
        0,
        0,
    )


# --------------------------------------------------------------------------- 7e join/leave


def test_7e_second_consumer_joins_and_leaves(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=4)
    n = 20_000
    produce(bootstrap, topic, [(b"%d" % i, b"%d" % i, None, None) for i in range(n)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    seen_a: list[int] = []
    seen_b: list[int] = []
    all_done = threading.Event()

    def handler(seen: list[int]) -> Callable[[Message], None]:
        def handle(msg: Message) -> None:
            time.sleep(0.0002)  # slow enough for the rebalances to happen mid-stream
            seen.append(int(msg.value() or b""))
            if len(set(seen_a) | set(seen_b)) == n:
                all_done.set()

        return handle

    a = ResilientConsumer(
        config(kafka_cluster, group), [topic], handler(seen_a), install_signal_handlers=False
    )
    run_a = Runner(a)
    wait_for(lambda: len(seen_a) >= 2000, 60, "consumer A to start")
    b = ResilientConsumer(
        config(kafka_cluster, group), [topic], handler(seen_b), install_signal_handlers=False
    )
    run_b = Runner(b)
    wait_for(lambda: len(seen_b) >= 1000, 60, "consumer B to get partitions")
    assert a.health().rebalances["revoked"] >= 1  # A gave partitions to B (cooperatively)
    run_b.stop()  # B leaves: A gets its partitions back
    assert run_b.error is None
    assert all_done.wait(120)
    run_a.stop()
    assert run_a.error is None
    total = seen_a + seen_b
    assert set(total) == set(range(n))  # nothing lost
    duplicates = len(total) - n
    failures = a.health().commit_failures + b.health().commit_failures
    # Offsets are stored at the end of every batch and committed synchronously on revoke:
    # work in flight at a cooperative revoke is nil unless that commit failed.
    assert duplicates == 0 or failures > 0, (duplicates, failures)
    assert duplicates <= 2 * 500 * 4
    high = ends(bootstrap, topic)
    assert committed(bootstrap, group, topic, high) == high


# --------------------------------------------------------------------------- variants


def test_batch_handler_item_failure_dead_letters_that_item_only(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=2)
    produce(
        bootstrap,
        topic,
        [(None, b"bad" if i % 50 == 7 else b"%d" % i, None, None) for i in range(1000)],
    )
    handled: list[bytes] = []
    calls: list[int] = []
    consumer: ResilientConsumer

    def handle_batch(msgs: list[Message]) -> None:
        calls.append(len({m.partition() for m in msgs}))
        for i, msg in enumerate(msgs):
            try:
                int(msg.value() or b"")
            except ValueError as exc:
                raise BatchItemError(index=i) from exc
            handled.append(msg.value() or b"")
        if len(handled) == 980:
            consumer.stop()

    consumer = ResilientConsumer(
        config(kafka_cluster), [topic], batch_handler=handle_batch, install_signal_handlers=False
    )
    Runner(consumer).join(120)
    assert sorted(int(v) for v in handled) == [i for i in range(1000) if i % 50 != 7]
    assert set(calls) == {1}  # one partition per call
    assert len(read_back(bootstrap, dlq)) == 20


@pytest.mark.broker_smoke
def test_deserializer_failures_go_to_the_dlq_with_raw_bytes(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(
        bootstrap,
        topic,
        [(b"k", b"\xc3\x28 not utf-8", None, None), (b"k", b'{"ok": 1}', None, None)],
    )
    got: list[Any] = []
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        got.append(msg.value())
        consumer.stop()

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        install_signal_handlers=False,
        value_deserializer=lambda data, _ctx: json.loads((data or b"").decode("utf-8")),
    )
    Runner(consumer).join(60)
    assert got == [{"ok": 1}]
    (record,) = read_back(bootstrap, dlq)
    assert record.value() == b"\xc3\x28 not utf-8"
    info = parse_dead_letter_headers(record.headers())
    assert info.exception_type == "confluent_kafka.error.ValueDeserializationError"
    assert info.error_category == "poison" and info.attempts == 1


def test_without_dead_letter_topic_exhausted_retries_stop_the_consumer(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory()
    produce(bootstrap, topic, [(None, b"%d" % i, None, None) for i in range(10)])
    cfg = config(kafka_cluster)

    def handle(msg: Message) -> None:
        if msg.offset() == 4:
            raise RuntimeError("always")

    consumer = ResilientConsumer(
        cfg, [topic], handle, dead_letter=None, retry=FAST_RETRY, install_signal_handlers=False
    )
    with pytest.raises(RuntimeError, match="always"):
        consumer.run()
    assert committed(bootstrap, cfg["group.id"], topic, [0]) == {0: 4}


def test_stop_finishes_the_message_in_hand_and_commits_exactly_what_was_processed(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    produce(bootstrap, topic, [(None, b"%d" % i, None, None) for i in range(100)])
    cfg = config(kafka_cluster)
    handled: list[int] = []
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        handled.append(msg.offset())  # type: ignore[arg-type]
        if msg.offset() == 41:
            consumer.stop()  # e.g. SIGTERM arriving while this message is handled
            time.sleep(0.2)  # the message in hand is finished

    consumer = ResilientConsumer(cfg, [topic], handle, install_signal_handlers=False)
    consumer.run()
    assert handled == list(range(42))  # the rest of the fetched batch was not handed out
    assert committed(bootstrap, cfg["group.id"], topic, [0]) == {0: 42}

    # an exception that escapes the handler (not an Exception: KeyboardInterrupt) stops the
    # consumer too, and that message is NOT committed
    def interrupted(msg: Message) -> None:
        if msg.offset() == 50:
            raise KeyboardInterrupt

    consumer = ResilientConsumer(cfg, [topic], interrupted, install_signal_handlers=False)
    with pytest.raises(KeyboardInterrupt):
        consumer.run()
    assert committed(bootstrap, cfg["group.id"], topic, [0]) == {0: 50}


def test_slow_handler_over_a_big_batch_does_not_exceed_max_poll_interval(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """500 messages fetched at once x 50 ms each would be 25 s without polling; with
    max.poll.interval.ms=6000 the watchdog hands the rest of the batch back after 3 s and the
    loop polls again: no rebalance, nothing lost, nothing handled twice."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    produce(bootstrap, topic, [(None, b"%d" % i, None, None) for i in range(200)])
    handled: list[int] = []
    rebalances: list[str] = []
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        time.sleep(0.05)
        handled.append(msg.offset())  # type: ignore[arg-type]
        if len(handled) == 200:
            consumer.stop()

    consumer = ResilientConsumer(
        config(kafka_cluster, **{"max.poll.interval.ms": 6000, "session.timeout.ms": 6000}),
        [topic],
        handle,
        on_assign=lambda ps: rebalances.append("assign"),
        on_lost=lambda ps: rebalances.append("lost"),
        on_revoke=lambda ps: rebalances.append("revoke"),
        install_signal_handlers=False,
    )
    Runner(consumer).join(120)
    assert handled == list(range(200))
    assert rebalances == ["assign", "revoke"]
