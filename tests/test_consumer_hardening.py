"""ResilientConsumer hardening (issue 11 defects 2, 5, 6, 8, 10; issue 23 defects 2 and 3).

Each test is named for its scenario and fails on 9c6e9f3. Real 3-node cluster wherever a
guarantee is claimed; the rebalance-inside-consume interleaving of defect 10 is forced by a
thin proxy around the real ``confluent_kafka.Consumer`` (it only chooses WHEN the real
``consume()`` calls happen; the rebalance, the revoke commit and the messages are real).
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any

import pytest
import structlog
import tenacity
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from opentelemetry.trace import StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from test_consumer_integration import (
    Runner,
    TopicFactory,
    committed,
    config,
    ends,
    produce,
    wait_for,
    with_dlq,
)
from test_telemetry import Otel

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.consumer._support import SignalHandlers
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster

pytestmark = pytest.mark.integration

W3C = TraceContextTextMapPropagator()


def _group_members(bootstrap: str, group: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return len(desc.members)


# --------------------------------------------------------------------------- defect 2


def test_retried_partition_resumes_after_the_assignment_is_lost(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """p0 is held for a retry; a handler on p1 overruns max.poll.interval.ms, the group takes
    both partitions back (on_lost), cooperative-sticky returns them: p0 must be consumed
    again (on 9c6e9f3 it stayed paused forever and health() showed nothing held)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=2)
    group = f"g-{uuid.uuid4().hex[:10]}"
    produce(bootstrap, topic, [(b"k0", b"p0-held", None, 0)])
    lost = threading.Event()
    p0_failures: list[int] = []
    p0_done = threading.Event()

    def handle(msg: Message) -> None:
        if msg.partition() == 0:
            if not lost.is_set():
                p0_failures.append(msg.offset())  # type: ignore[arg-type]
                raise RuntimeError("downstream not ready")
            p0_done.set()
            return
        # p1: block (no poll) until the group has thrown this member out
        wait_for(lambda: _group_members(bootstrap, group) == 0, 90, "the group to empty")

    consumer = ResilientConsumer(
        config(
            kafka_cluster,
            group,
            **{
                "max.poll.interval.ms": 7000,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
            },
        ),
        [topic],
        handle,
        retry=RetryPolicy(
            stop=tenacity.stop_never,
            # long enough that p0 is still paused when the assignment is lost
            wait=tenacity.wait_fixed(60),
            retry=tenacity.retry_if_exception_type(RuntimeError),
        ),
        on_lost=lambda _parts: lost.set(),
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: bool(p0_failures), 60, "the first failure on p0")
        produce(bootstrap, topic, [(b"k1", b"p1-slow", None, 1)])
        wait_for(lost.is_set, 90, "the assignment to be lost")
        wait_for(p0_done.is_set, 60, "p0's held message to be consumed again")
    finally:
        runner.stop()
    assert runner.error is None
    health = consumer.health()
    assert health.rebalances["lost"] >= 1
    assert health.held_partitions == []


# --------------------------------------------------------------------------- defect 10


def test_drop_unassigned_keeps_only_messages_of_assigned_partitions() -> None:
    """The filtering logic of defect 10 (pure: fake messages)."""
    from kresilient.consumer._consumer import drop_unassigned

    class M:
        def __init__(self, topic: str, partition: int | None) -> None:
            self._t, self._p = topic, partition

        def topic(self) -> str:
            return self._t

        def partition(self) -> int | None:
            return self._p

    msgs = [M("a", 0), M("a", 1), M("b", 0), M("a", 0), M("x", None), M("x", -1)]
    kept, dropped = drop_unassigned(msgs, {("a", 0), ("b", 0)})  # type: ignore[arg-type]
    assert kept == [msgs[0], msgs[2], msgs[3], msgs[4], msgs[5]]
    assert dropped == [msgs[1]]
    kept, dropped = drop_unassigned(msgs, set())  # type: ignore[arg-type]
    assert dropped == msgs[:4] and kept == msgs[4:]


