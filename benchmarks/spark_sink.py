"""Spark's built-in Kafka sink vs kresilient's two engines: rows/s on the same cluster and data.

Arms (``--arms``): ``builtin`` (``format("kafka")``), ``jvm`` (``kresilient.spark.write(...,
engine="jvm")``) and ``kresilient`` (the Python data source, ``engine="python"``). Every arm
writes the same cached DataFrame (``key`` = 8-byte id, ``value`` = N bytes) from the
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
    .venv/bin/python benchmarks/spark_sink.py --headers       # both arms write a headers column
    .venv/bin/python benchmarks/spark_sink.py --task-layouts --bootstrap-servers host:port

Each arm is warmed up with one full-size write of its own (JIT, producers, connections,
broker page cache and log segments) before the measured rounds, so round 0 does not run on
cold brokers. CPU per row is reported per process group from ``/proc``: the Spark JVM, its
Python workers (the pyspark daemon counts its reaped workers) and the brokers (only for a
cluster the run started itself).

``--task-layouts`` measures the kresilient Python path alone, without Spark: the executor's
``write_task`` is driven with the same Arrow batches (plain, with a ``headers`` column, with a
``timestamp`` column) and the process CPU time and the task thread's CPU time per row are
reported (interleaved rounds after a full-size warm-up round): the cost of each column layout.
Beside it, raw confluent-kafka's ``produce()`` with the same two headers against without
(calling-thread CPU, enqueue only): the part of the ``headers`` layout's cost that is the
client's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


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


def _frame(spark: Any, rows: int, size: int, partitions: int, headers: bool = False) -> Any:
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
    if headers:  # two headers per row, as a tracing or routing layer would add
        df = df.withColumn(
            "headers",
            F.array(
                F.struct(F.lit("source").alias("key"), F.lit(b"spark").alias("value")),
                F.struct(
                    F.lit("id").alias("key"),
                    F.expr("substring(key, 1, 8)").alias("value"),
                ),
            ),
        )
    df = df.cache()
    df.count()
    return df


def _write(df: Any, arm: str, bootstrap: str, topic: str, settings: dict[str, str]) -> float:
    """One write of ``df`` by ``arm``: ``builtin`` (format("kafka")), ``jvm``
    (kresilient.spark.write(engine="jvm")) or ``kresilient`` (the Python data source)."""
    began = time.perf_counter()
    if arm == "jvm":
        from kresilient.spark import write

        write(df, topic=topic, bootstrap_servers=bootstrap, engine="jvm",
              dead_letter_topic=f"{topic}.dlq", options=settings)  # fmt: skip
        return time.perf_counter() - began
    fmt = "kafka" if arm == "builtin" else "kresilient"
    w = df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    for key, value in settings.items():
        w = w.option(f"kafka.{key}", value)
    if arm == "kresilient":
        w = w.option("deadLetterTopic", f"{topic}.dlq")
    began = time.perf_counter()
    w.mode("append").save()
    return time.perf_counter() - began


def _proc_cpu(pid: int, *, children: bool) -> float:
    """CPU seconds of ``pid`` (with its reaped children's when ``children``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _cpu_groups(spark: Any, broker_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far per process group: the Spark JVM, its Python workers, the brokers.

    Python workers are forked by pyspark's daemon: the daemon's count includes its reaped
    children (workers that exited)."""
    jvm = spark.sparkContext._gateway.proc.pid
    python = 0.0
    for p in _descendants(jvm):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"python" in cmd:
            python += _proc_cpu(p, children=b"pyspark.daemon" in cmd)
    return {
        "spark_jvm": _proc_cpu(jvm, children=False),
        "python_workers": python,
        "brokers": sum(_proc_cpu(p, children=True) for p in broker_pids),
    }


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
    from kresilient.spark.connector import connector_jars

    # the installed pyspark's, or $KRESILIENT_SPARK_CONNECTOR_VERSION's (4.3.0's is unpublished)
    jars = connector_jars()
    settings = {
        "acks": "all",
        "enable.idempotence": "true",
        "linger.ms": str(args.linger_ms),
        "batch.size": str(args.batch_size),
        "compression.type": args.compression,
    }
    if args.untuned:  # each client's defaults (only the safety settings)
        settings = {"acks": "all", "enable.idempotence": "true"}
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
        # Broker CPU only for a cluster this run started (an existing one's pids are unknown).
        brokers = list(cluster.pids().values()) if args.bootstrap_servers is None else []
        for size in args.sizes:
            df = _frame(spark, args.rows, size, args.cores, args.headers)
            arms = tuple(args.arms)
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            cpu: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
            for arm in arms:  # warm-up at full size, per arm
                warm = f"bench-warm-{arm}-{uuid.uuid4().hex[:6]}"
                cluster.create_topic(warm, args.partitions, 3, {"min.insync.replicas": 2})
                if arm == "jvm":
                    cluster.create_topic(f"{warm}.dlq", 1, 3, {"min.insync.replicas": 2})
                _write(df, arm, bs, warm, settings)
                cluster.delete_topic(warm)
            for r in range(args.rounds):
                order = arms if r % 2 == 0 else tuple(reversed(arms))
                for arm in order:
                    topic = f"bench-{size}-{arm}-{r}-{uuid.uuid4().hex[:6]}"
                    cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
                    if arm == "jvm":
                        cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})
                    cpu_before = _cpu_groups(spark, brokers)
                    seconds = _write(df, arm, bs, topic, settings)
                    cpu_after = _cpu_groups(spark, brokers)
                    cpu[arm].append(
                        {g: (cpu_after[g] - cpu_before[g]) / args.rows * 1e6 for g in cpu_after}
                    )
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
            entry: dict[str, Any] = dict(per_arm)
            for arm in arms:
                entry[arm]["cpu_us_per_row_median"] = {
                    g: statistics.median(c[g] for c in cpu[arm]) for g in cpu[arm][0]
                }
                if arm != "builtin" and "builtin" in arms:
                    # throughput ratio arm / builtin, paired per round
                    ratios = [b / k for b, k in zip(times["builtin"], times[arm], strict=True)]
                    entry[f"{arm}_vs_builtin"] = {
                        "median": statistics.median(ratios),
                        "min": min(ratios),
                        "max": max(ratios),
                    }
            results["sizes"][str(size)] = entry
        spark.stop()
    results["load_after"] = os.getloadavg()
    contended = max(results["load_before"][0], results["load_after"][0]) > args.cores * 0.75
    results["contended"] = contended
    return results


def _task_batches(rows: int, size: int, layout: str) -> list[Any]:
    import pyarrow as pa

    out = []
    per = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch
    for start in range(0, rows, per):
        ids = range(start, min(rows, start + per))
        cols = [
            pa.array([i.to_bytes(8, "big") for i in ids], pa.binary()),
            pa.array([(b"%064x" % i) * (size // 64 + 1) for i in ids], pa.binary()),
        ]
        names = ["key", "value"]
        if layout == "headers":
            htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
            cols.append(
                pa.array(
                    [
                        [{"key": "source", "value": b"spark"}, {"key": "id", "value": b"%d" % i}]
                        for i in ids
                    ],
                    htype,
                )
            )
            names.append("headers")
        elif layout == "timestamp":
            cols.append(pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us")))
            names.append("timestamp")
        out.append(pa.RecordBatch.from_arrays(cols, names))
    return out


def raw_header_ratio(rows: int, size: int, rounds: int) -> list[float]:
    """The yardstick for the ``headers`` layout: raw confluent-kafka's ``produce()`` with the
    same two headers against without, calling-thread CPU per paired round (nothing listens, so
    this is the enqueue alone: what ``produce()`` itself costs the task thread)."""
    import confluent_kafka as ck

    producer = ck.Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",  # nothing listens: pure enqueue cost
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
            "message.timeout.ms": 600_000,
            "log_level": 0,
        }
    )
    keys = [i.to_bytes(8, "big") for i in range(rows)]
    values = [b"%0*d" % (size, i) for i in range(rows)]

    def one(headers: bool) -> float:
        began = time.thread_time()
        if headers:
            for k, v in zip(keys, values, strict=True):
                producer.produce("t", v, k, headers=[("source", b"spark"), ("id", k)])
        else:
            for k, v in zip(keys, values, strict=True):
                producer.produce("t", v, k)
        used = time.thread_time() - began
        producer.purge()
        producer.poll(0)
        return used

    one(False), one(True)  # warm-up
    ratios = []
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)  # interleaved
        cost = {headers: one(headers) for headers in order}
        ratios.append(cost[True] / cost[False])
    return ratios


def run_task_layouts(args: argparse.Namespace) -> dict[str, Any]:
    """CPU time per row of the Python path (``write_task``) for each column layout."""
    from kresilient.spark._options import column_layout, parse_options
    from kresilient.spark._task import TaskInfo
    from kresilient.spark._write import discard_producers, sink_producer_config, write_task

    types = {"headers": "array<struct<key:string,value:binary>>", "timestamp": "timestamp"}
    layouts = ("plain", "headers", "timestamp")
    results: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds, "sizes": {}}
    with _cluster(args.bootstrap_servers) as cluster:
        for size in args.sizes:
            batches = {name: _task_batches(args.rows, size, name) for name in layouts}
            cpu: dict[str, list[float]] = {name: [] for name in layouts}
            thread: dict[str, list[float]] = {name: [] for name in layouts}
            for r in range(args.rounds + 1):  # round 0: full-size warm-up, not counted
                order = layouts if r % 2 == 0 else tuple(reversed(layouts))
                for name in order:
                    topic = f"bench-task-{name}-{r}-{uuid.uuid4().hex[:6]}"
                    cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
                    opts = parse_options(
                        {
                            "kafka.bootstrap.servers": cluster.bootstrap_servers,
                            "topic": topic,
                            "kafka.linger.ms": str(args.linger_ms),
                            "kafka.batch.size": str(args.batch_size),
                            "kafka.compression.type": args.compression,
                        }
                    )
                    fields = [("key", "binary"), ("value", "binary")]
                    if name != "plain":
                        fields.append((name, types[name]))
                    layout = column_layout(fields, topic_option=topic)
                    began, began_thread = time.process_time(), time.thread_time()
                    write_task(
                        opts,
                        layout,
                        iter(batches[name]),
                        config=sink_producer_config(opts),
                        context=lambda: TaskInfo(partition_id=0, attempt=0),
                    )
                    used = time.process_time() - began
                    used_thread = time.thread_time() - began_thread
                    discard_producers()
                    cluster.delete_topic(topic)
                    if r > 0:
                        cpu[name].append(used / args.rows * 1e6)
                        thread[name].append(used_thread / args.rows * 1e6)
                    print(
                        f"size={size}B round={r} {name:9s} process {used / args.rows * 1e6:6.2f} "
                        f"task thread {used_thread / args.rows * 1e6:6.2f} us/row"
                    )
            med = {name: statistics.median(v) for name, v in cpu.items()}
            med_thread = {name: statistics.median(v) for name, v in thread.items()}
            raw = sorted(raw_header_ratio(args.rows, size, max(args.rounds, 5)))
            print(
                f"size={size}B raw confluent-kafka produce(), 2 headers / none, calling thread: "
                f"median {statistics.median(raw):.2f} [{raw[0]:.2f}-{raw[-1]:.2f}]"
            )
            results["sizes"][str(size)] = {
                "raw_thread_headers_vs_plain": raw,
                "cpu_us_per_row": cpu,
                "median_us_per_row": med,
                "thread_us_per_row": thread,
                "median_thread_us_per_row": med_thread,
                "thread_headers_vs_plain": [
                    h / p for h, p in zip(thread["headers"], thread["plain"], strict=True)
                ],
                "thread_timestamp_vs_plain": [
                    t / p for t, p in zip(thread["timestamp"], thread["plain"], strict=True)
                ],
                "headers_vs_plain": [
                    h / p for h, p in zip(cpu["headers"], cpu["plain"], strict=True)
                ],
                "timestamp_vs_plain": [
                    t / p for t, p in zip(cpu["timestamp"], cpu["plain"], strict=True)
                ],
            }
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
    p.add_argument("--untuned", action="store_true", help="no linger/batch/compression settings")
    p.add_argument(
        "--arms",
        nargs="+",
        default=["builtin", "jvm", "kresilient"],
        choices=["builtin", "jvm", "kresilient"],
        help="what to compare (kresilient = engine='python', the data source)",
    )
    p.add_argument("--headers", action="store_true", help="both arms write a headers column")
    p.add_argument(
        "--task-layouts",
        action="store_true",
        help="CPU per row of kresilient's write_task alone (no Spark): plain/headers/timestamp",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 200_000, 2
    if args.task_layouts:
        results = run_task_layouts(args)
        for size, r in results["sizes"].items():
            for label, key, ratio in (
                ("process CPU", "median_us_per_row", ""),
                ("task thread", "median_thread_us_per_row", "thread_"),
            ):
                m = r[key]
                hx = statistics.median(r[ratio + "headers_vs_plain"])
                print(
                    f"{size:>5} B {label} us/row: plain {m['plain']:.2f}, headers "
                    f"{m['headers']:.2f} ({hx:.2f}x), "
                    f"timestamp {m['timestamp']:.2f} "
                    f"({statistics.median(r[ratio + 'timestamp_vs_plain']):.2f}x)"
                )
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    results = run(args)
    label = " (CONTENDED: machine load was high, figures are indicative)" * results["contended"]
    print(f"\nSpark sink benchmark, {args.rows} rows, local[{args.cores}]{label}")
    print(f"load average before/after: {results['load_before']} / {results['load_after']}")
    for size, r in results["sizes"].items():
        for arm in args.arms:
            a = r[arm]
            cpu = ", ".join(f"{g} {v:.2f}" for g, v in a["cpu_us_per_row_median"].items())
            ratio = r.get(f"{arm}_vs_builtin")
            shown = (
                f"  {ratio['median']:.2f}x builtin [{ratio['min']:.2f}..{ratio['max']:.2f}]"
                if ratio
                else ""
            )
            print(
                f"{size:>5} B {arm:10s} {a['rows_per_s_median']:9.0f} rows/s "
                f"[{a['rows_per_s_min']:.0f}..{a['rows_per_s_max']:.0f}]{shown}  "
                f"CPU us/row: {cpu}"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
