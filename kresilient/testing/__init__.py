"""A real Apache Kafka cluster on loopback, for tests and demos.

:class:`KafkaCluster` starts N combined broker+controller KRaft nodes of real Apache Kafka
(default 3, version :data:`KAFKA_VERSION`) on 127.0.0.1 with free ports and fresh data
directories. The broker jars are resolved by Maven on first use and cached per version.
It has chaos controls (kill, graceful stop, restart, freeze/thaw, preferred election) so
tests can prove behaviour across real leader elections::

    from kresilient.testing._cluster import KafkaCluster

    with KafkaCluster() as cluster:
        cluster.create_topic("orders", partitions=3)
        leader = cluster.leader("orders", 0)
        cluster.kill(leader)               # SIGKILL: a crash
        cluster.start(leader)              # same data, rejoins the ISR
        cluster.wait_for_isr("orders", 0)

With ``KRESILIENT_BOOTSTRAP_SERVERS`` set, the cluster object wraps that existing cluster
instead; chaos operations then raise :class:`ChaosNotSupportedError`.

Every process is started by the cluster and stopped by pid in :meth:`KafkaCluster.close`,
which also runs at interpreter exit; on Linux the brokers also receive SIGKILL when the
thread that started them dies (``PR_SET_PDEATHSIG``), so none outlives a killed test run.
"""

from __future__ import annotations

from kresilient.testing._cluster import *  # noqa: F403
from kresilient.testing._cluster import __all__ as __all__
