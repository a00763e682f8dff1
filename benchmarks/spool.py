"""Spooled producer throughput, paired with the unspooled ResilientProducer in the same run.

Arms (each on a fresh topic per round, ``--partitions`` partitions, RF=3,
``min.insync.replicas=2``, and a fresh spool file in a temp directory):

- ``unspooled``: ``ResilientProducer`` without a spool (the baseline).
- ``group``: ``Spool(durability="group")`` (the default: fsync per group commit, 10 ms).
- ``os``: ``Spool(durability="os")`` (a commit per message, no fsync).
- ``fsync``: ``Spool(durability="fsync")`` (a commit and an fsync per message; run with
  fewer messages: ``--fsync-messages``).

The clock runs from the first ``produce`` to the return of ``flush()`` with every message
acknowledged (``FlushResult.complete``). Rounds are interleaved in shuffled order, one warm-up
round dropped; the headline is the paired per-round ratio to ``unspooled``. Values are
pre-built ``bytes`` with a 4-byte key, 100 B and 1 KiB.

    .venv/bin/python benchmarks/spool.py --messages 100000 --rounds 3

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` names one. The spool
directory is ``--dir`` (default: a temp dir; put it on the disk you mean to measure).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

# benchmarks/asyncio.py would shadow the standard library's asyncio (imported by structlog):
# this directory comes off sys.path until the third-party imports are done.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import structlog  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from kresilient.producer import ResilientProducer, Spool  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

sys.path.append(str(_HERE))
from _common import (  # noqa: E402
    Sample,
    Timer,
    contention,
    environment,
    markdown_table,
    run_interleaved,
)

ARMS = ("unspooled", "group", "os", "fsync")


def _topic(admin: AdminClient, partitions: int) -> str:
    name = f"bench-spool-{uuid.uuid4().hex[:8]}"
    fs = admin.create_topics([NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})])
    fs[name].result()
    return name


def _arm(
    name: str, bootstrap: str, admin: AdminClient, size: int, n: int, partitions: int, base: Path
) -> Callable[[int], Sample]:
    value = b"v" * size
    keys = [b"k%03d" % (i % 100) for i in range(100)]

    def run(round_no: int) -> Sample:
        topic = _topic(admin, partitions)
        spool = None
        if name != "unspooled":
            spool = Spool(base / f"{name}-{uuid.uuid4().hex[:8]}.db", durability=name)  # type: ignore[arg-type]
        producer = ResilientProducer({"bootstrap.servers": bootstrap}, spool=spool)
        producer.produce(topic, value)  # metadata first: not timed
        producer.flush(30)
        with Timer() as t:
            for i in range(n):
                producer.produce(topic, value, key=keys[i % 100])
            result = producer.flush(120)
        if spool is not None:
            assert result is not None and result.complete, result
        producer.close()
        admin.delete_topics([topic])
        return Sample(arm=name, round=round_no, messages=n, wall_s=t.wall_s, cpu_s=t.cpu_s)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--fsync-messages", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--sizes", default="100,1024")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    arms = [a for a in args.arms.split(",") if a]
    load_before = os.getloadavg()[0]
    cluster = None
    bootstrap = os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS")
    if not bootstrap:
        cluster = KafkaCluster()
        cluster.start_cluster()
        bootstrap = cluster.bootstrap_servers
    base = Path(args.dir or tempfile.mkdtemp(prefix="kresilient-spool-bench-"))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        print(f"environment: {environment(spool_dir=str(base))}\n")
        for size in (int(s) for s in args.sizes.split(",")):
            per_arm = {}
            for name in arms:
                if name == "fsync":
                    # Not comparable in rate terms at the same count: its own baseline pair.
                    continue
                per_arm[name] = _arm(
                    name, bootstrap, admin, size, args.messages, args.partitions, base
                )
            samples = run_interleaved(per_arm, rounds=args.rounds)
            print(
                markdown_table(
                    samples,
                    baseline="unspooled",
                    title=f"{size} B values, {args.messages} messages",
                )
            )
            if "fsync" in arms:
                pair = {
                    "unspooled": _arm(
                        "unspooled",
                        bootstrap,
                        admin,
                        size,
                        args.fsync_messages,
                        args.partitions,
                        base,
                    ),
                    "fsync": _arm(
                        "fsync", bootstrap, admin, size, args.fsync_messages, args.partitions, base
                    ),
                }
                samples = run_interleaved(pair, rounds=args.rounds)
                print(
                    markdown_table(
                        samples,
                        baseline="unspooled",
                        title=f"{size} B, {args.fsync_messages} messages (fsync per message)",
                    )
                )
        print(f"\ncontention: {contention(load_before, os.getloadavg()[0])}")
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main()
