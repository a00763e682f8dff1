"""Producer throughput: raw confluent-kafka against ResilientProducer, same config, same work.

Arms (each on a fresh topic per round: ``--partitions`` partitions, RF=3,
``min.insync.replicas=2``, deleted afterwards):

- ``raw``: ``confluent_kafka.Producer`` with exactly the configuration ResilientProducer
  applies (acks=all, idempotence, 5 in flight, murmur2_random, statistics every 5 s with a
  no-op ``stats_cb``, an ``error_cb``), a per-message delivery callback counting errors,
  ``poll(0)`` every 1024 messages and on ``BufferError`` (then produce again): the cheapest
  correct loop we know how to write by hand.
- ``kresilient``: ``ResilientProducer`` with no OpenTelemetry SDK provider (the API's no-op).
- ``kresilient_otel_1pct``: ``ResilientProducer`` with an SDK ``TracerProvider`` sampling 1%
  of root spans (``ParentBased(TraceIdRatioBased(0.01))``) and a batch processor whose
  exporter drops spans.
- ``raw_positional``: the ``raw`` loop calling ``produce(topic, value, None, -1, callback)``
  positionally, as kresilient does (the binding parses keywords dearer: ``raw`` passes
  ``on_delivery=`` and ``headers=None``); the cheapest calling-thread baseline, reported beside
  ``raw`` rather than instead of it.
- ``raw_header``: the ``raw`` loop sending one prebuilt 55-byte ``traceparent`` header on every
  record (the header's own cost, no tracing): the baseline of ``kresilient_otel_1pct``
  (``--arms raw,raw_header,kresilient_otel_1pct``), as ``benchmarks/peers.py``'s
  ``raw+header``.
- ``kresilient_sub`` / ``kresilient_old``: the ``kresilient`` arm in a fresh subprocess, with
  this tree's code / with the tree given by ``--old-tree`` (e.g. a checkout of an older
  commit) first on ``PYTHONPATH``: the layout-regression check, paired in the same run
  (``--arms raw,kresilient_sub,kresilient_old --old-tree /path/to/old/checkout``). The
  subprocess times itself exactly like the in-process arm (interpreter start excluded).

The clock runs from the first ``produce`` to the return of ``flush()`` with every delivery
report received and no failure. Rounds are interleaved with a shuffled order, one warm-up
round discarded; the headline is the paired per-round ratio to ``raw`` (median and IQR);
CPU is this process's ``process_time`` per message (librdkafka's threads included). Values are
pre-built ``bytes`` (no key), 100 B and 1 KiB.

    .venv/bin/python benchmarks/producer.py                       # 1M messages per arm, 10 rounds
    .venv/bin/python benchmarks/producer.py --messages 200000 --rounds 3     # quick look
    .venv/bin/python benchmarks/producer.py --messages 200000 --rounds 6 \
        --arms raw,kresilient,kresilient_sub --settle 3      # docs/performance.md P2-P4
    .venv/bin/python benchmarks/producer.py --micro               # enqueue cost, no broker
    .venv/bin/python benchmarks/producer.py --micro --old-tree /path/to/old/checkout  # A/B

Starts a local 3-node cluster (``kresilient.testing.KafkaCluster``) unless
``KRESILIENT_BOOTSTRAP_SERVERS`` names one. Prints markdown.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# benchmarks/asyncio.py would shadow the standard library's asyncio (imported by
# confluent_kafka): this directory comes off sys.path until the third-party imports are done.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from confluent_kafka import Producer  # noqa: E402

from kresilient.config import producer_config  # noqa: E402
from kresilient.producer import ResilientProducer  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

sys.path.append(str(_HERE))
from _common import (  # noqa: E402
    Sample,
    Timer,
    contention,
    environment,
    markdown_table,
    median_iqr,
    paired_ratios,
    peak_rss_mib,
    run_interleaved,
)

ARMS = ("raw", "kresilient", "kresilient_otel_1pct", "raw_header", "raw_positional")
DEFAULT_ARMS = ARMS[:3]
#: What ``raw_header`` sends on every record (a not-sampled W3C trace context).
TRACEPARENT = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")]
SUBPROCESS_ARMS = ("kresilient_sub", "kresilient_old")
_ROOT = Path(__file__).resolve().parent.parent


def run_subprocess(
    tree: Path, bootstrap: str, topic: str, size: int, n: int
) -> tuple[float, float, float, int, float]:
    """The ``kresilient`` arm in a child interpreter importing kresilient from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", bootstrap, topic, str(size), str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=str(tree),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child arm failed ({tree}):\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return r["wall_s"], r["cpu_s"], r["gc_s"], r["gc_collections"], r["thread_s"]


