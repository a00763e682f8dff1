"""Shared helpers for kresilient's benchmarks: fair, interleaved, paired comparisons.

How a comparison is run (performance-anchors B7):

* every arm does the same work on the same inputs; a fresh topic per arm and round;
* one warm-up round per arm is discarded (metadata, connections, JIT-free but cache-warm);
* rounds are interleaved and the arm order is shuffled inside each round, so slow drifts of
  a shared machine hit every arm alike;
* the headline figure is the **paired per-round ratio** (arm / baseline of the same round),
  reported as median and IQR, not a ratio of medians;
* CPU cost is ``time.process_time()`` (all threads of this process, librdkafka's included)
  per message; RSS is this process's peak;
* the load average is sampled before and after: figures taken while it exceeded the core
  count are labelled CONTENDED.

Example::

    samples = run_interleaved({"raw": run_raw, "kresilient": run_wrapped}, rounds=10)
    print(markdown_table(samples, baseline="raw", title="100 B"))
"""

from __future__ import annotations

import gc
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Sample",
    "Timer",
    "contention",
    "environment",
    "iqr",
    "markdown_table",
    "median_iqr",
    "paired_ratios",
    "peak_rss_mib",
    "run_child",
    "run_interleaved",
]


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One arm's run in one round."""

    arm: str
    round: int
    messages: int
    wall_s: float
    cpu_s: float
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages per second (wall clock)."""
        return self.messages / self.wall_s if self.wall_s > 0 else float("inf")

    @property
    def gc_us_per_msg(self) -> float:
        """Microseconds spent in garbage collection per message (``extra["gc_s"]``)."""
        gc_s = float(self.extra.get("gc_s", float("nan")))
        return gc_s / self.messages * 1e6 if self.messages else float("nan")

    @property
    def cpu_us_per_msg(self) -> float:
        """CPU microseconds of this process per message."""
        return self.cpu_s / self.messages * 1e6 if self.messages else float("nan")


class Timer:
    """Wall, process CPU and garbage-collector time of a block.

    ``with Timer() as t: ...`` then ``t.wall_s``, ``t.cpu_s``, ``t.thread_s`` (CPU of the
    thread that ran the block alone: a Python client's own work, without librdkafka's threads),
    ``t.gc_s`` (time inside ``gc`` collections, measured with ``gc.callbacks``) and
    ``t.gc_collections``.
    """

    wall_s: float = 0.0
    cpu_s: float = 0.0
    thread_s: float = 0.0
    gc_s: float = 0.0
    gc_collections: int = 0

    def _on_gc(self, phase: str, _info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_began
            self.gc_collections += 1

    def __enter__(self) -> Timer:
        gc.callbacks.append(self._on_gc)
        self._wall = time.perf_counter()
        self._cpu = time.process_time()
        self._thread = time.thread_time()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu
        self.thread_s = time.thread_time() - self._thread
        gc.callbacks.remove(self._on_gc)


def median_iqr(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile); quartiles equal the median for < 2 values."""
    if not values:
        return (float("nan"),) * 3
    med = statistics.median(values)
    if len(values) < 2:
        return med, med, med
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return med, q1, q3


def iqr(values: Sequence[float]) -> float:
    """Interquartile range."""
    _, q1, q3 = median_iqr(values)
    return q3 - q1


def paired_ratios(samples: Iterable[Sample], arm: str, baseline: str) -> list[float]:
    """arm rate / baseline rate, for every round where both ran."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s
    return [
        r[arm].rate / r[baseline].rate
        for _, r in sorted(by_round.items())
        if arm in r and baseline in r and r[baseline].rate > 0
    ]


def run_interleaved(
    arms: Mapping[str, Callable[[int], Sample]],
    *,
    rounds: int,
    warmup: int = 1,
    seed: int | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """Run every arm ``warmup + rounds`` times, shuffled inside each round.

    Each arm callable receives the round number (negative for warm-up rounds) and returns its
    :class:`Sample`. Warm-up samples are dropped.
    """
    rng = random.Random(seed)
    out: list[Sample] = []
    for r in range(-warmup, rounds):
        order = list(arms)
        rng.shuffle(order)
        for name in order:
            sample = arms[name](r)
            if on_sample is not None:
                on_sample(sample)
            if r >= 0:
                out.append(sample)
    return out


def peak_rss_mib() -> float:
    """Peak resident set size of this process, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def contention(load_before: float, load_after: float) -> str:
    """``"quiet"`` or ``"CONTENDED (load ...)"`` against the number of cores."""
    cores = os.cpu_count() or 1
    worst = max(load_before, load_after)
    if worst > cores:
        return f"CONTENDED (1-min load {load_before:.1f} -> {load_after:.1f} on {cores} cores)"
    return f"quiet (1-min load {load_before:.1f} -> {load_after:.1f} on {cores} cores)"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _first(version: object) -> str:
    # confluent_kafka.version() is a str in 2.16, a (str, int) tuple in older releases
    return str(version[0] if isinstance(version, tuple) else version)


