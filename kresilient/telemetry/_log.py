"""structlog integration: trace/span ids in log events and a recommended production setup.

kresilient never calls :func:`structlog.configure` (that is process-global state owned by the
application). It offers:

- :func:`add_trace_context`, a structlog processor that adds ``trace_id``/``span_id`` of the
  current OpenTelemetry span to every event;
- :func:`trace_fields`, the same ids for an explicit span (used by kresilient's own notable
  events, so they carry ids even when the application did not install the processor);
- :func:`production_config`, keyword arguments for ``structlog.configure`` (JSON lines, level
  filtering by ``make_filtering_bound_logger``, cached loggers).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from opentelemetry import trace
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["add_trace_context", "production_config", "trace_fields"]


def trace_fields(span: trace.Span | None = None) -> dict[str, str]:
    """Return ``{"trace_id": ..., "span_id": ...}`` (lower-case hex) for *span*.

    With ``span=None`` the current span is used. Returns ``{}`` when there is no valid span
    context (no SDK, or outside any span).
    """
    if span is None:
        span = trace.get_current_span()
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return {}
    return {
        "trace_id": trace.format_trace_id(ctx.trace_id),
        "span_id": trace.format_span_id(ctx.span_id),
    }


def add_trace_context(
    _logger: WrappedLogger, _method_name: str, event_dict: EventDict
) -> EventDict:
    """structlog processor: add ``trace_id`` and ``span_id`` of the current span.

    Existing ``trace_id``/``span_id`` keys (bound explicitly) are kept. Nothing is added when
    there is no valid current span.

    Example::

        structlog.configure(
            processors=[..., add_trace_context, structlog.processors.JSONRenderer()]
        )
    """
    if "trace_id" in event_dict:
        return event_dict
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict["trace_id"] = trace.format_trace_id(ctx.trace_id)
        event_dict["span_id"] = trace.format_span_id(ctx.span_id)
    return event_dict


def production_config(
    *, level: int = logging.INFO, stream: TextIO | None = None, json_dumps: Any = None
) -> dict[str, Any]:
    """Keyword arguments for ``structlog.configure(**production_config())``.

    JSON lines to *stream* (default ``sys.stdout``) with ISO timestamps, log level, trace and
    span ids, rendered exceptions; events below *level* cost one method call returning ``None``
    (``make_filtering_bound_logger``). Pass ``json_dumps=orjson.dumps`` together with a bytes
    stream (e.g. ``sys.stdout.buffer``) for the fastest rendering. The returned dict is a value:
    the application decides whether and when to call :func:`structlog.configure` with it.
    """
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_trace_context,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.dict_tracebacks,
    ]
    if json_dumps is None:
        processors.append(structlog.processors.JSONRenderer())
        factory: Any = structlog.WriteLoggerFactory(file=stream or sys.stdout)
    else:
        processors.append(structlog.processors.JSONRenderer(serializer=json_dumps))
        factory = structlog.BytesLoggerFactory(file=stream or sys.stdout.buffer)  # type: ignore[arg-type]
    return {
        "processors": processors,
        "wrapper_class": structlog.make_filtering_bound_logger(level),
        "logger_factory": factory,
        "cache_logger_on_first_use": True,
    }
