"""Issue 22 point 1: a producer the application forgets to flush or close loses nothing silently.

Every test here runs the forgetful application in a subprocess (or drops the producer in
process) against the real cluster: each message is delivered, or ONE ``producer_not_closed``
warning gives the exact counts delivered, failed and unaccounted.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import weakref
from typing import Any

import pytest
from _producer_helpers import read_back
from structlog.testing import capture_logs

from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

_CHILD = textwrap.dedent(
    """
    import json, sys, time, structlog
    structlog.configure(processors=[structlog.processors.add_log_level,
                                    structlog.processors.JSONRenderer()])
    from kresilient.producer import ResilientProducer

    bootstrap, topic, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    producer = ResilientProducer({"bootstrap.servers": bootstrap}, exit_timeout=float(sys.argv[4]))
    for i in range(10):
        producer.produce(topic, b"m%d" % i)
    print(json.dumps({"event": "ready"}), flush=True)
    if mode == "raise":
        raise RuntimeError("application bug")
    if mode == "sigterm":
        time.sleep(120)  # the parent sends SIGTERM; it must not wait this out
    """
)


def _run(args: list[str], *, sigterm: bool = False) -> tuple[int, list[dict[str, Any]], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        if sigterm:
            assert proc.stdout is not None
            for line in proc.stdout:  # wait for "ready" (a condition, not a sleep)
                if '"ready"' in line:
                    break
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return proc.returncode, events, err


def _warnings(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "producer_not_closed"]


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["return", "raise", "sigterm"])
def test_forgotten_flush_delivers_every_message_and_warns_once_with_counts(
    kafka_cluster: KafkaCluster, topic: str, mode: str
) -> None:
    code, events, err = _run(
        [kafka_cluster.bootstrap_servers, topic, mode, "30"], sigterm=mode == "sigterm"
    )
    expected_code = {"return": 0, "raise": 1, "sigterm": 128 + signal.SIGTERM}[mode]
    assert code == expected_code, err
    (warning,) = _warnings(events)
    assert warning["level"] == "warning"
    assert warning["produced"] == 10
    assert (warning["delivered"], warning["failed"], warning["unaccounted"]) == (10, 0, 0)
    records = read_back(kafka_cluster.bootstrap_servers, topic)
    assert sorted(m.value() for m in records) == [b"m%d" % i for i in range(10)]
    if mode == "raise":
        assert "application bug" in err


def test_forgotten_flush_to_an_unreachable_cluster_warns_once_with_exact_counts() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, events, err = _run([f"127.0.0.1:{port}", "t", "return", "1"])
    assert code == 0, err
    (warning,) = _warnings(events)
    assert (warning["delivered"], warning["failed"], warning["unaccounted"]) == (0, 10, 0)
    assert warning["by_category"] == {"DELIVERY_TIMEOUT": 10}
    assert "%3|" not in err  # no raw librdkafka line


@pytest.mark.integration
def test_dropped_producer_is_finalised_at_once_and_delivers(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    gc.disable()  # no cycle collector: plain reference counting must be enough
    try:
        with capture_logs() as logs:
            producer = ResilientProducer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
            for i in range(10):
                producer.produce(topic, b"g%d" % i)
            ref = weakref.ref(producer)
            assert sys.getrefcount(producer) == 2  # the local name and the call's argument
            del producer
            assert ref() is None
    finally:
        gc.enable()
    (warning,) = [e for e in logs if e["event"] == "producer_not_closed"]
    assert warning["reason"] == "garbage_collected"
    assert (warning["delivered"], warning["failed"], warning["unaccounted"]) == (10, 0, 0)
    assert len(read_back(kafka_cluster.bootstrap_servers, topic)) == 10


def test_closed_or_flushed_producer_is_not_reported_when_dropped(closed_port: int) -> None:
    with capture_logs() as logs:
        producer = ResilientProducer({"bootstrap.servers": f"127.0.0.1:{closed_port}"})
        producer.close()
        del producer
        other = ResilientProducer({"bootstrap.servers": f"127.0.0.1:{closed_port}"})
        del other  # produced nothing: nothing to say
    assert [e for e in logs if e["event"] == "producer_not_closed"] == []


_BLOCKED = textwrap.dedent(
    """
    import sys
    from kresilient.producer import ResilientProducer

    producer = ResilientProducer({"bootstrap.servers": sys.argv[1]}, exit_timeout=1)
    for i in range(3):
        producer.produce("t", b"m%d" % i)
    print('{"event": "ready"}', flush=True)
    producer.flush()  # blocks: nothing listens; message.timeout.ms is two minutes
    """
)


def test_sigterm_during_a_blocking_flush_exits_and_warns_with_counts(closed_port: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _BLOCKED, f"127.0.0.1:{closed_port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready" in line:
                break
        proc.send_signal(signal.SIGTERM)
        # Without sliced flushes the handler would wait out the 120 s delivery timeout.
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    (warning,) = [line for line in out.splitlines() if "producer_not_closed" in line]
    assert "failed=3" in warning and "delivered=0" in warning and "unaccounted=0" in warning
