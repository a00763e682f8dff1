"""A spooled producer process SIGKILLed mid-stream, restarted: nothing it accepted is lost.

Issue 20 acceptance 1. The child produces 200,000 keyed messages and prints a watermark every
1,000 (in ``"os"`` mode a returned ``produce()`` is stored; in ``"group"`` mode the child calls
``flush(0)`` first, which stores the batch). The test SIGKILLs it once the watermark passed
60,000, restarts it on the same spool file (it recovers, then produces 1,000 new messages)
and reads the topic back:

* every message up to the last watermark is there, and the indices present are exactly a
  prefix 0..m of the stream (the spool stores in order and re-sends all it holds);
* every copy after the first of an index carries ``kresilient.possible.duplicate: true``;
* per key, the first copies come in produce order, and recovered messages come before the
  restarted process's new ones;
* a consumer using :class:`~kresilient.dedupe.Deduplicator` processes each index once.

Run as a script, this file is the child (``python test_spool_process.py child ...``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

N = 200_000
KEYS = 50
NEW = 1_000
KILL_AFTER = 60_000


def _key(i: int) -> bytes:
    return b"k%02d" % (i % KEYS)


def _child(
    bootstrap: str, topic: str, spool_path: str, durability: str, start: int, n: int
) -> None:
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from kresilient.producer import ResilientProducer, Spool

    spool = Spool(spool_path, durability=durability)  # type: ignore[arg-type]
    producer = ResilientProducer({"bootstrap.servers": bootstrap}, spool=spool)
    print("recovered", producer._spooler.recovered if producer._spooler else -1, flush=True)
    for i in range(start, start + n):
        producer.produce(topic, b"%07d" % i + b"|" + b"v" * 92, key=_key(i))
        if (i + 1) % 1000 == 0:
            if durability == "group":
                producer.flush(0)  # stores the batch: everything up to i is on disk
            print("stored", i, flush=True)
    result = producer.flush(120)
    assert result is not None and result.complete, result
    producer.close()
    print("done", flush=True)


def _run_child(
    bootstrap: str, topic: str, spool: Path, durability: str, start: int, n: int
) -> list[str]:
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "child",
            bootstrap,
            topic,
            str(spool),
            durability,
            str(start),
            str(n),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.parametrize("durability", ["os", "group"])
def test_sigkilled_spooled_producer_loses_nothing_it_accepted(
    kafka_cluster, topic_factory, tmp_path: Path, durability: str
) -> None:
    from _producer_helpers import header_dict, read_back

    from kresilient.dedupe import Deduplicator

    topic = topic_factory(partitions=6)
    bootstrap = kafka_cluster.bootstrap_servers
    spool = tmp_path / "spool.db"
    err_path = tmp_path / "child1.err"
    with (
        err_path.open("w") as err,
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "child",
                bootstrap,
                topic,
                str(spool),
                durability,
                "0",
                str(N),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        watermark = -1
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            if line.startswith("stored "):
                watermark = int(line.split()[1])
                if watermark >= KILL_AFTER:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            assert time.monotonic() < deadline, "child too slow"
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err_path.read_text()[-3000:]
    assert watermark < N - 1  # killed mid-way, not after the end

    out = _run_child(bootstrap, topic, spool, durability, N, NEW)
    recovered = next(int(line.split()[1]) for line in out if line.startswith("recovered "))
    assert "done" in out
    assert recovered > 0  # the kill left unacknowledged messages (negative control: real)

    records = read_back(bootstrap, topic)
    first: dict[int, int] = {}
    copies: dict[int, int] = defaultdict(int)
    per_partition: dict[int, list[int]] = defaultdict(list)
    unmarked_dupes = 0
    ids: dict[int, bytes] = {}
    for msg in records:
        i = int(msg.value()[:7])
        h = header_dict(msg)
        ident = h.get("kresilient.message.id")
        assert ident is not None
        assert ids.setdefault(i, ident) == ident  # one stable id per message
        copies[i] += 1
        if copies[i] > 1 and h.get("kresilient.possible.duplicate") != b"true":
            unmarked_dupes += 1
        if copies[i] == 1:
            per_partition[msg.partition()].append(i)
        first.setdefault(i, 1)
    old = sorted(i for i in first if i < N)
    m = old[-1]
    assert m >= watermark
    assert old == list(range(m + 1)), "a gap: a stored message is missing"
    assert all(N + j in first for j in range(NEW))
    assert unmarked_dupes == 0
    duplicates = sum(c - 1 for c in copies.values())
    for part, seq in per_partition.items():
        by_key: dict[bytes, list[int]] = defaultdict(list)
        for i in seq:
            by_key[_key(i)].append(i)
        for key, order in by_key.items():
            assert order == sorted(order), f"partition {part} key {key!r} out of order"

    dedupe = Deduplicator(window=100_000)
    processed: dict[int, int] = defaultdict(int)
    for msg in records:
        if dedupe.is_duplicate(msg):
            continue
        processed[int(msg.value()[:7])] += 1
        dedupe.processed(msg)
    assert set(processed) == set(first)
    assert max(processed.values()) == 1
    assert dedupe.dropped == duplicates
    print(
        f"{durability}: watermark {watermark}, in topic {m + 1}, recovered {recovered}, "
        f"duplicates {duplicates}"
    )


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "child":
    _child(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