class _RebalanceInSecondConsume:
    """The real Consumer, with a rebalance forced into the loop's ``consume(size - 1, 0)``.

    Phase 1: ``consume(size, 0)`` returns nothing and ``consume(1, t)`` one real message ``m``.
    Phase 2 (the following ``consume(size - 1, 0)``): a second member joins the group and the
    real ``consume()`` is called until the rebalance revoked the partitions (the revoke commit
    runs in there); whatever it returned is returned. Then plain delegation.
    """

    def __init__(self, real: Consumer, join: Any, revoked: threading.Event) -> None:
        self._real = real
        self._join = join
        self._revoked = revoked
        self.phase = 0
        self.first: Message | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        real = self._real
        if self.phase == 0 and num_messages > 1:
            return []
        if self.phase == 0:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = [m for m in real.consume(1, 0.5) if m.error() is None]
                if got:
                    self.first = got[0]
                    self.phase = 1
                    return got
            raise AssertionError("no message within 60 s")
        if self.phase == 1:
            self.phase = 2
            self._join()
            out: list[Message] = []
            deadline = time.monotonic() + 90
            while not self._revoked.is_set():
                assert time.monotonic() < deadline, "no revoke within 90 s"
                out.extend(real.consume(num_messages, 0.2))
            return out
        return list(real.consume(num_messages, timeout))


