"""OpenTelemetry spans and metrics for Kafka clients, on the current messaging conventions.

One :class:`Telemetry` object per client. The producer and consumer call it on their hot paths:

Producer (one PRODUCER span per message that ends at the *delivery report*, not at enqueue)::

    headers, token = tel.producer_send(topic, key, len(value), headers, partition)
    producer.produce(topic, value, key, headers=headers, on_delivery=...)
    # in the delivery callback:
    tel.producer_delivered(token, err, msg, classification)

Consumer (one CONSUMER span per message, parented to / linked with the producer's context)::

    with tel.process_span(msg) as span:
        handle(msg)                         # retries: tel.retry_event(span, attempt, exc)
        with tel.dead_letter_span(dlq_topic, source=msg, reason=exc):
            dlq_producer.produce(dlq_topic, ..., headers=tel.inject_headers(dlq_headers))
    tel.record_commit(offsets)

Cost: with only ``opentelemetry-api`` installed (or no provider configured) every call returns
after a couple of attribute loads, no span or attribute dict is built. A global provider set
*after* the client was created is picked up on the next call. Sampling is respected: a sampled-out
span is never recorded, but its context is still injected so downstream services agree. With a
``TraceIdRatioBased`` or ``ParentBased(TraceIdRatioBased)`` sampler the producer takes the
sampler's decision itself (same rule, same trace ids): a sampled-out message costs a random
draw and a ``traceparent`` header, no SDK span (:mod:`kresilient.telemetry.sampling`).

Attribute/metric names: :mod:`kresilient.telemetry.names` (checked against the
``opentelemetry-semantic-conventions`` package by the tests).

Failures: telemetry never changes what happens to a message. Every call into the SDK on the
message path (span start/end and their processors, propagators, meters) is guarded: an error is
counted (:attr:`Telemetry.failures`), logged rate-limited as ``kafka_telemetry_failed`` and the
message goes on as if telemetry were off for that step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal, cast

import structlog
from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind

from kresilient.redaction import Redactor, redact_text
from kresilient.telemetry import names as N
from kresilient.telemetry._log import add_trace_context, production_config, trace_fields
from kresilient.telemetry._propagation import (
    NO_PROPAGATION,
    Headers,
    HeaderValue,
    MessageLike,
    extract_context,
    inject_headers,
)
from kresilient.telemetry._scope import _CURRENT, _NULL_SCOPE, _Bases, _SendToken
from kresilient.telemetry._util import (
    Redact,
    _call,
    _category,
    _config_error,
    _error_name,
    _exception_type,
    _global_meter_provider_is_set,
    _global_tracer_provider_is_set,
    _Guard,
    _Instruments,
    _is_proxy_meter_provider,
    _is_proxy_tracer_provider,
    _key_text,
    _LocalCounter,
    _make_instruments,
    _make_tracer,
    _mark_error,
    _offset_item,
    _record_exception,
    _safe_int,
    _short,
    _state_name,
    _str_or_none,
)
from kresilient.telemetry.sampling import (
    DirectW3C,
    FastSampler,
    fast_sampler_for,
    runtime_context_var,
)

__all__ = [
    "NO_PROPAGATION",
    "Headers",
    "MessageLike",
    "Telemetry",
    "add_trace_context",
    "extract_context",
    "inject_headers",
    "production_config",
    "trace_fields",
]

# where attach/detach end (the default runtime context), set and reset directly by the
# process scope of a sampled-out message; None: attach/detach themselves
_CONTEXT_VAR = runtime_context_var()


class _MetricSet:
    """One client's metric attributes for (topic base, partition, error type), and the shared
    counter cell they count in (resolved on first count; the client's cache owns it)."""

    __slots__ = ("attrs", "cell", "counter")

    def __init__(self, attrs: dict[str, Any]) -> None:
        self.attrs = attrs
        self.counter: _LocalCounter | None = None
        self.cell: list[Any] | None = None

    def count(self, counter: _LocalCounter, n: int = 1) -> None:
        cell = self.cell
        if cell is None or self.counter is not counter:
            cell = self.cell = counter.cell(self.attrs)
            self.counter = counter
        counter.add_to(cell, n)


def _header_list(headers: Headers) -> list[tuple[str, HeaderValue]]:
    """*headers* as a new list, unchanged (what a failed injection sends)."""
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers)


