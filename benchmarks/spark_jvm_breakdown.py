"""Where does ``engine="jvm"`` cost more than the built-in sink? Arms interleaved, paired ratios.

An experiment beside ``benchmarks/spark_sink.py`` (the product benchmark). Arms:

* ``builtin-v1`` / ``builtin-v2``: ``format("kafka")`` on Spark's V1 (default) or V2 write path
  (``engine="jvm"`` writes on V2: the path that reports observed metrics);
* ``jvm``: ``kresilient.spark.write(engine="jvm")``;
* ``jvm-rev``: ``engine="jvm"`` as it was at the commit ``REV`` (its
  ``kresilient/spark/_jvm.py``, read with ``git show``): before/after in the same run;
* ``noop-plain`` / ``noop-jvm``: the same DataFrame, and the same ``engine="jvm"`` plan
  (routing projection + observed counts), written into Spark's ``noop`` sink: the plan's own
  JVM cost per row, without a producer or brokers.

Prints rows/s and the Spark JVM's CPU per row, and each arm's paired ratio to ``builtin-v1``::

    ROWS=4000000 ROUNDS=7 .venv/bin/python -P benchmarks/spark_jvm_breakdown.py
    REV=7a55e7e ARMS=builtin-v1,jvm-rev,jvm ROWS=4000000 ROUNDS=9 .venv/bin/python -P \
        benchmarks/spark_jvm_breakdown.py
    SHAPE=renamed ARMS=builtin-v1,jvm ROWS=4000000 ROUNDS=9 .venv/bin/python -P \\
        benchmarks/spark_jvm_breakdown.py
    ROWS=4000000 ROUNDS=7 HEADERS=1 ARMS=noop-plain,noop-jvm .venv/bin/python -P \\
        benchmarks/spark_jvm_breakdown.py
"""

import contextlib
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyspark.sql.readwriter as readwriter
import spark_sink as sb

from kresilient.spark import write
from kresilient.spark.connector import connector_jars

rows = int(os.environ.get("ROWS", "1000000"))
size = int(os.environ.get("SIZE", "100"))
rounds = int(os.environ.get("ROUNDS", "3"))
headers = os.environ.get("HEADERS") == "1"
#: ``cached``: every arm writes the cached DataFrame itself (the sink's cost alone);
#: ``renamed``: a projection renaming the cached columns comes last, as a job's final
#: ``select`` building ``key``/``value`` does (``engine="jvm"``'s routing then merges into it).
shape = os.environ.get("SHAPE", "cached")
settings = {
    "linger.ms": "5",
    "batch.size": "262144",
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": "true",
}


@contextlib.contextmanager
def _kafka_into_noop() -> Iterator[None]:
    """``format("kafka")`` writes into ``noop`` for the duration."""
    original = readwriter.DataFrameWriter.format

    def fmt(self: Any, source: str) -> Any:
        return original(self, "noop" if source == "kafka" else source)

    readwriter.DataFrameWriter.format = fmt  # type: ignore[method-assign]
    try:
        yield
    finally:
        readwriter.DataFrameWriter.format = original  # type: ignore[method-assign]


def builtin(df: Any, boot: str, topic: str, v2: bool) -> None:
    conf = df.sparkSession.conf
    if v2:
        conf.set("spark.sql.sources.useV1SourceList", "avro,csv,json,orc,parquet,text")
    try:
        w = df.write.format("kafka").option("kafka.bootstrap.servers", boot).option("topic", topic)
        for k, v in settings.items():
            w = w.option(f"kafka.{k}", v)
        w.mode("append").save()
    finally:
        conf.unset("spark.sql.sources.useV1SourceList")


def jvm(df: Any, boot: str, topic: str) -> None:
    summary = write(df, topic=topic, bootstrap_servers=boot, engine="jvm",
                    dead_letter_topic=f"{topic}.dlq", options=settings)  # fmt: skip
    assert summary.rows == rows and summary.written == rows, summary


