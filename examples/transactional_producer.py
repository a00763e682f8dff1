"""Exactly-once consume-transform-produce: each batch's results and offsets in one transaction.

Reads integers from ``--source``, writes each one doubled to ``--target``. Every batch (up to
500 records or 1 s) commits its output records and its consumed offsets in one Kafka
transaction, or none of them: a crash anywhere redoes the batch, and ``read_committed``
readers of the target see each result exactly once.

    kresilient cluster --port 9092 &                     # or any Kafka
    kresilient topic create numbers numbers.doubled
    python examples/transactional_producer.py --bootstrap 127.0.0.1:9092 --stop-after 1000

``--bootstrap`` defaults to ``$KRESILIENT_BOOTSTRAP_SERVERS``, else ``127.0.0.1:9092``.
What happens on each kind of error is in docs/transactions.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import structlog
from confluent_kafka import OFFSET_BEGINNING, Consumer

import kresilient.logging
from kresilient import (
    FatalProducerError,
    ProducerFencedError,
    TransactionAbortedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
    consumer_config,
)

log = structlog.get_logger("transactional_example")


def rewind(consumer: Consumer) -> None:
    """Seek every assigned partition back to its committed offset: the records of an aborted
    (or maybe-committed) batch are read again, and committed ones are not."""
    assignment = consumer.assignment()
    for tp in consumer.committed(assignment, timeout=30):
        tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(tp)


def serve(bootstrap: str, source: str, target: str, group: str, txn_id: str, stop: int) -> int:
    consumer = Consumer(
        consumer_config(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,  # offsets commit with the transaction only
                "isolation.level": "read_committed",
            }
        )
    )
    consumer.subscribe([source])
    handled = 0
    try:
        with TransactionalProducer(
            {"bootstrap.servers": bootstrap}, transactional_id=txn_id
        ) as producer:
            while stop <= 0 or handled < stop:
                batch = [m for m in consumer.consume(500, timeout=1.0) if m.error() is None]
                if not batch:
                    continue
                try:
                    with producer.transaction():
                        for msg in batch:
                            doubled = int(msg.value() or b"0") * 2
                            producer.produce(target, b"%d" % doubled, key=msg.key())
                        producer.send_offsets(consumer)
                    handled += len(batch)
                except (TransactionAbortedError, TransactionOutcomeUnknownError) as exc:
                    # Aborted: nothing of the batch is visible. Outcome unknown: the producer
                    # was replaced; the committed offsets say whether the batch committed.
                    log.warning("batch_not_committed", records=len(batch), error=str(exc))
                    rewind(consumer)
    except ProducerFencedError as exc:
        # another instance took over (or may have): stop, never build a new producer here
        log.error("fenced_stopping", error=str(exc))
        return 1
    except FatalProducerError as exc:
        # closed, not recreated: restart the process if it still owns the transactional.id
        log.error("producer_failed_stopping", error=str(exc))
        return 1
    finally:
        consumer.close()
    print(f"handled {handled} records in transactions")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = os.environ.get("KRESILIENT_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    parser.add_argument("--bootstrap", default=default)
    parser.add_argument("--source", default="numbers")
    parser.add_argument("--target", default="numbers.doubled")
    parser.add_argument("--group", default="number-doubler")
    parser.add_argument("--transactional-id", default="number-doubler-0")
    parser.add_argument("--stop-after", type=int, default=0, help="stop after N records")
    args: Any = parser.parse_args(argv)
    kresilient.logging.configure()  # INFO and above on stderr
    return serve(
        args.bootstrap, args.source, args.target, args.group, args.transactional_id, args.stop_after
    )


if __name__ == "__main__":
    sys.exit(main())
