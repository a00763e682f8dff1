"""The pytest plugin as a user meets it: fixtures, markers, and the external-cluster seam."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kresilient.testing import BOOTSTRAP_ENV, KafkaCluster

pytestmark = pytest.mark.integration

USER_TESTS = textwrap.dedent(
    """
    import pytest
    from confluent_kafka import Producer

    @pytest.mark.integration
    def test_topic_fixture(kafka_cluster, topic):
        assert kafka_cluster.replicas(topic) and len(kafka_cluster.isr(topic)) == 3
        p = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})
        p.produce(topic, b"x")
        assert p.flush(30) == 0

    def test_factory(topic_factory, kafka_cluster):
        t = topic_factory(partitions=3, config={"retention.ms": 60000})
        assert [kafka_cluster.leader(t, p) >= 0 for p in range(3)] == [True] * 3

    @pytest.mark.chaos
    def test_needs_chaos(kafka_cluster):
        kafka_cluster.kill(1)
    """
)


def test_user_project_against_an_external_cluster(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    # A user's own pytest run: none of this run's pytest options (PYTEST_ADDOPTS could add
    # -x, -p or -k and change the counts asserted below)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")}
    env[BOOTSTRAP_ENV] = kafka_cluster.bootstrap_servers
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "--strict-markers",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed, 1 skipped" in out.stdout, out.stdout
    assert "chaos test needs a cluster started by kresilient.testing" in out.stdout
    # The external cluster was used, and not harmed: node 1 still runs.
    assert kafka_cluster.running(1)
