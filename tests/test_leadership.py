"""LeadershipMonitor on a fake clock: bursts vs sustained churn, parsing, events, snapshots."""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaError

from kresilient.leadership import (
    ChurnPolicy,
    LeadershipChange,
    LeadershipMonitor,
    LeadershipState,
)

STABLE = LeadershipState.STABLE
BURST = LeadershipState.TRANSIENT_BURST
CHURN = LeadershipState.SUSTAINED_CHURN


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def stats(topic: str = "t", leaders: dict[int, int] | None = None, age: Any = 1000) -> str:
    parts: dict[str, Any] = {"-1": {"partition": -1, "leader": -1}}
    for p, leader in (leaders if leaders is not None else {0: 1}).items():
        parts[str(p)] = {"partition": p, "leader": leader}
    return json.dumps({"topics": {topic: {"metadata_age": age, "partitions": parts}}})


class Rig:
    """A monitor on a fake clock, recording listener calls and structlog events."""

    def __init__(self, policy: ChurnPolicy | None = None, **kw: Any) -> None:
        self.clock = Clock()
        self.changes: list[LeadershipChange] = []
        self.monitor = LeadershipMonitor(policy, clock=self.clock, **kw)
        self.monitor.add_listener(self.changes.append)

    def leader(self, leader: int, *, topic: str = "t", partition: int = 0) -> None:
        self.monitor.on_stats(stats(topic, {partition: leader}))

    def tick(self, seconds: float, leader: int | None = None) -> None:
        """Advance time in 1 s stats ticks (statistics.interval.ms=1000) keeping the leader."""
        for _ in range(int(seconds)):
            self.clock.advance(1)
            if leader is not None:
                self.leader(leader)
            else:
                self.monitor.refresh()

    def states(self) -> list[LeadershipState]:
        return [c.state for c in self.changes]


# --------------------------------------------------------------------------- policy


def test_policy_defaults_are_documented_values() -> None:
    p = ChurnPolicy()
    assert (p.window_s, p.churn_leader_changes, p.churn_bursts) == (120.0, 4, 4)
    assert (p.burst_gap_s, p.quiet_period_s) == (10.0, 60.0)
    doc = ChurnPolicy.__doc__ or ""
    for text in ("default 120", "default 4", "default 10", "default 60"):
        assert text in doc


def test_policy_is_frozen_keyword_only_and_validated() -> None:
    p = ChurnPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.window_s = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        ChurnPolicy(60.0)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="window_s"):
        ChurnPolicy(window_s=0)
    with pytest.raises(ValueError, match="churn_bursts"):
        ChurnPolicy(churn_bursts=1)
    q = p.replace(quiet_period_s=5)
    assert q.quiet_period_s == 5 and p.quiet_period_s == 60
    with pytest.raises(ValueError):
        p.replace(burst_gap_s=-1)


# --------------------------------------------------------------------------- states


def test_first_sighting_is_stable_and_silent() -> None:
    rig = Rig()
    rig.leader(1)
    rig.tick(5, leader=1)
    assert rig.monitor.state("t", 0) is STABLE
    assert rig.changes == []
    assert rig.monitor.leader("t", 0) == 1


def test_one_leader_move_is_a_transient_burst_then_stable() -> None:
    rig = Rig()
    rig.leader(1)
    rig.tick(3, leader=1)
    rig.clock.advance(1)
    rig.leader(-1)  # the leader died: no leader for a few ticks
    rig.tick(4, leader=-1)
    rig.clock.advance(1)
    rig.leader(2)  # elected
    assert rig.monitor.state("t", 0) is BURST
    assert rig.monitor.leader("t", 0) == 2
    rig.tick(59, leader=2)
    assert rig.monitor.state("t", 0) is BURST  # quiet period (60 s) not over yet
    rig.tick(2, leader=2)
    assert rig.monitor.state("t", 0) is STABLE
    assert rig.states() == [BURST, STABLE], "one event per state change"
    first = rig.changes[0]
    assert (first.topic, first.partition, first.previous) == ("t", 0, STABLE)
    assert "no leader" in first.reason
    assert rig.changes[1].leader_changes == 1 and rig.changes[1].bursts == 1


