"""The sync consumer at the seams between its features (issue 35, defects 1 and 6, and the
three consumer suspicions), on the real cluster.

* #1: which error is a Schema Registry outage (pure classification); on the cluster, for both
  consumers, in tests/test_aio_consumer_parity.py (a transport error of the handler's OWN
  HTTP dependency follows the RetryPolicy to the DLQ; the registry's is still held);
* #6: ``kresilient.retry.*`` headers forwarded from an upstream topic do not route a dead
  letter to the upstream DLQ: only a record of this consumer's own retry topics is a retry.
* a retry-topic record deferred to its due time goes through ``dedupe`` like any other;
* a record waiting in a long retry hold is not charged a crash-loop death by a kill.

``/ready`` turning 503 when the member lost its partitions and cannot rejoin is checked for
both consumers in tests/test_aio_consumer_parity.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
from _producer_helpers import read_back
from confluent_kafka import Consumer, Message, TopicPartition
from test_consumer_integration import Runner, TopicFactory, config, produce, wait_for, with_dlq

from kresilient.consumer import ResilientConsumer, RetryTopicPolicy
from kresilient.consumer._crashloop import parse_marker
from kresilient.consumer._retrytopics import KeyBlocks, RetryView, retry_headers
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator
from kresilient.testing import KafkaCluster

sr = pytest.importorskip("confluent_kafka.schema_registry")


# --------------------------------------------------------------------------- defect 1


def test_a_requests_error_is_not_the_registrys_but_the_clients_is() -> None:
    """Pure classification of the three cases of
    tests/test_aio_consumer_parity.py::test_parity_a_handlers_own_http_error_follows_the_retry_policy_to_the_dlq
    and its controls (no cluster needed)."""
    from kresilient.consumer._registry import outage_classification

    client = sr.SchemaRegistryClient({"url": "http://127.0.0.1:9", "max.retries": 0})
    with pytest.raises(Exception) as from_client:
        client.get_schema(1)
    with pytest.raises(requests.ConnectionError) as from_app:
        requests.get("http://127.0.0.1:9/", timeout=5)
    assert outage_classification(from_client.value) is not None
    assert outage_classification(from_app.value) is None


# --------------------------------------------------------------------------- defect 6


def _upstream_retry_headers(upstream: str) -> list[tuple[str, bytes | None]]:
    """The headers a record of ``upstream``'s first retry tier carries (what a service that
    forwards ``msg.headers()`` passes on downstream): spelled out, as on the wire."""
    return [
        ("app", b"\x00forwarded"),
        ("kresilient.retry.tier", b"1"),
        ("kresilient.retry.due", b"1700000001000"),
        ("kresilient.retry.original.topic", upstream.encode()),
        ("kresilient.retry.original.partition", b"0"),
        ("kresilient.retry.original.offset", b"77"),
        ("kresilient.retry.original.timestamp", b"1700000000000"),
        ("kresilient.retry.first.failure", b"1700000000000"),
        ("kresilient.retry.exception.type", b"builtins.RuntimeError"),
    ]


@pytest.mark.integration
def test_forwarded_retry_headers_do_not_route_the_dead_letter_upstream(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A record of ``orders2`` carries the retry headers of an ``orders`` retry record
    (forwarded by the service that produced it). It fails every time: it goes through
    orders2's own retry tier and ends in ``orders2.dlq`` with original.topic = orders2, its
    own offset and its own attempts, its headers byte for byte (the forwarded block too);
    ``orders.dlq`` gets nothing. Before the fix it went to ``orders.dlq`` as orders@77."""
    bootstrap = kafka_cluster.bootstrap_servers
    upstream, upstream_dlq = with_dlq(topic_factory)
    topic, dlq = with_dlq(topic_factory)
    policy = RetryTopicPolicy(delays=(1.0,))
    for name in policy.topics(topic):
        topic_factory(name=name)
    forwarded = _upstream_retry_headers(upstream)
    ((_, offset),) = produce(bootstrap, topic, [(b"\x00key", b"\xffvalue", forwarded, None)])
    topics_seen: list[str] = []

    def handle(msg: Message) -> None:
        topics_seen.append(msg.topic())  # type: ignore[arg-type]
        raise RuntimeError("downstream refused")

    consumer = ResilientConsumer(
        config(kafka_cluster), [topic], handle, retry_topics=policy, install_signal_handlers=False
    )
    runner = Runner(consumer)
    try:
        wait_for(
            lambda: consumer.health().dead_lettered == 1,
            90,
            "the record dead-lettered after its retry tier",
        )
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert topics_seen == [topic, policy.topic(topic, 0)]  # the source, then its own tier
    assert read_back(bootstrap, upstream_dlq) == []
    (record,) = read_back(bootstrap, dlq)
    info = parse_dead_letter_headers(record.headers())
    assert (info.original_topic, info.original_partition, info.original_offset) == (
        topic,
        0,
        offset,
    )
    assert info.attempts == 2  # its own: the source attempt and one retry tier
    assert list(info.original_headers) == forwarded  # byte for byte, forwarded block included
    assert (record.key(), record.value()) == (b"\x00key", b"\xffvalue")


