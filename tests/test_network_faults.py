"""Network faults on a real cluster (issue 13): each with a negative control.

The plugin's ``kafka_network_cluster`` (``KafkaCluster(network_faults=True)``): every client,
inter-broker and controller connection passes through the fault proxies.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from kresilient import LeadershipState, ResilientProducer
from kresilient.clusterinfo import committed_offsets
from kresilient.errors import DeliveryError, ErrorCategory, classify
from kresilient.testing import ChaosNotSupportedError, KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

# librdkafka gives up on an unanswered request after socket.timeout.ms (request.timeout.ms
# is only the broker's ack timeout): the client-side "request timeout" of the issue.
_REQUEST_TIMEOUT_MS = 4000
#: Seconds of produce+consume on the lossy network (issue 13 says 60; see the test).
LOSSY_NETWORK_S = float(os.environ.get("KRESILIENT_LOSSY_NETWORK_S", "20"))


@pytest.fixture(name="net_cluster")
def _net_cluster(kafka_network_cluster: KafkaCluster) -> KafkaCluster:
    # The plugin's session cluster with network_faults=True; healed after each test.
    return kafka_network_cluster


def _topic(cluster: KafkaCluster, **config: Any) -> str:
    name = f"net-{uuid.uuid4().hex[:10]}"
    return cluster.create_topic(name, 1, 3, {"min.insync.replicas": 2, **config})


def _read_back(cluster: KafkaCluster, topic: str, expected: int, timeout: float = 90) -> list[int]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    # Assigned, not subscribed: right after a heal the group coordinator may still be moving
    # or loading, and a group join could outlast the deadline and read nothing (CI,
    # 2026-11-26: "4148 acknowledged message(s) lost" with an empty read). The read needs no
    # group: every partition from its beginning.
    deadline = time.monotonic() + timeout
    while True:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        if partitions:
            break
        assert time.monotonic() < deadline, f"no metadata for {topic}"
        time.sleep(0.2)
    tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(partitions)]
    consumer.assign(tps)

    def at_log_end() -> bool:
        # Every record in the log read (a duplicate would be an extra one): positions at the
        # high watermarks, asked now (a new leader's may still be catching up).
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps}
        return all(
            ends[tp.partition] == 0 or tp.offset >= ends[tp.partition]
            for tp in consumer.position(tps)
        )

    out: list[int] = []
    try:
        # Until everything expected is read and nothing more is in the log.
        while time.monotonic() < deadline:
            # consume() returns at 1000 records or at the timeout: short, the loop asks again
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    out.append(int(msg.value()))
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consume error: {msg.error()}")
            if len(out) >= expected and at_log_end():
                break
    finally:
        consumer.close()
    return out


def _wait(
    what: str, condition: Callable[[], bool], timeout: float, tick: Callable[[], Any]
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        tick()


def _ack_loss_run(
    cluster: KafkaCluster,
    produce: Callable[[str, int], None],
    poll: Callable[[float], Any],
    flush: Callable[[], Any],
) -> tuple[list[int], int]:
    """Produce 0..199 with the leader's responses dropped for messages 100..199."""
    topic = _topic(cluster)
    leader = cluster.leader(topic)
    for i in range(100):
        produce(topic, i)
    flush()
    net = cluster.network
    accepted = net.connections_accepted(leader)
    with net.drop_responses(leader):
        for i in range(100, 200):
            produce(topic, i)
        # Held until the client gave up on an unanswered request (request.timeout.ms) and
        # reconnected to retry it: the acknowledgement was really lost.
        _wait(
            "the client to time out and reconnect",
            lambda: (
                net.dropped_responses(leader) > 0 and net.connections_accepted(leader) > accepted
            ),
            60,
            lambda: poll(0.1),
        )
    flush()
    return _read_back(cluster, topic, 200), net.dropped_responses(leader)


