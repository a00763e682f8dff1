"""Trace-context propagation through Kafka headers (part of :mod:`kresilient.telemetry`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import Getter, TextMapPropagator

__all__ = [
    "NO_PROPAGATION",
    "HeaderValue",
    "Headers",
    "MessageLike",
    "extract_context",
    "fields",
    "inject_headers",
    "merge_carrier",
]

NO_PROPAGATION: TextMapPropagator = CompositePropagator([])
"""A propagator that writes and reads nothing.

``Telemetry(propagator=NO_PROPAGATION)`` (or ``ResilientProducer(..., propagator=...)``) sends
headers byte for byte as given: for a producer that copies records whose trace context must
stay the original one, e.g. a dead-letter producer. Spans are still recorded.
"""

HeaderValue = bytes | str | None


Headers = Sequence[tuple[str, HeaderValue]] | Mapping[str, HeaderValue] | None
"""Kafka headers as confluent-kafka accepts them: a list of ``(key, value)`` or a dict."""


class MessageLike(Protocol):
    """The part of ``confluent_kafka.Message`` telemetry reads."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | str | None: ...
    def value(self) -> bytes | str | None: ...
    def headers(
        self,
    ) -> Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None: ...


class _DictGetter(Getter[dict[str, str]]):
    """Reads a ``{lower-case key: str}`` carrier built from Kafka headers."""

    def get(self, carrier: dict[str, str], key: str) -> list[str] | None:
        value = carrier.get(key.lower())
        return None if value is None else [value]

    def keys(self, carrier: dict[str, str]) -> list[str]:
        return list(carrier)


_GETTER = _DictGetter()


_FIELDS_CACHE: dict[int, tuple[TextMapPropagator, frozenset[str]]] = {}


def fields(propagator: TextMapPropagator) -> frozenset[str]:
    """Lower-case header names *propagator* reads/writes (cached per propagator object)."""
    hit = _FIELDS_CACHE.get(id(propagator))
    if hit is not None and hit[0] is propagator:
        return hit[1]
    names = frozenset(f.lower() for f in propagator.fields)
    _FIELDS_CACHE[id(propagator)] = (propagator, names)
    return names


def _items(headers: Headers) -> Iterable[tuple[str, HeaderValue]]:
    if headers is None:
        return ()
    if isinstance(headers, Mapping):
        return headers.items()
    return headers


def _decode(value: object) -> str | None:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def inject_headers(
    headers: Headers,
    *,
    context: Context | None = None,
    propagator: TextMapPropagator | None = None,
) -> list[tuple[str, HeaderValue]]:
    """Return a NEW header list with the trace context of *context* (default: current) injected.

    Existing headers the propagator owns (``traceparent``, ``tracestate``, ``baggage`` ... in any
    letter case) are replaced, so re-producing a consumed record (e.g. to a dead-letter topic)
    never carries two parents. The caller's *headers* are never modified. Values are ``bytes``.
    """
    prop = propagator or propagate.get_global_textmap()
    carrier: dict[str, str] = {}
    prop.inject(carrier, context=context)
    return merge_carrier(headers, carrier, prop)


def merge_carrier(
    headers: Headers, carrier: dict[str, str], prop: TextMapPropagator
) -> list[tuple[str, HeaderValue]]:
    """A new header list: *headers* without the fields *prop* owns, then *carrier* (as bytes)."""
    if not carrier and headers is None:
        return []
    owned = fields(prop) | {k.lower() for k in carrier}
    out: list[tuple[str, HeaderValue]] = [
        (k, v) for k, v in _items(headers) if not (isinstance(k, str) and k.lower() in owned)
    ]
    out.extend((k, v.encode("utf-8")) for k, v in carrier.items())
    return out


def extract_context(
    headers: Headers,
    *,
    context: Context | None = None,
    propagator: TextMapPropagator | None = None,
) -> Context:
    """Extract the trace context from Kafka *headers* (bytes, str or None values tolerated).

    Malformed or missing headers yield *context* (default: the current context) unchanged. If a
    header repeats, the last value wins (Java ``Headers.lastHeader`` semantics).
    """
    prop = propagator or propagate.get_global_textmap()
    wanted = fields(prop)
    carrier: dict[str, str] = {}
    for item in _items(headers):
        try:
            k, v = item
        except (TypeError, ValueError):
            continue
        if isinstance(k, str) and k.lower() in wanted:
            text = _decode(v)
            if text is not None:
                carrier[k.lower()] = text
    if not carrier:
        return context if context is not None else otel_context.get_current()
    return prop.extract(carrier, context=context, getter=_GETTER)
