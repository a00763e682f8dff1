"""The broker-version matrix (issue 43): ``$KRESILIENT_KAFKA_VERSION`` picks the Kafka release
of the session clusters and of every ``KafkaCluster`` started without ``version=``, and the
suite's clusters really run it.

.ci/test runs the ``broker_smoke`` subset a second time with ``KRESILIENT_KAFKA_VERSION`` set to
the newest Kafka 4.x; this file is in that subset, so each run checks the brokers it ran on.
"""

from __future__ import annotations

import re

import pytest

from kresilient.pytest_plugin import KAFKA_VERSION_ENV, session_kafka_version
from kresilient.testing import KAFKA_VERSION, KafkaCluster


def test_session_version_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KAFKA_VERSION_ENV, " 4.4.0 ")
    assert session_kafka_version() == "4.4.0" != KAFKA_VERSION
    # Negative controls: unset or empty leaves the harness default.
    monkeypatch.setenv(KAFKA_VERSION_ENV, "")
    assert session_kafka_version() == KAFKA_VERSION
    monkeypatch.delenv(KAFKA_VERSION_ENV)
    assert session_kafka_version() == KAFKA_VERSION


def test_a_cluster_given_no_version_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 5 D10: a test's own ``KafkaCluster()`` (~16 files start one) runs the matrix's
    release too, not only the session clusters; ``version=`` given wins. Not started: the
    version is resolved at construction (the session test below checks the JVMs)."""
    monkeypatch.setenv(KAFKA_VERSION_ENV, " 4.4.0 ")
    assert KafkaCluster().version == "4.4.0" != KAFKA_VERSION
    assert KafkaCluster(version="4.2.2").version == "4.2.2"  # an explicit version wins
    # Negative controls: unset or empty leaves the harness default.
    monkeypatch.setenv(KAFKA_VERSION_ENV, "")
    assert KafkaCluster().version == KAFKA_VERSION
    monkeypatch.delenv(KAFKA_VERSION_ENV)
    assert KafkaCluster().version == KAFKA_VERSION


@pytest.mark.broker_smoke
def test_the_session_cluster_runs_the_version_asked_for(kafka_cluster: KafkaCluster) -> None:
    """Every broker's own start-up line names the release: the variable reached the JVMs,
    not only the fixture's bookkeeping."""
    if kafka_cluster.external:
        pytest.skip("an external cluster's brokers are not started here")
    expected = session_kafka_version()
    assert kafka_cluster.version == expected
    for node_id in kafka_cluster.node_ids:
        started = set(re.findall(r"Kafka version: (\S+)", kafka_cluster.logs(node_id)))
        assert started == {expected}, f"node {node_id} logged Kafka version(s) {started}"