def test_lost_acks_resilient_producer_delivers_each_message_exactly_once_in_order(
    net_cluster: KafkaCluster,
) -> None:
    acked: list[int] = []
    failed: list[Any] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        (failed.append(err) if err is not None else acked.append(int(msg.value())))

    with ResilientProducer(
        {
            "bootstrap.servers": net_cluster.bootstrap_servers,
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
            "linger.ms": 5,
        }
    ) as producer:
        seen, dropped = _ack_loss_run(
            net_cluster,
            lambda t, i: producer.produce(t, str(i).encode(), on_delivery=on_delivery),
            producer.poll,
            producer.flush,
        )
    assert dropped > 0
    assert failed == []
    assert sorted(acked) == list(range(200)), "each message acknowledged exactly once"
    assert seen == list(range(200)), f"{len(seen) - len(set(seen))} duplicate(s) or disorder"


def test_lost_acks_without_idempotence_duplicate_negative_control(
    net_cluster: KafkaCluster,
) -> None:
    producer = Producer(
        {
            "bootstrap.servers": net_cluster.bootstrap_servers,
            "enable.idempotence": False,
            "acks": "all",
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
            "linger.ms": 5,
        }
    )
    seen, dropped = _ack_loss_run(
        net_cluster,
        lambda t, i: producer.produce(t, str(i).encode()),
        producer.poll,
        lambda: producer.flush(120),
    )
    assert dropped > 0
    assert set(seen) == set(range(200))  # nothing lost either way ...
    assert len(seen) > 200, "the fault did not bite: no retry duplicated a message"


@pytest.mark.parametrize("clients", [False, True], ids=["peers-only", "full"])
def test_isolated_leader_is_replaced_and_nothing_acknowledged_is_lost(
    net_cluster: KafkaCluster, clients: bool
) -> None:
    topic = _topic(net_cluster)
    old_leader = net_cluster.leader(topic)
    acked: list[int] = []
    errors: list[KafkaError] = []
    states: set[str] = set()

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is None:
            acked.append(int(msg.value()))

    stop = threading.Event()
    with ResilientProducer(
        {
            "bootstrap.servers": net_cluster.bootstrap_servers,
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
            "statistics.interval.ms": 1000,
            "linger.ms": 5,
            "error_cb": errors.append,
        }
    ) as producer:

        def produce_loop() -> None:
            i = 0
            while not stop.is_set():
                producer.produce(topic, str(i).encode(), on_delivery=on_delivery)
                i += 1
                producer.poll(0.002)
                if i % 50 == 0:
                    states.update(producer.health().leadership.values())

        worker = threading.Thread(target=produce_loop)
        worker.start()
        try:
            _wait("first acknowledgements", lambda: len(acked) > 200, 60, lambda: time.sleep(0.05))
            with net_cluster.network.isolate(old_leader, clients=clients, peers=True):
                new_leader = net_cluster.wait_for_leader(topic, not_on=old_leader, timeout=60)
                after = len(acked)
                _wait(
                    "acknowledgements from the new leader",
                    lambda: len(acked) > after + 200,
                    90,
                    lambda: time.sleep(0.05),
                )
        finally:
            stop.set()
            worker.join()
        producer.flush(120)
        health = producer.health()
    assert new_leader != old_leader
    seen = _read_back(net_cluster, topic, len(acked))
    assert set(acked) <= set(seen), f"{len(set(acked) - set(seen))} acknowledged message(s) lost"
    assert len(seen) == len(set(seen)), "duplicates"
    assert seen == sorted(seen)
    # A burst at most, never churn: one election is not a sick cluster.
    assert LeadershipState.SUSTAINED_CHURN.value not in states | set(health.leadership.values())
    assert health.sustained_churn == ()
    for err in errors:  # every error the client saw is explained
        assert classify(err).category is not ErrorCategory.UNKNOWN, err
    net_cluster.wait_for_isr(topic, size=3, timeout=120)
    # After an election and a heal, every node still reaches every other through a proxy.
    assert net_cluster.direct_peer_connections() == []


_LEADER_ENDPOINT = re.compile(
    r"leaderEndpoints=Endpoints\(endpoints=\{ListenerName\(CONTROLLER\)=[^:]+:(\d+)"
)
_CONTROLLER_LISTENER = re.compile(r"^\s*listeners = .*CONTROLLER://[^,]*:(\d+)", re.M)


