"""``Telemetry.batch_process_span``: one CONSUMER span per batch handler call, in memory.

The span follows the messaging conventions for batches: a child of the current context, one
link per message to its producer's context, ``messaging.batch.message_count``. Links are read
from the canonical ``traceparent`` without the propagator where that gives the same context;
a sampled-out batch reads no headers at all. These tests compare both with the SDK and the
propagator (the generic path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage import get_baggage, set_baggage
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.semconv._incubating.attributes import messaging_attributes as MA
from opentelemetry.semconv._incubating.metrics import messaging_metrics as MM
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import SpanKind, StatusCode
from test_telemetry_sampling import DEFAULT_COMPOSITE, HEADER_FORMS, W3C, PropagatorOnly

from kresilient.telemetry import Telemetry, extract_context, inject_headers, sampling

TRACEPARENT = "traceparent"  # the W3C header name: a propagation format, not a semconv name
PROCESS = MA.MessagingOperationTypeValues.PROCESS.value


@dataclass
class Msg:
    """A consumed record as telemetry reads it; counts ``headers()`` calls."""

    topic_: str = "orders"
    partition_: int = 3
    offset_: int = 0
    headers_: Any = None
    reads: list[int] = field(default_factory=list)

    def topic(self) -> str:
        return self.topic_

    def partition(self) -> int:
        return self.partition_

    def offset(self) -> int:
        return self.offset_

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v" * 10

    def headers(self) -> Any:
        self.reads.append(1)
        return self.headers_


def parent(trace_id: int, span_id: int, flags: str) -> list[tuple[str, bytes]]:
    return [(TRACEPARENT, f"00-{trace_id:032x}-{span_id:016x}-{flags}".encode())]


def provider(
    sampler: Sampler = ALWAYS_ON, **kw: Any
) -> tuple[TracerProvider, InMemorySpanExporter]:
    tp = TracerProvider(sampler=sampler, shutdown_on_exit=False, **kw)
    exporter = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def telemetry(tp: TracerProvider, **kw: Any) -> Telemetry:
    kw.setdefault("propagator", W3C)
    return Telemetry(tracer_provider=tp, client_id="worker-1", **kw)


def generic_context(headers: Any, propagator: Any = W3C) -> trace.SpanContext:
    """The producer context the propagator reads from *headers* (invalid if none)."""
    extracted = extract_context(headers, context=Context(), propagator=propagator)
    return trace.get_current_span(extracted).get_span_context()


def test_one_span_per_batch_linked_to_each_producer() -> None:
    tp, exporter = provider()
    tel = telemetry(tp)
    msgs = [
        Msg(offset_=10, headers_=parent(0xA1, 0xB1, "01")),
        Msg(offset_=11, headers_=None),  # no context: no link
        Msg(offset_=12, headers_=parent(0xA2, 0xB2, "00")),  # sampled out upstream: linked
        Msg(offset_=13, headers_=[*parent(0xA3, 0xB3, "01"), ("tracestate", b"v=1")]),
    ]
    with tel.batch_process_span(msgs, group="billing") as span:
        assert span is not None and span.is_recording()
        assert trace.get_current_span() is span  # the handler's own spans are its children
    (done,) = exporter.get_finished_spans()
    assert done.name == "process orders"
    assert done.kind is SpanKind.CONSUMER
    assert done.parent is None  # a new trace in a consumer loop; producers are links
    attrs = dict(done.attributes or {})
    assert attrs[MA.MESSAGING_BATCH_MESSAGE_COUNT] == 4
    assert attrs[MA.MESSAGING_DESTINATION_NAME] == "orders"
    assert attrs[MA.MESSAGING_DESTINATION_PARTITION_ID] == "3"
    assert attrs[MA.MESSAGING_OPERATION_TYPE] == PROCESS
    assert attrs[MA.MESSAGING_CONSUMER_GROUP_NAME] == "billing"
    assert attrs[MA.MESSAGING_CLIENT_ID] == "worker-1"
    assert MA.MESSAGING_KAFKA_OFFSET not in attrs  # one offset would misdescribe a batch
    expected = [generic_context(m.headers_) for m in msgs if m.headers_]
    assert [link.context for link in done.links] == expected
    assert [c.trace_id for c in expected] == [0xA1, 0xA2, 0xA3]
    assert expected[2].trace_state.get("v") == "1"


def test_batch_span_is_a_child_of_the_current_span() -> None:
    tp, exporter = provider()
    tel = telemetry(tp)
    msgs = [Msg(headers_=parent(0xA1, 0xB1, "01"))]
    with (
        tp.get_tracer("test").start_as_current_span("poll-loop") as outer,
        tel.batch_process_span(msgs),
    ):
        pass
    batch = next(s for s in exporter.get_finished_spans() if s.name == "process orders")
    assert batch.parent is not None
    assert batch.parent.span_id == outer.get_span_context().span_id
    assert batch.context.trace_id == outer.get_span_context().trace_id


@pytest.mark.parametrize(("form", "headers"), HEADER_FORMS, ids=[f for f, _ in HEADER_FORMS])
@pytest.mark.parametrize("propagator", [W3C, DEFAULT_COMPOSITE], ids=["w3c", "composite"])
def test_links_read_from_headers_are_the_propagators(
    form: str, headers: Any, propagator: Any
) -> None:
    """The direct read gives exactly the propagator's context, or leaves it to it."""
    direct = sampling.DirectW3C().read(headers, propagator)
    if direct is not None:
        assert direct == generic_context(headers, propagator), form
    tp, exporter = provider()
    fast = telemetry(tp, propagator=propagator)
    slow = telemetry(tp, propagator=propagator)
    slow._w3c = PropagatorOnly()  # type: ignore[assignment]  # always the propagator
    for tel in (fast, slow):
        with tel.batch_process_span([Msg(headers_=headers)]):
            pass
    fast_span, slow_span = exporter.get_finished_spans()
    assert [lk.context for lk in fast_span.links] == [lk.context for lk in slow_span.links], form


