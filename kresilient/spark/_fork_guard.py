"""Keep the driver's py4j connections alive across ``fork()``.

Why the ``kresilient`` format could vanish mid-program (``DATA_SOURCE_NOT_FOUND``): PySpark's
default py4j mode pins each Python thread to one socket, served in the JVM by one thread, and
Spark finds a Python data source only through that JVM thread's *active* session
(``SparkSession.getActiveSession``; the default session is not consulted). When any thread
forks a child that runs Python before ``exec`` (``subprocess.Popen(preexec_fn=...)``, e.g.
kresilient's test cluster restarting a broker, or ``os.fork()``/multiprocessing), CPython
deletes the other threads' states in the child; their thread-local py4j connections are
garbage-collected there, and ``ClientServerConnection.close()`` calls
``socket.shutdown(SHUT_RDWR)`` on sockets the child shares with the parent. That shuts the
*parent's* connections down: the next call from the driver thread opens a new connection,
served by a new JVM thread with no active session, and ``format("kresilient")`` is not found
(nor anything else that depends on the thread's active session).

:func:`install` makes ``close()`` in a process other than the one that opened the connection
only release the child's own descriptors, never shut down the shared socket.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import Any

_OWNER_PID = "_kresilient_owner_pid"
_lock = threading.Lock()
#: py4j's own ``ClientServerConnection.close`` (set by :func:`install`; tests restore it to
#: show the fault).
original_close: Any = None


def install() -> None:
    """Patch py4j's ``ClientServerConnection`` once per process (idempotent, thread-safe).

    A no-op without py4j's ``clientserver`` module (e.g. Spark Connect clients).
    """
    global original_close
    try:  # py4j has no type information: its modules are Any here
        clientserver: Any = importlib.import_module("py4j.clientserver")
        quiet_close = importlib.import_module("py4j.java_gateway").quiet_close
    except ImportError:  # pragma: no cover - pyspark always ships py4j
        return
    cls: Any = clientserver.ClientServerConnection
    with _lock:
        if original_close is not None:
            return
        original_close = cls.close
        original_init = cls.__init__
        # Connections opened before install() (the session's own) belong to this process.
        default_owner = os.getpid()
        py4j_close = original_close

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            setattr(self, _OWNER_PID, os.getpid())
            original_init(self, *args, **kwargs)

        def close(self: Any, reset: bool = False) -> None:
            if getattr(self, _OWNER_PID, default_owner) == os.getpid():
                py4j_close(self, reset)
                return
            # A forked child: the socket is shared with the parent; shutdown() would cut the
            # parent's connection. Close only this process's descriptors.
            stream, sock = self.stream, self.socket
            self.stream = self.socket = None
            quiet_close(stream)
            quiet_close(sock)

        cls.__init__ = __init__
        cls.close = close
