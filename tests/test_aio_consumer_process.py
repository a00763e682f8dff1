"""AsyncResilientConsumer in a process SIGKILLed mid-stream and restarted (issue 14, acc. 3).

The worker is tests/test_aio_consumer_worker.py; the second one is stopped by SIGTERM, which
must finish, commit everything and exit 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import IO

import pytest
from test_consumer_integration import TopicFactory, committed, ends, produce, wait_for, with_dlq

from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("test_aio_consumer_worker.py")


def _lines(path: Path) -> list[tuple[int, int, int]]:
    """``(partition, offset, id)`` per complete line of a worker's output file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_bytes().split(b"\n")[:-1]:  # a SIGKILL never splits a write(2)
        p, o, v = line.split(b" ")
        out.append((int(p), int(o), int(v)))
    return out


def _worker(bootstrap: str, topic: str, group: str, out: Path, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as sink:  # the child keeps its own copy of the descriptor
        return _spawn(bootstrap, topic, group, out, sink)


def _spawn(
    bootstrap: str, topic: str, group: str, out: Path, sink: IO[str]
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--out",
            str(out),
            "--sleep",
            "0.0003",
            "--max-concurrency",
            "3",
        ],
        stdout=sink,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_consumer_process_sigkilled_mid_stream_then_restarted_skips_nothing(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=3)
    n = 30_000
    produce(bootstrap, topic, [(b"%d" % i, b"%d" % i, None, None) for i in range(n)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    first_out, second_out = tmp_path / "first.txt", tmp_path / "second.txt"

    first = _worker(bootstrap, topic, group, first_out, tmp_path / "first.log")
    try:
        wait_for(
            lambda: first_out.exists() and first_out.read_bytes().count(b"\n") >= 10_000,
            120,
            "the first worker to progress",
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert first.returncode == -signal.SIGKILL
    before = _lines(first_out)
    assert len(before) < n, "the first worker finished before it was killed"
    at_kill = committed(bootstrap, group, topic, range(3))
    assert any(o > 0 for o in at_kill.values()), "nothing was committed before the kill"
    # never committed past what the killed process had handled
    for p in range(3):
        handled = sorted(o for q, o, _ in before if q == p)
        assert at_kill[p] <= (handled[-1] + 1 if handled else 0), (p, at_kill[p])
        assert handled == list(range(len(handled)))  # in order, none skipped

    second = _worker(bootstrap, topic, group, second_out, tmp_path / "second.log")
    try:
        wait_for(
            lambda: (
                {v for _, _, v in before} | {v for _, _, v in _lines(second_out)} >= set(range(n))
            ),
            240,
            "the restarted worker to finish",
        )
    finally:
        second.send_signal(signal.SIGTERM)  # graceful: finish, commit, leave
        second.wait(timeout=60)
    assert second.returncode == 0, (tmp_path / "second.log").read_text()[-2000:]
    after = _lines(second_out)
    ids = [v for _, _, v in before + after]
    assert set(ids) == set(range(n))  # at least once, none skipped
    high = ends(bootstrap, topic)
    for p in range(3):
        resumed = [o for q, o, _ in after if q == p]
        if resumed:  # the restart resumes exactly at the committed offset
            assert min(resumed) == max(at_kill[p], 0), (p, min(resumed), at_kill)
    duplicates = {(p, o) for p, o, _ in before} & {(p, o) for p, o, _ in after}
    in_flight = {(p, o) for p, o, _ in before if o >= at_kill[p]}
    assert duplicates == in_flight  # only the killed process's uncommitted work is redone
    assert committed(bootstrap, group, topic, high) == high  # SIGTERM committed everything
    print(f"{len(before)} handled before SIGKILL, {len(duplicates)} re-handled after it")
