"""Issue 36, items 2 and 3 (producer side): a new user's first bad day.

A wrong bootstrap address made the README producer wait 120 s, then raise a ``DeliveryError``
whose text said "it was not written." and then "may have been written: re-send only with
dedup", then log ``producer_closed failed=0``. Here: a producer that never reached a broker
fails its messages ``unreachable_timeout`` seconds after it started, with ONE text naming the
address and the cause; a producer that reached the cluster once keeps waiting
``message.timeout.ms`` (negative control on a real cluster that goes away and comes back);
the unreachable condition is one line when it starts and one when it ends; logs are on
stderr, quiet at INFO on a healthy cluster, and the close events come in order.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaError
from structlog.testing import capture_logs

from kresilient import DeliveryError, ErrorCategory, ProduceError
from kresilient.producer import ResilientProducer
from kresilient.reachability import LogBridge, Reachability
from kresilient.testing import KafkaCluster

_CHECK = (
    "Check bootstrap.servers, that the brokers run and listen on these addresses, DNS, "
    "firewalls, and security.protocol/TLS settings"
)
#: librdkafka's flush() is sliced (0.5 s) and the producer asks the cluster for its metadata
#: once (0.5 s) before failing the messages: flush(timeout=bound + this) must see them failed
_SLACK = 3.0


def _wait_until(
    what: str, condition: Callable[[], bool], poll: Callable[[], Any], limit: float
) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        poll()


# ----------------------------------------------------------------- a wrong address (acceptance 2)


def test_closed_port_fails_the_messages_within_the_bound_with_one_text(closed_port: int) -> None:
    """Real connection refusals (a held, never-listening port). flush() is given exactly the
    documented bound: on c15a167 it ended with "3 message(s) still queued ... after
    flush(timeout=...)" (they waited for message.timeout.ms, 120 s); now it lists the three
    messages failed, never sent, with one text and nothing that contradicts it."""
    address = f"127.0.0.1:{closed_port}"
    bound = 2.0
    with capture_logs() as logs:
        producer = ResilientProducer(
            {"bootstrap.servers": address}, unreachable_timeout=bound, exit_timeout=0
        )
        handles = [producer.produce("orders", b"m%d" % i, key=b"k") for i in range(3)]
        with pytest.raises(DeliveryError) as info:
            producer.flush(timeout=bound + _SLACK)
        producer.close()
    expected_remedy = (
        f"no broker of bootstrap.servers={address} was reached within 2 s "
        f"({address}: connection refused); the message was failed without waiting for "
        "message.timeout.ms (unreachable_timeout=2 s): it was never sent and was not "
        f"written; produce it again once the cluster is reachable. {_CHECK}"
    )
    assert str(info.value) == (
        f"3 message(s) failed delivery: orders: 3 x _PURGE_QUEUE (DELIVERY_TIMEOUT) — "
        f"{expected_remedy}"
    )
    assert len(info.value.failures) == 3
    for failure in info.value.failures:
        c = failure.classification
        assert c.remedy == expected_remedy
        assert not c.possibly_persisted and not c.retriable
    # each message's own error says the same, once
    error = handles[0].exception(timeout=0)
    assert isinstance(error, ProduceError)
    assert str(error).endswith(f"[DELIVERY_TIMEOUT, FAIL] {expected_remedy}")
    # nothing anywhere says the opposite
    every_text = str(info.value) + " ".join(str(e) for e in logs)
    for contradiction in (
        "may have been written",
        "re-send only with dedup",
        "possibly_persisted=True",
    ):
        assert contradiction not in every_text
    events = [e["event"] for e in logs]
    (closed,) = [e for e in logs if e["event"] == "producer_closed"]
    assert closed["failed"] == 3 and closed["produced"] == 3  # c15a167: failed=0
    assert closed["log_level"] == "info"
    assert "producer_not_closed" not in events
    assert "kafka_reachable" not in events  # the condition never ended
    (failed_line,) = [e for e in logs if e["event"] == "unreachable_messages_failed"]
    assert failed_line["suppressed"] == 0 and failed_line["bootstrap_servers"] == address
    (unreachable,) = [e for e in logs if e["event"] == "kafka_unreachable"]
    assert unreachable["hosts"] == {address: "refused"}  # negative control: refusals were real


def test_opting_out_waits_message_timeout_and_still_says_one_thing(closed_port: int) -> None:
    """``unreachable_timeout=None`` keeps today's wait (message.timeout.ms); the timed-out
    messages, never assigned a partition, are said not written ONCE: c15a167 appended the
    timeout's own "may have been written: re-send only with dedup" to it."""
    address = f"127.0.0.1:{closed_port}"
    producer = ResilientProducer(
        {"bootstrap.servers": address, "message.timeout.ms": 2000},
        unreachable_timeout=None,
        exit_timeout=0,
    )
    try:
        producer.produce("orders", b"m")
        with pytest.raises(DeliveryError) as info:
            producer.flush(timeout=2 + _SLACK)
    finally:
        producer.close()
    assert str(info.value) == (
        "1 message(s) failed delivery: orders: 1 x _MSG_TIMED_OUT (DELIVERY_TIMEOUT) — "
        f"no broker of bootstrap.servers={address} was reached within 2 s ({address}: "
        "connection refused); the message was never assigned a partition, so it was never "
        f"sent and was not written; produce it again once the cluster is reachable. {_CHECK}"
    )