class Telemetry:
    """Spans, metrics and notable-event logs for one Kafka client.

    Args:
        tracer_provider: default: the global one (also when it is set after construction).
        meter_provider: default: the global one (same).
        propagator: default: the global text-map propagator (W3C ``traceparent`` by default).
        client_id: ``messaging.client.id`` (the librdkafka ``client.id``).
        consumer_group: ``messaging.consumer.group.name`` (the ``group.id``).
        link_mode: ``"parent"`` (default): a process span is a child of the producer's span, so
            one trace runs from producer through consumer to the dead-letter topic.
            ``"link"``: the process span starts in the consumer's current trace and carries a
            span link to the producer (the conventions' recommended default for batch/async).
        server_address, server_port: ``server.address``/``server.port`` if the caller knows them.
        record_message_key: set ``messaging.kafka.message.key`` (text keys only) on spans.
            Default ``False``: keys are often e-mail addresses or user ids, and the semantic
            conventions make the attribute opt-in. Never on metrics.
        metric_partition_attribute: add ``messaging.destination.partition.id`` to the
            per-message metrics. Default ``False``: one series per partition exceeds the SDK's
            cardinality limit (2,000 series per instrument) on large topics, and the overflow
            lands in ``otel.metric.overflow``. Spans always carry the partition.
        redactor: applied to every exception text that goes into a span status or event
            (default :func:`kresilient.redaction.redact_text`; :meth:`for_client` uses a
            :class:`~kresilient.redaction.Redactor` for the client's configuration).
        logger: structlog logger for notable events (default:
            ``structlog.get_logger("kresilient")``).

    Telemetry never raises into the message path: see :attr:`failures`.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: otel_metrics.MeterProvider | None = None,
        propagator: TextMapPropagator | None = None,
        client_id: str | None = None,
        consumer_group: str | None = None,
        link_mode: Literal["parent", "link"] = "parent",
        server_address: str | None = None,
        server_port: int | None = None,
        record_message_key: bool = False,
        metric_partition_attribute: bool = False,
        redactor: Redact | None = None,
        logger: Any = None,
    ) -> None:
        if link_mode not in ("parent", "link"):
            raise _config_error(f"link_mode must be 'parent' or 'link', not {link_mode!r}")
        self.client_id = client_id
        self.consumer_group = consumer_group
        self.link_mode = link_mode
        self._propagator = propagator
        self._record_key = bool(record_message_key)
        self._metric_partition = bool(metric_partition_attribute)
        self._redact: Redact = redactor if redactor is not None else redact_text
        self._common: dict[str, Any] = {N.MESSAGING_SYSTEM: N.MESSAGING_SYSTEM_KAFKA}
        if server_address:
            self._common[N.SERVER_ADDRESS] = server_address
            if server_port is not None:
                self._common[N.SERVER_PORT] = server_port
        self._send_bases: dict[str, _Bases] = {}
        self._process_bases: dict[tuple[str | None, str | None], _Bases] = {}
        self._w3c = DirectW3C()
        # Never evicted: bounded by topics x partitions x error names (x 1 partition when the
        # partition is not a metric attribute); dies with the client.
        self._metric_cache: dict[tuple[int, int | None, str | None], _MetricSet] = {}
        log = logger if logger is not None else structlog.get_logger("kresilient")
        self._log = log.bind(client_id=client_id) if client_id else log
        self._guard = _Guard(self._log, self._redact)

        # None (or the API's proxy) means the global provider. get_*_provider() also loads one
        # named by OTEL_PYTHON_TRACER_PROVIDER / OTEL_PYTHON_METER_PROVIDER. While the global is
        # still the proxy, each call re-checks it cheaply (a provider may be set later).
        self._tracer: trace.Tracer | None = None
        self._tracer_pending = False
        self._fast: FastSampler | None = None
        try:
            if tracer_provider is None or _is_proxy_tracer_provider(tracer_provider):
                tracer_provider = trace.get_tracer_provider()
            self._tracer_pending = _is_proxy_tracer_provider(tracer_provider)
            if not self._tracer_pending:
                self._tracer = _make_tracer(tracer_provider)
                self._fast = fast_sampler_for(self._tracer)
        except Exception as exc:  # a broken provider: no spans, the client still works
            self._guard("tracer_provider", exc)
            self._tracer, self._tracer_pending, self._fast = None, False, None

        self._instr: _Instruments | None = None
        self._instr_pending = False
        try:
            if meter_provider is None or _is_proxy_meter_provider(meter_provider):
                meter_provider = otel_metrics.get_meter_provider()
            self._instr_pending = _is_proxy_meter_provider(meter_provider)
            if not self._instr_pending:
                self._instr = _make_instruments(meter_provider)
        except Exception as exc:
            self._guard("meter_provider", exc)
            self._instr, self._instr_pending = None, False

    @classmethod
    def for_client(cls, config: Mapping[str, Any], **kwargs: Any) -> Telemetry:
        """Build from a librdkafka config: ``client.id`` and ``group.id`` are taken from it, and
        span texts are redacted with a :class:`~kresilient.redaction.Redactor` for it."""
        kwargs.setdefault("client_id", _str_or_none(config.get("client.id")))
        kwargs.setdefault("consumer_group", _str_or_none(config.get("group.id")))
        if kwargs.get("redactor") is None:
            kwargs["redactor"] = Redactor.for_config(config)
        return cls(**kwargs)

    @property
    def failures(self) -> int:
        """Telemetry failures absorbed so far (a span processor, exporter, propagator or meter
        raised). Each cost a span, an event or a data point, never a message; they are logged
        as ``kafka_telemetry_failed`` (WARNING, at most one line per step every 5 s, with the
        count held back in between)."""
        return self._guard.failures

    @property
    def record_message_key(self) -> bool:
        """Whether text message keys go into spans (``messaging.kafka.message.key``)."""
        return self._record_key

    @property
    def metric_partition_attribute(self) -> bool:
        """Whether the per-message metrics carry ``messaging.destination.partition.id``."""
        return self._metric_partition

    # --- enablement -------------------------------------------------------------------------

    def _poll_tracer(self) -> trace.Tracer | None:
        if not _global_tracer_provider_is_set():
            return None
        self._tracer_pending = False
        try:
            tracer = _make_tracer(trace.get_tracer_provider())
            fast = fast_sampler_for(tracer)
        except Exception as exc:
            self._guard("tracer_provider", exc)
            return None
        self._fast = fast
        self._tracer = tracer
        return tracer

    def _poll_instr(self) -> _Instruments | None:
        if not _global_meter_provider_is_set():
            return None
        self._instr_pending = False
        try:
            self._instr = _make_instruments(otel_metrics.get_meter_provider())
        except Exception as exc:
            self._guard("meter_provider", exc)
            return None
        return self._instr

    def _active(self) -> tuple[trace.Tracer | None, _Instruments | None]:
        tracer = self._tracer
        if tracer is None and self._tracer_pending:
            tracer = self._poll_tracer()
        instr = self._instr
        if instr is None and self._instr_pending:
            instr = self._poll_instr()
        return tracer, instr

    @property
    def tracing_enabled(self) -> bool:
        """True when spans are created (an SDK tracer provider is in use)."""
        return self._active()[0] is not None

    @property
    def metrics_enabled(self) -> bool:
        """True when metrics are recorded (an SDK meter provider is in use)."""
        return self._active()[1] is not None

    @property
    def enabled(self) -> bool:
        """True when either spans or metrics are recorded."""
        tracer, instr = self._active()
        return tracer is not None or instr is not None

    # --- propagation ------------------------------------------------------------------------

    def inject_headers(
        self, headers: Headers, context: Context | None = None
    ) -> list[tuple[str, HeaderValue]]:
        """:func:`inject_headers` with this client's propagator.

        If the propagator raises, the headers are returned unchanged (as a new list).
        """
        try:
            return inject_headers(headers, context=context, propagator=self._propagator)
        except Exception as exc:
            self._guard("inject_headers", exc)
            return _header_list(headers)

    def trace_carrier(self, context: Context | None = None) -> dict[str, str]:
        """The propagator's fields for *context* (default: current), e.g. ``{"traceparent": ...}``.

        Empty when there is no valid span context. For header formats that store the context
        under other names (``kresilient.traceparent`` in dead-letter records).
        """
        carrier: dict[str, str] = {}
        try:
            (self._propagator or propagate.get_global_textmap()).inject(carrier, context=context)
        except Exception as exc:
            self._guard("trace_carrier", exc)
            return {}
        return carrier

    def extract_context(self, headers: Headers, context: Context | None = None) -> Context:
        """:func:`extract_context` with this client's propagator (*context* or the current one
        if the propagator raises)."""
        try:
            return extract_context(headers, context=context, propagator=self._propagator)
        except Exception as exc:
            self._guard("extract_context", exc)
            return context if context is not None else otel_context.get_current()

    # --- producer ---------------------------------------------------------------------------

    def _send_base(self, topic: str) -> _Bases:
        span = dict(self._common)
        span[N.MESSAGING_DESTINATION_NAME] = topic
        span[N.MESSAGING_OPERATION_TYPE] = N.OP_TYPE_SEND
        span[N.MESSAGING_OPERATION_NAME] = N.OP_NAME_SEND
        metric = dict(span)
        del metric[N.MESSAGING_OPERATION_TYPE]
        if self.client_id:
            span[N.MESSAGING_CLIENT_ID] = self.client_id
        base = _Bases(f"{N.OP_NAME_SEND} {topic}", span, metric)
        self._send_bases[topic] = base
        return base

    def producer_send(
        self,
        topic: str,
        key: bytes | str | None,
        value_size: int,
        headers: Headers,
        partition: int | None = None,
        *,
        tombstone: bool = False,
    ) -> tuple[Headers, _SendToken | None]:
        """Start the PRODUCER span ``send {topic}`` for one message; inject its context.

        Returns ``(headers, token)``: pass *headers* to ``produce()`` (a new list when a context
        was injected; the caller's object is never modified) and *token* to
        :meth:`producer_delivered` from the delivery callback. When telemetry is off this is
        ``(headers, None)`` at the cost of a few attribute loads; a message the ratio sampler
        drops gets its ``traceparent`` (not sampled) and token ``None`` unless metrics are on.
        """
        tracer = self._tracer  # self._active(), inlined: this runs once per message
        if tracer is None and self._tracer_pending:
            tracer = self._poll_tracer()
        instr = self._instr
        if instr is None and self._instr_pending and _global_meter_provider_is_set():
            instr = self._poll_instr()
        if tracer is None:
            if instr is None:
                return headers, None
            base = self._send_bases.get(topic) or self._send_base(topic)
            return headers, _SendToken(None, time.perf_counter(), base.metric)
        span: Span | None = None
        try:
            fast = self._fast
            root_id = None
            if fast is not None:
                # Sampled out: no span, only the traceparent the SDK would have injected.
                routed = fast.route(headers, self._propagator)
                if isinstance(routed, list):
                    if instr is None:
                        return routed, None
                    base = self._send_bases.get(topic) or self._send_base(topic)
                    return routed, _SendToken(None, time.perf_counter(), base.metric)
                root_id = routed
            base = self._send_bases.get(topic) or self._send_base(topic)
            attrs = base.span.copy()
            attrs[N.MESSAGING_MESSAGE_BODY_SIZE] = value_size
            if partition is not None and partition >= 0:
                attrs[N.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
            if key is not None and self._record_key:
                text = _key_text(key)
                if text is not None:
                    attrs[N.MESSAGING_KAFKA_MESSAGE_KEY] = text
            if tombstone:
                attrs[N.MESSAGING_KAFKA_MESSAGE_TOMBSTONE] = True
            if fast is None or root_id is None:
                span = tracer.start_span(base.name, kind=SpanKind.PRODUCER, attributes=attrs)
            else:  # a sampled root: the trace id the fast path drew
                span = fast.start_root(root_id, base.name, SpanKind.PRODUCER, attrs)
            out = self._w3c.write(span.get_span_context(), headers, self._propagator)
            if out is None:
                out = inject_headers(
                    headers, context=trace.set_span_in_context(span), propagator=self._propagator
                )
            return out, _SendToken(span, time.perf_counter(), base.metric)
        except Exception as exc:  # e.g. a span processor's on_start raised: send untraced
            self._guard("producer_send", exc)
            self._end_quietly(span)
            if instr is None:
                return headers, None
            base = self._send_bases.get(topic) or self._send_base(topic)
            return headers, _SendToken(None, time.perf_counter(), base.metric)

    def _end_quietly(self, span: Span | None) -> None:
        """End a span a failed step leaves behind (its own failure is counted, not logged)."""
        if span is not None:
            try:
                span.end()
            except Exception:
                self._guard.failures += 1

    def producer_delivered(
        self,
        token: _SendToken | None,
        err: Any,
        msg: MessageLike | None,
        classification: Any = None,
    ) -> None:
        """End the send span at the delivery report and record the send metrics.

        Success: ``messaging.destination.partition.id`` and ``messaging.kafka.offset``.
        Failure (*err* is a ``KafkaError``/exception): ``error.type`` (the Kafka error name, e.g.
        ``_MSG_TIMED_OUT``), ``kresilient.error.category`` and status ERROR.
        """
        if token is None:
            return
        elapsed = time.perf_counter() - token.start
        span = token.span
        partition = error_type = None
        try:
            partition = _safe_int(msg.partition) if msg is not None else None
            error_type = None if err is None else _error_name(err)
            if span is not None:
                if span.is_recording():
                    at: dict[str, Any] = {}
                    if partition is not None and partition >= 0:
                        at[N.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
                    if error_type is None:
                        offset = _safe_int(msg.offset) if msg is not None else None
                        if offset is not None and offset >= 0:
                            at[N.MESSAGING_KAFKA_OFFSET] = offset
                    if at:
                        span.set_attributes(at)  # one lock and call, not one per attribute
                    if error_type is not None:
                        _mark_error(
                            span, err, error_type, _category(classification, err), self._redact
                        )
                span.end()
        except Exception as exc:  # a span processor's on_end raised: the report goes on
            self._guard("producer_delivered", exc)
        instr = self._instr
        if instr is not None:
            try:
                metric = self._metric_set(token.attrs, partition, error_type)
                metric.count(instr.sent)
                instr.operation_duration.record(elapsed, metric.attrs)
            except Exception as exc:
                self._guard("producer_delivered", exc)

    def _metric_set(
        self, base: dict[str, Any], partition: int | None, error_type: str | None
    ) -> _MetricSet:
        if not self._metric_partition or (partition is not None and partition < 0):
            partition = None
        key = (id(base), partition, error_type)  # bases live as long as the client
        hit = self._metric_cache.get(key)
        if hit is not None:
            return hit
        attrs = base.copy()
        if partition is not None:
            attrs[N.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
        if error_type is not None:
            attrs[N.ERROR_TYPE] = error_type
        metric = self._metric_cache[key] = _MetricSet(attrs)
        return metric

    # --- consumer ---------------------------------------------------------------------------

    def _process_base(self, topic: str | None, group: str | None) -> _Bases:
        """The bases of ``process {topic}``; ``topic=None``: a batch of several topics
        (``process``, no destination)."""
        span = dict(self._common)
        if topic is not None:
            span[N.MESSAGING_DESTINATION_NAME] = topic
        span[N.MESSAGING_OPERATION_TYPE] = N.OP_TYPE_PROCESS
        span[N.MESSAGING_OPERATION_NAME] = N.OP_NAME_PROCESS
        if group:
            span[N.MESSAGING_CONSUMER_GROUP_NAME] = group
        metric = dict(span)
        del metric[N.MESSAGING_OPERATION_TYPE]
        if self.client_id:
            span[N.MESSAGING_CLIENT_ID] = self.client_id
        name = N.OP_NAME_PROCESS if topic is None else f"{N.OP_NAME_PROCESS} {topic}"
        base = _Bases(name, span, metric)
        self._process_bases[(topic, group)] = base
        return base

    def process_span(
        self, msg: MessageLike, *, group: str | None = None
    ) -> AbstractContextManager[Span | None]:
        """Context manager around processing one consumed message.

        Creates the CONSUMER span ``process {topic}`` (current while the block runs), parented
        to the producer's context from the headers (``link_mode="parent"``) or linked to it
        (``"link"``); records ``messaging.client.consumed.messages`` and
        ``messaging.process.duration``. An exception escaping the block is recorded (status
        ERROR, ``error.type``) and re-raised. Yields the span, or ``None`` when tracing is off
        (or the span could not be started). Never raises an error of its own: a failing span
        processor costs the span, never the message (see :attr:`failures`).
        """
        tracer, instr = self._active()
        if tracer is None and instr is None:
            return _NULL_SCOPE
        got = None
        fast = self._fast
        if fast is not None and self.link_mode == "parent":
            # sampled out upstream, read from the canonical traceparent alone: the SDK's
            # non-recording child without the propagator (sampling.py)
            try:
                headers = msg.headers()
                got = fast.drop_from_headers(headers, self._propagator) if headers else None
            except Exception:  # not a message this path reads: _ProcessScope says why
                got = None
            if got is not None and instr is None:  # the commonest traced message at 1 %
                return _DroppedScope(self, msg, got[0], got[1])
        return _ProcessScope(self, tracer, msg, group or self.consumer_group, got)

    def batch_process_span(
        self, msgs: Sequence[MessageLike], *, group: str | None = None
    ) -> AbstractContextManager[Span | None]:
        """Context manager around processing a batch of consumed messages in one call.

        Creates one CONSUMER span ``process {topic}`` (``process`` when the messages are of
        several topics), current while the block runs, with ``messaging.batch.message_count``
        and the partition when they share one. As the messaging conventions recommend for
        batches, the span is not parented to any one producer: it is a child of the current
        context (a new trace in a consumer loop) and **links** to each message's producer
        context (at most the SDK's span link limit, ``OTEL_SPAN_LINK_COUNT_LIMIT``, default
        128: the first messages'). A sampled-out batch builds no links. Records
        ``messaging.client.consumed.messages`` (one per message) and one
        ``messaging.process.duration``. Failures: as :meth:`process_span`. An empty *msgs*
        gives no span.
        """
        tracer, instr = self._active()
        if (tracer is None and instr is None) or not msgs:
            return _NULL_SCOPE
        return _BatchScope(self, tracer, msgs, group or self.consumer_group)

    def _batch_links(self, msgs: Sequence[MessageLike], tracer: trace.Tracer) -> list[Link]:
        """Links to the producer contexts of *msgs* (up to the tracer's span link limit)."""
        cap = getattr(getattr(tracer, "_span_limits", None), "max_links", None)
        if not isinstance(cap, int) or cap < 0:
            cap = len(msgs)  # another tracer, or no limit
        links: list[Link] = []
        if not cap:
            return links
        read = self._w3c.read
        prop = self._propagator
        for msg in msgs:
            headers = msg.headers()
            if not headers:
                continue
            remote = read(headers, prop)
            if remote is None:  # any other header form: the propagator's (never our context)
                extracted = self.extract_context(headers, Context())
                remote = trace.get_current_span(extracted).get_span_context()
                if not remote.is_valid:
                    continue
            links.append(Link(remote))
            if len(links) >= cap:
                break
        return links

    def set_error(self, exc: BaseException, classification: Any = None) -> None:
        """Mark the current :meth:`process_span` as failed by *exc* (without raising it).

        Use when the consumer handles the exception itself (e.g. dead-letters the message).
        """
        scope = _CURRENT.get()
        if scope is not None:
            scope.fail(exc, classification)

    def retry_event(
        self,
        span: Span | None,
        attempt: int,
        exc: BaseException,
        *,
        classification: Any = None,
        delay_s: float | None = None,
        topic: str | None = None,
    ) -> None:
        """Record one retry: a span event ``kresilient.retry`` and the ``kresilient.retries`` count.

        *span* defaults to the current process span; *attempt* is the attempt that failed
        (1-based). *topic* defaults to the current process span's topic.
        """
        try:
            scope = _CURRENT.get()
            if span is None and scope is not None:
                span = scope.span
            error_type = _error_name(exc)
            category = _category(classification, exc)
            if span is not None and span.is_recording():
                event: dict[str, Any] = {
                    N.KRESILIENT_RETRY_ATTEMPT: attempt,
                    N.ERROR_TYPE: error_type,
                    N.EXCEPTION_TYPE: _exception_type(exc),
                    N.EXCEPTION_MESSAGE: _short(self._redact(str(exc))),
                }
                if category:
                    event[N.KRESILIENT_ERROR_CATEGORY] = category
                if delay_s is not None:
                    event[N.KRESILIENT_RETRY_DELAY] = float(delay_s)
                span.add_event(N.EVENT_RETRY, event)
            instr = self._active()[1]
            if instr is not None:
                attrs = dict(self._common)
                dest = topic or (scope.topic if scope is not None else None)
                if dest:
                    attrs[N.MESSAGING_DESTINATION_NAME] = dest
                attrs[N.ERROR_TYPE] = error_type
                if category:
                    attrs[N.KRESILIENT_ERROR_CATEGORY] = category
                instr.retries.add(1, attrs)
        except Exception as err:
            self._guard("retry_event", err)

    @contextmanager
    def dead_letter_span(
        self,
        dlq_topic: str,
        *,
        source: MessageLike | None = None,
        reason: BaseException | None = None,
        classification: Any = None,
        attempts: int | None = None,
        kind: Literal["internal", "producer"] = "internal",
    ) -> Iterator[Span | None]:
        """Context manager around dead-lettering one record to *dlq_topic*.

        A span child of the current (process) span is current while the block runs:

        - ``kind="internal"`` (default): ``dead_letter {dlq_topic}`` (INTERNAL), for a DLQ
          write through a traced :class:`~kresilient.ResilientProducer`, whose own PRODUCER
          span ``send {dlq_topic}`` (ended at the DLQ acknowledgement, with partition and
          offset) becomes its child;
        - ``kind="producer"``: ``send {dlq_topic}`` (PRODUCER) for a write through an
          uninstrumented producer; inject its context with ``tel.inject_headers(...)`` or
          ``tel.trace_carrier()`` inside the block.

        The enclosing process span is marked failed by *reason*. Counts
        ``kresilient.dead_letters`` and logs one ``kafka_message_dead_lettered`` event (WARNING,
        with trace/span ids). If the block raises (the DLQ write failed), the span carries
        ``error.type`` and status ERROR and the error re-raises.
        """
        scope = _CURRENT.get()
        span: Span | None = None
        token = None
        src_topic = src_partition = src_offset = category = reason_type = None
        try:
            if reason is not None and scope is not None and scope.error_type is None:
                scope.fail(reason, classification)
            src_topic = _call(source.topic) if source is not None else None
            if src_topic is None and scope is not None:
                src_topic = scope.topic
            src_partition = _safe_int(source.partition) if source is not None else None
            src_offset = _safe_int(source.offset) if source is not None else None
            category = (
                _category(classification, reason)
                if reason is not None
                else _category(classification)
            )
            reason_type = _error_name(reason) if reason is not None else None
            tracer, _ = self._active()
            if tracer is not None:
                attrs = dict(self._common)
                attrs[N.MESSAGING_DESTINATION_NAME] = dlq_topic
                if kind == "producer":
                    attrs[N.MESSAGING_OPERATION_TYPE] = N.OP_TYPE_SEND
                    attrs[N.MESSAGING_OPERATION_NAME] = N.OP_NAME_SEND
                    name, span_kind = f"{N.OP_NAME_SEND} {dlq_topic}", SpanKind.PRODUCER
                else:
                    name, span_kind = f"{N.SPAN_DEAD_LETTER} {dlq_topic}", SpanKind.INTERNAL
                if self.client_id:
                    attrs[N.MESSAGING_CLIENT_ID] = self.client_id
                for k, v in (
                    (N.KRESILIENT_DEAD_LETTER_SOURCE_TOPIC, src_topic),
                    (N.KRESILIENT_DEAD_LETTER_SOURCE_PARTITION, src_partition),
                    (N.KRESILIENT_DEAD_LETTER_SOURCE_OFFSET, src_offset),
                    (N.KRESILIENT_DEAD_LETTER_REASON, reason_type),
                    (N.KRESILIENT_ERROR_CATEGORY, category),
                    (N.KRESILIENT_ATTEMPTS, attempts),
                ):
                    if v is not None:
                        attrs[k] = v
                span = tracer.start_span(name, kind=span_kind, attributes=attrs)
                token = otel_context.attach(trace.set_span_in_context(span))
        except Exception as exc:  # the dead-letter write goes on without its span
            self._guard("dead_letter_span", exc)
            self._end_quietly(span)
            span = token = None
        write_error: str | None = None
        try:
            yield span
        except BaseException as exc:
            try:
                write_error = _error_name(exc)
                if span is not None and span.is_recording():
                    _record_exception(span, exc, self._redact)
                    _mark_error(span, exc, write_error, _category(None, exc), self._redact)
            except Exception as err:
                self._guard("dead_letter_span", err)
            raise
        finally:
            # each step on its own: a span that fails to end must not cost the count or the log
            if token is not None:
                try:
                    otel_context.detach(token)
                except Exception as exc:
                    self._guard("dead_letter_span", exc)
            fields: dict[str, str] = {}
            if span is not None:
                try:
                    fields = trace_fields(span)
                    span.end()
                except Exception as exc:
                    self._guard("dead_letter_span", exc)
            try:
                instr = self._active()[1]
                if instr is not None:
                    m = dict(self._common)
                    if src_topic:
                        m[N.MESSAGING_DESTINATION_NAME] = src_topic
                    m[N.KRESILIENT_DEAD_LETTER_TOPIC] = dlq_topic
                    if category:
                        m[N.KRESILIENT_ERROR_CATEGORY] = category
                    if write_error:
                        m[N.ERROR_TYPE] = write_error
                    instr.dead_letters.add(1, m)
            except Exception as exc:
                self._guard("dead_letter_span", exc)
            try:
                event: dict[str, Any] = {
                    "topic": src_topic,
                    "partition": src_partition,
                    "offset": src_offset,
                    "dead_letter_topic": dlq_topic,
                    "reason": reason_type,
                    "category": category,
                    "attempts": attempts,
                    "write_error": write_error,
                }
                event.update(fields or trace_fields())
                log = self._log.error if write_error else self._log.warning
                log(N.LOG_DEAD_LETTERED, **{k: v for k, v in event.items() if v is not None})
            except Exception as exc:
                self._guard("dead_letter_span", exc)

    def record_commit(
        self,
        offsets: Iterable[Any],
        error: Any = None,
        *,
        duration_s: float | None = None,
        group: str | None = None,
    ) -> None:
        """Record one offset commit as a CLIENT span ``commit {topic}`` (operation type settle).

        *offsets*: ``confluent_kafka.TopicPartition`` objects (as passed to or returned by
        ``commit()``) or ``(topic, partition, offset)`` tuples. A per-partition error on a
        returned ``TopicPartition`` counts as a failure like *error*. With *duration_s* the span
        gets that duration and ``messaging.client.operation.duration`` is recorded.
        """
        try:
            self._record_commit(offsets, error, duration_s, group)
        except Exception as exc:
            self._guard("record_commit", exc)

    def _record_commit(
        self, offsets: Iterable[Any], error: Any, duration_s: float | None, group: str | None
    ) -> None:
        tracer, instr = self._active()
        if tracer is None and instr is None:
            return
        items = [_offset_item(o) for o in offsets]
        if error is None:
            error = next((it[3] for it in items if it[3] is not None), None)
        topics = {it[0] for it in items if it[0]}
        attrs = dict(self._common)
        attrs[N.MESSAGING_OPERATION_NAME] = N.OP_NAME_COMMIT
        group = group or self.consumer_group
        if group:
            attrs[N.MESSAGING_CONSUMER_GROUP_NAME] = group
        if len(topics) == 1:
            attrs[N.MESSAGING_DESTINATION_NAME] = next(iter(topics))
        error_type = _error_name(error) if error is not None else None
        if tracer is not None:
            span_attrs = dict(attrs)
            span_attrs[N.MESSAGING_OPERATION_TYPE] = N.OP_TYPE_SETTLE
            if self.client_id:
                span_attrs[N.MESSAGING_CLIENT_ID] = self.client_id
            if len(items) == 1:
                _, part, off, _ = items[0]
                if part is not None and part >= 0:
                    span_attrs[N.MESSAGING_DESTINATION_PARTITION_ID] = str(part)
                if off is not None and off >= 0:
                    span_attrs[N.MESSAGING_KAFKA_OFFSET] = off
            elif items:
                span_attrs[N.MESSAGING_BATCH_MESSAGE_COUNT] = len(items)
            end = time.time_ns()
            start = end - int(duration_s * 1e9) if duration_s is not None else None
            name = f"{N.OP_NAME_COMMIT} {next(iter(topics))}" if len(topics) == 1 else "commit"
            span = tracer.start_span(
                name, kind=SpanKind.CLIENT, attributes=span_attrs, start_time=start
            )
            try:
                if error is not None and error_type is not None:
                    _mark_error(span, error, error_type, _category(None, error), self._redact)
            finally:
                span.end(end_time=end)
        if instr is not None and duration_s is not None:
            if error_type:
                attrs[N.ERROR_TYPE] = error_type
            instr.operation_duration.record(duration_s, attrs)

    # --- notable state changes ---------------------------------------------------------------

    def leadership_listener(self, *, log: bool = False) -> Callable[[Any], None]:
        """A callable for ``LeadershipMonitor.add_listener(tel.leadership_listener())``.

        Each :class:`~kresilient.leadership.LeadershipChange` counts
        ``kresilient.leadership.state_changes`` by topic, new state
        (``kresilient.leadership.state``: ``stable``, ``transient_burst``, ``sustained_churn``)
        and the last error's category. The monitor already logs every change, so this listener
        logs only with ``log=True`` (one ``kafka_leadership_state_changed`` event: WARNING for a
        burst or churn, INFO on the return to STABLE, with trace/span ids when a span is
        current), and adds the change as an event to the current span when one is recording.
        """

        def on_change(change: Any) -> None:
            try:
                record(change)
            except Exception as exc:
                self._guard("leadership_listener", exc)

        def record(change: Any) -> None:
            topic = getattr(change, "topic", None)
            new = _state_name(getattr(change, "state", None))
            category = _category(getattr(change, "classification", None))
            instr = self._active()[1]
            if instr is not None:
                attrs = dict(self._common)
                if topic:
                    attrs[N.MESSAGING_DESTINATION_NAME] = str(topic)
                if new:
                    attrs[N.KRESILIENT_LEADERSHIP_STATE] = new
                if category:
                    attrs[N.KRESILIENT_ERROR_CATEGORY] = category
                instr.leadership.add(1, attrs)
            fields: dict[str, Any] = {
                "topic": topic,
                "partition": getattr(change, "partition", None),
                "state": new,
                "previous_state": _state_name(getattr(change, "previous", None)),
                "category": category,
            }
            for name in ("reason", "leader", "leader_changes", "bursts", "errors", "window_s"):
                value = getattr(change, name, None)
                if value is not None:
                    fields[name] = value
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    N.LOG_LEADERSHIP_CHANGED,
                    {k: v for k, v in fields.items() if isinstance(v, str | bool | int | float)},
                )
            if log:
                emit = self._log.info if new == "stable" else self._log.warning
                emit(N.LOG_LEADERSHIP_CHANGED, **fields, **trace_fields(span))

        return on_change

    def notable_event(
        self, event: str, *, level: str = "warning", span: Span | None = None, **fields: Any
    ) -> None:
        """Log one notable state change with trace/span ids, and add it to the current span.

        For state changes only (circuit breaker opened, fatal producer error, ...), never per
        message. *fields* must not contain secrets. Never raises.
        """
        try:
            target = span if span is not None else trace.get_current_span()
            ids: dict[str, str] = {}
            try:
                if target.is_recording():
                    scalars = {
                        k: v for k, v in fields.items() if isinstance(v, str | bool | int | float)
                    }
                    target.add_event(event, scalars)
                ids = trace_fields(target)
            finally:  # the log line is the part that must not be lost
                getattr(self._log, level)(event, **fields, **ids)
        except Exception as exc:
            self._guard("notable_event", exc)

    def circuit_breaker_opened(self, **fields: Any) -> None:
        """Notable event ``kafka_dead_letter_circuit_breaker_opened`` (ERROR)."""
        self.notable_event(N.LOG_CIRCUIT_BREAKER_OPENED, level="error", **fields)

    def fatal_error(self, exc: BaseException, classification: Any = None, **fields: Any) -> None:
        """Notable event ``kafka_fatal_error`` (ERROR) naming the error type and category."""
        try:
            error_type, category = _error_name(exc), _category(classification, exc)
        except Exception as err:
            self._guard("fatal_error", err)
            error_type, category = _exception_type(exc), None
        self.notable_event(
            N.LOG_FATAL_ERROR, level="error", error_type=error_type, category=category, **fields
        )


def _leave_scope(tel: Telemetry, token: Any) -> None:
    """Restore the current process scope a scope's ``__enter__`` replaced (*token*)."""
    try:
        _CURRENT.reset(token)
    except (ValueError, RuntimeError) as err:  # exited in another context: clear ours
        tel._guard("process_span", err)
        _CURRENT.set(None)


class _ProcessScope:
    """The enabled path of :meth:`Telemetry.process_span` (a class: cheaper than a generator).

    Every SDK call is guarded: a span processor raising in ``on_start`` costs the span (the
    block still runs, with ``None``), one raising in ``on_end`` costs nothing the caller sees,
    and the current-scope variable is always reset.
    """

    __slots__ = (
        "_base",
        "_ctx_token",
        "_dropped",
        "_group",
        "_msg",
        "_scope_token",
        "_tel",
        "_tracer",
        "category",
        "error_type",
        "partition",
        "span",
        "start",
        "topic",
    )

    def __init__(
        self,
        tel: Telemetry,
        tracer: trace.Tracer | None,
        msg: MessageLike,
        group: str | None,
        dropped: tuple[Span, Context] | None = None,
    ) -> None:
        self._tel = tel
        self._tracer = tracer
        self._msg = msg
        self._group = group
        self._dropped = dropped  # the sampled-out child and its context (drop_from_headers)
        self.span: Span | None = None
        self.error_type: str | None = None
        self.category: str | None = None
        self._ctx_token: Any = None
        self._scope_token: Any = None
        self.topic = ""
        self.partition: int | None = None
        self.start = 0.0

    def __enter__(self) -> Span | None:
        tel, msg = self._tel, self._msg
        try:
            self.topic = topic = _call(msg.topic) or ""
            self.partition = partition = _safe_int(msg.partition)
            self._base = base = tel._process_bases.get((topic, self._group)) or (
                tel._process_base(topic, self._group)
            )
        except Exception as exc:  # not a message telemetry can read: no scope at all
            tel._guard("process_span", exc)
            return None
        self._scope_token = _CURRENT.set(self)
        self.start = time.perf_counter()
        tracer = self._tracer
        if tracer is None:
            return None
        try:
            parent: Context | None = None
            links: list[Link] | None = None
            dropped = self._dropped
            if dropped is not None:  # read by process_span
                self.span = dropped[0]
                self._ctx_token = otel_context.attach(dropped[1])
                return dropped[0]
            headers = _call(msg.headers)
            if headers:
                direct = tel._w3c.read_context(headers, tel._propagator)
                if direct is not None:  # canonical traceparent: no propagator (sampling.py)
                    remote, extracted = direct
                else:
                    extracted = tel.extract_context(headers)
                    remote = trace.get_current_span(extracted).get_span_context()
                if remote.is_valid:
                    if tel.link_mode == "parent":
                        fast = tel._fast
                        if fast is not None:
                            # sampled out upstream: the SDK's non-recording child, built here
                            # (no sampler call, attributes or span processors; sampling.py)
                            child = fast.drop_child(remote)
                            if child is not None:
                                self.span = child
                                self._ctx_token = otel_context.attach(
                                    trace.set_span_in_context(child, extracted)
                                )
                                return child
                        parent = extracted
                    else:
                        links = [Link(remote)]
            attrs = base.span.copy()
            if partition is not None and partition >= 0:
                attrs[N.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
            offset = _safe_int(msg.offset)
            if offset is not None and offset >= 0:
                attrs[N.MESSAGING_KAFKA_OFFSET] = offset
            value = _call(msg.value)
            if value is None:
                attrs[N.MESSAGING_KAFKA_MESSAGE_TOMBSTONE] = True
            else:
                attrs[N.MESSAGING_MESSAGE_BODY_SIZE] = len(value)
            if tel._record_key:
                text = _key_text(_call(msg.key))
                if text is not None:
                    attrs[N.MESSAGING_KAFKA_MESSAGE_KEY] = text
            self.span = span = tracer.start_span(
                base.name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links
            )
            self._ctx_token = otel_context.attach(trace.set_span_in_context(span, parent))
        except Exception as exc:  # e.g. a span processor's on_start raised: handle untraced
            tel._guard("process_span", exc)
            tel._end_quietly(self.span)
            self.span = None
            return None
        return span

    def fail(self, exc: BaseException, classification: Any = None) -> None:
        try:
            self.error_type = _error_name(exc)
            self.category = _category(classification, exc)
            span = self.span
            if span is not None and span.is_recording():
                _record_exception(span, exc, self._tel._redact)
                _mark_error(span, exc, self.error_type, self.category, self._tel._redact)
        except Exception as err:
            self._tel._guard("set_error", err)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if self._scope_token is None:
            return  # __enter__ could not read the message: nothing was started
        tel = self._tel
        elapsed = time.perf_counter() - self.start
        if exc is not None:
            self.fail(exc)
        if self._ctx_token is not None:
            try:
                otel_context.detach(self._ctx_token)
            except Exception as err:
                tel._guard("process_span", err)
        if self.span is not None:
            try:
                self.span.end()  # runs the span processors' on_end
            except Exception as err:
                tel._guard("process_span", err)
        _leave_scope(tel, self._scope_token)
        instr = tel._instr
        if instr is not None:
            try:
                self._record(tel, instr, elapsed)
            except Exception as err:
                tel._guard("process_span", err)

    def _record(self, tel: Telemetry, instr: _Instruments, elapsed: float) -> None:
        metric = tel._metric_set(self._base.metric, self.partition, None)
        metric.count(instr.consumed)
        if self.error_type is not None:
            metric = tel._metric_set(self._base.metric, self.partition, self.error_type)
        instr.process_duration.record(elapsed, metric.attrs)


class _DroppedScope:
    """:meth:`Telemetry.process_span` for a message its upstream sampled out, with no metrics.

    All the full scope would do for it: make the SDK's non-recording child current (built by
    ``FastSampler.drop_from_headers``) and be the current process scope (for
    :meth:`Telemetry.set_error` and friends). No topic, partition or timer is read. A meter
    provider installed while the block runs counts from the next message on.
    """

    __slots__ = (
        "_ctx",
        "_ctx_token",
        "_msg",
        "_scope_token",
        "_tel",
        "category",
        "error_type",
        "span",
    )

    def __init__(self, tel: Telemetry, msg: MessageLike, span: Span, ctx: Context) -> None:
        self._tel = tel
        self._msg = msg
        self.span: Span | None = span
        self._ctx = ctx
        self.error_type: str | None = None
        self.category: str | None = None

    @property
    def topic(self) -> str:
        try:
            return _call(self._msg.topic) or ""
        except Exception:
            return ""

    def __enter__(self) -> Span | None:
        self._scope_token = _CURRENT.set(self)
        var = _CONTEXT_VAR
        self._ctx_token = var.set(self._ctx) if var is not None else otel_context.attach(self._ctx)
        return self.span

    def fail(self, exc: BaseException, classification: Any = None) -> None:
        try:
            self.error_type = _error_name(exc)
            self.category = _category(classification, exc)
        except Exception as err:
            self._tel._guard("set_error", err)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            if _CONTEXT_VAR is not None:
                _CONTEXT_VAR.reset(self._ctx_token)
            else:
                otel_context.detach(self._ctx_token)
        except Exception as err:  # exited in another context (as otel_context.detach logs)
            self._tel._guard("process_span", err)
        _leave_scope(self._tel, self._scope_token)


class _BatchScope(_ProcessScope):
    """The enabled path of :meth:`Telemetry.batch_process_span`: one span for many messages.

    ``_msg`` holds the message sequence; ``_topics`` the count per topic when they are of
    several (their consumed-messages counts go to each topic's series).
    """

    __slots__ = ("_topics",)

    def __init__(
        self,
        tel: Telemetry,
        tracer: trace.Tracer | None,
        msgs: Sequence[MessageLike],
        group: str | None,
    ) -> None:
        super().__init__(tel, tracer, cast(Any, msgs), group)
        self._topics: dict[str, int] | None = None

    def __enter__(self) -> Span | None:
        tel = self._tel
        msgs: Sequence[MessageLike] = self._msg  # type: ignore[assignment]
        try:
            first = msgs[0]
            topic: str | None = first.topic() or ""
            partition = _safe_int(first.partition)
            mixed = False
            for msg in msgs:
                if msg.topic() != topic or _safe_int(msg.partition) != partition:
                    mixed = True
                    break
            if mixed:  # not one partition: which topics, how many each
                topics: dict[str, int] = {}
                for msg in msgs:
                    name = msg.topic() or ""
                    topics[name] = topics.get(name, 0) + 1
                partition = None
                if len(topics) > 1:
                    self._topics, topic = topics, None
            self.topic = topic or ""
            self.partition = partition
            self._base = base = tel._process_bases.get((topic, self._group)) or (
                tel._process_base(topic, self._group)
            )
        except Exception as exc:  # not messages telemetry can read: no scope at all
            tel._guard("process_span", exc)
            return None
        self._scope_token = _CURRENT.set(self)
        self.start = time.perf_counter()
        tracer = self._tracer
        if tracer is None:
            return None
        span: Span | None = None
        try:
            fast = tel._fast
            decided = fast.drop_root() if fast is not None else None
            if decided is not None and not isinstance(decided, int):
                self.span = decided  # sampled out: no links, attributes or processors
                self._ctx_token = otel_context.attach(trace.set_span_in_context(decided))
                return decided
            attrs = base.span.copy()
            if partition is not None and partition >= 0:
                attrs[N.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
            attrs[N.MESSAGING_BATCH_MESSAGE_COUNT] = len(msgs)
            links = tel._batch_links(msgs, tracer)
            if decided is None or fast is None:
                span = tracer.start_span(
                    base.name, kind=SpanKind.CONSUMER, attributes=attrs, links=links
                )
            else:
                span = fast.start_root(decided, base.name, SpanKind.CONSUMER, attrs, links)
            self.span = span
            self._ctx_token = otel_context.attach(trace.set_span_in_context(span))
        except Exception as exc:  # e.g. a span processor's on_start raised: handle untraced
            tel._guard("process_span", exc)
            tel._end_quietly(self.span)
            self.span = None
            return None
        return span

    def _record(self, tel: Telemetry, instr: _Instruments, elapsed: float) -> None:
        msgs: Sequence[MessageLike] = self._msg  # type: ignore[assignment]
        base = self._base
        topics = self._topics
        if topics is None:
            tel._metric_set(base.metric, self.partition, None).count(instr.consumed, len(msgs))
        else:
            for topic, n in topics.items():
                own = tel._process_bases.get((topic, self._group)) or (
                    tel._process_base(topic, self._group)
                )
                tel._metric_set(own.metric, None, None).count(instr.consumed, n)
        metric = tel._metric_set(base.metric, self.partition, self.error_type)
        instr.process_duration.record(elapsed, metric.attrs)