def environment(**extra: Any) -> dict[str, Any]:
    """Versions and machine facts to print beside the figures."""
    import confluent_kafka

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "confluent_kafka": _first(confluent_kafka.version()),
        "librdkafka": _first(confluent_kafka.libversion()),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        import kresilient

        info["kresilient"] = kresilient.__version__
    except ImportError:  # pragma: no cover
        pass
    info.update(extra)
    return info


def markdown_table(
    samples: Sequence[Sample], *, baseline: str, title: str = "", arms: Sequence[str] = ()
) -> str:
    """Per-arm msgs/s (median [IQR]), CPU µs/msg and the paired ratio to ``baseline``."""
    names = list(arms) or sorted({s.arm for s in samples}, key=lambda a: (a != baseline, a))
    lines = []
    if title:
        lines.append(f"**{title}**\n")
    lines.append(
        "| arm | rounds | msgs/s median [IQR] | CPU µs/msg median | of which GC µs/msg | "
        f"ratio vs {baseline} (paired) median [IQR] |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|")
    for name in names:
        mine = [s for s in samples if s.arm == name]
        if not mine:
            continue
        rate, r1, r3 = median_iqr([s.rate for s in mine])
        cpu = statistics.median(s.cpu_us_per_msg for s in mine)
        gc_values = [s.gc_us_per_msg for s in mine if "gc_s" in s.extra]
        gcs = f"{statistics.median(gc_values):.2f}" if gc_values else "-"
        if name == baseline:
            ratio = "1 (baseline)"
        else:
            m, q1, q3 = median_iqr(paired_ratios(samples, name, baseline))
            ratio = f"{m:.3f} [{q1:.3f}-{q3:.3f}]"
        lines.append(
            f"| {name} | {len(mine)} | {rate:,.0f} [{r1:,.0f}-{r3:,.0f}] | {cpu:.2f} | "
            f"{gcs} | {ratio} |"
        )
    return "\n".join(lines)


def run_child(script: str, tree: str | os.PathLike[str], args: Sequence[str]) -> dict[str, Any]:
    """Run ``script --child ARGS`` in a fresh interpreter importing kresilient from ``tree``.

    The layout-regression arms (``kresilient_sub`` / ``kresilient_old``): ``tree`` goes first
    on ``PYTHONPATH`` (ahead of the editable install) and is the working directory; the child
    times itself and prints one JSON object as its last line of stdout, which is returned.
    Interpreter start and imports are outside the child's timer. If that object has a
    ``"kresilient"`` key (``kresilient.__file__`` in the child), it must lie inside ``tree``.
    """
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, script, "--child", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=str(tree),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child arm failed ({tree}):\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    imported = result.get("kresilient")
    if imported is not None and not Path(imported).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"child arm imported kresilient from {imported}, not from {tree}")
    return result


def precommit_clean(bootstrap: str, group: str, topic: str, partitions: int) -> None:
    """Commit *group* at offset 0 of every partition of *topic* with kresilient's clean-end
    marker (what a consumer that stopped cleanly leaves): a consumer arm then starts as from a
    restart, without the crash-loop guard's first-start commits (one synchronous commit per
    never-committed partition, once in a group's life). Arms other than kresilient ignore the
    metadata and start from offset 0."""
    from confluent_kafka import Consumer, TopicPartition

    # here, not at the top: a --child of an --old-tree checkout imports this file too
    from kresilient.consumer._crashloop import CLEAN

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(topic, p, 0, metadata=CLEAN) for p in range(partitions)]
        for part in consumer.commit(offsets=parts, asynchronous=False) or []:
            if part.error is not None:
                raise RuntimeError(f"pre-commit of {group} failed: {part.error}")
    finally:
        consumer.close()
