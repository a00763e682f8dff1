"""asyncio throughput: kresilient.aio against confluent-kafka's own AIOProducer / AIOConsumer.

Producer arms (a fresh topic per arm and round: ``--partitions`` partitions, RF=3,
``min.insync.replicas=2``); the clock runs from the first produce until EVERY message's
delivery was awaited without error:

- ``raw_aio``: ``confluent_kafka.aio.AIOProducer`` with the configuration ResilientProducer
  applies (acks=all, idempotence, ...), ``await produce()`` per message (its futures kept),
  ``await flush()``, then every future awaited;
- ``kresilient_aio``: :class:`kresilient.aio.AsyncResilientProducer`, ``await produce()`` per
  message (handles kept), ``await flush()``, then every handle awaited;
- ``sync``: :class:`kresilient.ResilientProducer` ``produce()`` + ``flush()`` (reported, not
  a target).

Consumer arms (the same pre-filled topic, a fresh group per arm and round); the clock runs
until every record was handled (a no-op ``async def``) and its offset stored after handling:

- ``raw_aio_consumer``: ``AIOConsumer`` with ``enable.auto.offset.store=false``:
  ``await consume(500)``, ``await handler(msg)`` per record, then ``await store_offsets()`` of
  the batch (commit after processing, background auto-commit), ``close()`` (commit, leave);
- ``kresilient_aio_consumer``: :class:`kresilient.aio.AsyncResilientConsumer` (default
  ``max_concurrency=1``), ``stop()`` after the last record: shutdown commits and leaves;
- ``kresilient_aio_consumer_untimed``: the same with ``blocking_warning_s=None`` (no per-step
  timing of the handler).

Rounds are interleaved with a shuffled arm order, one warm-up round discarded; the headline is
the paired per-round ratio to the raw arm (median and IQR), see benchmarks/_common.py.

    .venv/bin/python benchmarks/async_clients.py --messages 50000 --rounds 3    # quick look
    .venv/bin/python benchmarks/async_clients.py                                # 200k x 10 rounds
    .venv/bin/python benchmarks/async_clients.py --cpu-path     # consumer per-record CPU, no Kafka

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` names one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import structlog
from _common import (
    Sample,
    Timer,
    contention,
    environment,
    markdown_table,
    run_interleaved,
)
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.aio import AIOConsumer, AIOProducer

from kresilient.aio import AsyncResilientConsumer, AsyncResilientProducer
from kresilient.config import consumer_config, producer_config
from kresilient.producer import ResilientProducer

PRODUCER_ARMS = ("raw_aio", "kresilient_aio", "sync")
CONSUMER_ARMS = ("raw_aio_consumer", "kresilient_aio_consumer", "kresilient_aio_consumer_untimed")


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))


async def _raw_producer(bootstrap: str, topic: str, value: bytes, n: int) -> Timer:
    config = producer_config({"bootstrap.servers": bootstrap})
    producer = AIOProducer(config)
    with Timer() as t:
        futures = [await producer.produce(topic, value) for _ in range(n)]
        await producer.flush()
        for f in futures:
            await f  # raises on a failed delivery
    await producer.close()
    return t


async def _kresilient_producer(bootstrap: str, topic: str, value: bytes, n: int) -> Timer:
    producer = AsyncResilientProducer({"bootstrap.servers": bootstrap})
    with Timer() as t:
        handles = [await producer.produce(topic, value) for _ in range(n)]
        await producer.flush()
        for h in handles:
            await h
    await producer.close()
    return t


def _sync_producer(bootstrap: str, topic: str, value: bytes, n: int) -> Timer:
    producer = ResilientProducer({"bootstrap.servers": bootstrap})
    with Timer() as t:
        for _ in range(n):
            producer.produce(topic, value)
        producer.flush()
    producer.close()
    return t


async def _noop(_msg: Any) -> None:
    return None


async def _raw_consumer(bootstrap: str, topic: str, n: int) -> Timer:
    config = consumer_config({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    seen = 0
    with Timer() as t:  # from creation to close, as the kresilient arm's run()
        consumer = AIOConsumer(config)
        await consumer.subscribe([topic])
        while seen < n:
            batch = await consumer.consume(500, 0.5)
            last: dict[tuple[str, int], Any] = {}
            for msg in batch:
                if msg.error() is not None:
                    continue
                await _noop(msg)
                last[(msg.topic(), msg.partition())] = msg
                seen += 1
            if last:
                await consumer.store_offsets(
                    offsets=[
                        _tp(topic_, part, m.offset() + 1) for (topic_, part), m in last.items()
                    ]
                )
        await consumer.close()  # commit and leave the group, as the kresilient arm does
    return t


def _tp(topic: str, partition: int, offset: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition, offset)


async def _kresilient_consumer(
    bootstrap: str, topic: str, n: int, blocking_warning_s: float | None = 0.5
) -> Timer:
    seen = 0
    consumer: AsyncResilientConsumer

    async def handle(_msg: Any) -> None:
        nonlocal seen
        seen += 1
        if seen >= n:
            consumer.stop()

    consumer = AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex},
        [topic],
        handle,
        dead_letter=None,
        handle_signals=False,
        blocking_warning_s=blocking_warning_s,
    )
    with Timer() as t:
        await consumer.run()
    return t


def _cpu_path() -> None:
    """Main-thread CPU per record of the consumer's dispatch + handler path, no Kafka.

    400 batches of 500 records over 3 partitions go through ``_dispatch`` and the partition
    workers (private: this measures kresilient's own per-record overhead), against the raw
    arm's loop body over the same batches; ``thread_time``, best of 5.
    """
    from confluent_kafka import Message, TopicPartition

    from kresilient.aio._consumer import _Partition

    batches = [
        [
            Message(topic="t", partition=p, offset=b * 500 + i, value=b"x" * 100)
            for p in range(3)
            for i in range(167 if p < 2 else 166)
        ]
        for b in range(400)
    ]
    n = sum(map(len, batches))

    async def raw() -> None:
        for batch in batches:
            last: dict[tuple[str, int], Any] = {}
            for msg in batch:
                if msg.error() is not None:
                    continue
                await _noop(msg)
                last[(msg.topic(), msg.partition())] = msg  # type: ignore[index]
            [TopicPartition(t, p, m.offset() + 1) for (t, p), m in last.items()]

    async def kresilient(timing: bool) -> None:
        c = AsyncResilientConsumer(
            {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
            ["t"],
            _noop,
            dead_letter=None,
            handle_signals=False,
            blocking_warning_s=0.5 if timing else None,
        )
        c._loop = asyncio.get_running_loop()
        c._sem = asyncio.Semaphore(1)
        c._running = True
        for p in range(3):
            c._parts[("t", p)] = _Partition(("t", p))
        for batch in batches:
            c._dispatch(batch)
            while c._queued:
                await c._drained.wait()
            c._pending_ops()
        assert c.processed == n

    def best(run: Callable[[], Any]) -> float:
        times = []
        for _ in range(5):
            t0 = time.thread_time()
            asyncio.run(run())
            times.append(time.thread_time() - t0)
        return min(times) / n * 1e6

    print(f"raw loop body                     {best(raw):.3f} µs/record (main thread)")
    print(f"kresilient, blocking warning on   {best(lambda: kresilient(True)):.3f} µs/record")
    print(f"kresilient, blocking warning off  {best(lambda: kresilient(False)):.3f} µs/record")


def _fill(bootstrap: str, topic: str, value: bytes, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="per arm and round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024]
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--arms", type=lambda s: s.split(","), default=list(PRODUCER_ARMS + CONSUMER_ARMS)
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--cpu-path",
        action="store_true",
        help="only the consumer's per-record main-thread CPU, no Kafka (_cpu_path)",
    )
    args = parser.parse_args()
    _quiet()
    if args.cpu_path:
        _cpu_path()
        return
    load_before = os.getloadavg()[0]
    cluster = None
    bootstrap = os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
    if not bootstrap:
        from kresilient.testing import KafkaCluster

        cluster = KafkaCluster()
        cluster.start_cluster()
        bootstrap = cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def create(topic: str) -> None:
        futures = admin.create_topics(
            [NewTopic(topic, args.partitions, 3, config={"min.insync.replicas": "2"})]
        )
        for f in futures.values():
            f.result()

    def delete(topic: str) -> None:
        for f in admin.delete_topics([topic]).values():
            f.result()

    results: dict[tuple[str, int], list[Sample]] = {}
    try:
        for size in args.sizes:
            value = os.urandom(size)
            source = f"bench-aio-source-{size}-{uuid.uuid4().hex[:6]}"
            if any(a in CONSUMER_ARMS for a in args.arms):
                create(source)
                _fill(bootstrap, source, value, args.messages)

            def arm(
                name: str, size: int = size, value: bytes = value, source: str = source
            ) -> Callable[[int], Sample]:
                def run(round_no: int) -> Sample:
                    n = args.messages if round_no >= 0 else min(args.messages, 20_000)
                    gc.collect()
                    if name in CONSUMER_ARMS:
                        if name == "raw_aio_consumer":
                            t = asyncio.run(_raw_consumer(bootstrap, source, n))
                        else:
                            timed = name == "kresilient_aio_consumer"
                            t = asyncio.run(
                                _kresilient_consumer(bootstrap, source, n, 0.5 if timed else None)
                            )
                    else:
                        topic = f"bench-aio-{name}-{size}-{round_no}-{uuid.uuid4().hex[:6]}"
                        create(topic)
                        try:
                            if name == "sync":
                                t = _sync_producer(bootstrap, topic, value, n)
                            elif name == "raw_aio":
                                t = asyncio.run(_raw_producer(bootstrap, topic, value, n))
                            else:
                                t = asyncio.run(_kresilient_producer(bootstrap, topic, value, n))
                        finally:
                            delete(topic)
                    sample = Sample(
                        arm=name,
                        round=round_no,
                        messages=n,
                        wall_s=t.wall_s,
                        cpu_s=t.cpu_s,
                        extra={"gc_s": t.gc_s},
                    )
                    tag = "warm-up" if round_no < 0 else f"round {round_no}"
                    print(
                        f"  {size} B {tag:8s} {name:24s} {sample.rate:10,.0f} msg/s "
                        f"{sample.cpu_us_per_msg:6.2f} CPU µs/msg",
                        file=sys.stderr,
                        flush=True,
                    )
                    return sample

                return run

            producer_arms = {a: arm(a) for a in args.arms if a in PRODUCER_ARMS}
            consumer_arms = {a: arm(a) for a in args.arms if a in CONSUMER_ARMS}
            if producer_arms:
                results[("producer", size)] = run_interleaved(
                    producer_arms, rounds=args.rounds, seed=args.seed
                )
            if consumer_arms:
                results[("consumer", size)] = run_interleaved(
                    consumer_arms, rounds=args.rounds, seed=args.seed
                )
                delete(source)
    finally:
        if cluster is not None:
            cluster.close()
    label = contention(load_before, os.getloadavg()[0])
    print(f"## asyncio throughput, RF=3, acks=all ({label})\n")
    print(
        f"{args.messages:,} messages per arm and round, {args.rounds} rounds (+1 warm-up), "
        f"{args.partitions} partitions.\n"
    )
    for (kind, size), samples in results.items():
        baseline = "raw_aio" if kind == "producer" else "raw_aio_consumer"
        print(markdown_table(samples, baseline=baseline, title=f"{kind}, {size} B values"))
        print()
    print("Environment: " + ", ".join(f"{k}={v}" for k, v in environment().items()))


if __name__ == "__main__":
    main()
