"""``kresilient``: a PySpark data source that writes DataFrames to Kafka without losing rows.

A drop-in for Spark's built-in Kafka sink (same columns, same ``kafka.*`` options), written
with PySpark's Python Data Source API (Arrow-based writers) on librdkafka::

    from kresilient.spark._source import register, last_write_summary

    register(spark)
    (df.selectExpr("CAST(id AS STRING) AS key", "payload AS value")
       .write.format("kresilient")                 # was: .format("kafka")
       .option("kafka.bootstrap.servers", "broker:9092")
       .option("topic", "orders")
       .mode("append")
       .save())
    print(last_write_summary())                    # rows written / dead-lettered

    (stream_df.writeStream.format("kresilient")
       .option("kafka.bootstrap.servers", "broker:9092").option("topic", "orders")
       .option("checkpointLocation", "/chk/orders").start())

Guarantee: **at-least-once** by default. ``acks=all`` and idempotence are forced and unsafe
settings refused; a task reports success only after Kafka acknowledged every row, so a job or
micro-batch that succeeded wrote every row at least once. A retried task re-sends its
partition (as with the built-in sink), so duplicates are possible after task retries or a
streaming restart. Rows that can never be produced (too large, invalid) go to a dead-letter
topic (``deadLetterTopic``, default ``<topic>.dlq``) with kresilient's error headers instead of
failing the job; retriable failures fail the task so Spark retries it.

``.option("guarantee", "exactly_once")`` (streaming only): one Kafka transaction per task with a
batch marker committed in it, so a replayed micro-batch is skipped where it had committed; for
``read_committed`` consumers, given deterministic replay. See docs/spark.md for the
preconditions.

Importing this module needs pyspark and pyarrow (``pip install kresilient[spark]``); ``import
kresilient`` alone never imports them.
"""

from __future__ import annotations

from kresilient.spark._source import *  # noqa: F403
from kresilient.spark._source import __all__ as __all__
