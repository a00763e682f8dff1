"""Write a DataFrame to Kafka with the ``kresilient`` Spark data source, batch and streaming.

Run against a cluster of your own::

    python examples/spark_job.py --bootstrap-servers broker1:9092,broker2:9092

or without arguments to start a local 3-node cluster (``kresilient.testing``) for the demo.
Spark runs as ``local[2]``; on a real cluster, ship kresilient to the executors
(integrations/spark/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _bootstrap(servers: str | None) -> Iterator[tuple[str, object]]:
    from kresilient.testing import KafkaCluster

    with KafkaCluster(bootstrap_servers=servers) as cluster:
        yield cluster.bootstrap_servers, cluster


def _wrote_a_micro_batch(summary: Any) -> bool:
    return summary is not None and summary.mode == "streaming" and summary.written > 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors need kresilient too
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kresilient.spark import last_write_summary, register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    register(spark)  # the "kresilient" format

    with _bootstrap(args.bootstrap_servers) as (servers, cluster):
        create = getattr(cluster, "create_topic", None)
        if create is not None and args.bootstrap_servers is None:
            create("orders", partitions=3, config={"min.insync.replicas": 2})
            create("orders.dlq", partitions=1, config={"min.insync.replicas": 2})

        # Batch: the built-in sink's columns (key, value, headers, ...). One row is too large
        # for Kafka (2 MB > message.max.bytes): it goes to orders.dlq, the job succeeds.
        header = F.struct(F.lit("source").alias("key"), F.lit(b"example").alias("value"))
        orders = spark.range(args.rows).select(
            F.col("id").cast("string").alias("key"),
            F.when(F.col("id") == 42, F.expr("repeat('x', 2000000)"))
            .otherwise(F.to_json(F.struct("id")))
            .alias("value"),
            F.array(header).alias("headers"),
        )
        (
            orders.write.format("kresilient")  # was: .format("kafka")
            .option("kafka.bootstrap.servers", servers)
            .option("topic", "orders")
            .option("kafka.compression.type", "lz4")
            .mode("append")
            .save()
        )
        summary = last_write_summary()
        assert summary is not None
        print(
            f"batch: {summary.written} rows written, {summary.dead_lettered} dead-lettered "
            f"{dict(summary.dead_letter_reasons)} to {list(summary.dead_letter_topics)}"
        )

        # Streaming: same options plus a checkpoint; a restart resumes from it (at-least-once).
        with tempfile.TemporaryDirectory() as checkpoint:
            query = (
                spark.readStream.format("rate")
                .option("rowsPerSecond", 1000)
                .load()
                .select(
                    F.col("value").cast("string").alias("key"),
                    F.to_json(F.struct("timestamp", "value")).alias("value"),
                )
                .writeStream.format("kresilient")
                .option("kafka.bootstrap.servers", servers)
                .option("topic", "orders")
                .option("checkpointLocation", checkpoint)
                .start()
            )
            # Run until a micro-batch has written rows (at most 60 s), then stop. A query that
            # failed raises here, from awaitTermination().
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not _wrote_a_micro_batch(last_write_summary()):
                query.awaitTermination(0.2)
            query.stop()
        summary = last_write_summary()
        assert summary is not None
        print(f"streaming: micro-batch {summary.batch_id} wrote {summary.written} rows")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
