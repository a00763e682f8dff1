"""``kresilient audit`` KR067-KR070 on the real cluster: each symptom of the troubleshooting
guides made real (a log dir over the threshold, a record a day in the future on a CreateTime
topic that lets it in, an idle group whose offsets are about to expire and then do), found
with its rule, and each check quiet on a healthy topic or group (the negative controls)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kresilient.clusterinfo import (
    committed_offsets,
    committed_record_timestamps,
    describe_log_dirs,
)
from kresilient.lint import Settings, exit_code, render
from kresilient.lint.audit import AuditOptions, ClusterSnapshot, audit, check_snapshot
from kresilient.lint.model import Finding, Severity
from kresilient.testing import KafkaCluster


def _conf(cluster: KafkaCluster) -> dict[str, str]:
    return {"bootstrap.servers": cluster.bootstrap_servers}


def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


_COORDINATOR_NOT_READY = (
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


def _commit(consumer: Consumer, **kwargs: Any) -> None:
    """A synchronous commit, retried while the group coordinator is still loading (a cluster
    started for this test: CI, 2026-11-26, COORDINATOR_LOAD_IN_PROGRESS on the first commit)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            consumer.commit(asynchronous=False, **kwargs)
            return
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_NOT_READY or time.monotonic() > deadline:
                raise
        time.sleep(0.5)


def _on(findings: list[Finding], rule: str, fragment: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule and fragment in f.path]


@pytest.mark.integration
def test_log_dir_over_the_usage_threshold_is_kr067(kafka_cluster: KafkaCluster) -> None:
    host, port = kafka_cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    dirs = describe_log_dirs(host, int(port), 10)
    used = max(d.used or 0.0 for d in dirs)
    assert 0 < used < 1, dirs
    # A threshold below the real usage: the volume is "over the threshold" on every broker.
    over = audit(
        _conf(kafka_cluster), options=AuditOptions(topics=("__none__",), disk_threshold=used / 2)
    )
    flagged = [f for f in over if f.rule == "KR067"]
    assert sorted(f.path.split("/broker/")[1].split("/")[0] for f in flagged) == ["1", "2", "3"]
    assert all("disk exhaustion" in f.message and "retention" in f.message for f in flagged)
    assert all(f.severity == Severity.WARNING for f in flagged)
    # The existing outputs carry the new rule: SARIF with its metadata, JSON with its name.
    sarif = json.loads(render(flagged, "sarif", "audit"))
    rules = {r["id"]: r for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    assert "DescribeLogDirs" in rules["KR067"]["shortDescription"]["text"]
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} == {"KR067"}
    assert {f["name"] for f in json.loads(render(flagged, "json", "audit"))} == {"log-dir-usage"}
    # Negative control: just above the real usage nothing is reported.
    under = audit(
        _conf(kafka_cluster),
        options=AuditOptions(topics=("__none__",), disk_threshold=min(used + 0.02, 1.0)),
    )
    assert not [
        f for f in under if f.rule == "KR067" or (f.rule == "KR066" and "/broker/" in f.path)
    ], under