def test_a_three_broker_rolling_restart_is_not_churn_with_defaults() -> None:
    # Leader of t[0] moves 1 -> 2 -> 3 -> 1 as brokers 1, 2, 3 restart 30 s apart (fast),
    # each with a leaderless gap and a handful of NOT_LEADER errors.
    rig = Rig()
    rig.leader(1)
    for new in (2, 3, 1):
        rig.tick(27, leader=rig.monitor.leader("t", 0))
        rig.clock.advance(1)
        rig.leader(-1)
        for _ in range(5):
            rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "t", 0)
        rig.tick(1, leader=-1)
        rig.clock.advance(1)
        rig.leader(new)
    assert rig.monitor.state("t", 0) is BURST
    assert rig.states() == [BURST]
    part = rig.monitor.snapshot()["partitions"]["t[0]"]
    assert (part["leader_changes"], part["bursts"], part["errors"]) == (3, 3, 15)
    rig.tick(61, leader=1)
    assert rig.monitor.state("t", 0) is STABLE


def test_a_flapping_broker_is_sustained_churn_until_quiet() -> None:
    rig = Rig()
    rig.leader(1)
    leaders = [2, 1, 2, 1, 2, 1]
    for new in leaders[:4]:  # 4 moves, 15 s apart: within 120 s
        rig.tick(15, leader=rig.monitor.leader("t", 0))
        rig.leader(new)
    assert rig.monitor.state("t", 0) is CHURN
    assert rig.states() == [BURST, CHURN]
    churn = rig.changes[-1]
    assert churn.leader_changes == 4 and churn.window_s == 120
    assert "4 leader changes" in churn.reason
    for new in leaders[4:]:  # still flapping: stays churn, no new events
        rig.tick(15, leader=rig.monitor.leader("t", 0))
        rig.leader(new)
    assert rig.states() == [BURST, CHURN]
    rig.tick(59, leader=1)
    assert rig.monitor.state("t", 0) is CHURN
    rig.tick(2, leader=1)
    assert rig.monitor.state("t", 0) is STABLE
    assert rig.states() == [BURST, CHURN, STABLE]


def test_separate_error_bursts_make_churn_without_leader_moves() -> None:
    rig = Rig()
    rig.leader(1)
    for burst in range(4):
        for _ in range(20):  # many errors, one burst
            rig.monitor.on_error(KafkaError(KafkaError.LEADER_NOT_AVAILABLE), "t", 0)
            rig.clock.advance(0.1)
        if burst < 3:
            assert rig.monitor.state("t", 0) is BURST
            rig.tick(20, leader=1)  # > burst_gap_s apart
    assert rig.monitor.state("t", 0) is CHURN
    assert rig.changes[-1].bursts == 4 and rig.changes[-1].leader_changes == 0
    assert rig.changes[-1].errors == 61  # the first error of the 4th burst tipped it
    assert rig.monitor.snapshot()["partitions"]["t[0]"]["errors"] == 80
    assert rig.changes[-1].classification is not None
    assert rig.changes[-1].classification.name == "LEADER_NOT_AVAILABLE"


def test_errors_within_one_burst_count_once() -> None:
    rig = Rig()
    rig.leader(1)
    for _ in range(200):
        rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "t", 0)
        rig.clock.advance(0.2)  # 40 s of errors, never a 10 s gap
    assert rig.monitor.state("t", 0) is BURST
    assert rig.monitor.snapshot()["partitions"]["t[0]"]["bursts"] == 1
    assert rig.states() == [BURST]


def test_old_signals_leave_the_window() -> None:
    rig = Rig(ChurnPolicy(quiet_period_s=30))
    rig.leader(1)
    for new in (2, 1, 2):  # 3 moves
        rig.tick(15, leader=rig.monitor.leader("t", 0))
        rig.leader(new)
    rig.tick(130, leader=2)  # everything ages out of the 120 s window
    rig.leader(1)  # a 4th move, alone in the window
    assert rig.monitor.state("t", 0) is BURST


