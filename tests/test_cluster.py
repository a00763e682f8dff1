"""The local cluster itself: real KRaft nodes, real elections, no lost acknowledged writes."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from kresilient.testing import ChaosNotSupportedError, ClusterError, KafkaCluster

pytestmark = pytest.mark.integration


def _producer(cluster: KafkaCluster, **extra: object) -> Producer:
    return Producer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
            **extra,
        }
    )


def _consume_all(
    cluster: KafkaCluster, topic: str, expected: int, timeout: float = 60
) -> list[Message]:
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": f"check-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    # Assigned, not subscribed: right after a restart the group coordinator may still be
    # loading, and a join could outlast the deadline (an empty read, then a false "lost").
    parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)])
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is None:
                    out.append(msg)
                elif msg.error().code() != KafkaError._PARTITION_EOF:
                    raise AssertionError(f"consume error: {msg.error()}")
        # Anything beyond `expected` would be a duplicate: read a little longer to see it.
        for msg in consumer.consume(1000, timeout=1.0):
            if msg.error() is None:
                out.append(msg)
    finally:
        consumer.close()
    return out


def test_round_trip_plain_confluent_kafka(kafka_cluster: KafkaCluster, topic: str) -> None:
    producer = _producer(kafka_cluster)
    for i in range(100):
        producer.produce(topic, key=str(i).encode(), value=f"value-{i}".encode())
    assert producer.flush(30) == 0
    got = _consume_all(kafka_cluster, topic, 100)
    assert [m.value() for m in got] == [f"value-{i}".encode() for i in range(100)]
    assert kafka_cluster.replicas(topic) and len(kafka_cluster.isr(topic)) == 3


@pytest.mark.chaos
def test_sigkill_leader_while_producing_loses_no_acknowledged_message(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    old_leader = kafka_cluster.leader(topic)
    old_isr = kafka_cluster.isr(topic)
    producer = _producer(kafka_cluster)
    acked: list[int] = []
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked.append(int(msg.value()))
        else:
            failed.append(err)

    stop = threading.Event()

    def produce_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                producer.produce(topic, value=str(i).encode(), on_delivery=on_delivery)
                i += 1
            except BufferError:
                producer.poll(0.05)
            producer.poll(0)
            if i % 500 == 0:
                time.sleep(0.01)

    worker = threading.Thread(target=produce_loop)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)  # the first idempotent PID can take a while on a fresh cluster
        acked_before_kill = len(acked)
        kafka_cluster.kill(old_leader)
        new_leader = kafka_cluster.wait_for_leader(topic, not_on=old_leader, timeout=30)
        assert new_leader in old_isr, "the new leader must come from the ISR"
        # Producing continues: more acknowledgements after the election.
        after = len(acked)
        deadline = time.monotonic() + 30
        while len(acked) <= after + 100 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(acked) > after + 100, "no progress after the new leader was elected"
    finally:
        stop.set()
        worker.join()
    assert producer.flush(60) == 0
    assert failed == []
    assert acked_before_kill > 0

    # Restart brings the ISR back to 3.
    kafka_cluster.start(old_leader)
    assert sorted(kafka_cluster.wait_for_isr(topic, size=3, timeout=60)) == [1, 2, 3]

    # Every acknowledged message is there, exactly once, in order.
    got = [int(m.value()) for m in _consume_all(kafka_cluster, topic, len(acked))]
    assert got == sorted(acked)
    assert len(got) == len(set(got))


@pytest.mark.chaos
def test_preferred_election_returns_leadership_to_first_replica(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    preferred = kafka_cluster.replicas(topic)[0]
    assert kafka_cluster.leader(topic) == preferred
    kafka_cluster.stop(preferred)
    moved_to = kafka_cluster.wait_for_leader(topic, not_on=preferred)
    kafka_cluster.start(preferred)
    kafka_cluster.wait_for_isr(topic, size=3)
    # auto.leader.rebalance.enable=false: leadership stays away until we ask.
    assert kafka_cluster.leader(topic) == moved_to
    kafka_cluster.elect_preferred_leaders(topic)
    assert kafka_cluster.leader(topic) == preferred


@pytest.mark.chaos
def test_graceful_stop_moves_leadership_before_the_process_exits(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    leader = kafka_cluster.leader(topic)
    kafka_cluster.stop(leader)
    assert not kafka_cluster.running(leader)
    # A controlled shutdown is a metadata record: the controller marks the node
    # inControlledShutdown=1 and moves its leaderships in the same step; a crash gets no
    # such record, only fencing (fenced=1) after broker.session.timeout.ms. Every
    # controller replays the record into its log. (A metadata read right after the exit
    # may lag by a heartbeat: a deadline on it would be a timing assertion.)
    record = f"BrokerRegistrationChangeRecord(brokerId={leader}, "
    others = [n for n in kafka_cluster.node_ids if n != leader]

    def marked() -> bool:
        return any(
            record in line and "inControlledShutdown=1" in line
            for n in others
            for line in kafka_cluster.logs(n).splitlines()
        )

    deadline = time.monotonic() + 30
    while not marked() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(), f"no controlled-shutdown record for node {leader}"
    assert kafka_cluster.wait_for_leader(topic, not_on=leader, timeout=30) != leader
    kafka_cluster.start(leader)
    kafka_cluster.wait_for_isr(topic, size=3)


@pytest.mark.chaos
def test_frozen_leader_is_fenced_and_rejoins_after_thaw(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    leader = kafka_cluster.leader(topic)
    kafka_cluster.freeze(leader)
    try:
        new_leader = kafka_cluster.wait_for_leader(topic, not_on=leader, timeout=30)
        assert new_leader != leader
        isr = kafka_cluster.wait_for_isr_shrink(topic, without=leader, timeout=30)
        assert leader not in isr, "a frozen replica must leave the ISR"
        assert kafka_cluster.running(leader)
    finally:
        kafka_cluster.thaw(leader)
    assert leader in kafka_cluster.wait_for_isr(topic, size=3, timeout=60)


def test_external_cluster_refuses_chaos(kafka_cluster: KafkaCluster) -> None:
    external = KafkaCluster(bootstrap_servers=kafka_cluster.bootstrap_servers)
    with external:
        assert external.external and not external.supports_chaos
        assert external.bootstrap_servers == kafka_cluster.bootstrap_servers
        assert len(external.node_ids) == 3
        for op in (external.kill, external.stop, external.start, external.freeze):
            with pytest.raises(ChaosNotSupportedError, match="KRESILIENT_BOOTSTRAP_SERVERS"):
                op(1)
        with pytest.raises(ChaosNotSupportedError):
            external.pids()


def test_start_failure_names_the_node_and_shows_its_log() -> None:
    cluster = KafkaCluster(nodes=1, broker_config={"num.network.threads": "not-a-number"})
    with pytest.raises(ClusterError) as info:
        cluster.start_cluster()
    text = str(info.value)
    assert "node 1" in text
    assert "num.network.threads" in text  # the broker's own complaint, from the log tail
    assert cluster.pids() == {}


# The no-orphan guarantee (SIGKILL, SIGTERM, SIGINT of the owner) and its files are
# tested in test_cluster_lifecycle.py.
