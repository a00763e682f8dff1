"""Spark's built-in Kafka sink vs the ``kresilient`` sink: rows/s on the same cluster and data.

Both arms write the same cached DataFrame (``key`` = 8-byte id, ``value`` = N bytes) from the
same ``local[2]`` SparkSession to fresh topics of the same shape on the same 3-node cluster, with
the same producer settings (acks=all, idempotence, linger.ms, batch.size, compression). Rounds
are interleaved (the order alternates each round) so drift on a shared machine hits both arms.
Every written topic is checked afterwards: its high watermarks must add up to the row count.

The built-in sink is ``spark-sql-kafka-0-10_2.13`` of the installed Spark version, resolved once
through Maven (``kresilient/_data/spark-kafka-pom.xml``) into the user cache dir and handed to
Spark with ``spark.jars``.

Run::

    .venv/bin/python benchmarks/spark_sink.py                 # 2M rows x {100 B, 1 KiB}, 3 rounds
    .venv/bin/python benchmarks/spark_sink.py --quick         # 200k rows, 2 rounds
    .venv/bin/python benchmarks/spark_sink.py --bootstrap-servers host:port  # existing cluster
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

_CONNECTOR_PREFIXES = (
    "spark-sql-kafka-0-10",
    "spark-token-provider-kafka-0-10",
    "kafka-clients",
    "commons-pool2",
)
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


def connector_jars(spark_version: str) -> list[str]:
    """The built-in Kafka connector's jars for ``spark_version`` (resolved once, then cached).

    Only jars Spark does not already ship are returned (the rest are ``provided``).
    """
    from kresilient.testing._broker_jars import cache_root

    target = cache_root() / "spark-kafka" / spark_version
    marker = target / ".complete"
    if not marker.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.exists():
                _resolve_connector(spark_version, target)
    return sorted(str(p) for p in target.glob("*.jar") if p.name.startswith(_CONNECTOR_PREFIXES))


def _resolve_connector(spark_version: str, target: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SystemExit("Maven ('mvn') is needed once to fetch spark-sql-kafka-0-10")
    staging = Path(tempfile.mkdtemp(prefix="spark-kafka-", dir=target.parent))
    try:
        pom = staging / "pom.xml"
        pom.write_bytes(
            resources.files("kresilient").joinpath("_data/spark-kafka-pom.xml").read_bytes()
        )
        cmd = [
            mvn, "-B", "-q", "-f", str(pom), f"-Dspark.version={spark_version}",
            f"{_DEPENDENCY_PLUGIN}:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / 'jars'}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(
                f"Maven could not resolve spark-sql-kafka-0-10_2.13:{spark_version}:\n"
                + (proc.stdout + proc.stderr)[-3000:]
            )
        (staging / "jars" / ".complete").write_text(spark_version)
        if target.exists():
            shutil.rmtree(target)
        (staging / "jars").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _cluster(bootstrap: str | None) -> Iterator[Any]:
    from kresilient.testing import KafkaCluster

    with KafkaCluster(bootstrap_servers=bootstrap) as cluster:
        yield cluster


def _spark(jars: list[str], cores: int) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName("kresilient-spark-sink-benchmark")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", ",".join(jars))
        .config("spark.driver.memory", "6g")
        .config("spark.sql.shuffle.partitions", str(cores))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _frame(spark: Any, rows: int, size: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    # Values: `size` bytes of distinct hex digests (sha256 of "<id>-<i>"): no repeats, so lz4
    # gains little and both producers move the same bytes (the Java client sizes batches
    # after compression, librdkafka before: highly compressible data would favour Java's).
    reps = size // 64 + 1
    digests = f"transform(sequence(0, {reps - 1}), i -> sha2(concat(cast(id AS STRING), '-', "
    digests += "cast(i AS STRING)), 256))"
    df = spark.range(rows, numPartitions=partitions).select(
        F.expr("unhex(lpad(hex(id), 16, '0'))").alias("key"),
        F.expr(f"substring(concat_ws('', {digests}), 1, {size})").cast("binary").alias("value"),
    )
    df = df.cache()
    df.count()
    return df


def _write(df: Any, arm: str, bootstrap: str, topic: str, settings: dict[str, str]) -> float:
    fmt = "kafka" if arm == "builtin" else "kresilient"
    w = df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for key, value in settings.items():
        w = w.option(f"kafka.{key}", value)
    if arm == "kresilient":
        w = w.option("deadLetterTopic", f"{topic}.dlq")
    began = time.perf_counter()
    w.mode("append").save()
    return time.perf_counter() - began


def _count(cluster: Any, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": "bench-count"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        total = 0
        for p in parts:
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += hi - lo
        return total
    finally:
        c.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    import pyspark

    from kresilient.spark import register

    jars = connector_jars(pyspark.__version__)
    settings = {
        "acks": "all",
        "enable.idempotence": "true",
        "linger.ms": str(args.linger_ms),
        "batch.size": str(args.batch_size),
        "compression.type": args.compression,
    }
    results: dict[str, Any] = {
        "pyspark": pyspark.__version__,
        "rows": args.rows,
        "rounds": args.rounds,
        "cores": args.cores,
        "settings": settings,
        "load_before": os.getloadavg(),
        "sizes": {},
    }
    with _cluster(args.bootstrap_servers) as cluster:
        spark = _spark(jars, args.cores)
        register(spark)
        bs = cluster.bootstrap_servers
        for size in args.sizes:
            df = _frame(spark, args.rows, size, args.cores)
            times: dict[str, list[float]] = {"builtin": [], "kresilient": []}
            for arm in ("builtin", "kresilient"):  # warm-up: JIT, producers, connections
                warm = f"bench-warm-{arm}-{uuid.uuid4().hex[:6]}"
                cluster.create_topic(warm, args.partitions, 3, {"min.insync.replicas": 2})
                _write(df.limit(20000), arm, bs, warm, settings)
                cluster.delete_topic(warm)
            for r in range(args.rounds):
                order = ("builtin", "kresilient") if r % 2 == 0 else ("kresilient", "builtin")
                for arm in order:
                    topic = f"bench-{size}-{arm}-{r}-{uuid.uuid4().hex[:6]}"
                    cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
                    seconds = _write(df, arm, bs, topic, settings)
                    got = _count(cluster, topic)
                    cluster.delete_topic(topic)  # GBs per round: keep the disk free
                    if got < args.rows:
                        raise SystemExit(f"{arm} lost rows: {got} < {args.rows} in {topic}")
                    times[arm].append(seconds)
                    print(
                        f"size={size}B round={r} {arm:10s} {seconds:7.2f}s "
                        f"{args.rows / seconds:10.0f} rows/s (topic holds {got})",
                        flush=True,
                    )
            df.unpersist()
            per_arm = {
                arm: {
                    "rows_per_s_median": args.rows / statistics.median(ts),
                    "rows_per_s_min": args.rows / max(ts),
                    "rows_per_s_max": args.rows / min(ts),
                    "seconds": ts,
                }
                for arm, ts in times.items()
            }
            ratios = [b / k for b, k in zip(times["builtin"], times["kresilient"], strict=True)]
            results["sizes"][str(size)] = {
                **per_arm,
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        spark.stop()
    results["load_after"] = os.getloadavg()
    contended = max(results["load_before"][0], results["load_after"][0]) > args.cores * 0.75
    results["contended"] = contended
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 1024])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cores", type=int, default=2, help="local[N] and DataFrame partitions")
    p.add_argument("--partitions", type=int, default=2, help="partitions of each topic")
    p.add_argument("--linger-ms", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=262144)
    p.add_argument("--compression", default="lz4")
    p.add_argument("--bootstrap-servers", default=None, help="use this cluster (default: start)")
    p.add_argument("--quick", action="store_true", help="200k rows, 2 rounds")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 200_000, 2
    results = run(args)
    label = " (CONTENDED: machine load was high, figures are indicative)" * results["contended"]
    print(f"\nSpark sink benchmark, {args.rows} rows, local[{args.cores}]{label}")
    print(f"load average before/after: {results['load_before']} / {results['load_after']}")
    for size, r in results["sizes"].items():
        print(
            f"{size:>5} B: builtin {r['builtin']['rows_per_s_median']:9.0f} rows/s "
            f"[{r['builtin']['rows_per_s_min']:.0f}..{r['builtin']['rows_per_s_max']:.0f}]  "
            f"kresilient {r['kresilient']['rows_per_s_median']:9.0f} rows/s "
            f"[{r['kresilient']['rows_per_s_min']:.0f}..{r['kresilient']['rows_per_s_max']:.0f}]  "
            f"ratio {r['ratio_median']:.2f}x [{r['ratio_min']:.2f}..{r['ratio_max']:.2f}]"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