def test_non_leadership_errors_are_ignored() -> None:
    rig = Rig()
    rig.leader(1)
    for code in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError._TRANSPORT, KafkaError._MSG_TIMED_OUT):
        rig.monitor.on_error(KafkaError(code), "t", 0)
    assert rig.monitor.state("t", 0) is STABLE and rig.changes == []


def test_error_attribution() -> None:
    rig = Rig()
    rig.monitor.on_stats(stats("t", {0: 1, 1: 2}))
    rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "t")  # whole topic
    assert rig.monitor.states() == {("t", 0): BURST, ("t", 1): BURST}
    rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))  # error_cb style
    rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "unknown-topic", -1)
    assert rig.monitor.snapshot()["unattributed_errors"] == 2
    rig.monitor.on_error(KafkaError.FENCED_LEADER_EPOCH, "other", 3)  # int code, new partition
    assert rig.monitor.state("other", 3) is BURST


class _Msg:
    def __init__(self, topic: str, partition: int) -> None:
        self._t, self._p = topic, partition

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p


def test_on_delivery() -> None:
    rig = Rig()
    rig.monitor.on_delivery(None, _Msg("t", 0))
    assert rig.changes == []
    rig.monitor.on_delivery(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), _Msg("t", 2))
    assert rig.monitor.state("t", 2) is BURST


@pytest.mark.parametrize(
    "line",
    [
        "[thrd:127.0.0.1:9092/1]: orders [3]: Broker: Not leader for partition",
        'Topic "orders" [3]: produce failed: NOT_LEADER_FOR_PARTITION (retrying)',
    ],
)
def test_on_log_recognises_leadership_errors(line: str) -> None:
    rig = Rig()
    rig.monitor.on_log(line)
    assert rig.monitor.state("orders", 3) is BURST


def test_on_log_ignores_other_lines() -> None:
    rig = Rig()
    rig.monitor.on_log("orders [3]: Disconnected (after 12ms in state UP)")
    rig.monitor.on_log("MSG_SIZE_TOO_LARGE on orders [3]")
    assert rig.monitor.states() == {}


def test_leaderless_and_back_to_the_same_leader_is_a_burst_not_a_move() -> None:
    rig = Rig()
    rig.leader(1)
    rig.clock.advance(1)
    rig.leader(-1)
    assert rig.monitor.leader("t", 0) is None
    rig.clock.advance(1)
    rig.leader(1)
    assert rig.monitor.state("t", 0) is BURST
    assert rig.monitor.snapshot()["partitions"]["t[0]"]["leader_changes"] == 0


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "doc",
    [
        "not json",
        b"\xff\xfe",
        "[]",
        "{}",
        json.dumps({"topics": None}),
        json.dumps({"topics": {"t": None}}),
        json.dumps({"topics": {"t": {"partitions": {"0": {}}}}}),
        json.dumps({"topics": {"t": {"partitions": {"0": {"leader": "1"}}}}}),
        json.dumps({"topics": {"t": {"partitions": {"x": {"leader": 1}, "0": None}}}}),
        json.dumps({"topics": {"t": {"partitions": {"0": {"leader": True}}}}}),
        json.dumps({"topics": {"t": {"metadata_age": "old", "partitions": []}}}),
    ],
)
def test_stats_parsing_tolerates_missing_and_odd_fields(doc: str | bytes) -> None:
    rig = Rig()
    rig.monitor.on_stats(doc)
    assert rig.monitor.states() == {}
    assert rig.changes == []


def test_stats_accepts_bytes_and_mappings_and_counts_garbage() -> None:
    rig = Rig()
    rig.monitor.on_stats(stats().encode())
    rig.monitor.on_stats(json.loads(stats(leaders={0: 2})))
    assert rig.monitor.state("t", 0) is BURST
    rig.monitor.on_stats("{")
    snap = rig.monitor.snapshot()
    assert snap["stats_ticks"] == 2 and snap["unparsable_stats"] == 1


def test_the_unassigned_partition_is_ignored() -> None:
    rig = Rig()
    rig.monitor.on_stats(stats(leaders={}))
    assert rig.monitor.states() == {}


# --------------------------------------------------------------------------- metadata age


