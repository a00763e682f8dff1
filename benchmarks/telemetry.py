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

Reports, per arm, the median over rounds of wall-clock µs per message, its IQR, the median of
this thread's CPU µs per message (less disturbed by other processes on a shared machine; the
span exporter thread's CPU is not in it), and the cost each adds over ``loop``.

    .venv/bin/python benchmarks/telemetry.py [--messages 20000] [--rounds 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka as ck
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kresilient.telemetry import Telemetry

TOPIC = "bench"
VALUE = b"x" * 100
KEY = b"key-000042"
W3C = TraceContextTextMapPropagator()
# used where telemetry is off: a sampled parent, as an upstream service would send it
PARENT = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


class _DropExporter(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _sdk(ratio: float | None, *, traces: bool = True) -> tuple[Telemetry, Callable[[], None]]:
    tp = None
    if traces:
        sampler = None if ratio is None else ParentBased(TraceIdRatioBased(ratio))
        tp = TracerProvider(sampler=sampler) if sampler else TracerProvider()
        tp.add_span_processor(BatchSpanProcessor(_DropExporter(), max_queue_size=8192))
    mp = MeterProvider(metric_readers=[InMemoryMetricReader()])
    tel = Telemetry(
        tracer_provider=tp, meter_provider=mp, propagator=W3C, client_id="bench",
        consumer_group="bench-group",
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
    args = ap.parse_args(argv)

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
