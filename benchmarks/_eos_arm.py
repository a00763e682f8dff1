"""One arm of benchmarks/eos.py: the doubler pipeline, in a process of its own.

Run by benchmarks/eos.py with the interpreter of the arm's library (quix-streams lives in a
virtualenv of its own, never in kresilient's), never imported by kresilient:

    python benchmarks/_eos_arm.py ARM BOOTSTRAP SOURCE TARGET GROUP RECORDS INTERVAL_S EVERY

ARM is ``kresilient-eos`` (``ResilientConsumer(transactions=TransactionPolicy(
max_interval_s=INTERVAL_S, max_records=EVERY))``), ``kresilient-alo`` (the same consumer
without ``transactions=``: outputs produced at-least-once, flushed before the offsets commit)
or ``quix-eos`` (``Application(processing_guarantee="exactly-once", commit_interval=INTERVAL_S,
commit_every=EVERY)``). Each reads SOURCE from the beginning in the fresh GROUP and writes
``2n`` for each integer ``n`` to TARGET with the input's key; after RECORDS records it stops
itself (the final commit and the close are inside the timing). Prints one JSON line:
``{"records", "wall_s", "cpu_s"}``, wall and process CPU (librdkafka's threads included)
from the first record handled to the return of the library's run loop.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any


class _Clock:
    def __init__(self, records: int, interval_s: float) -> None:
        self.records, self.interval_s = records, interval_s
        self.count = 0
        self.wall0 = self.cpu0 = 0.0

    def tick(self) -> bool:
        """Count one record; True at the last one."""
        if self.count == 0:
            self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.count += 1
        return self.count == self.records

    def report(self) -> None:
        wall, cpu = time.perf_counter() - self.wall0, time.process_time() - self.cpu0
        print(json.dumps({"records": self.count, "wall_s": wall, "cpu_s": cpu}), flush=True)


def _kresilient(
    arm: str, bootstrap: str, source: str, target: str, group: str, clock: _Clock, every: int
) -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    from kresilient import Output, ResilientConsumer, TransactionPolicy

    consumer: ResilientConsumer

    def double(msg: Any) -> Output:
        if clock.tick():
            consumer.stop()
        return Output(target, value=b"%d" % (2 * int(msg.value())), key=msg.key())

    options: dict[str, Any] = {}
    if arm == "kresilient-eos":
        options["transactions"] = TransactionPolicy(
            transactional_id=f"bench-eos-{uuid.uuid4().hex[:8]}",
            max_interval_s=clock.interval_s,
            max_records=every,
        )
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": group}, [source], double, **options
    )
    consumer.run()


def _quix(bootstrap: str, source: str, target: str, group: str, clock: _Clock, every: int) -> None:
    import tempfile

    from quixstreams import Application

    # quix keeps a state directory (./state by default): a temporary one, not the caller's cwd
    state_dir = tempfile.mkdtemp(prefix="kresilient-bench-quix-")
    app = Application(
        broker_address=bootstrap,
        state_dir=state_dir,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=clock.interval_s,
        commit_every=every,
        auto_create_topics=False,
        loglevel="WARNING",
    )
    src = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    dst = app.topic(target, key_serializer="bytes", value_serializer="bytes")

    def count(_value: bytes) -> None:
        if clock.tick():
            app.stop()

    sdf = app.dataframe(src)
    sdf = sdf.apply(lambda value: b"%d" % (2 * int(value)))
    sdf = sdf.update(count)
    sdf.to_topic(dst)
    app.run()


def main() -> None:
    arm, bootstrap, source, target, group, records, interval_s, every = sys.argv[1:9]
    clock = _Clock(int(records), float(interval_s))
    if arm in ("kresilient-eos", "kresilient-alo"):
        _kresilient(arm, bootstrap, source, target, group, clock, int(every))
    elif arm == "quix-eos":
        _quix(bootstrap, source, target, group, clock, int(every))
    else:
        raise SystemExit(f"unknown arm {arm!r}")
    clock.report()


if __name__ == "__main__":
    main()
