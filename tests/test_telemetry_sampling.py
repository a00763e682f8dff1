"""The sampled-out fast path of Telemetry.producer_send (kresilient/telemetry/sampling.py).

With a ``TraceIdRatioBased`` or ``ParentBased(TraceIdRatioBased)`` sampler the producer takes
the SDK's sampling decision itself: a sampled-out message gets only the ``traceparent`` the SDK
would have injected (no span, no token), a sampled one the same span as before. These tests
compare it with the SDK's own behaviour (the generic path, or the SDK directly), in memory.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.baggage import set_baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.semconv._incubating.attributes import messaging_attributes as MA
from opentelemetry.semconv._incubating.metrics import messaging_metrics as MM
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from structlog.testing import capture_logs

from kresilient.telemetry import Telemetry, extract_context, sampling

W3C = TraceContextTextMapPropagator()
DEFAULT_COMPOSITE = CompositePropagator([W3C, W3CBaggagePropagator()])
TRACEPARENT = "traceparent"  # the W3C header name: a propagation format, not a semconv name
UNSAMPLED = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-02$")
MASK64 = (1 << 64) - 1


class _Counting(SpanProcessor):
    """Counts started/ended spans and keeps the ended ones (cheaper than an exporter)."""

    def __init__(self) -> None:
        self.started = 0
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Context | None = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


def provider(sampler: Sampler, **kw: Any) -> tuple[TracerProvider, InMemorySpanExporter]:
    tp = TracerProvider(sampler=sampler, shutdown_on_exit=False, **kw)
    exporter = InMemorySpanExporter()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def telemetry(tp: TracerProvider, *, propagator: Any = W3C, **kw: Any) -> Telemetry:
    return Telemetry(tracer_provider=tp, propagator=propagator, client_id="svc-1", **kw)


class PropagatorOnly:
    """Leaves every read and write of trace context to the propagator."""

    def read(self, *_: Any) -> None:
        return None

    def read_context(self, *_: Any) -> None:
        return None

    def write(self, *_: Any) -> None:
        return None


def generic(tel: Telemetry) -> Telemetry:
    """*tel* with the fast paths switched off (the behaviour before they existed)."""
    tel._fast = None
    tel._w3c = PropagatorOnly()  # type: ignore[assignment]
    return tel


def header(headers: Any, name: str = TRACEPARENT) -> str | None:
    found = [v for k, v in (headers or []) if k == name]
    return found[-1].decode() if found else None


def message(headers: Any, partition: int = 2, offset: int = 41) -> Any:
    return ck.Message(
        topic="orders",
        partition=partition,
        offset=offset,
        key=b"order-7",
        value=b"x" * 12,
        headers=headers,
    )


@pytest.fixture(name="attached")
def _attached() -> Iterator[list[Any]]:
    """Contexts a test attaches, detached afterwards (in reverse order)."""
    tokens: list[Any] = []
    yield tokens
    for token in reversed(tokens):
        otel_context.detach(token)


def remote_parent(trace_id: int, flags: str, tracestate: str | None = None) -> Context:
    carrier = {TRACEPARENT: f"00-{trace_id:032x}-{0x1122334455667788:016x}-{flags}"}
    if tracestate:
        carrier["tracestate"] = tracestate
    return W3C.extract(carrier)


# --- the sampled fraction ------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampler",
    [ParentBased(TraceIdRatioBased(0.05)), TraceIdRatioBased(0.05)],
    ids=["parent-based", "ratio"],
)
def test_recorded_fraction_is_the_rate_and_headers_agree_with_the_spans(sampler: Sampler) -> None:
    tp = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    counting = _Counting()
    tp.add_span_processor(counting)
    tel = telemetry(tp)
    assert tel._fast is not None
    n, rate = 20_000, 0.05
    sampled_ids: list[int] = []
    unsampled_ids: set[int] = set()
    for i in range(n):
        out, token = tel.producer_send("orders", b"k", 12, None, None)
        value = header(out)
        assert value is not None
        trace_id, flags = int(value[3:35], 16), int(value[-2:], 16)
        if flags & 1:
            sampled_ids.append(trace_id)
            assert token is not None and token.span is not None
            assert token.span.is_recording()
        else:
            assert UNSAMPLED.match(value), value
            assert token is None  # nothing kept alive while the message is in flight
            unsampled_ids.add(trace_id)
        tel.producer_delivered(token, None, message(out, offset=i))
    expected, sigma = n * rate, math.sqrt(n * rate * (1 - rate))
    assert abs(len(counting.ended) - expected) < 5 * sigma, len(counting.ended)
    assert counting.started == len(counting.ended) == len(sampled_ids)
    bound = TraceIdRatioBased(rate).bound
    # each recorded span carries the trace id its header announced, and the SDK's rule holds
    assert [s.context.trace_id for s in counting.ended] == sampled_ids
    assert all(t & MASK64 < bound for t in sampled_ids)
    assert all(t & MASK64 >= bound for t in unsampled_ids)
    assert len(unsampled_ids) == n - len(sampled_ids)  # fresh random trace ids


# --- sampled-out messages ------------------------------------------------------------------


def test_sampled_out_message_carries_a_not_sampled_traceparent_consumers_follow() -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.0)))
    producer = telemetry(tp)
    consumer = telemetry(tp, consumer_group="grp")
    out, token = producer.producer_send("orders", b"k", 12, None, None)
    assert token is None
    value = header(out)
    assert value is not None and UNSAMPLED.match(value), value
    producer.producer_delivered(token, None, message(out))
    with consumer.process_span(message(out)) as span:
        assert span is not None and not span.is_recording()
        ctx = span.get_span_context()
        assert f"{ctx.trace_id:032x}" == value[3:35]  # same trace, not orphaned
    assert exporter.get_finished_spans() == ()


def test_sampled_out_header_is_what_the_sdk_would_inject() -> None:
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    fast_value = header(telemetry(tp).producer_send("orders", None, 1, None, None)[0])
    out, token = generic(telemetry(tp)).producer_send("orders", None, 1, None, None)
    assert token is not None and token.span is not None and not token.span.is_recording()
    slow_value = header(out)
    assert fast_value is not None and slow_value is not None
    assert UNSAMPLED.match(fast_value) and UNSAMPLED.match(slow_value)
    assert fast_value[-3:] == slow_value[-3:]  # same flags: random-trace-id, not sampled


def test_callers_headers_are_kept_and_an_old_traceparent_replaced() -> None:
    tp, _ = provider(TraceIdRatioBased(0.0))
    tel = telemetry(tp)
    mine = [("id", b"7"), ("TraceParent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")]
    out, token = tel.producer_send("orders", None, 1, mine, None)
    assert token is None
    assert mine[0] == ("id", b"7") and len(mine) == 2  # never modified
    assert out is not None and [k for k, _ in out] == ["id", TRACEPARENT]
    out2, _ = tel.producer_send("orders", None, 1, {"id": b"8"}, None)
    assert out2 is not None and out2[0] == ("id", b"8") and header(out2) is not None


def test_metrics_still_count_sampled_out_messages() -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.0)))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    try:
        tel = telemetry(tp, meter_provider=mp)
        for offset in range(3):
            out, token = tel.producer_send("orders", None, 1, None, None)
            assert token is not None and token.span is None
            tel.producer_delivered(token, None, message(out, offset=offset))
        data = reader.get_metrics_data()
        assert data is not None
        counts = [
            dp.value
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == MM.MESSAGING_CLIENT_SENT_MESSAGES
            for dp in m.data.data_points
        ]
        assert counts == [3]
        assert exporter.get_finished_spans() == ()
    finally:
        mp.shutdown()


def test_baggage_still_travels_with_the_default_composite_propagator(attached: list[Any]) -> None:
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    attached.append(otel_context.attach(set_baggage("tenant", "acme")))
    fast_out, token = telemetry(tp, propagator=DEFAULT_COMPOSITE).producer_send(
        "orders", None, 1, None, None
    )
    assert token is None
    slow_out, _ = generic(telemetry(tp, propagator=DEFAULT_COMPOSITE)).producer_send(
        "orders", None, 1, None, None
    )
    assert header(fast_out, "baggage") == header(slow_out, "baggage") == "tenant=acme"
    assert [k for k, _ in fast_out or []] == [k for k, _ in slow_out or []]


# --- sampled messages: the same span as before -----------------------------------------------


def _span_view(span: ReadableSpan) -> dict[str, Any]:
    return {
        "name": span.name,
        "kind": span.kind,
        "attributes": dict(span.attributes or {}),
        "parent": span.parent,
        "status": span.status.status_code,
        "events": list(span.events),
        "links": list(span.links),
        "resource": span.resource,
        "scope": span.instrumentation_scope,
        "sampled": span.context.trace_flags.sampled,
        "flags": int(span.context.trace_flags),
        "trace_state": span.context.trace_state,
    }


def test_sampled_span_is_the_generic_paths_span(monkeypatch: pytest.MonkeyPatch) -> None:
    roots: list[int] = []
    real = sampling.FastSampler.start_root

    def spy(self: Any, trace_id: int, *args: Any) -> Any:
        roots.append(trace_id)
        return real(self, trace_id, *args)

    monkeypatch.setattr(sampling.FastSampler, "start_root", spy)
    views = []
    for make in (telemetry, lambda tp: generic(telemetry(tp))):
        tp, exporter = provider(ParentBased(TraceIdRatioBased(1.0)))
        tel = make(tp)
        out, token = tel.producer_send("orders", b"order-7", 12, None, None)
        assert exporter.get_finished_spans() == ()  # ends at the delivery report, not before
        tel.producer_delivered(token, None, message(out, partition=2, offset=41))
        (span,) = exporter.get_finished_spans()
        assert span.end_time is not None
        assert header(out) == (f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-03")
        views.append(_span_view(span))
    assert len(roots) == 1  # the first arm went through the fast path's sampled branch
    fast, slow = views
    assert fast == slow
    assert fast["kind"] is SpanKind.PRODUCER and fast["parent"] is None
    assert fast["attributes"][MA.MESSAGING_KAFKA_OFFSET] == 41
    assert fast["attributes"][MA.MESSAGING_DESTINATION_PARTITION_ID] == "2"


def test_sampled_failed_delivery_is_marked_like_before() -> None:
    err = ck.KafkaError(ck.KafkaError._MSG_TIMED_OUT)
    views = []
    for fast in (True, False):
        tp, exporter = provider(TraceIdRatioBased(1.0))
        tel = telemetry(tp) if fast else generic(telemetry(tp))
        out, token = tel.producer_send("orders", None, 12, None, 1)
        tel.producer_delivered(token, err, message(out, partition=1, offset=-1))
        (span,) = exporter.get_finished_spans()
        views.append(_span_view(span))
    assert views[0] == views[1]
    assert views[0]["status"].name == "ERROR"


# --- a parent in the current context ---------------------------------------------------------


def test_not_sampled_parent_is_followed_without_a_span(attached: list[Any]) -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(1.0)))
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    attached.append(otel_context.attach(remote_parent(trace_id, "02", "vendor=x")))
    fast_out, token = telemetry(tp).producer_send("orders", None, 1, None, None)
    assert token is None
    slow_out, slow_token = generic(telemetry(tp)).producer_send("orders", None, 1, None, None)
    assert slow_token is not None and slow_token.span is not None
    assert not slow_token.span.is_recording()
    fast_tp, slow_tp = header(fast_out), header(slow_out)
    assert fast_tp is not None and slow_tp is not None
    assert fast_tp[:36] == slow_tp[:36] == f"00-{trace_id:032x}-"  # the parent's trace
    assert fast_tp[-3:] == slow_tp[-3:] == "-02"
    assert fast_tp[36:52] != "1122334455667788"  # a new span id, not the parent's
    assert header(fast_out, "tracestate") == header(slow_out, "tracestate") == "vendor=x"
    assert exporter.get_finished_spans() == ()


def test_sampled_parent_gets_a_recorded_child_span(attached: list[Any]) -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.0)))
    trace_id = 0x0AF7651916CD43DD8448EB211C80319C
    attached.append(otel_context.attach(remote_parent(trace_id, "01")))
    out, token = telemetry(tp).producer_send("orders", None, 1, None, None)
    assert token is not None and token.span is not None and token.span.is_recording()
    token.span.end()
    (span,) = exporter.get_finished_spans()
    assert span.context.trace_id == trace_id
    assert span.parent is not None and span.parent.span_id == 0x1122334455667788
    assert header(out) == f"00-{trace_id:032x}-{span.context.span_id:016x}-01"


@pytest.mark.parametrize("low_bits_sampled", [True, False])
def test_plain_ratio_sampler_decides_on_the_parents_trace_id(
    attached: list[Any], low_bits_sampled: bool
) -> None:
    sampler = TraceIdRatioBased(0.5)
    tp, exporter = provider(sampler)
    low = sampler.bound - 1 if low_bits_sampled else sampler.bound
    trace_id = (0x1234 << 64) | low
    attached.append(otel_context.attach(remote_parent(trace_id, "01")))  # flag ignored
    out, token = telemetry(tp).producer_send("orders", None, 1, None, None)
    if token is not None and token.span is not None:
        token.span.end()
    value = header(out)
    assert value is not None and value.startswith(f"00-{trace_id:032x}-")
    assert len(exporter.get_finished_spans()) == (1 if low_bits_sampled else 0)
    assert value.endswith("-01" if low_bits_sampled else "-00")
    assert (token is None) is (not low_bits_sampled)


def test_a_valid_parent_made_by_this_provider_is_followed(attached: list[Any]) -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.0)))
    tracer = tp.get_tracer("test")
    with tracer.start_as_current_span("handler") as parent:  # root at rate 0: not sampled
        assert not parent.is_recording()
        out, token = telemetry(tp).producer_send("orders", None, 1, None, None)
    assert token is None
    value = header(out)
    assert value is not None
    assert int(value[3:35], 16) == parent.get_span_context().trace_id
    assert exporter.get_finished_spans() == ()


# --- where the fast path does not apply -----------------------------------------------------


class _CountingSampler(Sampler):
    def __init__(self) -> None:
        self.calls = 0
        self._inner = TraceIdRatioBased(0.5)

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        self.calls += 1
        return self._inner.should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "counting"


class _Subclass(TraceIdRatioBased):
    pass


class _Ids(RandomIdGenerator):
    pass


@pytest.mark.parametrize(
    ("sampler", "kw"),
    [
        (ALWAYS_ON, {}),
        (ALWAYS_OFF, {}),
        (ParentBased(ALWAYS_ON), {}),
        (_Subclass(0.01), {}),
        (ParentBased(TraceIdRatioBased(0.01), remote_parent_not_sampled=ALWAYS_ON), {}),
        (ParentBased(TraceIdRatioBased(0.01), local_parent_sampled=ALWAYS_OFF), {}),
        (TraceIdRatioBased(0.01), {"id_generator": _Ids()}),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, dict) else ",".join(v),
)
def test_other_samplers_and_id_generators_keep_the_generic_path(
    sampler: Sampler, kw: dict[str, Any]
) -> None:
    tp, _ = provider(sampler, **kw)
    tel = telemetry(tp)
    assert tel._fast is None
    _, token = tel.producer_send("orders", None, 1, None, None)
    assert token is not None and token.span is not None  # the SDK made (or dropped) the span


def test_a_custom_sampler_is_asked_for_every_message() -> None:
    sampler = _CountingSampler()
    tp, exporter = provider(sampler)
    tel = telemetry(tp)
    for offset in range(50):
        out, token = tel.producer_send("orders", None, 1, None, None)
        tel.producer_delivered(token, None, message(out, offset=offset))
    assert sampler.calls == 50
    assert 0 < len(exporter.get_finished_spans()) < 50


class _OtherPropagator(TraceContextTextMapPropagator):
    """Not the W3C class itself: the fast path cannot know what it writes."""


@pytest.mark.parametrize(
    "propagator",
    [
        _OtherPropagator(),
        CompositePropagator([W3C, _OtherPropagator()]),
        CompositePropagator([W3CBaggagePropagator()]),
    ],
    ids=["subclass", "composite-with-unknown", "baggage-only"],
)
def test_other_propagators_keep_the_generic_path(propagator: Any) -> None:
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    _, token = telemetry(tp, propagator=propagator).producer_send("orders", None, 1, None, None)
    assert token is not None and token.span is not None and not token.span.is_recording()


def test_the_global_propagator_is_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry import propagate

    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    tel = telemetry(tp, propagator=None)
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", DEFAULT_COMPOSITE)
    out, token = tel.producer_send("orders", None, 1, None, None)
    assert token is None and header(out) is not None
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", _OtherPropagator())
    _, token = tel.producer_send("orders", None, 1, None, None)
    assert token is not None


def test_late_global_provider_gets_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.util._once import Once

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)
    tel = Telemetry(propagator=W3C)
    assert tel.producer_send("orders", None, 1, None, None) == (None, None)
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    trace.set_tracer_provider(tp)
    out, token = tel.producer_send("orders", None, 1, None, None)
    assert token is None
    value = header(out)
    assert value is not None and UNSAMPLED.match(value)
    assert trace.get_current_span(extract_context(out, propagator=W3C)).get_span_context().is_valid


def test_a_span_processor_producing_from_on_start_does_not_deadlock() -> None:
    tp, exporter = provider(TraceIdRatioBased(1.0))
    tel = telemetry(tp)
    inner: list[Any] = []

    class _Reentrant(SpanProcessor):
        def on_start(self, span: Any, parent_context: Context | None = None) -> None:
            if not inner:
                inner.append(None)
                inner.append(tel.producer_send("audit", None, 1, None, None))

    tp.add_span_processor(_Reentrant())
    out, token = tel.producer_send("orders", None, 1, None, None)
    inner_out, inner_token = inner[1]
    for headers, tok in ((out, token), (inner_out, inner_token)):
        assert tok is not None and tok.span is not None
        tel.producer_delivered(tok, None, message(headers))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"send orders", "send audit"}
    for name, headers in (("send orders", out), ("send audit", inner_out)):
        ctx = spans[name].context
        assert header(headers) == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-03"
    assert spans["send orders"].context.trace_id != spans["send audit"].context.trace_id


# --- consumer side: process_span under a sampled-out producer (issue 18) ------------------


def _consumed(flags: str, tracestate: str | None = None, trace_id: int = 0xABC) -> Any:
    value = f"00-{trace_id:032x}-{0x1122334455667788:016x}-{flags}".encode()
    headers = [(TRACEPARENT, value)]
    if tracestate:
        headers.append(("tracestate", tracestate.encode()))
    return message(headers)


@pytest.mark.parametrize("flags", ["00", "02"])
def test_process_span_under_a_not_sampled_parent_is_the_sdks_non_recording_child(
    flags: str,
) -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.01)))
    counting = _Counting()
    tp.add_span_processor(counting)
    fast, slow = telemetry(tp), generic(telemetry(tp))
    assert fast._fast is not None  # the fast path is on for this sampler
    msg = _consumed(flags, tracestate="vendor=abc")
    seen = {}
    for name, tel in (("fast", fast), ("sdk", slow)):
        with tel.process_span(msg) as span:
            assert span is not None
            current = trace.get_current_span().get_span_context()
            seen[name] = (span.is_recording(), current)
    (fast_rec, f), (sdk_rec, g) = seen["fast"], seen["sdk"]
    assert not fast_rec and not sdk_rec
    # the same child the SDK makes: parent's trace id, state and flags, a new local span id
    assert (f.trace_id, f.trace_flags, f.trace_state, f.is_remote) == (
        g.trace_id,
        g.trace_flags,
        g.trace_state,
        g.is_remote,
    )
    assert f.trace_id == 0xABC and f.span_id not in (0, 0x1122334455667788)
    assert f.trace_state.get("vendor") == "abc"
    assert counting.started == 0 and exporter.get_finished_spans() == ()


def _consumed_counts(reader: InMemoryMetricReader) -> list[Any]:
    data = reader.get_metrics_data()
    return [
        (dp.value, dict(dp.attributes or {}).get(MA.MESSAGING_DESTINATION_NAME))
        for rm in (data.resource_metrics if data is not None else ())
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == MM.MESSAGING_CLIENT_CONSUMED_MESSAGES
        for dp in m.data.data_points
    ]


def test_sampled_out_process_span_without_metrics_is_the_full_scopes_behaviour(
    attached: list[Any],
) -> None:
    """With no meter provider, a sampled-out message takes the light scope (no topic, timer or
    metric work): the handler still sees the non-recording child, ``set_error`` and a dead
    letter inside it mark this message's scope (not an outer one), an exception escapes
    unchanged, and every context is restored after it, nested or not."""
    outer = otel_context.get_current()
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.01)))
    tel = telemetry(tp)
    full = telemetry(tp, meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]))
    light, heavy = tel.process_span(_consumed("00")), full.process_span(_consumed("00"))
    # the negative control: with metrics the full scope runs (it counts the message)
    assert type(light).__name__ == "_DroppedScope" and type(heavy).__name__ == "_ProcessScope"
    with pytest.raises(KeyError, match="boom"), light as span:
        assert span is not None and not span.is_recording()
        seen = trace.get_current_span().get_span_context()
        assert seen == span.get_span_context() and seen.trace_id == 0xABC
        with tel.process_span(_consumed("00", trace_id=0xDEF)) as inner:
            assert inner is not None and inner is not span
            assert trace.get_current_span() is inner
            tel.set_error(ValueError("inner only"))
        assert trace.get_current_span() is span  # the outer scope is current again
        with capture_logs() as logs, tel.dead_letter_span("orders.dlq", reason=RuntimeError("x")):
            pass
        raise KeyError("boom")
    # set_error marked the inner scope only; the dead letter marked this one (first failure)
    assert light.error_type == "RuntimeError"  # type: ignore[attr-defined]
    assert otel_context.get_current() == outer
    assert trace.get_current_span() is trace.INVALID_SPAN
    # the dead letter read its source topic and reason from this message's scope
    (event,) = [e for e in logs if e["event"] == "kafka_message_dead_lettered"]
    assert (event["topic"], event["reason"]) == ("orders", "RuntimeError")
    assert exporter.get_finished_spans() == ()  # children of a sampled-out parent: dropped


def test_sampled_out_light_scopes_in_concurrent_tasks_keep_their_own_context() -> None:
    """The asyncio consumer holds a scope across ``await``: two tasks interleaving inside
    light scopes each see their own parent's child, and leave the context as they found it."""
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.01)))
    tel = telemetry(tp)
    assert type(tel.process_span(_consumed("00"))).__name__ == "_DroppedScope"
    seen: dict[int, list[int]] = {}

    async def handle(trace_id: int, gate: asyncio.Event, other: asyncio.Event) -> None:
        with tel.process_span(_consumed("00", trace_id=trace_id)):
            seen[trace_id] = [trace.get_current_span().get_span_context().trace_id]
            gate.set()
            await other.wait()  # the other task enters and runs its scope meanwhile
            await asyncio.sleep(0)
            seen[trace_id].append(trace.get_current_span().get_span_context().trace_id)
        seen[trace_id].append(trace.get_current_span().get_span_context().trace_id)

    async def main() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(handle(0xA1, a, b), handle(0xB2, b, a))

    asyncio.run(main())
    assert seen == {0xA1: [0xA1, 0xA1, 0], 0xB2: [0xB2, 0xB2, 0]}


