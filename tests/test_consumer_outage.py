"""A bad record or a bad dependency (issue 36, item 1; acceptance 1).

The decision (:class:`kresilient.consumer.OutageDetector`) is pure and tested first; then the
consumer on the real cluster, DEFAULT policies: a handler whose dependency is down for a while
(every record fails with a ``ConnectionError``), then back:

* nothing is dead-lettered, every record is handled exactly once afterwards;
* ``health().outage`` and ``/ready`` (503, reason named) show the outage while it lasts;
* the whole outage logs at most 5 lines at WARNING or above, none with the secret in the
  exception's text;
* with 1 % poison records mixed in (``ValueError``), exactly those are dead-lettered;
* per-message (one partition: the probe path; three partitions: records of different
  partitions failing in a row) and batch handlers; retry topics move at most the first record.

The 60 s test keeps the issue's duration. The shorter variants (12 to 35 s) exercise every
code path of it: the RetryPolicy exhausted (one partition: the probe, retried under its own
policy) or the distinct-record evidence (several partitions), the outage policy's backoff (0.5,
1, 2, 4, 8 s, then the 10 s cap: reached after 15.5 s of waits; the one-partition test asserts
a retry at the cap), the end of the outage at the first success, the records held in the other
partitions resumed at once. A longer outage only adds retries at the cap (the 60 s test
asserts several) and, past a minute, the reminder line.

The negative control (``outage_retry=None``, the pre-issue-36 semantics kept as an explicit
policy) dead-letters the records of the same kind of outage: the fault is real.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import Runner, TopicFactory, produce, wait_for, with_dlq

from kresilient.consumer import (
    BatchItemError,
    OutageDecision,
    OutageDetector,
    ResilientConsumer,
    RetryPolicy,
    RetryTopicPolicy,
)
from kresilient.consumer._holds import Hold, Holds, Verdict
from kresilient.deadletter import CircuitBreakerPolicy
from kresilient.testing import KafkaCluster

SECRET = "hunter2-outage"
LOUD = frozenset({"warning", "warn", "error", "critical", "exception", "fatal"})


# --------------------------------------------------------------------------- pure decision


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_distinct_records_failing_in_a_row_start_an_outage_a_success_ends_it() -> None:
    clock = _Clock()
    d = OutageDetector(clock=clock)
    assert not d.failure(("t", 0, 5), error_type="ConnectionError", error="refused")
    assert not d.failure(("t", 0, 5))  # the same record again is no evidence
    assert not d.active and d.snapshot() is None
    assert d.failure(("t", 1, 9), error_type="ConnectionError", error="refused")
    assert d.active and d.outages == 1
    clock.now += 12.5
    assert not d.failure(("t", 0, 5))  # during the outage: counted, no new start
    snap = d.snapshot()
    assert snap == {
        "since_s": 12.5,
        "error_type": "ConnectionError",
        "error": "refused",
        "failures": 2,
        "outages": 1,
    }
    assert d.success() and not d.active
    assert d.last_duration == 12.5 and d.last_failures == 2
    assert not d.success()  # only the first success ends it


def test_a_success_between_two_failures_is_no_outage() -> None:
    d = OutageDetector()
    d.failure(("t", 0, 5))
    d.success()
    assert not d.failure(("t", 1, 9))
    assert not d.active


def test_a_classified_outage_starts_at_its_first_failure() -> None:
    d = OutageDetector()
    assert d.failure(("t", 0, 5), error_type="SchemaRegistryError", classified=True)
    assert d.active


def test_exhausted_record_dead_lettered_only_if_others_succeeded_since_its_first_failure() -> None:
    d = OutageDetector()
    mark = d.mark()
    d.failure(("t", 0, 5))
    assert d.exhausted(mark) is OutageDecision.PROBE  # nothing else handled: unknown
    d.success()  # another record was handled meanwhile
    d.failure(("t", 0, 5))
    assert d.exhausted(mark) is OutageDecision.DEAD_LETTER
    later = d.mark()
    d.failure(("t", 0, 6))
    d.failure(("t", 1, 1))  # distinct: an outage
    assert d.exhausted(later) is OutageDecision.HOLD


def test_reminder_at_most_once_per_interval_with_the_count_held_back() -> None:
    clock = _Clock()
    d = OutageDetector(clock=clock, reminder_s=60)
    assert d.reminder() is None  # no outage
    d.failure(("t", 0, 1))
    d.failure(("t", 0, 2))
    for _ in range(5):
        d.failure(("t", 0, 2))
    assert d.reminder() is None  # the start was logged just now
    clock.now += 59
    assert d.reminder() is None
    clock.now += 1
    assert d.reminder() == 5
    assert d.reminder() is None
    clock.now += 61
    assert d.reminder() == 0


class _FakeClient:
    """Records pause/seek/resume (a fake: a broker cannot be asked to expire a probe)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def pause(self, parts: list[Any]) -> None:
        self.calls += [("pause", p.offset) for p in parts]

    def seek(self, part: Any) -> None:
        self.calls.append(("seek", part.offset))

    def resume(self, parts: list[Any]) -> None:
        self.calls += [("resume", p.offset) for p in parts]


