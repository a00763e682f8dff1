"""Throughput of one partition with many records in flight (issue 40, acceptance 1).

One partition, ``--records`` records over ``--keys`` keys, a handler that sleeps
``--sleep-ms`` (an I/O-bound handler: an HTTP call, a database write). Arms:

- ``partition``: ``ResilientConsumer`` with its default ordering (one record of the partition
  at a time). At 10 ms a record it needs ~200 s for 20,000 records, so it is timed on the
  first ``--partition-records`` records only (its rate is flat: one handler call after the
  other);
- ``key-N``: ``ordering="key"``, ``max_in_flight=N`` for each N of ``--in-flight``;
- ``aio-partition``, ``aio-key-N`` (``--engines`` with ``asyncio``, the default): the same
  arms through ``AsyncResilientConsumer``, the handler awaiting ``asyncio.sleep`` (each
  record of ``"key"`` mode an asyncio task, no thread pool);
- ``pyrallel-N`` (with ``--pyrallel-python``): the same workload through the peer
  ``pyrallel-consumer`` (``key_hash`` ordering, N in flight, its asyncio engine, the handler's
  sleep awaited), run by ``benchmarks/_pyrallel_arm.py`` under the interpreter given (a
  virtualenv with ``pip install pyrallel-consumer``; it asks for Python 3.12, and installs and
  runs on 3.11 with ``pip install --ignore-requires-python``).

Each arm uses a fresh group, reads the same topic from the beginning, and is timed from its
first handled record to its last (group join excluded). An arm with one record in flight
(``partition``, ``key-1``) is timed on the first ``--partition-records`` records: its rate is
one handler call after the other. The report gives records/s and the ratio to the
``partition`` arm of the same engine, per round (paired: the spread is over the rounds' ratios)
and of the medians (the ideal at N in flight is N, less what the
keys' collisions cost: with 1,000 keys and 64 in flight a record often waits behind one of
its own key). Rounds interleave the arms. Figures taken while the load average exceeds the
core count are labelled CONTENDED.

    .venv/bin/python benchmarks/keyed.py                                  # the issue's size
    .venv/bin/python benchmarks/keyed.py --records 4000 --rounds 1        # quick
    .venv/bin/python benchmarks/keyed.py --pyrallel-python /path/to/venv/bin/python

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import contention
from confluent_kafka import Message, Producer

from kresilient import ResilientConsumer
from kresilient.aio import AsyncResilientConsumer
from kresilient.testing import KafkaCluster


def _produce(bootstrap: str, topic: str, records: int, keys: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, b"x" * 100, key=b"key-%d" % (i % keys), partition=0)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def _run(bootstrap: str, topic: str, records: int, sleep_s: float, **options: Any) -> float:
    """Records/s of one consumer over the first ``records`` records."""
    lock = threading.Lock()
    count = 0
    first = last = 0.0
    consumer: ResilientConsumer

    def handle(_msg: Message) -> None:
        nonlocal count, first, last
        time.sleep(sleep_s)
        with lock:
            count += 1
            now = time.perf_counter()
            if count == 1:
                first = now
            if count == records:
                last = now
                consumer.stop()

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-keyed-{uuid.uuid4().hex[:8]}"},
        [topic],
        handle,
        install_signal_handlers=False,
        **options,
    )
    cpu = time.process_time()
    consumer.run()
    cpu = time.process_time() - cpu
    print(f"  cpu {cpu / records * 1e6:,.0f} us/record (process, join included)", flush=True)
    return (records - 1) / (last - first)


def _run_aio(bootstrap: str, topic: str, records: int, sleep_s: float, **options: Any) -> float:
    """Records/s of one ``AsyncResilientConsumer`` over the first ``records`` records."""
    count = 0
    first = last = 0.0

    async def consume() -> None:
        consumer: AsyncResilientConsumer

        async def handle(_msg: Message) -> None:
            nonlocal count, first, last
            await asyncio.sleep(sleep_s)
            count += 1
            now = time.perf_counter()
            if count == 1:
                first = now
            if count == records:
                last = now
                consumer.stop()

        consumer = AsyncResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": f"bench-keyed-{uuid.uuid4().hex[:8]}"},
            [topic],
            handle,
            handle_signals=False,
            **options,
        )
        await consumer.run()

    cpu = time.process_time()
    asyncio.run(consume())
    cpu = time.process_time() - cpu
    print(f"  cpu {cpu / records * 1e6:,.0f} us/record (process, join included)", flush=True)
    return (records - 1) / (last - first)


def _run_pyrallel(
    python: str, bootstrap: str, topic: str, records: int, in_flight: int, sleep_ms: float
) -> float:
    """Records/s of the peer ``pyrallel-consumer`` on the same workload (its own process)."""
    arm = str(Path(__file__).resolve().parent / "_pyrallel_arm.py")
    out = subprocess.run(
        [python, arm, bootstrap, topic, str(records), str(in_flight), str(sleep_ms)],
        check=True,
        capture_output=True,
        text=True,
        timeout=max(900.0, records * sleep_ms / 1000 * 2),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  cpu {result['cpu_us']:,.0f} us/record (process, join included)", flush=True)
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--sleep-ms", type=float, default=10.0)
    parser.add_argument("--in-flight", default="1,8,32,64,256")
    parser.add_argument("--partition-records", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--engines", default="sync,asyncio", help="sync (ResilientConsumer), asyncio, or both"
    )
    parser.add_argument(
        "--pyrallel-python",
        help="an interpreter with pyrallel-consumer installed: adds its arms (pyrallel-N)",
    )
    args = parser.parse_args()
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    sleep_s = args.sleep_ms / 1000
    windows = [int(n) for n in args.in_flight.split(",")]
    load_before = os.getloadavg()[0]
    rates: dict[str, list[float]] = {}
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        bootstrap = cluster.bootstrap_servers
        topic = f"bench-keyed-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 1, 3, {"min.insync.replicas": 2})
        cluster.create_topic(topic + ".dlq", 1, 3, {"min.insync.replicas": 2})
        _produce(bootstrap, topic, args.records, args.keys)
        engines = args.engines.split(",")
        slow = min(args.partition_records, args.records)  # one in flight: a flat rate
        for rnd in range(args.rounds):
            arms: list[tuple[str, int, dict[str, Any]]] = []
            if "sync" in engines:
                arms.append(("partition", slow, {}))
                arms += [
                    (
                        f"key-{n}",
                        slow if n == 1 else args.records,
                        {
                            "ordering": "key",
                            "max_in_flight": n,
                            "max_process_deaths": None,
                        },
                    )
                    for n in windows
                ]
            if "asyncio" in engines:
                arms.append(("aio-partition", slow, {"aio": True}))
                arms += [
                    (
                        f"aio-key-{n}",
                        slow if n == 1 else args.records,
                        {"aio": True, "ordering": "key", "max_in_flight": n},
                    )
                    for n in windows
                ]
            if args.pyrallel_python:
                arms += [(f"pyrallel-{n}", args.records, {"pyrallel": n}) for n in windows]
            if rnd % 2:
                arms.reverse()
            for name, records, options in arms:
                if "pyrallel" in options:
                    rate = _run_pyrallel(
                        args.pyrallel_python,
                        bootstrap,
                        topic,
                        records,
                        options["pyrallel"],
                        args.sleep_ms,
                    )
                elif options.pop("aio", False):
                    rate = _run_aio(bootstrap, topic, records, sleep_s, **options)
                    options["aio"] = True  # the same dict again next round
                else:
                    rate = _run(bootstrap, topic, records, sleep_s, **options)
                rates.setdefault(name, []).append(rate)
                print(f"round {rnd} {name}: {rate:,.0f} records/s", flush=True)
    load_after = os.getloadavg()[0]
    print()
    print(
        f"{args.records:,} records over {args.keys:,} keys, one partition, handler sleeps "
        f"{args.sleep_ms:g} ms; partition mode timed on "
        f"{min(args.partition_records, args.records):,} records; {args.rounds} round(s); "
        f"{contention(load_before, load_after)}"
    )
    print(
        "| arm | records/s (median) | x partition (medians) | x partition per round: median "
        "[min-max] |"
    )
    print("|---|---:|---:|---:|")
    for name, values in rates.items():
        base_name = "aio-partition" if name.startswith("aio-") else "partition"
        bases = rates.get(base_name)
        rate = statistics.median(values)
        if not bases:
            print(f"| {name} | {rate:,.0f} | - | - |")
            continue
        paired = [v / b for v, b in zip(values, bases, strict=False)]
        print(
            f"| {name} | {rate:,.0f} | {rate / statistics.median(bases):.1f} | "
            f"{statistics.median(paired):.1f} [{min(paired):.1f}-{max(paired):.1f}] |"
        )


if __name__ == "__main__":
    main()
