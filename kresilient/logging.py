"""``kresilient.logging.configure()``: logs on stderr at a level, for a program without its own
logging set-up.

kresilient logs through structlog and never configures it: structlog's configuration is
process-global and belongs to the application. Unconfigured, structlog prints every level,
DEBUG included, on **stdout**, mixed with the program's own output. A script, a demo or a
small service that has no logging set-up of its own calls this once at start::

    import kresilient.logging

    kresilient.logging.configure()            # INFO and above, on stderr
    # or: kresilient.logging.configure("DEBUG")  every lifecycle and per-message event

It sets structlog's processors (log level, an ISO timestamp, the console renderer without
colours), a filtering wrapper at ``level`` and a logger factory writing to ``stream``.
An application that configures structlog itself (JSON output, the stdlib ``logging``
integration) does not call it. The library never does.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

__all__ = ["configure"]


def _level_number(level: int | str) -> int:
    if isinstance(level, bool):
        raise ValueError(f"level must be a logging level name or number, not {level!r}")
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(str(level).upper())
    if number is None:
        raise ValueError(
            f"unknown log level {level!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    return number


def configure(level: int | str = "INFO", stream: TextIO | None = None) -> None:
    """Send structlog's output (kresilient's and the application's) to ``stream`` at
    ``level`` and above.

    Args:
        level: a level name (``"DEBUG"``, ``"INFO"``, ``"WARNING"``, ...) or number
            (``logging.INFO``); ``ValueError`` for an unknown name.
        stream: where lines go; ``None`` (the default) is ``sys.stderr`` as it is at the
            time of the call, so program output on stdout stays clean.

    Call it first, before creating kresilient clients: a client binds its structlog logger
    when it is made, and a bound logger keeps the configuration of that moment. Replaces any
    structlog configuration made before (structlog's configuration is process-global).
    """
    number = _level_number(level)
    out = sys.stderr if stream is None else stream
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.StackInfoRenderer(),
            structlog.dev.set_exc_info,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