def test_retry_view_reads_only_its_own_block_and_key_blocks_only_own_topics() -> None:
    """Units of the same rule: a source record with forwarded retry headers is not a retry;
    a record of our retry topic whose original carried a forwarded block is read by its LAST
    block (ours), the forwarded one staying in the original headers."""
    forwarded = _upstream_retry_headers("orders")

    class _Rec:
        def __init__(self, topic: str, headers: list[tuple[str, bytes | None]]) -> None:
            self._topic, self._headers = topic, headers

        def topic(self) -> str:
            return self._topic

        def partition(self) -> int:
            return 4

        def offset(self) -> int:
            return 9

        def timestamp(self) -> tuple[int, int]:
            return (1, 5)

        def headers(self) -> list[tuple[str, bytes | None]]:
            return self._headers

        def key(self) -> bytes:
            return b"K"

    class _Upstream(_Rec):
        def partition(self) -> int:
            return 0

        def offset(self) -> int:
            return 77

        def timestamp(self) -> tuple[int, int]:
            return (1, 1_700_000_000_000)

    upstream = _Upstream("orders", forwarded[:1])
    written = retry_headers(
        upstream, tier=0, delay=1, exc=RuntimeError(), retry_topics=(), now_ms=1_700_000_000_000
    )
    assert written == forwarded  # the literal above is what kresilient writes upstream
    own = {"orders2.retry.1s"}
    source = _Rec("orders2", forwarded)
    assert not RetryView.is_retry(source, own)
    moved = retry_headers(source, tier=0, delay=1, exc=RuntimeError(), retry_topics=own)
    assert moved[: len(forwarded)] == forwarded  # the original headers first, byte for byte
    back = _Rec("orders2.retry.1s", moved)
    assert RetryView.is_retry(back, own)
    view = RetryView(back)
    assert (view.topic(), view.partition(), view.offset(), view.tier) == ("orders2", 4, 9, 1)
    assert view.headers() == forwarded
    keys = KeyBlocks(own)
    assert keys.key_of(source)[0] == ("orders2", 4, b"K")  # not orders@77
    assert keys.key_of(back)[0] == ("orders2", 4, b"K")


# --------------------------------------------------------------------------- dedupe, deferred


@pytest.mark.integration
def test_deferred_retry_record_is_skipped_when_its_id_was_processed_meanwhile(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A re-sent copy (marked, id m1) fails and moves to the 4 s retry tier; the other copy
    of m1 is handled meanwhile. When the moved copy comes back it is not due yet: it is
    deferred (its partition held) and, once due, must be skipped as a duplicate like any
    record reaching the dedupe check. Before the fix the deferred path bypassed dedupe and
    the handler ran on m1 twice."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _dlq = with_dlq(topic_factory)
    policy = RetryTopicPolicy(delays=(4.0,))
    for name in policy.topics(topic):
        topic_factory(name=name)
    ident = uuid.uuid4().hex.encode()
    produce(
        bootstrap,
        topic,
        [
            (b"k", b"copy", [(MESSAGE_ID_HEADER, ident), (POSSIBLE_DUPLICATE_HEADER, b"true")], 0),
            (b"k", b"first", [(MESSAGE_ID_HEADER, ident)], 0),
            (b"k", b"after", None, 0),
        ],
    )
    calls: list[tuple[str, bytes]] = []
    failed_once = False
    deferred_seen = False

    def handle(msg: Message) -> None:
        nonlocal failed_once
        calls.append((msg.topic(), msg.value()))  # type: ignore[arg-type]
        if msg.value() == b"copy" and not failed_once:
            failed_once = True
            raise RuntimeError("timeout of a dependency: retried through the retry topic")

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        retry_topics=policy,
        dedupe=Deduplicator(),
        install_signal_handlers=False,
    )
    retry_topic = policy.topic(topic, 0)
    runner = Runner(consumer)

    def settled() -> bool:
        nonlocal deferred_seen
        health = consumer.health()
        deferred_seen |= any(h["topic"] == retry_topic for h in health.held_partitions)
        copies = sum(1 for _, v in calls if v == b"copy")
        return health.duplicates_skipped == 1 or copies >= 2

    try:
        wait_for(settled, 90, "the moved copy skipped or handled again")
    finally:
        runner.stop()
    assert runner.error is None, runner.error
    assert deferred_seen, "the retry record was due when fetched: the seam was not exercised"
    assert [v for _, v in calls] == [b"copy", b"first", b"after"], calls
    assert consumer.health().duplicates_skipped == 1


# --------------------------------------------------------------------------- crash loops