def test_canonical_traceparent_is_read_without_the_propagator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = W3C.extract

    def counting(*args: Any, **kwargs: Any) -> Context:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(W3C, "extract", counting)
    tp, exporter = provider()
    tel = telemetry(tp)
    with tel.batch_process_span([Msg(headers_=parent(0xA1, 0xB1, "01")) for _ in range(5)]):
        pass
    assert calls == []
    assert len(exporter.get_finished_spans()[0].links) == 5
    # negative control: a form the direct read leaves alone goes through the propagator
    with_state = [*parent(0xA1, 0xB1, "01"), ("tracestate", b"v=1")]
    with tel.batch_process_span([Msg(headers_=with_state)]):
        pass
    assert calls == [1]


def test_links_stop_at_the_sdks_link_limit() -> None:
    tp, exporter = provider(span_limits=SpanLimits(max_links=2))
    tel = telemetry(tp)
    msgs = [Msg(offset_=i, headers_=parent(0xA0 + i, 0xB0 + i, "01")) for i in range(1, 6)]
    with tel.batch_process_span(msgs):
        pass
    (done,) = exporter.get_finished_spans()
    assert [lk.context.trace_id for lk in done.links] == [0xA1, 0xA2]
    assert dict(done.attributes or {})[MA.MESSAGING_BATCH_MESSAGE_COUNT] == 5
    assert [len(m.reads) for m in msgs] == [1, 1, 0, 0, 0]  # no parse past the limit


def test_sampled_out_batch_reads_no_headers_and_records_nothing() -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.0)))
    tel = telemetry(tp)
    assert tel._fast is not None
    msgs = [Msg(headers_=parent(0xA1, 0xB1, "01")) for _ in range(3)]
    with tel.batch_process_span(msgs) as span:
        assert span is not None and not span.is_recording()
        assert trace.get_current_span() is span
        ctx = span.get_span_context()
        assert ctx.is_valid and not ctx.is_remote
        assert ctx.trace_flags == trace.TraceFlags(0x02)  # random trace id, not sampled
    assert exporter.get_finished_spans() == ()
    assert [m.reads for m in msgs] == [[], [], []]
    # negative control: the generic path (no fast sampler) builds the links, then drops
    slow = telemetry(tp)
    slow._fast = None
    with slow.batch_process_span(msgs) as span:
        assert span is not None and not span.is_recording()
    assert [len(m.reads) for m in msgs] == [1, 1, 1]


