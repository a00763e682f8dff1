"""One arm of benchmarks/keyed.py run through ``pyrallel-consumer`` (a peer, not a dependency).

Run by benchmarks/keyed.py with the interpreter given to ``--pyrallel-python`` (a virtualenv
holding ``pyrallel-consumer``), never imported by kresilient. Reads the topic from the
beginning in a fresh group with ``ordering_mode="key_hash"``, ``max_in_flight`` and
``worker_pool_size`` both set to the window, and an asyncio worker awaiting the handler's
sleep (pyrallel's async engine runs only coroutine workers). Prints one JSON line:
``{"rate": records/s from the first handled record to the last, "cpu_us": per record}``.

    python benchmarks/_pyrallel_arm.py BOOTSTRAP TOPIC RECORDS IN_FLIGHT SLEEP_MS
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import uuid


async def _main(bootstrap: str, topic: str, records: int, in_flight: int, sleep_s: float) -> None:
    from pyrallel_consumer import KafkaConfig, PyrallelConsumer
    from pyrallel_consumer.dto import ExecutionMode, OrderingMode

    config = KafkaConfig()
    config.BOOTSTRAP_SERVERS = [bootstrap]
    config.CONSUMER_GROUP = f"bench-pyrallel-{uuid.uuid4().hex[:8]}"
    config.AUTO_OFFSET_RESET = "earliest"
    config.dlq_enabled = False
    config.parallel_consumer.ordering_mode = OrderingMode.KEY_HASH
    config.parallel_consumer.worker_pool_size = in_flight
    config.parallel_consumer.execution.mode = ExecutionMode.ASYNC
    config.parallel_consumer.execution.max_in_flight = in_flight

    count = 0
    first = last = 0.0
    done = asyncio.Event()

    async def worker(_item: object) -> None:
        nonlocal count, first, last
        await asyncio.sleep(sleep_s)
        count += 1
        now = time.perf_counter()
        if count == 1:
            first = now
        if count == records:
            last = now
            done.set()

    consumer = PyrallelConsumer(config=config, worker=worker, topic=topic)
    cpu = time.process_time()
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=max(600.0, records * sleep_s * 2))
    finally:
        await consumer.stop()
    cpu = time.process_time() - cpu
    print(json.dumps({"rate": (records - 1) / (last - first), "cpu_us": cpu / records * 1e6}))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    bootstrap, topic, records, in_flight, sleep_ms = sys.argv[1:6]
    asyncio.run(_main(bootstrap, topic, int(records), int(in_flight), float(sleep_ms) / 1000))
