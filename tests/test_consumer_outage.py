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
asserts several) and, past a minute, the reminder line. The four run side by side (below).

The negative control (``outage_retry=None``, the pre-issue-36 semantics kept as an explicit
policy) dead-letters the records of the same kind of outage: the fault is real.

Then the edges, ONE body for both consumers (parametrised ``sync``/``aio``, short policies so
each takes seconds): an outage longer than the outage limit (one dead letter per limit, the
outage goes on), a record failing at the tail of a partition (kept uncommitted until a probe
record arrives or the limit), and a probe handled out of turn when the consumer stops before
the records before it are settled (handled again after a restart). ``_check_common`` is shared
with tests/test_aio_consumer_outage.py, and the two consumers' probe options are checked equal.

The outages and most edge scenarios run in the background from the module's first test on
(the ``background`` fixture: each mostly waits), while the pure tests and the one edge test
whose proof hangs on a one-second window (a record of another partition handled between two
tries of a probe) run in the foreground; the tests checking a background scenario come last
and wait for its end. The file pays about the 60 s outage's time for all of them.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import itertools
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import tenacity
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import (
    Runner,
    TopicFactory,
    committed,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.aio import AsyncResilientConsumer
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
        ready_after = _get(port, "/ready")
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
        "ready_after": ready_after,
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
    status, body = result["ready_after"]  # and clear once it is over
    assert status == 200 and body["reasons"] == [], body
    # at most 5 loud lines for the outage (each poison dead letter has its own lines: the
    # sync consumer's kafka_message_dead_lettered, the asyncio one's message_dead_lettered)
    loud = [
        line
        for line in log.loud()
        if line[1] not in ("message_failed", "kafka_message_dead_lettered", "message_dead_lettered")
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


#: The four outages on the real cluster, by the test that checks each: they run side by side
#: (below), each on its own topics, group and consumer.
OUTAGES: dict[str, dict[str, Any]] = {
    # Acceptance 1, the 60 s: records of different partitions fail in a row.
    "test_dependency_down_60s_three_partitions_nothing_dead_lettered": {
        "partitions": 3,
        "per_partition": 100,
        "down_for": 60.0,
        "poison_every": None,
    },
    "test_dependency_down_one_partition_with_poison_per_message": {
        "partitions": 1,
        "per_partition": 400,
        "down_for": 35.0,  # the probe phase takes ~8 s before the outage starts: one cap retry
        "poison_every": 100,
    },
    "test_dependency_down_batch_handler_with_poison": {
        "partitions": 2,
        "per_partition": 200,
        "down_for": 25.0,
        "poison_every": 100,
        "batch": True,
    },
    "test_dependency_down_with_retry_topics_moves_at_most_the_first_record": {
        "partitions": 1,
        "per_partition": 100,
        "down_for": 12.0,
        "poison_every": None,
        "retry_topics": RetryTopicPolicy(delays=(1,)),
    },
}


#: The negative control (below) runs beside them too.
CONTROL = "test_control_without_outage_detection_the_same_outage_dead_letters"


def _run_control(kafka_cluster: KafkaCluster, topic_factory: TopicFactory) -> dict[str, Any]:
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
        outage = consumer.health().outage
    finally:
        runner.stop()
    return {"error": runner.error, "outage": outage, "dead": read_back(bootstrap, dlq)}


# --------------------------------------------------------------------------- both consumers

#: Short policies so the edge tests take seconds: two tries per record, then the evidence.
QUICK_RETRY = RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.1))
#: An outage limit of 6 waits of 0.2 s (the default is 10 minutes).
SHORT_LIMIT = RetryPolicy(stop=tenacity.stop_after_attempt(6), wait=tenacity.wait_fixed(0.2))
#: The tail test's limit: 3 tries (the sync consumer waits at least 5 s for a probe record
#: before each retry of a tail record, so every try there costs 5 s).
TAIL_LIMIT = RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0.2))
#: A limit the tests never reach (the negative control of SHORT_LIMIT).
NO_LIMIT = RetryPolicy(stop=tenacity.stop_after_attempt(100_000), wait=tenacity.wait_fixed(0.2))
KINDS = ("sync", "aio")


