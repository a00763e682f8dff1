"""Benchmark: wall time of every ``kresilient ... --help`` (issue 36 target: median <= 0.3 s).

Usage: .venv/bin/python benchmarks/cli_help.py [--runs 15] [--json]

Each help screen runs as a user runs it, in a new process through the installed console
script (``.venv/bin/kresilient``: interpreter start-up, ``site``, every import included).
``python -c pass`` is measured the same way as the floor no command can beat. Rounds are
interleaved and shuffled, so a shared machine's slow drifts hit every command alike; the
figure is the median (and IQR) of ``--runs`` rounds, after one discarded warm-up round.
The load average is printed with the table: figures taken while it exceeded the core count
are labelled CONTENDED. Not a test: tests/test_cli_help.py checks what --help imports,
never how long it takes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS: tuple[tuple[str, ...], ...] = (
    (),
    ("cluster",),
    ("demo",),
    ("topic",),
    ("topic", "create"),
    ("lint",),
    ("audit",),
    ("dlq",),
    ("dlq", "inspect"),
    ("dlq", "replay"),
    ("doctor",),
)
TARGET = 0.3


def _script() -> list[str]:
    here = Path(sys.executable).parent / "kresilient"
    found = str(here) if here.exists() else shutil.which("kresilient")
    return [found] if found else [sys.executable, "-m", "kresilient.cli"]


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="Rounds measured (default 15).")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    opts = parser.parse_args()
    arms: dict[str, list[str]] = {"python -c pass (floor)": [sys.executable, "-c", "pass"]}
    for command in COMMANDS:
        arms[" ".join(("kresilient", *command, "--help"))] = [*_script(), *command, "--help"]
    samples: dict[str, list[float]] = {name: [] for name in arms}
    load_before = os.getloadavg()[0]
    for round_ in range(opts.runs + 1):
        order = list(arms)
        random.shuffle(order)
        for name in order:
            seconds = _time(arms[name])
            if round_:  # round 0 warms the page cache and .pyc files: discarded
                samples[name].append(seconds)
    load_after = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    contended = max(load_before, load_after) > cores
    rows = {}
    for name, values in samples.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        rows[name] = {"median": statistics.median(values), "q1": q1, "q3": q3}
    if opts.json:
        print(json.dumps({"runs": opts.runs, "contended": contended, "rows": rows}, indent=2))
        return 0
    print(
        f"{opts.runs} interleaved runs each; load average {load_before:.1f} -> "
        f"{load_after:.1f} on {cores} cores" + (" (CONTENDED)" if contended else "")
    )
    print(f"\n| command | median s | IQR s | <= {TARGET} s |\n|---|---:|---:|---|")
    for name, row in rows.items():
        ok = "" if "floor" in name else ("yes" if row["median"] <= TARGET else "NO")
        print(f"| `{name}` | {row['median']:.3f} | {row['q1']:.3f}-{row['q3']:.3f} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
