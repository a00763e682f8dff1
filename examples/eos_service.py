"""An exactly-once service: ResilientConsumer doubling numbers inside Kafka transactions.

The handler returns its output records; ``transactions=`` writes them, the dead letters of
records that cannot be doubled and the consumed offsets in one transaction per group of
batches, or none of them. ``read_committed`` readers of ``--target`` see each result exactly
once, whatever crashes, rebalances or redone transactions happened (docs/transactions.md).

    kresilient cluster --port 9092 &                     # or any Kafka
    kresilient topic create numbers numbers.doubled numbers.dlq
    python examples/eos_service.py --bootstrap 127.0.0.1:9092 --stop-after 1000

``--bootstrap`` defaults to ``$KRESILIENT_BOOTSTRAP_SERVERS``, else ``127.0.0.1:9092``.
Run a second copy with another ``--transactional-id`` to share the partitions; a copy with
the SAME id fences this one (it stops: ``ProducerFencedError``, exit code 3).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

from confluent_kafka import Message

import kresilient.logging
from kresilient import (
    DeadLetterPolicy,
    Output,
    ProducerFencedError,
    ResilientConsumer,
    TransactionPolicy,
)


def service(
    bootstrap: str, source: str, target: str, group: str, transactional_id: str
) -> ResilientConsumer:
    """The doubler: a record whose value is not an integer goes to ``<source>.dlq`` (inside
    the same transaction as the outputs)."""

    def double(msg: Message) -> Output:
        number = int(msg.value() or b"")  # ValueError: poison, dead-lettered at once
        return Output(target, value=b"%d" % (2 * number), key=msg.key())

    return ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group},
        [source],
        double,
        transactions=TransactionPolicy(transactional_id=transactional_id),
        dead_letter=DeadLetterPolicy(),
        install_signal_handlers=threading.current_thread() is threading.main_thread(),
    )


def run(
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
    if stop_after is not None:
        watcher = threading.Thread(target=_stop_when, args=(consumer, stop_after), daemon=True)
        watcher.start()
    try:
        consumer.run()
    except ProducerFencedError as exc:
        print(f"fenced, stopping: {exc}", file=sys.stderr)
        return 3
    return 0


def _stop_when(consumer: ResilientConsumer, records: int) -> None:
    """Stop ``consumer`` once ``records`` records were handled and their transaction
    committed (checked a few times a second)."""
    event = threading.Event()
    while not event.wait(0.2):
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
    return run(
        args.bootstrap,
        args.source,
        args.target,
        args.group,
        args.transactional_id,
        args.stop_after,
    )


if __name__ == "__main__":
    sys.exit(main())