class Running:
    """A :class:`ResilientConsumer` or an :class:`AsyncResilientConsumer` (its own event loop)
    run in a thread with the same plain handler, so one test body checks both. ``batch``: the
    sync consumer with a batch handler calling it per record (``BatchItemError`` names the
    record that failed)."""

    def __init__(
        self, kind: str, conf: dict[str, Any], topic: str, handle: Callable[[Any], None], **kw: Any
    ) -> None:
        self.kind = kind
        self.error: BaseException | None = None
        self.consumer: Any
        if kind == "sync":
            self.consumer = ResilientConsumer(
                conf, [topic], handle, install_signal_handlers=False, **kw
            )
        elif kind == "batch":

            def batch(msgs: list[Message]) -> None:
                for i, msg in enumerate(msgs):
                    try:
                        handle(msg)
                    except Exception as exc:
                        raise BatchItemError(index=i) from exc

            self.consumer = ResilientConsumer(
                conf, [topic], None, batch_handler=batch, install_signal_handlers=False, **kw
            )
        else:

            async def ahandle(msg: Message) -> None:
                handle(msg)

            self.consumer = AsyncResilientConsumer(
                conf, [topic], ahandle, handle_signals=False, **kw
            )
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            if self.kind != "aio":
                self.consumer.run()
            else:
                asyncio.run(self.consumer.run())
        except BaseException as exc:
            self.error = exc

    def health(self) -> Any:
        return self.consumer.health()

    def stop(self) -> None:
        self.consumer.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "consumer did not stop"
        assert self.error is None, self.error