def test_probe_verdicts_fake() -> None:
    hold = Hold(tp=("t", 0), offset=5, probe=6)
    assert hold.verdict(6) is Verdict.SKIP  # not resumed yet: fetched before the seek
    hold.resumed = True
    assert hold.verdict(5) is Verdict.SKIP  # before the probe: stale
    assert hold.verdict(6) is Verdict.PROBE
    assert hold.verdict(8) is Verdict.PROBE and hold.probe == 8  # 6, 7 gone (compaction)
    assert hold.position() == 8
    hold.probe = None
    assert hold.verdict(5) is Verdict.RETRY and hold.position() == 5


def test_a_probe_without_a_record_gives_way_to_the_held_record_fake() -> None:
    client = _FakeClient()
    holds = Holds(client, LogRecorder(), str)
    now = time.monotonic()
    hold = Hold(tp=("t", 0), offset=5, probe=6, resumed=True, due=now, probe_until=now + 30)
    holds.by_tp[("t", 0)] = hold
    assert holds.service(1.0) == 1.0 and hold.probe == 6  # still waiting for the probe
    assert client.calls == []
    hold.probe_until = now - 1  # nothing came after the held record
    holds.service(1.0)
    assert hold.probe is None and hold.resumed
    # paused and seeked back to the held record, then resumed there: it is retried
    assert client.calls == [("pause", 5), ("seek", 5), ("seek", 5), ("resume", 5)]


# --------------------------------------------------------------------------- real cluster


