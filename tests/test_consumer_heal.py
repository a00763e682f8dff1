"""The consumers heal a stall by recreating their librdkafka client (issue 42, acceptance 1).

On the real network-fault cluster (the plugin's ``kafka_network_cluster``): the client
connections of two consumers are frozen (``cluster.network.freeze_connections``: no byte
either way, the sockets stay up: librdkafka's hung connection, #5153) while a producer on
connections of its own writes on. Their fetches are never answered, so the cached high
watermarks stand still: the stall is seen in librdkafka's statistics (the leader connection
up, a request waiting, nothing received past ``stall_after_s``). Per consumer kind, in one
test, the same stream:

* ``on_stall="heal"``: one ``consumer_stalled`` WARNING, ``/ready`` 503, one
  ``consumer_recreated`` WARNING (counted by ``health().recreations`` and the
  ``kresilient.consumer.recreations`` counter); the new member resumes from the committed
  offsets: every offset produced is handled, none skipped (a record handled twice is allowed:
  at least once);
* the negative control, ``on_stall="report"`` on the same frozen cluster: one WARNING, no
  recreation, nothing more handled while the healed consumer finishes and the watcher checks
  on, ``/ready`` 503 naming the fetch; once the connections flow again it reads everything.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Message, Producer
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from structlog.testing import capture_logs
from test_consumer_stalls import _events, wait_for

from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import ResilientConsumer
from kresilient.consumer._probes import HEALS_METRIC
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

STALL_AFTER_S = 3.0
PARTITIONS = 2
BEFORE, DURING = 20, 20


def _heals_counted(reader: InMemoryMetricReader) -> float:
    data = reader.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == HEALS_METRIC:
                    total += sum(float(p.value) for p in metric.data.data_points)  # type: ignore[union-attr]
    return total


def _ready(port: int | None) -> int | None:
    if port is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _ready_reasons(port: int | None) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
    return list(json.loads(body)["reasons"])


def _start(
    kind: str, config: dict[str, Any], topic: str, record: Callable[[Message], None], **options: Any
) -> tuple[Any, threading.Thread]:
    """A consumer of either kind handling with ``record``, running in a thread of its own
    (``sync-key``: ``ResilientConsumer(ordering="key")``, its records on a thread pool)."""
    consumer: Any
    if kind == "sync-key":
        options.update(ordering="key")  # crash-loop protection on, as by default
    if kind.startswith("sync"):
        consumer = ResilientConsumer(
            config, [topic], record, install_signal_handlers=False, **options
        )
        thread = threading.Thread(target=consumer.run, daemon=True)
    else:

        async def arecord(msg: Message) -> None:
            record(msg)

        consumer = AsyncResilientConsumer(config, [topic], arecord, handle_signals=False, **options)
        thread = threading.Thread(target=asyncio.run, args=(consumer.run(),), daemon=True)
    thread.start()
    return consumer, thread


class _Member:
    """One consumer of either kind in a thread; records every (partition, offset) handled
    and polls ``/ready`` (the statuses seen)."""

    def __init__(self, kind: str, cluster: KafkaCluster, topic: str, on_stall: str) -> None:
        self.group = f"heal-{on_stall}-{uuid.uuid4().hex[:8]}"
        self.client_id = f"{self.group}-client"
        self.handled: list[tuple[int, int]] = []
        self.readies: list[int] = []
        self.reader = InMemoryMetricReader()
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": self.group,
            "client.id": self.client_id,
            "auto.offset.reset": "earliest",
            # the frozen old member leaves the group at its session timeout (its LeaveGroup
            # is frozen too): the smallest the broker takes, so the new member joins soon
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "statistics.interval.ms": 1000,
        }
        options: dict[str, Any] = {
            "stall_after_s": STALL_AFTER_S,
            "on_stall": on_stall,
            "health_port": 0,
            "meter_provider": MeterProvider(metric_readers=[self.reader]),
        }

        def record(msg: Message) -> None:
            self.handled.append((int(msg.partition() or 0), int(msg.offset() or 0)))

        self.kind = kind
        self.consumer, self._runner = _start(kind, config, topic, record, **options)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_ready, daemon=True)
        self._poller.start()

    def _poll_ready(self) -> None:
        while not self._stop.wait(0.2):  # a probe polled as an orchestrator would
            status = _ready(self.consumer.health_port)
            if status is not None:
                self.readies.append(status)

    def distinct(self) -> set[tuple[int, int]]:
        return set(self.handled)

    def stop(self) -> None:
        self._stop.set()
        self.consumer.stop()
        self._runner.join(60)
        assert not self._runner.is_alive(), f"the {self.kind} consumer did not stop"


@pytest.mark.parametrize("kind", ["sync", "aio"])
def test_a_hung_fetch_is_one_stall_healed_by_a_new_client_nothing_lost_or_skipped(
    kafka_network_cluster: KafkaCluster, kind: str
) -> None:
    cluster = kafka_network_cluster
    topic = cluster.create_topic(f"heal-{uuid.uuid4().hex[:8]}", PARTITIONS, 3, {})
    cluster.create_topic(f"{topic}.dlq", 1, 3, {})
    producer = Producer({"bootstrap.servers": cluster.bootstrap_servers, "client.id": "feeder"})

    def produce(start: int, count: int) -> None:
        for i in range(start, start + count):
            producer.produce(topic, str(i).encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0

    every = {(p, o) for p in range(PARTITIONS) for o in range((BEFORE + DURING) // PARTITIONS)}
    with capture_logs() as logs:
        healer = _Member(kind, cluster, topic, "heal")
        stuck = _Member(kind, cluster, topic, "report")
        members = (healer, stuck)
        try:
            produce(0, BEFORE)
            for m in members:
                wait_for(lambda m=m: len(m.distinct()) == BEFORE, 90, f"{m.group}: first records")
                wait_for(lambda m=m: 200 in m.readies[-3:], 30, f"{m.group}: /ready 200")
            for m in members:
                assert _events(logs, "consumer_stalled", m.group) == []
                frozen = cluster.network.freeze_connections(client_id=m.client_id)
                assert frozen > 0, f"no connection of {m.client_id} to freeze"
            produce(BEFORE, DURING)  # the feeder's own connections are not frozen
            for m in members:
                wait_for(
                    lambda m=m: _events(logs, "consumer_stalled", m.group),
                    STALL_AFTER_S + 15,
                    f"{m.group}: the stall reported",
                )
                (stall,) = _events(logs, "consumer_stalled", m.group)
                assert stall["kinds"] == ["progress"], stall
                assert "fetch not answered" in stall["reason"], stall
                # the cached high watermarks stood still: the lag rule saw nothing
                assert "without progress" not in stall["reason"], stall
            # heal: one recreation, then every offset handled, none skipped
            wait_for(lambda: _events(logs, "consumer_recreated", healer.group), 30, "the heal")
            wait_for(lambda: healer.distinct() == every, 90, "the healed consumer catching up")
            (heal,) = _events(logs, "consumer_recreated", healer.group)
            assert heal["cause"] == "progress", heal
            assert heal["log_level"] == "warning"
            assert healer.consumer.health().recreations == 1
            assert _heals_counted(healer.reader) == 1
            assert 503 in healer.readies, "the healer's /ready was never 503 during the stall"
            assert len(_events(logs, "consumer_stalled", healer.group)) == 1
            # the control: the same fault without the heal, still stuck meanwhile
            stuck_seen = len(stuck.handled)
            assert stuck.distinct() != every
            checks = stuck.consumer._probes.checks
            wait_for(
                lambda: stuck.consumer._probes.checks >= checks + 3, 30, "the control's checks"
            )
            assert len(stuck.handled) == stuck_seen, "the control moved without a heal"
            assert _events(logs, "consumer_recreated", stuck.group) == []
            assert stuck.consumer.health().recreations == 0
            # still 503: the fetch, or (librdkafka's own session timer: its heartbeats are
            # frozen too) the partitions lost and not rejoined: the same stall, said once
            assert _ready(stuck.consumer.health_port) == 503
            assert _ready_reasons(stuck.consumer.health_port)
            assert stuck.consumer.health().stalled is not None
            assert len(_events(logs, "consumer_stalled", stuck.group)) == 1
            cluster.network.heal()  # the frozen connections flow again
            wait_for(lambda: stuck.distinct() == every, 120, "the control after the thaw")
        finally:
            cluster.network.heal()
            for m in members:
                m.stop()


def test_no_false_stall_in_a_rolling_restart_or_an_isolation_healed_in_time(
    kafka_network_cluster: KafkaCluster,
) -> None:
    """Issue 42, acceptance 2: both consumers with the default bound (60 s) and
    ``on_stall="heal"`` stay quiet (no stall, no loop, no recreation) while the stream goes on
    through an isolation of a leader from its clients, healed in time, and a rolling restart of
    the three brokers; every record produced is handled. The stream is written by a
    ``ResilientProducer`` with the default bound and ``on_stall="heal"``: it stays quiet too
    (no stall, no flush stall, no heal) and every message it was given is delivered. The
    controls, on the same stream, a consumer and a producer with a 1 s bound, report the
    isolation (the watchers were live)."""
    cluster = kafka_network_cluster
    topic = cluster.create_topic(f"quiet-{uuid.uuid4().hex[:8]}", 3, 3, {"min.insync.replicas": 2})
    cluster.create_topic(f"{topic}.dlq", 1, 3, {})
    sent: list[int] = []
    stop = threading.Event()
    errors: list[str] = []

    tag = uuid.uuid4().hex[:6]
    producer_config = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "statistics.interval.ms": 1000,  # the watchdog reads statistics: a second, not five
    }
    feeder_id = f"quiet-feeder-{tag}"
    quiet_producer = ResilientProducer({**producer_config, "client.id": feeder_id}, on_stall="heal")
    control_producer = ResilientProducer(
        {**producer_config, "client.id": f"control-feeder-{tag}"}, stall_after_s=1.0
    )
    given = 0

    def feed() -> None:
        nonlocal given

        def delivered(err: Any, msg: Message) -> None:
            if err is None:
                sent.append(int(msg.value() or b"0"))
            else:
                errors.append(str(err))

        i = 0
        while not stop.wait(0.05):  # a steady stream, 20 records a second
            quiet_producer.produce(topic, str(i).encode(), on_delivery=delivered)
            control_producer.produce(topic, b"-1", partition=0)  # the isolated leader's
            quiet_producer.poll(0)
            control_producer.poll(0)
            i += 1
            given = i
        quiet_producer.flush(60)

    values: dict[str, set[int]] = {}

    def member(kind: str, group: str, **options: Any) -> Any:
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": group,
            "client.id": group,
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 1000,
        }
        seen = values.setdefault(group, set())

        def record(msg: Message) -> None:
            seen.add(int(msg.value() or b"0"))

        return _start(kind, config, topic, record, **options)

    quiet = {
        f"quiet-sync-{tag}": member("sync", f"quiet-sync-{tag}", on_stall="heal"),
        f"quiet-aio-{tag}": member("aio", f"quiet-aio-{tag}", on_stall="heal"),
    }
    control_group = f"control-{tag}"
    control = member("sync", control_group, stall_after_s=1.0)
    feeder = threading.Thread(target=feed, daemon=True)
    with capture_logs() as logs:
        feeder.start()
        try:
            wait_for(lambda: len(sent) >= 20, 60, "the stream")
            for group in [*quiet, control_group]:
                wait_for(lambda g=group: len(values[g]) >= 10, 60, f"{group} consuming")
            # an isolation of one leader from its clients, healed once the control saw it
            leader = cluster.leader(topic, 0)
            control_probes = control[0]._probes
            with cluster.network.isolate(leader, clients=True, peers=False):
                wait_for(
                    lambda: "fetch not answered" in (control_probes.stall.reason or ""),
                    30,
                    "the control (1 s bound) reporting the isolation",
                )
                wait_for(
                    lambda: control_producer.health().stalls >= 1,
                    30,
                    "the control producer (1 s bound) reporting the isolation",
                )
            # a rolling restart of the three brokers (controlled shutdown, restart, full ISR)
            for node in sorted(cluster.pids()):
                cluster.stop(node)
                cluster.start(node)
                cluster.heal([topic])
            count = len(sent)
            wait_for(lambda: len(sent) >= count + 20, 60, "the stream after the restarts")
        finally:
            stop.set()
            feeder.join(90)
        try:
            produced = set(sent)
            for group in [*quiet, control_group]:
                wait_for(lambda g=group: produced <= values[g], 120, f"{group} catching up")
            for group, (consumer, _) in quiet.items():
                for event in ("consumer_stalled", "consumer_rebalance_loop", "consumer_recreated"):
                    assert _events(logs, event, group) == [], (group, event)
                health = consumer.health()
                assert (health.stalls, health.recreations) == (0, 0), group
            # the quiet producer: every message it was given delivered, no stall of any kind
            assert errors == [] and sorted(sent) == list(range(given)), (len(sent), given)
            said = [
                e["event"]
                for e in logs
                if e.get("client_id") == feeder_id
                and ("stall" in e["event"] or e["event"] == "producer_recreated")
            ]
            assert said == [], said
            assert quiet_producer.health().stalls == 0
        finally:
            for consumer, thread in [*quiet.values(), control]:
                consumer.stop()
                thread.join(60)
            quiet_producer.close()
            control_producer.close()


@pytest.mark.parametrize("kind", ["sync", "aio", "sync-key"])
def test_a_heal_with_the_cluster_answering_commits_first_and_redoes_nothing(
    kafka_cluster: KafkaCluster, kind: str
) -> None:
    """The heal's commit-first path, on the shared cluster: the watcher is made to see a
    rebalance loop (what a real cluster cannot provoke on demand, see
    test_consumer_stalls.py) while the consumer's connections are healthy. The old instance
    commits what was handled (``committed=True``), so the new member resumes exactly there:
    every record handled once, none twice. No interval commit runs meanwhile (10 minutes):
    without the old instance's commit (ours, or librdkafka's own at its close) before the new
    member read the committed offsets, the first 10 records would be handled again."""
    topic = kafka_cluster.create_topic(f"heal-commit-{uuid.uuid4().hex[:8]}", 1, 1, {})
    kafka_cluster.create_topic(f"{topic}.dlq", 1, 1, {})
    group = f"heal-commit-{uuid.uuid4().hex[:8]}"
    handled: list[int] = []
    config = {
        "bootstrap.servers": kafka_cluster.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        # no commit but the heal's: a record handled again would show it was not committed
        "auto.commit.interval.ms": 600_000,
    }

    def record(msg: Message) -> None:
        handled.append(int(msg.value() or b"0"))

    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap_servers})

    def produce(values: range) -> None:
        for i in values:
            producer.produce(topic, str(i).encode())
        assert producer.flush(30) == 0

    with capture_logs() as logs:
        consumer, thread = _start(kind, config, topic, record, on_stall="heal")
        try:
            produce(range(10))
            wait_for(lambda: len(handled) == 10, 60, "the first records")
            # the watcher sees a rebalance loop (made up) until the consumer healed it
            probes = consumer._probes
            seen = probes.rebalance_loop

            def made_up_loop(now: float) -> tuple[str, float, int] | None:
                if probes.heals["rebalance_loop"]:
                    return seen(now)  # type: ignore[no-any-return]
                return ("a rebalance loop made up for the test", 61.0, 3)

            probes.rebalance_loop = made_up_loop
            wait_for(lambda: _events(logs, "consumer_recreated", group), 30, "the heal")
            produce(range(10, 20))
            wait_for(lambda: len(set(handled)) == 20, 60, "the records after the heal")
            (heal,) = _events(logs, "consumer_recreated", group)
            assert heal["committed"] is True and heal["old_closed"] is True, heal
            assert heal["cause"] == "rebalance_loop"
            assert consumer.health().recreations == 1
            assert consumer._probes.heals == {"progress": 0, "rebalance_loop": 1}
            assert sorted(handled) == list(range(20)), "a record handled twice or skipped"
            # the hand-over carried the clean-end marker (beside keyed mode's finished list):
            # the new member probes nothing (else 20 records one at a time, each a commit)
            crash = getattr(consumer, "_crash", None)
            assert crash is None or crash.probes == {}, crash.probes
        finally:
            consumer.stop()
            thread.join(60)
