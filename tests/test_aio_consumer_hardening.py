"""AsyncResilientConsumer hardening (issue 37 #8, the LogBridge suspicion), real cluster.

The second-signal interruption is checked for both consumers by the same test in
tests/test_aio_consumer_parity.py; here what only the asyncio consumer can do: a handler that
ignores its cancellation holds the shutdown, and a third signal aborts it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog
from confluent_kafka import Message
from test_aio_consumer_parity import _Worker
from test_consumer_integration import TopicFactory, committed, produce, with_dlq

from kresilient.aio import AsyncResilientConsumer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


@pytest.mark.timeout(400)
@pytest.mark.parametrize("third_signal", [True, False], ids=["aborted", "control"])
def test_third_signal_aborts_a_shutdown_held_by_a_handler_that_ignores_cancellation(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, third_signal: bool
) -> None:
    """Real SIGINTs to a consumer process (commits only at close) whose handler hangs on
    offset 1 and ignores the cancellation a 2nd signal sends it (``deaf``), so the shutdown
    waits for it (shutdown_timeout 600 s). The 3rd signal aborts the shutdown: no final
    commit (nothing committed), no close, ``shutdown_aborted`` and no ``consumer_closed`` in
    the log, run() raises KeyboardInterrupt (issue 37 #8; on c15a167 every signal only called
    stop()). Control: the same run whose handler obeys the 2nd signal (``plain``): the
    shutdown commits offset 1 (offset 0 handled) and closes, so the abort is what skipped
    the commit."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    group = f"g-{uuid.uuid4().hex[:10]}"
    produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(3)])
    worker = _Worker(
        "--kind", "aio", "--bootstrap", bootstrap, "--topic", topic, "--group", group,
        "--out", str(tmp_path / "out"), "--mode", "deaf" if third_signal else "plain",
        "--commit-interval-ms", "600000",
    )  # fmt: skip
    worker.read_until("stuck", 120)
    worker.proc.send_signal(signal.SIGINT)
    worker.read_until("stopping", 60)
    worker.proc.send_signal(signal.SIGINT)
    if third_signal:
        worker.read_until("deaf", 60)  # it ignored the cancellation: the shutdown waits on
        worker.proc.send_signal(signal.SIGINT)
    code = worker.finish(120)
    text = worker.text
    assert code == 3 and "interrupted" in text, text
    assert "handlers_interrupted" in text, text
    if third_signal:
        assert "shutdown_aborted" in text and "consumer_closed" not in text, text
        assert committed(bootstrap, group, topic, [0]) == {0: -1001}, text
    else:
        assert "shutdown_aborted" not in text and "consumer_closed" in text, text
        assert committed(bootstrap, group, topic, [0]) == {0: 1}, text


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
