"""Where does ``engine="jvm"`` lose against the built-in sink? Arms interleaved, paired ratios.

An experiment, not a product benchmark: it needs ``kresilient/spark/_jvm.py`` with the knobs of
``spark_jvm_breakdown.patch`` (KR_OBS=full|count|none: the observed aggregates; KR_V2=1|0: the
V2 or V1 write path; KR_SINK=noop). Run it on a patched worktree::

    git worktree add /tmp/kr-breakdown HEAD
    git -C /tmp/kr-breakdown apply "$PWD/benchmarks/spark_jvm_breakdown.patch"
    ROWS=4000000 ROUNDS=5 ARMS=builtin-v1,builtin-v2,jvm-full-v2,jvm-count-v2,jvm-none-v1 \
        PYTHONPATH=/tmp/kr-breakdown .venv/bin/python -P benchmarks/spark_jvm_breakdown.py

Arms: ``builtin-v1``/``builtin-v2`` (``format("kafka")`` on Spark's V1 or V2 write path),
``jvm-*`` (``kresilient.spark.write(engine="jvm")`` with all 8 observed aggregates, a count
only, or none), ``noop-*`` (the same plans into the ``noop`` sink: projection cost alone).
Prints rows/s and the Spark JVM's CPU per row, and each arm's paired ratio to ``builtin-v1``.
"""

import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyspark
import spark_sink as sb

from kresilient.spark import write

rows = int(os.environ.get("ROWS", "1000000"))
size = int(os.environ.get("SIZE", "100"))
rounds = int(os.environ.get("ROUNDS", "3"))
settings = {
    "linger.ms": "5",
    "batch.size": "262144",
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": "true",
}


def builtin(df, boot, topic, v2):
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


def jvm(df, boot, topic, obs, v2, sink="kafka"):
    os.environ["KR_OBS"] = obs
    os.environ["KR_V2"] = "1" if v2 else "0"
    os.environ["KR_SINK"] = sink
    write(
        df,
        topic=topic,
        bootstrap_servers=boot,
        engine="jvm",
        dead_letter_topic=f"{topic}.dlq",
        options=settings,
    )


ARMS = {
    "builtin-v1": lambda df, b, t: builtin(df, b, t, False),
    "builtin-v2": lambda df, b, t: builtin(df, b, t, True),
    "jvm-full-v2": lambda df, b, t: jvm(df, b, t, "full", True),
    "jvm-count-v2": lambda df, b, t: jvm(df, b, t, "count", True),
    "jvm-none-v2": lambda df, b, t: jvm(df, b, t, "none", True),
    "jvm-none-v1": lambda df, b, t: jvm(df, b, t, "none", False),
    "noop-plain": lambda df, b, t: df.write.format("noop").mode("overwrite").save(),
    "noop-jvm-full": lambda df, b, t: jvm(df, b, t, "full", True, "noop"),
    "noop-jvm-none": lambda df, b, t: jvm(df, b, t, "none", True, "noop"),
}
only = os.environ.get("ARMS")
if only:
    ARMS = {k: v for k, v in ARMS.items() if k in only.split(",")}

with sb._cluster(os.environ.get("BOOT")) as cluster:
    boot = cluster.bootstrap_servers
    spark = sb._spark(sb.connector_jars(pyspark.__version__), 2)
    df = sb._frame(spark, rows, size, 2)
    jpid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    res = {a: [] for a in ARMS}

    def one(arm):
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
                f"round {r} {arm:14s} {rows / el:10,.0f} rows/s  "
                f"jvm cpu {jcpu / rows * 1e6:6.2f} us/row",
                flush=True,
            )
    base = res.get("builtin-v1")
    print(f"\nrows={rows} size={size} rounds={rounds} load={os.getloadavg()}")
    for arm, xs in res.items():
        rate = statistics.median(rows / e for e, _ in xs)
        cpu = statistics.median(j / rows * 1e6 for _, j in xs)
        ratio = (
            statistics.median(b[0] / e for (e, _), b in zip(xs, base, strict=True))
            if base
            else float("nan")
        )
        rr = sorted(b[0] / e for (e, _), b in zip(xs, base, strict=True)) if base else []
        print(
            f"| {arm} | {rate:,.0f} | {cpu:.2f} | {ratio:.3f} [{rr[0]:.3f}..{rr[-1]:.3f}] |"
            if rr
            else f"| {arm} | {rate:,.0f} | {cpu:.2f} |"
        )
    spark.stop()
