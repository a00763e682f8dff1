"""The exactly-once doubler of tests/test_eos_chaos.py, run as a child process.

Reads integers, writes each one doubled (``Output(<output topic>, value=2n, key=<input
key>)``) through ``ResilientConsumer(..., transactions=TransactionPolicy(...))``; a value that
is no integer raises ``ValueError`` in the handler: poison, dead-lettered inside the
transaction. With ``--tag T`` the output value is ``2n@T``, so a reader can tell which
instance wrote a record (the zombie test).

Its stdout carries one event per line, flushed, for the test to wait on:
``READY``, ``ASSIGNED t:p ...``, ``REVOKED t:p ...``, ``LOST t:p ...``, ``HANDLED <count>``
(every ``--report-every`` records, and the first), ``H <partition> <offset>`` (with
``--log-each``), then ``STOPPED`` or ``ERROR <exception type> <message>``. kresilient's own log
(structlog, INFO and above) goes to stderr.

    python tests/eos_processor.py --bootstrap B --group G --input T --output T.out --tid doubler-0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import kresilient.logging


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _names(partitions: list[Any]) -> str:
    return " ".join(f"{tp.topic}:{tp.partition}" for tp in partitions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--tid", required=True, help="the transactional id")
    parser.add_argument("--instance-id", help="group.instance.id (static membership)")
    parser.add_argument("--max-records", type=int, help="default: the policy's")
    parser.add_argument("--max-interval", type=float, help="seconds; default: the policy's")
    parser.add_argument("--txn-timeout", type=float, help="TransactionPolicy(timeout=)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--log-each", action="store_true")
    parser.add_argument("--report-every", type=int, default=500)
    parser.add_argument(
        "--pace", type=float, default=0.0, help="seconds the handler sleeps per record"
    )
    parser.add_argument(
        "--config", default="{}", help="JSON: extra consumer config (session.timeout.ms ...)"
    )
    parser.add_argument(
        "--producer-config", default="{}", help="JSON: the transactional producer's overrides"
    )
    args = parser.parse_args(argv)
    kresilient.logging.configure("INFO")  # stderr

    from kresilient import DeadLetterPolicy, Output, ResilientConsumer, TransactionPolicy

    tag = b"@" + args.tag.encode() if args.tag else b""
    handled = 0

    def double(msg: Any) -> list[Output]:
        nonlocal handled
        n = int(msg.value())  # b"poison-..." raises ValueError: dead-lettered at once
        if args.pace:
            time.sleep(args.pace)  # the work of a real handler: spreads the run over time
        handled += 1
        if args.log_each:
            _say(f"H {msg.partition()} {msg.offset()}")
        if handled == 1 or handled % args.report_every == 0:
            _say(f"HANDLED {handled}")
        return [Output(args.output, value=b"%d" % (2 * n) + tag, key=msg.key())]

    config: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        **json.loads(args.config),
    }
    if args.instance_id:
        config["group.instance.id"] = args.instance_id
    sizing: dict[str, Any] = {"producer_config": json.loads(args.producer_config)}
    if args.max_records is not None:
        sizing["max_records"] = args.max_records
    if args.max_interval is not None:
        sizing["max_interval_s"] = args.max_interval
    if args.txn_timeout is not None:
        sizing["timeout"] = args.txn_timeout
    consumer = ResilientConsumer(
        config,
        [args.input],
        double,
        transactions=TransactionPolicy(transactional_id=args.tid, **sizing),
        dead_letter=DeadLetterPolicy(),
        on_assign=lambda parts: _say("ASSIGNED " + _names(parts)),
        on_revoke=lambda parts: _say("REVOKED " + _names(parts)),
        on_lost=lambda parts: _say("LOST " + _names(parts)),
    )
    _say("READY")
    try:
        consumer.run()
    except Exception as exc:
        _say(f"ERROR {type(exc).__name__} {' '.join(str(exc).split())}")
        return 3
    _say(f"STOPPED {handled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