def test_message_of_a_revoked_partition_is_not_handled_after_the_revoke_commit(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """consume(1, t) returned m; a rebalance inside consume(size-1, 0) revoked m's partition
    and committed; m must not be handled afterwards (on 9c6e9f3 it was)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=1)
    group = f"g-{uuid.uuid4().hex[:10]}"
    produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(5)])
    events: list[tuple[str, Any]] = []
    revoked = threading.Event()
    other: dict[str, Any] = {}
    stop_other = threading.Event()

    def join() -> None:  # a second member: an eager rebalance revokes everything
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "partition.assignment.strategy": "range",
                "enable.auto.commit": False,
                # range gives the one partition to the lowest member id: this member's
                "client.id": "aaa-second-member",
            }
        )
        c.subscribe([topic])
        other["c"] = c

        def run() -> None:
            while not stop_other.is_set():
                c.poll(0.2)

        threading.Thread(target=run, daemon=True).start()

    def on_revoke(parts: list[TopicPartition]) -> None:
        events.append(("revoked", {(p.topic, p.partition) for p in parts}))
        revoked.set()

    def handle(msg: Message) -> None:
        events.append(("handled", (msg.topic(), msg.partition(), msg.offset())))

    consumer = ResilientConsumer(
        config(kafka_cluster, group, **{"partition.assignment.strategy": "range"}),
        [topic],
        handle,
        on_revoke=on_revoke,
        on_assign=lambda parts: events.append(
            ("assigned", {(p.topic, p.partition) for p in parts})
        ),
        install_signal_handlers=False,
    )
    proxy = _RebalanceInSecondConsume(consumer._consumer, join, revoked)
    consumer._consumer = proxy  # type: ignore[assignment]
    runner = Runner(consumer)
    try:
        wait_for(lambda: proxy.phase == 2 and revoked.is_set(), 120, "the forced rebalance")
        wait_for(
            lambda: sum(e[0] == "assigned" for e in events) >= 2 or not runner.thread.is_alive(),
            90,
            "the re-assignment",
        )
    finally:
        runner.stop()
        stop_other.set()
        if "c" in other:
            other["c"].close()
    assert runner.error is None
    first = proxy.first
    assert first is not None
    m = (first.topic(), first.partition(), first.offset())
    tp = (m[0], m[1])
    owned = False
    for kind, what in events:
        if kind == "assigned" and tp in what:
            owned = True
        elif kind == "revoked" and tp in what:
            owned = False
        elif kind == "handled" and what == m:
            assert owned, f"{m} handled after its partition was revoked: {events}"


# --------------------------------------------------------------------------- defect 6


def _captured_log() -> tuple[Any, list[str]]:
    """A structlog logger keeping each event's name (and dropping the line)."""
    events: list[str] = []

    def capture(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(str(event["event"]))
        raise structlog.DropEvent

    return structlog.wrap_logger(None, processors=[capture]), events


@pytest.mark.parametrize("second_signal", [True, False], ids=["interrupted", "control"])
def test_second_signal_turned_into_another_error_in_the_handler_is_not_a_failure(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, second_signal: bool
) -> None:
    """A signal handler runs between two bytecodes wherever the main thread is, and the code
    its KeyboardInterrupt lands in can turn it into another exception (CI: RuntimeError
    'release unlocked lock' inside a lock's release; here a ValueError, which the consumer
    dead-letters at once). A 2nd signal in the handler must still interrupt it: the message
    is neither dead-lettered nor committed, run() raises KeyboardInterrupt. (The signal is
    delivered by calling the installed handler, exactly where the interpreter would run it.)
    Control: the same ValueError with no 2nd signal is the handler's failure and is
    dead-lettered, so the dead-letter path is live."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k", b"%d" % i, None, 0) for i in range(3)])
    cfg = config(kafka_cluster)
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        if msg.offset() != 1:
            return
        signals = consumer._signals
        signals._handle(signal.SIGINT, None)  # 1st: stop after the message in hand
        try:
            if second_signal:
                signals._handle(signal.SIGINT, None)  # 2nd: interrupts the handler
        except KeyboardInterrupt as interrupt:
            raise ValueError("turned into a poison-looking error") from interrupt
        raise ValueError("turned into a poison-looking error")

    consumer = ResilientConsumer(cfg, [topic], handle, install_signal_handlers=False)
    if second_signal:
        with pytest.raises(KeyboardInterrupt):
            consumer.run()
        assert ends(bootstrap, dlq) == {0: 0}  # nothing dead-lettered
        assert committed(bootstrap, cfg["group.id"], topic, [0]) == {0: 1}  # 1 comes again
    else:
        consumer.run()
        assert ends(bootstrap, dlq) == {0: 1}
        assert committed(bootstrap, cfg["group.id"], topic, [0]) == {0: 2}


@pytest.mark.parametrize("fate", ["turned", "swallowed", "control"])
def test_third_signal_aborts_even_when_the_step_it_lands_in_mangles_it(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, fate: str
) -> None:
    """The third signal of a shutdown aborts it even when the step it lands in turns its
    KeyboardInterrupt into another exception (CI, the await-dead-letters step: logged as
    ``shutdown_step_failed: RuntimeError('release unlocked lock')``, then the shutdown went
    on, committed, closed and exited 0) or swallows it. Control: a step failing on its own
    is logged and the shutdown goes on to close."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory)
    produce(bootstrap, topic, [(b"k", b"0", None, 0)])
    cfg = config(kafka_cluster)
    log, events = _captured_log()
    consumer: ResilientConsumer

    def handle(_msg: Message) -> None:
        consumer._signals._handle(signal.SIGINT, None)  # 1st: stop, then the shutdown

    consumer = ResilientConsumer(cfg, [topic], handle, install_signal_handlers=False, logger=log)
    commit = consumer._offsets.commit_sync
    calls: list[str] = []

    def commit_step(reason: str) -> None:
        calls.append(reason)
        if len(calls) > 1:  # the commit on revoke inside close(): no more signals
            commit(reason)
            return
        if fate == "control":
            raise RuntimeError("the commit failed on its own")
        signals = consumer._signals
        signals._handle(signal.SIGINT, None)  # 2nd during the shutdown: only logged
        try:
            signals._handle(signal.SIGINT, None)  # 3rd: aborts
        except KeyboardInterrupt as interrupt:
            if fate == "turned":
                raise RuntimeError("release unlocked lock") from interrupt
        commit(reason)  # swallowed: the step goes on as if nothing came

    consumer._offsets.commit_sync = commit_step  # type: ignore[method-assign]
    if fate == "control":
        consumer.run()
        assert "shutdown_step_failed" in events and "consumer_closed" in events
        return
    with pytest.raises(KeyboardInterrupt):
        consumer.run()
    assert "shutdown_step_failed" not in events
    assert "consumer_closed" not in events
    assert calls == ["close"]  # nothing ran after the aborted step
    if fate == "turned":  # the abort skipped the final commit (of offset 1)
        assert committed(bootstrap, cfg["group.id"], topic, [0])[0] < 1


# --------------------------------------------------------------------------- defect 5


def test_error_callback_and_constructor_error_are_redacted(kafka_cluster: KafkaCluster) -> None:
    """librdkafka echoes configuration values in error texts; they must not reach the log
    (error_cb, on 9c6e9f3 logged as err.str()) nor the ConfigError of a bad config."""
    secret = "s3cr3t-Passw0rd-xyz"
    events: list[dict[str, Any]] = []

    def capture(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        events.append(dict(event))
        raise structlog.DropEvent

    log = structlog.wrap_logger(None, processors=[capture])
    consumer = ResilientConsumer(
        config(kafka_cluster, **{"sasl.username": "u", "sasl.password": secret}),
        ["t"],
        print,
        logger=log,
        install_signal_handlers=False,
    )
    try:
        err = KafkaError(KafkaError._AUTHENTICATION, f"SASL auth failed (password {secret})")
        consumer._events.on_error(err)
        consumer._events.on_error(KafkaError(KafkaError._TRANSPORT, f"broker down {secret[3:15]}"))
    finally:
        consumer.close()
    text = repr(events) + repr(consumer)
    assert any(e.get("event") == "kafka_error" for e in events), events
    assert secret not in text and secret[3:15] not in text, text

    # the real thing: librdkafka echoes the tail of a malformed sasl.oauthbearer.config in
    # the error it hands to error_cb ("... beginning at: <the rest of the value>")
    events.clear()
    oauth = ResilientConsumer(
        config(
            kafka_cluster,
            **{
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "OAUTHBEARER",
                "enable.sasl.oauthbearer.unsecure.jwt": True,
                "sasl.oauthbearer.config": f"principal=admin garbage clientSecret={secret}",
            },
        ),
        ["t"],
        print,
        dead_letter=None,
        logger=log,
        install_signal_handlers=False,
    )
    runner = Runner(oauth)
    try:
        wait_for(
            lambda: any("OAUTHBEARER" in str(e.get("detail")) for e in list(events)),
            60,
            "the token error",
        )
    finally:
        runner.stop()
    text = repr(events) + repr(oauth)
    assert secret not in text and secret[3:15] not in text, text


# --------------------------------------------------------------------------- issue 23, 2 and 3


def test_failure_span_carries_the_handler_exception_not_an_internal_class(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"user@example.com", b"not json", None, 0)])
    otel = Otel()
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        consumer.stop()
        raise ValueError("record 0 is not an order")  # not retried: dead-lettered

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        install_signal_handlers=False,
    )
    try:
        Runner(consumer).join(120)
        span = otel.span(f"process {topic}")
    finally:
        otel.shutdown()
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "ValueError", attrs
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description and "not an order" in span.status.description
    exceptions = [e for e in span.events if e.name == "exception"]
    assert len(exceptions) == 1, span.events
    assert (exceptions[0].attributes or {})["exception.type"] == "ValueError"
    # issue 23, 3: no message key on spans by default
    assert "messaging.kafka.message.key" not in attrs
    durations = otel.points("messaging.process.duration")
    assert durations and {a.get("error.type") for a, _ in durations} == {"ValueError"}


