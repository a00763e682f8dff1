"""Helpers of :mod:`kresilient.producer` that are not on the per-message path."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from kresilient.errors import DeliveryError, DeliveryFailure

__all__ = [
    "LogBridge",
    "category_counts",
    "compose_delivery_error",
    "fatal_cause",
    "lost_fatal",
    "scrubber",
]

#: librdkafka syslog levels as the binding maps them to ``logging`` levels -> structlog method.
_LEVEL_METHOD: Final = {
    logging.CRITICAL: "critical",
    logging.ERROR: "error",
    logging.WARNING: "warning",
    logging.INFO: "info",
    logging.DEBUG: "debug",
}


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


def scrubber(secret_values: Iterable[str]) -> Callable[[str], str]:
    """A function replacing every secret value of the configuration in a text."""
    secrets = tuple(sorted({s for s in secret_values if s}, key=len, reverse=True))

    def scrub(text: str) -> str:
        for secret in secrets:
            text = text.replace(secret, "[REDACTED]")
        return text

    return scrub


class LogBridge:
    """librdkafka log lines into the client's structlog logger (confluent-kafka ``logger``).

    The binding calls ``logger.log(level, "%s [%s] %s", facility, client_name, message)``
    from ``poll()``. Each line is also offered to the leadership monitor (it recognises
    leadership errors in log text) and to a user-supplied ``logger`` if there was one.
    """

    def __init__(
        self,
        log: Any,
        on_line: Callable[[str], None],
        scrub: Callable[[str], str],
        user_logger: Any = None,
        on_failure: Callable[[Exception], None] | None = None,
    ) -> None:
        self._log = log
        self._on_line = on_line
        self._scrub = scrub
        self._user = user_logger
        self._on_failure = on_failure

    #: The last ``FATAL`` line librdkafka logged (``rd_kafka_set_fatal_error`` always logs
    #: one): the reason of a fatal error whose exception the binding lost.
    fatal_line: str | None = None

    def log(self, level: int, fmt: str, *args: Any) -> None:
        """``logging.Logger.log``-compatible entry point used by confluent-kafka."""
        # Only plain subscripts, comparisons and stores before the try: while a fatal error's
        # exception is pending, the first C call in here fails (see fatal_cause).
        if args and args[0] == "FATAL" and args[2:3]:
            self.fatal_line = args[2]
        try:
            facility = str(args[0]) if args else ""
            text = self._scrub(str(args[2]) if len(args) > 2 else fmt % args)
            self._on_line(text)
            method = _LEVEL_METHOD.get(level, "info")
            getattr(self._log, method)("librdkafka_log", facility=facility, message=text)
            if self._user is not None:
                self._user.log(level, fmt, *args)
        except Exception as exc:  # logging must never break the client
            if self._on_failure is not None:
                self._on_failure(exc)


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
