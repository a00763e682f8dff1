"""An exactly-once asyncio service: AsyncResilientConsumer doubling numbers in transactions.

The ``async def`` handler returns its output records; ``transactions=`` writes them, the dead
letters of records that cannot be doubled and the consumed offsets in one Kafka transaction
per group of batches, or none of them. ``read_committed`` readers of ``--target`` see each
result exactly once, whatever crashes, rebalances, cancellations or redone transactions
happened (docs/asyncio.md, "Exactly once: transactions=").

    kresilient cluster --port 9092 &                     # or any Kafka
    kresilient topic create numbers numbers.doubled numbers.dlq
    python examples/aio_exactly_once.py --bootstrap 127.0.0.1:9092 --stop-after 1000

``--bootstrap`` defaults to ``$KRESILIENT_BOOTSTRAP_SERVERS``, else ``127.0.0.1:9092``.
SIGTERM/SIGINT stop it: the transaction in hand commits what was handled. A copy with the
SAME ``--transactional-id`` fences this one (it stops: ``ProducerFencedError``, exit code 3).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from confluent_kafka import Message

import kresilient.logging
from kresilient import DeadLetterPolicy, Output, ProducerFencedError, TransactionPolicy
from kresilient.aio import AsyncResilientConsumer


def service(
    bootstrap: str, source: str, target: str, group: str, transactional_id: str
) -> AsyncResilientConsumer:
    """The doubler: a record whose value is not an integer goes to ``<source>.dlq`` (inside
    the same transaction as the outputs)."""

    async def double(msg: Message) -> Output:
        number = int(msg.value() or b"")  # ValueError: poison, dead-lettered at once
        await asyncio.sleep(0)  # an async lookup would be awaited here
        return Output(target, value=b"%d" % (2 * number), key=msg.key())

    return AsyncResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [source],
        double,
        transactions=TransactionPolicy(transactional_id=transactional_id),
        dead_letter=DeadLetterPolicy(),
    )


async def run(
    bootstrap: str,
    source: str,
    target: str,
    group: str,
    transactional_id: str,
    stop_after: int | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, or until ``stop_after`` records were committed. Returns
    the exit code: 0, or 3 when fenced by another instance with the same id."""
    consumer = service(bootstrap, source, target, group, transactional_id)
    watcher = (
        asyncio.create_task(_stop_when(consumer, stop_after)) if stop_after is not None else None
    )
    try:
        await consumer.run()
    except ProducerFencedError as exc:
        print(f"fenced, stopping: {exc}", file=sys.stderr)
        return 3
    finally:
        if watcher is not None:
            watcher.cancel()
    return 0


async def _stop_when(consumer: AsyncResilientConsumer, records: int) -> None:
    """Stop ``consumer`` once ``records`` records were handled and their transaction
    committed (checked a few times a second)."""
    while True:
        await asyncio.sleep(0.2)
        health = consumer.health()
        txn: Any = health.transactions
        if health.processed + health.dead_lettered >= records and txn and not txn["open"]:
            consumer.stop()
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
    )
    parser.add_argument("--source", default="numbers")
    parser.add_argument("--target", default="numbers.doubled")
    parser.add_argument("--group", default="number-doubler")
    parser.add_argument("--transactional-id", default="number-doubler-0")
    parser.add_argument("--stop-after", type=int, default=None)
    args = parser.parse_args(argv)
    kresilient.logging.configure("info")
    return asyncio.run(
        run(
            args.bootstrap,
            args.source,
            args.target,
            args.group,
            args.transactional_id,
            args.stop_after,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
