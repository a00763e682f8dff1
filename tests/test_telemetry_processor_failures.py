"""A span processor that raises never changes what happens to a message (issue 23 defect 7).

Real 3-node cluster, through the public ResilientProducer / ResilientConsumer APIs: an SDK
tracer provider with a processor that raises in ``on_start`` or ``on_end``. Every message must
be produced, handled once, committed, and dead-lettered only when the handler says so.
"""

from __future__ import annotations

import threading
from typing import Any

import confluent_kafka as ck
import pytest
import tenacity
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.deadletter import DeadLetterPolicy
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

N = 20


class Raising(SpanProcessor):
    """Raises in ``on_start`` or ``on_end`` (as a buggy exporter/processor would)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.raised = 0
        self._lock = threading.Lock()

    def _raise(self) -> None:
        with self._lock:
            self.raised += 1
        raise RuntimeError(f"span processor {self.where} failed")

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.where == "on_start":
            self._raise()

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "on_end":
            self._raise()


def _provider(where: str) -> tuple[TracerProvider, Raising]:
    processor = Raising(where)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    return provider, processor


def _high_watermark(bootstrap: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{topic}"})
    try:
        return int(c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=30)[1])
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([ck.TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)
    finally:
        c.close()


@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_does_not_fail_produce_on_the_real_cluster(
    kafka_cluster: KafkaCluster, topic: str, where: str
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    provider, processor = _provider(where)
    with ResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=provider) as producer:
        handles = [producer.produce(topic, b"v%d" % i, key=b"k%d" % i) for i in range(N)]
        producer.flush(60)
        offsets = sorted(h.result(60).offset for h in handles)
    assert offsets == list(range(N))
    assert processor.raised >= N  # negative control: the processor really raised
    assert _high_watermark(bootstrap, topic) == N


@pytest.mark.parametrize("where", ["on_start", "on_end"])
def test_a_raising_span_processor_does_not_change_message_handling_on_the_real_cluster(
    kafka_cluster: KafkaCluster, topic: str, where: str
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = kafka_cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})
    raw = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(N):
        raw.produce(topic, b"v%d" % i, key=b"poison" if i == 7 else b"k%d" % i)
    assert raw.flush(60) == 0

    provider, processor = _provider(where)
    attempts: dict[int, int] = {}
    done = threading.Event()
    lock = threading.Lock()

    def handle(msg: Any) -> None:
        with lock:
            attempts[msg.offset()] = attempts.get(msg.offset(), 0) + 1
            if len(attempts) == N and attempts[7] == 3:
                done.set()
        if msg.key() == b"poison":
            raise RuntimeError("this record can never be handled")

    group = f"g-{topic}"
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.05)),
        dead_letter=DeadLetterPolicy(),
        install_signal_handlers=False,
        poll_timeout=0.2,
        tracer_provider=provider,
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        assert done.wait(120), f"handled so far: {attempts}"
    finally:
        consumer.stop()
        worker.join(60)
    assert not worker.is_alive() and errors == []
    # each good record handled exactly once (a failed span.end() did not make it a failure),
    # the poison record exactly its three attempts, then dead-lettered once
    assert attempts == {i: (3 if i == 7 else 1) for i in range(N)}
    assert _high_watermark(bootstrap, dlq) == 1
    assert _committed(bootstrap, group, topic) == N
    assert processor.raised >= N  # negative control: the processor really raised