def test_unresolvable_name_is_named_as_dns() -> None:
    """A real failed name resolution: the cause is DNS, in words."""
    address = "no-such-host.invalid:9092"
    producer = ResilientProducer(
        {"bootstrap.servers": address}, unreachable_timeout=1.0, exit_timeout=0
    )
    try:
        producer.produce("orders", b"m")
        with pytest.raises(DeliveryError) as info:
            producer.flush(timeout=1 + _SLACK)
    finally:
        producer.close()
    (failure,) = info.value.failures
    assert f"({address}: name not resolved (DNS))" in failure.classification.remedy
    assert "never sent and was not written" in failure.classification.remedy


def test_unreachable_timeout_must_be_positive_or_none() -> None:
    from kresilient import ConfigError

    with pytest.raises(ConfigError) as info:
        ResilientProducer({"bootstrap.servers": "127.0.0.1:1"}, unreachable_timeout=0)
    assert info.value.key == "unreachable_timeout"


# ------------------------------------------------ a cluster that goes away and comes back (real)


@pytest.fixture(name="lone_node", scope="module")
def _lone_node() -> Iterator[KafkaCluster]:
    """A one-node cluster of this module's own: the tests stop and start its only node."""
    with KafkaCluster(nodes=1) as cluster:
        yield cluster


def test_unreachable_condition_is_one_line_when_it_starts_and_one_when_it_ends(
    lone_node: KafkaCluster,
) -> None:
    """The producer starts while the cluster's only node is stopped (its port is held, so
    connections are refused), then the node starts: one ``kafka_unreachable`` line, one
    ``kafka_reachable`` line, and the message is delivered (nothing failed early: the bound
    is longer than the outage)."""
    topic = "bad-day-comes-back"
    lone_node.create_topic(topic, 1, 1)
    lone_node.stop(1)
    try:
        with capture_logs() as logs:
            producer = ResilientProducer(
                {"bootstrap.servers": lone_node.bootstrap_servers},
                unreachable_timeout=300.0,
                exit_timeout=0,
            )
            handle = producer.produce(topic, b"m")
            _wait_until(
                "the unreachable line",
                lambda: any(e["event"] == "kafka_unreachable" for e in logs),
                lambda: producer.poll(0.1),
                30,
            )
    finally:
        lone_node.start(1)
    with capture_logs() as later:
        assert producer.flush(timeout=120) is None
        producer.close()
    assert handle.result(timeout=0).topic == topic
    everything = logs + later
    events = [e["event"] for e in everything]
    assert events.count("kafka_unreachable") == 1, events
    assert events.count("kafka_reachable") == 1, events
    assert events.index("kafka_unreachable") < events.index("kafka_reachable")
    (end,) = [e for e in everything if e["event"] == "kafka_reachable"]
    assert end["unreachable_for_s"] > 0 and end["log_level"] == "warning"  # as the start


