"""Per-message state of :mod:`kresilient.telemetry`: send tokens, per-topic attribute bases and
the context variable naming the current process scope.

This module knows nothing of :class:`~kresilient.telemetry.Telemetry` (the process scope itself
lives beside it in ``_telemetry.py``), so the two never import each other.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from typing import Any, Protocol

from opentelemetry.trace import Span


class _SendToken:
    """Opaque per-message state between :meth:`Telemetry.producer_send` and the delivery report."""

    __slots__ = ("attrs", "span", "start")

    def __init__(self, span: Span | None, start: float, attrs: dict[str, Any]) -> None:
        self.span = span
        self.start = start
        self.attrs = attrs  # base metric attributes (system, destination, operation name)


_NULL_SCOPE: AbstractContextManager[None] = nullcontext(None)


class _Scope(Protocol):
    """What :meth:`Telemetry.set_error` and friends need of the current process scope."""

    span: Span | None
    error_type: str | None

    @property
    def topic(self) -> str: ...

    def fail(self, exc: BaseException, classification: Any = None) -> None: ...


_CURRENT: ContextVar[_Scope | None] = ContextVar("kresilient_process_scope", default=None)


class _Bases:
    """Per-topic constant parts of span names and attribute dicts (built once per topic)."""

    __slots__ = ("metric", "name", "span")

    def __init__(self, name: str, span: dict[str, Any], metric: dict[str, Any]) -> None:
        self.name = name
        self.span = span
        self.metric = metric
