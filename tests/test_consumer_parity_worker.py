"""ResilientConsumer or AsyncResilientConsumer in a process of its own, for the signal tests of
tests/test_aio_consumer_parity.py (real SIGINTs, delivered by the test).

Not a test module (no tests; pytest imports it harmlessly): run as a script. The handler
appends ``handled P O`` to ``--out`` for every record but offset 1; at offset 1 it prints
``stuck`` and hangs (a downstream call that never answers), printing ``stopping`` once the
consumer says it is stopping (the 1st signal was received). ``--mode``:

- ``plain``: it hangs until interrupted (sync: ``KeyboardInterrupt``; asyncio: its task is
  cancelled).
- ``turn``: as ``plain``, but it turns the interruption into a ``ValueError`` (as an HTTP
  client may turn a cancellation or a ``KeyboardInterrupt`` into an error of its own); a
  ValueError is otherwise dead-lettered at once.
- ``control``: it raises the same ``ValueError`` by itself once the consumer is stopping
  (no 2nd signal): that one is dead-lettered (the dead-letter path is live).
- ``deaf`` (asyncio): it ignores its first cancellation and hangs on, so the shutdown hangs
  on it (for the 3rd signal); it obeys the next (asyncio.run's, at exit).

Exit status: 0 when ``run()`` returned, 3 when it raised ``KeyboardInterrupt`` (printed
``interrupted``).

    python tests/test_consumer_parity_worker.py --kind aio --bootstrap H --topic T --group G \\
        --out FILE --mode plain
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any


def main() -> int:
    from kresilient.aio import AsyncResilientConsumer
    from kresilient.consumer import ResilientConsumer

    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=("sync", "aio"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=("plain", "turn", "control", "deaf"), required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=None)
    args = parser.parse_args()
    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    config: dict[str, Any] = {"bootstrap.servers": args.bootstrap, "group.id": args.group}
    if args.commit_interval_ms is not None:
        config["auto.commit.interval.ms"] = args.commit_interval_ms
    consumer: Any = None
    announced: set[str] = set()

    def say(line: str) -> None:
        if line not in announced:
            announced.add(line)
            print(line, flush=True)

    def done(msg: Any) -> bool:
        """True: the record is handled; False: it is the stuck one."""
        if msg.offset() != 1:
            os.write(fd, b"handled %d %d\n" % (msg.partition(), msg.offset()))
            return True
        say("stuck")
        return False

    def stopping() -> bool:
        if consumer.health().stopping:
            say("stopping")
            if args.mode == "control":
                raise ValueError("the downstream refused it (by itself)")
            return True
        return False

    def handle(msg: Any) -> None:
        if done(msg):
            return
        try:
            while True:
                stopping()
                time.sleep(0.05)
        except KeyboardInterrupt as interrupt:
            if args.mode == "turn":
                raise ValueError("turned into a poison-looking error") from interrupt
            raise

    async def handle_async(msg: Any) -> None:
        if done(msg):
            return
        deaf = args.mode == "deaf"
        while True:
            try:
                stopping()
                await asyncio.sleep(0.05)
            except asyncio.CancelledError as cancelled:
                if args.mode == "turn":
                    raise ValueError("turned into a poison-looking error") from cancelled
                if deaf:  # ignores the consumer's cancellation (not asyncio.run's at exit)
                    deaf = False
                    say("deaf")
                    continue
                raise

    try:
        if args.kind == "sync":
            consumer = ResilientConsumer(config, [args.topic], handle, shutdown_timeout=600)
            print("started", flush=True)
            consumer.run()
        else:
            consumer = AsyncResilientConsumer(
                config, [args.topic], handle_async, shutdown_timeout=600
            )
            print("started", flush=True)
            asyncio.run(consumer.run())
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        return 3
    print("returned", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
