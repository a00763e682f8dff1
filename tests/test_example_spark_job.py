"""examples/spark_job.py runs as written and ends cleanly (issue 22 point 8).

The example used to end with raw librdkafka ``%3|...|Disconnected`` lines on stderr; every
librdkafka line of the sink now goes through the sink's (redacting) log bridge.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "spark_job.py"


@pytest.mark.streaming_source  # the example's second half streams
def test_spark_job_example_runs_and_prints_no_raw_librdkafka_line(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    # The example writes to orders / orders.dlq of the cluster it is given (a user creates
    # them with `kresilient topic create orders --dlq`); the README test removes them too.
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    existing = set(admin.list_topics(timeout=30).topics)
    for name, parts in (("orders", 3), ("orders.dlq", 1)):
        if name not in existing:
            kafka_cluster.create_topic(name, parts, 3, {"min.insync.replicas": 2})
    try:
        proc = _run(kafka_cluster, tmp_path)
    finally:
        for name in ("orders", "orders.dlq"):
            kafka_cluster.delete_topic(name)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"batch: \d+ rows written, 1 dead-lettered", proc.stdout), proc.stdout
    # The example stops its query once a micro-batch has written rows (was: after 10 s).
    assert re.search(r"streaming: micro-batch \d+ wrote [1-9]\d* rows", proc.stdout), proc.stdout
    raw = [line for line in proc.stderr.splitlines() if re.search(r"%\d\|\d+\.\d+\|", line)]
    assert not raw, raw[:5]


def _run(kafka_cluster: KafkaCluster, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_cluster.bootstrap_servers],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # outside the checkout, as a user runs it
        check=False,
    )
