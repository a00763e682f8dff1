"""A consumer pointed at nothing (issue 22 point 2): one line naming the host and the reason,
at most 5 log lines in the first 10 s, no raw librdkafka line on stderr.

Each case runs in a subprocess (librdkafka writes to the process's stderr when no ``logger``
is configured, which is what 9c6e9f3 did: ~200 ``%3|...|FAIL|...`` lines in 10 s).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from kresilient.consumer import ResilientConsumer
    from kresilient.deadletter import DeadLetterPolicy

    servers, mode = sys.argv[1], sys.argv[2]
    kwargs = {"install_signal_handlers": False}
    if mode == "no-dlq":
        kwargs["dead_letter"] = None
    c = ResilientConsumer({"bootstrap.servers": servers, "group.id": "g"}, ["orders"], print,
                          **kwargs)
    threading.Timer(10.0, c.stop).start()  # a service would run until SIGTERM
    try:
        c.run()
    except Exception as exc:
        print("RAISED", type(exc).__name__, exc, file=sys.stderr)
    """
)

CASES = [
    ("127.0.0.1:1", "refused"),  # nothing listens on port 1
    ("kafka.invalid:9092", "DNS"),  # .invalid never resolves (RFC 2606)
]


def _run(servers: str, mode: str) -> tuple[list[str], list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, servers, mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout.splitlines(), proc.stderr.splitlines()


@pytest.mark.parametrize(("servers", "reason"), CASES)
def test_unreachable_cluster_at_start_is_one_line_naming_host_and_reason(
    servers: str, reason: str
) -> None:
    """With the default dead-letter policy the start checks the topics: it gives up after
    10 s with an error naming the host and the reason."""
    out, err = _run(servers, "default")
    raw = [line for line in err if line.startswith("%")]
    assert raw == [], raw[:5]  # no raw librdkafka line on stderr
    logs = [line for line in out if line.strip()]
    assert len(logs) <= 5, logs
    warnings = [line for line in logs if "kafka_unreachable" in line]
    assert len(warnings) == 1 and servers in warnings[0] and reason in warnings[0], logs
    raised = [line for line in err if line.startswith("RAISED")]
    words = {"refused": "connection refused", "DNS": "name not resolved (DNS)"}[reason]
    assert len(raised) == 1 and f"{servers}: {words}" in raised[0], err
    # the consumer's own text: it gave up (no "retry", no producer wording)
    assert "the consumer did not start: nothing was consumed or committed" in raised[0], err
    assert "idempotence" not in raised[0] and "BACKOFF_AND_RETRY" not in raised[0], err


@pytest.mark.parametrize(("servers", "reason"), CASES)
def test_unreachable_cluster_while_running_is_one_warning_not_a_flood(
    servers: str, reason: str
) -> None:
    """Without a dead-letter topic nothing is checked at start: the loop runs for 10 s."""
    out, err = _run(servers, "no-dlq")
    raw = [line for line in err if line.startswith("%")]
    assert raw == [], raw[:5]
    logs = [line for line in out if line.strip()]
    # consumer_created, consumer_started, kafka_unreachable; then stopping/closed at 10 s
    first_10s = [line for line in logs if "consumer_stopping" not in line
                 and "consumer_closed" not in line]  # fmt: skip
    assert len(first_10s) <= 5, logs
    warnings = [line for line in logs if "kafka_unreachable" in line]
    assert len(warnings) == 1 and servers in warnings[0] and reason in warnings[0], logs
    assert not [line for line in err if line.startswith("RAISED")], err
