"""Kubernetes probes and per-partition lag (issue 17, item 5), over real HTTP on 127.0.0.1.

* a partition held by retries: ``/live`` and ``/ready`` stay 200; the lag gauge names the
  held partition (with its partition attribute) and the other one at 0;
* a hanging handler on one partition: ``/ready`` turns 503 within 2x ``stall_after_s``
  naming it while ``/live`` is still 200; once the loop has not polled for
  ``max.poll.interval.ms`` both are 503;
* the asyncio consumer serves the same probes (one implementation): a handler awaiting past
  ``stall_after_s`` turns ``/ready`` 503 naming its partition, one blocking the event loop
  turns ``/live`` 503; its lag and outage gauges are exported.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
import tenacity
from test_consumer_integration import Runner, TopicFactory, produce, with_dlq
from test_telemetry import Otel

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.consumer._probes import LAG_METRIC, OUTAGE_METRIC, PROGRESS_METRIC
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def wait_for(condition: Any, timeout: float, what: str) -> float:
    """Poll ``condition`` until true; return the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)  # polling a condition, not settling
    return time.monotonic() - start


def test_retry_hold_stays_live_and_ready_and_lag_gauge_names_the_partition(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(
        bootstrap,
        topic,
        [(b"fail", b"x", None, 0)] + [(b"k", b"v", None, p) for p in (0, 1) for _ in range(20)],
    )
    otel = Otel()
    handled: list[int] = []

    def handle(msg: Any) -> None:
        if msg.key() == b"fail":
            raise RuntimeError("downstream down")
        handled.append(msg.partition())

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:10]}"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(100), wait=tenacity.wait_fixed(30)),
        health_port=0,
        stall_after_s=2.0,
        meter_provider=otel.meter_provider,
        install_signal_handlers=False,
        poll_timeout=0.2,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: handled.count(1) == 20 and consumer.health().held_partitions, 60, "hold")
        port = consumer.health_port
        assert port is not None
        # 2x the stall threshold without progress, the held partition (retry due in 30 s) is
        # still not "stalled"
        wait_for(
            lambda: get(port, "/live")[1]["partitions"][f"{topic}[0]"]["since_progress_s"] >= 4,
            30,
            "4 s without progress on the held partition",
        )
        live, ready = get(port, "/live"), get(port, "/ready")
        assert live[0] == 200, live
        assert ready[0] == 200, ready
        parts = ready[1]["partitions"]
        assert parts[f"{topic}[0]"]["lag"] == 21 and parts[f"{topic}[1]"]["lag"] == 0
        lag = {a["messaging.destination.partition.id"]: v for a, v in otel.points(LAG_METRIC)}
        assert lag == {"0": 21, "1": 0}
        progress = {
            a["messaging.destination.partition.id"]: v for a, v in otel.points(PROGRESS_METRIC)
        }
        assert progress["0"] >= 4.0 and progress["1"] == 0.0
        assert get(port, "/nope")[0] == 404
    finally:
        consumer.stop()
        runner.join(60)
    assert runner.error is None
    with pytest.raises(urllib.error.URLError):  # the server is gone with the consumer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2)


def test_hanging_handler_turns_ready_then_live_unhealthy(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(bootstrap, topic, [(b"k", b"v", None, 1) for _ in range(5)])
    release, entered = threading.Event(), threading.Event()
    seen: list[bytes] = []

    def handle(msg: Any) -> None:
        seen.append(msg.key())
        if msg.key() == b"hang":
            entered.set()
            release.wait(60)

    stall = 2.0
    consumer = ResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "max.poll.interval.ms": 8000,
            "session.timeout.ms": 6000,
        },
        [topic],
        handle,
        health_port=0,
        stall_after_s=stall,
        install_signal_handlers=False,
        poll_timeout=0.2,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: len(seen) == 5, 60, "first records")
        port = consumer.health_port
        assert port is not None
        assert get(port, "/ready")[0] == 200 and get(port, "/live")[0] == 200
        produce(bootstrap, topic, [(b"hang", b"v", None, 0)])
        assert entered.wait(30)
        took = wait_for(lambda: get(port, "/ready")[0] == 503, 2 * stall, "/ready 503")
        status, body = get(port, "/ready")
        assert status == 503 and any(f"{topic}[0]" in r for r in body["reasons"]), body
        assert get(port, "/live")[0] == 200  # still within max.poll.interval.ms
        wait_for(lambda: get(port, "/live")[0] == 503, 20, "/live 503")
        status, body = get(port, "/live")
        assert "has not polled" in body["reasons"][0]
        assert get(port, "/ready")[0] == 503
        print(f"/ready turned 503 {took:.2f} s after the threshold-start (stall_after_s={stall})")
    finally:
        release.set()
        consumer.stop()
        runner.join(60)
    assert runner.error is None


