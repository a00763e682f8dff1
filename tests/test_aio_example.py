"""examples/asyncio_service.py runs as written: results produced, poison dead-lettered,
SIGTERM finishes cleanly with everything committed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _producer_helpers import read_back
from test_consumer_integration import TopicFactory, committed, ends, produce, with_dlq

from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "asyncio_service.py"


def test_asyncio_service_example_enriches_dead_letters_and_stops_on_sigterm(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    source, dlq = with_dlq(topic_factory, partitions=3)
    target = topic_factory(partitions=3)
    orders = [
        (b"%d" % i, json.dumps({"id": i} if i % 50 == 3 else {"id": i, "amount": i}).encode())
        for i in range(300)
    ]
    produce(bootstrap, source, [(k, v, None, None) for k, v in orders])
    log = tmp_path / "service.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "--bootstrap",
                bootstrap,
                "--source",
                source,
                "--target",
                target,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while sum(ends(bootstrap, target).values()) < 294:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        # every result is written: stop it the way an orchestrator does; the shutdown must
        # commit everything (group "orders-enricher", set by the example)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "handled 294 records" in output
    results = [json.loads(m.value() or b"") for m in read_back(bootstrap, target)]
    assert sorted(r["id"] for r in results) == [i for i in range(300) if i % 50 != 3]
    assert all(r["amount_with_tax"] == round(r["amount"] * 1.2, 2) for r in results)
    dead = read_back(bootstrap, dlq)
    assert sorted(m.value() for m in dead) == sorted(v for _, v in orders if b"amount" not in v)
    high = ends(bootstrap, source)
    assert committed(bootstrap, "orders-enricher", source, high) == high