@pytest.mark.parametrize("sampled", [True, False])
def test_drop_root_decides_as_the_sdk(monkeypatch: pytest.MonkeyPatch, sampled: bool) -> None:
    """Same ids in: the fast decision and the dropped span are the SDK's."""
    ratio = TraceIdRatioBased(0.5)
    low = ratio.bound - 1 if sampled else ratio.bound + 1
    trace_id = (0x1234 << 64) | low
    span_id = 0x5566778899AABBCC
    monkeypatch.setattr(
        sampling, "_bits", lambda n: (trace_id << 64 | span_id) if n == 192 else span_id
    )
    tp, _ = provider(ParentBased(ratio))
    tel = telemetry(tp)
    assert tel._fast is not None
    decided = tel._fast.drop_root()

    class Preset:
        def generate_trace_id(self) -> int:
            return trace_id

        def generate_span_id(self) -> int:
            return span_id

        def is_trace_id_random(self) -> bool:
            return True

    sdk = (
        TracerProvider(
            sampler=ParentBased(ratio),
            id_generator=Preset(),  # type: ignore[arg-type]
            shutdown_on_exit=False,
        )
        .get_tracer("sdk")
        .start_span("x")
    )
    assert sdk.is_recording() is sampled
    if sampled:
        assert decided == trace_id
    else:
        assert isinstance(decided, trace.Span) and not decided.is_recording()
        assert decided.get_span_context() == sdk.get_span_context()


def test_under_baggage_the_generic_path_keeps_it() -> None:
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    tel = telemetry(tp)
    assert tel._fast is not None
    token = otel_context.attach(set_baggage("tenant", "7"))
    try:
        with tel.batch_process_span([Msg()]) as span:
            assert span is not None and not span.is_recording()
            assert get_baggage("tenant") == "7"  # the caller's baggage kept
    finally:
        otel_context.detach(token)


def test_failure_in_the_block_marks_the_span_and_is_reraised() -> None:
    tp, exporter = provider()
    tel = telemetry(tp)
    with (
        pytest.raises(ValueError, match="bad batch"),
        tel.batch_process_span([Msg(), Msg(offset_=1)]),
    ):
        raise ValueError("bad batch")
    (done,) = exporter.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert dict(done.attributes or {})[ERROR_TYPE] == "ValueError"
    assert [e.name for e in done.events] == ["exception"]


def _points(reader: InMemoryMetricReader, metric: str) -> list[tuple[dict[str, Any], Any]]:
    out: list[tuple[dict[str, Any], Any]] = []
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == metric:
                    for dp in m.data.data_points:
                        value = getattr(dp, "value", None)
                        out.append(
                            (dict(dp.attributes or {}), value if value is not None else dp.count)
                        )  # type: ignore[union-attr]
    return out


def test_metrics_count_every_message_and_one_duration_per_batch() -> None:
    reader = InMemoryMetricReader()
    tel = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]), client_id="w")
    with tel.batch_process_span([Msg(offset_=i) for i in range(4)], group="g"):
        pass
    with pytest.raises(KeyError), tel.batch_process_span([Msg(offset_=9)], group="g"):
        raise KeyError("x")
    consumed = _points(reader, MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
    assert [(a[MA.MESSAGING_DESTINATION_NAME], v) for a, v in consumed] == [("orders", 5)]
    durations = sorted(
        (a.get(ERROR_TYPE, ""), n) for a, n in _points(reader, MM.MESSAGING_PROCESS_DURATION)
    )
    assert durations == [("", 1), ("KeyError", 1)]


def test_several_topics_name_no_destination_and_count_per_topic() -> None:
    reader = InMemoryMetricReader()
    tp, exporter = provider()
    tel = Telemetry(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]))
    msgs = [Msg("a", 0), Msg("b", 0), Msg("a", 1)]
    with tel.batch_process_span(msgs):
        pass
    (done,) = exporter.get_finished_spans()
    assert done.name == "process"
    attrs = dict(done.attributes or {})
    assert MA.MESSAGING_DESTINATION_NAME not in attrs
    assert MA.MESSAGING_DESTINATION_PARTITION_ID not in attrs
    consumed = {
        a[MA.MESSAGING_DESTINATION_NAME]: v
        for a, v in _points(reader, MM.MESSAGING_CLIENT_CONSUMED_MESSAGES)
    }
    assert consumed == {"a": 2, "b": 1}
    # one topic, two partitions: the topic's name, no partition
    with tel.batch_process_span([Msg("a", 0), Msg("a", 1)]):
        pass
    second = exporter.get_finished_spans()[1]
    assert second.name == "process a"
    assert MA.MESSAGING_DESTINATION_PARTITION_ID not in dict(second.attributes or {})