def test_sampled_out_process_span_still_counts_when_metrics_are_on() -> None:
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    try:
        tp, exporter = provider(ParentBased(TraceIdRatioBased(0.01)))
        tel = telemetry(tp, meter_provider=mp)
        for flags in ("00", "02", "00"):
            with tel.process_span(_consumed(flags)) as span:
                assert span is not None and not span.is_recording()
        assert _consumed_counts(reader) == [(3, "orders")]
        assert exporter.get_finished_spans() == ()
    finally:
        mp.shutdown()


def test_process_span_under_a_sampled_parent_is_still_recorded() -> None:
    tp, exporter = provider(ParentBased(TraceIdRatioBased(0.01)))
    tel = telemetry(tp)
    assert tel._fast is not None
    with tel.process_span(_consumed("01")) as span:
        assert span is not None and span.is_recording()
    (ended,) = exporter.get_finished_spans()
    assert ended.kind is SpanKind.CONSUMER
    assert ended.parent is not None and ended.parent.trace_id == 0xABC
    assert ended.attributes is not None
    assert ended.attributes[MA.MESSAGING_KAFKA_OFFSET] == 41  # attributes built as before


def test_process_span_plain_ratio_sampler_decides_on_the_parents_trace_id() -> None:
    tp, exporter = provider(TraceIdRatioBased(0.5))
    tel = telemetry(tp)
    assert tel._fast is not None
    bound = TraceIdRatioBased(0.5).bound
    kept, dropped = bound - 1, bound + 1  # the low 64 bits decide, as in the SDK
    for trace_id in (kept, dropped):
        with tel.process_span(_consumed("00", trace_id=trace_id)):
            pass
    assert [s.context.trace_id for s in exporter.get_finished_spans()] == [kept]