def test_a_producer_that_reached_the_cluster_keeps_waiting_message_timeout(
    lone_node: KafkaCluster,
) -> None:
    """Negative control: once a broker was reached, the cluster going away (its only node
    stopped) does not fail the messages at ``unreachable_timeout``; they wait and are
    delivered when it comes back (as before: message.timeout.ms bounds them)."""
    topic = "bad-day-goes-away"
    lone_node.create_topic(topic, 1, 1)
    producer = ResilientProducer(
        {"bootstrap.servers": lone_node.bootstrap_servers},
        unreachable_timeout=1.0,
        exit_timeout=0,
    )
    try:
        producer.produce(topic, b"before")
        assert producer.flush(timeout=60) is None  # reached
        lone_node.stop(1)
        try:
            handle = producer.produce(topic, b"during")
            with pytest.raises(DeliveryError) as info:
                producer.flush(timeout=1.0 + _SLACK)  # well past the bound
            assert info.value.failures == ()  # nothing failed: still queued
            assert "still queued" in str(info.value)
        finally:
            lone_node.start(1)
        assert producer.flush(timeout=120) is None
        assert handle.result(timeout=0).topic == topic
    finally:
        producer.close()


# ---------------------------------------------------------------- logs (issue 36, item 3)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_fake_clock_unreachable_is_one_line_then_a_minutely_reminder_then_an_end() -> None:
    """librdkafka reports "all brokers down" again and again while it lasts; c15a167 logged
    kafka_unreachable each time its limiter was reset (suppressed=0 each time)."""
    clock = _Clock()
    with capture_logs() as logs:
        reach = Reachability(structlog.get_logger("t"), interval=60.0, clock=clock)
        reach.failed(
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"
        )
        for _ in range(30):  # every 2 s for a minute
            reach.all_down("1/1 brokers are down")
            clock.now += 2.0
        reach.on_stats({"brokers": {"GroupCoordinator": {"state": "UP", "source": "logical"}}})
        reach.all_down("1/1 brokers are down")  # 60 s after the first: the reminder
        clock.now += 5.0
        reach.up(1)
        reach.up(1)  # already reachable: no second end line
    events = [(e["event"], e.get("reminder"), e.get("suppressed")) for e in logs]
    assert events == [
        ("kafka_unreachable", False, 0),
        ("kafka_unreachable", True, 29),
        ("kafka_reachable", None, 0),
    ], events
    assert logs[1]["down_for_s"] == 60.0 and logs[2]["unreachable_for_s"] == 65.0
    assert "message.timeout.ms" not in logs[0]["note"]  # the consumer's wording too


def test_fake_clock_coordinator_load_line_is_info_once_then_debug() -> None:
    """The GETPID line of a fresh cluster's first idempotent producer was a WARNING with no
    explanation; it passes by itself: INFO once with what it means, then DEBUG; still
    reported a minute later it is a WARNING (it no longer passes by itself)."""
    clock = _Clock()
    line = (
        "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:39853/3: "
        "Broker: Coordinator load in progress: retrying"
    )
    with capture_logs() as logs:
        bridge = LogBridge(structlog.get_logger("t"), lambda _t: None, lambda t: t, clock=clock)
        for _ in range(5):
            bridge.log(30, "%s [%s] %s", "GETPID", "rdkafka#producer-1", line)
            clock.now += 1.0
        clock.now += 60.0
        bridge.log(30, "%s [%s] %s", "GETPID", "rdkafka#producer-1", line)
        bridge.log(30, "%s [%s] %s", "FAIL", "rdkafka#producer-1", "something else")
    levels = [(e["facility"], e["log_level"]) for e in logs]
    assert levels == [("GETPID", "info")] + [("GETPID", "debug")] * 4 + [
        ("GETPID", "warning"),
        ("FAIL", "warning"),  # other lines keep librdkafka's level (negative control)
    ], levels
    assert "nothing to do" in logs[0]["note"] and logs[5]["suppressed"] == 4


