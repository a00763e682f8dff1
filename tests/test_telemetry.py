"""Unit tests of kresilient.telemetry with the SDK's in-memory span exporter and metric reader.

No broker: messages are confluent_kafka.Message objects built in memory. The real-cluster trace
is in test_telemetry_integration.py. Every attribute and metric name comes from the
opentelemetry-semantic-conventions constants, never typed here.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka as ck
import pytest
import structlog
from opentelemetry import propagate, trace
from opentelemetry.baggage import get_baggage, set_baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, Sampler
from opentelemetry.semconv._incubating.attributes import messaging_attributes as MA
from opentelemetry.semconv._incubating.metrics import messaging_metrics as MM
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util._once import Once
from structlog.testing import capture_logs

from kresilient.telemetry import (
    Telemetry,
    add_trace_context,
    extract_context,
    inject_headers,
    production_config,
)


@dataclass
class Otel:
    """An SDK tracer and meter provider whose output the test can read."""

    sampler: Sampler | None = None
    exporter: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    reader: InMemoryMetricReader = field(default_factory=InMemoryMetricReader)

    def __post_init__(self) -> None:
        kw: dict[str, Any] = {} if self.sampler is None else {"sampler": self.sampler}
        self.tracer_provider = TracerProvider(**kw)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in self.spans()]}"
        return found[0]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value-or-count) of every data point of *metric*."""
        out: list[tuple[dict[str, Any], Any]] = []
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != metric:
                        continue
                    for dp in m.data.data_points:
                        value = getattr(dp, "value", None)
                        if value is None:
                            value = dp.count  # type: ignore[union-attr]
                        out.append((dict(dp.attributes or {}), value))
        return out

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def header(headers: Any, name: str) -> bytes | None:
    """Last value of header *name* in a confluent-kafka style header list."""
    found = [v for k, v in (headers or []) if k == name]
    return found[-1] if found else None


KAFKA = MA.MessagingSystemValues.KAFKA.value
SEND = MA.MessagingOperationTypeValues.SEND.value
PROCESS = MA.MessagingOperationTypeValues.PROCESS.value
SETTLE = MA.MessagingOperationTypeValues.SETTLE.value
W3C = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"  # the W3C header name: a propagation format, not a semconv name


@pytest.fixture(name="otel")
def _otel() -> Any:
    o = Otel()
    yield o
    o.shutdown()


@pytest.fixture(name="tel")
def _tel(otel: Otel) -> Telemetry:
    return Telemetry(
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        propagator=W3C,
        client_id="svc-1",
        consumer_group="grp",
    )