_WORKER = r"""
import os, sys, threading, time
import tenacity
from kresilient.consumer import ResilientConsumer, RetryPolicy

bootstrap, topic, group, out, mode = sys.argv[1:6]
fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

def handle(msg):
    os.write(fd, b"call %d\n" % msg.offset())
    if mode == "block":
        threading.Event().wait()  # in flight until the process is killed
    raise RuntimeError("dependency down: retried in an hour")

consumer = ResilientConsumer(
    {"bootstrap.servers": bootstrap, "group.id": group,
     "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
    [topic], handle,
    retry=RetryPolicy(stop=tenacity.stop_never, wait=tenacity.wait_fixed(3600)),
    max_process_deaths=2,
)

def report():
    seen = 0
    while True:
        held = consumer.health().held_partitions
        attempts = max((h["attempts"] for h in held), default=0)
        if attempts > seen:
            seen = attempts
            os.write(fd, b"held %d\n" % attempts)
        time.sleep(0.05)

threading.Thread(target=report, daemon=True).start()
consumer.run()
"""


def _lines(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def _run_and_kill(script: Path, args: list[str], out: Path, until: str) -> None:
    """Start the worker, wait for ``until`` lines more in ``out``, SIGKILL it (by pid)."""
    before = len(_lines(out))
    proc = subprocess.Popen([sys.executable, str(script), *args])
    try:
        wait_for(
            lambda: (
                any(line.startswith(until) for line in _lines(out)[before:])
                or proc.poll() is not None
            ),
            120,
            f"worker line {until!r}",
        )
        assert proc.poll() is None, f"worker exited with {proc.returncode}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _marker(bootstrap: str, group: str, topic: str) -> str | None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (part,) = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return part.metadata  # type: ignore[no-any-return]
    finally:
        consumer.close()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["held", "block"], ids=["held-in-retry-wait", "control-in-flight"])
def test_kills_during_a_retry_wait_are_not_crash_loop_deaths(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, tmp_path: Path, mode: str
) -> None:
    """max_process_deaths=2. The record fails (a dependency down) and waits an hour for its
    next attempt; the process is SIGKILLed during the wait twice (a deploy, an eviction). At
    the third start the record must be tried again, not dead-lettered as a crash loop.

    Control (``block``): the same two kills while the handler is IN the record: counted, the
    third start dead-letters it as ``crash_loop`` without calling the handler (the kills are
    real and the protection works)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k", b"x", None, None)])
    group = f"g-{uuid.uuid4().hex[:10]}"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    out = tmp_path / "out"
    args = [bootstrap, topic, group, str(out), "fail" if mode == "held" else "block"]
    # first start (a new group: seeded, not probed) and the second (probed after the kill)
    until = "held" if mode == "held" else "call"
    _run_and_kill(script, args, out, until)
    _run_and_kill(script, args, out, until)
    marker = parse_marker(_marker(bootstrap, group, topic))
    assert marker is not None and marker.offset == 0, marker
    proc = subprocess.Popen([sys.executable, str(script), *args])
    try:
        calls_before = sum(line.startswith("call") for line in _lines(out))

        def third_start_decided() -> bool:
            calls = sum(line.startswith("call") for line in _lines(out))
            return calls > calls_before or bool(_end(bootstrap, dlq))

        wait_for(third_start_decided, 120, "the third start to call or dead-letter the record")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    dead = read_back(bootstrap, dlq)
    calls = sum(line.startswith("call") for line in _lines(out))
    if mode == "held":
        assert dead == [], [parse_dead_letter_headers(r.headers()) for r in dead]
        assert calls == 3  # tried again at the third start
        assert marker.waiting and marker.deaths == 0
    else:
        (record,) = dead
        info = parse_dead_letter_headers(record.headers())
        assert info.error_category == "crash_loop" and info.attempts == 2
        assert calls == 2  # not called a third time


def _end(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "end-" + uuid.uuid4().hex})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
    finally:
        consumer.close()


# --------------------------------------------------------------------------- /ready


def test_a_forwarded_duplicate_mark_does_not_mark_the_producers_own_id() -> None:
    """Dedupe headers under the same rule (pure header parsing): the spool and the outbox
    append ``message.id`` then the mark; an upstream id and mark forwarded before them are
    not this record's. The last id counts, and a mark only after it."""
    from kresilient.dedupe import record_id

    class _Rec:
        def __init__(self, headers: list[tuple[str, bytes | None]]) -> None:
            self._headers = headers

        def headers(self) -> list[tuple[str, bytes | None]]:
            return self._headers

        def topic(self) -> str:
            return "orders2"

    upstream = [(MESSAGE_ID_HEADER, b"up-1"), (POSSIBLE_DUPLICATE_HEADER, b"true")]
    own_first_copy = _Rec([*upstream, (MESSAGE_ID_HEADER, b"own-7")])
    own_resent = _Rec(
        [*upstream, (MESSAGE_ID_HEADER, b"own-7"), (POSSIBLE_DUPLICATE_HEADER, b"true")]
    )
    assert record_id(own_first_copy) == (b"own-7", False)
    assert record_id(own_resent) == (b"own-7", True)
    dedupe = Deduplicator()
    dedupe.processed(own_first_copy)
    assert dedupe.is_duplicate(own_resent) and not dedupe.is_duplicate(own_first_copy)