def test_the_controller_quorum_is_reached_only_through_the_proxies(
    net_cluster: KafkaCluster,
) -> None:
    # A KRaft leader sends its followers its own endpoints (KIP-853) and a follower that
    # reconnects uses them. Unadvertised, they were the leader's real CONTROLLER port: in a
    # CI run a follower fetched from an isolated controller around its proxy, kept it the
    # leader, and no partition got a new leader in 60 s. This failed before the fix (the
    # logged leader endpoint was the real port).
    real: set[int] = set()
    learned: set[int] = set()
    for node in net_cluster.node_ids:
        log = net_cluster.logs(node)
        real.update(int(m) for m in _CONTROLLER_LISTENER.findall(log))
        learned.update(int(m) for m in _LEADER_ENDPOINT.findall(log))
    assert len(real) == len(net_cluster.node_ids), real  # every node's own listener found
    assert learned, "no follower logged the leader's endpoints"
    assert not learned & real, f"followers were given real controller ports {learned & real}"
    assert net_cluster.direct_peer_connections() == []


def test_slow_follower_leaves_the_isr_and_rejoins_after_heal(net_cluster: KafkaCluster) -> None:
    topic = _topic(net_cluster)
    leader = net_cluster.leader(topic)
    follower = [r for r in net_cluster.replicas(topic) if r != leader][-1]
    assert follower in net_cluster.isr(topic)  # control: in sync before the fault
    p = Producer({"bootstrap.servers": net_cluster.bootstrap_servers, "acks": "all"})
    # > replica.lag.time.max.ms (5 s), on its replication links (clients stay fast).
    with net_cluster.network.delay(follower, 7000, links=["replication"]):
        for i in range(50):
            p.produce(topic, str(i).encode())
        p.flush(60)
        isr = net_cluster.wait_for_isr_shrink(topic, without=follower, timeout=90)
        assert follower not in isr and len(isr) == 2
        # `kresilient audit` reports it (KR060: under-replicated).
        audit = subprocess.run(
            [
                sys.executable,
                "-m",
                "kresilient.cli",
                "audit",
                "-b",
                net_cluster.bootstrap_servers,
                "--topic",
                topic,
                "--format",
                "json",
                "--timeout",
                "30",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert audit.returncode in (0, 1), audit.stdout + audit.stderr
        assert "KR060" in audit.stdout and "under-replicated" in audit.stdout, audit.stdout
    assert follower in net_cluster.wait_for_isr(topic, size=3, timeout=120)


def test_network_requires_the_opt_in() -> None:
    with pytest.raises(ChaosNotSupportedError, match=r"network_faults=True"):
        _ = KafkaCluster().network  # never started: the check needs no cluster


def test_lossy_network_loses_and_duplicates_nothing(net_cluster: KafkaCluster) -> None:
    """Issue 13: 5 % loss and 50 ms jitter on every link while producing and consuming: 0
    lost, 0 producer duplicates. The issue's 60 s: ``KRESILIENT_LOSSY_NETWORK_S=60``. CI runs
    the same faults for 20 s: each second of it is the same mix (hundreds of requests, a few
    lost segments retransmitted), and the counters below check the fault was as real in the
    shorter run (2026-11-29, 20 s: see the assertion's figures)."""
    topic = _topic(net_cluster)
    acked: list[int] = []
    failed: list[Any] = []
    consumed_during_fault: list[int] = []
    stop = threading.Event()

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        (failed.append(err) if err is not None else acked.append(int(msg.value())))

    def consume_loop() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": net_cluster.bootstrap_servers,
                "group.id": f"lossy-{topic}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is None:
                        consumed_during_fault.append(int(msg.value()))
        finally:
            consumer.close()

    before = net_cluster.network.counters()
    with ResilientProducer(
        {"bootstrap.servers": net_cluster.bootstrap_servers, "linger.ms": 5}
    ) as producer:
        for node in net_cluster.node_ids:
            net_cluster.network.loss(node, 5)
            net_cluster.network.delay(node, 50, jitter_ms=50)
        reader = threading.Thread(target=consume_loop)
        reader.start()
        try:
            i = 0
            end = time.monotonic() + LOSSY_NETWORK_S
            while time.monotonic() < end:
                producer.produce(topic, str(i).encode(), on_delivery=on_delivery)
                i += 1
                producer.poll(0.002)  # ~300-500 messages a second
        finally:
            stop.set()
            reader.join()
            net_cluster.network.heal()
        producer.flush(120)
    after = net_cluster.network.counters()
    # The fault was real: segments were lost and chunks delayed while we produced.
    faults = {k: after[k] - before[k] for k in ("lost_segments", "delayed_chunks")}
    print(f"lossy network for {LOSSY_NETWORK_S:g} s: {faults}, {i} messages")
    assert faults["lost_segments"] > 20, faults
    assert faults["delayed_chunks"] > 1000, faults
    assert consumed_during_fault, "nothing consumed while the network was lossy"
    assert failed == []
    assert sorted(acked) == list(range(i))
    seen = _read_back(net_cluster, topic, len(acked))
    lost, duplicated = i - len(set(seen)), len(seen) - len(set(seen))
    assert seen == list(range(i)), f"lost {lost}, duplicated {duplicated}"


def test_both_followers_slow_acks_all_never_succeeds_on_one_replica(
    net_cluster: KafkaCluster,
) -> None:
    topic = _topic(net_cluster)
    leader = net_cluster.leader(topic)
    followers = [r for r in net_cluster.replicas(topic) if r != leader]
    acked: list[int] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        (errors.append(err) if err is not None else acked.append(int(msg.value())))

    config = {
        "bootstrap.servers": net_cluster.bootstrap_servers,
        "message.timeout.ms": 8000,
        "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
    }
    with ResilientProducer(config) as producer:
        producer.produce(topic, b"-1", on_delivery=on_delivery)
        producer.flush(60)
        assert acked == [-1]  # control: acks=all works with the followers in sync
        try:
            for f in followers:
                # Replication only: two of three controllers slowed by 7 s would lose the
                # KRaft quorum, and with it the controller that shrinks the ISR.
                net_cluster.network.delay(f, 7000, links=["replication"])
            # Followers only fall behind when there is something to fetch: acks=1 writes.
            lagger = Producer({"bootstrap.servers": net_cluster.bootstrap_servers, "acks": 1})
            for _ in range(20):
                lagger.produce(topic, b"-2")
            assert lagger.flush(60) == 0
            isr = net_cluster.wait_for_isr_shrink(topic, without=followers[0], timeout=90)
            isr = net_cluster.wait_for_isr_shrink(topic, without=followers[1], timeout=90)
            assert isr == [leader]
            for i in range(10):
                producer.produce(topic, str(i).encode(), on_delivery=on_delivery)
            with pytest.raises(DeliveryError):
                producer.flush(60)
        finally:
            net_cluster.network.heal()
    assert acked == [-1], "acks=all succeeded with one replica in sync"
    # (the 20 acks=1 writes above are not the producer under test)
    assert len(errors) == 10
    for err in errors:  # NOT_ENOUGH_REPLICAS retried until the timeout: classified, bounded
        c = classify(err, context="delivery")
        assert c.category is not ErrorCategory.UNKNOWN, err
    net_cluster.wait_for_isr(topic, size=3, timeout=120)


def test_consumer_cut_from_its_coordinator_rebalances_and_skips_nothing(
    net_cluster: KafkaCluster,
) -> None:
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    from kresilient import ResilientConsumer

    topic = _topic(net_cluster)
    group = f"cut-{topic}"
    total = 300
    p = Producer({"bootstrap.servers": net_cluster.bootstrap_servers})
    for i in range(total):
        p.produce(topic, str(i).encode())
    assert p.flush(60) == 0
    # The harness's own listener: the fault below does not touch this admin client.
    admin = AdminClient({"bootstrap.servers": net_cluster._harness_bootstrap()})

    def group_state() -> Any:
        return admin.describe_consumer_groups([group])[group].result(timeout=10)

    handled: list[int] = []
    first_pass = threading.Event()

    def handle(msg: Any) -> None:
        handled.append(int(msg.offset()))
        if len(handled) >= 100:
            first_pass.wait(120)  # hold here: commits stop at what was processed so far

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": net_cluster.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "socket.timeout.ms": _REQUEST_TIMEOUT_MS,
        },
        [topic],
        handle,
        dead_letter=None,
        install_signal_handlers=False,
    )
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        _wait("100 messages handled", lambda: len(handled) >= 100, 90, lambda: time.sleep(0.05))
        coordinator = group_state().coordinator.id
        with net_cluster.network.isolate(coordinator, peers=False):
            # Longer than session.timeout.ms: the coordinator evicts the member.
            _wait(
                "the coordinator to evict the cut-off member",
                lambda: group_state().state == ConsumerGroupState.EMPTY,
                90,
                lambda: time.sleep(0.2),
            )
            # a consumer of the group, not the Admin API's ListConsumerGroupOffsets (it kills
            # the process while the coordinator is not ready: librdkafka issue 5040)
            (committed,) = committed_offsets(
                {"bootstrap.servers": net_cluster._harness_bootstrap()}, group, [(topic, 0)], 10
            ) or [TopicPartition(topic, 0, -1001)]
            first_pass.set()
        _wait(
            "every message handled after the heal",
            lambda: set(range(total)) <= set(handled),
            120,
            lambda: time.sleep(0.1),
        )
    finally:
        first_pass.set()
        consumer.stop()
        runner.join(60)
    assert set(range(total)) <= set(handled), "a message was skipped"
    redone = [o for o in set(handled) if handled.count(o) > 1]
    # Duplicates only from work after the last commit before the cut.
    assert all(o >= max(committed.offset, 0) for o in redone), (committed.offset, redone)


