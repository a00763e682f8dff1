"""Crash-loop protection with ``transactions=`` (issue 41), real cluster, consumer processes.

A transactional doubler's handler calls ``os._exit(1)`` on a record (a crash no Python code
sees); each death aborts the open transaction (its outputs never visible). A supervisor
restarts the process (static membership, like a restarted pod). The deaths are counted in
markers the consumer commits OUTSIDE the transactions, at the partition's committed position
(never past a record of the open transaction), and while a partition is probed each record
commits in a transaction of its own (its progress durable before the next marker): after
``max_process_deaths`` deaths the record is dead-lettered inside a transaction
(``kresilient.error.category=crash_loop``) and the partition goes on, every other record's
output exactly once for ``read_committed`` readers. The negative controls run the same
supervisor without the protection: every start dies on the same record.

Review 11 found three ways the protection looped for ever (#2 a killer further than the probe
window past the committed offset, #3 two killers in one transaction, #10 a killer right after
a graceful stop, with or without transactions); each has its scenario here.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from _producer_helpers import read_back
from confluent_kafka import Consumer, TopicPartition
from test_consumer_integration import TopicFactory, committed, produce, wait_for, with_dlq

from kresilient.consumer._crashloop import CLEAN
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

_WORKER = r"""
import os, sys
from kresilient import Output, ResilientConsumer, TransactionPolicy
from kresilient.deadletter import DeadLetterPolicy

bootstrap, topic, target, group, out, deaths, txn, interval = sys.argv[1:9]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def handle(msg):
    if msg.value().startswith(b"die"):
        os.write(fd, b"died %d\n" % msg.offset())
        os._exit(1)
    os.write(fd, b"ok %d\n" % msg.offset())
    return Output(target, value=b"2x" + msg.value(), key=msg.key())

options = {}
if txn == "1":
    options["transactions"] = TransactionPolicy(
        transactional_id=group + "-0", max_interval_s=float(interval)
    )
ResilientConsumer(
    {"bootstrap.servers": bootstrap, "group.id": group,
     "group.instance.id": group + "-pod-0", "session.timeout.ms": 6000},
    [topic],
    handle,
    dead_letter=DeadLetterPolicy(),
    max_process_deaths=int(deaths) or None,
    **options,
).run()
"""


class _Service:
    """The worker of one group, restarted by :meth:`supervise` like a pod."""

    def __init__(
        self,
        kafka_cluster: KafkaCluster,
        topic_factory: TopicFactory,
        tmp_path: Path,
        *,
        deaths: int,
        txn: bool = True,
        interval: float = 0.2,
    ) -> None:
        self.bootstrap = kafka_cluster.bootstrap_servers
        self.topic, self.dlq = with_dlq(topic_factory)
        self.target = topic_factory()
        self.group = f"g-{uuid.uuid4().hex[:10]}"
        self.script = tmp_path / "worker.py"
        self.script.write_text(_WORKER)
        self.out = tmp_path / "handled.txt"
        self.values: list[bytes] = []
        self.args = [
            self.bootstrap,
            self.topic,
            self.target,
            self.group,
            str(self.out),
            str(deaths),
            "1" if txn else "0",
            str(interval),
        ]

    def produce(self, values: list[bytes]) -> None:
        start = len(self.values)
        self.values += values
        produce(
            self.bootstrap,
            self.topic,
            [(b"k%d" % i, v, [("h", b"%d" % i)], 0) for i, v in enumerate(values, start)],
        )

    def lines(self, kind: str) -> list[int]:
        if not self.out.exists():
            return []
        return [
            int(ln.split()[1]) for ln in self.out.read_text().splitlines() if ln.startswith(kind)
        ]

    def supervise(self, max_starts: int) -> tuple[int, bool]:
        """Restart the worker until every record that does not kill it is handled (then
        SIGTERM: a graceful stop, which commits the open transaction) or ``max_starts``
        starts. Returns (deaths, finished)."""
        wanted = {i for i, v in enumerate(self.values) if not v.startswith(b"die")}
        deaths = 0
        for _ in range(max_starts):
            proc = subprocess.Popen(
                [sys.executable, str(self.script), *self.args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                deadline = time.monotonic() + 90
                while time.monotonic() < deadline:
                    if proc.poll() is not None:
                        break
                    if wanted <= set(self.lines("ok")):
                        proc.send_signal(signal.SIGTERM)
                        assert proc.wait(60) == 0
                        return deaths, True
                    time.sleep(0.1)  # polling the worker's output file, not settling
                else:
                    raise AssertionError("worker neither died nor finished within 90 s")
                assert proc.returncode == 1, proc.returncode
                deaths += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        return deaths, False

    def outputs(self) -> list[bytes]:
        return [m.value() or b"" for m in read_back(self.bootstrap, self.target)]

    def expected_outputs(self) -> list[bytes]:
        return [b"2x" + v for v in self.values if not v.startswith(b"die")]

    def dead_letters(self) -> list[tuple[int, dict[str, bytes]]]:
        out = []
        for record in read_back(self.bootstrap, self.dlq):
            headers = list(record.headers() or [])
            info = {k: v or b"" for k, v in headers}
            out.append((parse_dead_letter_headers(headers).original_offset, info))
        return out

    def marker(self) -> str | None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group})
        try:
            (part,) = c.committed([TopicPartition(self.topic, 0)], timeout=30)
            return part.metadata
        finally:
            c.close()


def _values(n: int, killers: set[int]) -> list[bytes]:
    return [b"die%d" % i if i in killers else b"v%d" % i for i in range(n)]


@pytest.mark.parametrize("deaths", [2, 0], ids=["protected", "control-unprotected"])
def test_a_record_killing_a_transactional_consumer_is_dead_lettered_after_max_deaths(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, deaths: int
) -> None:
    service = _Service(kafka_cluster, topic_factory, tmp_path, deaths=deaths)
    service.produce(_values(12, {5}))

    died, finished = service.supervise(max_starts=3)

    outputs = service.outputs()  # read_committed
    if deaths == 0:
        # the control: every start died on the record; nothing after it was ever output,
        # nothing dead-lettered (the fault above is real)
        assert (died, finished) == (3, False)
        assert service.lines("died") == [5] * 3
        assert all(int(v[3:]) < 5 for v in outputs), outputs
        assert service.dead_letters() == []
        return
    assert (died, finished) == (2, True)
    assert service.lines("died") == [5] * 2
    # each other record's output exactly once, in order (the dead starts' outputs aborted)
    assert outputs == service.expected_outputs()
    ((offset, info),) = service.dead_letters()
    assert offset == 5
    assert info["h"] == b"5"  # the original header, byte for byte
    assert info["kresilient.error.category"] == b"crash_loop"
    assert info["kresilient.attempts"] == b"2"
    # the graceful stop: everything committed (transactions), then the clean-end marker
    topic, group = service.topic, service.group
    wait_for(lambda: committed(service.bootstrap, group, topic, [0]) == {0: 12}, 30, "the end")
    assert service.marker() == CLEAN


def test_a_killer_further_than_the_probe_window_is_reached_and_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Review 11 #2: the killer 30 records past the committed offset, the probe window 20,
    the default interval (one transaction holds all 30). Each probed record now commits on
    its own, so a restart moves on past what it probed: the first two deaths are not pinned
    (the record was not probed), the third is, and the fourth start dead-letters it. Before
    the fix every start re-handled the same uncommitted records, used its window up on them
    and died unprobed for ever."""
    service = _Service(kafka_cluster, topic_factory, tmp_path, deaths=2, interval=0.5)
    service.produce(_values(40, {30}))

    died, finished = service.supervise(max_starts=5)

    assert (died, finished) == (3, True)
    assert service.lines("died") == [30] * 3
    assert service.outputs() == service.expected_outputs()
    assert [offset for offset, _ in service.dead_letters()] == [30]