class LogRecorder:
    """A structlog-shaped logger keeping every line (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def bind(self, **_kw: Any) -> LogRecorder:
        return self

    def __getattr__(self, level: str) -> Callable[..., None]:
        if level.startswith("_"):
            raise AttributeError(level)

        def log(event: Any = None, *_args: Any, **kw: Any) -> None:
            with self._lock:
                self.lines.append((level, str(event), kw))

        return log

    def loud(self) -> list[tuple[str, str, dict[str, Any]]]:
        with self._lock:
            return [line for line in self.lines if line[0] in LOUD]

    def events(self) -> list[str]:
        with self._lock:
            return [event for _, event, _ in self.lines]


class Dependency:
    """Down for ``down_for`` seconds from the first call, then up (the scenario's clock; the
    test waits for conditions, never for this time)."""

    def __init__(self, down_for: float) -> None:
        self.down_for = down_for
        self.first: float | None = None
        self.failures = 0

    def call(self) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        if now - self.first < self.down_for:
            self.failures += 1
            raise ConnectionError(f"payments:443 connection refused (password={SECRET})")

    @property
    def up(self) -> bool:
        return self.first is not None and time.monotonic() - self.first >= self.down_for


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _items(partitions: int, per_partition: int, poison_every: int | None) -> list[Any]:
    items = []
    for p in range(partitions):
        for i in range(per_partition):
            # poison at position 1 (right behind the first record: the probe meets it) and
            # then every poison_every records
            bad = poison_every is not None and (i == 1 or (i > 1 and i % poison_every == 0))
            value = b"poison-%d-%d" % (p, i) if bad else b"ok-%d-%d" % (p, i)
            items.append((b"k%d" % i, value, None, p))
    return items


class Scenario:
    """The handler side: records handled, attempts per record (times), poison raised."""

    def __init__(self, dependency: Dependency) -> None:
        self.dep = dependency
        self.handled: list[bytes] = []
        self.attempts: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
        self.outage_seen: list[dict[str, Any]] = []

    def one(self, msg: Message) -> None:
        self.attempts[(msg.partition(), msg.offset())].append(time.monotonic())  # type: ignore[index]
        value: bytes = msg.value()  # type: ignore[assignment]
        if value.startswith(b"poison"):
            raise ValueError(f"invalid order {value!r}")
        self.dep.call()
        self.handled.append(value)

    def batch(self, msgs: list[Message]) -> None:
        for i, msg in enumerate(msgs):
            try:
                self.one(msg)
            except Exception as exc:
                raise BatchItemError(index=i) from exc


def _run_outage(
    kafka_cluster: KafkaCluster,
    topic_factory: TopicFactory,
    *,
    partitions: int,
    per_partition: int,
    down_for: float,
    poison_every: int | None,
    batch: bool = False,
    retry_topics: RetryTopicPolicy | None = None,
) -> dict[str, Any]:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=partitions)
    for name in retry_topics.topics(topic) if retry_topics is not None else []:
        topic_factory(partitions=partitions, name=name)
    items = _items(partitions, per_partition, poison_every)
    produce(bootstrap, topic, items)
    good = {v for _, v, _, _ in items if v.startswith(b"ok")}
    poison = {v for _, v, _, _ in items if v.startswith(b"poison")}
    scenario = Scenario(Dependency(down_for))
    log = LogRecorder()
    kwargs: dict[str, Any] = {"batch_handler": scenario.batch} if batch else {}
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:10]}"},
        [topic],
        None if batch else scenario.one,
        logger=log,
        health_port=0,
        install_signal_handlers=False,
        retry_topics=retry_topics,
        **kwargs,
    )
    runner = Runner(consumer)
    ready_during: tuple[int, dict[str, Any]] | None = None
    outage_during: dict[str, Any] | None = None
    try:
        wait_for(lambda: consumer.health().outage is not None, 90, "the outage to be reported")
        port = consumer.health_port
        assert port is not None
        outage_during = consumer.health().outage
        ready_during = _get(port, "/ready")
        live_during = _get(port, "/live")
        assert not scenario.dep.up, "the outage was reported only after the dependency was up"
        wait_for(lambda: good <= set(scenario.handled), down_for + 120, "every good record")
        wait_for(
            lambda: (
                consumer.health().dead_letters_pending == 0 and consumer.health().outage is None
            ),
            60,
            "dead letters acknowledged, the outage over",
        )
        wait_for(lambda: _get(port, "/ready")[0] == 200, 60, "/ready 200 after the outage")
        health = consumer.health()
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    dead = read_back(bootstrap, dlq)
    return {
        "scenario": scenario,
        "log": log,
        "good": good,
        "poison": poison,
        "dead": dead,
        "health": health,
        "ready_during": ready_during,
        "live_during": live_during,
        "outage_during": outage_during,
        "topic": topic,
    }


def _check_common(result: dict[str, Any]) -> None:
    scenario: Scenario = result["scenario"]
    log: LogRecorder = result["log"]
    # the fault was real: the dependency failed records for a while
    assert scenario.dep.failures >= 5, scenario.dep.failures
    # every good record handled exactly once (its failed attempts are not handlings)
    counts = collections.Counter(scenario.handled)
    assert set(counts) == result["good"]
    assert max(counts.values()) == 1, [v for v, c in counts.items() if c > 1][:5]
    # exactly the poison records dead-lettered
    assert sorted(m.value() for m in result["dead"]) == sorted(result["poison"])
    assert result["health"].dead_lettered == len(result["poison"])
    # reported while it lasted
    outage = result["outage_during"]
    assert outage is not None and outage["error_type"] == "ConnectionError", outage
    assert "connection refused" in outage["error"] and SECRET not in outage["error"]
    status, body = result["ready_during"]
    assert status == 503 and any("dependency outage" in r for r in body["reasons"]), body
    assert result["live_during"][0] == 200  # held, polling: live
    # at most 5 loud lines for the outage (each poison dead letter has its own lines)
    loud = [
        line
        for line in log.loud()
        if line[1] not in ("message_failed", "kafka_message_dead_lettered")
    ]
    assert len(loud) <= 5, loud
    events = [e for _, e, _ in loud]
    assert events.count("dependency_outage_started") >= 1, events
    assert events.count("dependency_outage_ended") >= 1, events
    started = next(kw for _, e, kw in loud if e == "dependency_outage_started")
    assert "connection refused" in started["error"]
    assert SECRET not in repr(log.lines)
    # per-attempt lines are DEBUG
    assert all(
        level == "debug"
        for level, e, _ in log.lines
        if e in ("message_retry_scheduled", "message_retry_succeeded")
    )
    # the final failure of each poison record: WARNING with the exception text
    failed = [kw for _, e, kw in log.loud() if e == "message_failed"]
    assert len(failed) == len(result["poison"])
    assert all("invalid order" in kw["error"] for kw in failed)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.integration
def test_dependency_down_60s_three_partitions_nothing_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Acceptance 1, the issue's 60 s: records of different partitions fail in a row."""
    result = _run_outage(
        kafka_cluster,
        topic_factory,
        partitions=3,
        per_partition=100,
        down_for=60.0,
        poison_every=None,
    )
    _check_common(result)
    assert result["dead"] == []
    scenario: Scenario = result["scenario"]
    # the same record retried with capped backoff: several retries at the 10 s cap
    held = max(scenario.attempts.values(), key=len)
    at_cap = [g for g in _gaps(held) if g >= 9.5]
    assert len(at_cap) >= 2, _gaps(held)
    assert len(held) <= 15, _gaps(held)  # backed off: not a retry storm


