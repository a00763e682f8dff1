"""Per-message state of :mod:`kresilient.telemetry`: send tokens and the process-span scope."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

from kresilient.telemetry import _names as N
from kresilient.telemetry._propagation import MessageLike
from kresilient.telemetry._util import (
    _call,
    _category,
    _error_name,
    _key_text,
    _mark_error,
    _safe_int,
)

if TYPE_CHECKING:
    from kresilient.telemetry._telemetry import Telemetry


class _SendToken:
    """Opaque per-message state between :meth:`Telemetry.producer_send` and the delivery report."""

    __slots__ = ("attrs", "span", "start")

    def __init__(self, span: Span | None, start: float, attrs: dict[str, Any]) -> None:
        self.span = span
        self.start = start
        self.attrs = attrs  # base metric attributes (system, destination, operation name)


_NULL_SCOPE: AbstractContextManager[None] = nullcontext(None)
_CURRENT: ContextVar[_ProcessScope | None] = ContextVar("kresilient_process_scope", default=None)


class _Bases:
    """Per-topic constant parts of span names and attribute dicts (built once per topic)."""

    __slots__ = ("metric", "name", "span")

    def __init__(self, name: str, span: dict[str, Any], metric: dict[str, Any]) -> None:
        self.name = name
        self.span = span
        self.metric = metric






class _ProcessScope:
    """The enabled path of :meth:`Telemetry.process_span` (a class: cheaper than a generator)."""

    __slots__ = (
        "_base",
        "_ctx_token",
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
        self, tel: Telemetry, tracer: trace.Tracer | None, msg: MessageLike, group: str | None
    ) -> None:
        self._tel = tel
        self._tracer = tracer
        self._msg = msg
        self._group = group
        self.span: Span | None = None
        self.error_type: str | None = None
        self.category: str | None = None
        self._ctx_token: Any = None

    def __enter__(self) -> Span | None:
        tel, msg = self._tel, self._msg
        self.topic = topic = _call(msg.topic) or ""
        self.partition = partition = _safe_int(msg.partition)
        self._base = base = tel._process_bases.get((topic, self._group)) or tel._process_base(
            topic, self._group
        )
        self._scope_token = _CURRENT.set(self)
        self.start = time.perf_counter()
        tracer = self._tracer
        if tracer is None:
            return None
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
        parent: Context | None = None
        links: list[Link] | None = None
        headers = _call(msg.headers)
        if headers:
            extracted = tel.extract_context(headers)
            remote = trace.get_current_span(extracted).get_span_context()
            if remote.is_valid:
                if tel.link_mode == "parent":
                    parent = extracted
                else:
                    links = [Link(remote)]
        self.span = span = tracer.start_span(
            base.name, context=parent, kind=SpanKind.CONSUMER, attributes=attrs, links=links
        )
        self._ctx_token = otel_context.attach(trace.set_span_in_context(span, parent))
        return span

    def fail(self, exc: BaseException, classification: Any = None) -> None:
        self.error_type = _error_name(exc)
        self.category = _category(classification, exc)
        span = self.span
        if span is not None and span.is_recording():
            span.record_exception(exc)
            _mark_error(span, exc, self.error_type, self.category)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        elapsed = time.perf_counter() - self.start
        if exc is not None:
            self.fail(exc)
        if self._ctx_token is not None:
            otel_context.detach(self._ctx_token)
        if self.span is not None:
            self.span.end()
        _CURRENT.reset(self._scope_token)
        instr = self._tel._instr
        if instr is not None:
            attrs = self._tel._metric_attrs(self._base.metric, self.partition, None)
            instr.consumed.add(attrs)
            if self.error_type is not None:
                attrs = self._tel._metric_attrs(self._base.metric, self.partition, self.error_type)
            instr.process_duration.record(elapsed, attrs)
