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
- ``kresilient_sub`` / ``kresilient_old``: the ``kresilient`` arm in a fresh child interpreter
  importing kresilient from this tree / from the tree given by ``--old-tree`` (first on
  ``PYTHONPATH``; e.g. a checkout of 9c6e9f3, the flat layout): the layout-regression check,
  paired and interleaved in the same run. The child uses only ``ResilientConsumer(config,
  topics, handler, install_signal_handlers=False)``, ``run()`` and ``stop()`` (in both trees);
  every other knob is left at each tree's default, so each tree's default consumer is
  compared. It times itself exactly like the in-process arm (interpreter start, imports and
  group join excluded) with its own process CPU. With both arms the report adds the paired
  per-round ratio kresilient_sub/kresilient_old (>= 0.98: no regression)::

    .venv/bin/python -P benchmarks/consumer.py --arms raw,kresilient_sub,kresilient_old \
        --old-tree OLD_TREE --messages 1000000 --rounds 9 --fetch-queue-backoff-ms 10 \
        --start restart

``--start`` (every arm): ``new-group`` (default) gives each sample a never-committed group;
the crash-loop guard (issue 17, newer than the flat layout) then commits each partition once,
synchronously, before its first record: 3 commits inside the timed window of a 1M-message
round, a start-up cost a service pays once in its group's life. ``restart`` pre-commits each
sample's group at offset 0 with the clean-end marker, as a cleanly stopped consumer leaves it:
the steady state, and the layout comparison (the old tree has no guard to pay for).

``--fetch-queue-backoff-ms`` (every arm): with librdkafka's default (1000 ms), the fetcher
stops for a second whenever a partition's local queue holds ``queued.min.messages``
(100,000): a consumer faster than the brokers' fetch then waits out whole seconds, and the
wall rate moves in steps of one backoff (~140k/160k/180k msg/s here for 1M messages over 3
partitions, ~7 µs/msg) that hide the client's own cost. 10 ms makes the wall rate follow
the consumer (~0.65 µs/msg); CPU per message is unaffected either way.

Each sample is timed from the arm's first handled message to its last (group join excluded);
CPU is the whole process (librdkafka's threads included); the consuming thread's own CPU
time is recorded too (the layout check reports its ratio: on a loaded machine it is the
steadiest figure of the Python-side cost). Rounds are interleaved with the arm
order shuffled (benchmarks/_common.py); the headline is the paired per-round ratio
kresilient/raw, median and IQR. Figures taken while the load average exceeds the core count
are labelled CONTENDED.

    .venv/bin/python benchmarks/consumer.py                                 # 1M messages
    .venv/bin/python benchmarks/consumer.py --messages 100000 --rounds 3    # quick
    .venv/bin/python benchmarks/consumer.py --micro                         # no broker

``--micro`` isolates the per-message cost of the loop itself (no broker, so no fetch and no
machine-wide noise from broker JVMs): the same pre-built ``confluent_kafka.Message`` objects, in
batches of 500 over 3 partitions, go through the raw loop body and through
``ResilientConsumer``'s per-message path, with ``store_offsets`` stubbed out in both; the
per-message figure is this thread's CPU time (wall time on a shared machine is mostly noise).

Starts a local 3-node cluster unless ``KRESILIENT_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    Sample,
    Timer,
    contention,
    environment,
    markdown_table,
    median_iqr,
    paired_ratios,
    precommit_clean,
    run_child,
    run_interleaved,
)
from confluent_kafka import Consumer, Producer

from kresilient.consumer import ResilientConsumer
from kresilient.testing import KafkaCluster

VALUE = b"x" * 100
ARMS = ("raw", "kresilient")
SUBPROCESS_ARMS = ("kresilient_sub", "kresilient_old")
_ROOT = Path(__file__).resolve().parent.parent


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


def _clean_restart_group(bootstrap: str, topic: str, partitions: int) -> str:
    """A new group pre-committed at offset 0 with the clean-end marker (``precommit_clean``);
    the raw loop and a tree without the guard ignore the metadata."""
    group = f"bench-restart-{uuid.uuid4().hex[:8]}"
    precommit_clean(bootstrap, group, topic, partitions)
    return group