def _unserved(admin: Any, topic: str, partitions: int) -> list[str]:
    """The partitions whose leader does not answer a ListOffsets for ``topic`` right now."""
    from confluent_kafka.admin import OffsetSpec

    latest: Any = OffsetSpec.latest
    spec = {TopicPartition(topic, p): latest() for p in range(partitions)}
    unserved = []
    for tp, future in admin.list_offsets(spec, request_timeout=10).items():
        try:
            future.result(timeout=15)
        except KafkaException as exc:
            unserved.append(f"{tp.partition}: {exc}")
    return unserved


def test_create_topic_returns_once_each_partitions_leader_serves_it(
    net_cluster: KafkaCluster,
) -> None:
    """``kresilient.admin.create_topic`` returned once one broker's metadata named every
    leader; a leader that had not applied the topic's record yet answered the next ListOffsets
    UNKNOWN_TOPIC_OR_PART (CI, 2026-11-30: ``kresilient dlq inspect`` right after ``kresilient
    topic create``). Here one node's controller link is 0.6 s slow each way: it learns of a
    new topic about 2 s after the others name it as a leader (a longer delay outlasts the
    KRaft fetch timeout and the node stops learning at all)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from kresilient.admin import create_topic

    bootstrap = net_cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    brokers = admin.list_topics(timeout=30).brokers

    def served_at_once(slow: int) -> bool:
        """The control with ``slow``'s controller link slowed: whether every leader served a
        raw client's new topic once a metadata answer (of another node) named them all."""
        fast = brokers[next(n for n in net_cluster.node_ids if n != slow)]
        # a client knowing only the other node asks only it
        fast_admin = AdminClient({"bootstrap.servers": f"{fast.host}:{fast.port}"})
        raw = f"net-raw-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(raw, 6, 1)])[raw].result(60)
        deadline = time.monotonic() + 30
        while True:
            described = fast_admin.list_topics(raw, timeout=10).topics[raw]
            leaders = [p.leader for p in described.partitions.values()]
            if described.error is None and len(leaders) == 6 and min(leaders) >= 0:
                break
            assert time.monotonic() < deadline, f"no leaders for {raw}: {described.error}"
            time.sleep(0.05)  # polling interval of a condition wait
        return not _unserved(admin, raw, 6)

    # The node slowed must not be the active controller (which learns first): the first
    # node whose slowness the control sees; one of any two nodes is not the controller.
    # Under load the slowed node may stop learning altogether (its fetches outlast the KRaft
    # fetch timeout; CI, 2026-11-30): create_topic rightly waits then, so the delay is lifted
    # after 3 s and create_topic returns once the node caught up. Returned sooner, its
    # topic is checked while the delay is still on.
    for slow in net_cluster.node_ids:
        name = f"net-created-{uuid.uuid4().hex[:8]}"
        failed: list[BaseException] = []

        def create(name: str, failed: list[BaseException]) -> None:
            try:
                create_topic(bootstrap, name, partitions=6, replication_factor=1, timeout=90)
            except BaseException as exc:  # re-raised in the test's thread
                failed.append(exc)

        creator = threading.Thread(target=create, args=(name, failed), daemon=True)
        with net_cluster.network.delay(slow, 600, links=["controller"]):
            if served_at_once(slow):
                continue
            creator.start()
            creator.join(3.0)
            early = not creator.is_alive()
            if early and not failed:
                assert _unserved(admin, name, 6) == []
        creator.join(120)
        assert not creator.is_alive() and not failed, failed
        if not early:
            assert _unserved(admin, name, 6) == []
        return
    pytest.fail("no slowed node left a leader not serving the raw client's new topic")