class Switch:
    """A dependency the test turns on and off (no clock): down, every call is refused."""

    def __init__(self, down: bool = True) -> None:
        self.down = down
        self.calls = 0

    def call(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionError(f"payments:443 connection refused (password={SECRET})")


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def test_probe_options_are_the_same_for_both_consumers() -> None:
    """Parity: ``health_port``, ``health_host``, ``stall_after_s`` (and ``outage_retry``) exist
    on both consumers with the same defaults and the same annotation."""
    sync = inspect.signature(ResilientConsumer.__init__).parameters
    aio = inspect.signature(AsyncResilientConsumer.__init__).parameters
    for name in ("health_port", "health_host", "stall_after_s", "outage_retry"):
        assert name in sync and name in aio, name
        assert sync[name].default == aio[name].default, name
        assert sync[name].annotation == aio[name].annotation, name
        assert sync[name].kind is aio[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert isinstance(AsyncResilientConsumer.health_port, property)
    assert isinstance(ResilientConsumer.health_port, property)


# --------------------------------------------------------------------------- edge scenarios
# The bodies of the edge tests (below, with what each proves). They run in the background
# (the ``background`` fixture), a few at a time beside the outages; each test waits for its
# own scenario's end and re-raises what failed there.


def _outage_limit(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str, limit: str
) -> None:
    """test_an_outage_longer_than_the_outage_limit_dead_letters_one_record_per_limit."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k", b"ok-%d" % i, None, 0) for i in range(6)])
    dep = Switch(down=True)
    handled: list[bytes] = []

    def handle(msg: Message) -> None:
        dep.call()
        handled.append(msg.value())  # type: ignore[arg-type]

    log = LogRecorder()
    running = Running(
        kind,
        {"bootstrap.servers": bootstrap, "group.id": _group()},
        topic,
        handle,
        retry=QUICK_RETRY,
        outage_retry=SHORT_LIMIT if limit == "short" else NO_LIMIT,
        logger=log,
    )
    try:
        wait_for(lambda: running.health().outage is not None, 60, "the outage")
        if limit == "control":
            # as many refused calls as two limits take (6 each, plus the evidence)
            wait_for(lambda: dep.calls >= 20, 60, "20 refused calls")
            assert running.health().dead_lettered == 0
            assert running.health().outage is not None
        else:
            wait_for(lambda: running.health().dead_lettered >= 2, 60, "two dead letters")
            health = running.health()
            assert health.outage is not None, "the outage ended at the limit"
            assert health.dead_lettered < 6  # one per limit, not the topic
        dep.down = False
        wait_for(
            lambda: (
                len(handled) + running.health().dead_lettered >= 6
                and running.health().dead_letters_pending == 0
            ),
            60,
            "every record settled",
        )
        assert running.health().outage is None
    finally:
        running.stop()
    dead = [m.value() for m in read_back(bootstrap, dlq)]
    if limit == "control":
        assert dead == []
        assert handled == [b"ok-%d" % i for i in range(6)]
        return
    assert len(dead) >= 2 and dead == [b"ok-%d" % i for i in range(len(dead))], dead
    assert handled == [b"ok-%d" % i for i in range(len(dead), 6)]
    failed = [kw for _, e, kw in log.loud() if e == "message_failed"]
    assert len(failed) == len(dead)
    assert all("outage limit" in kw["reason"] and SECRET not in kw["error"] for kw in failed)


def _tail(kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str, ending: str) -> None:
    """test_a_record_failing_at_the_tail_of_a_partition_is_kept_until_a_probe_or_the_limit."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    group = _group()
    produce(bootstrap, topic, [(b"k", b"bad-0", None, 0)])
    attempts: collections.Counter[bytes] = collections.Counter()
    handled: list[bytes] = []

    def handle(msg: Message) -> None:
        value: bytes = msg.value()  # type: ignore[assignment]
        attempts[value] += 1
        if value.startswith(b"bad"):
            raise ConnectionError(f"payments:443 connection refused (password={SECRET})")
        handled.append(value)

    outage_retry = {"probe": NO_LIMIT, "limit": TAIL_LIMIT, "control": None}[ending]
    running = Running(
        kind,
        {"bootstrap.servers": bootstrap, "group.id": group},
        topic,
        handle,
        retry=QUICK_RETRY,
        outage_retry=outage_retry,
    )
    try:
        if ending == "control":
            wait_for(lambda: running.health().dead_lettered == 1, 60, "the dead letter")
            assert attempts[b"bad-0"] == 2  # its RetryPolicy only
        elif ending == "probe":
            # retried past its RetryPolicy (2 tries), under the outage policy, kept
            wait_for(lambda: attempts[b"bad-0"] >= 3, 60, "retries under the outage policy")
            assert running.health().dead_lettered == 0
            assert running.health().outage is None  # one record: no evidence of an outage
            produce(bootstrap, topic, [(b"k", b"ok-1", None, 0)])
            wait_for(lambda: running.health().dead_lettered == 1, 60, "the dead letter")
        else:
            wait_for(lambda: running.health().dead_lettered == 1, 60, "the limit")
            assert attempts[b"bad-0"] >= 3  # kept past its RetryPolicy (2 tries) until then
            assert running.health().outage is None  # one record: no evidence of an outage
        wait_for(lambda: running.health().dead_letters_pending == 0, 30, "the ack")
        if ending == "probe":
            wait_for(lambda: handled == [b"ok-1"], 30, "the probe handled")
    finally:
        running.stop()
    assert [m.value() for m in read_back(bootstrap, dlq)] == [b"bad-0"]
    assert handled == ([b"ok-1"] if ending == "probe" else [])
    end = 2 if ending == "probe" else 1
    assert committed(bootstrap, group, topic, [0]) == {0: end}


def _out_of_turn(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str, stop_early: bool
) -> None:
    """test_a_probe_handled_out_of_turn_is_handled_again_after_a_restart."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    group = _group()
    values = [b"bad-0", b"poison-1", b"ok-2"]
    produce(bootstrap, topic, [(b"k", v, None, 0) for v in values])
    handled: list[bytes] = []
    runs: list[Running] = []

    def handle(msg: Message) -> None:
        value: bytes = msg.value()  # type: ignore[assignment]
        if value.startswith(b"poison"):
            raise ValueError(f"invalid order {value!r}")
        if value.startswith(b"bad") and len(runs) <= 1:
            raise ConnectionError("payments:443 connection refused")
        handled.append(value)
        if value == b"ok-2" and stop_early and len(runs) <= 1:
            runs[0].consumer.stop()  # stops before record 1 is settled

    conf = {"bootstrap.servers": bootstrap, "group.id": group}
    runs.append(Running(kind, conf, topic, handle, retry=QUICK_RETRY, outage_retry=NO_LIMIT))
    try:
        if stop_early:
            runs[0].thread.join(60)
        else:
            wait_for(lambda: runs[0].health().dead_lettered >= 1, 60, "record 0 dead-lettered")
            wait_for(  # the poison record follows at once
                lambda: (
                    runs[0].health().dead_lettered == 2
                    and runs[0].health().dead_letters_pending == 0
                ),
                20,
                "0 and 1 dead-lettered",
            )
    finally:
        runs[0].stop()
    assert handled == [b"ok-2"]  # the probe, handled before the records in front of it
    first = committed(bootstrap, group, topic, [0])[0]
    dead_first = sorted(m.value() for m in read_back(bootstrap, dlq))
    if not stop_early:
        assert first == 3
        assert dead_first == [b"bad-0", b"poison-1"]
    else:
        # never past the probe (nor the unsettled poison record before it)
        assert 0 <= first <= 1 or first == -1001, first
        assert b"poison-1" not in dead_first
    # the restart (the dependency is up: record 0 succeeds now)
    runs.append(Running(kind, conf, topic, handle, retry=QUICK_RETRY, outage_retry=NO_LIMIT))
    try:
        if stop_early:
            wait_for(lambda: handled.count(b"ok-2") == 2, 60, "the probe handled again")
            wait_for(
                lambda: (
                    runs[1].health().dead_lettered == 1
                    and runs[1].health().dead_letters_pending == 0
                ),
                60,
                "the poison record dead-lettered",
            )
        else:
            wait_for(lambda: runs[1].health().rebalances.get("assigned", 0) >= 1, 60, "assigned")
    finally:
        runs[1].stop()
    assert committed(bootstrap, group, topic, [0]) == {0: 3}
    if not stop_early:
        assert handled == [b"ok-2"]
        return
    again = [b"bad-0"] if first in (0, -1001) else []  # not dead-lettered: handled now
    assert handled == [b"ok-2", *again, b"ok-2"]  # at-least-once: the probe handled twice
    assert sorted(m.value() for m in read_back(bootstrap, dlq)) == sorted(
        [*dead_first, b"poison-1"]
    )


#: The edge scenarios, by the test that checks each (its parameters are the scenario's).
EDGES: dict[str, Callable[..., None]] = {
    "test_an_outage_longer_than_the_outage_limit_dead_letters_one_record_per_limit": (
        _outage_limit
    ),
    "test_a_record_failing_at_the_tail_of_a_partition_is_kept_until_a_probe_or_the_limit": _tail,
    "test_a_probe_handled_out_of_turn_is_handled_again_after_a_restart": _out_of_turn,
}
#: Edge scenarios running at once (beside the outages): each takes 2 to 14 s, mostly waiting
#: for a retry's backoff or a rebalance, so a few side by side barely slow each other.
EDGE_WORKERS = 3


@pytest.fixture(scope="module", autouse=True, name="background")
def _background(request: pytest.FixtureRequest) -> Iterator[dict[str, Future[Any]]]:
    """The outages and edge scenarios of the tests selected in this run, started at the
    module's first test: each is mostly waiting (for its dependency's clock, for the outage
    policy's backoff), so side by side they take about the longest one's time instead of the
    sum's (each outage alone: 73 + 41 + 32 + 21 + 8 s; the 16 edge scenarios: 100 s in a
    row). Meanwhile the tests above run in the foreground; the tests checking a background
    scenario come last in this file. Nothing is shared but the cluster: own topics, group,
    consumer, health port, logger and dependency clock. A scenario's failure is its own
    test's (``result()`` raises it there); leaving the fixture waits for every scenario to
    end."""
    items = [item for item in request.session.items if item.module is request.module]
    runs: dict[str, Callable[..., Any]] = {}
    for item in items:
        if item.name in OUTAGES:
            runs[item.name] = functools.partial(_run_outage, **OUTAGES[item.name])
        elif item.name == CONTROL:
            runs[item.name] = _run_control
    edges = [item for item in items if getattr(item, "originalname", None) in EDGES]
    if not runs and not edges:
        yield {}
        return
    kafka_cluster: KafkaCluster = request.getfixturevalue("kafka_cluster")

    def topic_factory(partitions: int = 1, *, name: str | None = None) -> str:
        topic = name or f"t-outage-{uuid.uuid4().hex[:10]}"
        return kafka_cluster.create_topic(topic, partitions, 3, {"min.insync.replicas": 2})

    with (
        ThreadPoolExecutor(max(1, len(runs)), thread_name_prefix="outage") as outages,
        ThreadPoolExecutor(EDGE_WORKERS, thread_name_prefix="edge") as quick,
    ):
        futures: dict[str, Future[Any]] = {
            name: outages.submit(run, kafka_cluster, topic_factory) for name, run in runs.items()
        }
        for item in edges:  # in the file's order: the order their tests ask
            scenario = EDGES[item.originalname]  # type: ignore[attr-defined]
            params = item.callspec.params  # type: ignore[attr-defined]
            futures[item.name] = quick.submit(scenario, kafka_cluster, topic_factory, **params)
        yield futures


def _verdict(background: dict[str, Future[Any]], request: pytest.FixtureRequest) -> Any:
    """This test's background scenario, once it is over (its own bound: an outage's
    dependency time plus the waits of ``_run_outage``; an edge scenario's waits, queued
    behind the others)."""
    name = request.node.name
    if name in OUTAGES:
        return background[name].result(timeout=OUTAGES[name]["down_for"] + 400)
    return background[name].result(timeout=600)


# --------------------------------------------------------------------------- foreground

#: Three tries a second apart: the other partition's record is handled meanwhile.
SLOW_RETRY = RetryPolicy(stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(1.0))


@pytest.mark.integration
@pytest.mark.parametrize("kind", [*KINDS, "batch"])
def test_a_failed_probe_after_a_poison_probe_leaves_the_poison_record_to_its_turn(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, kind: str
) -> None:
    """Partition 0: record 0 keeps failing (retriable), record 1 is poison (as a probe it
    proves nothing), record 2 fails its three tries as the probe. A record of partition 1
    (produced when the probing starts) succeeds meanwhile, so record 0 is bad: dead-lettered
    once the probe gave up; the probe was not handled. The partition goes on from record 1,
    each in its turn: 1 dead-lettered (poison), 2 handled (its 4th try succeeds), the offset
    after 2 committed. Before, the partition went on at the probe: record 1 was neither
    handled nor dead-lettered, and its offset committed."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=2)
    group = _group()
    produce(bootstrap, topic, [(b"k", v, None, 0) for v in (b"bad-0", b"poison-1", b"flaky-2")])
    attempts: collections.Counter[bytes] = collections.Counter()
    handled: list[bytes] = []

    def handle(msg: Message) -> None:
        value: bytes = msg.value()  # type: ignore[assignment]
        attempts[value] += 1
        if value.startswith(b"poison"):
            if attempts[value] == 1:  # the first probe: a success elsewhere from now on
                produce(bootstrap, topic, [(b"k", b"ok-other", None, 1)])
            raise ValueError(f"invalid order {value!r}")
        if value.startswith(b"bad") or (value.startswith(b"flaky") and attempts[value] <= 3):
            raise ConnectionError("payments:443 connection refused")
        handled.append(value)

    log = LogRecorder()
    running = Running(
        kind,
        {"bootstrap.servers": bootstrap, "group.id": group},
        topic,
        handle,
        retry=SLOW_RETRY,
        outage_retry=NO_LIMIT,
        logger=log,
    )
    try:
        wait_for(
            lambda: (
                running.health().dead_lettered == 2
                and running.health().dead_letters_pending == 0
                and b"flaky-2" in handled
            ),
            60,
            "0 and 1 dead-lettered, 2 handled",
        )
        assert running.health().outage is None
    finally:
        running.stop()
    assert attempts[b"bad-0"] == 3  # its RetryPolicy, then the probe
    assert attempts[b"poison-1"] == 2  # as a probe, then in its turn
    assert attempts[b"flaky-2"] == 4  # three as the probe, then once in its turn
    assert handled == [b"ok-other", b"flaky-2"]
    assert sorted(m.value() for m in read_back(bootstrap, dlq)) == [b"bad-0", b"poison-1"]
    failed = {kw["offset"]: kw["reason"] for _, e, kw in log.loud() if e == "message_failed"}
    assert failed == {0: "failed while other records succeeded", 1: "poison (not retried)"}
    assert committed(bootstrap, group, topic, [0, 1]) == {0: 3, 1: 1}


