"""The consumers' stall reports (issue 42, acceptance 1, consumer side).

``ConsumerProbes`` (one implementation for ``ResilientConsumer`` and
``AsyncResilientConsumer``) checks for stalls once a second in a watcher thread, without
anyone polling ``/ready``: one ``consumer_stalled`` WARNING when a stall begins, nothing while
it lasts, one ``consumer_stalled_cleared`` INFO when it ends; one ``consumer_rebalance_loop``
WARNING for a member without partitions while its rebalances repeat.

On the real (shared) cluster, for both consumers, each test with its negative control first
(the same consumer, the same stream, no fault: no WARNING while the watcher checks past the
bound):

* a handler that does not return is one stall, reported once while it lasts, ``health()``
  not healthy, counted by ``kresilient.consumer.stalls``, cleared once when it returns;
* an idle member (a group with more members than partitions) is no rebalance loop; a member
  kept without partitions while another member joins and leaves again and again is one.

With a fake clock (``_fake``: what a real cluster cannot provoke on demand): librdkafka's
Join/Sync/SyncError loop (#3866), a member whose rebalances complete empty again and again;
and the rule that a partition held by a dependency outage is no stall.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import pytest
from confluent_kafka import Message, Producer, TopicPartition
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from structlog.testing import capture_logs

import kresilient.consumer._probes as probes_module
from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ResilientConsumer
from kresilient.consumer._probes import STALLS_METRIC, ConsumerProbes
from kresilient.testing import KafkaCluster

STALL_AFTER_S = 1.0
KINDS = ["sync", "aio"]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)  # polling a condition, not settling


def _events(logs: Sequence[Mapping[str, Any]], event: str, group: str) -> list[Mapping[str, Any]]:
    # the sync consumer's logger binds group_id, the asyncio consumer's group
    return [e for e in logs if e["event"] == event and group in (e.get("group_id"), e.get("group"))]


def _stalls_counted(reader: InMemoryMetricReader, kind: str) -> float | None:
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != STALLS_METRIC:
                    continue
                for point in metric.data.data_points:
                    attrs = point.attributes or {}
                    if attrs.get("kresilient.stall.kind") == kind:
                        return float(point.value)  # type: ignore[union-attr]
    return None


class _Run:
    """A consumer of either kind running in a thread of its own. Handlers are written once
    as plain functions; the asyncio consumer's handler awaits while ``block`` is set (the
    event loop runs on), the sync consumer's blocks its loop thread."""

    def __init__(
        self,
        kind: str,
        config: dict[str, Any],
        topic: str,
        handle: Callable[[Message], Any],
        **options: Any,
    ) -> None:
        self.kind = kind
        self.stall_after_s = float(options["stall_after_s"])
        self.error: BaseException | None = None
        self.consumer: Any
        if kind == "sync":
            self.consumer = ResilientConsumer(
                config, [topic], handle, install_signal_handlers=False, **options
            )
        else:

            async def ahandle(msg: Message) -> None:
                wait = handle(msg)
                if wait is not None:  # an Event to await without blocking the loop
                    while not wait.is_set():
                        await asyncio.sleep(0.05)

            self.consumer = AsyncResilientConsumer(
                config, [topic], ahandle, handle_signals=False, **options
            )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            if self.kind == "sync":
                self.consumer.run()
            else:
                asyncio.run(self.consumer.run())
        except BaseException as exc:
            self.error = exc

    @property
    def checks(self) -> int:
        """The stall checks the watcher thread has made so far."""
        return int(self.consumer._probes.checks)

    def watched_past_the_bound(self, checks: int | None = None) -> None:
        """Wait (on a condition) until the watcher has checked once a second for longer
        than the bound and one check more (or ``checks`` times): a stall present now would
        have been reported by then."""
        target = self.checks + (int(self.stall_after_s) + 2 if checks is None else checks)
        wait_for(lambda: self.checks >= target, 30, "the watcher's checks")

    def stop(self) -> None:
        self.consumer.stop()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"the {self.kind} consumer did not stop"
        assert self.error is None, repr(self.error)


def _conf(cluster: KafkaCluster, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": cluster.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **extra,
    }


