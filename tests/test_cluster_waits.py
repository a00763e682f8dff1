"""The harness's waits return only when every broker agrees (the preferred-election flake).

`test_preferred_election_returns_leadership_to_first_replica` failed once under load: the
election's answer (and one metadata read) showed the new leader, the test's next read went
to another broker that had not applied it yet. These tests script per-broker views (fakes:
the race cannot be produced on demand) and check that the waits keep polling until every
broker shows the same state.
"""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from kresilient.testing import KafkaCluster
from kresilient.testing._cluster import _Node
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


# ---------------------------------------------------------------- admin requests resent
# CI failed once at the set-up of a secured cluster: the readiness topic's CreateTopics came
# back _DESTROY_BROKER (librdkafka decommissions a broker a metadata response leaves out,
# failing what was queued on it). Such a failure cannot be produced on demand; these fakes
# script the futures and check that the harness sends the (idempotent) request again.


def _failed(code: int) -> Future[None]:
    from confluent_kafka import KafkaError, KafkaException

    future: Future[None] = Future()
    future.set_exception(KafkaException(KafkaError(code)))
    return future


def _ok() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


def _sender(*rounds: list[Future[None]]) -> tuple[Any, list[int]]:
    sent: list[int] = []

    def submit(seconds: float) -> list[Future[None]]:
        assert 0 < seconds <= 20  # one send never waits longer than an attempt
        sent.append(1)
        return rounds[min(len(sent) - 1, len(rounds) - 1)]

    return submit, sent


def test_admin_request_is_resent_after_a_destroyed_broker_handle() -> None:
    from confluent_kafka import KafkaError

    from kresilient.testing._cluster import _admin_request

    submit, sent = _sender([_failed(KafkaError._DESTROY_BROKER)], [_ok()])
    _admin_request("creating topic 't'", submit, 10.0)
    assert len(sent) == 2


def test_topic_that_exists_after_a_resend_counts_as_created() -> None:
    from confluent_kafka import KafkaError

    from kresilient.testing._cluster import _admin_request

    exists = frozenset({KafkaError.TOPIC_ALREADY_EXISTS})
    submit, sent = _sender(
        [_failed(KafkaError._DESTROY_BROKER)], [_failed(KafkaError.TOPIC_ALREADY_EXISTS)]
    )
    _admin_request("creating topic 't'", submit, 10.0, done_after_resend=exists)
    assert len(sent) == 2


def test_topic_that_exists_before_any_resend_is_an_error() -> None:
    from confluent_kafka import KafkaError

    from kresilient.errors import ClusterError
    from kresilient.testing._cluster import _admin_request

    exists = frozenset({KafkaError.TOPIC_ALREADY_EXISTS})
    submit, sent = _sender([_failed(KafkaError.TOPIC_ALREADY_EXISTS)])
    with pytest.raises(ClusterError, match=r"creating topic 't' failed: .*already exists"):
        _admin_request("creating topic 't'", submit, 10.0, done_after_resend=exists)
    assert len(sent) == 1


def test_broker_refusal_is_not_resent() -> None:
    from confluent_kafka import KafkaError

    from kresilient.errors import ClusterError
    from kresilient.testing._cluster import _admin_request

    submit, sent = _sender([_failed(KafkaError.TOPIC_AUTHORIZATION_FAILED)], [_ok()])
    with pytest.raises(ClusterError, match="granting x failed"):
        _admin_request("granting x", submit, 10.0)
    assert len(sent) == 1


def test_resending_stops_at_the_deadline() -> None:
    from confluent_kafka import KafkaError

    from kresilient.errors import ClusterError
    from kresilient.testing._cluster import _admin_request

    submit, sent = _sender([_failed(KafkaError._DESTROY_BROKER)])
    with pytest.raises(ClusterError, match="Broker handle destroyed"):
        _admin_request("creating topic 't'", submit, 0.5)
    assert 1 <= len(sent) <= 5


def test_admin_request_timed_out_on_a_starved_cluster_is_sent_again() -> None:
    from confluent_kafka import KafkaError

    from kresilient.testing._cluster import _admin_request

    for code in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT):
        exists = frozenset({KafkaError.TOPIC_ALREADY_EXISTS})
        # the first send timed out but took effect: the resend finds the topic
        submit, sent = _sender([_failed(code)], [_failed(KafkaError.TOPIC_ALREADY_EXISTS)])
        _admin_request("creating topic 't'", submit, 10.0, done_after_resend=exists)
        assert len(sent) == 2


def test_admin_request_whose_future_never_completes_ends_at_the_deadline() -> None:
    from kresilient.errors import ClusterError
    from kresilient.testing._cluster import _admin_request

    never: Future[None] = Future()
    submit, sent = _sender([never])
    with pytest.raises(ClusterError, match=r"granting x failed: no answer in 0.5 s"):
        _admin_request("granting x", submit, 0.5)
    assert len(sent) >= 1


def test_stop_kills_the_node_once_no_controller_quorum_is_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """stop() of a node that is the last of its quorum: its controlled shutdown could never
    finish (a broker waited stop()'s 60 s and was SIGKILLed anyway), so it is SIGKILLed at
    once. Stand-in processes (``sleep``) record the signal each got. Negative control: while
    the node and another are a majority of three, stop() sends SIGTERM."""
    cluster = KafkaCluster()
    monkeypatch.setattr(cluster._owned.ports, "hold_again", lambda _ports: None)
    for node_id in (1, 2, 3):
        node = _Node(node_id, 0, 0, tmp_path / str(node_id))
        node.process = subprocess.Popen(["sleep", "300"])
        cluster._nodes[node_id] = node
    try:
        cluster.freeze(3)  # a frozen node is no voter that answers
        cluster.stop(1)  # 1 and 2 alive: a majority, a controlled shutdown
        cluster.stop(2)  # 2 alone: no quorum
        cluster.thaw(3)
        cluster.stop(3)  # alone: no quorum
        codes = {n: cluster._nodes[n].process.returncode for n in (1, 2, 3)}  # type: ignore[union-attr]
        assert codes == {1: -signal.SIGTERM, 2: -signal.SIGKILL, 3: -signal.SIGKILL}, codes
        assert not any(cluster.running(n) for n in (1, 2, 3))
    finally:
        for node in cluster._nodes.values():
            if node.process is not None and node.process.poll() is None:
                os.kill(node.process.pid, signal.SIGCONT)
                node.process.kill()
                node.process.wait(10)
        cluster._nodes.clear()