# --------------------------------------------------------------------------- background
# The tests of the scenarios the ``background`` fixture runs: last, so the tests above run
# while those scenarios wait.


@pytest.mark.integration
def test_dependency_down_60s_three_partitions_nothing_dead_lettered(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest
) -> None:
    """Acceptance 1, the issue's 60 s: records of different partitions fail in a row."""
    result = _verdict(background, request)
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
    background: dict[str, Future[Any]], request: pytest.FixtureRequest
) -> None:
    """One partition: the first record's RetryPolicy is exhausted with nothing else handled;
    the next record is probed (the first probe is poison: proves nothing, the probe moves
    on), fails too (its own RetryPolicy): an outage. 1 % poison: exactly those
    dead-lettered."""
    result = _verdict(background, request)
    _check_common(result)
    scenario: Scenario = result["scenario"]
    held = scenario.attempts[(0, 0)]
    assert any(g >= 9.5 for g in _gaps(held)), _gaps(held)  # the cap reached
    assert len(scenario.attempts[(0, 1)]) == 2  # the poison probe, then its dead letter
    assert len(result["poison"]) == 4


@pytest.mark.integration
def test_dependency_down_batch_handler_with_poison(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest
) -> None:
    """Batch handler naming the failed item (``BatchItemError``): the same outcome."""
    result = _verdict(background, request)
    _check_common(result)
    assert len(result["poison"]) == 4


