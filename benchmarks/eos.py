"""Exactly-once consume-transform-produce: kresilient against quix-streams (issue 41,
acceptance 4), and against kresilient's own at-least-once.

The pipeline: read integers from a topic of ``--partitions`` partitions, write each one
doubled, with the input's key, to a fresh output topic. Arms, each a child process
(``benchmarks/_eos_arm.py``) reading the same input from the beginning in a fresh group:

- ``kresilient-eos``: ``ResilientConsumer(..., transactions=TransactionPolicy(
  max_interval_s=--interval, max_records=--every))``, the handler returning an ``Output``;
- ``kresilient-alo``: the same consumer without ``transactions=`` (at-least-once: the outputs
  are flushed before the offsets commit);
- ``quix-eos`` (with ``--quix-python``): quix-streams ``Application(processing_guarantee=
  "exactly-once", commit_interval=--interval, commit_every=--every)``, ``sdf.apply`` doubling,
  ``to_topic``; run under the interpreter given, a virtualenv holding quixstreams (it pins
  ``confluent-kafka<2.13``, so it cannot share kresilient's development venv):

      python3 -m venv <quix venv> && <quix venv>/bin/pip install quixstreams==3.28.1

The same commit interval and size for both exactly-once arms: a transaction (a quix
checkpoint) commits after ``--interval`` seconds or ``--every`` records, whichever first.

Each arm times itself from its first record to the return of its run loop (the final commit
and the close included; interpreter start, imports and the group join excluded) and reports
its process CPU over the same span (librdkafka's threads included). After each run the group's
committed offsets must be the end of every input partition (the run is discarded otherwise).
Rounds are interleaved with the arm order shuffled, one warm-up round discarded
(``benchmarks/_common.py``); the headline figures are paired per-round ratios, median and IQR.

    .venv/bin/python benchmarks/eos.py --quix-python <quix venv>/bin/python
    .venv/bin/python benchmarks/eos.py --records 20000 --rounds 3 --interval 1.0

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Sample,
    contention,
    environment,
    markdown_table,
    median_iqr,
    paired_ratios,
    run_interleaved,
)
from confluent_kafka import Consumer, Producer, TopicPartition

from kresilient import TransactionPolicy
from kresilient.testing import KafkaCluster

ARM_SCRIPT = str(Path(__file__).resolve().parent / "_eos_arm.py")
# confluent_kafka.version() is a str in 2.16, a (str, int) tuple in older releases
_VERSIONS = (
    "import confluent_kafka as c; v = c.version(); "
    "print(v[0] if isinstance(v, tuple) else v, c.libversion()[0])"
)


def _produce(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        while True:
            try:
                producer.produce(
                    topic, b"%d" % i, key=b"k%d" % (i % 1000), partition=i % partitions
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    """The group's committed offsets, summed (read by a consumer that never joins)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        return sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=30))
    finally:
        consumer.close()


