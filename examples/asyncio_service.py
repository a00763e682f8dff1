"""A small asyncio service: consume, call an async function per record, produce the results.

Each input record is committed only after its result was ACKNOWLEDGED by the cluster
(``await handle``), so a crash at any point redoes work but never loses any
(at-least-once end to end). A record the function rejects (``ValueError``) goes to
``<input>.dlq`` with its original bytes; other errors are retried with the partition paused.
SIGTERM or Ctrl-C: the records in hand finish, everything handled is committed, the producer
flushes, the process exits 0.

    kresilient cluster --port 9092 &                     # or any Kafka
    kresilient topic create orders orders.enriched --dlq
    python examples/asyncio_service.py --bootstrap 127.0.0.1:9092 --health-port 8080

``--health-port``: ``GET /live`` and ``GET /ready`` for Kubernetes probes (``/ready`` is 503
while a dependency outage holds the records, or a partition is stalled).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from confluent_kafka import Message

from kresilient.aio import AsyncResilientConsumer, AsyncResilientProducer


async def enrich(order: dict[str, Any]) -> dict[str, Any]:
    """Stands for an async call to another service (HTTP, a database ...)."""
    await asyncio.sleep(0.001)
    if "amount" not in order:
        raise ValueError("an order needs an amount")  # not retried: dead-lettered at once
    return {**order, "amount_with_tax": round(order["amount"] * 1.2, 2)}


async def serve(
    bootstrap: str,
    source: str,
    target: str,
    *,
    stop_after: int = 0,
    health_port: int | None = None,
) -> int:
    """Run until SIGTERM/SIGINT (or ``stop_after`` records); return how many were handled."""
    handled = 0
    async with AsyncResilientProducer(
        {"bootstrap.servers": bootstrap, "client.id": "orders-enricher"}
    ) as producer:

        async def handle(msg: Message) -> None:
            nonlocal handled
            order = json.loads(msg.value() or b"")  # JSONDecodeError (ValueError): DLQ
            result = await enrich(order)
            delivery = await producer.produce(target, json.dumps(result).encode(), key=msg.key())
            await delivery  # committed only once the result is safely written
            handled += 1
            if stop_after and handled >= stop_after:
                consumer.stop()

        consumer = AsyncResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": "orders-enricher"},
            [source],
            handle,
            max_concurrency=4,  # up to 4 partitions at once; each one stays in order
            health_port=health_port,  # /live and /ready (127.0.0.1; health_host= for a pod)
        )
        await consumer.run()  # returns after a graceful stop (SIGTERM, SIGINT, stop())
    return handled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--source", default="orders")
    parser.add_argument("--target", default="orders.enriched")
    parser.add_argument("--stop-after", type=int, default=0, help="stop after N records")
    parser.add_argument("--health-port", type=int, default=None, help="serve /live, /ready")
    args = parser.parse_args()
    handled = asyncio.run(
        serve(
            args.bootstrap,
            args.source,
            args.target,
            stop_after=args.stop_after,
            health_port=args.health_port,
        )
    )
    print(f"handled {handled} records")


if __name__ == "__main__":
    main()