def _topic(cluster: KafkaCluster, prefix: str) -> str:
    """A one-partition topic and its dead-letter topic (the consumers check it at start)."""
    topic = cluster.create_topic(f"{prefix}-{uuid.uuid4().hex[:8]}", 1, 1, {})
    cluster.create_topic(f"{topic}.dlq", 1, 1, {})
    return topic


def _produce(bootstrap: str, topic: str, values: Iterable[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_a_handler_that_does_not_return_is_one_stall_reported_once_until_it_returns(
    kafka_cluster: KafkaCluster, kind: str
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = _topic(kafka_cluster, "cstall")
    group = f"g-{uuid.uuid4().hex[:10]}"
    release, entered = threading.Event(), threading.Event()
    handled: list[bytes] = []

    def handle(msg: Message) -> threading.Event | None:
        handled.append(msg.value() or b"")
        if msg.value() == b"hang":
            entered.set()
            if kind == "sync":
                release.wait(60)
                return None
            return release
        return None

    reader = InMemoryMetricReader()
    with capture_logs() as logs:
        run = _Run(
            kind,
            _conf(kafka_cluster, group),
            topic,
            handle,
            stall_after_s=STALL_AFTER_S,
            meter_provider=MeterProvider(metric_readers=[reader]),
        )
        try:
            # the control: the same consumer and stream, every handler returns: no stall
            _produce(bootstrap, topic, [b"a", b"b", b"c"])
            wait_for(lambda: len(handled) == 3, 60, "the first records")
            run.watched_past_the_bound()
            assert _events(logs, "consumer_stalled", group) == []
            assert run.consumer.health().stalled is None
            # the fault: a handler that does not return
            _produce(bootstrap, topic, [b"hang"])
            assert entered.wait(30)
            wait_for(lambda: bool(_events(logs, "consumer_stalled", group)), 30, "the WARNING")
            run.watched_past_the_bound(checks=2)  # it lasts: nothing more is said
            stalled = _events(logs, "consumer_stalled", group)
            assert len(stalled) == 1, stalled
            event = stalled[0]
            assert event["log_level"] == "warning"
            assert event["kinds"][0] == "handler" and f"{topic}[0]" in event["partitions"]
            assert "a handler has been running" in event["reason"]
            assert event["quiet_s"] > STALL_AFTER_S and event["stalled_since"]
            health = run.consumer.health()
            assert not health.healthy and health.stalls == 1
            assert health.stalled is not None and f"{topic}[0]" in health.stalled
            assert _stalls_counted(reader, "progress") == 1
            assert _events(logs, "consumer_stalled_cleared", group) == []
        finally:
            release.set()
        wait_for(lambda: bool(_events(logs, "consumer_stalled_cleared", group)), 30, "the INFO")
        run.stop()
    cleared = _events(logs, "consumer_stalled_cleared", group)
    assert len(cleared) == 1 and cleared[0]["log_level"] == "info", cleared
    assert cleared[0]["stalled_for_s"] > STALL_AFTER_S
    assert len(_events(logs, "consumer_stalled", group)) == 1
    assert handled == [b"a", b"b", b"c", b"hang"]  # nothing skipped, nothing twice


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_an_idle_member_of_a_group_with_more_members_than_partitions_is_no_rebalance_loop(
    kafka_cluster: KafkaCluster, kind: str
) -> None:
    """The rebalance loop's negative control on the real cluster: a group of two members and
    one partition. The member left without it (an empty assignment: its rebalance callback
    was called) holds nothing for longer than ``stall_after_s``, but its rebalances do not
    repeat: no ``consumer_rebalance_loop``, no ``consumer_stalled``, ``/ready`` 200. (The
    loop itself: the fake-clock test below; a real group cannot be made to rebalance three
    times within 3 x ``stall_after_s`` on demand: a member joining and leaving again took
    about 6 s per round here.)"""
    topic = _topic(kafka_cluster, "cloop")
    group = f"g-{uuid.uuid4().hex[:10]}"
    conf = _conf(kafka_cluster, group, **{"partition.assignment.strategy": "cooperative-sticky"})
    with capture_logs() as logs:
        first = _Run(kind, dict(conf), topic, lambda _m: None, stall_after_s=STALL_AFTER_S)
        second: _Run | None = None
        try:
            wait_for(lambda: bool(first.consumer._probes.parts), 60, "the first member assigned")
            second = idle = _Run(
                kind, dict(conf), topic, lambda _m: None, stall_after_s=STALL_AFTER_S, health_port=0
            )
            wait_for(
                lambda: idle.consumer.health().rebalances["assigned"] >= 1,
                60,
                "the second member's (empty) assignment",
            )
            assert not idle.consumer._probes.parts and first.consumer._probes.parts
            idle.watched_past_the_bound()
            assert not idle.consumer._probes.parts  # idle for longer than the bound
            status, body = _get(idle.consumer.health_port, "/ready")
            assert status == 200, body
            assert idle.consumer.health().stalled is None
        finally:
            if second is not None:
                second.stop()
            first.stop()
    assert _events(logs, "consumer_rebalance_loop", group) == []
    assert _events(logs, "consumer_stalled", group) == []


# --------------------------------------------------------------------------- fakes


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Source:
    """A consumer's state as the probes read it, made up."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, int], int] = {}
        self.holds: set[tuple[str, int]] = set()
        self.running: list[tuple[float, Collection[str]]] = []  # handlers in hand

    def stored_offsets(self) -> Mapping[tuple[str, int], int]:
        return self.stored

    def handlers(self) -> list[tuple[float, Collection[str]]]:
        return self.running

    def retry_waits(self) -> list[tuple[tuple[str, int], int, float]]:
        return []

    def held(self) -> Collection[tuple[str, int]]:
        return self.holds

    def duplicates(self) -> int:
        return 0


def _probes(
    clock: _Clock, source: _Source | None = None, *, on_stall: str = "report"
) -> ConsumerProbes:
    probes = ConsumerProbes(
        None,
        source or _Source(),
        stall_after_s=2.0,
        max_poll_s=300.0,
        group="g-fake",
        clock=clock,
        on_stall=on_stall,
    )
    probes.running = True
    return probes


def _seconds(probes: ConsumerProbes, clock: _Clock, seconds: int) -> None:
    """``seconds`` of fake time, checked once a second as the watcher does."""
    for _ in range(seconds):
        clock.now += 1.0
        probes.last_poll = clock.now
        probes.check()


def test_a_rebalance_loop_fake_clock_member_without_partitions_while_rebalances_repeat() -> None:
    """librdkafka's Join/Sync/SyncError loop (#3866) cannot be provoked on demand on a real
    cluster: a fake clock drives the probes. The member loses its partition, then every
    1.5 s a rebalance completes without one (revoke, empty assign): one WARNING once it held
    nothing for longer than ``stall_after_s``, ``/ready`` 503 naming it, one INFO when it
    gets a partition again."""
    clock = _Clock()
    probes = _probes(clock)
    with capture_logs() as logs:
        probes.on_assign([TopicPartition("t", 0)])
        _seconds(probes, clock, 5)
        assert probes.ready(clock.now) == (True, [])
        for _ in range(8):
            probes.forget([("t", 0)])
            probes.on_assign([])
            clock.now += 0.5
            _seconds(probes, clock, 1)
        loops = _events(logs, "consumer_rebalance_loop", "g-fake")
        assert len(loops) == 1, loops
        assert loops[0]["log_level"] == "warning" and loops[0]["rebalances"] >= 3
        assert loops[0]["without_partitions_s"] > 2.0
        ok, reasons = probes.ready(clock.now)
        assert not ok and any("rebalance loop" in r for r in reasons), reasons
        assert probes.stall_fields()["stalled"] is not None
        assert probes.stall_fields()["stalls"] == 1
        probes.on_assign([TopicPartition("t", 0)])
        _seconds(probes, clock, 3)
        assert probes.ready(clock.now)[0]
    cleared = _events(logs, "consumer_rebalance_loop_cleared", "g-fake")
    assert len(cleared) == 1 and cleared[0]["log_level"] == "info"
    assert len(_events(logs, "consumer_rebalance_loop", "g-fake")) == 1
    assert _events(logs, "consumer_stalled", "g-fake") == []


def test_no_rebalance_loop_fake_clock_idle_member_and_a_single_later_rebalance() -> None:
    """The control of the test above: a member given no partition (more members than
    partitions) whose rebalances do not repeat: one empty assignment, then, a minute later,
    one more rebalance (another member joins): never a loop, ``/ready`` stays 200."""
    clock = _Clock()
    probes = _probes(clock)
    with capture_logs() as logs:
        probes.on_assign([])
        _seconds(probes, clock, 60)
        probes.forget([])
        probes.on_assign([])
        _seconds(probes, clock, 20)
        assert probes.ready(clock.now) == (True, [])
    assert _events(logs, "consumer_rebalance_loop", "g-fake") == []
    assert _events(logs, "consumer_stalled", "g-fake") == []


def test_a_partition_held_by_a_dependency_outage_is_no_stall_fake() -> None:
    """The rule on made-up figures: a partition with lag whose offset does not move is a
    stall (one WARNING, ``progress``) unless the consumer holds it (a retry wait, a
    dependency outage: reported as an outage, with its own WARNING)."""
    clock = _Clock()
    source = _Source()
    probes = _probes(clock, source)
    tp = ("t", 0)
    with capture_logs() as logs:
        probes.on_assign([TopicPartition(*tp)])
        probes.parts[tp].lag = 5  # what tick() measures from the watermarks
        source.holds.add(tp)
        _seconds(probes, clock, 10)
        assert _events(logs, "consumer_stalled", "g-fake") == []  # held: no stall
        source.holds.clear()
        _seconds(probes, clock, 10)
        stalled = _events(logs, "consumer_stalled", "g-fake")
        assert len(stalled) == 1 and stalled[0]["kinds"] == ["progress"], stalled
        assert stalled[0]["partitions"] == ["t[0]"]
        probes.parts[tp].lag = 0
        probes.parts[tp].moved(clock.now)
        _seconds(probes, clock, 2)
    assert len(_events(logs, "consumer_stalled_cleared", "g-fake")) == 1


def _stats(rxidle_s: float, *, waiting: int = 1, state: str = "UP", source: str = "learned") -> str:
    """A librdkafka statistics document (its shape: ``brokers`` before the large ``topics``)
    with one broker leading t[0]."""
    broker = {
        "name": "127.0.0.1:9092/1",
        "nodeid": 1,
        "source": source,
        "state": state,
        "waitresp_cnt": waiting,
        "rxidle": int(rxidle_s * 1e6),
        "toppars": {"t-0": {"topic": "t", "partition": 0}},
    }
    doc = {"name": "c#consumer-1", "type": "consumer", "brokers": {"b1": broker}, "topics": {}}
    return json.dumps(doc)


def test_a_hung_fetch_from_statistics_fake_is_a_progress_stall_and_a_live_one_is_not() -> None:
    """The hung-fetch rule on made-up statistics (the real one: tests/test_consumer_heal.py):
    the leader connection up, a request waiting, nothing received for longer than the bound +
    fetch.wait.max.ms is a ``progress`` stall, handed to the heal; the controls: received
    0.2 s ago, nothing waiting, the broker down, the coordinator's logical connection, a held
    partition: none."""
    clock = _Clock()
    source = _Source()
    probes = _probes(clock, source, on_stall="heal")
    probes.on_assign([TopicPartition("t", 0)])
    with capture_logs() as logs:
        for doc in (
            _stats(0.2),
            _stats(9.0, waiting=0),
            _stats(9.0, state="DOWN"),
            _stats(9.0, source="logical"),
        ):
            probes.on_stats(doc)
            _seconds(probes, clock, 3)
            assert probes.stalled(clock.now) == [], doc
        source.holds.add(("t", 0))
        probes.on_stats(_stats(9.0))
        _seconds(probes, clock, 3)
        assert _events(logs, "consumer_stalled", "g-fake") == []
        assert probes.remedy is None
        source.holds.clear()
        _seconds(probes, clock, 1)
        (stall,) = _events(logs, "consumer_stalled", "g-fake")
        assert stall["kinds"] == ["progress"] and "fetch not answered" in stall["reason"]
        assert probes.remedy is not None and probes.remedy[0] == "progress"
        probes.on_stats(_stats(0.1))  # answered again
        _seconds(probes, clock, 1)
        assert probes.remedy is None
        assert len(_events(logs, "consumer_stalled_cleared", "g-fake")) == 1


def test_heal_is_never_handed_over_for_a_handler_or_in_report_mode_fake() -> None:
    """The remedy goes to the consumer for a rebalance loop (and ``progress``) only with
    ``on_stall="heal"``: a handler running past the bound is reported, never healed; in
    report mode nothing is handed over. ``healed()`` clears the loop with ``healed=True``."""
    clock = _Clock()
    source = _Source()
    probes = _probes(clock, source, on_stall="heal")
    source.running = [(clock.now, ["t[0]"])]
    _seconds(probes, clock, 4)
    assert probes.stall.active and probes.remedy is None  # a handler: never healed
    source.running = []
    _seconds(probes, clock, 1)
    assert not probes.stall.active
    for on_stall in ("report", "heal"):
        clock = _Clock()
        probes = _probes(clock, on_stall=on_stall)
        with capture_logs() as logs:
            _loop(probes, clock)
            assert probes.loop.active
            if on_stall == "report":
                assert probes.remedy is None
                continue
            assert probes.remedy is not None and probes.remedy[0] == "rebalance_loop"
            probes.healed("rebalance_loop")
            # review6 D2: reported until the new client makes progress, /ready 503 meanwhile
            assert _events(logs, "consumer_rebalance_loop_cleared", "g-fake") == []
            _prove_progress(probes, clock)
        (cleared,) = _events(logs, "consumer_rebalance_loop_cleared", "g-fake")
        assert cleared["healed"] is True
        assert probes.remedy is None and probes.stall_fields()["recreations"] == 1


class _Client:
    """The little of a librdkafka consumer the probes' tick reads."""

    def __init__(self) -> None:
        self.high: dict[tuple[str, int], int] = {}

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool = True) -> tuple[int, int]:
        return 0, self.high.get((tp.topic, tp.partition), -1001)

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]


def _prove_progress(probes: ConsumerProbes, clock: _Clock) -> None:
    """The new member is assigned and handles a record (its stored offset moves)."""
    source = probes._source
    assert isinstance(source, _Source)
    probes.consumer = _Client()
    probes.on_assign([TopicPartition("t", 0)])
    ready, reasons = probes.ready(clock.now)
    assert not ready and any("on_stall='heal'" in r for r in reasons), reasons
    source.stored[("t", 0)] = 5
    probes.tick(clock.now)
    assert probes.healed_at is not None  # the first offset seen is no progress yet
    source.stored[("t", 0)] = 6
    probes.tick(clock.now)
    assert probes.healed_at is None


def _broker_stats(state: str) -> str:
    broker = {"nodeid": 1, "source": "configured", "state": state, "waitresp_cnt": 0}
    return json.dumps({"brokers": {"b:1/1": broker}, "topics": {}})


def _loop(probes: ConsumerProbes, clock: _Clock) -> None:
    probes.on_assign([TopicPartition("t", 0)])
    for _ in range(8):  # rebalances completing empty again and again (#3866)
        probes.forget([("t", 0)])
        probes.on_assign([])
        clock.now += 0.5
        _seconds(probes, clock, 1)


def test_a_slow_handler_is_a_handler_stall_not_a_progress_one_to_heal_fake() -> None:
    """CI, 2026-11-30 (the asyncio consumer under load): work arrived on a partition (lag
    0 -> 1, its quiet time starts) a while before its handler started, so the partition's
    "lag without progress" passed the bound before the handler's running time did: the stall
    was reported as ``progress``, and with ``on_stall="heal"`` a slow handler would have
    recreated the consumer. A partition a handler works on is the handler's stall; the
    ticks are left out after the handler starts, as when the polling thread is late."""

    def work_arrived() -> tuple[_Clock, _Source, ConsumerProbes]:
        clock = _Clock()
        source = _Source()
        probes = _probes(clock, source, on_stall="heal")
        client = _Client()
        probes.consumer = client
        probes.on_assign([TopicPartition("t", 0)])
        source.stored[("t", 0)] = 5
        client.high[("t", 0)] = 5
        probes.tick(clock.now)  # caught up
        client.high[("t", 0)] = 6
        probes.tick(clock.now)  # work arrived: lag 1, the partition's quiet time starts
        clock.now += 1.5
        return clock, source, probes

    # control: no handler in hand: 2.5 s of lag without progress is a progress stall, healed
    clock, source, probes = work_arrived()
    _seconds(probes, clock, 1)
    assert probes.stall.active and probes.remedy is not None
    assert probes.remedy[0] == "progress"
    # the same with its handler started 1.5 s after the work arrived
    clock, source, probes = work_arrived()
    with capture_logs() as logs:
        source.running = [(clock.now, ["t[0]"])]
        _seconds(probes, clock, 1)  # 2.5 s without progress, the handler running 1 s
        assert not probes.stall.active and probes.remedy is None
        _seconds(probes, clock, 2)  # the handler running 3 s: past the bound
        assert probes.stall.active and probes.remedy is None  # reported, never healed
    (stalled,) = _events(logs, "consumer_stalled", "g-fake")
    assert stalled["kinds"] == ["handler"], stalled


def test_no_heal_while_no_broker_is_up_fake() -> None:
    """Review6 D5: a Kafka outage was 'healed' (one useless recreation, then the stall
    cleared and ``health()`` healthy for the rest of the outage). No broker up in the
    latest statistics: the stall stays reported, no remedy; control: a broker up, healed."""
    for state, healed in (("DOWN", False), ("UP", True)):
        clock = _Clock()
        probes = _probes(clock, on_stall="heal")
        probes.on_stats(_broker_stats(state))
        _loop(probes, clock)
        assert probes.loop.active
        assert (probes.remedy is not None) is healed, state


def test_heals_back_off_and_a_heal_that_did_not_help_stays_reported_fake() -> None:
    """Review6 D4: heals had no backoff (a slow leader healed every ~12 s, each heal a
    group rebalance). After a heal the next waits max(stall_after_s, 30 s), then twice as
    long; meanwhile the stall stays reported."""
    clock = _Clock()
    probes = _probes(clock, on_stall="heal")
    _loop(probes, clock)
    assert probes.remedy is not None
    probes.healed("rebalance_loop")
    _loop(probes, clock)  # the new member loops too: no progress, still reported
    assert probes.loop.active and probes.healed_at is not None
    assert probes.remedy is None  # within the backoff
    _seconds(probes, clock, 30)
    assert probes.remedy is not None  # 30 s after the first heal
    probes.healed("rebalance_loop")
    _seconds(probes, clock, 31)
    assert probes.remedy is None  # the second waits 60 s
    _seconds(probes, clock, 30)
    assert probes.remedy is not None
    assert probes.stall_fields()["recreations"] == 2


def test_a_watcher_whose_checks_keep_failing_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One check raising in passing is figures read while they moved; checks raising every
    time mean no stall can ever be reported, and that was silent: now one
    ``consumer_stall_check_failed`` WARNING after 5 in a row (the error redacted), none while
    they keep failing, and the count starts again after a check that succeeds."""
    monkeypatch.setattr(probes_module, "CHECK_INTERVAL_S", 0.01)
    clock = _Clock()
    probes = _probes(clock)
    broken = {"on": True}
    real_check = probes.check

    def check(now: float | None = None) -> None:
        if broken["on"]:
            raise RuntimeError("sasl.password=hunter2 figures moved")
        real_check(now)

    probes.check = check  # type: ignore[method-assign]
    try:
        with capture_logs() as logs:
            probes.tick(clock())  # starts the watcher thread
            wait_for(lambda: probes.check_failures >= 12, 30, "a dozen failed checks")
            said = [e for e in logs if e["event"] == "consumer_stall_check_failed"]
            assert len(said) == 1 and said[0]["failures"] == 5
            assert "hunter2" not in str(said[0])
            broken["on"] = False
            wait_for(lambda: probes.check_failures == 0, 30, "a check that succeeds")
    finally:
        probes.close()
