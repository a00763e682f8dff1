"""How kresilient's cost grows with the number of partitions (issue 18).

For each size in ``--sizes`` (default 1, 100, 1,000, 10,000 partitions, spread over
``min(10, size)`` topics):

- **real** sizes (``<= --real-max``, default 1,000): the topics are created on the cluster
  (RF=``--rf``, deleted afterwards) and, interleaved over ``--rounds`` rounds (one warm-up
  discarded), raw confluent-kafka and kresilient each

  * produce ``--messages`` 100-byte messages, message *i* to partition ``i % per_topic`` of
    topic ``i % topics`` (so every partition gets traffic; acks=all + idempotence, the same
    ``producer_config`` on both), clock from the first ``produce`` to ``flush()``;
  * consume ``--messages`` of them from the beginning of every topic (fresh group, commit only
    after a trivial handler), clock from the first handled message to the last;

  reporting msgs/s, process CPU µs per message and the RSS the client added (VmRSS with the
  client alive minus before it was created). The consumers' clock starts at the first record,
  so each consumer sample also reports its **start**: the seconds from creating the client to
  its first handled record (group join, assignment, and a new group's crash-loop seed commit,
  which kresilient makes in the assignment callback). Then one statistics document of a
  producer and one of a consumer that know every partition are **recorded** from the cluster.
  Consumers are also compared over the **whole run** (client created to last record, rate and
  CPU): the clock from the first record favours a client that stalls before its first record
  while its fetcher already fills the queue (the per-partition seed commits before issue 39),
  and raw's loop, whose first ``consume(500, 1.0)`` returns once 500 records are queued.
- ``--old-tree PATH`` (a checkout of an older kresilient; ``--new-tree PATH``: of the newer
  one, default this checkout): two more consumer arms, each in a fresh interpreter, importing
  kresilient from the new / the old tree (first on ``PYTHONPATH``; the same function,
  interpreter start and imports outside the clock), paired and interleaved with the others;
  the report adds the paired ratios new / old. Compare the two child arms with each other: a
  fresh interpreter pays first-call costs inside the clock that the in-process arms paid in
  their warm-up, so against raw (in-process) the child arms read low.
- **generated** sizes (above ``--real-max``): only the bookkeeping, on a GENERATED statistics
  document (benchmarks/telemetry.py's ``generated_statistics``: every partition entry is the
  field set of a recorded librdkafka 2.16 producer document). Every size also gets a
  generated document, so one growth line covers all sizes.

Bookkeeping per statistics document (thread CPU, median over ``--ticks`` ticks 5 s apart on a
fake clock): ``json.loads`` alone, ``LeadershipMonitor.on_stats(text)``, the producer's own
``stats_cb`` path (``ResilientProducer._on_stats``: parse, monitor, broker count), the
consumer's (``ClientEvents.on_stats``) and the asyncio consumer's (``_on_stats``), and the
share of one core at ``statistics.interval.ms=5000``. Growth: the per-partition cost from the
smallest to the largest size (flat / linear / worse than linear).

    KRESILIENT_BOOTSTRAP_SERVERS=... .venv/bin/python -P benchmarks/scale.py
    .venv/bin/python -P benchmarks/scale.py --real-max 0      # bookkeeping only
    .venv/bin/python -P benchmarks/scale.py --sizes 3,100 --real-max 100 --rounds 3 \
        --messages 100000 --old-tree OLD_CHECKOUT               # a new group's start, A/B

Uses ``KRESILIENT_BOOTSTRAP_SERVERS`` or starts a local 3-node cluster (only when a real size
is asked for). Prints markdown (progress on stderr).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from kresilient.aio import AsyncResilientConsumer  # noqa: E402
from kresilient.config import producer_config  # noqa: E402
from kresilient.consumer import ResilientConsumer  # noqa: E402
from kresilient.errors import DeliveryError  # noqa: E402
from kresilient.leadership import LeadershipMonitor  # noqa: E402
from kresilient.producer import ResilientProducer  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

sys.path.append(str(_HERE))
from _common import (  # noqa: E402
    Sample,
    contention,
    environment,
    median_iqr,
    paired_ratios,
    run_child,
    run_interleaved,
)
from telemetry import generated_statistics  # noqa: E402

VALUE = b"x" * 100
INTERVAL_MS = 5000
#: the --old-tree arms (each in a fresh interpreter)
NEW_ARM = "kresilient consumer, this tree (child)"
OLD_ARM = "kresilient consumer, old tree (child)"


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def _anoop(*_args: Any) -> None:
    pass


def _noop(*_args: Any) -> None:
    return None


def _quiet() -> None:
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


class _Quiet:
    """A logger that drops everything (the unreachable placeholder broker of the bookkeeping
    clients would log warnings; the figures are about the statistics path)."""

    def __getattr__(self, name: str) -> Any:
        return self._noop

    def _noop(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def bind(self, **kwargs: Any) -> _Quiet:
        return self


_QUIET = _Quiet()


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- topics


def create_topics(admin: AdminClient, names: list[str], per: int, rf: int) -> None:
    """Create the topics and wait (one metadata request per second) until every partition
    has a leader and a full ISR."""
    futures = admin.create_topics(
        [NewTopic(n, per, rf, config={"min.insync.replicas": str(min(2, rf))}) for n in names],
        operation_timeout=300,
        request_timeout=300,
    )
    for f in futures.values():
        f.result(timeout=300)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        md = admin.list_topics(timeout=30)
        ready = 0
        for n in names:
            t = md.topics.get(n)
            if t is None or t.error is not None:
                continue
            ready += sum(1 for p in t.partitions.values() if p.leader >= 0 and len(p.isrs) >= rf)
        if ready == per * len(names):
            return
        time.sleep(1)
    raise RuntimeError(f"{len(names)} topics x {per} partitions not ready after 600 s")


def delete_topics(admin: AdminClient, names: list[str]) -> None:
    for f in admin.delete_topics(names, operation_timeout=120, request_timeout=120).values():
        try:
            f.result(timeout=120)
        except Exception as exc:  # report and go on: the other topics still get deleted
            _log(f"deleting a topic failed: {exc}")


# ----------------------------------------------------------------------------- arms


def produce_raw(config: dict[str, Any], topics: list[str], per: int, n: int) -> dict[str, float]:
    errors = [0]
    first_error: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1
            if not first_error:
                first_error.append(str(err))

    rss0 = _rss_kib()
    producer = Producer({**config, "error_cb": _noop, "stats_cb": _noop})
    produce, poll = producer.produce, producer.poll
    nt = len(topics)
    w0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        while True:
            try:
                produce(topics[i % nt], VALUE, partition=(i // nt) % per, on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.05)
        if not i & 1023:
            poll(0)
    remaining = producer.flush(300)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    rss = _rss_kib() - rss0
    del producer
    if remaining or errors[0]:
        # the cluster's doing (the same for both arms): reported beside the figures
        _log(f"raw producer: {remaining} left, {errors[0]} failed, first: {first_error}")
    return {"wall": wall, "cpu": cpu, "rss_kib": rss, "failed": errors[0] + remaining}


def produce_kresilient(
    user: dict[str, Any], topics: list[str], per: int, n: int
) -> dict[str, float]:
    rss0 = _rss_kib()
    producer = ResilientProducer(user)
    produce = producer.produce
    nt = len(topics)
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            produce(topics[i % nt], VALUE, partition=(i // nt) % per)
        failed = 0
        try:
            producer.flush(300)
        except DeliveryError as exc:  # the cluster's doing: reported beside the figures
            failed = len(exc.failures)
            _log(f"kresilient producer: {failed} failed, {str(exc)[:300]}")
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        rss = _rss_kib() - rss0
    finally:
        producer.close()
    return {"wall": wall, "cpu": cpu, "rss_kib": rss, "failed": failed}


def consume_raw(bootstrap: str, topics: list[str], n: int) -> dict[str, float]:
    rss0 = _rss_kib()
    created, created_cpu = time.perf_counter(), time.process_time()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-scale-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    consumer.subscribe(topics)
    count = 0
    first = (0.0, 0.0)
    deadline = time.monotonic() + 600
    try:
        while count < n and time.monotonic() < deadline:
            msgs = consumer.consume(500, 1.0)
            last: dict[tuple[str, int], Any] = {}
            for m in msgs:
                if m.error() is None:
                    count += 1
                    if count == 1:
                        first = (time.perf_counter(), time.process_time())
                    last[(m.topic(), m.partition())] = m
            for m in last.values():
                consumer.store_offsets(message=m)
        if count < n:
            raise RuntimeError(f"raw consumer: {count} of {n}")
        wall, cpu = time.perf_counter() - first[0], time.process_time() - first[1]
        rss = _rss_kib() - rss0
    finally:
        consumer.close()
    return {
        "wall": wall,
        "cpu": cpu,
        "rss_kib": rss,
        "start": first[0] - created,
        "start_cpu": first[1] - created_cpu,
    }


def consume_kresilient(bootstrap: str, topics: list[str], n: int) -> dict[str, float]:
    rss0 = _rss_kib()
    count = [0]
    marks: list[tuple[float, float]] = []
    rss = [0]

    def handler(_msg: Any) -> None:
        count[0] += 1
        if count[0] == 1:
            marks.append((time.perf_counter(), time.process_time()))
        if count[0] == n:
            marks.append((time.perf_counter(), time.process_time()))
            rss[0] = _rss_kib() - rss0
            consumer.stop()

    created, created_cpu = time.perf_counter(), time.process_time()
    consumer = ResilientConsumer(
        {"bootstrap.servers": bootstrap, "group.id": f"bench-scale-kr-{uuid.uuid4().hex[:8]}"},
        topics,
        handler,
        dead_letter=None,
        install_signal_handlers=False,
    )
    consumer.run()
    (w0, c0), (w1, c1) = marks
    return {
        "wall": w1 - w0,
        "cpu": c1 - c0,
        "rss_kib": rss[0],
        "start": w0 - created,
        "start_cpu": c0 - created_cpu,
    }


def child(argv: list[str]) -> None:
    """``--child BOOTSTRAP N TOPIC...``: :func:`consume_kresilient` once, in this
    interpreter (kresilient from ``PYTHONPATH``); prints its figures as one JSON line."""
    import kresilient

    _quiet()
    r = consume_kresilient(argv[0], argv[2:], int(argv[1]))
    print(json.dumps({**r, "kresilient": kresilient.__file__}))


def consume_in(tree: Path) -> Callable[[str, list[str], int], dict[str, float]]:
    """The kresilient consumer arm in a fresh interpreter importing kresilient from
    ``tree``."""

    def run(bootstrap: str, topics: list[str], n: int) -> dict[str, float]:
        r = run_child(__file__, tree, [bootstrap, str(n), *topics])
        return {k: float(v) for k, v in r.items() if k != "kresilient"}

    return run


def record_statistics(bootstrap: str, topics: list[str], per: int) -> tuple[str, str]:
    """A producer's and a consumer's statistics document, each listing every partition."""
    docs: list[str] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "statistics.interval.ms": 1000, "stats_cb": docs.append}
    )
    for t in topics:
        for p in range(per):
            producer.produce(t, VALUE, partition=p)
    producer.flush(120)
    want = len(topics) * per
    deadline = time.monotonic() + 60
    prod_doc = ""
    while time.monotonic() < deadline and not prod_doc:
        producer.poll(0.5)
        for d in docs:
            if _known(d) >= want:
                prod_doc = d
    cdocs: list[str] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-scale-stats-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "statistics.interval.ms": 1000,
            "stats_cb": cdocs.append,
        }
    )
    consumer.subscribe(topics)
    cons_doc = ""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not cons_doc:
            consumer.consume(500, 0.5)
            for d in cdocs:
                if _known(d) >= want:
                    cons_doc = d
    finally:
        consumer.close()
    return prod_doc or (docs[-1] if docs else ""), cons_doc or (cdocs[-1] if cdocs else "")


def _known(doc: str) -> int:
    d = json.loads(doc)
    return sum(
        sum(1 for p in t.get("partitions", {}) if p != "-1") for t in d.get("topics", {}).values()
    )


# ----------------------------------------------------------------------------- bookkeeping


def bookkeeping(doc: str, ticks: int) -> dict[str, float]:
    """Thread CPU ms per statistics document: parse, monitor, producer and consumer paths."""
    now = [1000.0]
    monitor = LeadershipMonitor(clock=lambda: now[0])
    monitor.on_stats(doc)  # first sighting
    producer = ResilientProducer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": 0}, logger=_QUIET
    )
    conf = {"bootstrap.servers": "127.0.0.1:9", "group.id": "bench-scale-bk", "log_level": 0}
    consumer = ResilientConsumer(
        conf, ["t"], _noop, dead_letter=None, install_signal_handlers=False, logger=_QUIET
    )
    events = consumer._events
    # The asyncio consumer's librdkafka consumer is only created by run().
    aio = AsyncResilientConsumer(
        conf, ["t"], _anoop, dead_letter=None, handle_signals=False, logger=_QUIET
    )
    producer._on_stats(doc)
    events.on_stats(doc)
    aio._on_stats(doc)

    def cpu_ms(fn: Callable[[], object]) -> float:
        c0 = time.thread_time_ns()
        fn()
        return (time.thread_time_ns() - c0) / 1e6

    res: dict[str, list[float]] = {
        "loads": [],
        "monitor": [],
        "producer": [],
        "consumer": [],
        "aio": [],
    }
    try:
        for _ in range(ticks):
            gc.collect()
            now[0] += INTERVAL_MS / 1000
            res["loads"].append(cpu_ms(lambda: json.loads(doc)))
            res["monitor"].append(cpu_ms(lambda: monitor.on_stats(doc)))
            res["producer"].append(cpu_ms(lambda: producer._on_stats(doc)))
            res["consumer"].append(cpu_ms(lambda: events.on_stats(doc)))
            res["aio"].append(cpu_ms(lambda: aio._on_stats(doc)))
    finally:
        producer._producer.purge()
        producer.close(0)
        consumer.close()
    return {k: statistics.median(v) for k, v in res.items()}


def _paired_cpu(samples: list[Sample], arm: str, baseline: str) -> list[float]:
    """arm's CPU per message / baseline's, for every round where both ran."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s
    return [
        r[arm].cpu_us_per_msg / r[baseline].cpu_us_per_msg
        for _, r in sorted(by_round.items())
        if arm in r and baseline in r and r[baseline].cpu_us_per_msg > 0
    ]