def test_metadata_age_and_staleness() -> None:
    rig = Rig(metadata_max_age_ms=10_000)
    with structlog.testing.capture_logs() as logs:
        rig.monitor.on_stats(stats("a", age=5_000))
        assert rig.monitor.metadata_age_ms("a") == 5_000
        assert rig.monitor.stale_metadata() == []
        rig.monitor.on_stats(stats("a", age=12_000))
        rig.monitor.on_stats(stats("a", age=13_000))
        assert rig.monitor.stale_metadata() == ["a"]
        rig.monitor.on_stats(stats("a", age=100))
        assert rig.monitor.stale_metadata() == []
    events = [e for e in logs if e["event"] == "kafka_metadata_stale_changed"]
    assert [e["stale"] for e in events] == [True, False], "one event per change"
    assert events[0]["log_level"] == "warning"
    assert rig.monitor.metadata_age_ms("never-seen") is None


def test_default_metadata_max_age_is_librdkafkas() -> None:
    rig = Rig()
    assert rig.monitor.metadata_max_age_ms == 900_000
    rig.monitor.on_stats(stats(age=899_999))
    assert rig.monitor.stale_metadata() == []
    rig.monitor.on_stats(stats(age=900_001))
    assert rig.monitor.stale_metadata() == ["t"]


# --------------------------------------------------------------------------- events


def test_one_structlog_event_per_state_change_and_nothing_per_error() -> None:
    rig = Rig()
    with structlog.testing.capture_logs() as logs:
        rig.leader(1)
        for _ in range(50):
            rig.monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "t", 0)
        rig.tick(61, leader=1)
    assert [(e["event"], e["log_level"], e["state"]) for e in logs] == [
        ("kafka_leadership_state_changed", "warning", "transient_burst"),
        ("kafka_leadership_state_changed", "info", "stable"),
    ]
    assert logs[0]["topic"] == "t" and logs[0]["partition"] == 0


def test_a_failing_listener_does_not_break_the_callback() -> None:
    rig = Rig()
    seen: list[LeadershipChange] = []

    def bad(change: LeadershipChange) -> None:
        raise RuntimeError("boom")

    rig.monitor.add_listener(bad)
    rig.monitor.add_listener(seen.append)
    with structlog.testing.capture_logs() as logs:
        rig.leader(1)
        rig.leader(2)
    assert len(seen) == 1
    assert any(e["event"] == "leadership_listener_failed" for e in logs)
    rig.monitor.remove_listener(bad)
    rig.monitor.remove_listener(bad)  # unknown: ignored


def test_snapshot_is_json_ready_and_worst_state() -> None:
    rig = Rig()
    rig.monitor.on_stats(stats("t", {0: 1, 1: 2}))
    assert rig.monitor.worst_state() is STABLE
    rig.monitor.on_stats(stats("t", {0: 1, 1: 3}))
    snap = rig.monitor.snapshot()
    json.dumps(snap)
    assert snap["state"] == "transient_burst"
    assert snap["partitions"]["t[1]"]["state"] == "transient_burst"
    assert snap["partitions"]["t[1]"]["leader"] == 3
    assert snap["partitions"]["t[0]"]["state"] == "stable"
    assert snap["topics"]["t"] == {"metadata_age_ms": 1000.0, "stale": False}
    assert snap["policy"]["window_s"] == 120.0
    assert rig.monitor.worst_state() is BURST


def test_concurrent_feeding_and_querying() -> None:
    monitor = LeadershipMonitor(ChurnPolicy(quiet_period_s=0.01))
    stop = threading.Event()
    problems: list[BaseException] = []

    def feed() -> None:
        leader = 1
        try:
            while not stop.is_set():
                leader = 3 - leader
                monitor.on_stats(stats("t", {0: leader, 1: leader}))
                monitor.on_error(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), "t", 1)
        except BaseException as exc:  # pragma: no cover - reported below
            problems.append(exc)

    threads = [threading.Thread(target=feed) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(200):
        monitor.states()
        monitor.snapshot()
    stop.set()
    for t in threads:
        t.join()
    assert problems == []
    assert set(monitor.states()) == {("t", 0), ("t", 1)}