@pytest.fixture(name="fresh_globals")
def _fresh_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    """No global tracer/meter provider set (restored after the test)."""
    from opentelemetry import metrics
    from opentelemetry.metrics import _internal as metrics_internal

    assert hasattr(trace, "_TRACER_PROVIDER"), "opentelemetry-api changed its global"
    assert hasattr(metrics_internal, "_METER_PROVIDER"), "opentelemetry-api changed its global"
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER", None)
    monkeypatch.setattr(metrics_internal, "_METER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    monkeypatch.delenv("OTEL_PYTHON_METER_PROVIDER", raising=False)
    assert metrics is not None


def message(
    headers: Any,
    *,
    topic: str = "orders",
    partition: int = 2,
    offset: int = 41,
    key: bytes | None = b"order-7",
    value: bytes | None = b"x" * 12,
) -> Any:
    return ck.Message(
        topic=topic, partition=partition, offset=offset, key=key, value=value, headers=headers
    )


def remote(headers: Any) -> tuple[int, int, bool]:
    """(trace id, span id, sampled) of the context carried in *headers*."""
    sc = trace.get_current_span(extract_context(headers, propagator=W3C)).get_span_context()
    assert sc.is_valid and sc.is_remote
    return sc.trace_id, sc.span_id, sc.trace_flags.sampled


def send_and_deliver(tel: Telemetry, headers: Any = None, **kw: Any) -> Any:
    """Produce-side telemetry for one successfully delivered message; returns the message."""
    out, token = tel.producer_send("orders", b"order-7", 12, headers, None)
    msg = message(out, **kw)
    tel.producer_delivered(token, None, msg)
    return msg


# --- producer ------------------------------------------------------------------------------


def test_send_span_ends_at_delivery_report_with_partition_and_offset(
    otel: Otel, tel: Telemetry
) -> None:
    out, token = tel.producer_send("orders", b"order-7", 12, None, None)
    assert otel.spans() == []  # still open: enqueue is not delivery
    tel.producer_delivered(token, None, message(out, partition=2, offset=41))

    span = otel.span("send orders")
    assert span.kind is SpanKind.PRODUCER
    assert span.status.status_code is StatusCode.UNSET
    attrs = dict(span.attributes or {})
    assert attrs[MA.MESSAGING_SYSTEM] == KAFKA
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders"
    assert attrs[MA.MESSAGING_OPERATION_TYPE] == SEND
    assert attrs[MA.MESSAGING_OPERATION_NAME] == SEND
    assert attrs[MA.MESSAGING_CLIENT_ID] == "svc-1"
    assert MA.MESSAGING_KAFKA_MESSAGE_KEY not in attrs  # keys are opt-in
    assert attrs[MA.MESSAGING_MESSAGE_BODY_SIZE] == 12
    assert attrs[MA.MESSAGING_DESTINATION_PARTITION_ID] == "2"
    assert attrs[MA.MESSAGING_KAFKA_OFFSET] == 41
    assert ERROR_TYPE not in attrs
    # no deprecated names
    for old in (
        MA.MESSAGING_OPERATION,
        MA.MESSAGING_KAFKA_MESSAGE_OFFSET,
        MA.MESSAGING_KAFKA_DESTINATION_PARTITION,
    ):
        assert old not in attrs


def test_send_injects_span_context_into_a_new_header_list(otel: Otel, tel: Telemetry) -> None:
    original = [("app", b"1"), ("TraceParent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    snapshot = list(original)
    out, token = tel.producer_send("orders", None, 0, original, 0)
    tel.producer_delivered(token, None, message(out))

    assert original == snapshot  # caller's list untouched
    assert isinstance(out, list) and out is not original
    assert [k for k, _ in out].count(TRACEPARENT) == 1
    assert all(k.lower() != TRACEPARENT or k == TRACEPARENT for k, _ in out)  # stale one gone
    assert ("app", b"1") in out
    ctx = otel.span("send orders").context
    assert remote(out) == (ctx.trace_id, ctx.span_id, True)


def test_send_accepts_dict_headers(otel: Otel, tel: Telemetry) -> None:
    original = {"app": b"1"}
    out, token = tel.producer_send("orders", None, 0, original, None)
    tel.producer_delivered(token, None, message(out))
    assert original == {"app": b"1"}
    assert isinstance(out, list)
    assert header(out, "app") == b"1"
    assert header(out, TRACEPARENT) is not None


def test_binary_key_is_omitted_and_text_key_kept(otel: Otel) -> None:
    tel = Telemetry(tracer_provider=otel.tracer_provider, record_message_key=True)
    _, t1 = tel.producer_send("orders", b"\xff\xfe\x00", 1, None, None)
    tel.producer_delivered(t1, None, message(None))
    _, t2 = tel.producer_send("orders", "text-key", 1, None, None)
    tel.producer_delivered(t2, None, message(None))
    keys = [dict(s.attributes or {}).get(MA.MESSAGING_KAFKA_MESSAGE_KEY) for s in otel.spans()]
    assert keys == [None, "text-key"]


def test_record_message_key_false_never_records_keys(otel: Otel) -> None:
    tel = Telemetry(tracer_provider=otel.tracer_provider, record_message_key=False)
    send_and_deliver(tel)
    assert MA.MESSAGING_KAFKA_MESSAGE_KEY not in dict(otel.span("send orders").attributes or {})


def test_failed_delivery_carries_error_type_category_and_error_status(
    otel: Otel, tel: Telemetry
) -> None:
    out, token = tel.producer_send("orders", b"k", 3, None, None)
    err = ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT)
    tel.producer_delivered(token, err, message(out, partition=-1, offset=-1001))

    span = otel.span("send orders")
    attrs = dict(span.attributes or {})
    assert attrs[ERROR_TYPE] == err.name() == "_MSG_TIMED_OUT"
    assert attrs["kresilient.error.category"] == "delivery_timeout"
    assert MA.MESSAGING_KAFKA_OFFSET not in attrs
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == err.str()

    sent = otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)
    assert [(a.get(ERROR_TYPE), v) for a, v in sent] == [("_MSG_TIMED_OUT", 1)]


def test_explicit_classification_wins(otel: Otel, tel: Telemetry) -> None:
    from kresilient.errors import classify

    out, token = tel.producer_send("orders", None, 3, None, None)
    err = ck.KafkaError(ck.KafkaError.MSG_SIZE_TOO_LARGE)
    tel.producer_delivered(token, err, message(out), classify(ck.KafkaError._MSG_TIMED_OUT))
    assert dict(otel.span("send orders").attributes or {})["kresilient.error.category"] == (
        "delivery_timeout"
    )


def test_send_metrics_count_and_time_each_delivery(otel: Otel, tel: Telemetry) -> None:
    for _ in range(3):
        send_and_deliver(tel)
    ((attrs, count),) = otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)
    assert count == 3
    assert attrs == {  # no partition: opt-in on metrics (cardinality)
        MA.MESSAGING_SYSTEM: KAFKA,
        MA.MESSAGING_DESTINATION_NAME: "orders",
        MA.MESSAGING_OPERATION_NAME: SEND,
    }
    ((dattrs, dcount),) = otel.points(MM.MESSAGING_CLIENT_OPERATION_DURATION)
    assert dcount == 3
    assert dattrs == attrs