def test_producer_not_closed_is_never_logged_after_producer_closed(closed_port: int) -> None:
    """The safety net (a dropped producer) logged producer_closed, then producer_not_closed,
    whose text says the opposite. Now it logs its one line only."""
    with capture_logs() as logs:
        producer = ResilientProducer(
            {"bootstrap.servers": f"127.0.0.1:{closed_port}"},
            unreachable_timeout=None,
            exit_timeout=0,
        )
        producer.produce("orders", b"m")
        del producer
        gc.collect()
    events = [e["event"] for e in logs]
    assert "producer_not_closed" in events  # negative control: the safety net ran
    assert "producer_closed" not in events, events


_HEALTHY_CHILD = textwrap.dedent(
    """
    import logging, sys
    import structlog
    from kresilient import ResilientProducer

    # what kresilient.logging.configure() does (tests/test_logging.py), spelled out so the
    # test runs against a kresilient without it: INFO and above, on stderr
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )
    with ResilientProducer({"bootstrap.servers": sys.argv[1]}) as producer:
        for n in range(100):
            producer.produce(sys.argv[2], b"order %d" % n, key=b"c%d" % (n % 7))
        producer.flush()
    print("sent 100")
    """
)


def test_default_level_output_on_a_healthy_cluster_is_quiet_and_on_stderr(
    kafka_cluster: KafkaCluster, topic_factory: Any
) -> None:
    """The README producer on a fresh topic, logs at INFO on stderr: stdout is the program's
    own line; stderr has nothing a person need not act on (c15a167: producer_created with
    the whole config and producer_closed at INFO). A fresh cluster's coordinator-load line
    may appear once, at INFO, explained."""
    topic = topic_factory(partitions=3)
    proc = subprocess.run(
        [sys.executable, "-c", _HEALTHY_CHILD, kafka_cluster.bootstrap_servers, topic],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "sent 100\n"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    unexplained = [line for line in lines if "facility=GETPID" not in line]
    assert unexplained == [], lines
    assert len(lines) <= 1, lines


def test_getpid_error_code_is_transient_in_the_table() -> None:
    """What the docs say about the coordinator-load line: its code is TRANSIENT (retried)."""
    from kresilient.errors import classify

    assert classify(KafkaError.COORDINATOR_LOAD_IN_PROGRESS).category is ErrorCategory.TRANSIENT


def test_the_dead_letter_writers_coordinator_load_line_is_info_once_then_debug() -> None:
    """The same GETPID line from the consumer's dead-letter writer (its own librdkafka
    instance, its own log bridge) was a WARNING: the README consumer printed it on a loaded
    machine, a third line past issue 36's two. Now worded as the clients' own bridge does."""
    from kresilient._ratelimit import RateLimiter
    from kresilient.deadletter import _LogBridge as DeadLetterLogBridge
    from kresilient.redaction import Redactor

    line = (
        "[thrd:main]: Failed to acquire idempotence PID from broker 127.0.0.1:24422/2: "
        "Broker: Coordinator load in progress: retrying"
    )
    with capture_logs() as logs:
        bridge = DeadLetterLogBridge(structlog.get_logger("t"), Redactor(), RateLimiter(60.0))
        for _ in range(3):
            bridge.log(30, "%s [%s] %s", "GETPID", "kresilient-consumer-dlq#producer-1", line)
        bridge.log(30, "%s [%s] %s", "GETPID", "kresilient-consumer-dlq#producer-1", "other")
    levels = [(e["facility"], e["log_level"]) for e in logs]
    assert levels == [
        ("GETPID", "info"),
        ("GETPID", "debug"),
        ("GETPID", "debug"),
        ("GETPID", "warning"),  # another GETPID line keeps librdkafka's level (control)
    ], levels
    assert logs[0]["transient"] is True and "nothing to do" in logs[0]["note"]