def _paired_whole(
    samples: list[Sample], arm: str, baseline: str, *, cpu: bool = False
) -> list[float]:
    """Over the whole run (client created to last record: the start, a new group's seed
    included, plus the clocked part), for every round where both ran: the rate of arm /
    baseline, or (``cpu``) arm's CPU / baseline's. The clocked part alone favours a client
    that stalls before its first record while its fetcher already fills the queue, and a loop
    whose first ``consume()`` waits for a full batch."""
    by_round: dict[int, dict[str, Sample]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.arm] = s

    def whole(s: Sample) -> float:
        if cpu:
            return s.cpu_s + float(s.extra["start_cpu"])
        return s.wall_s + float(s.extra["start"])

    return [
        whole(r[arm]) / whole(r[baseline]) if cpu else whole(r[baseline]) / whole(r[arm])
        for _, r in sorted(by_round.items())
        if arm in r and baseline in r
    ]


def growth(sizes: list[int], values: list[float]) -> str:
    """flat / linear / worse than linear, between the two largest sizes (where a fixed cost
    per document no longer hides the per-partition one), with every step shown."""
    if len(sizes) < 2 or min(values) <= 0:
        return "-"
    steps = ", ".join(
        f"{a:,}->{b:,}: x{vb / va:,.1f}"
        for a, b, va, vb in zip(sizes, sizes[1:], values, values[1:], strict=False)
    )
    size_x = sizes[-1] / sizes[-2]
    cost_x = values[-1] / values[-2]
    if cost_x < 2:
        verdict = "flat"
    elif cost_x <= 1.5 * size_x:
        verdict = "linear (or below)"
    else:
        verdict = "WORSE than linear"
    return f"{verdict} (x{cost_x:,.1f} for x{size_x:,.0f} partitions; steps {steps})"


