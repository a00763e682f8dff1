"""Start broker processes from ONE long-lived thread, so they die with the owning process.

``PR_SET_PDEATHSIG`` is delivered when the *thread* that forked the child exits, not the
process (prctl(2): "the parent thread"). Brokers forked from a short-lived thread (an
executor worker calling ``cluster.start(n)``) were SIGKILLed as soon as that thread ended.
Every fork therefore happens on a daemon launcher thread that lives as long as the process:
the death signal then fires exactly when the owning process dies (SIGKILL included), and
never because some worker thread finished.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

_T = TypeVar("_T")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class _Launcher:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        # Daemon: it must outlive every other thread (atexit handlers still use it) and
        # must not keep the interpreter alive.
        self.thread = threading.Thread(target=self._run, name="kresilient-launcher", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to the caller, never lost
                future.set_exception(exc)

    def call(self, job: Callable[[], _T]) -> _T:
        if threading.current_thread() is self.thread:
            return job()
        future: Future[_T] = Future()
        self._jobs.put((job, future))
        return future.result()


_LAUNCHER: _Launcher | None = None
_LAUNCHER_LOCK = threading.Lock()


def launcher_thread() -> threading.Thread:
    """The thread every broker is forked from (started on first use, per process)."""
    return _launcher().thread


def _launcher() -> _Launcher:
    global _LAUNCHER
    with _LAUNCHER_LOCK:
        # After os.fork() the child has no launcher thread: start its own.
        if _LAUNCHER is None or _LAUNCHER.pid != os.getpid() or not _LAUNCHER.thread.is_alive():
            _LAUNCHER = _Launcher()
        return _LAUNCHER


def popen(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen`` on the launcher thread, the child dying with this process (Linux)."""
    return _launcher().call(lambda: subprocess.Popen(args, preexec_fn=_die_with_parent, **kwargs))