@pytest.mark.integration
def test_future_timestamp_is_kr068_and_the_bound_that_let_it_in_kr070(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    permissive = {
        "message.timestamp.type": "CreateTime",
        "message.timestamp.after.max.ms": "172800000",  # two days
    }
    future = topic_factory(partitions=2, config=permissive)
    bound_only = topic_factory(config=permissive)  # permissive, but no future record yet
    healthy = topic_factory(
        config={"message.timestamp.type": "CreateTime", "message.timestamp.after.max.ms": 3600000}
    )
    producer = Producer({**_conf(kafka_cluster), "acks": "all"})
    day_ahead = int(time.time() * 1000) + 86_400_000
    producer.produce(
        future, b"from a clock advanced during testing", partition=1, timestamp=day_ahead
    )
    producer.produce(future, b"on time", partition=0)
    producer.produce(bound_only, b"on time")
    producer.produce(healthy, b"on time")
    assert producer.flush(30) == 0

    findings = audit(
        _conf(kafka_cluster), options=AuditOptions(topics=(future, bound_only, healthy))
    )
    (ahead,) = _on(findings, "KR068", f"/topic/{future}")
    assert "1 partition(s) [1]" in ahead.message and "24.0 h in the future" in ahead.message
    assert "message.timestamp.type=CreateTime" in ahead.message
    assert "disk exhaustion" in ahead.message and "after.max.ms" in ahead.message
    assert [f.path.rsplit("/", 1)[1] for f in findings if f.rule == "KR070"] == sorted(
        [future, bound_only]
    )
    assert all("172800000" in f.message for f in findings if f.rule == "KR070")
    # Negative controls: on-time records and a one-hour bound say nothing.
    assert not _on(findings, "KR068", bound_only) and not _on(findings, "KR068", healthy)
    assert not [f for f in findings if healthy in f.path], findings
    # A tolerance above the record's lead quiets KR068 (the option is honoured).
    tolerant = audit(
        _conf(kafka_cluster),
        options=AuditOptions(topics=(future,), future_tolerance_ms=2 * 86_400_000),
    )
    assert not [f for f in tolerant if f.rule == "KR068"]
    assert exit_code(findings, Settings()) == 0  # warnings: the cluster still serves


@pytest.fixture(name="short_retention_cluster", scope="module")
def _short_retention_cluster() -> Iterator[KafkaCluster]:
    # A one-node cluster whose broker forgets an idle group's offsets after one minute.
    with KafkaCluster(
        nodes=1,
        broker_config={
            "offsets.retention.minutes": 1,
            "offsets.retention.check.interval.ms": 1000,
            "offsets.topic.replication.factor": 1,
        },
    ) as cluster:
        yield cluster


@pytest.mark.integration
@pytest.mark.chaos  # needs a cluster of its own with a broker setting: not on an external one
def test_idle_group_at_risk_then_expired_is_kr069_active_group_is_not(
    short_retention_cluster: KafkaCluster,
) -> None:
    cluster = short_retention_cluster
    topic = cluster.create_topic(f"expiry-{uuid.uuid4().hex[:8]}", replication_factor=1)
    producer = Producer(_conf(cluster))
    for i in range(5):
        producer.produce(topic, f"m{i}".encode())
    assert producer.flush(30) == 0
    idle = f"idle-{uuid.uuid4().hex[:8]}"
    committer = Consumer({**_conf(cluster), "group.id": idle, "enable.auto.commit": False})
    _commit(committer, offsets=[TopicPartition(topic, 0, 3)])
    committer.close()
    # Negative control: a group with a live member commits the same way and stays quiet.
    active = f"active-{uuid.uuid4().hex[:8]}"
    member = Consumer(
        {
            **_conf(cluster),
            "group.id": active,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    member.subscribe([topic])

    def committed(group: str) -> int:
        # a consumer of the group, not the Admin API's ListConsumerGroupOffsets (it kills the
        # process while the coordinator is not ready: librdkafka issue 5040)
        return len(committed_offsets(_conf(cluster), group, [(topic, 0)], 10))

    def member_committed() -> bool:
        msg = member.poll(0.5)
        if msg is not None and msg.error() is None:
            _commit(member, message=msg)
        return committed(active) > 0

    try:
        _until("the live member to commit", member_committed, 60)
        options = AuditOptions(groups=(idle, active), timeout=10)
        risk: list[Finding] = []

        def at_risk() -> bool:
            member.poll(0)  # the member stays in the group while the idle one ages
            nonlocal risk
            findings = audit(_conf(cluster), options=options)
            assert not _on(findings, "KR069", f"/group/{active}"), findings
            risk = _on(findings, "KR069", f"/group/{idle}")
            return bool(risk)

        # Retention is one minute: more than half of it idle is "at risk".
        _until("the idle group to be at risk of offset expiry", at_risk, 120)
        assert committed(idle) == 1  # reported before the offsets are gone
        assert "at risk of expiry" in risk[0].message
        assert "offsets.retention.minutes=1" in risk[0].message

        def expired() -> bool:
            member.poll(0)
            return committed(idle) == 0

        _until("the broker to expire the idle group's offsets", expired, 240)
        after = audit(_conf(cluster), options=options)
        (gone,) = _on(after, "KR069", f"/group/{idle}")
        assert "no committed offset" in gone.message and "auto.offset.reset" in gone.message
        assert not _on(after, "KR069", f"/group/{active}")
        assert committed(active) > 0
    finally:
        member.close()


def test_log_dirs_over_tls_or_sasl_are_an_info_note_not_a_failure() -> None:
    """Pure: DescribeLogDirs is sent over PLAINTEXT only; elsewhere KR067 says so at info
    level and the exit code stays 0 (a secured cluster's audit does not fail for it)."""
    snap = ClusterSnapshot(bootstrap="broker:9093")
    snap.notes.append(("KR067", ("broker",), "log-dir usage not checked over sasl_ssl"))
    findings = check_snapshot(snap)
    assert [(f.rule, f.severity) for f in findings] == [("KR067", Severity.INFO)]
    assert exit_code(findings, Settings()) == 0
    assert not check_snapshot(snap, settings=Settings(ignore=("KR067",)))


def test_offset_expiry_threshold_is_half_the_retention() -> None:
    """Pure: an empty group idle up to half of offsets.retention.minutes is quiet (negative
    control), beyond it KR069; without a known retention nothing is guessed."""
    snap = ClusterSnapshot(
        bootstrap="broker:9092",
        broker_configs={1: {"offsets.retention.minutes": "10"}},
        idle_ms={"fresh": 300_000, "stale": 300_001},
    )
    expiry = [f for f in check_snapshot(snap) if f.rule == "KR069"]
    assert [f.path.rsplit("/", 1)[1] for f in expiry] == ["stale"]
    assert "5 min old, offsets.retention.minutes=10" in expiry[0].message
    # Idle for years by its records' timestamps, yet its offsets are still there: the
    # estimate is refuted (old producer timestamps), no false alarm; within the retention
    # plus one expiry sweep it is still reported.
    snap.broker_configs[1]["offsets.retention.check.interval.ms"] = "60000"
    snap.idle_ms = {"replayed": 3 * 365 * 86_400_000, "edge": 660_000, "past": 660_001}
    expiry = [f for f in check_snapshot(snap) if f.rule == "KR069"]
    assert [f.path.rsplit("/", 1)[1] for f in expiry] == ["edge"]
    snap.broker_configs = {}
    assert not [f for f in check_snapshot(snap) if f.rule == "KR069"]


@pytest.mark.integration
@pytest.mark.chaos
def test_follower_falling_behind_is_kr060_naming_it_once_out_of_the_isr(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    """What the Admin API shows of a lagging follower: nothing while it is still in the ISR
    (no follower log end offset is exposed), KR060 naming it once it falls out."""
    topic = topic_factory()
    leader = kafka_cluster.leader(topic, 0)
    follower = next(r for r in kafka_cluster.replicas(topic, 0) if r != leader)
    options = AuditOptions(topics=(topic,), disk_threshold=None, timeout=20)
    # Negative control: a healthy partition is not reported.
    assert not [f for f in audit(_conf(kafka_cluster), options=options) if f.rule == "KR060"]
    kafka_cluster.freeze(follower)  # a follower stalled by a disk or a GC pause
    try:
        producer = Producer({**_conf(kafka_cluster), "acks": "all"})
        for i in range(100):
            producer.produce(topic, f"m{i}".encode(), partition=0)
        assert producer.flush(60) == 0  # the leader and the other follower still form the ISR
        kafka_cluster.wait_for_isr_shrink(topic, 0, without=follower, timeout=60)
        findings = audit(_conf(kafka_cluster), options=options)
        (urp,) = [f for f in findings if f.rule == "KR060" and f.path.endswith("/partition/0")]
        assert f"out of sync: [{follower}]" in urp.message, urp
    finally:
        kafka_cluster.thaw(follower)
    kafka_cluster.wait_for_isr(topic, 0, size=3, timeout=90)
    healed = audit(_conf(kafka_cluster), options=options)
    assert not [f for f in healed if f.rule == "KR060"], healed


@pytest.mark.integration
def test_committed_record_timestamps_one_consumer_for_every_group(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    """The idle-time input of KR069: the record before each committed offset, read for
    several groups at once (two groups on one partition at different offsets), and a
    position whose record was deleted is left out rather than waited for."""
    topic = topic_factory(partitions=2)
    producer = Producer(_conf(kafka_cluster))
    base = int(time.time() * 1000) - 600_000
    for i in range(4):
        producer.produce(topic, f"m{i}".encode(), partition=0, timestamp=base + i)
        producer.produce(topic, f"n{i}".encode(), partition=1, timestamp=base + 100 + i)
    assert producer.flush(30) == 0
    positions = [(topic, 0, 2), (topic, 0, 4), (topic, 1, 1), (topic, 1, 0)]
    stamps = committed_record_timestamps(_conf(kafka_cluster), positions, 30)
    assert stamps == {(topic, 0, 2): base + 1, (topic, 0, 4): base + 3, (topic, 1, 1): base + 100}
    # Records before offset 3 of partition 1 deleted: the group that committed 2 has no
    # record to date it by (left out); one that committed 4 still has its record.
    admin = AdminClient(_conf(kafka_cluster))
    (future,) = admin.delete_records([TopicPartition(topic, 1, 3)]).values()
    future.result(30)
    after = committed_record_timestamps(_conf(kafka_cluster), [(topic, 1, 2), (topic, 1, 4)], 30)
    assert after == {(topic, 1, 4): base + 103}


@pytest.mark.integration
def test_audit_cli_disk_threshold_option(
    kafka_cluster: KafkaCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--disk-threshold` reaches KR067 from the command line; 0 skips the log dirs; a value
    outside 0-1 is a usage error naming the option."""
    from kresilient.cli import main

    host, port = kafka_cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    used = max(d.used or 0.0 for d in describe_log_dirs(host, int(port), 10))
    argv = ["audit", "-b", kafka_cluster.bootstrap_servers, "--topic", "__none__"]
    over = [*argv, "--disk-threshold", f"{used / 2:.6f}", "--fail-on", "warning"]
    assert main([*over, "--format", "json"]) == 1  # KR067 is a warning
    rules = {f["rule"] for f in json.loads(capsys.readouterr().out)}
    assert "KR067" in rules
    main([*argv, "--disk-threshold", "0", "--format", "json"])  # negative control
    assert "KR067" not in {f["rule"] for f in json.loads(capsys.readouterr().out)}
    assert main([*argv, "--disk-threshold", "1.5"]) == 2
    assert "--disk-threshold" in capsys.readouterr().err