def test_empty_batch_and_no_provider_give_no_span() -> None:
    tp, exporter = provider()
    with telemetry(tp).batch_process_span([]) as span:
        assert span is None
    with Telemetry(tracer_provider=trace.NoOpTracerProvider()).batch_process_span([Msg()]) as s:
        assert s is None
    assert exporter.get_finished_spans() == ()


# --- the direct traceparent write of a recorded PRODUCER span --------------------------------


class _B3Like:
    """A propagator of another format: never written directly."""

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        sc = trace.get_current_span(context).get_span_context()
        carrier["b3"] = f"{sc.trace_id:032x}-{sc.span_id:016x}"

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Context:
        return context or Context()

    @property
    def fields(self) -> set[str]:
        return {"b3"}


@pytest.mark.parametrize("headers", [None, [], {}], ids=["none", "empty-list", "empty-dict"])
@pytest.mark.parametrize("propagator", [W3C, DEFAULT_COMPOSITE], ids=["w3c", "composite"])
@pytest.mark.parametrize("flags", [0x01, 0x03])
def test_direct_write_is_what_the_propagator_injects(
    headers: Any, propagator: Any, flags: int
) -> None:
    sc = trace.SpanContext(
        0xABC, 0x1122334455667788, is_remote=False, trace_flags=trace.TraceFlags(flags)
    )
    direct = sampling.DirectW3C().write(sc, headers, propagator)
    generic = inject_headers(
        headers,
        context=trace.set_span_in_context(trace.NonRecordingSpan(sc)),
        propagator=propagator,
    )
    assert direct == generic
    assert isinstance(direct, list) and direct is not headers


def test_direct_write_leaves_other_cases_to_the_propagator() -> None:
    w3c = sampling.DirectW3C()
    sc = trace.SpanContext(0xABC, 0x1122, is_remote=False, trace_flags=trace.TraceFlags(1))
    assert w3c.write(sc, [("app", b"1")], W3C) is None  # caller headers: merged by the generic
    with_state = trace.SpanContext(
        0xABC,
        0x1122,
        is_remote=False,
        trace_flags=trace.TraceFlags(1),
        trace_state=trace.TraceState([("v", "1")]),
    )
    assert w3c.write(with_state, None, W3C) is None
    assert w3c.write(trace.INVALID_SPAN_CONTEXT, None, W3C) is None
    assert w3c.write(sc, None, _B3Like()) is None  # type: ignore[arg-type]
    token = otel_context.attach(set_baggage("tenant", "7"))
    try:  # baggage in the current context: the composite writes it too
        assert w3c.write(sc, None, DEFAULT_COMPOSITE) is None
        assert w3c.write(sc, None, W3C) is not None  # W3C alone never writes baggage
    finally:
        otel_context.detach(token)


@pytest.mark.parametrize("headers", [None, [("app", b"1")]], ids=["none", "caller-headers"])
def test_recorded_send_span_headers_equal_the_generic_paths(headers: Any) -> None:
    tp, exporter = provider()
    fast = telemetry(tp, propagator=DEFAULT_COMPOSITE)
    slow = telemetry(tp, propagator=DEFAULT_COMPOSITE)
    slow._w3c = PropagatorOnly()  # type: ignore[assignment]
    for tel in (fast, slow):
        out, token = tel.producer_send("orders", b"k", 10, headers, None)
        assert token is not None and token.span is not None
        sc = token.span.get_span_context()
        value = f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}".encode()
        assert out == [*(headers or []), ("traceparent", value)]
        tel.producer_delivered(token, None, None)
    assert len(exporter.get_finished_spans()) == 2
