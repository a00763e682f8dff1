"""Issue 22 point 2 (producer): an unreachable cluster gives ONE warning naming each host and
the reason, repeated slowly; at most 5 log lines in the first 10 s; no raw librdkafka line on
stderr; messages that never reached a broker are not "possibly persisted"."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest

_CHILD = textwrap.dedent(
    """
    import sys, time
    from kresilient.producer import ResilientProducer

    producer = ResilientProducer({"bootstrap.servers": sys.argv[1]}, exit_timeout=0)
    for i in range(5):
        producer.produce("orders", b"m%d" % i)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        producer.poll(0.2)
    print("=== 10 s ===", flush=True)
    """
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize(
    ("host", "reason"),
    [(f"127.0.0.1:{_closed_port()}", "refused"), ("no-such-host.invalid:9092", "DNS")],
    ids=["closed-port", "unresolvable-name"],
)
def test_unreachable_cluster_gives_one_warning_naming_host_and_reason(
    host: str, reason: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, host],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first_10s = proc.stdout.split("=== 10 s ===")[0]
    lines = [line for line in first_10s.splitlines() if line.strip()]
    assert len(lines) <= 5, lines
    (warning,) = [line for line in lines if "kafka_unreachable" in line]
    assert host in warning and f"'{reason}'" in warning, warning
    assert "%3|" not in proc.stderr and "%4|" not in proc.stderr and "FAIL" not in proc.stderr
    # negative control: librdkafka did fail to connect (the summary saw the failures)
    assert "1/1 brokers are down" in warning


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
            "(after 0ms in state CONNECT)",
            ("127.0.0.1:1", "refused"),
        ),
        (
            "ssl://127.0.0.1:9093/1: SSL handshake failed: error:0A000086:SSL routines::"
            "certificate verify failed",
            ("127.0.0.1:9093", "TLS"),
        ),
        (
            "[thrd:sasl_ssl://h.invalid:9094/bootstrap]: sasl_ssl://h.invalid:9094/bootstrap: "
            "Failed to resolve 'h.invalid:9094': Name or service not known",
            ("h.invalid:9094", "DNS"),
        ),
        ("Some other librdkafka line", None),
    ],
)
def test_connect_failure_parses_plain_and_protocol_prefixed_broker_names(
    line: str, expected: tuple[str, str] | None
) -> None:
    # A TLS/SASL listener's broker name is "ssl://host:port/id": it was not recognised, so
    # TLS failures (the reason most worth naming) were summarised as nothing.
    from kresilient.producer import connect_failure

    assert connect_failure(line) == expected