@pytest.mark.integration
def test_dependency_down_with_retry_topics_moves_at_most_the_first_record(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest
) -> None:
    """Retry topics: the record that fails before there is any evidence is moved to the first
    tier; the next one (a distinct record failing) starts the outage and is held in place:
    not every record goes through the tiers into the DLQ."""
    result = _verdict(background, request)
    _check_common(result)
    assert result["health"].moved_to_retry <= 1, result["health"]


@pytest.mark.integration
def test_control_without_outage_detection_the_same_outage_dead_letters(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest
) -> None:
    """Negative control: ``outage_retry=None`` (every failure is the record's, the semantics
    before issue 36) dead-letters good records during the same kind of outage."""
    result = _verdict(background, request)
    assert result["outage"] is None
    assert result["error"] is None, result["error"]
    assert len(result["dead"]) >= 3  # good records dead-lettered: the fault is real


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("limit", ["short", "control"])
def test_an_outage_longer_than_the_outage_limit_dead_letters_one_record_per_limit(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest, kind: str, limit: str
) -> None:
    """The dependency stays down past the outage limit (``outage_retry``'s stop, here 6 tries
    of 0.2 s): the held record is dead-lettered (``message_failed`` names the limit), the
    outage goes on for the next record, held again: one dead letter per limit, in order, not
    the topic. Control: with a limit not reached, the same outage dead-letters nothing."""
    _verdict(background, request)


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ending", ["probe", "limit", "control"])
def test_a_record_failing_at_the_tail_of_a_partition_is_kept_until_a_probe_or_the_limit(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest, kind: str, ending: str
) -> None:
    """The last record of a partition keeps failing (retriable), nothing else to handle: no
    evidence either way, so it is kept uncommitted and retried under the outage policy's
    backoff past its RetryPolicy, until a record after it arrives (the probe: handled, the
    failed one dead-lettered) or the outage limit (dead-lettered). Control
    (``outage_retry=None``): dead-lettered once its RetryPolicy is exhausted."""
    _verdict(background, request)


@pytest.mark.integration
@pytest.mark.parametrize("kind", [*KINDS, "batch"])
@pytest.mark.parametrize("stop_early", [True, False])
def test_a_probe_handled_out_of_turn_is_handled_again_after_a_restart(
    background: dict[str, Future[Any]], request: pytest.FixtureRequest, kind: str, stop_early: bool
) -> None:
    """Record 0 keeps failing (retriable), record 1 is poison (as a probe it proves nothing:
    left for its turn), record 2 is the probe that is handled, out of turn. The consumer
    stops while the probe is handled, before record 1 is settled: the stored offset stays
    before the probe, so a restart handles it again (at-least-once) and dead-letters the
    poison record then. Control: not stopped, 0 and 1 are dead-lettered, the offset after 2
    is committed (2 handled once, a restart handles nothing). The same with a batch handler
    (its probe is a run of records)."""
    _verdict(background, request)
