"""`kresilient doctor` on the real cluster: each seed symptom made real, found and explained."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
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

from kresilient.clusterinfo import DISK_USAGE_THRESHOLD, committed_offsets, describe_log_dirs
from kresilient.doctor import DoctorReport, Severity, diagnose
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration


def _until(what: str, check: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _conf(cluster: KafkaCluster) -> dict[str, str]:
    return {"bootstrap.servers": cluster.bootstrap_servers}


def _symptoms(report: DoctorReport, section: str, subject: str | None = None) -> list[str]:
    return [
        f.symptom
        for f in report.by_section(section)
        if f.severity >= Severity.WARNING and (subject is None or f.subject == subject)
    ]


def _log_dir_usage(cluster: KafkaCluster) -> float:
    """The fullest log dir's real usage (``LogDir.used``: 1 - usable/total)."""
    host, port = cluster.bootstrap_servers.split(",")[0].rsplit(":", 1)
    used = [d.used for d in describe_log_dirs(host, int(port), 10)]
    assert used and all(u is not None and 0 <= u < 1 for u in used), used
    return max(u for u in used if u is not None)


def _doctor_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kresilient.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.broker_smoke
def test_healthy_cluster_exit_0_with_probe_and_clock(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    # The brokers' log dirs share the host's disk, whose fill is the machine's, not the
    # cluster's: a CI host 80 % full drew a log-dir warning here. The threshold sits above the
    # real usage, so the disk check still runs and must report its OK line.
    threshold = min(max(DISK_USAGE_THRESHOLD, _log_dir_usage(kafka_cluster) + 0.05), 0.99)
    proc = _doctor_cli(
        "-b",
        kafka_cluster.bootstrap_servers,
        "--topic",
        topic,
        "--format",
        "json",
        "--disk-threshold",
        f"{threshold:.4f}",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["reachable"] is True
    assert report["figures"]["probe"]["consumed"] == 20
    assert abs(report["figures"]["clock_skew_ms"]) < 1_000  # one machine, one clock
    assert set(report["figures"]["brokers"]) == {1, 2, 3}
    assert not [f for f in report["findings"] if f["severity"] in ("warning", "error")]
    assert [f for f in report["findings"] if f["subject"] == "log dirs" and f["severity"] == "ok"]
    # the temporary probe topic is gone again
    # (deletion reaches every broker's metadata asynchronously: waited for, with a deadline)
    admin = AdminClient(_conf(kafka_cluster))
    _until(
        "the probe topic to be deleted",
        lambda: not [t for t in admin.list_topics(timeout=10).topics if "kresilient_doctor" in t],
        30,
    )


@pytest.mark.broker_smoke
@pytest.mark.chaos
def test_broker_down_then_preferred_leaders_not_restored(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(partitions=3)
    victim = kafka_cluster.leader(topic, 0)
    kafka_cluster.kill(victim)
    kafka_cluster.wait_for_leader(topic, 0, not_on=victim)
    _until(
        "the ISR to shrink",
        lambda: victim not in kafka_cluster.isr(topic, 0),
        60,
    )
    down = diagnose(_conf(kafka_cluster), topics=[topic], probe=False)
    symptoms = _symptoms(down, "topics", topic)
    assert any("UnderReplicatedPartitions" in s for s in symptoms), down.findings
    assert any("leader imbalance" in s for s in symptoms), down.findings
    # The dead node's bootstrap address is a warning (clients fail over to the others)...
    down_addresses = [f for f in down.by_section("connectivity") if f.severity >= Severity.WARNING]
    assert [f.severity for f in down_addresses] == [Severity.WARNING], down.findings
    # ...and so are URP and the imbalance: the cluster still serves every partition.
    assert down.exit_code() == 0
    assert down.exit_code(Severity.WARNING) == 1

    kafka_cluster.start(victim)
    for p in range(3):
        kafka_cluster.wait_for_isr(topic, p)
    restarted = diagnose(_conf(kafka_cluster), topics=[topic], probe=False)
    symptoms = _symptoms(restarted, "topics", topic)
    assert not any("UnderReplicatedPartitions" in s for s in symptoms), restarted.findings
    imbalance = [f for f in restarted.by_section("topics") if "leader imbalance" in f.symptom]
    assert imbalance and "preferred" in imbalance[0].fix.lower()

    # Negative control: once leadership is moved back, the doctor says nothing more.
    kafka_cluster.elect_preferred_leaders(topic)
    healed = diagnose(_conf(kafka_cluster), topics=[topic], probe=False)
    assert not _symptoms(healed, "topics", topic), healed.findings


def test_future_timestamp_on_create_time_topic_is_found(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    future = topic_factory(
        config={
            "message.timestamp.type": "CreateTime",
            "message.timestamp.after.max.ms": "172800000",
        }
    )
    present = topic_factory(config={"message.timestamp.type": "CreateTime"})
    producer = Producer({**_conf(kafka_cluster), "acks": "all"})
    day_ahead = int(time.time() * 1000) + 86_400_000
    producer.produce(future, b"from a clock advanced during testing", timestamp=day_ahead)
    producer.produce(present, b"on time")
    assert producer.flush(30) == 0
    report = diagnose(_conf(kafka_cluster), topics=[future, present], probe=False)
    ahead = [f for f in report.by_section("topics") if "future timestamps" in f.symptom]
    assert [f.subject for f in ahead if f.severity == Severity.WARNING] == [future]
    assert "24.0 h in the future" in ahead[0].message
    assert "message.timestamp.after.max.ms" in ahead[0].fix
    # the permissive setting that let it in is named too
    assert any(
        f.subject == future and "message.timestamp.after.max.ms=172800000" in f.message
        for f in report.findings
    )


def test_log_dir_over_the_usage_threshold(kafka_cluster: KafkaCluster) -> None:
    used = _log_dir_usage(kafka_cluster)
    over = diagnose(_conf(kafka_cluster), topics=["__none__"], probe=False, disk_threshold=used / 2)
    flagged = [f for f in over.by_section("topics") if "disk exhaustion" in f.symptom]
    assert len(flagged) == 3, over.findings  # one log dir per broker
    # Negative control: above the real usage nothing is reported.
    under = diagnose(
        _conf(kafka_cluster), topics=["__none__"], probe=False, disk_threshold=min(used + 0.01, 1)
    )
    assert not [f for f in under.by_section("topics") if "disk exhaustion" in f.symptom]


def test_client_config_typo_is_linted_first(kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    config = tmp_path / "client.properties"
    config.write_text("enable.idempotance=true\nacks=all\n")
    proc = _doctor_cli(
        "-b",
        kafka_cluster.bootstrap_servers,
        "--command-config",
        str(config),
        "--topic",
        "__consumer_offsets",
        "--no-probe",
        "--format",
        "json",
    )
    report = json.loads(proc.stdout)
    config_findings = [f for f in report["findings"] if f["section"] == "config"]
    assert any(
        "enable.idempotance" in f["message"] and "enable.idempotence" in f["message"]
        for f in config_findings
    ), config_findings
    assert proc.returncode == 1


@pytest.mark.parametrize(
    ("bootstrap", "reason"),
    [("127.0.0.1:1", "connection refused"), ("no-such-host.invalid:9092", "does not resolve")],
)
def test_unreachable_cluster_one_line_exit_2(bootstrap: str, reason: str) -> None:
    proc = _doctor_cli("-b", bootstrap, "--timeout", "5", timeout=60)
    assert proc.returncode == 2
    assert reason in proc.stdout
    assert bootstrap.rsplit(":", 1)[0] in proc.stdout
    assert "%3|" not in proc.stderr and proc.stderr.count("\n") <= 5


_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
)


def test_group_offsets_expired_after_short_retention(kafka_cluster: KafkaCluster) -> None:
    """An idle group whose committed offsets are gone is a WARNING naming the broker's
    offsets.retention.minutes and auto.offset.reset. (The name is the one docs/ cite.)

    The offsets are removed with ``delete_consumer_groups``: when the broker expires the last
    offsets of a group with no members it deletes the group itself, the state this gives at
    once, where a real expiry costs at least a minute (offsets.retention.minutes has a
    one-minute floor). Compared on Kafka 4.1 (2026-11-29): after either, the group is DEAD,
    CLASSIC, no members, no committed offset, not listed. The doctor reads only that. The
    broker's own expiry is proven, with its one-minute wait, on the same kind of idle group
    by test_audit_cluster_symptoms.py's ``test_idle_group_at_risk_then_expired_...``.
    """
    cluster = kafka_cluster
    topic = cluster.create_topic(f"expiry-{uuid.uuid4().hex[:8]}")
    producer = Producer(_conf(cluster))
    for i in range(5):
        producer.produce(topic, f"m{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    group = f"idle-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({**_conf(cluster), "group.id": group, "enable.auto.commit": False})

    def commit() -> bool:
        # The coordinator may still be loading __consumer_offsets (CI under load:
        # COORDINATOR_LOAD_IN_PROGRESS): a retriable refusal, tried again until a deadline.
        try:
            consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVING:
                raise
            return False
        return True

    _until("the group coordinator to accept a commit", commit, 60)
    consumer.close()
    admin = AdminClient(_conf(cluster))

    def committed() -> int:
        # a consumer of the group, not the Admin API's ListConsumerGroupOffsets (it kills the
        # process while the coordinator is not ready: librdkafka issue 5040)
        return len(committed_offsets(_conf(cluster), group, [(topic, 0)], 10))

    # Negative control: while the offsets exist the group is reported with its lag.
    before = diagnose(_conf(cluster), groups=[group], probe=False)
    assert committed() == 1
    assert before.figures["group_lag"][group] == {f"{topic}-0": 2}
    assert not [f for f in before.by_section("groups") if "expiration" in f.symptom]

    admin.delete_consumer_groups([group], request_timeout=30)[group].result(30)
    _until("the group's offsets to be gone", lambda: committed() == 0, 30)
    after = diagnose(_conf(cluster), groups=[group], probe=False)
    expired = [f for f in after.by_section("groups") if "offset expiration" in f.symptom]
    assert expired and expired[0].severity == Severity.WARNING
    assert f"offsets.retention.minutes={_retention_minutes(admin)}" in expired[0].message
    assert "auto.offset.reset" in expired[0].fix


def _retention_minutes(admin: AdminClient) -> str:
    """The broker's offsets.retention.minutes, read apart from the doctor."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    broker = min(admin.list_topics(timeout=10).brokers)
    resource = ConfigResource(ResourceType.BROKER, str(broker))
    entries = admin.describe_configs([resource], request_timeout=10)[resource].result(15)
    value = entries["offsets.retention.minutes"].value
    assert value, entries
    return str(value)


def test_weak_replication_and_unclean_election_are_errors(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    weak = topic_factory(
        replication_factor=2,
        config={"min.insync.replicas": "2", "unclean.leader.election.enable": "true"},
    )
    safe = topic_factory(config={"min.insync.replicas": "2"})
    report = diagnose(_conf(kafka_cluster), topics=[weak, safe], probe=False)
    errors = [f for f in report.by_section("topics") if f.severity == Severity.ERROR]
    assert {f.subject for f in errors} == {weak}
    messages = " | ".join(f.message for f in errors)
    assert "replication factor 2 <= min.insync.replicas 2" in messages
    assert "unclean.leader.election.enable=true" in messages
    assert report.exit_code() == 1


def test_clock_skew_is_measured_against_log_append_time(
    kafka_cluster: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kresilient.doctor as doctor

    # Negative control first: on one machine the broker's clock is ours.
    same = diagnose(_conf(kafka_cluster), topics=["__none__"])
    assert abs(same.figures["clock_skew_ms"]) < doctor.CLOCK_SKEW_WARN_MS
    low, high = same.figures["clock_skew_bounds_ms"]
    assert low <= 0 <= high  # each message was appended between its send and its ack
    assert not [f for f in same.by_section("clock") if f.severity >= Severity.WARNING]

    # This process's clock an hour ahead of the broker's (a client clock left advanced).
    real = time.time
    monkeypatch.setattr(doctor.time, "time", lambda: real() + 3600)
    skewed = diagnose(_conf(kafka_cluster), topics=["__none__"])
    assert -3_601_000 < skewed.figures["clock_skew_ms"] < -3_599_000
    (warning,) = [f for f in skewed.by_section("clock") if f.severity == Severity.WARNING]
    assert "clock drift" in warning.symptom and "NTP" in warning.fix


def test_topic_and_group_asked_for_are_shown_without_verbose(
    kafka_cluster: KafkaCluster, topic_factory: Callable[..., str]
) -> None:
    """Issue 36: `doctor --topic orders --group billing` printed neither when both were
    healthy (their OK lines only with --verbose): the user could not tell a healthy topic
    from one the doctor never looked at."""

    asked, other = topic_factory(partitions=3), topic_factory()
    group = f"billing-{uuid.uuid4().hex[:8]}"
    producer = Producer({**_conf(kafka_cluster), "acks": "all"})
    producer.produce(asked, b"one", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({**_conf(kafka_cluster), "group.id": group, "enable.auto.commit": False})

    def commit() -> bool:
        # A fresh coordinator may still be loading (COORDINATOR_LOAD_IN_PROGRESS): retried.
        try:
            consumer.commit(offsets=[TopicPartition(asked, 0, 1)], asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVING:
                raise
            return False
        return True

    _until("the group's first commit", commit, 60)
    consumer.close()

    def doctor(*extra: str) -> list[str]:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "kresilient.cli",
                "doctor",
                "-b",
                kafka_cluster.bootstrap_servers,
                "--no-probe",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.splitlines()

    lines = doctor("--topic", asked, "--group", group)
    topic_lines = [line for line in lines if line.startswith(f"  ok   {asked}: ")]
    group_lines = [line for line in lines if line.startswith(f"  ok   {group}: ")]
    assert topic_lines == [
        f"  ok   {asked}: 3 partition(s), RF 3: every leader preferred, ISR full"
    ]
    assert len(group_lines) == 1 and "lag 0 over 1 partition(s)" in group_lines[0], "\n".join(lines)
    assert "[topics]" in lines and "[groups]" in lines
    # Concise: the passed checks of what was not asked for stay out (--verbose shows them).
    assert not any("log dirs" in line or "propagation" in line for line in lines), lines
    assert not any(other in line for line in lines)
    verbose = doctor("--topic", asked, "--group", group, "--verbose")
    assert any("propagation" in line for line in verbose), verbose  # the control: they exist
