"""The harness's waits return only when every broker agrees (the preferred-election flake).

`test_preferred_election_returns_leadership_to_first_replica` failed once under load: the
election's answer (and one metadata read) showed the new leader, the test's next read went
to another broker that had not applied it yet. These tests script per-broker views (fakes:
the race cannot be produced on demand) and check that the waits keep polling until every
broker shows the same state.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from kresilient.testing import KafkaCluster
from kresilient.testing._wire import PartitionView

R = (1, 2, 3)


def _script(
    cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch, *rounds: list[int]
) -> list[int]:
    """Each round: the leader each broker reports for partition 0 (last round repeats)."""
    calls: list[int] = []

    def views(_topic: str) -> list[dict[int, PartitionView]]:
        leaders = rounds[min(len(calls), len(rounds) - 1)]
        calls.append(1)
        return [{0: PartitionView(leader, R, R)} for leader in leaders]

    monkeypatch.setattr(cluster, "_views", views)
    return calls


def test_wait_for_leader_waits_for_the_lagging_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = KafkaCluster()
    calls = _script(cluster, monkeypatch, [2, 2, 1], [2, 2, 1], [2, 2, 2])
    assert cluster.wait_for_leader("t", not_on=1, timeout=10) == 2
    assert len(calls) == 3, "returned while broker 3 still named the old leader"


def test_preferred_election_waits_until_every_broker_shows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = KafkaCluster()

    class _Admin:
        def list_topics(self, **_kw: Any) -> Any:
            class _T:
                partitions = {0: None}

            class _M:
                topics = {"t": _T()}

            return _M()

        def elect_leaders(self, *_a: Any) -> Future[dict[Any, Any]]:
            done: Future[dict[Any, Any]] = Future()
            done.set_result({})  # the controller answered: election done
            return done

    monkeypatch.setattr(cluster, "_admin_client", _Admin)
    # Broker 1 applied the election at once, brokers 2 and 3 a few polls later.
    calls = _script(cluster, monkeypatch, [1, 2, 2], [1, 1, 2], [1, 1, 2], [1, 1, 1])
    cluster.elect_preferred_leaders("t", timeout=10)
    assert len(calls) == 4, "returned before every broker showed the preferred leader"
