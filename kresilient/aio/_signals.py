"""SIGTERM/SIGINT on the event loop for the asyncio consumers (both run() paths share it)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable
from typing import Any


def install_loop_signals(
    loop: asyncio.AbstractEventLoop,
    on_signal: Callable[[signal.Signals], None],
    previous: dict[signal.Signals, Any],
) -> list[signal.Signals]:
    """Route SIGTERM and SIGINT to ``on_signal`` on ``loop`` (main thread only); the handlers
    they replace are kept in ``previous`` for :func:`restore_loop_signals`."""
    if threading.current_thread() is not threading.main_thread():
        return []
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        before = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append(sig)
        previous[sig] = before
    return installed


def restore_loop_signals(
    loop: asyncio.AbstractEventLoop,
    signals: list[signal.Signals],
    previous: dict[signal.Signals, Any],
) -> None:
    """Undo :func:`install_loop_signals`. remove_signal_handler resets to SIG_DFL: what was
    there before run() is put back (e.g. the sync producer's SIGTERM safety net)."""
    for sig in signals:
        loop.remove_signal_handler(sig)
        before = previous.pop(sig, None)
        if before is not None:
            with contextlib.suppress(ValueError, TypeError, OSError):
                signal.signal(sig, before)