def test_two_killers_in_one_transaction_are_each_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path
) -> None:
    """Review 11 #3: records 5 and 8 both kill the process. The first one's crash-loop dead
    letter commits (the partition is probed: a transaction per record) before record 8 runs,
    so 8's deaths no longer abort it and reset its count. Before the fix: 5, 5, 8, 5, 5, 8...
    for ever."""
    service = _Service(kafka_cluster, topic_factory, tmp_path, deaths=2)
    service.produce(_values(12, {5, 8}))

    died, finished = service.supervise(max_starts=6)

    assert (died, finished) == (4, True)
    assert service.lines("died") == [5, 5, 8, 8]
    assert service.outputs() == service.expected_outputs()
    assert [offset for offset, _ in service.dead_letters()] == [5, 8]


@pytest.mark.parametrize("txn", [True, False], ids=["transactions", "plain"])
def test_a_killer_right_after_a_graceful_stop_is_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, txn: bool
) -> None:
    """Review 11 #10 (the "deploy, then the new version dies" case), with and without
    transactions: a graceful stop commits the clean-end marker; the next start does not probe
    (nothing per record) but commits that marker again without its clean flag, so a record
    killing it before the partition's next commit leaves it unclean and the start after
    probes: dead-lettered after 2 deaths. Before the fix the clean marker stayed and every
    start ran into the record unprobed for ever."""
    service = _Service(kafka_cluster, topic_factory, tmp_path, deaths=2, txn=txn, interval=0.5)
    service.produce(_values(10, set()))
    assert service.supervise(max_starts=1) == (0, True)
    assert service.marker() == CLEAN  # the graceful stop
    service.produce([b"v10", b"v11", b"v12", b"die13", b"v14"])

    died, finished = service.supervise(max_starts=4)

    assert (died, finished) == (2, True)
    assert service.lines("died") == [13, 13]
    outputs = service.outputs()
    if txn:
        assert outputs == service.expected_outputs()
    else:  # at-least-once outputs: each at least once, in order of first appearance
        assert list(dict.fromkeys(outputs)) == service.expected_outputs()
    assert [offset for offset, _ in service.dead_letters()] == [13]