@pytest.mark.integration
def test_dependency_down_one_partition_with_poison_per_message(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """One partition: the first record's RetryPolicy is exhausted with nothing else handled;
    the next record is probed (the first probe is poison: proves nothing, the probe moves
    on), fails too (its own RetryPolicy): an outage. 1 % poison: exactly those
    dead-lettered."""
    result = _run_outage(
        kafka_cluster,
        topic_factory,
        partitions=1,
        per_partition=400,
        down_for=35.0,  # the probe phase takes ~8 s before the outage starts: one cap retry
        poison_every=100,
    )
    _check_common(result)
    scenario: Scenario = result["scenario"]
    held = scenario.attempts[(0, 0)]
    assert any(g >= 9.5 for g in _gaps(held)), _gaps(held)  # the cap reached
    assert len(scenario.attempts[(0, 1)]) == 2  # the poison probe, then its dead letter
    assert len(result["poison"]) == 4


@pytest.mark.integration
def test_dependency_down_batch_handler_with_poison(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Batch handler naming the failed item (``BatchItemError``): the same outcome."""
    result = _run_outage(
        kafka_cluster,
        topic_factory,
        partitions=2,
        per_partition=200,
        down_for=25.0,
        poison_every=100,
        batch=True,
    )
    _check_common(result)
    assert len(result["poison"]) == 4


@pytest.mark.integration
def test_dependency_down_with_retry_topics_moves_at_most_the_first_record(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Retry topics: the record that fails before there is any evidence is moved to the first
    tier; the next one (a distinct record failing) starts the outage and is held in place:
    not every record goes through the tiers into the DLQ."""
    policy = RetryTopicPolicy(delays=(1,))
    result = _run_outage(
        kafka_cluster,
        topic_factory,
        partitions=1,
        per_partition=100,
        down_for=12.0,
        poison_every=None,
        retry_topics=policy,
    )
    _check_common(result)
    assert result["health"].moved_to_retry <= 1, result["health"]


@pytest.mark.integration
def test_control_without_outage_detection_the_same_outage_dead_letters(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Negative control: ``outage_retry=None`` (every failure is the record's, the semantics
    before issue 36) dead-letters good records during the same kind of outage."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"k", b"ok-%d" % i, None, 0) for i in range(20)])
    dep = Dependency(down_for=6.0)
    handled: list[bytes] = []

    def handle(msg: Message) -> None:
        dep.call()
        handled.append(msg.value())  # type: ignore[arg-type]

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:10]}"},
        [topic],
        handle,
        retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.2)),
        outage_retry=None,
        circuit_breaker=CircuitBreakerPolicy(max_consecutive=None, max_ratio=None),
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: len(handled) + consumer.health().dead_lettered >= 20, 90, "all")
        wait_for(lambda: consumer.health().dead_letters_pending == 0, 30, "acks")
        assert consumer.health().outage is None
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert len(read_back(bootstrap, dlq)) >= 3  # good records dead-lettered: the fault is real