def test_an_abort_right_after_a_commit_is_not_refused_while_its_markers_are_written(
    net_cluster: KafkaCluster,
) -> None:
    """librdkafka#4849 (CI, 2026-11-30: a consume-transform-produce consumer stopped with
    INVALID_TXN_STATE). Right after a commit the coordinator still writes the committed
    transaction's markers; a record of the next transaction makes librdkafka send
    AddPartitionsToTxn, refused with CONCURRENT_TRANSACTIONS and counted as sent anyway, so
    an abort then sends EndTxn for a transaction the coordinator never began, which it
    refuses fatally. Here every node's inter-broker links are 150 ms slow: the markers take
    that long. The control, raw confluent-kafka, is refused fatally; TransactionalProducer
    waits for its first record to reach a broker before aborting, and goes on."""
    from confluent_kafka import KafkaError as _KafkaError

    from kresilient import TransactionalProducer

    bootstrap = net_cluster.bootstrap_servers
    topic = net_cluster.create_topic(f"net-txn-{uuid.uuid4().hex[:8]}", 3, 1)

    def commit_then_abort_raw() -> _KafkaError | None:
        raw = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"raw-{uuid.uuid4().hex[:8]}"}
        )
        raw.init_transactions(60)
        raw.begin_transaction()
        for partition in range(3):  # markers to every node, two of them over a slow link
            raw.produce(topic, b"committed", partition=partition)
        raw.commit_transaction(60)
        raw.begin_transaction()
        raw.produce(topic, b"aborted", partition=0)
        raw.poll(0.05)  # AddPartitionsToTxn sent
        try:
            raw.abort_transaction(60)
        except KafkaException as exc:
            refusal: _KafkaError = exc.args[0]
            return refusal
        finally:
            with contextlib.suppress(KafkaException):
                raw.flush(1)
        return None

    product = TransactionalProducer(
        {"bootstrap.servers": bootstrap}, transactional_id=f"kr-{uuid.uuid4().hex[:8]}"
    )
    try:
        with contextlib.ExitStack() as slow:
            for node in net_cluster.node_ids:
                slow.enter_context(net_cluster.network.delay(node, 150, links=["replication"]))
            # the control: the fault is real (refused 10 times in 10 runs; up to 3 tries)
            refused = None
            for _ in range(3):
                refused = commit_then_abort_raw()
                if refused is not None:
                    break
            assert refused is not None, "the raw abort was never refused: no fault to guard"
            assert refused.code() == _KafkaError.INVALID_TXN_STATE and refused.fatal()
            for cycle in range(3):
                with product.transaction():
                    for partition in range(3):
                        product.produce(topic, f"c{cycle}".encode(), partition=partition)
                with (
                    pytest.raises(RuntimeError, match="the handler failed"),
                    product.transaction(),
                ):
                    product.produce(topic, f"a{cycle}".encode(), partition=0)
                    product.poll(0.05)
                    raise RuntimeError("the handler failed")
        assert product.closed_by is None
        assert (product.committed, product.aborted, product.recreations) == (3, 3, 0)
        with product.transaction():  # and it goes on
            product.produce(topic, b"after", partition=1)
    finally:
        product.close()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        tps = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)]
        consumer.assign(tps)
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len([v for v in seen if v != b"committed"]) < 3 * 3 + 1:
            assert time.monotonic() < deadline, f"read {len(seen)} committed records: {seen}"
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(msg.value() or b"")
    finally:
        consumer.close()
    # the raw controls' commits, the product's three and its last; no aborted record
    product_records = [f"c{c}".encode() for c in range(3) for _ in range(3)] + [b"after"]
    assert sorted(v for v in seen if v != b"committed") == sorted(product_records)
    assert seen.count(b"committed") % 3 == 0 and seen.count(b"committed") > 0
