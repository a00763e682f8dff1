"""AsyncResilientConsumer hardening (the LogBridge suspicion of issue 37), real cluster.

Issue 37 #8 (the second signal interrupts the handler in hand, the third aborts a held
shutdown) is checked for both consumers by the same tests in
tests/test_aio_consumer_parity.py.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from typing import Any

import pytest
import structlog
from confluent_kafka import Message

from kresilient.aio import AsyncResilientConsumer

pytestmark = pytest.mark.integration


class _Lines(logging.Logger):
    """The application's ``logger`` in the config: keeps each line it gets."""

    def __init__(self) -> None:
        super().__init__("app-librdkafka")
        self.lines: list[str] = []

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.lines.append(str(msg) % args)


@pytest.mark.asyncio
async def test_librdkafka_log_lines_go_through_the_log_bridge(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """docs/asyncio.md said the asyncio consumer does not feed the LogBridge; it does: with a
    bootstrap server nothing listens on, librdkafka's connection-failure lines reach the
    application's ``logger`` from the config (through the bridge, redacted) and kresilient's
    logger summarises them (``kafka_unreachable``); none is printed raw on stderr
    (``%3|...|FAIL|``, which librdkafka does when no logger is set)."""
    events: list[str] = []

    def capture(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(str(event["event"]))
        raise structlog.DropEvent

    with socket.socket() as probe:  # a port nothing listens on (bound, never listening)
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
        app_logger = _Lines()

        async def handle(_msg: Message) -> None:
            pass

        consumer = AsyncResilientConsumer(
            {
                "bootstrap.servers": dead,
                "group.id": f"g-{uuid.uuid4().hex[:10]}",
                "logger": app_logger,
            },
            ["t"],
            handle,
            handle_signals=False,
            dead_letter=None,
            logger=structlog.wrap_logger(None, processors=[capture]),
        )
        task = asyncio.create_task(consumer.run())
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while not (
                any(dead in line for line in app_logger.lines) and "kafka_unreachable" in events
            ):
                assert asyncio.get_running_loop().time() < deadline, (app_logger.lines, events)
                await asyncio.sleep(0.05)
        finally:
            consumer.stop()
            await asyncio.wait_for(task, 60)
    raw = [line for line in capfd.readouterr().err.splitlines() if dead in line]
    assert raw == []  # every line about the dead server went through the bridge