def run_raw(
    bootstrap: str, topic: str, n: int, extra: dict[str, Any] | None = None
) -> tuple[float, float, float]:
    """The hand-written at-least-once loop; returns (wall_s, cpu_s, main_cpu_s) first to last
    message (``main_cpu_s``: this thread's CPU time only)."""
    consumer = Consumer(
        {
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            **(extra or {}),
            "bootstrap.servers": bootstrap,
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    consumer.subscribe([topic])
    count = 0
    first = cpu0 = main0 = 0.0

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
                first, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
            for msg in msgs:
                if msg.error() is None:
                    handler(msg)
            last = {(m.topic(), m.partition()): m for m in msgs if m.error() is None}
            for m in last.values():
                store(message=m)
        return (
            time.perf_counter() - first,
            time.process_time() - cpu0,
            time.thread_time() - main0,
        )
    finally:
        consumer.close()


def run_kresilient(
    bootstrap: str, topic: str, n: int, extra: dict[str, Any] | None = None
) -> tuple[float, float, float]:
    """ResilientConsumer with its defaults; returns (wall_s, cpu_s, main_cpu_s) first to last
    message."""
    count = 0
    first = last = cpu0 = cpu1 = main0 = main1 = 0.0
    consumer: ResilientConsumer

    def handler(_msg: Any) -> None:
        nonlocal count, first, last, cpu0, cpu1, main0, main1
        count += 1
        if count == 1:
            first, cpu0, main0 = time.perf_counter(), time.process_time(), time.thread_time()
        elif count == n:
            last, cpu1, main1 = time.perf_counter(), time.process_time(), time.thread_time()
            consumer.stop()

    consumer = ResilientConsumer(
        {
            "group.id": f"bench-kr-{uuid.uuid4().hex[:8]}",
            **(extra or {}),
            "bootstrap.servers": bootstrap,
        },
        [topic],
        handler,
        install_signal_handlers=False,
    )
    consumer.run()
    # timed from the first message: n - 1 intervals, scaled to n like the raw arm
    scale = n / (n - 1)
    return (last - first) * scale, (cpu1 - cpu0) * scale, (main1 - main0) * scale


def child(argv: list[str]) -> None:
    """``--child BOOTSTRAP TOPIC N [CONFIG_JSON]``: the kresilient arm once; prints its times
    as JSON."""
    import kresilient

    _quiet_structlog()
    bootstrap, topic, n = argv[0], argv[1], int(argv[2])
    extra = json.loads(argv[3]) if len(argv) > 3 else {}
    wall, cpu, main_cpu = run_kresilient(bootstrap, topic, n, extra)
    out = {"wall_s": wall, "cpu_s": cpu, "main_cpu_s": main_cpu, "kresilient": kresilient.__file__}
    print(json.dumps(out))


def _quiet_structlog() -> None:
    import logging

    import structlog

    # nothing below WARNING, on stderr: stdout is the report (and a child's JSON line)
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


class _StubConsumer:
    """Stands in for confluent_kafka.Consumer in --micro mode (offsets go nowhere)."""

    def store_offsets(self, message: Any = None, offsets: Any = None) -> None:
        return None


def micro(n: int, rounds: int) -> None:
    """Per-message cost of the loops themselves, no broker."""
    from confluent_kafka import Message

    msgs = [Message(topic="t", partition=i % 3, offset=i // 3, value=VALUE) for i in range(n)]
    batches = [msgs[i : i + 500] for i in range(0, n, 500)]
    stub = _StubConsumer()

    def handler(_msg: Any) -> None:
        return None

    def raw(rnd: int) -> Sample:
        store = stub.store_offsets
        with Timer() as t:
            cpu = time.thread_time()
            for batch in batches:
                for msg in batch:
                    if msg.error() is None:
                        handler(msg)
                last = {(m.topic(), m.partition()): m for m in batch if m.error() is None}
                for m in last.values():
                    store(message=m)
            cpu = time.thread_time() - cpu
        return Sample(arm="raw", round=rnd, messages=n, wall_s=t.wall_s, cpu_s=cpu)

    consumer = ResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:9", "group.id": "micro", "log_level": 0},
        ["t"],
        handler,
        install_signal_handlers=False,
    )
    consumer._offsets._consumer = stub  # type: ignore[assignment]

    def kresilient(rnd: int) -> Sample:
        process = consumer._process
        with Timer() as t:
            cpu = time.thread_time()
            for batch in batches:
                process(batch)
            cpu = time.thread_time() - cpu
        return Sample(arm="kresilient", round=rnd, messages=n, wall_s=t.wall_s, cpu_s=cpu)

    load_before = os.getloadavg()[0]
    samples = run_interleaved({"raw": raw, "kresilient": kresilient}, rounds=rounds)
    consumer.close()
    print(f"consumer loop, no broker, {contention(load_before, os.getloadavg()[0])}")
    print(markdown_table(samples, baseline="raw", title=f"{n:,} messages in batches of 500"))
    ns = {
        name: median_iqr([s.cpu_s / n * 1e9 for s in samples if s.arm == name])[0]
        for name in ("raw", "kresilient")
    }
    print(
        f"\nper message (this thread's CPU time, steadier than wall time on a shared machine):"
        f" raw {ns['raw']:.0f} ns, kresilient {ns['kresilient']:.0f} ns, "
        f"added {ns['kresilient'] - ns['raw']:+.0f} ns"
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--arms", type=lambda s: s.split(","), default=list(ARMS))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--old-tree",
        help="a checkout whose kresilient the kresilient_old arm imports (PYTHONPATH)",
    )
    parser.add_argument(
        "--fetch-queue-backoff-ms",
        type=int,
        default=None,
        help="set librdkafka's fetch.queue.backoff.ms in every arm (default: its default, 1000)",
    )
    parser.add_argument(
        "--start",
        choices=("new-group", "restart"),
        default="new-group",
        help="each sample's group: new (never committed; kresilient's crash-loop guard then "
        "commits each partition once before its first record) or restart (pre-committed at "
        "offset 0 with the clean-end marker, the steady state of a restarted service)",
    )
    parser.add_argument("--json", action="store_true", help="also print every sample")
    parser.add_argument("--micro", action="store_true", help="the loops alone, no broker")
    args = parser.parse_args()
    unknown = set(args.arms) - set(ARMS) - set(SUBPROCESS_ARMS)
    if unknown:
        parser.error(
            f"unknown arm(s) {sorted(unknown)}; choose from {', '.join(ARMS + SUBPROCESS_ARMS)}"
        )
    if "kresilient_old" in args.arms and not args.old_tree:
        parser.error("the kresilient_old arm needs --old-tree")

    _quiet_structlog()
    if args.micro:
        micro(min(args.messages, 500_000), max(args.rounds, 9))
        return
    extra: dict[str, Any] = {}
    if args.fetch_queue_backoff_ms is not None:
        extra["fetch.queue.backoff.ms"] = args.fetch_queue_backoff_ms
    load_before = os.getloadavg()[0]
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        bootstrap = cluster.bootstrap_servers
        topic = f"bench-consumer-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
        cluster.create_topic(topic + ".dlq", args.partitions, 3, {"min.insync.replicas": 2})
        t0 = time.monotonic()
        _produce(bootstrap, topic, args.messages)
        print(f"produced {args.messages:,} x 100 B in {time.monotonic() - t0:.1f} s", flush=True)

        def arm(name: str) -> Any:
            def sample(rnd: int) -> Sample:
                if args.start == "restart":
                    extra["group.id"] = _clean_restart_group(bootstrap, topic, args.partitions)
                if name in SUBPROCESS_ARMS:
                    tree = _ROOT if name == "kresilient_sub" else Path(args.old_tree)
                    r = run_child(
                        __file__, tree, [bootstrap, topic, str(args.messages), json.dumps(extra)]
                    )
                    wall, cpu, main_cpu = r["wall_s"], r["cpu_s"], r["main_cpu_s"]
                else:
                    run = run_raw if name == "raw" else run_kresilient
                    wall, cpu, main_cpu = run(bootstrap, topic, args.messages, extra)
                return Sample(
                    arm=name,
                    round=rnd,
                    messages=args.messages,
                    wall_s=wall,
                    cpu_s=cpu,
                    extra={"main_cpu_s": main_cpu},
                )

            return sample

        def show(s: Sample) -> None:
            tag = "warm-up" if s.round < 0 else f"round {s.round + 1}"
            print(
                f"{tag}: {s.arm} {s.rate:,.0f} msg/s, {s.cpu_us_per_msg:.2f} CPU µs/msg "
                f"({s.extra['main_cpu_s'] / s.messages * 1e6:.3f} in the consuming thread) "
                f"(load {os.getloadavg()[0]:.1f})",
                flush=True,
            )

        samples = run_interleaved(
            {name: arm(name) for name in args.arms},
            rounds=args.rounds,
            seed=args.seed,
            on_sample=show,
        )
        cluster.delete_topic(topic)
        cluster.delete_topic(topic + ".dlq")
    load_after = os.getloadavg()[0]
    extra.pop("group.id", None)
    env = environment(
        messages=args.messages,
        partitions=args.partitions,
        rounds=args.rounds,
        config=extra,
        start=args.start,
    )
    print()
    print(f"consumer, {contention(load_before, load_after)}: {json.dumps(env)}")
    baseline = "raw" if "raw" in args.arms else args.arms[0]
    print(
        markdown_table(
            samples, baseline=baseline, title="1 consumer, trivial handler, 100 B", arms=args.arms
        )
    )
    cpu = {
        name: median_iqr([s.cpu_us_per_msg for s in samples if s.arm == name])[0]
        for name in args.arms
    }
    if {"raw", "kresilient"} <= set(args.arms):
        ratio, q1, q3 = median_iqr(paired_ratios(samples, "kresilient", "raw"))
        verdict = "meets" if ratio >= 0.90 else "MISSES"
        print(
            f"\npaired throughput ratio kresilient/raw {ratio:.3f} [IQR {q1:.3f}-{q3:.3f}]: "
            f"{verdict} the >= 0.90 target; CPU per message raw/kresilient "
            f"{cpu['raw'] / cpu['kresilient']:.3f}"
        )
    if set(SUBPROCESS_ARMS) <= set(args.arms):
        ratio, q1, q3 = median_iqr(paired_ratios(samples, "kresilient_sub", "kresilient_old"))
        c, c1, c3 = median_iqr(_paired_cpu_ratios(samples, "kresilient_old", "kresilient_sub"))
        t, t1, t3 = median_iqr(
            _paired_cpu_ratios(samples, "kresilient_old", "kresilient_sub", key="main_cpu_s")
        )
        verdict = "no regression" if ratio >= 0.98 else "REGRESSION"
        print(
            f"\nlayout check, paired per round: throughput kresilient_sub/kresilient_old "
            f"{ratio:.3f} [IQR {q1:.3f}-{q3:.3f}] ({verdict} at >= 0.98); CPU per message "
            f"old/new {c:.3f} [IQR {c1:.3f}-{c3:.3f}], of the consuming thread alone "
            f"{t:.3f} [IQR {t1:.3f}-{t3:.3f}]; old tree {args.old_tree}"
        )
    if args.json:
        print(json.dumps([s.__dict__ | {"extra": dict(s.extra)} for s in samples]))


def _paired_cpu_ratios(
    samples: list[Sample], num: str, den: str, key: str = "cpu_s"
) -> list[float]:
    """CPU time of *num* / *den* (process, or ``extra[key]``), for every round where both ran
    (> 1: den cheaper)."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s

    def cpu(s: Sample) -> float:
        return s.cpu_s if key == "cpu_s" else float(s.extra[key])

    return [
        cpu(r[num]) / cpu(r[den])
        for _, r in sorted(by_round.items())
        if num in r and den in r and cpu(r[den]) > 0
    ]


if __name__ == "__main__":
    main()