def test_aio_consumer_serves_the_same_probes_and_gauges(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """``AsyncResilientConsumer(health_port=0)``: the sync consumer's probes (one
    implementation). A handler awaiting on one partition for longer than ``stall_after_s``
    turns ``/ready`` 503 naming that partition while ``/live`` stays 200 (the loop polls on
    while handlers await); a handler BLOCKING the event loop turns ``/live`` 503 once the
    consumer has not polled for ``max.poll.interval.ms``. The lag and outage gauges are
    exported."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    produce(bootstrap, topic, [(b"k", b"v", None, 1) for _ in range(5)])
    entered, release = threading.Event(), threading.Event()
    blocked, unblock = threading.Event(), threading.Event()
    seen: list[bytes] = []
    otel = Otel()

    async def handle(msg: Any) -> None:
        seen.append(msg.key())
        if msg.key() == b"hang":
            entered.set()
            while not release.is_set():  # awaits: the event loop runs on
                await asyncio.sleep(0.05)
        elif msg.key() == b"block":
            blocked.set()
            unblock.wait(60)  # blocks the event loop: nothing polls

    stall = 2.0
    consumer = AsyncResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "max.poll.interval.ms": 6000,
            "session.timeout.ms": 6000,
        },
        [topic],
        handle,
        health_port=0,
        stall_after_s=stall,
        meter_provider=otel.meter_provider,
        handle_signals=False,
        blocking_warning_s=None,
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(consumer.run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    port: int | None = None
    try:
        wait_for(lambda: len(seen) == 5, 60, "first records")
        port = consumer.health_port
        assert port is not None
        wait_for(lambda: get(port, "/ready")[0] == 200, 30, "/ready 200")
        assert get(port, "/live")[0] == 200
        # partition 0 is empty (no position, no figure yet), partition 1 caught up
        wait_for(lambda: otel.points(LAG_METRIC), 30, "the lag gauge")
        lag = {a["messaging.destination.partition.id"]: v for a, v in otel.points(LAG_METRIC)}
        assert lag == {"1": 0}, lag
        assert [v for _, v in otel.points(OUTAGE_METRIC)] == [0.0]
        produce(bootstrap, topic, [(b"hang", b"v", None, 0)])
        assert entered.wait(30)
        wait_for(lambda: get(port, "/ready")[0] == 503, 2 * stall + 5, "/ready 503")
        status, body = get(port, "/ready")
        assert status == 503, body
        assert any(
            "a handler has been running" in r and f"{topic}[0]" in r for r in body["reasons"]
        ), body
        assert get(port, "/live")[0] == 200  # the loop polls on while the handler awaits
        release.set()
        wait_for(lambda: get(port, "/ready")[0] == 200, 30, "/ready 200 again")
        produce(bootstrap, topic, [(b"block", b"v", None, 1)])
        assert blocked.wait(30)
        wait_for(lambda: get(port, "/live")[0] == 503, 30, "/live 503")
        status, body = get(port, "/live")
        assert "has not polled" in body["reasons"][0], body
    finally:
        release.set()
        unblock.set()
        consumer.stop()
        thread.join(60)
    assert not thread.is_alive() and errors == [], errors
    with pytest.raises(urllib.error.URLError):  # the server is gone with the consumer
        urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2)
