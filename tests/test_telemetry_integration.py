"""Telemetry on the real 3-node cluster: one trace from producer through consumer to the DLQ.

ResilientProducer and ResilientConsumer (and the consumer's dead-letter producer) share one SDK
tracer/meter provider with in-memory exporters. Names come from the semantic-conventions
package constants.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import confluent_kafka as ck
import pytest
import tenacity
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.semconv._incubating.attributes import messaging_attributes as MA
from opentelemetry.semconv._incubating.metrics import messaging_metrics as MM
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from test_telemetry import Otel, remote

from kresilient import deadletter
from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.deadletter import DeadLetterPolicy
from kresilient.errors import BatchItemError, ConfigError, DeliveryError, ProduceError
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

KAFKA = MA.MessagingSystemValues.KAFKA.value
SEND = MA.MessagingOperationTypeValues.SEND.value
PROCESS = MA.MessagingOperationTypeValues.PROCESS.value
SETTLE = MA.MessagingOperationTypeValues.SETTLE.value
W3C = TraceContextTextMapPropagator()


@pytest.fixture(name="otel")
def _otel() -> Any:
    o = Otel()
    yield o
    o.shutdown()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _providers(otel: Otel) -> dict[str, Any]:
    """The clients' telemetry options: the test's SDK providers and the W3C propagator."""
    return {
        "tracer_provider": otel.tracer_provider,
        "meter_provider": otel.meter_provider,
        "propagator": W3C,
    }


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _read_one(bootstrap: str, topic: str, timeout: float = 30.0) -> Any:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(f"nothing read from {topic}")
    finally:
        c.close()


def test_one_trace_from_producer_through_consumer_to_dead_letter_topic(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = kafka_cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})
    providers = _providers(otel)
    with ResilientProducer(
        {"bootstrap.servers": bootstrap, "client.id": "orders-api"}, **providers
    ) as producer:
        ok = producer.produce(topic, b'{"id": 1}', key=b"order-1")
        bad = producer.produce(topic, b'{"id": 2}', key=b"order-2")
        producer.flush(30)
    assert (ok.result().offset, bad.result().offset) == (0, 1)

    attempts: dict[bytes, int] = {}

    def handle(msg: Any) -> None:
        attempts[msg.key()] = attempts.get(msg.key(), 0) + 1
        if msg.key() == b"order-2":
            raise RuntimeError("downstream refused order 2")

    group = f"g-{topic}"
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "client.id": "orders-worker"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.2)),
        # the failing record is the last one: with outage detection it would be held until a
        # later record showed the dependencies work (issue 36); this test is about the trace
        outage_retry=None,
        dead_letter=DeadLetterPolicy(),
        install_signal_handlers=False,
        poll_timeout=0.2,
        **providers,
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
        # the DLQ producer's send span ends at the DLQ acknowledgement
        _wait_for(lambda: any(s.name == f"send {dlq}" for s in otel.spans()), 90, "DLQ write")
    finally:  # stop() commits what was processed or dead-lettered (a commit span)
        consumer.stop()
        worker.join(60)
    assert not worker.is_alive()
    assert errors == []
    assert attempts == {b"order-1": 1, b"order-2": 2}

    spans = otel.spans()
    sends = {_attrs(s)[MA.MESSAGING_KAFKA_OFFSET]: s for s in spans if s.name == f"send {topic}"}
    assert sorted(sends) == [0, 1]
    for send in sends.values():
        a = _attrs(send)
        assert send.kind is SpanKind.PRODUCER
        assert a[MA.MESSAGING_SYSTEM] == KAFKA
        assert a[MA.MESSAGING_DESTINATION_NAME] == topic
        assert a[MA.MESSAGING_OPERATION_TYPE] == SEND
        assert a[MA.MESSAGING_OPERATION_NAME] == SEND
        assert a[MA.MESSAGING_DESTINATION_PARTITION_ID] == "0"
        assert a[MA.MESSAGING_CLIENT_ID] == "orders-api"
        assert MA.MESSAGING_KAFKA_MESSAGE_KEY not in a  # keys are opt-in (personal data)
        assert a[MA.MESSAGING_MESSAGE_BODY_SIZE] == 9
        assert send.parent is None

    # the good message: one process span, child of its send span
    ok_send = sends[0]
    (ok_proc,) = [
        s
        for s in spans
        if s.name == f"process {topic}"
        and s.parent is not None
        and s.parent.span_id == ok_send.context.span_id
    ]
    a = _attrs(ok_proc)
    assert ok_proc.kind is SpanKind.CONSUMER
    assert ok_proc.context.trace_id == ok_send.context.trace_id
    assert a[MA.MESSAGING_OPERATION_TYPE] == PROCESS
    assert a[MA.MESSAGING_CONSUMER_GROUP_NAME] == group
    assert a[MA.MESSAGING_DESTINATION_PARTITION_ID] == "0"
    assert a[MA.MESSAGING_KAFKA_OFFSET] == 0
    assert a[MA.MESSAGING_CLIENT_ID] == "orders-worker"
    assert ok_proc.status.status_code is not StatusCode.ERROR

    # the poison message: two attempts in the producer's trace, the last one dead-letters it
    bad_send = sends[1]
    trace_id = bad_send.context.trace_id
    bad_procs = sorted(
        (s for s in spans if s.name == f"process {topic}" and s.context.trace_id == trace_id),
        key=lambda s: s.start_time or 0,
    )
    assert len(bad_procs) == 2
    assert all(
        p.parent is not None and p.parent.span_id == bad_send.context.span_id for p in bad_procs
    )
    assert all(_attrs(p)[MA.MESSAGING_KAFKA_OFFSET] == 1 for p in bad_procs)
    assert all(_attrs(p)[ERROR_TYPE] == "RuntimeError" for p in bad_procs)
    retry_events = [e for e in bad_procs[0].events if e.name == "kresilient.retry"]
    assert len(retry_events) == 1
    assert dict(retry_events[0].attributes or {})[ERROR_TYPE] == "RuntimeError"

    (dead,) = [s for s in spans if s.name == f"dead_letter {dlq}"]
    assert dead.parent is not None and dead.parent.span_id == bad_procs[1].context.span_id
    assert dead.context.trace_id == trace_id
    assert _attrs(dead)[MA.MESSAGING_DESTINATION_NAME] == dlq
    assert _attrs(dead)["kresilient.dead_letter.source.offset"] == 1
    (dlq_send,) = [s for s in spans if s.name == f"send {dlq}"]
    assert dlq_send.kind is SpanKind.PRODUCER
    assert dlq_send.parent is not None and dlq_send.parent.span_id == dead.context.span_id
    assert _attrs(dlq_send)[MA.MESSAGING_KAFKA_OFFSET] == 0
    assert _attrs(dlq_send)[MA.MESSAGING_DESTINATION_PARTITION_ID] == "0"

    # commits: CLIENT spans, operation type settle
    commits = [s for s in spans if s.name == f"commit {topic}"]
    assert commits and all(c.kind is SpanKind.CLIENT for c in commits)
    assert all(_attrs(c)[MA.MESSAGING_OPERATION_TYPE] == SETTLE for c in commits)
    assert all(_attrs(c)[MA.MESSAGING_CONSUMER_GROUP_NAME] == group for c in commits)

    # the DLQ record: original traceparent kept byte for byte, processing context beside it
    record = _read_one(bootstrap, dlq)
    headers = record.headers() or []
    assert remote(headers) == (trace_id, bad_send.context.span_id, True)
    processing = [
        (k.removeprefix("kresilient."), v) for k, v in headers if k == deadletter.TRACEPARENT
    ]
    assert remote(processing) == (trace_id, dead.context.span_id, True)

    # metrics
    sent = {
        a[MA.MESSAGING_DESTINATION_NAME]: v
        for a, v in otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)
    }
    assert sent == {topic: 2, dlq: 1}
    consumed = sum(
        v
        for a, v in otel.points(MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
        if a[MA.MESSAGING_DESTINATION_NAME] == topic
    )
    assert consumed == 3  # order-1 once, order-2 twice (redelivered for its retry)
    durations = otel.points(MM.MESSAGING_PROCESS_DURATION)
    assert sorted((a.get(ERROR_TYPE, ""), n) for a, n in durations) == [
        ("", 1),
        ("RuntimeError", 2),
    ]
    assert sum(v for _, v in otel.points("kresilient.retries")) == 1
    ((dattrs, dead_letters),) = otel.points("kresilient.dead_letters")
    assert dead_letters == 1
    assert dattrs["kresilient.dead_letter.topic"] == dlq


def test_failed_delivery_carries_error_type(
    kafka_cluster: KafkaCluster, topic_factory: Any, otel: Otel
) -> None:
    topic = topic_factory(config={"max.message.bytes": 1024})
    producer = ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers},
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        propagator=W3C,
    )
    try:
        handle = producer.produce(topic, b"x" * 4096, key=b"big")
        with pytest.raises(ProduceError):
            handle.result(60)
    finally:
        with contextlib.suppress(DeliveryError):  # close() reports the same failure again
            producer.close()

    (span,) = [s for s in otel.spans() if s.name == f"send {topic}"]
    a = _attrs(span)
    assert span.kind is SpanKind.PRODUCER
    assert span.status.status_code is StatusCode.ERROR
    assert a[ERROR_TYPE] == ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE).name()
    assert a["kresilient.error.category"] == "config"
    assert a[MA.MESSAGING_DESTINATION_PARTITION_ID] == "0"
    assert MA.MESSAGING_KAFKA_OFFSET not in a
    sent = otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)
    assert [(x.get(ERROR_TYPE), v) for x, v in sent] == [("MSG_SIZE_TOO_LARGE", 1)]


def test_link_mode_links_the_process_span_to_the_producer(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    providers = _providers(otel)
    with ResilientProducer({"bootstrap.servers": bootstrap}, **providers) as producer:
        producer.produce(topic, b"v", key=b"k").result(60)
    handled = threading.Event()
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}"},
        [topic],
        lambda msg: handled.set(),
        dead_letter=None,
        install_signal_handlers=False,
        poll_timeout=0.2,
        link_mode="link",
        **providers,
    )
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    try:
        assert handled.wait(60)
        _wait_for(lambda: any(s.name == f"process {topic}" for s in otel.spans()), 30, "span")
    finally:
        consumer.stop()
        worker.join(60)
    (send,) = [s for s in otel.spans() if s.name == f"send {topic}"]
    (proc,) = [s for s in otel.spans() if s.name == f"process {topic}"]
    assert proc.kind is SpanKind.CONSUMER
    assert proc.parent is None
    assert proc.context.trace_id != send.context.trace_id
    (link,) = proc.links
    assert (link.context.trace_id, link.context.span_id) == (
        send.context.trace_id,
        send.context.span_id,
    )


def test_batch_handler_gets_one_span_per_call_linked_to_its_producers(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    """A batch handler's call runs inside one ``process`` span that links every message's send
    span; a failed call's span carries the error and the retry; metrics count messages."""
    bootstrap = kafka_cluster.bootstrap_servers
    providers = _providers(otel)
    total = 40
    with ResilientProducer({"bootstrap.servers": bootstrap}, **providers) as producer:
        handles = [producer.produce(topic, b"v%d" % i, key=b"k") for i in range(total)]
        producer.flush(60)
    assert [h.result().offset for h in handles] == list(range(total))

    calls: list[tuple[list[int], Any]] = []  # (offsets, the span current in the handler)
    done: set[int] = set()
    failed_once = threading.Event()

    def handle(msgs: list[Any]) -> None:
        calls.append(([m.offset() for m in msgs], otel_trace.get_current_span()))
        if not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("downstream busy")
        done.update(m.offset() for m in msgs)

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}"},
        [topic],
        batch_handler=handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.2)),
        dead_letter=None,
        install_signal_handlers=False,
        poll_timeout=0.2,
        **providers,
    )
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    try:
        _wait_for(lambda: len(done) == total, 90, "every message handled")
    finally:
        consumer.stop()
        worker.join(60)
    assert not worker.is_alive()

    sends = {
        _attrs(s)[MA.MESSAGING_KAFKA_OFFSET]: s.context
        for s in otel.spans()
        if s.name == f"send {topic}"
    }
    procs = {s.context.span_id: s for s in otel.spans() if s.name == f"process {topic}"}
    assert len(procs) == len(calls) >= 2  # one span per handler call, no other
    for offsets, current in calls:
        span = procs[current.get_span_context().span_id]  # the handler ran inside it
        a = _attrs(span)
        assert span.kind is SpanKind.CONSUMER
        assert a[MA.MESSAGING_BATCH_MESSAGE_COUNT] == len(offsets)
        assert a[MA.MESSAGING_OPERATION_TYPE] == PROCESS
        assert a[MA.MESSAGING_DESTINATION_PARTITION_ID] == "0"
        linked = [(lk.context.trace_id, lk.context.span_id) for lk in span.links]
        assert linked == [(sends[o].trace_id, sends[o].span_id) for o in offsets[:128]]
    first = procs[calls[0][1].get_span_context().span_id]
    assert first.status.status_code is StatusCode.ERROR
    assert _attrs(first)[ERROR_TYPE] == "RuntimeError"
    assert [e.name for e in first.events].count("kresilient.retry") == 1
    assert all(
        procs[c.get_span_context().span_id].status.status_code is not StatusCode.ERROR
        for _, c in calls[1:]
    )
    consumed = sum(
        v
        for a, v in otel.points(MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
        if a[MA.MESSAGING_DESTINATION_NAME] == topic
    )
    assert consumed == sum(len(o) for o, _ in calls)  # the failed call's messages counted too
    durations = sorted(
        (a.get(ERROR_TYPE, ""), n) for a, n in otel.points(MM.MESSAGING_PROCESS_DURATION)
    )
    assert durations == [("", len(calls) - 1), ("RuntimeError", 1)]


def test_batch_handler_dead_letter_span_is_a_child_of_the_calls_span(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    """The item a batch handler names in BatchItemError is dead-lettered inside the call's
    span: the dead_letter span is its child, the DLQ send span the dead_letter span's."""
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = kafka_cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})
    providers = _providers(otel)
    with ResilientProducer({"bootstrap.servers": bootstrap}, **providers) as producer:
        for i in range(5):
            producer.produce(topic, b"v%d" % i, key=b"k")
        producer.flush(60)

    done: set[int] = set()

    def handle(msgs: list[Any]) -> None:
        for i, m in enumerate(msgs):
            if m.offset() == 2:
                raise BatchItemError(index=i) from ValueError("poison record 2")
            done.add(m.offset())

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}"},
        [topic],
        batch_handler=handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(1)),
        dead_letter=DeadLetterPolicy(),
        install_signal_handlers=False,
        poll_timeout=0.2,
        **providers,
    )
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    try:
        _wait_for(
            lambda: done == {0, 1, 3, 4} and any(s.name == f"send {dlq}" for s in otel.spans()),
            90,
            "DLQ write",
        )
    finally:
        consumer.stop()
        worker.join(60)
    spans = otel.spans()
    (dead,) = [s for s in spans if s.name == f"dead_letter {dlq}"]
    assert _attrs(dead)["kresilient.dead_letter.source.offset"] == 2
    assert dead.parent is not None
    (call,) = [s for s in spans if s.context.span_id == dead.parent.span_id]
    assert call.name == f"process {topic}"
    assert _attrs(call)[MA.MESSAGING_BATCH_MESSAGE_COUNT] >= 3  # the call that held offset 2
    assert call.status.status_code is StatusCode.ERROR
    assert _attrs(call)[ERROR_TYPE] == "ValueError"  # the failed item's exception
    (dlq_send,) = [s for s in spans if s.name == f"send {dlq}"]
    assert dlq_send.parent is not None and dlq_send.parent.span_id == dead.context.span_id