def test_failure_span_that_stops_the_consumer_carries_the_handler_exception(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Without a dead-letter topic the failure stops the consumer: the failure handling raises
    inside the span. On 9c6e9f3 the span then carried ``error.type=kresilient.consumer._Handled``,
    an empty status description and a second exception event (issue 23, defect 2)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"k", b"not json", None, 0)])
    otel = Otel()

    def handle(msg: Message) -> None:
        raise ValueError("record 0 is not an order")  # not retried; no DLQ: run() raises it

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        dead_letter=None,
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        install_signal_handlers=False,
    )
    try:
        runner = Runner(consumer)
        runner.join(120)
        span = otel.span(f"process {topic}")
        durations = otel.points("messaging.process.duration")
    finally:
        otel.shutdown()
    assert isinstance(runner.error, ValueError)
    attrs = dict(span.attributes or {})
    assert attrs["error.type"] == "ValueError", attrs
    assert span.status.description and "not an order" in span.status.description
    exceptions = [e for e in span.events if e.name == "exception"]
    assert len(exceptions) == 1, span.events
    assert (exceptions[0].attributes or {})["exception.type"] == "ValueError"
    assert {a.get("error.type") for a, _ in durations} == {"ValueError"}


def test_record_message_key_opt_in(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, _ = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"order-7", b"{}", None, 0)])
    otel = Otel()
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        consumer.stop()

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        record_message_key=True,
        install_signal_handlers=False,
    )
    try:
        Runner(consumer).join(120)
        span = otel.span(f"process {topic}")
    finally:
        otel.shutdown()
    assert dict(span.attributes or {})["messaging.kafka.message.key"] == "order-7"


# --------------------------------------------------------------------------- defect 8