def test_process_span_link_mode_and_other_samplers_keep_the_generic_path() -> None:
    calls: list[str] = []

    class Asking(Sampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            calls.append("asked")
            return ALWAYS_OFF.should_sample(*args, **kwargs)

        def get_description(self) -> str:
            return "asking"

    tp, _ = provider(ParentBased(TraceIdRatioBased(0.01), remote_parent_not_sampled=Asking()))
    tel = telemetry(tp)
    assert tel._fast is None  # negative control: a custom delegate is asked every time
    with tel.process_span(_consumed("00")):
        pass
    assert calls == ["asked"]
    tp2, _ = provider(ParentBased(TraceIdRatioBased(0.01)))
    linked = telemetry(tp2, link_mode="link")
    assert linked._fast is not None
    with linked.process_span(_consumed("00")) as span:
        # link mode: the span is a root of the consumer's own trace, decided by the SDK
        assert span is not None
        assert trace.get_current_span().get_span_context().trace_id != 0xABC


# --- consumer side: the traceparent read without the propagator -----------------------------

_PARENT = "00-00000000000000000000000000000abc-1122334455667788-{flags}"

# (name, headers): every form the header-reading path must treat as the propagator does; the
# canonical not-sampled ones take the direct read, the others the propagator.
HEADER_FORMS: list[tuple[str, Any]] = [
    ("not-sampled", [(TRACEPARENT, _PARENT.format(flags="00").encode())]),
    ("not-sampled-random", [(TRACEPARENT, _PARENT.format(flags="02").encode())]),
    ("sampled", [(TRACEPARENT, _PARENT.format(flags="01").encode())]),
    ("sampled-random", [(TRACEPARENT, _PARENT.format(flags="03").encode())]),
    ("unknown-flag-bits", [(TRACEPARENT, _PARENT.format(flags="fc").encode())]),
    (
        "with-tracestate",
        [(TRACEPARENT, _PARENT.format(flags="00").encode()), ("tracestate", b"vendor=abc")],
    ),
    (
        "with-baggage",
        [(TRACEPARENT, _PARENT.format(flags="00").encode()), ("baggage", b"tenant=7")],
    ),
    (
        "other-headers-kept-out",
        [("app", b"1"), (TRACEPARENT, _PARENT.format(flags="00").encode()), ("Content-Type", b"x")],
    ),
    (
        "repeated-last-wins",
        [
            (TRACEPARENT, _PARENT.format(flags="01").encode()),
            (TRACEPARENT, _PARENT.format(flags="00").encode()),
        ],
    ),
    (
        "repeated-last-sampled",
        [
            (TRACEPARENT, _PARENT.format(flags="00").encode()),
            (TRACEPARENT, _PARENT.format(flags="01").encode()),
        ],
    ),
    ("mixed-case-key", [("TraceParent", _PARENT.format(flags="00").encode())]),
    (
        "mixed-case-key-last",
        [
            (TRACEPARENT, _PARENT.format(flags="01").encode()),
            ("TRACEPARENT", _PARENT.format(flags="00").encode()),
        ],
    ),
    ("upper-case-hex", [(TRACEPARENT, _PARENT.format(flags="00").upper().encode())]),
    ("surrounding-space", [(TRACEPARENT, b" " + _PARENT.format(flags="00").encode() + b" ")]),
    (
        "version-01-extra",
        [(TRACEPARENT, _PARENT.format(flags="00").replace("00-", "01-", 1).encode() + b"-extra")],
    ),
    ("version-00-extra", [(TRACEPARENT, _PARENT.format(flags="00").encode() + b"-extra")]),
    ("version-ff", [(TRACEPARENT, _PARENT.format(flags="00").replace("00-", "ff-", 1).encode())]),
    ("zero-trace-id", [(TRACEPARENT, b"00-" + b"0" * 32 + b"-1122334455667788-00")]),
    (
        "zero-span-id",
        [(TRACEPARENT, _PARENT.format(flags="00")[:36].encode() + b"0" * 16 + b"-00")],
    ),
    ("str-value", [(TRACEPARENT, _PARENT.format(flags="00"))]),
    ("none-value", [(TRACEPARENT, None)]),
    ("bytes-key", [(b"traceparent", _PARENT.format(flags="01").encode())]),
    ("truncated", [(TRACEPARENT, _PARENT.format(flags="00").encode()[:-1])]),
    ("not-utf8", [(TRACEPARENT, b"\xff" * 55)]),
    ("dict-headers", {TRACEPARENT: _PARENT.format(flags="00").encode()}),
]


def _counting_composite() -> tuple[CompositePropagator, list[int]]:
    """The SDK's default composite whose W3C member counts ``extract`` calls (an instance
    attribute: the member's type, which the fast path checks, stays the SDK's)."""
    w3c = TraceContextTextMapPropagator()
    calls: list[int] = []
    real = w3c.extract

    def extract(*args: Any, **kwargs: Any) -> Context:
        calls.append(1)
        return real(*args, **kwargs)

    w3c.extract = extract  # type: ignore[method-assign]
    return CompositePropagator([w3c, W3CBaggagePropagator()]), calls


def _inside(tel: Telemetry, headers: Any) -> tuple[Any, ...]:
    """What a handler sees inside process_span: the span's context and recording state, and
    the current context's contents (span replaced by its context, baggage as a dict)."""
    with tel.process_span(message(headers)) as span:
        current = otel_context.get_current()
        seen = trace.get_current_span().get_span_context()
        assert span is None or span.get_span_context() == seen
        others = {k: v for k, v in current.items() if not isinstance(v, trace.Span)}
        return (
            span is not None and span.is_recording(),
            seen.trace_id == 0xABC,
            seen.trace_flags,
            seen.trace_state,
            seen.is_remote,
            seen.is_valid,
            seen.span_id in (0, 0x1122334455667788),
            sorted(map(str, others.values())),
        )


@pytest.mark.parametrize("outer_baggage", [False, True], ids=["bare", "outer-baggage"])
@pytest.mark.parametrize(("form", "headers"), HEADER_FORMS, ids=[f for f, _ in HEADER_FORMS])
def test_header_read_gives_what_the_propagator_gives(
    form: str, headers: Any, outer_baggage: bool, attached: list[Any]
) -> None:
    if outer_baggage:  # the handler's caller had baggage current: extract() starts afresh
        attached.append(otel_context.attach(set_baggage("outer", "1")))
    # rate 0: a root span (a header the propagator refuses) is never sampled, so both paths'
    # roots compare; a parent's sampled flag still decides for its child
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    fast = telemetry(tp, propagator=DEFAULT_COMPOSITE)
    slow = generic(telemetry(tp, propagator=DEFAULT_COMPOSITE))
    assert fast._fast is not None
    for _ in range(3):  # span ids are random: compare the shape, thrice
        assert _inside(fast, headers) == _inside(slow, headers), form


DIRECT = {
    "not-sampled",
    "not-sampled-random",
    "other-headers-kept-out",
    "repeated-last-wins",
    "mixed-case-key",
    "mixed-case-key-last",
    "unknown-flag-bits",
}


@pytest.mark.parametrize(("form", "headers"), HEADER_FORMS, ids=[f for f, _ in HEADER_FORMS])
def test_only_canonical_not_sampled_parents_skip_the_propagator(
    form: str, headers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The direct read is taken exactly for the canonical not-sampled forms, and then the
    propagator is not called; anything else (tracestate, baggage, another spelling, a sampled
    parent) goes through the propagator. ``unknown-flag-bits`` (fc: sampled bit clear) is a
    not-sampled parent."""
    direct: list[bool] = []
    real = sampling.FastSampler.drop_from_headers

    def spy(self: Any, *args: Any) -> Any:
        got = real(self, *args)
        direct.append(got is not None)
        return got

    monkeypatch.setattr(sampling.FastSampler, "drop_from_headers", spy)
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.01)))
    prop, extracts = _counting_composite()
    tel = telemetry(tp, propagator=prop)
    assert tel._fast is not None
    _inside(tel, headers)
    assert direct == [form in DIRECT], form
    if form in DIRECT:
        assert extracts == [], form


def test_header_read_is_off_where_the_fast_path_is() -> None:
    """Negative controls: a plain ratio sampler decides on the parent's trace id (kept ->
    recorded), and link mode never parents to the header."""
    tp, exporter = provider(TraceIdRatioBased(0.5))
    tel = telemetry(tp, propagator=DEFAULT_COMPOSITE)
    bound = TraceIdRatioBased(0.5).bound
    for trace_id in (bound - 1, bound + 1):
        value = f"00-{trace_id:032x}-1122334455667788-00".encode()
        with tel.process_span(message([(TRACEPARENT, value)])):
            pass
    assert [s.context.trace_id for s in exporter.get_finished_spans()] == [bound - 1]
    prop, extracts = _counting_composite()
    linked = telemetry(
        provider(ParentBased(TraceIdRatioBased(0.01)))[0], propagator=prop, link_mode="link"
    )
    inside = _inside(linked, HEADER_FORMS[0][1])
    assert inside[1] is False  # a root of the consumer's own trace, not the header's child
    assert extracts == []  # the link's context: the direct read (DirectW3C), as the propagator


def test_baggage_before_trace_context_keeps_the_generic_path(attached: list[Any]) -> None:
    """A composite with W3C baggage first extracts from the current context (the baggage
    propagator's extract(context=None) starts there): the caller's baggage reaches the handler.
    The direct read starts from an empty context, so such a composite must not take it."""
    reverse = CompositePropagator([W3CBaggagePropagator(), TraceContextTextMapPropagator()])
    attached.append(otel_context.attach(set_baggage("outer", "1")))
    tp, _ = provider(ParentBased(TraceIdRatioBased(0.0)))
    fast = telemetry(tp, propagator=reverse)
    slow = generic(telemetry(tp, propagator=reverse))
    headers = HEADER_FORMS[0][1]
    assert _inside(fast, headers) == _inside(slow, headers)
    assert _inside(slow, headers)[-1] == ["{'outer': '1'}"]  # control: the generic path keeps it
    # the SDK's default order (trace context first) starts afresh, and takes the direct read
    assert _inside(telemetry(tp, propagator=DEFAULT_COMPOSITE), headers)[-1] == []
