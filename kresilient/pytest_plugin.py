"""pytest plugin: a real Kafka cluster as fixtures (registered through ``pytest11``).

Installed with kresilient, so any project's tests get:

- ``kafka_cluster`` (session): a :class:`kresilient.testing.KafkaCluster` of 3 KRaft nodes,
  or the cluster named by ``KRESILIENT_BOOTSTRAP_SERVERS``. Clients connect directly (no
  fault proxy).
- ``kafka_network_cluster`` (session, started on first use): a second 3-node cluster with
  ``network_faults=True`` for ``cluster.network`` faults; skipped when
  ``KRESILIENT_BOOTSTRAP_SERVERS`` is set. Its faults are healed after every test using it.
- ``topic``: a fresh topic name, 1 partition, RF=3, ``min.insync.replicas=2``.
- ``topic_factory``: ``topic_factory(partitions=1, replication_factor=3, config=None)``.
- markers ``integration`` (needs a cluster) and ``chaos`` (kills, stops or freezes nodes;
  skipped, saying why, when the cluster is external).

``KRESILIENT_KAFKA_VERSION`` (e.g. ``4.4.0``) runs both session clusters, and every
:class:`~kresilient.testing.KafkaCluster` a test starts without ``version=``, on that Apache
Kafka release instead of :data:`kresilient.testing.KAFKA_VERSION`, so one suite can be run
against the brokers its users run: ``KRESILIENT_KAFKA_VERSION=4.4.0 pytest``
(:func:`kresilient.testing.default_kafka_version`).

A test that damages the shared cluster must heal it (``kafka_cluster.heal([...])``); the
``chaos`` marker does that after each test as a safety net.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Callable, Iterator, Mapping

import pytest

from kresilient.testing import (
    BOOTSTRAP_ENV,
    KAFKA_VERSION_ENV,
    KafkaCluster,
    default_kafka_version,
)

_counter = itertools.count(1)

__all__ = ["KAFKA_VERSION_ENV", "session_kafka_version"]


def session_kafka_version() -> str:
    """The Kafka release of the session clusters: ``$KRESILIENT_KAFKA_VERSION``, or
    :data:`kresilient.testing.KAFKA_VERSION` when it is unset or empty: the default of every
    :class:`~kresilient.testing.KafkaCluster` (:func:`kresilient.testing.default_kafka_version`).
    """
    return default_kafka_version()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "integration: needs a real Kafka cluster (kresilient.testing.KafkaCluster)"
    )
    config.addinivalue_line(
        "markers",
        "chaos: kills, stops or freezes Kafka nodes; skipped on an external cluster "
        f"(${BOOTSTRAP_ENV})",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("chaos") is not None and os.environ.get(BOOTSTRAP_ENV):
        pytest.skip(
            f"chaos test needs a cluster started by kresilient.testing; {BOOTSTRAP_ENV} "
            "points at an external cluster whose nodes it cannot kill"
        )


@pytest.fixture(scope="session", name="kafka_cluster")
def _kafka_cluster() -> Iterator[KafkaCluster]:
    """A real 3-node KRaft Kafka cluster shared by the test session."""
    cluster = KafkaCluster()
    try:
        cluster.start_cluster()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session", name="kafka_network_cluster")
def _kafka_network_cluster() -> Iterator[KafkaCluster]:
    """A 3-node cluster whose every connection passes through fault proxies."""
    if os.environ.get(BOOTSTRAP_ENV):
        pytest.skip(
            f"network faults need a cluster started by kresilient.testing; {BOOTSTRAP_ENV} "
            "points at an external cluster"
        )
    cluster = KafkaCluster(network_faults=True)
    try:
        cluster.start_cluster()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(autouse=True)
def _heal_after_chaos(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "kafka_network_cluster" in request.fixturenames:
        network_cluster: KafkaCluster = request.getfixturevalue("kafka_network_cluster")
        network_cluster.heal()
    if request.node.get_closest_marker("chaos") is None:
        return
    if "kafka_cluster" not in request.fixturenames:
        return
    cluster: KafkaCluster = request.getfixturevalue("kafka_cluster")
    if cluster.supports_chaos:
        cluster.heal()


TopicFactory = Callable[..., str]


@pytest.fixture(name="topic_factory")
def _topic_factory(kafka_cluster: KafkaCluster, request: pytest.FixtureRequest) -> TopicFactory:
    """Create fresh, uniquely named topics: ``topic_factory(partitions=3)``."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]

    def make(
        partitions: int = 1,
        replication_factor: int = 3,
        config: Mapping[str, str | int | bool] | None = None,
        *,
        name: str | None = None,
    ) -> str:
        topic = name or f"t-{base}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        merged: dict[str, str | int | bool] = {"min.insync.replicas": min(2, replication_factor)}
        merged.update(config or {})
        return kafka_cluster.create_topic(topic, partitions, replication_factor, merged)

    return make


@pytest.fixture(name="topic")
def _topic(topic_factory: TopicFactory) -> str:
    """A fresh topic: 1 partition, replication factor 3, ``min.insync.replicas=2``."""
    return topic_factory()
