"""Write a DataFrame with ``engine="jvm"`` (Spark's built-in Kafka sink behind kresilient's
checks): oversized rows and rows aimed at a missing partition go to the dead-letter topic
before sending, the rest to the topic, and the summary counts both.

Run against a cluster of your own (the topics ``orders``-style names below are created)::

    python examples/spark_jvm_engine.py --bootstrap-servers broker1:9092

or without arguments to start a local 3-node cluster (``kresilient.testing``). The Kafka
connector jars are resolved once through Maven (``mvn`` on PATH) for the installed pyspark.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap-servers", default=None)
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import functions as F

    from kresilient.spark import write
    from kresilient.spark.connector import connector_jars
    from kresilient.spark.testing import local_session
    from kresilient.testing import KafkaCluster

    with KafkaCluster(bootstrap_servers=args.bootstrap_servers) as cluster:
        topic = f"orders-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 2, 3, {"max.message.bytes": 65536})
        cluster.create_topic(f"{topic}.dlq", 1, 3)
        spark = local_session("kresilient-jvm-example", jars=connector_jars())
        try:
            df = spark.range(args.rows, numPartitions=2).select(
                F.expr("CAST(id AS STRING)").alias("key"),
                # every 10,000th row is 100 KiB: too large for the topic
                F.expr("IF(id % 10000 = 0, repeat('x', 102400), 'order')").alias("value"),
                # row 7 names partition 9, which the topic lacks
                F.expr("CAST(IF(id = 7, 9, NULL) AS INT)").alias("partition"),
            )
            summary = write(
                df,
                topic=topic,
                bootstrap_servers=cluster.bootstrap_servers,
                engine="jvm",
                linger_ms=5,
                batch_size=262144,
                compression_type="lz4",
            )
            print(summary)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