def _outputs(bootstrap: str, topic: str, partitions: int) -> int:
    """Records of ``topic`` a ``read_committed`` reader sees (up to the last stable offsets)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-eos-check-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        parts = [TopicPartition(topic, p, 0) for p in range(partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
        consumer.assign(parts)
        count = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            count += sum(m.error() is None for m in consumer.consume(10000, 0.5))
            positions = consumer.position([TopicPartition(topic, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] or not ends[tp.partition] for tp in positions):
                return count
        raise RuntimeError(f"reading {topic} back timed out at {count} records")
    finally:
        consumer.close()


def _cpu_ratios(samples: list[Sample], arm: str, baseline: str) -> list[float]:
    """arm CPU per record / baseline CPU per record, for every round where both ran."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s
    return [
        r[arm].cpu_us_per_msg / r[baseline].cpu_us_per_msg
        for _, r in sorted(by_round.items())
        if arm in r and baseline in r
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    policy = TransactionPolicy(transactional_id="defaults")
    parser.add_argument(
        "--interval",
        type=float,
        default=policy.max_interval_s,
        help="seconds a transaction stays open at most (default: TransactionPolicy's)",
    )
    parser.add_argument(
        "--every",
        type=int,
        default=policy.max_records,
        help="records per transaction at most (default: TransactionPolicy's)",
    )
    parser.add_argument("--quix-python", help="an interpreter with quixstreams: the quix-eos arm")
    parser.add_argument(
        "--kresilient-python",
        default=sys.executable,
        help="the interpreter of the kresilient arms (default: this one)",
    )
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()

    arm_python = {
        "kresilient-eos": args.kresilient_python,
        "kresilient-alo": args.kresilient_python,
    }
    if args.quix_python:
        arm_python["quix-eos"] = args.quix_python
    versions = {
        name: subprocess.run(
            [python, "-c", _VERSIONS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for name, python in arm_python.items()
    }
    load_before = os.getloadavg()[0]
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    loads: list[float] = []
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        bootstrap = cluster.bootstrap_servers
        run = uuid.uuid4().hex[:6]
        source = cluster.create_topic(f"bench-eos-{run}", args.partitions, 3)
        cluster.create_topic(source + ".dlq", 1, 3)  # the consumer's dead-letter topic
        _produce(bootstrap, source, args.records, args.partitions)

        def arm(name: str) -> Callable[[int], Sample]:
            def one(rnd: int) -> Sample:
                target = cluster.create_topic(
                    f"bench-eos-out-{name}-{uuid.uuid4().hex[:6]}", args.partitions, 3
                )
                group = f"bench-eos-{name}-{uuid.uuid4().hex[:8]}"
                loads.append(os.getloadavg()[0])
                done = subprocess.run(
                    [
                        arm_python[name],
                        ARM_SCRIPT,
                        name,
                        bootstrap,
                        source,
                        target,
                        group,
                        str(args.records),
                        str(args.interval),
                        str(args.every),
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=900,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                committed = _committed(bootstrap, group, source, args.partitions)
                outputs = _outputs(bootstrap, target, args.partitions)
                exact = name.endswith("-eos")  # at-least-once may duplicate, never lose
                if committed != args.records or not (
                    outputs == args.records if exact else outputs >= args.records
                ):
                    raise RuntimeError(
                        f"{name}: {committed} of {args.records} inputs committed, "
                        f"{outputs} outputs visible"
                    )
                sample = Sample(
                    arm=name,
                    round=rnd,
                    messages=int(result["records"]),
                    wall_s=float(result["wall_s"]),
                    cpu_s=float(result["cpu_s"]),
                )
                print(
                    f"round {rnd} {name}: {sample.rate:,.0f} records/s, "
                    f"{sample.cpu_us_per_msg:,.1f} us CPU/record",
                    flush=True,
                )
                cluster.delete_topic(target)
                return sample

            return one

        samples = run_interleaved(
            {name: arm(name) for name in arm_python},
            rounds=args.rounds,
            seed=args.seed,
        )
    load_after = os.getloadavg()[0]
    print()
    print(
        f"{args.records:,} records over {args.partitions} partitions, a transaction every "
        f"{args.interval:g} s or {args.every:,} records, {args.rounds} rounds + 1 warm-up; "
        f"{contention(load_before, load_after)}; 1-min load at the arms' starts "
        f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
    )
    print(f"environment: {environment()}; arms' confluent-kafka/librdkafka: {versions}")
    baseline = "quix-eos" if "quix-eos" in arm_python else "kresilient-alo"
    print(markdown_table(samples, baseline=baseline, title="throughput and CPU"))
    print()
    print("| paired ratio | throughput median [IQR] | CPU per record median [IQR] |")
    print("|---|---:|---:|")
    pairs = [("kresilient-eos", "kresilient-alo")]
    if "quix-eos" in arm_python:
        pairs.insert(0, ("kresilient-eos", "quix-eos"))
    for a, b in pairs:
        rate = median_iqr(paired_ratios(samples, a, b))
        cpu = median_iqr(_cpu_ratios(samples, a, b))
        print(
            f"| {a} / {b} | {rate[0]:.3f} [{rate[1]:.3f}-{rate[2]:.3f}] | "
            f"{cpu[0]:.3f} [{cpu[1]:.3f}-{cpu[2]:.3f}] |"
        )
    print(f"(started {began}, ended {time.strftime('%H:%M UTC', time.gmtime())})")


if __name__ == "__main__":
    main()