def test_clients_sharing_a_meter_provider_all_count(otel: Otel, tel: Telemetry) -> None:
    other = Telemetry(meter_provider=otel.meter_provider, tracer_provider=otel.tracer_provider)
    send_and_deliver(tel)
    send_and_deliver(other)  # same attributes, another client: one series
    out, token = other.producer_send("payments", None, 1, None, None)
    other.producer_delivered(token, None, message(out, topic="payments"))
    sent = {
        a[MA.MESSAGING_DESTINATION_NAME]: v
        for a, v in otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)
    }
    assert sent == {"orders": 2, "payments": 1}


# --- consumer ------------------------------------------------------------------------------


def test_process_span_is_child_of_the_producer_span(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    with tel.process_span(msg) as span:
        assert span is not None
        assert trace.get_current_span() is span

    send, proc = otel.span("send orders"), otel.span("process orders")
    assert proc.kind is SpanKind.CONSUMER
    assert proc.parent is not None
    assert proc.parent.span_id == send.context.span_id
    assert proc.context.trace_id == send.context.trace_id
    assert list(proc.links) == []
    attrs = dict(proc.attributes or {})
    assert attrs[MA.MESSAGING_SYSTEM] == KAFKA
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders"
    assert attrs[MA.MESSAGING_OPERATION_TYPE] == PROCESS
    assert attrs[MA.MESSAGING_OPERATION_NAME] == PROCESS
    assert attrs[MA.MESSAGING_CONSUMER_GROUP_NAME] == "grp"
    assert attrs[MA.MESSAGING_DESTINATION_PARTITION_ID] == "2"
    assert attrs[MA.MESSAGING_KAFKA_OFFSET] == 41
    assert attrs[MA.MESSAGING_CLIENT_ID] == "svc-1"
    assert attrs[MA.MESSAGING_MESSAGE_BODY_SIZE] == 12
    assert MA.MESSAGING_KAFKA_MESSAGE_KEY not in attrs  # keys are opt-in


def test_link_mode_links_to_the_producer_instead_of_parenting(otel: Otel) -> None:
    tel = Telemetry(tracer_provider=otel.tracer_provider, propagator=W3C, link_mode="link")
    msg = send_and_deliver(tel)
    with tel.process_span(msg, group="g2"):
        pass
    send, proc = otel.span("send orders"), otel.span("process orders")
    assert proc.parent is None
    assert proc.context.trace_id != send.context.trace_id
    (link,) = proc.links
    assert link.context.span_id == send.context.span_id
    assert link.context.trace_id == send.context.trace_id
    assert dict(proc.attributes or {})[MA.MESSAGING_CONSUMER_GROUP_NAME] == "g2"


def test_link_mode_parent_is_the_ambient_span(otel: Otel) -> None:
    tel = Telemetry(tracer_provider=otel.tracer_provider, propagator=W3C, link_mode="link")
    msg = send_and_deliver(tel)
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("poll-loop") as loop, tel.process_span(msg):
        pass
    proc = otel.span("process orders")
    assert proc.parent is not None and proc.parent.span_id == loop.get_span_context().span_id


def test_message_without_headers_starts_a_root_span(otel: Otel, tel: Telemetry) -> None:
    with tel.process_span(message(None)):
        pass
    proc = otel.span("process orders")
    assert proc.parent is None
    assert list(proc.links) == []


@pytest.mark.parametrize(
    "headers",
    [
        [(TRACEPARENT, b"garbage")],
        [(TRACEPARENT, None)],
        [(TRACEPARENT, b"\xff\xfe")],
        [(TRACEPARENT, b"00-" + b"0" * 32 + b"-" + b"0" * 16 + b"-01")],  # invalid all-zero ids
    ],
    ids=["garbage", "none", "not-utf8", "zero-ids"],
)
def test_malformed_trace_headers_are_tolerated(
    otel: Otel, tel: Telemetry, headers: list[tuple[str, Any]]
) -> None:
    with tel.process_span(message(headers)):
        pass
    assert otel.span("process orders").parent is None


def test_extract_context_tolerates_str_values_and_odd_items() -> None:
    tid, sid = "a" * 32, "b" * 16
    headers: Any = [("x",), 17, (b"k", b"v"), (TRACEPARENT, f"00-{tid}-{sid}-01")]
    ctx = extract_context(headers, propagator=W3C)
    sc = trace.get_current_span(ctx).get_span_context()
    assert (f"{sc.trace_id:032x}", f"{sc.span_id:016x}") == (tid, sid)


def test_inject_headers_uses_the_global_propagator_by_default(otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("outer") as outer:
        out = inject_headers(None)
    assert propagate.get_global_textmap().fields >= {TRACEPARENT}
    sc = trace.get_current_span(extract_context(out)).get_span_context()
    assert sc.span_id == outer.get_span_context().span_id


def test_baggage_travels_with_the_parent_context(otel: Otel) -> None:
    prop = CompositePropagator([W3C, W3CBaggagePropagator()])
    tel = Telemetry(tracer_provider=otel.tracer_provider, propagator=prop)
    from opentelemetry import context as ctxapi

    token = ctxapi.attach(set_baggage("tenant", "t-9"))
    try:
        out, tok = tel.producer_send("orders", None, 1, None, None)
    finally:
        ctxapi.detach(token)
    tel.producer_delivered(tok, None, message(out))
    with tel.process_span(message(out)):
        assert get_baggage("tenant") == "t-9"


def test_exception_in_process_block_is_recorded_and_reraised(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    with pytest.raises(KeyError), tel.process_span(msg):
        raise KeyError("missing")
    proc = otel.span("process orders")
    assert proc.status.status_code is StatusCode.ERROR
    assert dict(proc.attributes or {})[ERROR_TYPE] == "KeyError"
    assert [e.name for e in proc.events] == ["exception"]
    ((attrs, count),) = otel.points(MM.MESSAGING_PROCESS_DURATION)
    assert (attrs[ERROR_TYPE], count) == ("KeyError", 1)
    ((cattrs, consumed),) = otel.points(MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
    assert consumed == 1
    assert ERROR_TYPE not in cattrs  # the message was delivered; processing failed


def test_consumer_metrics(otel: Otel, tel: Telemetry) -> None:
    for offset in (1, 2):
        with tel.process_span(message(None, offset=offset)):
            pass
    ((attrs, consumed),) = otel.points(MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
    assert consumed == 2
    assert attrs == {
        MA.MESSAGING_SYSTEM: KAFKA,
        MA.MESSAGING_DESTINATION_NAME: "orders",
        MA.MESSAGING_OPERATION_NAME: PROCESS,
        MA.MESSAGING_CONSUMER_GROUP_NAME: "grp",
    }
    ((pattrs, processed),) = otel.points(MM.MESSAGING_PROCESS_DURATION)
    assert (pattrs, processed) == (attrs, 2)


def test_retries_are_span_events_and_counted(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    with tel.process_span(msg) as span:
        tel.retry_event(span, 1, TimeoutError("slow"), delay_s=0.5)
        tel.retry_event(None, 2, TimeoutError("slow"))  # None: the current process span
    events = [e for e in otel.span("process orders").events if e.name == "kresilient.retry"]
    assert [dict(e.attributes or {})["kresilient.retry.attempt"] for e in events] == [1, 2]
    assert dict(events[0].attributes or {})[ERROR_TYPE] == "TimeoutError"
    ((attrs, count),) = otel.points("kresilient.retries")
    assert count == 2
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders"
    assert attrs[ERROR_TYPE] == "TimeoutError"


def test_dead_letter_span_is_a_child_span_naming_the_dlq(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    dlq_producer_side = Telemetry(tracer_provider=otel.tracer_provider, propagator=W3C)
    reason = ValueError("bad payload")
    with capture_logs() as logs, tel.process_span(msg):
        with tel.dead_letter_span("orders-dlq", source=msg, reason=reason, attempts=3) as dspan:
            assert dspan is not None
            carrier = tel.trace_carrier()
            # the DLQ write through a traced producer: its send span nests under this one
            out, token = dlq_producer_side.producer_send("orders-dlq", None, 12, None, None)
        dlq_producer_side.producer_delivered(token, None, message(out, topic="orders-dlq"))
    send, proc = otel.span("send orders"), otel.span("process orders")
    dead, dsend = otel.span("dead_letter orders-dlq"), otel.span("send orders-dlq")
    assert dead.kind is SpanKind.INTERNAL
    assert dead.parent is not None and dead.parent.span_id == proc.context.span_id
    assert dsend.kind is SpanKind.PRODUCER
    assert dsend.parent is not None and dsend.parent.span_id == dead.context.span_id
    assert {dead.context.trace_id, dsend.context.trace_id} == {send.context.trace_id}
    attrs = dict(dead.attributes or {})
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders-dlq"
    assert MA.MESSAGING_OPERATION_TYPE not in attrs  # not itself the send operation
    assert attrs["kresilient.dead_letter.source.topic"] == "orders"
    assert attrs["kresilient.dead_letter.source.partition"] == 2
    assert attrs["kresilient.dead_letter.source.offset"] == 41
    assert attrs["kresilient.dead_letter.reason"] == "ValueError"
    assert attrs["kresilient.attempts"] == 3
    assert ERROR_TYPE not in attrs  # the DLQ write itself succeeded
    assert remote([(k, v.encode()) for k, v in carrier.items()]) == (
        dead.context.trace_id,
        dead.context.span_id,
        True,
    )
    # the process span is failed by the reason
    assert dict(proc.attributes or {})[ERROR_TYPE] == "ValueError"
    ((mattrs, n),) = otel.points("kresilient.dead_letters")
    assert n == 1
    assert mattrs[MA.MESSAGING_DESTINATION_NAME] == "orders"
    assert mattrs["kresilient.dead_letter.topic"] == "orders-dlq"
    (log,) = [e for e in logs if e["event"] == "kafka_message_dead_lettered"]
    assert log["trace_id"] == f"{dead.context.trace_id:032x}"
    assert log["span_id"] == f"{dead.context.span_id:016x}"
    assert log["dead_letter_topic"] == "orders-dlq"
    assert log["log_level"] == "warning"


def test_dead_letter_producer_kind_injects_its_own_context(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    with tel.process_span(msg), tel.dead_letter_span("orders-dlq", source=msg, kind="producer"):
        dlq_headers = tel.inject_headers(msg.headers())
    dlq = otel.span("send orders-dlq")
    assert dlq.kind is SpanKind.PRODUCER
    assert dict(dlq.attributes or {})[MA.MESSAGING_OPERATION_TYPE] == SEND
    assert [k for k, _ in dlq_headers].count(TRACEPARENT) == 1  # the original one replaced
    assert remote(dlq_headers) == (dlq.context.trace_id, dlq.context.span_id, True)


def test_an_empty_propagator_leaves_headers_byte_for_byte(otel: Otel) -> None:
    from opentelemetry.propagators.composite import CompositePropagator as Composite

    tel = Telemetry(tracer_provider=otel.tracer_provider, propagator=Composite([]))
    original = [("b", b"2"), (TRACEPARENT, b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    out, token = tel.producer_send("orders", None, 1, original, None)
    assert out == original
    tel.producer_delivered(token, None, message(out))
    assert otel.span("send orders").kind is SpanKind.PRODUCER


def test_failed_dead_letter_write_carries_error_type(otel: Otel, tel: Telemetry) -> None:
    msg = send_and_deliver(tel)
    err = ck.KafkaException(ck.KafkaError(ck.KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with (
        capture_logs() as logs,
        pytest.raises(ck.KafkaException),
        tel.process_span(msg),
        tel.dead_letter_span("orders-dlq", source=msg, reason=ValueError("x")),
    ):
        raise err
    (log,) = [e for e in logs if e["event"] == "kafka_message_dead_lettered"]
    assert (log["log_level"], log["write_error"]) == ("error", "TOPIC_AUTHORIZATION_FAILED")
    dlq = otel.span("dead_letter orders-dlq")
    assert dict(dlq.attributes or {})[ERROR_TYPE] == "TOPIC_AUTHORIZATION_FAILED"
    assert dlq.status.status_code is StatusCode.ERROR
    ((mattrs, _),) = otel.points("kresilient.dead_letters")
    assert mattrs[ERROR_TYPE] == "TOPIC_AUTHORIZATION_FAILED"


def test_set_error_marks_the_current_process_span(otel: Otel, tel: Telemetry) -> None:
    with tel.process_span(message(None)):
        tel.set_error(ValueError("handled"))
    assert dict(otel.span("process orders").attributes or {})[ERROR_TYPE] == "ValueError"


def test_commit_is_a_settle_client_span(otel: Otel, tel: Telemetry) -> None:
    tel.record_commit([ck.TopicPartition("orders", 2, 42)], duration_s=0.02)
    span = otel.span("commit orders")
    assert span.kind is SpanKind.CLIENT
    attrs = dict(span.attributes or {})
    assert attrs[MA.MESSAGING_OPERATION_TYPE] == SETTLE
    assert attrs[MA.MESSAGING_OPERATION_NAME] == "commit"
    assert attrs[MA.MESSAGING_CONSUMER_GROUP_NAME] == "grp"
    assert attrs[MA.MESSAGING_DESTINATION_PARTITION_ID] == "2"
    assert attrs[MA.MESSAGING_KAFKA_OFFSET] == 42
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == 20_000_000
    ((mattrs, n),) = otel.points(MM.MESSAGING_CLIENT_OPERATION_DURATION)
    assert (mattrs[MA.MESSAGING_OPERATION_NAME], n) == ("commit", 1)


def test_failed_commit_carries_error_type(otel: Otel, tel: Telemetry) -> None:
    err = ck.KafkaError(ck.KafkaError.REBALANCE_IN_PROGRESS)
    tel.record_commit([("orders", 0, 5), ("payments", 1, 9)], error=err)
    span = otel.span("commit")
    attrs = dict(span.attributes or {})
    assert attrs[ERROR_TYPE] == "REBALANCE_IN_PROGRESS"
    assert attrs[MA.MESSAGING_BATCH_MESSAGE_COUNT] == 2
    assert span.status.status_code is StatusCode.ERROR


# --- sampling, disabled paths, late providers ----------------------------------------------


def test_sampled_out_send_is_not_recorded_but_context_still_propagates() -> None:
    otel = Otel(sampler=ParentBased(ALWAYS_OFF))
    try:
        tel = Telemetry(
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            propagator=W3C,
        )
        out, token = tel.producer_send("orders", b"k", 1, None, None)
        assert token is not None and token.span is not None
        assert not token.span.is_recording()
        tel.producer_delivered(token, None, message(out))
        # the not-sampled decision is propagated, so downstream does not sample either
        assert remote(out) == (
            token.span.get_span_context().trace_id,
            token.span.get_span_context().span_id,
            False,
        )
        with tel.process_span(message(out)) as span:
            assert span is not None and not span.is_recording()
        assert otel.spans() == []
        # metrics do not depend on trace sampling
        assert [v for _, v in otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)] == [1]
    finally:
        otel.shutdown()


def test_no_sdk_is_a_no_op(fresh_globals: None) -> None:
    tel = Telemetry()
    assert not tel.enabled
    headers = [("a", b"1")]
    out, token = tel.producer_send("orders", b"k", 1, headers, None)
    assert out is headers and token is None
    tel.producer_delivered(token, None, None)
    with tel.process_span(message(None)) as span:
        assert span is None
    with tel.dead_letter_span("dlq") as dspan:
        assert dspan is None
    tel.record_commit([("orders", 0, 1)])
    tel.retry_event(None, 1, ValueError())


def test_noop_providers_disable_telemetry() -> None:
    from opentelemetry.metrics import NoOpMeterProvider

    tel = Telemetry(tracer_provider=trace.NoOpTracerProvider(), meter_provider=NoOpMeterProvider())
    assert not tel.enabled
    assert tel.producer_send("orders", None, 1, None, None) == (None, None)


def test_global_providers_set_after_construction_are_picked_up(fresh_globals: None) -> None:
    from opentelemetry import metrics

    tel = Telemetry(propagator=W3C)
    assert not tel.enabled
    otel = Otel()
    try:
        trace.set_tracer_provider(otel.tracer_provider)
        metrics.set_meter_provider(otel.meter_provider)
        assert tel.tracing_enabled and tel.metrics_enabled
        send_and_deliver(tel)
        assert otel.span("send orders").kind is SpanKind.PRODUCER
        assert [v for _, v in otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)] == [1]
    finally:
        otel.shutdown()


def test_an_explicit_proxy_provider_means_the_global_one(fresh_globals: None) -> None:
    tel = Telemetry(tracer_provider=trace.get_tracer_provider(), propagator=W3C)
    assert not tel.tracing_enabled
    otel = Otel()
    try:
        trace.set_tracer_provider(otel.tracer_provider)
        send_and_deliver(tel)
        assert otel.span("send orders").kind is SpanKind.PRODUCER
    finally:
        otel.shutdown()


def test_a_provider_named_by_environment_is_loaded(
    fresh_globals: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    tel = Telemetry()
    assert tel.tracing_enabled
    assert not tel.metrics_enabled


def test_otel_sdk_disabled_turns_telemetry_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    otel = Otel()
    try:
        tel = Telemetry(tracer_provider=otel.tracer_provider, meter_provider=otel.meter_provider)
        assert not tel.enabled
        assert tel.producer_send("orders", None, 1, None, None) == (None, None)
    finally:
        otel.shutdown()


def test_metrics_only_still_counts_without_tracing(otel: Otel) -> None:
    tel = Telemetry(tracer_provider=trace.NoOpTracerProvider(), meter_provider=otel.meter_provider)
    out, token = tel.producer_send("orders", None, 1, [("a", b"1")], None)
    assert out == [("a", b"1")] and token is not None
    tel.producer_delivered(token, None, message(out))
    with tel.process_span(message(out)) as span:
        assert span is None
    assert [v for _, v in otel.points(MM.MESSAGING_CLIENT_SENT_MESSAGES)] == [1]
    assert [v for _, v in otel.points(MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)] == [1]
    assert otel.spans() == []


def test_invalid_link_mode_is_refused() -> None:
    from kresilient.errors import ConfigError

    with pytest.raises(ConfigError):
        Telemetry(link_mode="sideways")  # type: ignore[arg-type]


def test_for_client_reads_client_id_and_group(otel: Otel) -> None:
    tel = Telemetry.for_client(
        {"client.id": "c9", "group.id": "g9", "sasl.password": "s3cret"},
        tracer_provider=otel.tracer_provider,
    )
    with tel.process_span(message(None)):
        pass
    attrs = dict(otel.span("process orders").attributes or {})
    assert attrs[MA.MESSAGING_CLIENT_ID] == "c9"
    assert attrs[MA.MESSAGING_CONSUMER_GROUP_NAME] == "g9"
    assert "s3cret" not in repr(attrs)


# --- leadership and notable events ---------------------------------------------------------


def test_leadership_listener_counts_and_logs_state_changes(otel: Otel, tel: Telemetry) -> None:
    import enum

    class State(enum.Enum):
        STABLE = "stable"
        TRANSIENT_BURST = "transient_burst"

    @dataclass
    class Change:
        topic: str
        partition: int
        previous: State
        state: State

    listener = tel.leadership_listener(log=True)
    with capture_logs() as logs:
        listener(Change("orders", 0, State.STABLE, State.TRANSIENT_BURST))
        listener(Change("orders", 0, State.TRANSIENT_BURST, State.STABLE))
    points = {
        a["kresilient.leadership.state"]: v
        for a, v in otel.points("kresilient.leadership.state_changes")
    }
    assert points == {"transient_burst": 1, "stable": 1}
    assert [(e["state"], e["log_level"]) for e in logs] == [
        ("transient_burst", "warning"),
        ("stable", "info"),
    ]
    with capture_logs() as quiet:
        tel.leadership_listener()(Change("orders", 0, State.STABLE, State.TRANSIENT_BURST))
    assert quiet == []  # the monitor logs changes itself; no duplicate by default


def test_leadership_listener_with_the_real_monitor_types(otel: Otel, tel: Telemetry) -> None:
    from kresilient.errors import classify
    from kresilient.leadership import LeadershipChange, LeadershipState

    change = LeadershipChange(
        topic="orders",
        partition=1,
        previous=LeadershipState.STABLE,
        state=LeadershipState.SUSTAINED_CHURN,
        at=0.0,
        reason="errors",
        leader=2,
        leader_changes=4,
        bursts=3,
        errors=9,
        window_s=60.0,
        classification=classify(ck.KafkaError(ck.KafkaError.NOT_LEADER_FOR_PARTITION)),
    )
    tel.leadership_listener()(change)
    ((attrs, n),) = otel.points("kresilient.leadership.state_changes")
    assert n == 1
    assert attrs["kresilient.leadership.state"] == "sustained_churn"
    assert attrs["kresilient.error.category"] == "leadership"
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders"


def test_notable_events_carry_trace_ids(otel: Otel, tel: Telemetry) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    with capture_logs() as logs, tracer.start_as_current_span("work") as span:
        tel.circuit_breaker_opened(dead_letters=10, window_s=60.0)
        tel.fatal_error(ck.KafkaException(ck.KafkaError(ck.KafkaError._FENCED)))
    sc = span.get_span_context()
    assert [e["event"] for e in logs] == [
        "kafka_dead_letter_circuit_breaker_opened",
        "kafka_fatal_error",
    ]
    assert all(e["trace_id"] == f"{sc.trace_id:032x}" for e in logs)
    assert logs[1]["error_type"] == "_FENCED"
    assert [e.name for e in otel.span("work").events] == [
        "kafka_dead_letter_circuit_breaker_opened",
        "kafka_fatal_error",
    ]


# --- structlog -----------------------------------------------------------------------------


def test_add_trace_context_processor(otel: Otel) -> None:
    assert add_trace_context(None, "info", {"event": "x"}) == {"event": "x"}
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("s") as span:
        out = add_trace_context(None, "info", {"event": "x"})
    sc = span.get_span_context()
    assert out == {"event": "x", "trace_id": f"{sc.trace_id:032x}", "span_id": f"{sc.span_id:016x}"}


def test_production_config_renders_json_with_trace_ids_and_filters_debug(otel: Otel) -> None:
    import logging

    stream = io.StringIO()
    cfg = production_config(level=logging.INFO, stream=stream)
    log = structlog.wrap_logger(
        cfg["logger_factory"](), processors=cfg["processors"], wrapper_class=cfg["wrapper_class"]
    )
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("s") as span:
        log.debug("hidden")
        log.info("shown", topic="orders")
    (line,) = stream.getvalue().splitlines()
    event = json.loads(line)
    assert event["event"] == "shown" and event["level"] == "info"
    assert event["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert "timestamp" in event
