"""Per-message cost of kresilient telemetry (no broker).

Arms, interleaved in every round (order shuffled), each timed over ``--messages`` messages:

- ``loop``: the harness alone (same inputs, two trivial calls): the floor every arm pays.
- ``raw-produce``: confluent-kafka ``produce(..., on_delivery=cb)`` + ``poll(0)`` to a loopback
  address with nothing listening (enqueue cost, B6 of the performance anchors), for scale.
- ``send/noop``: ``producer_send`` + ``producer_delivered`` with only the API (no provider).
- ``send/sdk-100%``: SDK tracer (``BatchSpanProcessor``, exporter that drops) + SDK metrics.
- ``send/sdk-1%``: same, ``ParentBased(TraceIdRatioBased(0.01))``.
- ``send/metrics-only``: SDK metrics, no tracer provider.
- ``process/...``: ``with process_span(msg)`` for a message carrying a ``traceparent``.

With ``--broker`` (a local 3-node cluster, or ``KRESILIENT_BOOTSTRAP_SERVERS``): end to end,
``--messages`` 100-byte messages per arm and round, arms interleaved and shuffled, round 0
discarded. Producer arms: raw confluent-kafka (same config, counting ``on_delivery``,
``BufferError`` handled) and ``ResilientProducer`` with telemetry off / SDK 1% / SDK 100%;
consumer arms: ``ResilientConsumer`` off / 1% / 100% reading a pre-produced 3-partition topic.
Reports the median rate, process CPU µs per message and the paired per-round ratio.

    .venv/bin/python benchmarks/telemetry.py --broker --messages 50000 --rounds 3

Without ``--broker``: reports, per arm, the median over rounds of wall-clock µs per message,
its IQR, the median of this thread's CPU µs per message (less disturbed by other processes on
a shared machine; the span exporter thread's CPU is not in it), and the cost each adds over
``loop``.

    .venv/bin/python benchmarks/telemetry.py [--messages 20000] [--rounds 9] [--json]

Layout check (``--arms kresilient_sub,kresilient_old --old-tree PATH``): the no-broker arms
``loop``, ``send/*`` and ``process/*`` (not ``raw-produce``, which does not touch kresilient)
run in fresh child interpreters importing kresilient from this tree (``kresilient_sub``) and
from ``--old-tree`` (``kresilient_old``, first on ``PYTHONPATH``; e.g. a checkout of 9c6e9f3,
the flat layout), one child per tree and round, the two children of a round in shuffled order,
every arm's order shuffled inside a child after a warm-up. Round 0 is a discarded warm-up that
also sizes each arm: ``max(--messages, --min-sample-s / its CPU cost)`` messages, the same
count for both trees. The children use only ``Telemetry(tracer_provider=, meter_provider=,
propagator=, client_id=, consumer_group=, record_message_key=False)``, ``producer_send``,
``producer_delivered`` and ``process_span`` (in both trees); ``record_message_key`` is set
because its default differs (old ``True``, new ``False``), so both do the same work;
``metric_partition_attribute`` (new only) stays at its default. Reports per arm the paired
per-round ratio new/old of messages per second (= old cost / new cost), from this thread's
CPU time and from wall time, median [IQR]; ``loop`` touches no kresilient code and is the
noise control (its ratio should be 1)::

    .venv/bin/python -P benchmarks/telemetry.py --arms kresilient_sub,kresilient_old \
        --old-tree OLD_TREE --rounds 7

Scale (issue 23 defects 8 and 9; same script on the old tree with ``PYTHONPATH=<old tree>``):

- ``--scale memory``: ``--clients`` short-lived ``Telemetry`` objects on one SDK meter provider,
  each sending one message to each of ``--partitions`` partitions and then dropped; reports the
  memory still held (tracemalloc, after a 100-client warm-up) and the RSS growth.
- ``--scale leadership``: a GENERATED statistics document with ``--partitions`` partitions
  (10 topics; every partition entry is the field set of a recorded librdkafka 2.16 producer
  statistics document, see ``_RECORDED_PARTITION``), fed ``--ticks`` times to one
  ``LeadershipMonitor`` (5 s apart on a fake clock): reports the document size, ``json.loads``
  alone, ``on_stats(str)`` per tick (what ``stats_cb`` costs), ``on_stats(dict)`` (the monitor
  alone), ``snapshot()``, the monitor's memory per partition, and the share of one core at
  ``statistics.interval.ms=5000`` (thread CPU time). ``--baseline-leadership PATH`` runs
  another tree's ``leadership.py`` beside it, paired round by round. ``--rotate N``: instead,
  N topic sets of ``--partitions`` partitions, one set live at a time: the memory still held.

    .venv/bin/python benchmarks/telemetry.py --scale memory --clients 1000 --partitions 12
    .venv/bin/python benchmarks/telemetry.py --scale leadership --partitions 50000 --ticks 7 \
        --baseline-leadership OLD_TREE/kresilient/leadership.py
    .venv/bin/python benchmarks/telemetry.py --scale leadership --partitions 5000 --rotate 40 \
        --baseline-leadership OLD_TREE/kresilient/leadership.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import confluent_kafka as ck
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kresilient.telemetry import Telemetry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_iqr, run_child

TOPIC = "bench"
VALUE = b"x" * 100
KEY = b"key-000042"
W3C = TraceContextTextMapPropagator()
# used where telemetry is off: a sampled parent, as an upstream service would send it
PARENT = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


class _DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


SUBPROCESS_ARMS = ("kresilient_sub", "kresilient_old")
_ROOT = Path(__file__).resolve().parent.parent


def _sdk(
    ratio: float | None, *, traces: bool = True, **options: Any
) -> tuple[Telemetry, Callable[[], None]]:
    tp = None
    if traces:
        sampler = None if ratio is None else ParentBased(TraceIdRatioBased(ratio))
        tp = TracerProvider(sampler=sampler) if sampler else TracerProvider()
        tp.add_span_processor(BatchSpanProcessor(_DropExporter(), max_queue_size=8192))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tel = Telemetry(
        tracer_provider=tp, meter_provider=mp, propagator=W3C, client_id="bench",
        consumer_group="bench-group", **options,
    )

    def close() -> None:
        if tp is not None:
            tp.shutdown()
        mp.shutdown()

    return tel, close


def _send_arm(tel: Telemetry) -> Callable[[int], tuple[float, float]]:
    delivered: Any = ck.Message(topic=TOPIC, partition=0, offset=1, key=KEY, value=VALUE)
    send, done = tel.producer_send, tel.producer_delivered

    def run(n: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            _headers, token = send(TOPIC, KEY, 100, None, None)
            done(token, None, delivered)
        return _per_msg(t0, c0, n)

    return run


def _process_arm(tel: Telemetry) -> Callable[[int], tuple[float, float]]:
    # Messages whose headers this arm's own producer side wrote, so the sampling decision a
    # consumer sees is the producer's (ParentBased), as in a real pipeline.
    msgs: list[Any] = []
    for i in range(1024):
        headers, token = tel.producer_send(TOPIC, KEY, 100, None, None)
        carried: Any = headers if headers is not None else PARENT
        msgs.append(ck.Message(topic=TOPIC, partition=0, offset=i, key=KEY, value=VALUE,
                               headers=carried))
        if token is not None and token.span is not None:
            token.span.end()
    scope = tel.process_span

    def run(n: int) -> tuple[float, float]:
        pool = (msgs * (n // len(msgs) + 1))[:n]
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for msg in pool:
            with scope(msg):
                pass
        return _per_msg(t0, c0, n)

    return run


def _loop_arm() -> Callable[[int], tuple[float, float]]:
    def send(topic: str, key: bytes, size: int, headers: Any, partition: Any) -> tuple[Any, Any]:
        return headers, None

    def done(token: Any, err: Any, msg: Any) -> None:
        return None

    delivered = ck.Message(topic=TOPIC, partition=0, offset=1, key=KEY, value=VALUE)

    def run(n: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(n):
            _headers, token = send(TOPIC, KEY, 100, None, None)
            done(token, None, delivered)
        return _per_msg(t0, c0, n)

    return run


def _raw_produce_arm() -> tuple[Callable[[int], tuple[float, float]], Callable[[], None]]:
    producer = ck.Producer({
        "bootstrap.servers": "127.0.0.1:9",  # nothing listens: pure enqueue cost
        "queue.buffering.max.messages": 2_000_000,
        "queue.buffering.max.kbytes": 2_000_000,
        "message.timeout.ms": 600_000,
        "log_level": 0,
    })

    def cb(err: Any, msg: Any) -> None:
        return None

    def run(n: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for i in range(n):
            producer.produce(TOPIC, VALUE, KEY, on_delivery=cb)
            if i % 1000 == 0:
                producer.poll(0)
        elapsed = _per_msg(t0, c0, n)
        producer.purge()
        producer.poll(0)
        return elapsed

    def close() -> None:
        producer.flush(0)

    return run, close


def _per_msg(t0: int, c0: int, n: int) -> tuple[float, float]:
    """(wall us, this thread's CPU us) per message since (t0, c0)."""
    return (time.perf_counter_ns() - t0) / n / 1000, (time.thread_time_ns() - c0) / n / 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--broker", action="store_true", help="end to end on a real cluster")
    ap.add_argument("--scale", choices=["memory", "leadership"], help="a scale measurement")
    ap.add_argument("--clients", type=int, default=1000, help="--scale memory")
    ap.add_argument("--partitions", type=int, default=12, help="--scale memory/leadership")
    ap.add_argument("--ticks", type=int, default=5, help="--scale leadership")
    ap.add_argument("--rotate", type=int, default=0, metavar="N",
                    help="--scale leadership: N rotating topic sets instead of the tick timing")
    ap.add_argument("--baseline-leadership", metavar="PATH",
                    help="--scale leadership: also run another tree's leadership.py, paired")
    ap.add_argument("--metric-partitions", action="store_true",
                    help="--scale memory: Telemetry(metric_partition_attribute=True)")
    ap.add_argument("--arms", type=lambda s: s.split(","), default=[],
                    help="kresilient_sub,kresilient_old: the layout check (child interpreters)")
    ap.add_argument("--old-tree",
                    help="the checkout the kresilient_old arm imports kresilient from")
    ap.add_argument("--min-sample-s", type=float, default=0.5,
                    help="layout check: the shortest timed run of one arm")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    args = ap.parse_args(argv)
    unknown = set(args.arms) - set(SUBPROCESS_ARMS)
    if unknown:
        ap.error(f"unknown arm(s) {sorted(unknown)}; choose from {', '.join(SUBPROCESS_ARMS)}")
    if "kresilient_old" in args.arms and not args.old_tree:
        ap.error("the kresilient_old arm needs --old-tree")
    if args.arms:
        return layout(args)
    if args.broker:
        return broker_main(args)
    if args.scale == "memory":
        return scale_memory(args)
    if args.scale == "leadership":
        return scale_leadership(args)

    closers: list[Callable[[], None]] = []
    arms: dict[str, Callable[[int], tuple[float, float]]] = {"loop": _loop_arm()}
    raw, close_raw = _raw_produce_arm()
    arms["raw-produce"] = raw
    closers.append(close_raw)
    noop = Telemetry(propagator=W3C, client_id="bench", consumer_group="bench-group")
    assert not noop.enabled, "a global OpenTelemetry provider is set; the no-op arm needs none"
    arms["send/noop"] = _send_arm(noop)
    arms["process/noop"] = _process_arm(noop)
    for label, ratio, traces in (
        ("sdk-100%", None, True), ("sdk-1%", 0.01, True), ("metrics-only", None, False)
    ):
        tel, close = _sdk(ratio, traces=traces)
        closers.append(close)
        arms[f"send/{label}"] = _send_arm(tel)
        arms[f"process/{label}"] = _process_arm(tel)

    for run in arms.values():  # warm-up
        run(max(1000, args.messages // 10))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    order = list(arms)
    for _ in range(args.rounds):
        random.shuffle(order)
        for name in order:
            samples[name].append(arms[name](args.messages))
    for close in closers:
        close()

    wall = {name: statistics.median(w for w, _ in v) for name, v in samples.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in samples.items()}
    rows = [
        {
            "arm": name,
            "us_per_msg": round(wall[name], 3),
            "added_us": round(wall[name] - wall["loop"], 3),
            "iqr_us": round(_iqr([w for w, _ in samples[name]]), 3),
            "cpu_us_per_msg": round(cpu[name], 3),
            "cpu_added_us": round(cpu[name] - cpu["loop"], 3),
        }
        for name in arms
    ]
    env = {
        "python": platform.python_version(),
        "confluent_kafka": ck.__version__,
        "librdkafka": ck.libversion()[0],
        "cpu": _cpu(),
        "messages": args.messages,
        "rounds": args.rounds,
    }
    if args.json:
        json.dump({"env": env, "results": rows}, sys.stdout, indent=2)
        print()
        return 0
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    print(f"{'arm':<22}{'wall us':>9}{'added':>9}{'IQR':>9}{'cpu us':>9}{'added':>9}")
    for r in rows:
        print(
            f"{r['arm']:<22}{r['us_per_msg']:>9.3f}{r['added_us']:>9.3f}{r['iqr_us']:>9.3f}"
            f"{r['cpu_us_per_msg']:>9.3f}{r['cpu_added_us']:>9.3f}"
        )
    return 0


# --------------------------------------------------------------------------------------------
# --arms kresilient_sub,kresilient_old: this tree against an older one, paired per round
# --------------------------------------------------------------------------------------------


def _child_arms() -> tuple[dict[str, Callable[[int], tuple[float, float]]], list[Any]]:
    """The per-message arms of a layout child, with options both trees accept."""
    options = {"record_message_key": False}  # its default differs between the trees
    closers: list[Callable[[], None]] = []
    arms: dict[str, Callable[[int], tuple[float, float]]] = {"loop": _loop_arm()}
    noop = Telemetry(propagator=W3C, client_id="bench", consumer_group="bench-group", **options)
    assert not noop.enabled, "a global OpenTelemetry provider is set; the no-op arm needs none"
    arms["send/noop"] = _send_arm(noop)
    arms["process/noop"] = _process_arm(noop)
    for label, ratio, traces in (
        ("sdk-100%", None, True), ("sdk-1%", 0.01, True), ("metrics-only", None, False)
    ):
        tel, close = _sdk(ratio, traces=traces, **options)
        closers.append(close)
        arms[f"send/{label}"] = _send_arm(tel)
        arms[f"process/{label}"] = _process_arm(tel)
    return arms, closers


def child(argv: list[str]) -> int:
    """``--child COUNTS_JSON``: every arm once with its message count; prints JSON results."""
    import kresilient

    counts: dict[str, int] = json.loads(argv[0])
    arms, closers = _child_arms()
    for name, run in arms.items():  # warm-up: caches, instruments, the SDK's series
        run(max(1000, counts[name] // 10))
    order = list(arms)
    random.shuffle(order)
    results = {name: arms[name](counts[name]) for name in order}
    for close in closers:
        close()
    print(json.dumps({"kresilient": kresilient.__file__, "results": results}))
    return 0


def layout(args: argparse.Namespace) -> int:
    """This tree against ``--old-tree``: every arm's paired per-round ratio new/old."""
    trees = {
        name: _ROOT if name == "kresilient_sub" else Path(args.old_tree) for name in args.arms
    }
    names = list(_child_arms()[0])
    counts = {name: args.messages for name in names}
    per: dict[str, list[dict[str, tuple[float, float]]]] = {t: [] for t in trees}
    load = [os.getloadavg()[0]]
    for rnd in range(-1, args.rounds):  # round -1: warm-up, also sizes the arms
        order = list(trees)
        random.shuffle(order)
        got: dict[str, dict[str, tuple[float, float]]] = {}
        for tree in order:
            got[tree] = run_child(__file__, trees[tree], [json.dumps(counts)])["results"]
        print(f"round {rnd}: " + "; ".join(
            f"{t} " + " ".join(f"{a}={got[t][a][1]:.3f}" for a in names) for t in order
        ) + f" (cpu us/msg, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
        if rnd < 0:
            for a in names:  # from CPU time: wall time under load would undersize them
                cost_us = min(got[t][a][1] for t in got)
                counts[a] = max(args.messages, int(args.min_sample_s * 1e6 / cost_us))
            continue
        for t in trees:
            per[t].append(got[t])
    load.append(os.getloadavg()[0])
    contended = " CONTENDED" if max(load) > (os.cpu_count() or 1) else ""
    print(f"## Telemetry per-message cost, layout check ({args.rounds} rounds, 1-min load "
          f"{load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} cores{contended})\n")
    print(f"old tree: {args.old_tree}; messages per arm: "
          + ", ".join(f"{a} {counts[a]:,}" for a in names) + "\n")
    cols = " | ".join(f"{t} CPU µs/msg" for t in trees)
    both = set(SUBPROCESS_ARMS) <= set(trees)
    head = f"| arm | {cols} |"
    if both:
        head += " new/old rate, CPU median [IQR] | new/old rate, wall median [IQR] |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for a in names:
        row = f"| {a} | " + " | ".join(
            f"{statistics.median(r[a][1] for r in per[t]):.3f}" for t in trees
        ) + " |"
        if both:
            for k in (1, 0):  # rate ratio new/old = old cost / new cost, paired per round
                m, q1, q3 = median_iqr([
                    o[a][k] / n[a][k]
                    for n, o in zip(per["kresilient_sub"], per["kresilient_old"], strict=True)
                ])
                row += f" {m:.3f} [{q1:.3f}-{q3:.3f}] |"
        print(row)
    return 0


# --------------------------------------------------------------------------------------------
# --broker: end to end through a real cluster (ResilientProducer / ResilientConsumer)
# --------------------------------------------------------------------------------------------


def _providers(mode: str) -> tuple[dict[str, Any], Callable[[], None]]:
    """Per-client tracer/meter providers for *mode*: "off", "sdk-1%" or "sdk-100%"."""
    from opentelemetry import metrics as api_metrics
    from opentelemetry import trace as api_trace

    if mode == "off":
        return {
            "tracer_provider": api_trace.NoOpTracerProvider(),
            "meter_provider": api_metrics.NoOpMeterProvider(),
        }, lambda: None
    tel_ratio = 0.01 if mode == "sdk-1%" else None
    sampler = None if tel_ratio is None else ParentBased(TraceIdRatioBased(tel_ratio))
    tp = TracerProvider(sampler=sampler) if sampler else TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(_DropExporter(), max_queue_size=8192))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def close() -> None:
        tp.shutdown()
        mp.shutdown()

    return {"tracer_provider": tp, "meter_provider": mp, "propagator": W3C}, close


def _produce_raw(config: dict[str, Any], topic: str, n: int) -> tuple[float, float]:
    producer = ck.Producer(config)
    delivered = [0]

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivered[0] += 1

    producer.produce(topic, VALUE, KEY, on_delivery=on_delivery)  # metadata + connections
    producer.flush(30)
    delivered[0] = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        while True:
            try:
                producer.produce(topic, VALUE, KEY, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if not i & 1023:
            producer.poll(0)
    producer.flush(120)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert delivered[0] == n, f"raw: {delivered[0]} of {n} delivered"
    return wall, cpu


def _produce_resilient(
    config: dict[str, Any], topic: str, n: int, mode: str
) -> tuple[float, float]:
    from kresilient.producer import ResilientProducer

    providers, close = _providers(mode)
    producer = ResilientProducer(config, logger=_QUIET, **providers)
    try:
        producer.produce(topic, VALUE, key=KEY)
        producer.flush(30)
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            producer.produce(topic, VALUE, key=KEY)
        producer.flush(120)
        return time.perf_counter() - t0, time.process_time() - c0
    finally:
        producer.close()
        close()


def _consume_resilient(bootstrap: str, topic: str, n: int, mode: str) -> tuple[float, float]:
    from kresilient.consumer import ResilientConsumer

    providers, close = _providers(mode)
    seen = [0]
    marks: list[tuple[float, float]] = []

    def handle(msg: Any) -> None:
        if seen[0] == 0:
            marks.append((time.perf_counter(), time.process_time()))
        seen[0] += 1
        if seen[0] == n:
            marks.append((time.perf_counter(), time.process_time()))
            consumer.stop()

    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}"},
        [topic], handle, dead_letter=None, install_signal_handlers=False, logger=_QUIET,
        **providers,
    )
    try:
        consumer.run()
    finally:
        close()
    (w0, c0), (w1, c1) = marks
    return w1 - w0, c1 - c0


class _Quiet:
    """A logger that drops everything (the benchmark measures the clients, not logging)."""

    def __getattr__(self, name: str) -> Any:
        return self._noop

    def _noop(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def bind(self, **kwargs: Any) -> _Quiet:
        return self


_QUIET = _Quiet()


def broker_main(args: argparse.Namespace) -> int:
    from kresilient.config import producer_config
    from kresilient.testing import KafkaCluster

    n = args.messages
    with KafkaCluster() as cluster:
        bootstrap = cluster.bootstrap_servers
        config = producer_config({"bootstrap.servers": bootstrap})
        pmodes = ["raw", "off", "sdk-1%", "sdk-100%"]
        cmodes = ["off", "sdk-1%", "sdk-100%"]
        prod: dict[str, list[tuple[float, float]]] = {m: [] for m in pmodes}
        cons: dict[str, list[tuple[float, float]]] = {m: [] for m in cmodes}
        source = cluster.create_topic(f"bench-src-{uuid.uuid4().hex[:6]}", 3, 3,
                                      {"min.insync.replicas": 2})
        _produce_raw(config, source, n)  # the consumer arms' input (no trace headers)
        load = [os.getloadavg()[0]]
        for r in range(args.rounds + 1):  # round 0: warm-up, discarded
            random.shuffle(pmodes)
            for m in pmodes:
                topic = cluster.create_topic(f"bench-{uuid.uuid4().hex[:8]}", 3, 3,
                                             {"min.insync.replicas": 2})
                res = (_produce_raw(config, topic, n) if m == "raw"
                       else _produce_resilient(config, topic, n, m))
                if r:
                    prod[m].append(res)
            random.shuffle(cmodes)
            for m in cmodes:
                res = _consume_resilient(bootstrap, source, n, m)
                if r:
                    cons[m].append(res)
        load.append(os.getloadavg()[0])

    def row(label: str, samples: list[tuple[float, float]],
            base: list[tuple[float, float]]) -> str:
        rate = statistics.median(n / w for w, _ in samples)
        cpu_us = statistics.median(c / n * 1e6 for _, c in samples)
        ratio = statistics.median(b[0] / s[0] for s, b in zip(samples, base, strict=True))
        return f"{label:<22}{rate:>12,.0f}{cpu_us:>10.2f}{ratio:>10.2f}"

    contended = " CONTENDED" if max(load) > (os.cpu_count() or 1) else ""
    print(f"messages={n} rounds={args.rounds} loadavg={load[0]:.1f}->{load[1]:.1f}{contended}")
    print(f"{'producer arm':<22}{'msg/s':>12}{'cpu us':>10}{'x raw':>10}")
    for m in ("raw", "off", "sdk-1%", "sdk-100%"):
        print(row(m, prod[m], prod["raw"]))
    print(f"{'consumer arm':<22}{'msg/s':>12}{'cpu us':>10}{'x off':>10}")
    for m in ("off", "sdk-1%", "sdk-100%"):
        print(row(m, cons[m], cons["off"]))
    return 0


# --------------------------------------------------------------------------------------------
# --scale: memory of short-lived clients, the statistics tick at many partitions
# --------------------------------------------------------------------------------------------


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def scale_memory(args: argparse.Namespace) -> int:
    import gc
    import tracemalloc

    import kresilient

    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    delivered = [
        ck.Message(topic=TOPIC, partition=p, offset=1, key=KEY, value=VALUE)
        for p in range(args.partitions)
    ]

    # one series per partition, as every release before metric_partition_attribute had
    extra: dict[str, Any] = {"metric_partition_attribute": True} if args.metric_partitions else {}

    def clients(n: int) -> None:
        for _ in range(n):
            tel = Telemetry(meter_provider=mp, **extra)
            for p in range(args.partitions):
                _, token = tel.producer_send(TOPIC, None, 100, None, p)
                tel.producer_delivered(token, None, delivered[p])
            del tel

    clients(100)  # warm-up: series, caches, the SDK's storage
    gc.collect()
    rss0 = _rss_kib()
    t0 = time.perf_counter()
    clients(args.clients)
    elapsed = time.perf_counter() - t0
    gc.collect()
    rss1 = _rss_kib()
    tracemalloc.start()
    clients(100)
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    clients(args.clients)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    print(f"kresilient={os.path.dirname(kresilient.__file__)}")
    print(f"clients={args.clients} partitions={args.partitions} "
          f"messages={args.clients * args.partitions}")
    print(f"held after the clients are gone (tracemalloc): {held / 1024:.1f} KiB "
          f"({held / args.clients:.0f} B per client)")
    print(f"RSS growth: {(rss1 - rss0) / 1024:.1f} MiB; {elapsed * 1e6 / args.clients:.0f} us "
          "per client (create + send/deliver x partitions)")
    mp.shutdown()
    return 0


# One partition entry of a recorded librdkafka 2.16.0 producer statistics document (shared
# 3-node cluster, acks=all producer after 5 messages): the fields every partition carries.
_RECORDED_PARTITION: dict[str, Any] = {
    "partition": 0, "broker": 3, "leader": 3, "desired": False, "unknown": False,
    "msgq_cnt": 0, "msgq_bytes": 0, "xmit_msgq_cnt": 0, "xmit_msgq_bytes": 0, "fetchq_cnt": 0,
    "fetchq_size": 0, "fetch_state": "none", "query_offset": -1001, "next_offset": 0,
    "app_offset": -1001, "stored_offset": -1001, "stored_leader_epoch": -1,
    "commited_offset": -1001, "committed_offset": -1001, "committed_leader_epoch": -1,
    "eof_offset": -1001, "lo_offset": -1001, "hi_offset": -1001, "ls_offset": -1001,
    "consumer_lag": -1, "consumer_lag_stored": -1, "leader_epoch": 0, "txmsgs": 5,
    "txbytes": 5, "rxmsgs": 0, "rxbytes": 0, "msgs": 5, "rx_ver_drops": 0, "msgs_inflight": 0,
    "next_ack_seq": 0, "next_err_seq": 0, "acked_msgid": 0,
}
_RECORDED_WINDOW: dict[str, Any] = {
    "min": 0, "max": 0, "avg": 0, "sum": 0, "stddev": 0, "p50": 0, "p75": 0, "p90": 0,
    "p95": 0, "p99": 0, "p99_99": 0, "outofrange": 0, "hdrsize": 14448, "cnt": 0,
}


def generated_statistics(partitions: int, topics: int = 10) -> str:
    """A generated statistics document: *partitions* spread over *topics* topics."""
    per = max(1, partitions // topics)
    doc: dict[str, Any] = {"name": "bench#producer-1", "type": "producer", "topics": {}}
    for t in range(topics):
        parts: dict[str, Any] = {"-1": {**_RECORDED_PARTITION, "partition": -1, "leader": -1}}
        for p in range(per):
            parts[str(p)] = {**_RECORDED_PARTITION, "partition": p, "leader": 1 + (p % 3),
                             "broker": 1 + (p % 3)}
        doc["topics"][f"bench-{t}"] = {
            "topic": f"bench-{t}", "age": 60_000, "metadata_age": 3_000,
            "batchsize": _RECORDED_WINDOW, "batchcnt": _RECORDED_WINDOW, "partitions": parts,
        }
    return json.dumps(doc)


def _load_leadership(path: str | None) -> Any:
    """``kresilient.leadership``, or the module at *path* (another tree's leadership.py, loaded
    under another name so both run in this process, paired)."""
    if path is None:
        from kresilient import leadership

        return leadership
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_leadership", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _scale_rotation(args: argparse.Namespace, arms: dict[str, Any]) -> int:
    """--rotate N: N topic sets of --partitions partitions, one set live at a time (12 ticks
    of 15 s each), like a client moving through short-lived topics; memory held at the end."""
    import gc
    import tracemalloc

    template = generated_statistics(args.partitions, topics=10)
    print(f"rotation: {args.rotate} topic sets x {args.partitions} partitions, one set live at a "
          "time, 12 statistics ticks 15 s apart per set (generated documents)")
    print(f"{'arm':<10}{'partitions kept':>17}{'held MiB':>10}")
    for name, module in arms.items():
        now = [1000.0]
        gc.collect()
        tracemalloc.start()
        monitor = module.LeadershipMonitor(clock=lambda now=now: now[0])
        for i in range(args.rotate):
            doc = template.replace('"bench-', f'"rot{i}-')  # same shape, new topic names
            for _ in range(12):
                now[0] += 15
                monitor.on_stats(doc)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print(f"{name:<10}{len(monitor.states()):>17}{held / 2**20:>10.1f}")
    return 0


def scale_leadership(args: argparse.Namespace) -> int:
    import gc
    import tracemalloc

    import kresilient

    doc = generated_statistics(args.partitions)
    parsed = json.loads(doc)
    arms = {"this": _load_leadership(None)}
    if args.baseline_leadership:
        arms["baseline"] = _load_leadership(args.baseline_leadership)
    if args.rotate:
        return _scale_rotation(args, arms)
    now = [1000.0]
    monitors, held = {}, {}
    for name, module in arms.items():
        gc.collect()
        tracemalloc.start()
        monitors[name] = module.LeadershipMonitor(clock=lambda: now[0])
        monitors[name].on_stats(doc)  # first sighting of every partition
        gc.collect()
        held[name] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()

    def cpu_ms(fn: Callable[[], object]) -> float:
        c0 = time.thread_time_ns()
        fn()
        return (time.thread_time_ns() - c0) / 1e6

    loads: list[float] = []
    res: dict[str, dict[str, list[float]]] = {
        n: {"str": [], "dict": [], "snapshot": []} for n in arms
    }
    for _ in range(args.ticks):  # paired: every arm in every round, order shuffled
        loads.append(cpu_ms(lambda: json.loads(doc)))
        order = list(arms)
        random.shuffle(order)
        for name in order:
            m = monitors[name]
            now[0] += 5
            res[name]["str"].append(cpu_ms(functools.partial(m.on_stats, doc)))
            now[0] += 5
            res[name]["dict"].append(cpu_ms(functools.partial(m.on_stats, parsed)))
            res[name]["snapshot"].append(cpu_ms(m.snapshot))
    med = {n: {k: statistics.median(v) for k, v in r.items()} for n, r in res.items()}
    known = len(monitors["this"].states())
    print(f"kresilient={os.path.dirname(kresilient.__file__)} "
          f"baseline={args.baseline_leadership or '-'}")
    print(f"partitions={known} ticks={args.ticks} document={len(doc) / 1e6:.1f} MB (generated "
          "from a recorded librdkafka 2.16 partition entry); thread CPU ms, medians")
    print(f"json.loads alone: {statistics.median(loads):.1f} ms")
    print(f"{'arm':<10}{'on_stats(str)':>15}{'% core @5s':>12}{'on_stats(dict)':>16}"
          f"{'snapshot()':>12}{'B/partition':>13}")
    for name in arms:
        r = med[name]
        print(f"{name:<10}{r['str']:>15.1f}{r['str'] / 50:>12.2f}{r['dict']:>16.1f}"
              f"{r['snapshot']:>12.1f}{held[name] / max(known, 1):>13.0f}")
    if "baseline" in med:
        ratios = [b / t for b, t in zip(res["baseline"]["dict"], res["this"]["dict"], strict=True)]
        print(f"monitor tick (dict) baseline/this, paired per round: median "
              f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}, max {max(ratios):.2f})")
    return 0


def _iqr(values: list[float]) -> float:
    if len(values) < 4:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
