"""An AsyncResilientConsumer in its own process, for the SIGKILL/SIGTERM tests.

Not a test module (no tests; pytest imports it harmlessly): run as a script. Every handled
record is appended to ``--out`` as ``partition offset value`` with one ``write(2)`` on an
``O_APPEND`` descriptor before the handler returns, so a line means "processed" even if the
process is SIGKILLed right after. SIGTERM stops the consumer gracefully (exit code 0).

    python tests/test_aio_consumer_worker.py --bootstrap HOSTS --topic T --group G --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any


def main() -> int:
    from kresilient.aio import AsyncResilientConsumer

    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="awaited seconds per record")
    parser.add_argument("--max-concurrency", type=int, default=1)
    args = parser.parse_args()
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def handle(msg: Any) -> None:
        if args.sleep:
            await asyncio.sleep(args.sleep)
        os.write(fd, b"%d %d %s\n" % (msg.partition(), msg.offset(), msg.value()))

    consumer = AsyncResilientConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.commit.interval.ms": 1000,
            # A SIGKILLed worker stays in the group until its session times out (45 s by
            # default): the restarted one's first rebalance waits for that.
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        },
        [args.topic],
        handle,
        max_concurrency=args.max_concurrency,
    )
    print("started", flush=True)
    asyncio.run(consumer.run())  # SIGTERM: graceful stop, then run() returns
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