def _dead_letter_through(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, make_writer: Any
) -> list[tuple[str, bytes | None]]:
    """Dead-letter one record carrying a ``traceparent`` through a user-supplied client made
    by ``make_writer(otel)``; return the dead letter's headers."""
    from _producer_helpers import read_back

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=1)
    produce(bootstrap, topic, [(b"k", b"poison", ORIGINAL_HEADERS, 0)])
    otel = Otel()
    writer = make_writer(otel)
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        consumer.stop()
        raise ValueError("poison")

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        handle,
        dead_letter_producer=writer,
        tracer_provider=otel.tracer_provider,
        meter_provider=otel.meter_provider,
        propagator=W3C,
        install_signal_handlers=False,
    )
    try:
        Runner(consumer).join(120)
        writer.flush(30)
    finally:
        writer.close()
        otel.shutdown()
    records = read_back(bootstrap, dlq)
    assert len(records) == 1
    return list(records[0].headers() or [])


ORIGINAL = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ORIGINAL_HEADERS: list[tuple[str, bytes | None]] = [("traceparent", ORIGINAL), ("id", b"7")]


def _byte_for_byte(got: list[tuple[str, bytes | None]]) -> None:
    assert got[: len(ORIGINAL_HEADERS)] == ORIGINAL_HEADERS, got
    assert [k for k, _ in got].count("traceparent") == 1, got
    assert dict(got)["kresilient.traceparent"] != ORIGINAL  # the write's own context


def test_dead_letter_writer_as_dead_letter_producer_keeps_the_original_traceparent(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A dead letter is byte for byte whichever client writes it: a user-supplied
    DeadLetterWriter (9c6e9f3 had none: only a ResilientProducer, which re-injected)."""
    from kresilient.deadletter import DeadLetterWriter

    got = _dead_letter_through(
        kafka_cluster,
        topic_factory,
        lambda _otel: DeadLetterWriter({"bootstrap.servers": kafka_cluster.bootstrap_servers}),
    )
    _byte_for_byte(got)


def test_user_dead_letter_producer_keeps_the_original_traceparent(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """A user-supplied, traced ResilientProducer must not replace the original
    ``traceparent`` header (on 9c6e9f3 it did; only the consumer's own dead-letter producer
    was built without propagation)."""
    got = _dead_letter_through(
        kafka_cluster,
        topic_factory,
        lambda otel: ResilientProducer(
            {"bootstrap.servers": kafka_cluster.bootstrap_servers},
            tracer_provider=otel.tracer_provider,
            meter_provider=otel.meter_provider,
            propagator=W3C,
        ),
    )
    _byte_for_byte(got)


def test_a_signal_landing_inside_a_log_write_does_not_deadlock_the_shutdown() -> None:
    """A Python signal handler runs on the main thread between two bytecodes, possibly
    inside a log call holding the logger's non-reentrant write lock (structlog's
    PrintLogger). The handlers logged there themselves and waited for that lock forever: in
    CI the worker hung after its second SIGINT (no shutdown_aborted line, nothing written
    for 120 s). Fails on the previous code (the scenario never finishes)."""
    write_lock = threading.Lock()
    lines: list[str] = []

    class LockedLogger:  # what a PrintLogger does around each line
        def warning(self, event: str, **_fields: Any) -> None:
            with write_lock:
                lines.append(event)

        def error(self, event: str, **_fields: Any) -> None:
            with write_lock:
                lines.append(event)

    handlers = SignalHandlers(stop=lambda: None, stopping=lambda: True, log=LockedLogger())
    handlers.shutting_down = True
    handlers._count = 1  # the first signal started the shutdown
    outcome: list[str] = []

    def scenario() -> None:
        with write_lock:  # the main thread is in the middle of writing a log line
            handlers._handle(signal.SIGINT, None)  # 2nd: logged, the shutdown goes on
            try:
                handlers._handle(signal.SIGINT, None)  # 3rd: aborts
            except KeyboardInterrupt:
                outcome.append("aborted")

    worker = threading.Thread(target=scenario, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the signal handler deadlocked on the logger's lock"
    assert outcome == ["aborted"]
    deadline = time.monotonic() + 10  # both lines are written once the lock is free
    while sorted(lines) != ["shutdown_aborted", "shutdown_signal_received"]:
        assert time.monotonic() < deadline, lines
        time.sleep(0.01)
