"""``kresilient audit`` against the real 3-node cluster: a weak topic, a stopped broker
(under-replicated partition and moved leader reported, then cleared), consumer-group lag."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from kresilient.cli import main
from kresilient.testing import KafkaCluster


def _audit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["audit", "--format", "json", "--timeout", "20", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out)


def _rules_for(findings: list[dict[str, Any]], fragment: str) -> set[str]:
    return {f["rule"] for f in findings if fragment in f["path"]}


def _wait_for(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.5)
    return check()


@pytest.mark.integration
def test_audit_reports_weak_topic_and_not_the_safe_one(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    weak = topic_factory(
        partitions=2,
        replication_factor=2,
        config={"min.insync.replicas": 1, "unclean.leader.election.enable": "true"},
    )
    safe = topic_factory()
    code, findings = _audit(
        capsys, "-b", kafka_cluster.bootstrap_servers, "--topic", weak, "--topic", safe
    )
    assert code == 1
    assert _rules_for(findings, f"/topic/{weak}") >= {"KR042", "KR043", "KR045"}
    assert not _rules_for(findings, f"/topic/{safe}")
    assert not {"KR060", "KR061"} & {f["rule"] for f in findings}


@pytest.mark.integration
@pytest.mark.chaos
def test_stopped_broker_is_reported_then_cleared_after_restart(
    kafka_cluster: KafkaCluster,
    topic_factory: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory()
    bootstrap = kafka_cluster.bootstrap_servers
    args = ("-b", bootstrap, "--topic", topic)
    code, findings = _audit(capsys, *args)
    assert not {"KR060", "KR061", "KR062"} & {f["rule"] for f in findings}
    preferred = kafka_cluster.replicas(topic, 0)[0]
    assert kafka_cluster.leader(topic, 0) == preferred
    kafka_cluster.stop(preferred)
    try:
        reported: list[dict[str, Any]] = []

        def under_replicated() -> bool:
            nonlocal reported
            _, reported = _audit(capsys, *args)
            return "KR060" in _rules_for(reported, f"/topic/{topic}/partition/0")

        assert _wait_for(under_replicated), reported
        (urp,) = [f for f in reported if f["rule"] == "KR060"]
        assert f"out of sync: [{preferred}]" in urp["message"]
        assert urp["severity"] == "error"
        imbalance = [f for f in reported if f["rule"] == "KR062"]
        assert any(f["path"].endswith(f"/broker/{preferred}") for f in imbalance), reported
        code, _ = _audit(capsys, *args)
        assert code == 1
    finally:
        kafka_cluster.start(preferred)
        kafka_cluster.wait_for_isr(topic, 0, size=3)
    code, findings = _audit(capsys, *args)
    assert "KR060" not in {f["rule"] for f in findings}
    kafka_cluster.elect_preferred_leaders(topic)
    code, findings = _audit(capsys, *args)
    assert not {"KR060", "KR061", "KR062"} & {f["rule"] for f in findings}
    assert code == 0  # only broker-level warnings remain (racks, auto leader rebalance)


@pytest.mark.integration
def test_consumer_group_lag(
    kafka_cluster: KafkaCluster, topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(50):
        producer.produce(topic, value=b"m%d" % i)
    assert producer.flush(30) == 0
    group = f"audit-lag-{topic}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        # The group coordinator may still be loading on a busy machine: retry, bounded.
        deadline = time.monotonic() + 60
        while True:
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, 5)], asynchronous=False)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
    finally:
        consumer.close()
    base = ("-b", bootstrap, "--topic", topic, "--group", group)
    _, findings = _audit(capsys, *base, "--lag-threshold", "10")
    (lag,) = [f for f in findings if f["rule"] == "KR064"]
    assert f"lags 45 message(s) on {topic}" in lag["message"]
    _, findings = _audit(capsys, *base, "--lag-threshold", "100")
    assert "KR064" not in {f["rule"] for f in findings}


def test_unreachable_cluster_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["audit", "-b", "127.0.0.1:1", "--timeout", "2"])
    out = capsys.readouterr().out
    assert code == 2
    assert "KR065 [error] admin request failed" in out
