"""Consumption rate: raw confluent-kafka (same at-least-once pattern) vs ResilientConsumer.

Both arms consume the same pre-produced topic (``--messages`` messages of 100 B over
``--partitions`` partitions, RF=3) from the beginning with a fresh group, a trivial handler that
counts, and the same commit rule:

- ``raw``: ``confluent_kafka.Consumer`` with ``enable.auto.offset.store=false``, cooperative-
  sticky, ``consume(500, 1.0)`` batches, the handler per message, then ``store_offsets`` of each
  partition's last message per batch (auto-commit of stored offsets): the cheapest correct
  at-least-once loop we know how to write by hand.
- ``kresilient``: ``ResilientConsumer(config, [topic], handler)`` with its defaults (retry
  policy, dead-letter topic, circuit breaker, telemetry API without an SDK).

Rounds are interleaved (order shuffled inside each round, one warm-up round discarded). Each
arm's rate is messages / seconds from its first to its last handled message (group join
excluded). Reported: per-arm median rate and IQR, and the paired per-round ratio
kresilient/raw: median and IQR (not a ratio of medians). The load average is printed before
and after; figures taken while it exceeds the core count are labelled CONTENDED.

    .venv/bin/python benchmarks/consumer.py                      # 1M messages, 7 rounds
    .venv/bin/python benchmarks/consumer.py --messages 100000 --rounds 3   # quick

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka as ck
from confluent_kafka import Consumer, Producer

from kresilient import __version__
from kresilient.consumer import ResilientConsumer
from kresilient.testing import KafkaCluster

VALUE = b"x" * 100


def _produce(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000, "acks": "all"}
    )
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
        if not i & 0x3FFF:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("messages still queued after 120 s")


Result = tuple[float, float]  # (msg/s wall, CPU µs per message of the whole process)


def _raw(bootstrap: str, topic: str, n: int) -> Result:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    consumer.subscribe([topic])
    count = 0
    first = cpu0 = 0.0

    def handler(_msg: Any) -> None:
        nonlocal count
        count += 1

    store = consumer.store_offsets
    try:
        while count < n:
            msgs = consumer.consume(500, 1.0)
            if not msgs:
                continue
            if not first:
                first, cpu0 = time.perf_counter(), time.process_time()
            for msg in msgs:
                if msg.error() is None:
                    handler(msg)
            last = {(m.topic(), m.partition()): m for m in msgs if m.error() is None}
            for m in last.values():
                store(message=m)
        wall, cpu = time.perf_counter() - first, time.process_time() - cpu0
        return n / wall, cpu / n * 1e6
    finally:
        consumer.close()


def _kresilient(bootstrap: str, topic: str, n: int) -> Result:
    count = 0
    first = last = cpu0 = cpu1 = 0.0
    consumer: ResilientConsumer

    def handler(_msg: Any) -> None:
        nonlocal count, first, last, cpu0, cpu1
        count += 1
        if count == 1:
            first, cpu0 = time.perf_counter(), time.process_time()
        elif count == n:
            last, cpu1 = time.perf_counter(), time.process_time()
            consumer.stop()

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-kr-{uuid.uuid4().hex[:8]}"},
        [topic],
        handler,
        install_signal_handlers=False,
    )
    consumer.run()
    return (n - 1) / (last - first), (cpu1 - cpu0) / (n - 1) * 1e6


ARMS: dict[str, Callable[[str, str, int], Result]] = {"raw": _raw, "kresilient": _kresilient}


def _ck_version() -> str:
    v: Any = ck.version()
    return v if isinstance(v, str) else str(v[0])


def _iqr(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="also print the raw figures")
    args = parser.parse_args()

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings+
    cores = os.cpu_count() or 1
    load_before = os.getloadavg()
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        topic = f"bench-consumer-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
        cluster.create_topic(topic + ".dlq", args.partitions, 3, {"min.insync.replicas": 2})
        t0 = time.monotonic()
        _produce(cluster.bootstrap_servers, topic, args.messages)
        print(f"produced {args.messages} x 100 B in {time.monotonic() - t0:.1f} s", flush=True)
        rates: dict[str, list[float]] = {name: [] for name in ARMS}
        cpus: dict[str, list[float]] = {name: [] for name in ARMS}
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        for rnd in range(args.rounds + 1):
            order = list(ARMS)
            random.shuffle(order)
            got = {
                name: ARMS[name](cluster.bootstrap_servers, topic, args.messages) for name in order
            }
            ratio = got["kresilient"][0] / got["raw"][0]
            tag = "warm-up" if rnd == 0 else f"round {rnd}"
            print(
                f"{tag}: "
                + ", ".join(
                    f"{k} {v[0]:,.0f} msg/s ({v[1]:.2f} CPU µs/msg)" for k, v in got.items()
                )
                + f"  ratio {ratio:.3f}  load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            if rnd == 0:
                continue
            for name, (rate, cpu) in got.items():
                rates[name].append(rate)
                cpus[name].append(cpu)
            ratios.append(ratio)
            cpu_ratios.append(got["raw"][1] / got["kresilient"][1])
    load_after = os.getloadavg()
    contended = max(load_before[0], load_after[0]) > cores
    label = (
        f"CONTENDED (load {load_before[0]:.1f}->{load_after[0]:.1f} on {cores} cores)"
        if (contended)
        else f"load {load_before[0]:.1f}->{load_after[0]:.1f} on {cores} cores"
    )
    print()
    print(
        f"consumer benchmark: {args.messages:,} x 100 B, {args.partitions} partitions, "
        f"{args.rounds} rounds, kresilient {__version__}, confluent-kafka {_ck_version()}, "
        f"librdkafka {ck.libversion()[0]}, Python {platform.python_version()}; {label}"
    )
    print("| arm | median msg/s | IQR | median CPU µs/msg (process) |")
    print("|---|---:|---|---:|")
    for name, values in rates.items():
        lo, hi = _iqr(values)
        print(
            f"| {name} | {statistics.median(values):,.0f} | {lo:,.0f} - {hi:,.0f} "
            f"| {statistics.median(cpus[name]):.2f} |"
        )
    lo, hi = _iqr(ratios)
    clo, chi = _iqr(cpu_ratios)
    verdict = "meets" if statistics.median(ratios) >= 0.90 else "MISSES"
    print(
        f"| paired ratio kresilient/raw (throughput) | {statistics.median(ratios):.3f} "
        f"| {lo:.3f} - {hi:.3f} | |\n"
        f"| paired ratio raw/kresilient (CPU per message) | {statistics.median(cpu_ratios):.3f} "
        f"| {clo:.3f} - {chi:.3f} | |\n\ntarget >= 0.90x (throughput): {verdict}"
    )
    if args.json:
        json.dump(
            {
                "rates": rates,
                "cpu_us": cpus,
                "ratios": ratios,
                "cpu_ratios": cpu_ratios,
                "contended": contended,
            },
            sys.stdout,
        )
        print()


if __name__ == "__main__":
    main()