def child(argv: list[str]) -> None:
    """``--child BOOTSTRAP TOPIC SIZE N``: run the kresilient arm once, print its timer."""
    import kresilient

    _quiet_structlog()
    bootstrap, topic, size, n = argv[0], argv[1], int(argv[2]), int(argv[3])
    t = run_kresilient({"bootstrap.servers": bootstrap}, topic, os.urandom(size), n)
    out = {
        "wall_s": t.wall_s,
        "cpu_s": t.cpu_s,
        "gc_s": t.gc_s,
        "gc_collections": t.gc_collections,
        "thread_s": t.thread_s,
    }
    print(f"# kresilient from {kresilient.__file__}", file=sys.stderr)
    print(json.dumps(out))


POLL_MASK = 1023


def _quiet_structlog() -> None:
    import logging

    import structlog

    # The application's choice in real life; here: nothing below WARNING, and on stderr so
    # that stdout is only the markdown report.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _noop(*_args: Any) -> None:
    return None


def run_raw(
    config: dict[str, Any],
    topic: str,
    value: bytes,
    n: int,
    headers: Any = None,
    *,
    positional: bool = False,
) -> Timer:
    """The hand-written loop; returns its timer."""
    errors = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    producer = Producer({**config, "error_cb": _noop, "stats_cb": _noop})
    produce, poll = producer.produce, producer.poll
    with Timer() as t:
        if positional:
            for i in range(n):
                while True:
                    try:
                        produce(topic, value, None, -1, on_delivery)
                        break
                    except BufferError:
                        poll(0.05)
                if not i & POLL_MASK:
                    poll(0)
        else:
            for i in range(n):
                while True:
                    try:
                        produce(topic, value, on_delivery=on_delivery, headers=headers)
                        break
                    except BufferError:
                        poll(0.05)
                if not i & POLL_MASK:
                    poll(0)
        remaining = producer.flush()
    if remaining or errors[0]:
        raise RuntimeError(f"raw: {remaining} left, {errors[0]} failed")
    return t


def run_kresilient(
    config: dict[str, Any], topic: str, value: bytes, n: int, tracer_provider: Any = None
) -> Timer:
    producer = ResilientProducer(config, tracer_provider=tracer_provider)
    produce = producer.produce
    # A full collection just before the clock: otherwise when the first full collection of
    # the run comes depends on what happened to be collected while the interpreter started
    # (the old tree's constructor imports the OpenTelemetry SDK, moving its threshold), which
    # doubled one tree's GC time for reasons unrelated to its per-message work.
    gc.collect()
    with Timer() as t:
        for _ in range(n):
            produce(topic, value)
        producer.flush()  # raises DeliveryError on any failure
    producer.close()
    return t


def _otel_provider() -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class DropExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    provider.add_span_processor(BatchSpanProcessor(DropExporter()))
    return provider