def test_trace_spans_call_gives_one_span_per_consume_result_linked_to_its_producers(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    """``trace_spans="call"``: a per-message handler runs inside one ``process`` span per
    ``consume()`` result, linked to each record's send span, not one span per record; a
    failed record is an exception event on that span and its dead letter is the span's child."""
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = kafka_cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})
    providers = _providers(otel)
    total = 30
    producer = ResilientProducer({"bootstrap.servers": bootstrap}, **providers)
    for i in range(total - 5):  # the last 5 once these are handled: a later consume()
        producer.produce(topic, b"v%d" % i, key=b"k")
    producer.flush(60)

    calls: list[tuple[int, Any]] = []  # (offset, the span current in the handler)
    done: set[int] = set()

    def handle(msg: Any) -> None:
        calls.append((msg.offset(), otel_trace.get_current_span()))
        if msg.offset() == 7:
            raise ValueError("poison record 7")
        done.add(msg.offset())

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{topic}"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(1)),
        dead_letter=DeadLetterPolicy(),
        install_signal_handlers=False,
        poll_timeout=0.2,
        trace_spans="call",
        **providers,
    )
    worker = threading.Thread(target=consumer.run, daemon=True)
    worker.start()
    try:
        _wait_for(
            lambda: len(done) == total - 6 and any(s.name == f"send {dlq}" for s in otel.spans()),
            90,
            "the first records handled and the DLQ write",
        )
        for i in range(total - 5, total):
            producer.produce(topic, b"v%d" % i, key=b"k")
        producer.flush(60)
        _wait_for(lambda: len(done) == total - 1, 90, "every record handled")
    finally:
        consumer.stop()
        worker.join(60)
        producer.close()
    assert not worker.is_alive()

    spans = otel.spans()
    sends = {
        (s.context.trace_id, s.context.span_id): _attrs(s)[MA.MESSAGING_KAFKA_OFFSET]
        for s in spans
        if s.name == f"send {topic}"
    }
    procs = {s.context.span_id: s for s in spans if s.name == f"process {topic}"}
    by_span: dict[int, list[int]] = {}
    for offset, current in calls:
        by_span.setdefault(current.get_span_context().span_id, []).append(offset)
    assert set(by_span) == set(procs)  # every handler call ran inside one of them, no other
    assert len(procs) < len(calls)  # the negative control: not one span per record
    for span_id, offsets in by_span.items():
        span = procs[span_id]
        assert span.kind is SpanKind.CONSUMER and span.parent is None
        linked = [sends[(lk.context.trace_id, lk.context.span_id)] for lk in span.links]
        # the span covers the records consume() returned: every record handled in it is linked
        assert set(offsets) <= set(linked)
        assert _attrs(span)[MA.MESSAGING_BATCH_MESSAGE_COUNT] == len(linked)
    (failed_in,) = [sid for sid, offsets in by_span.items() if 7 in offsets]
    failed = procs[failed_in]
    assert failed.status.status_code is StatusCode.ERROR
    assert _attrs(failed)[ERROR_TYPE] == "ValueError"
    assert [e.attributes["exception.message"] for e in failed.events if e.name == "exception"] == [
        "poison record 7"
    ]
    ok = [s for sid, s in procs.items() if sid != failed_in]
    assert ok and all(s.status.status_code is not StatusCode.ERROR for s in ok)
    (dead,) = [s for s in spans if s.name == f"dead_letter {dlq}"]
    assert dead.parent is not None and dead.parent.span_id == failed_in
    assert _attrs(dead)["kresilient.dead_letter.source.offset"] == 7


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"handler": print, "trace_spans": "batch"}, "trace_spans must be 'message' or 'call'"),
        ({"batch_handler": print, "trace_spans": "call"}, "is for a per-message handler"),
    ],
)
def test_trace_spans_refuses_what_it_cannot_do(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        ResilientConsumer(
            {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            ["t"],
            install_signal_handlers=False,
            **kwargs,
        )
    assert err.value.key == "trace_spans"


def test_trace_spans_call_stop_leaves_after_the_span_with_the_handlers_error_once(
    kafka_cluster: KafkaCluster, topic: str, otel: Otel
) -> None:
    """No dead-letter topic and retries exhausted: ``run()`` re-raises the handler's error
    after the call's span ended. The span carries that error once (one exception event), and
    the offset stops before the failed record."""
    bootstrap = kafka_cluster.bootstrap_servers
    providers = _providers(otel)
    with ResilientProducer({"bootstrap.servers": bootstrap}, **providers) as producer:
        for i in range(10):
            producer.produce(topic, b"v%d" % i, key=b"k")
        producer.flush(60)
    group = f"g-{topic}"

    def handle(msg: Any) -> None:
        if msg.offset() == 4:
            raise RuntimeError("always")

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(1)),
        dead_letter=None,
        install_signal_handlers=False,
        poll_timeout=0.2,
        trace_spans="call",
        **providers,
    )
    with pytest.raises(RuntimeError, match="always"):
        consumer.run()
    procs = [s for s in otel.spans() if s.name == f"process {topic}"]
    (failed,) = [s for s in procs if s.status.status_code is StatusCode.ERROR]
    assert _attrs(failed)[ERROR_TYPE] == "RuntimeError"
    assert [e.attributes["exception.message"] for e in failed.events if e.name == "exception"] == [
        "always"
    ]
    reader = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = reader.committed([ck.TopicPartition(topic, 0)], timeout=30)
    finally:
        reader.close()
    assert tp.offset == 4  # everything before the failed record, nothing after it
