"""examples/otel_batch_tracing.py runs as written: every message handled, one span per batch
handler call, each linking its messages' send spans, the handler's own span its child."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "otel_batch_tracing.py"
LINE = re.compile(
    r"^process \S+ partition=(\d|\*) messages=(\d+) links_to_send_spans=(\d+) "
    r"children=\['insert invoices'\]$"
)


@pytest.mark.parametrize("per_message", [False, True], ids=["batch-handler", "per-message"])
def test_batch_tracing_example_links_every_message(
    kafka_cluster: KafkaCluster, per_message: bool
) -> None:
    """``--per-message``: a handler with ``trace_spans="call"``, one span per consume()
    result (its partition ``*`` when the result holds several), each message's own span a
    child of it."""
    run = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--bootstrap",
            kafka_cluster.bootstrap_servers,
            "--messages",
            "300",
            *(["--per-message"] if per_message else []),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    batches = [LINE.match(line) for line in lines if line.startswith("process ")]
    assert batches and all(batches), lines
    counts = [(m[1], int(m[2]), int(m[3])) for m in batches if m]
    if not per_message:  # a batch handler's call: one partition's run
        assert {p for p, _, _ in counts} == {"0", "1", "2"}
    assert sum(n for _, n, _ in counts) == 300  # no message handled twice, none missed
    assert len(counts) < 300  # per message too: not one span per message
    assert all(linked == min(n, 128) for _, n, linked in counts)
    assert lines[-1].startswith(f"handled=300 send_spans=300 batch_spans={len(counts)} ")
