"""close() is bounded with a broker frozen (SIGSTOP), and the process exits (issue 42,
acceptance 3).

One child process holds the clients (ResilientProducer, AsyncResilientProducer,
ResilientConsumer, AsyncResilientConsumer, and a TransactionalProducer with a transaction left
open), each connected (the consumers joined their group and handled a record) before the only
broker is frozen; then it closes them all with short bounds and exits. librdkafka's own
``Consumer.close()`` never returns while the group coordinator is frozen (confluent-kafka-python
#1667): without the bound the child hangs and the test fails on its deadline. The cluster is
this module's own: freezing its only node would stall every other test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import pytest
from _producer_helpers import broker_answers

from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

CHILD = textwrap.dedent(
    """
    import asyncio, json, sys, threading, time
    from kresilient import ResilientConsumer, ResilientProducer, TransactionalProducer
    from kresilient.aio import AsyncResilientConsumer, AsyncResilientProducer
    from kresilient.errors import DeliveryError

    bootstrap, topic = sys.argv[1], sys.argv[2]
    cfg = {"bootstrap.servers": bootstrap}
    producer = ResilientProducer(cfg, stall_after_s=None)
    producer.produce(topic, b"seed")
    producer.flush(30)
    txn = TransactionalProducer(cfg, transactional_id="close-txn", timeout=20)
    with txn.transaction():
        txn.produce(topic, b"seed-txn")

    got_sync = threading.Event()
    sync_consumer = ResilientConsumer(
        {**cfg, "group.id": "close-sync", "auto.offset.reset": "earliest"},
        [topic],
        lambda msg: got_sync.set(),
        dead_letter=None,
        shutdown_timeout=3.0,
    )
    sync_thread = threading.Thread(target=sync_consumer.run, daemon=True)
    sync_thread.start()

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    got_async = threading.Event()

    async def handle(msg):
        got_async.set()

    async def make():
        return (
            AsyncResilientConsumer(
                {**cfg, "group.id": "close-async", "auto.offset.reset": "earliest"},
                [topic],
                handle,
                dead_letter=None,
                shutdown_timeout=3.0,
                handle_signals=False,
            ),
            AsyncResilientProducer(cfg, stall_after_s=None),
        )

    async_consumer, async_producer = asyncio.run_coroutine_threadsafe(make(), loop).result(30)
    async_run = asyncio.run_coroutine_threadsafe(async_consumer.run(), loop)

    async def seed():
        handle = await async_producer.produce(topic, b"seed-async")
        await handle

    asyncio.run_coroutine_threadsafe(seed(), loop).result(30)
    assert got_sync.wait(60) and got_async.wait(60), "consumers did not get a record"
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "frozen"

    timings = {}
    began = time.monotonic()
    for i in range(5):
        producer.produce(topic, b"late-%d" % i)
    try:
        producer.close(2.0)
    except DeliveryError as exc:
        timings["producer_failed"] = len(exc.failures)
    timings["producer"] = time.monotonic() - began

    async def close_async_producer():
        for i in range(5):
            await async_producer.produce(topic, b"late-async-%d" % i)
        try:
            await async_producer.close(2.0)
        except DeliveryError as exc:
            return len(exc.failures)
        return 0

    began = time.monotonic()
    timings["async_producer_failed"] = asyncio.run_coroutine_threadsafe(
        close_async_producer(), loop
    ).result(60)
    timings["async_producer"] = time.monotonic() - began

    began = time.monotonic()
    sync_consumer.stop()
    sync_thread.join(60)
    timings["consumer"] = time.monotonic() - began
    timings["consumer_stopped"] = not sync_thread.is_alive()

    began = time.monotonic()
    loop.call_soon_threadsafe(async_consumer.stop)
    try:
        async_run.result(60)
    except Exception as exc:
        timings["async_consumer_error"] = type(exc).__name__
    timings["async_consumer"] = time.monotonic() - began
    timings["async_consumer_stopped"] = async_run.done()

    began = time.monotonic()
    open_txn = txn.transaction()  # a transaction left open by a frozen coordinator
    open_txn.__enter__()
    txn.produce(topic, b"late-txn")
    try:
        txn.close(3.0)
    except Exception as exc:
        timings["txn_error"] = type(exc).__name__
    timings["txn"] = time.monotonic() - began
    print("closed " + json.dumps(timings), flush=True)
    """
)


def test_every_client_closes_within_its_bound_with_the_broker_frozen(
    lone_cluster: KafkaCluster,
) -> None:
    topic = lone_cluster.create_topic(f"close-{uuid.uuid4().hex[:8]}", 1, 1, {})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, lone_cluster.bootstrap_servers, topic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    frozen = False
    try:
        assert child.stdout is not None and child.stdin is not None
        seen = []  # structlog prints to stdout: its lines come before "ready"
        while (line := child.stdout.readline()) and line.strip() != "ready":
            seen.append(line)
        assert line.strip() == "ready", "".join(seen)[-3000:]
        assert broker_answers(lone_cluster.bootstrap_servers)  # the control's own control
        lone_cluster.freeze(1)
        frozen = True
        # negative control: the broker really is frozen, a new client gets no answer
        assert not broker_answers(lone_cluster.bootstrap_servers)
        child.stdin.write("frozen\n")
        child.stdin.flush()
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            pytest.fail(f"the child did not exit: a close() hung\n{out}\n{err[-3000:]}")
        # still frozen when the child ended: the bounds, not a thawed broker, let it go
        assert not broker_answers(lone_cluster.bootstrap_servers)
    finally:
        if frozen:
            lone_cluster.thaw(1)
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-3000:]
    closed = [ln for ln in out.splitlines() if ln.startswith("closed ")]
    assert closed, out + err[-3000:]
    timings = json.loads(closed[0][len("closed ") :])
    assert timings["consumer_stopped"] and timings["async_consumer_stopped"], timings
    assert "txn" in timings and "txn_error" not in timings, timings  # TransactionalProducer
    # every message produced while frozen is reported failed, none silently dropped
    assert timings["producer_failed"] == 5, timings
    assert timings["async_producer_failed"] == 5, timings
    assert "close_timed_out" in out + err, (out + err)[-3000:]
    print("close timings (s):", timings)
