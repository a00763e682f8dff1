"""ResilientShareConsumer vs the raw ShareConsumer on the same records (issue 43, acceptance 4).

One topic of ``--records`` records over ``--partitions`` partitions. Each arm is one share-group
member in a fresh share group (``share.auto.offset.reset=earliest``) reading every record,
timed from its first record to its last (group join excluded):

- ``raw``: ``confluent_kafka.ShareConsumer`` in explicit mode, ACCEPT each record, then
  ``commit_sync()`` per poll (what a careful hand-written loop does);
- ``resilient``: :class:`kresilient.share.ResilientShareConsumer` with the default retry,
  dead-letter and outage policies and a handler that does nothing.

``--handler-us N`` gives both arms the same handler: ``time.sleep(N µs)`` per record (a call to
a dependency; it releases the GIL as I/O does). A batch then runs long enough for
``ResilientShareConsumer`` to send acknowledgements during it (``commit_async`` every 50 ms),
which the no-op handler never triggers.

Rounds interleave the arms (raw, resilient, resilient, raw, ...) and the report gives the
paired ratio resilient/raw per round, its median and range, for the wall-clock rate and for
the process CPU time per record (every thread's, librdkafka's included: on a machine whose
other processes take the cores at random, the CPU ratio says what the wrapper costs where the
wall ratio mostly says who was scheduled). Figures taken while the load average exceeds the
core count are labelled CONTENDED.

    .venv/bin/python benchmarks/share.py                          # 20,000 records, 5 rounds
    .venv/bin/python benchmarks/share.py --records 5000 --rounds 3
    .venv/bin/python benchmarks/share.py --records 5000 --rounds 7 --handler-us 200

Starts a local 1-node cluster on the newest Kafka 4.x served unless
``KRESILIENT_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import contention
from confluent_kafka import AcknowledgeType, Message, Producer, ShareConsumer

from kresilient.share import ResilientShareConsumer, configure_share_group
from kresilient.testing import KafkaCluster

NEWEST = "4.4.0"


def _produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(topic, b"x" * 100, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0


def _group(bootstrap: str) -> str:
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    configure_share_group(
        {"bootstrap.servers": bootstrap}, group, {"share.auto.offset.reset": "earliest"}
    )
    return group


def _work(handler_us: float) -> None:
    if handler_us:
        time.sleep(handler_us / 1e6)


def _raw(bootstrap: str, topic: str, records: int, handler_us: float) -> tuple[float, float]:
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _group(bootstrap),
            "share.acknowledgement.mode": "explicit",
        }
    )
    consumer.subscribe([topic])
    seen = 0
    first = cpu = 0.0

    def handle(_msg: Message) -> None:  # the user's handler, called as the other arm calls it
        _work(handler_us)

    deadline = time.monotonic() + 300
    try:
        while seen < records and time.monotonic() < deadline:
            batch = consumer.poll(0.5)
            if not batch:
                continue
            if not first:
                first, cpu = time.perf_counter(), time.process_time()
            for msg in batch:
                if msg.error() is None:
                    handle(msg)
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                    seen += 1
            consumer.commit_sync(30)
        elapsed = time.perf_counter() - first
        cpu = time.process_time() - cpu
    finally:
        consumer.close()
    if seen < records:
        raise RuntimeError(f"raw arm read {seen} of {records} records")
    return seen / elapsed, cpu / seen


def _resilient(bootstrap: str, topic: str, records: int, handler_us: float) -> tuple[float, float]:
    seen = 0
    first = cpu = 0.0

    def handle(_msg: Message) -> None:
        nonlocal seen, first, cpu
        if not first:
            first, cpu = time.perf_counter(), time.process_time()
        _work(handler_us)
        seen += 1

    consumer = ResilientShareConsumer(
        {"bootstrap.servers": bootstrap, "group.id": _group(bootstrap)}, [topic], handle
    )
    deadline = time.monotonic() + 300
    try:
        while consumer.stats.accepted < records and time.monotonic() < deadline:
            consumer.poll_once(0.5)
        elapsed = time.perf_counter() - first
        cpu = time.process_time() - cpu
    finally:
        consumer.close()
    if consumer.stats.accepted < records:
        raise RuntimeError(f"resilient arm accepted {consumer.stats.accepted} of {records}")
    return records / elapsed, cpu / records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--handler-us", type=float, default=0.0, help="each record's handler sleeps this long"
    )
    args = parser.parse_args()
    external = os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
    cluster = None if external else KafkaCluster(1, version=NEWEST)
    try:
        if cluster is not None:
            cluster.start_cluster()
            bootstrap = cluster.bootstrap_servers
        else:
            bootstrap = str(external)
        topic = f"bench-share-{uuid.uuid4().hex[:6]}"
        if cluster is not None:
            cluster.create_topic(topic, args.partitions, replication_factor=1)
            cluster.create_topic(topic + ".dlq", 1, replication_factor=1)
        _produce(bootstrap, topic, args.records)
        load_before = os.getloadavg()[0]
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        rates: dict[str, list[float]] = {"raw": [], "resilient": []}
        for r in range(args.rounds):
            order = ("raw", "resilient") if r % 2 == 0 else ("resilient", "raw")
            got: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for arm in order:
                fn = _raw if arm == "raw" else _resilient
                got[arm], cpu[arm] = fn(bootstrap, topic, args.records, args.handler_us)
                rates[arm].append(got[arm])
            ratios.append(got["resilient"] / got["raw"])
            cpu_ratios.append(cpu["raw"] / cpu["resilient"])  # > 1: the wrapper costs less
            print(
                f"round {r + 1}: raw {got['raw']:,.0f}/s, resilient {got['resilient']:,.0f}/s, "
                f"ratio {ratios[-1]:.2f}; CPU per record raw {cpu['raw'] * 1e6:.1f} µs, "
                f"resilient {cpu['resilient'] * 1e6:.1f} µs, ratio {cpu_ratios[-1]:.2f}",
                flush=True,
            )
        load_after = os.getloadavg()[0]
        print(
            f"\n{args.records} records, {args.partitions} partitions, {args.rounds} paired "
            f"rounds, handler {args.handler_us:g} µs, "
            f"Kafka {NEWEST if cluster is not None else 'external'}\n"
            f"raw median {statistics.median(rates['raw']):,.0f}/s, resilient median "
            f"{statistics.median(rates['resilient']):,.0f}/s\n"
            f"resilient/raw: median {statistics.median(ratios):.2f} "
            f"[{min(ratios):.2f}-{max(ratios):.2f}]\n"
            f"CPU per record, raw/resilient: median {statistics.median(cpu_ratios):.2f} "
            f"[{min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}]\n"
            f"{contention(load_before, load_after)}"
        )
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
