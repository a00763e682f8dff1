"""Helpers of :mod:`kresilient.producer` that are not on the per-message path."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from kresilient.errors import DeliveryError, DeliveryFailure

__all__ = [
    "DRAIN_TIMEOUT",
    "category_counts",
    "compose_delivery_error",
    "drain",
    "fatal_cause",
    "lost_fatal",
    "scrub_error",
    "scrub_exception",
    "weak_callback",
]

#: How long a purge waits for the purged messages' delivery reports.
DRAIN_TIMEOUT: Final = 10.0


def fatal_cause(exc: BaseException | None) -> KafkaException | None:
    """The fatal ``KafkaException`` behind ``exc``, if any.

    A fatal error is raised by confluent-kafka from ``poll()``/``flush()`` as
    ``KafkaException(KafkaError(..., fatal=True))``; when Python callbacks were being served at
    that moment it surfaces as a ``SystemError`` ("... returned a result with an exception
    set") whose ``__cause__`` is that exception (seen with confluent-kafka 2.16 on a real
    cluster). ``produce()`` after a fatal error raises ``_FATAL`` without the fatal flag.
    """
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            err = exc.args[0]
            if err.fatal() or err.code() == KafkaError._FATAL:
                return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def lost_fatal(exc: BaseException | None, fatal_line: str | None) -> KafkaException | None:
    """A fatal error whose exception the binding lost, rebuilt from librdkafka's FATAL log.

    When a Python callback swallows the pending fatal exception, ``poll()``/``flush()`` end
    with ``SystemError: ... returned NULL without setting an exception`` (the binding still
    marked the call as crashed). librdkafka logged the reason under the ``FATAL`` facility.
    """
    if (
        isinstance(exc, SystemError)
        and fatal_line is not None
        and "without setting an exception" in str(exc)
    ):
        return KafkaException(KafkaError(KafkaError._FATAL, fatal_line, fatal=True))
    return None


def scrub_error(err: KafkaError, scrub: Callable[[str], str]) -> KafkaError:
    """``err`` with its text redacted (the same object when there was nothing to redact)."""
    text = err.str()
    clean = scrub(text)
    if clean == text:
        return err
    return KafkaError(
        err.code(),
        clean,
        fatal=err.fatal(),
        retriable=err.retriable(),
        txn_requires_abort=err.txn_requires_abort(),
    )


def scrub_exception(exc: KafkaException, scrub: Callable[[str], str]) -> KafkaException:
    """``exc`` with its ``KafkaError`` text redacted, before it becomes a kresilient error."""
    if not exc.args or not isinstance(exc.args[0], KafkaError):
        text = str(exc)
        clean = scrub(text)
        return exc if clean == text else KafkaException(clean)
    err = exc.args[0]
    clean_err = scrub_error(err, scrub)
    return exc if clean_err is err else KafkaException(clean_err)


def drain(producer: Any) -> int:
    """Purge every queued and in-flight message of a ``confluent_kafka.Producer`` and serve
    their delivery reports.

    Returns how many messages are still unaccounted for after ``DRAIN_TIMEOUT`` (normally 0:
    a purge turns every message into a ``_PURGE_QUEUE``/``_PURGE_INFLIGHT`` report).
    """
    with contextlib.suppress(KafkaException):
        producer.purge(in_queue=True, in_flight=True, blocking=True)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while len(producer) > 0 and time.monotonic() < deadline:
        try:
            producer.poll(0.1)
        except (KafkaException, SystemError):
            continue  # a fatal event or a callback cut short: the reports were queued
    return len(producer)


def weak_callback(target: Any, name: str) -> Callable[..., None]:
    """``target.<name>(*args)`` through a weak reference (``target`` is a ``weakref.proxy``).

    librdkafka keeps its callbacks for the life of the client; a bound method there would
    keep the producer alive (and its ``__del__`` safety net from ever running) as long as
    the C client lives. Once the producer is gone the call does nothing.
    """

    def call(*args: Any) -> None:
        try:
            method = getattr(target, name)
        except ReferenceError:
            return
        method(*args)

    return call


def compose_delivery_error(
    failures: list[DeliveryFailure],
    remaining: int,
    unaccounted: int,
    timeout: float | None,
) -> DeliveryError:
    """One :class:`DeliveryError` for flush()/close(): failures, leftovers, unaccounted."""
    parts = [DeliveryError(failures=failures).message] if failures else []
    if remaining:
        parts.append(
            f"{remaining} message(s) still queued or in flight after flush(timeout={timeout}); "
            "they are not lost: a later flush() or close() reports them"
        )
    if unaccounted:
        parts.append(
            f"{unaccounted} message(s) got no delivery report before the producer instance "
            "was replaced or closed: treat them as failed and possibly persisted"
        )
    return DeliveryError("; ".join(parts), failures=failures)


def category_counts(failures: Iterable[DeliveryFailure]) -> dict[str, int]:
    """How many failures per error category (for one summary log line)."""
    counts: dict[str, int] = {}
    for f in failures:
        name = f.classification.category.name
        counts[name] = counts.get(name, 0) + 1
    return counts