def _module_at(rev: str) -> Any:
    """``kresilient/spark/_jvm.py`` as it was at commit ``rev``, loaded as a module."""
    import subprocess
    import types

    source = subprocess.run(
        ["git", "show", f"{rev}:kresilient/spark/_jvm.py"],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    module = types.ModuleType(f"_jvm_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{rev}:kresilient/spark/_jvm.py", "exec"), module.__dict__)
    return module


def jvm_rev(df: Any, boot: str, topic: str) -> None:
    old = _module_at(os.environ["REV"])
    summary = old.write_jvm(df, topic=topic, topics=None, dead_letter_topic=f"{topic}.dlq",
                            producer={"bootstrap.servers": boot, **settings})  # fmt: skip
    assert summary.rows == rows and summary.written == rows, summary


def noop_jvm(df: Any, boot: str, topic: str) -> None:
    with _kafka_into_noop():
        jvm(df, boot, topic)


ARMS = {
    "builtin-v1": lambda df, b, t: builtin(df, b, t, False),
    "builtin-v2": lambda df, b, t: builtin(df, b, t, True),
    "jvm": jvm,
    "jvm-rev": jvm_rev,
    "noop-plain": lambda df, b, t: df.write.format("noop").mode("append").save(),
    "noop-jvm": noop_jvm,
}
only = os.environ.get("ARMS")
if only:
    ARMS = {k: v for k, v in ARMS.items() if k in only.split(",")}

with sb._cluster(os.environ.get("BOOT")) as cluster:
    boot = cluster.bootstrap_servers
    spark = sb._spark(connector_jars(), 2)
    df = sb._frame(spark, rows, size, 2, headers=headers)
    if shape == "renamed":
        # A second cache of the same rows (unpersisting the first would make Spark rebuild
        # this one from the first's plan: the digests again on every write).
        cached = df.toDF(*(f"_src_{c}" for c in df.columns)).cache()
        cached.count()
        df = cached.select(*(cached[f"_src_{c}"].alias(c) for c in df.columns))
    elif shape != "cached":
        raise SystemExit(f"SHAPE={shape!r}: use cached or renamed")
    jpid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    res: dict[str, list[tuple[float, float]]] = {a: [] for a in ARMS}

    def one(arm: str) -> tuple[float, float]:
        topic = f"x-{arm}-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 2, 3, {"min.insync.replicas": 2})
        cluster.create_topic(topic + ".dlq", 1, 3, {"min.insync.replicas": 2})
        t = time.perf_counter()
        jcpu0 = sb._proc_cpu(jpid, children=False)
        ARMS[arm](df, boot, topic)
        el = time.perf_counter() - t
        jcpu = sb._proc_cpu(jpid, children=False) - jcpu0
        cluster.delete_topic(topic)
        cluster.delete_topic(topic + ".dlq")
        return el, jcpu

    for arm in ARMS:  # warm-up, full size
        one(arm)
    order = list(ARMS)
    for r in range(rounds):
        for arm in order if r % 2 == 0 else order[::-1]:
            el, jcpu = one(arm)
            res[arm].append((el, jcpu))
            print(
                f"round {r} {arm:12s} {rows / el:12,.0f} rows/s  "
                f"jvm cpu {jcpu / rows * 1e6:6.3f} us/row",
                flush=True,
            )
    base = res.get("builtin-v1") or res.get("noop-plain")
    print(f"\nrows={rows} size={size} headers={headers} shape={shape} rounds={rounds} "
          f"load={os.getloadavg()}")  # fmt: skip
    print("| arm | rows/s median | Spark JVM CPU µs/row | vs first (paired) median [min..max] |")
    for arm, xs in res.items():
        rate = statistics.median(rows / e for e, _ in xs)
        cpu = statistics.median(j / rows * 1e6 for _, j in xs)
        rr = sorted(b[0] / e for (e, _), b in zip(xs, base, strict=True)) if base else [1.0]
        print(f"| {arm} | {rate:,.0f} | {cpu:.3f} | "
              f"{statistics.median(rr):.3f} [{rr[0]:.3f}..{rr[-1]:.3f}] |")  # fmt: skip
    spark.stop()
