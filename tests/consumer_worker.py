"""A ResilientConsumer in its own process, for the SIGKILL test (test_consumer_integration.py).

Every handled message is appended to ``--out`` as ``partition offset value`` with one
``write(2)`` on an ``O_APPEND`` descriptor before the handler returns, so a line in the file
means "processed" even if the process is SIGKILLed right after (the kernel has the bytes).
SIGTERM stops the consumer gracefully (exit code 0).

Crash loops (tests/test_crash_loop.py): ``--die-on V`` calls ``os._exit(1)`` when the handler
gets value ``V`` (after appending ``died P O``); ``--max-process-deaths N`` (0: off).

Retry topics (tests/test_retry_topics.py): ``--retry-tiers 2,5``; values ``once-*`` fail on the
source topic only, ``always-*`` fail everywhere; a record handled from a retry topic appends
``R value due_ms now_ms``.

Shutdown tests (tests/test_consumer_hardening.py): ``--poison V`` makes the handler raise
``ValueError`` for value ``V`` (dead-lettered at once); ``--slow-dead-letters`` holds dead-letter
writes back (``linger.ms`` 60 s), commits only on close and prints ``waiting-for-dead-letters``
once the shutdown waits for them; ``--announce-after N`` prints ``handled-all`` after N handler
calls.

    python tests/consumer_worker.py --bootstrap HOSTS --topic T --group G --out FILE
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from kresilient.consumer import ResilientConsumer, RetryTopicPolicy


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds of work per message")
    parser.add_argument("--poison", default=None, help="a value the handler rejects")
    parser.add_argument("--slow-dead-letters", action="store_true")
    parser.add_argument("--announce-after", type=int, default=0)
    parser.add_argument("--die-on", default=None, help="a value on which os._exit(1) is called")
    parser.add_argument("--max-process-deaths", type=int, default=3, help="0: protection off")
    parser.add_argument("--instance-id", default=None, help="group.instance.id (static member)")
    parser.add_argument("--retry-tiers", default=None, help="retry-topic delays, e.g. 2,5")
    args = parser.parse_args()

    fd = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    pause = args.sleep

    poison = args.poison.encode() if args.poison is not None else None
    die_on = args.die_on.encode() if args.die_on is not None else None
    retry_tiers = tuple(float(d) for d in args.retry_tiers.split(",")) if args.retry_tiers else None
    calls = 0

    def handle(msg: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == args.announce_after:
            print("handled-all", flush=True)
        if pause:
            time.sleep(pause)
        if poison is not None and msg.value() == poison:
            raise ValueError("poison")
        if retry_tiers is not None:
            value = msg.value() or b""
            tier = dict(msg.headers() or []).get("kresilient.retry.tier")
            if value.startswith(b"always-") or (value.startswith(b"once-") and tier is None):
                raise RuntimeError("downstream refused")
            if tier is not None:  # handled from a retry topic: when it was due, when it ran
                due = dict(msg.headers() or [])["kresilient.retry.due"]
                os.write(fd, b"R %s %s %d\n" % (value, due, time.time() * 1000))
        if die_on is not None and msg.value() == die_on:
            os.write(fd, b"died %d %d\n" % (msg.partition(), msg.offset()))
            os._exit(1)  # a crash no Python code sees (OOM kill, segfault, os._exit in a lib)
        os.write(fd, b"%d %d %s\n" % (msg.partition(), msg.offset(), msg.value()))

    conf: dict[str, Any] = {
        "bootstrap.servers": args.bootstrap,
        "group.id": args.group,
        "auto.commit.interval.ms": args.commit_interval_ms,
        # a SIGKILLed member leaves the group after this, not after the 45 s default
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
    }
    extra: dict[str, Any] = {"max_process_deaths": args.max_process_deaths or None}
    if args.instance_id:
        conf["group.instance.id"] = args.instance_id
    if retry_tiers is not None:
        extra["retry_topics"] = RetryTopicPolicy(delays=retry_tiers)
    consumer: ResilientConsumer
    announced = False

    def stats(_json: str) -> None:  # served by the dead-letter producer's poll()
        nonlocal announced
        # announce once the consumer's shutdown (not its loop) serves this producer
        frame = sys._getframe()
        while frame is not None and not announced:
            if frame.f_code.co_name == "_shutdown" and consumer.health().stopping:
                announced = True
                print("waiting-for-dead-letters", flush=True)
            frame = frame.f_back  # type: ignore[assignment]

    if args.slow_dead_letters:
        conf["enable.auto.commit"] = False  # only the final commit on close
        conf["auto.commit.interval.ms"] = 86_400_000
        extra["dead_letter_producer_config"] = {
            "linger.ms": 60_000,
            "statistics.interval.ms": 100,
            "stats_cb": stats,
        }
        extra["shutdown_timeout"] = 5.0
        # "only the final commit": no crash-loop probe commits either
        extra["max_process_deaths"] = None

    consumer = ResilientConsumer(conf, [args.topic], handle, **extra)
    print("started", flush=True)
    consumer.run()  # until SIGTERM
    os.close(fd)
    print(f"stopped {consumer.health().processed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