# ----------------------------------------------------------------------------- driver


def real_size(cluster: Any, args: argparse.Namespace, size: int) -> dict[str, Any]:
    bootstrap = cluster.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap})
    nt = min(10, size)
    per = size // nt
    topics = [f"bench-scale-{size}-{i}-{uuid.uuid4().hex[:6]}" for i in range(nt)]
    t0 = time.monotonic()
    create_topics(admin, topics, per, args.rf)
    _log(
        f"{size} partitions: {nt} topics x {per}, RF={args.rf}, ready in "
        f"{time.monotonic() - t0:.0f} s"
    )
    user = {"bootstrap.servers": bootstrap}
    config = producer_config(user)
    n = args.messages
    try:

        def parm(name: str, fn: Callable[[int], dict[str, float]]) -> Callable[[int], Sample]:
            def run(rnd: int) -> Sample:
                gc.collect()
                m = n if rnd >= 0 else min(n, 5_000)
                r = fn(m)
                s = Sample(
                    arm=name,
                    round=rnd,
                    messages=m,
                    wall_s=r["wall"],
                    cpu_s=r["cpu"],
                    extra={
                        "rss_kib": r["rss_kib"],
                        "failed": r.get("failed", 0),
                        "start": r.get("start", float("nan")),
                        "start_cpu": r.get("start_cpu", float("nan")),
                    },
                )
                start = f" start {r['start']:.2f} s" if "start" in r else ""
                _log(
                    f"  {size} p {'warm-up' if rnd < 0 else f'round {rnd}'} {name:20s} "
                    f"{s.rate:9,.0f} msg/s {s.cpu_us_per_msg:6.2f} CPU µs/msg "
                    f"RSS +{r['rss_kib'] / 1024:.1f} MiB{start} (load {os.getloadavg()[0]:.1f})"
                )
                return s

            return run

        prod = run_interleaved(
            {
                "raw producer": parm("raw producer", lambda m: produce_raw(config, topics, per, m)),
                "kresilient producer": parm(
                    "kresilient producer", lambda m: produce_kresilient(user, topics, per, m)
                ),
            },
            rounds=args.rounds,
        )
        cons_arms = {
            "raw consumer": parm("raw consumer", lambda m: consume_raw(bootstrap, topics, m)),
            "kresilient consumer": parm(
                "kresilient consumer", lambda m: consume_kresilient(bootstrap, topics, m)
            ),
        }
        if args.old_tree:
            new_tree = Path(args.new_tree) if args.new_tree else _HERE.parent
            for arm, tree in ((NEW_ARM, new_tree), (OLD_ARM, Path(args.old_tree))):
                run_tree = consume_in(tree)
                cons_arms[arm] = parm(
                    arm, lambda m, run_tree=run_tree: run_tree(bootstrap, topics, m)
                )
        cons = run_interleaved(cons_arms, rounds=args.rounds)
        pdoc, cdoc = record_statistics(bootstrap, topics, per)
    finally:
        delete_topics(admin, topics)
    return {"samples": prod + cons, "pdoc": pdoc, "cdoc": cdoc, "topics": nt}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 100, 1000, 10000]
    )
    ap.add_argument(
        "--real-max",
        type=int,
        default=1000,
        help="largest size created on the cluster; above: generated statistics only",
    )
    ap.add_argument("--rf", type=int, default=3)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=7)
    ap.add_argument(
        "--old-tree",
        help="a checkout whose kresilient two more consumer arms compare with this tree's",
    )
    ap.add_argument(
        "--new-tree",
        help="with --old-tree: the checkout of the 'this tree' arm (default: this checkout; "
        "a fixed commit when the working tree is being edited)",
    )
    args = ap.parse_args()
    _quiet()
    load_before = os.getloadavg()[0]
    real = [s for s in args.sizes if s <= args.real_max]
    results: dict[int, dict[str, Any]] = {}
    env = environment(rf=args.rf, messages=args.messages, rounds=args.rounds, ticks=args.ticks)
    if real:
        with KafkaCluster() as cluster:
            env["cluster"] = repr(cluster)
            for size in real:
                results[size] = real_size(cluster, args, size)
    book: dict[tuple[int, str], dict[str, float]] = {}
    docsize: dict[tuple[int, str], int] = {}
    for size in args.sizes:
        gen = generated_statistics(size, topics=min(10, size))
        kinds = [("generated", gen)]
        if size in results:
            kinds += [
                ("recorded producer", results[size]["pdoc"]),
                ("recorded consumer", results[size]["cdoc"]),
            ]
        for kind, doc in kinds:
            if not doc:
                continue
            book[(size, kind)] = bookkeeping(doc, args.ticks)
            docsize[(size, kind)] = len(doc)
            b = book[(size, kind)]
            _log(
                f"bookkeeping {size} {kind}: loads {b['loads']:.2f} ms, monitor "
                f"{b['monitor']:.2f}, producer {b['producer']:.2f}, consumer {b['consumer']:.2f}"
            )
    label = contention(load_before, os.getloadavg()[0])

    print(f"## Scale with partitions ({label})\n")
    if results:
        print(
            f"Real cluster: {args.messages:,} x 100 B per arm and round, {args.rounds} rounds "
            "(+1 warm-up), every partition gets traffic; RSS = client's added VmRSS.\n"
        )
        print(
            "| partitions | topics | arm | msgs/s median [IQR] | CPU µs/msg | RSS added MiB "
            "| ratio vs raw (paired) [IQR] | CPU / raw's (paired) [IQR] | start s median "
            "[IQR] (consumers: whole-run rate / raw's, paired) | failed deliveries |"
        )
        print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        arms = ["raw producer", "kresilient producer", "raw consumer", "kresilient consumer"]
        if args.old_tree:
            arms += [NEW_ARM, OLD_ARM]
        for size, r in results.items():
            for arm in arms:
                mine = [s for s in r["samples"] if s.arm == arm]
                rate, q1, q3 = median_iqr([s.rate for s in mine])
                cpu = statistics.median(s.cpu_us_per_msg for s in mine)
                rss = statistics.median(s.extra["rss_kib"] for s in mine) / 1024
                base = "raw producer" if "producer" in arm else "raw consumer"
                if base == arm:
                    ratio = cpu_ratio = "1"
                else:
                    m, a, b = median_iqr(paired_ratios(r["samples"], arm, base))
                    ratio = f"{m:.2f} [{a:.2f}-{b:.2f}]"
                    m, a, b = median_iqr(_paired_cpu(r["samples"], arm, base))
                    cpu_ratio = f"{m:.2f} [{a:.2f}-{b:.2f}]"
                st, s1, s3 = median_iqr([s.extra["start"] for s in mine])
                start = f"{st:.2f} [{s1:.2f}-{s3:.2f}]" if "consumer" in arm else "-"
                if "consumer" in arm and arm != base:
                    m, a, b = median_iqr(_paired_whole(r["samples"], arm, base))
                    c, c1, c3 = median_iqr(_paired_whole(r["samples"], arm, base, cpu=True))
                    start += (
                        f"; whole run: rate {m:.2f} [{a:.2f}-{b:.2f}], CPU {c:.2f} "
                        f"[{c1:.2f}-{c3:.2f}] x raw's"
                    )
                failed = sum(s.extra["failed"] for s in mine)
                print(
                    f"| {size:,} | {r['topics']} | {arm} | {rate:,.0f} [{q1:,.0f}-{q3:,.0f}] "
                    f"| {cpu:.2f} | {rss:.1f} | {ratio} | {cpu_ratio} | {start} | {failed} |"
                )
        print()
        if args.old_tree:
            new_tree = args.new_tree or "this checkout"
            print(f"This tree ({new_tree}) / the old tree ({args.old_tree}), paired per round:\n")
            for size, r in results.items():
                m, a, b = median_iqr(paired_ratios(r["samples"], NEW_ARM, OLD_ARM))
                c, c1, c3 = median_iqr(_paired_cpu(r["samples"], NEW_ARM, OLD_ARM))
                w, w1, w3 = median_iqr(_paired_whole(r["samples"], NEW_ARM, OLD_ARM))
                wc, wc1, wc3 = median_iqr(_paired_whole(r["samples"], NEW_ARM, OLD_ARM, cpu=True))
                new_st = [s.extra["start"] for s in r["samples"] if s.arm == NEW_ARM]
                old_st = [s.extra["start"] for s in r["samples"] if s.arm == OLD_ARM]
                print(
                    f"- {size:,} partitions: throughput {m:.2f} [IQR {a:.2f}-{b:.2f}], whole "
                    f"run {w:.2f} [{w1:.2f}-{w3:.2f}] (CPU {wc:.2f} [{wc1:.2f}-{wc3:.2f}]), "
                    f"CPU per message {c:.2f} "
                    f"[{c1:.2f}-{c3:.2f}], start {statistics.median(new_st):.2f} s vs "
                    f"{statistics.median(old_st):.2f} s (medians)"
                )
            print()
    print(
        f"Statistics bookkeeping per document (thread CPU ms, median of {args.ticks} ticks); "
        f"% core = the producer's stats_cb path every {INTERVAL_MS / 1000:.0f} s.\n"
    )
    print(
        "| partitions | document | size MB | json.loads | monitor.on_stats(text) | producer "
        "stats_cb | consumer stats_cb | asyncio consumer stats_cb "
        "| % of a core @5 s (producer / consumer / asyncio consumer) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for (size, kind), b in book.items():
        pct_p = b["producer"] / INTERVAL_MS * 100
        pct_c = b["consumer"] / INTERVAL_MS * 100
        pct_a = b["aio"] / INTERVAL_MS * 100
        print(
            f"| {size:,} | {kind} | {docsize[(size, kind)] / 1e6:.2f} | {b['loads']:.2f} | "
            f"{b['monitor']:.2f} | {b['producer']:.2f} | {b['consumer']:.2f} | {b['aio']:.2f} | "
            f"{pct_p:.2f}% / {pct_c:.2f}% / {pct_a:.2f}% |"
        )
    gen_sizes = [s for s in args.sizes if (s, "generated") in book]
    print("\nGrowth (generated documents, smallest to largest size):")
    for key in ("loads", "monitor", "producer", "consumer", "aio"):
        vals = [book[(s, "generated")][key] for s in gen_sizes]
        print(f"- {key}: {growth(gen_sizes, vals)}")
    if len(results) >= 2:
        rs = sorted(results)
        print("\nGrowth of per-message CPU on the cluster (smallest to largest real size):")
        for arm in ("raw producer", "kresilient producer", "raw consumer", "kresilient consumer"):
            vals = [
                statistics.median(s.cpu_us_per_msg for s in results[z]["samples"] if s.arm == arm)
                for z in rs
            ]
            print(f"- {arm}: {growth(rs, vals)}")
    print("\nEnvironment: " + ", ".join(f"{k}={v}" for k, v in env.items()))


if __name__ == "__main__":
    main()
