"""LeadershipMonitor hardening (issue 23 defects 6, 9 and 14): it never raises from a callback,
it takes the caller's classification, and it forgets partitions that left the metadata.

Unit tests on a fake clock with generated statistics documents (librdkafka's shape, only the
fields the monitor reads); one test on the real cluster for a deleted topic.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka import KafkaError

from kresilient.errors import ErrorCategory, classify
from kresilient.leadership import ChurnPolicy, LeadershipChange, LeadershipMonitor, LeadershipState

STABLE = LeadershipState.STABLE
BURST = LeadershipState.TRANSIENT_BURST


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def generated_stats(topics: dict[str, int], leader: int = 1, age: int = 1000) -> str:
    """A generated statistics document: *topics* maps name -> partition count."""
    return json.dumps(
        {
            "topics": {
                name: {
                    "metadata_age": age,
                    "partitions": {
                        "-1": {"partition": -1, "leader": -1},
                        **{str(p): {"partition": p, "leader": leader} for p in range(n)},
                    },
                }
                for name, n in topics.items()
            }
        }
    )


def rig(**kw: Any) -> tuple[LeadershipMonitor, Clock, list[LeadershipChange]]:
    clock = Clock()
    changes: list[LeadershipChange] = []
    monitor = LeadershipMonitor(clock=clock, **kw)
    monitor.add_listener(changes.append)
    return monitor, clock, changes


# --- defect 14: on_stats never raises ----------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [
        "[" * 200_000 + "]" * 200_000,  # deeply nested JSON: RecursionError in json
        '{"topics": ' * 100_000 + "{}" + "}" * 100_000,
    ],
    ids=["nested-arrays", "nested-objects"],
)
def test_deeply_nested_statistics_json_is_counted_not_raised(doc: str) -> None:
    with pytest.raises(RecursionError):  # negative control: the document really is hostile
        json.loads(doc)
    monitor, _, _ = rig()
    monitor.on_stats(doc)
    monitor.on_stats(doc.encode())
    snap = monitor.snapshot()
    assert snap["unparsable_stats"] == 2
    assert snap["stats_ticks"] == 0
    monitor.on_stats(generated_stats({"t": 1}))  # and the monitor keeps working
    assert monitor.leader("t", 0) == 1


def test_a_statistics_mapping_that_raises_is_counted_not_raised() -> None:
    class Hostile(dict[str, Any]):
        def get(self, *_: Any, **__: Any) -> Any:
            raise KeyError("boom")

    monitor, _, _ = rig()
    monitor.on_stats(Hostile())
    assert monitor.snapshot()["unparsable_stats"] == 1


# --- defect 6 (monitor side): the caller's classification ---------------------------------


def test_on_error_takes_the_callers_classification() -> None:
    err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    # negative control: without context this code IS leadership-class (a leader move)
    assert classify(err).category is ErrorCategory.LEADERSHIP
    delivery = classify(err, context="delivery")
    assert delivery.category is not ErrorCategory.LEADERSHIP

    monitor, _, changes = rig()
    monitor.on_stats(generated_stats({"deleted": 3}))
    for p in range(3):
        monitor.on_error(err, "deleted", p, classification=delivery)
        monitor.on_error(err, "deleted", p, context="delivery")
    assert changes == []
    assert set(monitor.states().values()) == {STABLE}

    monitor.on_error(err, "deleted", 0)  # the old call still works, and still counts
    assert monitor.state("deleted", 0) is BURST


def test_on_delivery_of_a_missing_topic_is_not_leadership_trouble() -> None:
    class Msg:
        def topic(self) -> str:
            return "deleted"

        def partition(self) -> int:
            return 0

    monitor, _, changes = rig()
    monitor.on_stats(generated_stats({"deleted": 1}))
    for _ in range(50):
        monitor.on_delivery(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), Msg())
    assert changes == []
    assert monitor.worst_state() is STABLE
    # a real leadership error in a delivery report still counts
    monitor.on_delivery(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION), Msg())
    assert monitor.state("deleted", 0) is BURST


@pytest.mark.integration
def test_delivery_reports_after_deleting_the_topic_on_the_real_cluster_are_not_leadership(
    kafka_cluster: Any, topic: str
) -> None:
    """Real delivery reports for a topic deleted while the producer still writes to it."""
    reports: list[tuple[Any, Any]] = []
    producer = ck.Producer(
        {
            "bootstrap.servers": kafka_cluster.bootstrap_servers,
            "message.timeout.ms": 5000,
            "topic.metadata.refresh.interval.ms": 500,
            # The broker's UNKNOWN_TOPIC_OR_PART reaches the delivery report once librdkafka
            # gives up on the vanished topic, after topic.metadata.propagation.max.ms (30 s
            # by default, which this test used to wait for).
            "topic.metadata.propagation.max.ms": 2000,
        }
    )
    producer.produce(topic, b"before")
    assert producer.flush(30) == 0
    # Produce while the topic is being deleted: messages in flight then get the brokers'
    # UNKNOWN_TOPIC_OR_PART. Once librdkafka's metadata says the topic is gone, produce()
    # refuses at once (_UNKNOWN_TOPIC); starting only after the deletion had settled, a CI
    # run under load met only that refusal.
    failed: list[BaseException] = []

    def delete() -> None:
        try:
            kafka_cluster.delete_topic(topic)
        except BaseException as exc:  # re-raised by the test thread
            failed.append(exc)

    deleting = threading.Thread(target=delete)
    deleting.start()
    refused = 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not any(
        e is not None and e.code() == KafkaError.UNKNOWN_TOPIC_OR_PART for e, _ in reports
    ):
        try:
            producer.produce(topic, b"after", on_delivery=lambda e, m: reports.append((e, m)))
        except ck.KafkaException as exc:
            if exc.args[0].code() != KafkaError._UNKNOWN_TOPIC:
                raise
            refused += 1
        producer.poll(0.05 if deleting.is_alive() else 0.5)
    deleting.join()
    if failed:
        raise failed[0]
    producer.flush(10)
    missing = [
        (e, m) for e, m in reports if e is not None and e.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    ]
    assert missing, f"no UNKNOWN_TOPIC_OR_PART report ({refused} refused): {reports[:5]}"
    # negative control: classified without the delivery context, this is a leadership error
    assert classify(missing[0][0]).category is ErrorCategory.LEADERSHIP
    # the monitor knew the topic's partition from the statistics before it was deleted
    monitor, _, changes = rig()
    monitor.on_stats(generated_stats({topic: 1}))
    for err, msg in reports:
        monitor.on_delivery(err, msg)
    assert changes == []
    assert monitor.worst_state() is STABLE
    # negative control: the same reports, re-classified without the delivery context, would
    # put the partition in a leadership burst (what the producer used to cause)
    control, _, control_changes = rig()
    control.on_stats(generated_stats({topic: 1}))
    for err, msg in missing:
        control.on_error(err, msg.topic(), msg.partition())
    assert [c.state for c in control_changes] == [BURST]


# --- defect 9: forgetting, and a tick linear in the live partitions -----------------------


def test_partitions_absent_from_the_statistics_are_forgotten() -> None:
    monitor, clock, _ = rig()  # default forget_after_s: 600 s
    monitor.on_stats(generated_stats({"old": 100, "kept": 2}))
    assert len(monitor.states()) == 102
    for _ in range(1000):  # statistics.interval.ms=1000 for 1000 s without "old"
        clock.now += 1
        monitor.on_stats(generated_stats({"kept": 2}))
    assert set(monitor.states()) == {("kept", 0), ("kept", 1)}
    assert monitor.metadata_age_ms("old") is None
    assert monitor.metadata_age_ms("kept") == 1000
    assert monitor.snapshot()["forgotten_partitions"] == 100


def test_statistics_alone_forget_partitions_without_any_query() -> None:
    """A client nobody asks for health(): the statistics ticks themselves forget."""
    monitor, clock, _ = rig()  # default forget_after_s: 600 s
    monitor.on_stats(generated_stats({"old": 3, "kept": 1}))
    for _ in range(1000):
        clock.now += 1
        monitor.on_stats(generated_stats({"kept": 1}))
    # leader() reads under the lock without evaluating or sweeping
    assert monitor.leader("old", 0) is None
    assert monitor.leader("kept", 0) == 1
    assert monitor.metadata_age_ms("old") is None


def test_a_partition_leaving_during_a_burst_settles_before_it_is_forgotten() -> None:
    monitor, clock, changes = rig(forget_after_s=100)
    monitor.on_stats(generated_stats({"t": 1}, leader=1))
    clock.now += 1
    monitor.on_stats(generated_stats({"t": 1}, leader=2))  # a move: a burst
    assert monitor.state("t", 0) is BURST
    clock.now += 59  # the topic leaves the metadata while the burst is on
    monitor.on_stats(generated_stats({}))
    assert monitor.state("t", 0) is BURST
    clock.now += 2  # the quiet period ends: STABLE, announced, then forgotten later
    monitor.refresh()
    assert [c.state for c in changes] == [BURST, STABLE]
    clock.now += 200
    monitor.refresh()
    assert monitor.states() == {}


def test_a_forgotten_partition_seen_again_starts_fresh() -> None:
    monitor, clock, changes = rig(forget_after_s=100)
    monitor.on_stats(generated_stats({"t": 1}, leader=1))
    clock.now += 500
    monitor.refresh()
    assert monitor.states() == {}
    monitor.on_stats(generated_stats({"t": 1}, leader=3))  # first sighting: not a move
    assert monitor.state("t", 0) is STABLE and changes == []
    assert monitor.leader("t", 0) == 3


def test_forget_after_must_exceed_the_quiet_period() -> None:
    with pytest.raises(ValueError, match="forget_after_s"):
        LeadershipMonitor(ChurnPolicy(quiet_period_s=60), forget_after_s=30)


def test_scale_rotating_topic_sets_keep_the_monitor_bounded() -> None:
    """Generated statistics documents: 40 topic sets of 2,500 partitions, one set at a time.

    Before the fix every partition ever seen stayed (100,000 here); now the monitor holds the
    live set plus those absent for less than forget_after_s.
    """
    monitor, clock, _ = rig()  # default forget_after_s: 600 s
    docs = [generated_stats({f"rot-{i}-{j}": 250 for j in range(10)}) for i in range(40)]
    peak = 0
    for doc in docs:
        for _ in range(12):  # 12 ticks of 15 s per topic set: 180 s each
            clock.now += 15
            monitor.on_stats(doc)
        peak = max(peak, len(monitor.states()))
    # the live set + the sets absent for less than 600 s (+ up to 300 s until the next sweep)
    assert peak <= 2_500 * 6
    assert len(monitor.states()) <= 2_500 * 6
    assert monitor.snapshot()["forgotten_partitions"] >= 2_500 * 34


def test_a_topic_wide_error_after_the_topic_is_forgotten_is_unattributed() -> None:
    monitor, clock, changes = rig(forget_after_s=100)
    monitor.on_stats(generated_stats({"gone": 3, "live": 2}))
    clock.now += 500
    monitor.on_stats(generated_stats({"live": 2}))
    monitor.refresh()
    assert set(monitor.states()) == {("live", 0), ("live", 1)}
    err = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    monitor.on_error(err, "gone")  # no partition: every KNOWN partition of the topic
    assert monitor.snapshot()["unattributed_errors"] == 1
    monitor.on_error(err, "live")
    assert monitor.state("live", 0) is BURST and monitor.state("live", 1) is BURST
    assert {(c.topic, c.partition) for c in changes} == {("live", 0), ("live", 1)}
