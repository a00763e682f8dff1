"""Shared helpers of the chaos tests: bring stopped nodes back."""

from __future__ import annotations

import threading

from kresilient.errors import ClusterError
from kresilient.testing import KafkaCluster


def start_side_by_side(cluster: KafkaCluster, nodes: list[int], *, timeout: float = 90.0) -> bool:
    """Start stopped ``nodes`` at the same time (a combined KRaft node alone has no controller
    quorum, and one wait instead of one per node); True when every start returned.

    ``KafkaCluster.start`` checks every node while it waits, so a sibling caught between
    "expected up" and its new process can make one call raise although the node it started
    runs; a caller seeing False lets ``heal`` start whatever is still down."""
    failed: list[BaseException] = []

    def start(node: int) -> None:
        try:
            cluster.start(node, timeout=timeout)
        except ClusterError as exc:
            failed.append(exc)

    starters = [threading.Thread(target=start, args=(n,)) for n in nodes]
    for t in starters:
        t.start()
    for t in starters:
        t.join(timeout + 20)
    return not failed
