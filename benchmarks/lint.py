"""Benchmark: lint 1,000 generated config files (target: under 2 s on the project machine).

Usage: .venv/bin/python benchmarks/lint.py [--files 1000] [--repeat 3]

Generates a mix of producer/consumer/topic/broker configs in every supported format
(.properties, .yaml, .json, .toml, .env, .py), then times ``lint_paths`` over the directory
in-process (best of --repeat) and once through the ``kresilient lint`` CLI (a new process,
so interpreter start-up and imports are included). Not a test: numbers go in reports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from kresilient.lint import lint_paths

PRODUCER = {
    "bootstrap.servers": "k1:9092,k2:9092",
    "acks": "all",
    "linger.ms": 20,
    "enable.idempotence": True,
    "compression.type": "zstd",
    "message.timeout.ms": 120000,
}
CONSUMER = {
    "bootstrap.servers": "k1:9092,k2:9092",
    "group.id": "orders",
    "auto.offset.reset": "earliest",
    "enable.auto.offset.store": False,
    "partition.assignment.strategy": "cooperative-sticky",
    "session.timeout.ms": 45000,
}
TOPIC = {
    "cleanup.policy": "delete",
    "retention.ms": 604800000,
    "min.insync.replicas": 2,
    "replication.factor": 3,
    "max.message.bytes": 1048588,
}
BROKER = {
    "node.id": 1,
    "process.roles": "broker,controller",
    "log.dirs": "/data",
    "default.replication.factor": 3,
    "min.insync.replicas": 2,
    "broker.rack": "a",
}


def _config(rng: random.Random, fmt: str) -> dict[str, object]:
    kinds = [PRODUCER, CONSUMER] if fmt == "py" else [PRODUCER, CONSUMER, TOPIC, BROKER]
    base = dict(rng.choice(kinds))
    if rng.random() < 0.3:  # some findings, as in real repositories
        base[
            rng.choice(["acks", "enable.idempotense", "retries", "unclean.leader.election.enable"])
        ] = rng.choice(["0", "1", "true", 0])
    return base


def _write(path: str, fmt: str, conf: dict[str, object]) -> None:
    def val(v: object) -> str:
        return str(v).lower() if isinstance(v, bool) else str(v)

    if fmt == "properties":
        text = "".join(f"{k}={val(v)}\n" for k, v in conf.items())
    elif fmt == "yaml":
        text = "kafka:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in conf.items())
    elif fmt == "json":
        text = json.dumps(conf, indent=2)
    elif fmt == "toml":
        text = "[kafka]\n" + "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in conf.items())
    elif fmt == "env":
        text = "".join(f"KAFKA_{k.upper().replace('.', '_')}={val(v)}\n" for k, v in conf.items())
    else:
        text = (
            "from confluent_kafka import Producer\n\n"
            f"CONF = {conf!r}\n\np = Producer(CONF, error_cb=print)\n"
        )
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def generate(directory: str, count: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    formats = ["properties", "yaml", "json", "toml", "env", "py"]
    for i in range(count):
        fmt = formats[i % len(formats)]
        name = f"c{i:04d}.env" if fmt == "env" else f"c{i:04d}.{fmt}"
        _write(os.path.join(directory, name), fmt, _config(rng, fmt))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, args.files)
        timings = []
        findings = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            findings = lint_paths([tmp])
            timings.append(time.perf_counter() - start)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "kresilient.lint", "--format", "json", tmp],
            capture_output=True,
            text=True,
            check=False,
        )
        cli = time.perf_counter() - start
        files = len({f.path for f in findings})
        print(f"files={args.files} findings={len(findings)} files_with_findings={files}")
        print(
            f"in-process lint_paths: best {min(timings):.3f} s, runs "
            f"{', '.join(f'{t:.3f}' for t in timings)}"
        )
        print(f"CLI (new process, imports included): {cli:.3f} s, exit code {proc.returncode}")
        print(f"target < 2 s: {'met' if max(min(timings), cli) < 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
