"""Reach a cluster from a command-line tool: the first metadata request, given up within a
deadline, with ONE line naming each bootstrap host and why it failed.

librdkafka left to itself prints a ``%3|...|FAIL|...`` line per reconnect on stderr and, when
nothing answers, ends with a ``_TRANSPORT`` error naming no host. A client built with
:func:`quiet_client_config` routes its log lines to a silent logger and collects its errors;
:func:`fetch_metadata` turns them into one line ("127.0.0.1:1 (connection refused: nothing
listens on that port)" or "kafka.invalid:9092 (DNS cannot resolve the name)") as soon as
every bootstrap broker is known to be down, at the latest after ``timeout`` seconds. Used by
``kresilient audit`` and ``kresilient dlq inspect/replay``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException

from kresilient.admin import describe_unreachable
from kresilient.errors import KafkaClientError

__all__ = ["QUIET_LOGGER", "ConnectionErrors", "fetch_metadata", "quiet_client_config"]

#: Receives librdkafka's log lines and drops them (the error callback keeps what matters).
QUIET_LOGGER: Final = logging.getLogger("kresilient.cli.librdkafka")
QUIET_LOGGER.addHandler(logging.NullHandler())
QUIET_LOGGER.propagate = False

_TRANSPORT: Final = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._RESOLVE,
        KafkaError._ALL_BROKERS_DOWN,
    }
)
_KEEP: Final = 200  # error strings kept; the hosts repeat


class ConnectionErrors:
    """An ``error_cb`` that keeps librdkafka's error strings and notes "all brokers down";
    ``servers`` is the ``bootstrap.servers`` value the client was given."""

    def __init__(self, servers: str) -> None:
        self.servers = servers
        self.texts: list[str] = []
        self.all_down = False

    def __call__(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.all_down = True
        elif len(self.texts) < _KEEP:
            self.texts.append(str(err.str()))


def quiet_client_config(
    config: Mapping[str, Any], errors: ConnectionErrors, timeout: float
) -> dict[str, Any]:
    """``config`` plus a silent ``logger``, ``errors`` as ``error_cb`` and connection timeouts
    no longer than ``timeout`` (a user's own ``logger``/``error_cb`` are replaced)."""
    ms = max(1000, int(timeout * 1000))
    conf: dict[str, Any] = {
        "socket.connection.setup.timeout.ms": min(ms, 5000),
        "reconnect.backoff.max.ms": 1000,
        "log.connection.close": False,
    }
    conf.update(config)
    conf["logger"] = QUIET_LOGGER
    conf["error_cb"] = errors
    return conf


def fetch_metadata(
    client: Any, errors: ConnectionErrors, timeout: float, topic: str | None = None
) -> Any:
    """``client.list_topics(topic)``, retried in short steps until it answers, every bootstrap
    broker is down, or ``timeout`` seconds passed.

    ``client`` is a Consumer or AdminClient built with :func:`quiet_client_config` (and not
    yet assigned partitions: ``poll(0)`` serves its error callback). Raises
    :class:`~kresilient.errors.KafkaClientError` whose ``message`` is one line naming each
    host and the reason.
    """
    deadline = time.monotonic() + timeout
    while True:
        step = max(0.1, min(1.0, deadline - time.monotonic()))
        try:
            return client.list_topics(topic=topic, timeout=step)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not isinstance(err, KafkaError) or err.code() not in _TRANSPORT:
                raise KafkaClientError(
                    str(err.str() if isinstance(err, KafkaError) else exc), code=_code(err)
                ) from None
            client.poll(0)  # serves error_cb: the per-host reasons, "all brokers down"
            if errors.all_down or time.monotonic() >= deadline:
                raise KafkaClientError(
                    describe_unreachable(errors.servers, errors.texts),
                    code=err.code(),
                    name=err.name(),
                ) from None


def _code(err: object) -> int | None:
    return err.code() if isinstance(err, KafkaError) else None
