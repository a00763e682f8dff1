"""A ResilientConsumer in its own process, for the SIGKILL test (test_consumer_integration.py).

Every handled message is appended to ``--out`` as ``partition offset value`` with one
``write(2)`` on an ``O_APPEND`` descriptor before the handler returns, so a line in the file
means "processed" even if the process is SIGKILLed right after (the kernel has the bytes).
SIGTERM stops the consumer gracefully (exit code 0).

    python tests/consumer_worker.py --bootstrap HOSTS --topic T --group G --out FILE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from kresilient.consumer import ResilientConsumer


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of work per message")
    args = parser.parse_args()

    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    pause = args.sleep

    def handle(msg: Any) -> None:
        if pause:
            time.sleep(pause)
        os.write(fd, b"%d %d %s\n" % (msg.partition(), msg.offset(), msg.value()))

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.commit.interval.ms": args.commit_interval_ms,
            # a SIGKILLed member leaves the group after this, not after the 45 s default
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
        },
        [args.topic],
        handle,
    )
    print("started", flush=True)
    consumer.run()  # until SIGTERM
    os.close(fd)
    print(f"stopped {consumer.health()['processed']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