def end_to_end(args: argparse.Namespace) -> None:
    _quiet_structlog()
    load_before = os.getloadavg()[0]
    cluster = KafkaCluster()
    cluster.start_cluster()
    provider = _otel_provider()
    out: dict[str, Any] = {"environment": environment(cluster=repr(cluster)), "sizes": {}}
    try:
        bootstrap = cluster.bootstrap_servers
        # Both arms get the configuration ResilientProducer applies (defaults included).
        user = {"bootstrap.servers": bootstrap}
        config = producer_config(user)
        for size in args.sizes:
            value = os.urandom(size)

            def arm(name: str, size: int = size, value: bytes = value) -> Callable[[int], Sample]:
                def run(round_no: int) -> Sample:
                    topic = f"bench-{name}-{size}-{round_no}-{uuid.uuid4().hex[:6]}"
                    cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
                    if args.settle > 0:
                        time.sleep(args.settle)  # a benchmark's pause, outside every clock
                    n = args.messages if round_no >= 0 else min(args.messages, 100_000)
                    gc.collect()
                    try:
                        if name in SUBPROCESS_ARMS:
                            tree = _ROOT if name == "kresilient_sub" else Path(args.old_tree)
                            wall, cpu, gc_s, gc_n, thread = run_subprocess(
                                tree, bootstrap, topic, size, n
                            )
                        else:
                            if name == "raw":
                                t = run_raw(config, topic, value, n)
                            elif name == "raw_positional":
                                t = run_raw(config, topic, value, n, positional=True)
                            elif name == "raw_header":
                                t = run_raw(config, topic, value, n, TRACEPARENT)
                            elif name == "kresilient":
                                t = run_kresilient(user, topic, value, n)
                            else:
                                t = run_kresilient(user, topic, value, n, provider)
                            wall, cpu, gc_s, gc_n = t.wall_s, t.cpu_s, t.gc_s, t.gc_collections
                            thread = t.thread_s
                    finally:
                        cluster.delete_topic(topic)
                    return Sample(
                        arm=name,
                        round=round_no,
                        messages=n,
                        wall_s=wall,
                        cpu_s=cpu,
                        extra={"gc_s": gc_s, "gc_collections": gc_n, "thread_s": thread},
                    )

                return run

            def show(s: Sample, size: int = size) -> None:
                tag = "warm-up" if s.round < 0 else f"round {s.round}"
                print(
                    f"  {size} B {tag:8s} {s.arm:22s} {s.rate:10,.0f} msg/s "
                    f"{s.cpu_us_per_msg:6.2f} CPU µs/msg ({s.gc_us_per_msg:.2f} in GC, "
                    f"{s.extra['thread_s'] / s.messages * 1e6:.2f} calling thread)",
                    file=sys.stderr,
                    flush=True,
                )

            samples = run_interleaved(
                {name: arm(name) for name in args.arms},
                rounds=args.rounds,
                seed=args.seed,
                on_sample=show,
            )
            out["sizes"][size] = samples
    finally:
        cluster.close()
    load_after = os.getloadavg()[0]
    label = contention(load_before, load_after)
    print(f"## Producer throughput, RF=3, acks=all ({label})\n")
    print(
        f"{args.messages:,} messages per arm and round, {args.rounds} rounds (+1 warm-up), "
        f"{args.partitions} partitions, values without keys. Peak RSS of the benchmark "
        f"process: {peak_rss_mib():.0f} MiB.\n"
    )
    for size, samples in out["sizes"].items():
        print(markdown_table(samples, baseline="raw", title=f"{size} B values", arms=args.arms))
        print()
        print(cpu_table(samples, args.arms))
        if {"kresilient_sub", "kresilient_old"} <= set(args.arms):
            m, q1, q3 = median_iqr(paired_ratios(samples, "kresilient_sub", "kresilient_old"))
            print(
                f"\nThis tree / the old tree (`kresilient_sub` / `kresilient_old`, paired per "
                f"round): **{m:.3f}** [{q1:.3f}-{q3:.3f}]\n"
            )
        print()
    env = out["environment"]
    print("Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))
    if args.json:
        dump = {
            "environment": env,
            "contention": label,
            "samples": {
                str(size): [s.__dict__ | {"rate": s.rate} for s in samples]
                for size, samples in out["sizes"].items()
            },
        }
        Path(args.json).write_text(json.dumps(dump, indent=2, default=str))


def _paired_cpu(samples: list[Sample], arm: str, base: str, key: str) -> list[float]:
    """Per round: arm's CPU per message / base's (``key``: ``cpu_s`` or ``thread_s``)."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s

    def per_msg(s: Sample) -> float:
        return float(s.cpu_s if key == "cpu_s" else s.extra[key]) / s.messages

    return [per_msg(r[arm]) / per_msg(r[base]) for r in by_round.values() if {arm, base} <= set(r)]


def cpu_table(samples: list[Sample], arms: list[str]) -> str:
    """CPU per message, paired per round against ``raw`` (issue 39's CPU criterion): the
    process (librdkafka's threads included) and the calling thread alone (``produce()`` and
    the delivery callbacks: the wrapper's own work, without the batching noise of
    librdkafka's threads). ``kresilient_old`` is also paired against ``kresilient_sub``."""
    lines = [
        "| arm | process CPU µs/msg | CPU vs raw (paired) median [IQR] | calling-thread CPU "
        "µs/msg | calling thread vs raw (paired) median [IQR] |",
        "|---|---:|---:|---:|---:|",
    ]
    pairs = [(a, "raw") for a in arms if a != "raw"]
    if {"kresilient_sub", "kresilient_old"} <= set(arms):
        pairs.append(("kresilient_sub", "kresilient_old"))
    for name in arms:
        mine = [s for s in samples if s.arm == name]
        if not mine:
            continue
        cpu = median_iqr([s.cpu_s / s.messages * 1e6 for s in mine])[0]
        thread = median_iqr([s.extra["thread_s"] / s.messages * 1e6 for s in mine])[0]
        cells = []
        for key in ("cpu_s", "thread_s"):
            if name == "raw":
                cells.append("1")
            else:
                m, q1, q3 = median_iqr(_paired_cpu(samples, name, "raw", key))
                cells.append(f"{m:.3f} [{q1:.3f}-{q3:.3f}]")
        lines.append(f"| {name} | {cpu:.2f} | {cells[0]} | {thread:.2f} | {cells[1]} |")
    if {"kresilient", "raw_positional"} <= set(arms):
        m, q1, q3 = median_iqr(_paired_cpu(samples, "kresilient", "raw_positional", "cpu_s"))
        t, t1, t3 = median_iqr(_paired_cpu(samples, "kresilient", "raw_positional", "thread_s"))
        lines.append(
            f"\nCPU, kresilient / raw_positional (paired per round): process **{m:.3f}** "
            f"[{q1:.3f}-{q3:.3f}], calling thread **{t:.3f}** [{t1:.3f}-{t3:.3f}]"
        )
    if ("kresilient_sub", "kresilient_old") in pairs:
        m, q1, q3 = median_iqr(_paired_cpu(samples, "kresilient_sub", "kresilient_old", "cpu_s"))
        t, t1, t3 = median_iqr(_paired_cpu(samples, "kresilient_sub", "kresilient_old", "thread_s"))
        lines.append(
            f"\nCPU, this tree / the old tree (`kresilient_sub` / `kresilient_old`, paired per "
            f"round): process **{m:.3f}** [{q1:.3f}-{q3:.3f}], calling thread **{t:.3f}** "
            f"[{t1:.3f}-{t3:.3f}]"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- micro


MICRO_ARMS = ("kresilient", "kresilient_otel_1pct", "kresilient_cb", "kresilient_nogc")


def _micro_config(n: int) -> dict[str, Any]:
    """A producer whose broker does not exist: nothing is ever delivered or sent."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "bootstrap.servers": f"127.0.0.1:{port}",
        "log_level": 0,
        "queue.buffering.max.messages": n + 10,
        "queue.buffering.max.kbytes": 2**21,
    }


def _micro_raw(n: int, value: bytes) -> float:
    config = producer_config(_micro_config(n))
    p = Producer({**config, "error_cb": _noop, "stats_cb": _noop})
    produce, poll = p.produce, p.poll
    errors = [0]

    def cb(err: Any, _m: Any) -> None:
        if err is not None:
            errors[0] += 1

    gc.collect()
    t0 = time.process_time()
    for i in range(n):
        produce("t", value, on_delivery=cb)
        if not i & POLL_MASK:
            poll(0)
    dt = time.process_time() - t0
    p.purge()
    p.poll(0)
    return dt


def _micro_wrapped(arm: str, n: int, value: bytes, provider: Any = None) -> float:
    """One round of a kresilient arm: ``kresilient`` (``produce(topic, value)``), ``..._otel_1pct``
    (the same with an SDK sampling 1%), ``kresilient_cb`` (with a per-message ``on_delivery``,
    the path the asyncio producer takes), ``kresilient_nogc`` (``kresilient`` with the garbage
    collector disabled during the loop: not a configuration to run, it isolates what the
    collections of the handles alive cost; nothing is delivered here, so each call makes one)."""
    p = ResilientProducer(_micro_config(n), tracer_provider=provider)
    produce = p.produce
    gc.collect()  # the previous round's garbage is not this round's cost
    if arm == "kresilient_cb":
        t0 = time.process_time()
        for _ in range(n):
            produce("t", value, on_delivery=_noop)
        dt = time.process_time() - t0
    else:
        if arm == "kresilient_nogc":
            gc.disable()
        t0 = time.process_time()
        for _ in range(n):
            produce("t", value)
        dt = time.process_time() - t0
        gc.enable()
    p._producer.purge()
    p._producer.poll(0)  # each purged report refers to its handle (a cycle): freed below
    p._reported.clear()
    p._closed = True
    del p, produce
    gc.collect()
    return dt


def micro_child(argv: list[str]) -> None:
    """``--micro-child ARM N``: one timed round of ``ARM`` after a short warm-up, in this
    interpreter (whose ``PYTHONPATH`` chooses the tree); prints the CPU seconds."""
    _quiet_structlog()
    arm, n = argv[0], int(argv[1])
    value = b"x" * 100
    provider = _otel_provider() if arm == "kresilient_otel_1pct" else None
    _micro_wrapped(arm, min(n, 20_000), value, provider)
    print(json.dumps({"cpu_s": _micro_wrapped(arm, n, value, provider)}))


def _micro_in_tree(tree: Path, arm: str, n: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, __file__, "--micro-child", arm, str(n)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=str(tree),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"micro child failed ({tree}):\n{proc.stderr[-2000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["cpu_s"])


def micro(args: argparse.Namespace) -> None:
    """Enqueue cost per produce() call with nothing listening (no delivery, no network).

    Every timed loop starts after a full collection, with the previous round's producer and
    its purged handles freed: the loop's own allocations (one handle per message, all alive
    since nothing is delivered) still trigger collections inside it, which are its cost; the
    garbage of the round before is not (it made the kresilient arm look 2 µs dearer).

    With ``--old-tree``, each kresilient arm runs in two child interpreters per round, this
    tree's and the old tree's (``ARM@new`` / ``ARM@old``, same measuring code), in a shuffled
    order: the A/B of a change.
    """
    _quiet_structlog()
    n = args.micro_messages
    value = b"x" * 100
    provider = _otel_provider()
    arms = [a for a in args.arms if a in MICRO_ARMS]
    runs: dict[str, Callable[[], float]] = {"raw": lambda: _micro_raw(n, value)}
    for arm in arms:
        if args.old_tree:
            for tag, tree in (("new", _ROOT), ("old", Path(args.old_tree))):
                runs[f"{arm}@{tag}"] = lambda a=arm, t=tree: _micro_in_tree(t, a, n)
        else:
            prov = provider if arm == "kresilient_otel_1pct" else None
            runs[arm] = lambda a=arm, p=prov: _micro_wrapped(a, n, value, p)
    results: dict[str, list[float]] = {name: [] for name in runs}
    rng = random.Random(args.seed)
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        order = list(runs)
        rng.shuffle(order)
        for name in order:
            results[name].append(runs[name]() / n * 1e6)
        load.append(os.getloadavg()[0])
    print(f"## produce() enqueue cost, no broker ({n:,} calls x {args.rounds} rounds)\n")
    print("| arm | CPU µs per call median [IQR] | added vs raw (median of paired diffs) |")
    print("|---|---:|---:|")
    for name, values in results.items():
        m, q1, q3 = median_iqr(values)
        diffs = [v - r for v, r in zip(values, results["raw"], strict=True)]
        added = "-" if name == "raw" else f"{median_iqr(diffs)[0]:+.3f}"
        print(f"| {name} | {m:.3f} [{q1:.3f}-{q3:.3f}] | {added} |")
    if args.old_tree:
        print("\n| arm | new / old, paired per round: median [IQR] |\n|---|---:|")
        for arm in arms:
            ratios = [
                a / b for a, b in zip(results[f"{arm}@new"], results[f"{arm}@old"], strict=True)
            ]
            m, q1, q3 = median_iqr(ratios)
            print(f"| {arm} | {m:.3f} [{q1:.3f}-{q3:.3f}] |")
    print(
        f"\n1-min load average: {min(load):.1f}-{max(load):.1f} (median "
        f"{sorted(load)[len(load) // 2]:.1f}) on {os.cpu_count()} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="per arm and round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024]
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--arms",
        type=lambda s: s.split(","),
        default=None,
        help=f"default: {','.join(DEFAULT_ARMS)}; --micro: raw,{','.join(MICRO_ARMS)}",
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds between creating a round's topic and the arm's first produce (outside "
        "the clock): a topic used at once sometimes costs librdkafka's broker threads 1-3 µs "
        "per message more, in raw and kresilient arms alike",
    )
    parser.add_argument("--json", help="also write every sample to this file")
    parser.add_argument("--micro", action="store_true", help="enqueue cost only, no broker")
    parser.add_argument("--micro-messages", type=int, default=100_000)
    parser.add_argument(
        "--old-tree",
        help="a checkout whose kresilient the kresilient_old arm imports (PYTHONPATH)",
    )
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    if sys.argv[1:2] == ["--micro-child"]:
        micro_child(sys.argv[2:])
        return
    args = parser.parse_args()
    if args.arms is None:
        args.arms = ["raw", *MICRO_ARMS] if args.micro else list(DEFAULT_ARMS)
    unknown = set(args.arms) - set(ARMS) - set(SUBPROCESS_ARMS) - set(MICRO_ARMS)
    if unknown:
        parser.error(
            f"unknown arm(s) {sorted(unknown)}; choose from {', '.join(ARMS + SUBPROCESS_ARMS)}"
        )
    micro_only = {"kresilient_cb", "kresilient_nogc"} & set(args.arms)
    if not args.micro and micro_only:
        parser.error(f"{', '.join(sorted(micro_only))}: --micro only")
    if "kresilient_old" in args.arms and not args.old_tree:
        parser.error("the kresilient_old arm needs --old-tree")
    if args.micro and set(args.arms) & set(SUBPROCESS_ARMS):
        parser.error("subprocess arms are end-to-end only")
    if args.micro:
        micro(args)
    else:
        end_to_end(args)


if __name__ == "__main__":
    main()
