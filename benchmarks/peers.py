"""kresilient against the libraries a team would pick instead (issue 18).

Every arm runs in this one process (one venv: the same confluent-kafka and librdkafka for all),
on the same cluster, with the same configuration; rounds are interleaved with the arm order
shuffled and one warm-up round discarded (``benchmarks/_common.py``); the headline is the
paired per-round ratio to a baseline arm, median and IQR.

Sections (``--sections``, default all):

``producer`` -- 100 B and 1 KiB values, no key, a fresh ``--partitions`` topic (RF=3,
``min.insync.replicas=2``) per arm and round; the clock runs from the first ``produce`` to
``flush()`` returning with every delivery report in and none failed. acks=all + idempotence on
every arm (kresilient's ``producer_config`` is given to every arm):

- ``raw``: ``confluent_kafka.Producer``, the hand-written loop of benchmarks/producer.py;
- ``kresilient``: ``ResilientProducer`` (no OpenTelemetry SDK);
- ``quix``: quix-streams' producer, ``Application(...).get_producer()`` with the same
  librdkafka settings as ``producer_extra_config``, ``produce(topic, value, on_delivery=...)``
  (it handles ``BufferError`` itself).

``consumer`` -- one pre-produced topic (``--consume-messages`` x 100 B over ``--partitions``
partitions), read from the beginning by a fresh group per arm and round; a trivial handler
counts; offsets are committed only for handled messages. Timed from the first handled message
to the last (group join excluded):

- ``raw``: the loop of benchmarks/consumer.py (``consume(500)``, handler, ``store_offsets`` of
  the last handled message per partition, auto-commit every 5 s);
- ``kresilient``: ``ResilientConsumer`` with its defaults (dead-letter topic created);
- ``quix``: ``Application`` + ``dataframe(topic).update(handler).sink(no-op BatchingSink)``,
  checkpoint (sink flush, then commit) every 5 s (``commit_interval=5``);
- ``arroyo``: ``StreamProcessor`` with ``RunTask(handler, CommitOffsets(commit))`` and
  ``CommitPolicy(min_commit_frequency_sec=5)``.

``tracing`` -- the same SDK ``TracerProvider`` object for both traced arms of a sampler
(``ParentBased(TraceIdRatioBased(0.01))``, or ``ALWAYS_ON``), a ``BatchSpanProcessor`` whose
exporter drops spans, no MeterProvider on either side (the official instrumentation records no
metrics; kresilient gets the API's no-op meter), the global W3C propagator on both:

- producer, 100 B: ``raw`` (no header), ``raw+header`` (the same 55-byte ``traceparent`` on
  every record, no tracing: the header's own cost), ``kresilient`` with the SDK,
  ``instrumented``: raw ``Producer`` wrapped by ``opentelemetry-instrumentation-confluent-
  kafka`` (``ConfluentKafkaInstrumentor().instrument_producer``), same loop as ``raw``;
- consumer: a topic whose records carry a ``traceparent`` (1% of them sampled, as a 1%-sampling
  upstream writes them), ``raw`` (no tracing), ``kresilient`` with the SDK (a handler: one
  span per message), ``kresilient-batch`` (a ``batch_handler``: one span per partition's run of
  a consumed batch, linked to each record's producer context), ``kresilient-call`` (a handler
  with ``trace_spans="call"``: one span per ``consume()`` result, linked to each record's
  producer context, the official instrumentation's density), ``instrumented``: raw
  ``Consumer`` wrapped by ``instrument_consumer``, the raw loop.

What each traced arm records differs, see docs/performance.md: kresilient's producer span ends
at the delivery report (with partition/offset/error); the official one ends when ``produce()``
returns. kresilient's consumer span covers the handler per message (``batch_handler``: per
call); the official consumer instrumentation makes one span per ``consume()`` call (none per
message).

    .venv-bench-quix/bin/python -P benchmarks/peers.py                     # all sections
    .venv-bench-quix/bin/python -P benchmarks/peers.py --sections producer --rounds 5

``--start restart`` (consumer arms, tracing consumers too): each sample's group is committed
at offset 0 of every partition with kresilient's clean-end marker before the arm starts (not
timed), as a cleanly stopped consumer leaves it; the default ``new-group`` times kresilient's
first-start commits (one per never-committed partition, once in a group's life) as well.

Uses ``KRESILIENT_BOOTSTRAP_SERVERS`` or starts a local 3-node cluster; deletes every topic it
creates. Prints markdown (progress on stderr).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from confluent_kafka import Consumer, Producer  # noqa: E402

from kresilient.config import producer_config  # noqa: E402
from kresilient.consumer import ResilientConsumer  # noqa: E402
from kresilient.producer import ResilientProducer  # noqa: E402
from kresilient.testing import KafkaCluster  # noqa: E402

sys.path.append(str(_HERE))
from _common import (  # noqa: E402
    Sample,
    Timer,
    contention,
    environment,
    markdown_table,
    peak_rss_mib,
    precommit_clean,
    run_interleaved,
)

POLL_MASK = 1023
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PEER_PACKAGES = (
    "confluent-kafka",
    "quixstreams",
    "sentry-arroyo",
    "opentelemetry-sdk",
    "opentelemetry-instrumentation-confluent-kafka",
)


def _quiet() -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )
    for name in ("quixstreams", "arroyo", "opentelemetry"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def versions() -> dict[str, str]:
    out = {}
    for name in PEER_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# ------------------------------------------------------------------------------- producer


def produce_raw(
    config: dict[str, Any],
    topic: str,
    value: bytes,
    n: int,
    *,
    headers: Any = None,
    wrap: Callable[[Any], Any] | None = None,
) -> Timer:
    """The hand-written loop (optionally with a header list, optionally instrumented)."""
    errors = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    producer: Any = Producer({**config, "error_cb": _noop, "stats_cb": _noop})
    if wrap is not None:
        producer = wrap(producer)
    produce, poll = producer.produce, producer.poll
    with Timer() as t:
        if headers is None:
            for i in range(n):
                while True:
                    try:
                        produce(topic, value, on_delivery=on_delivery)
                        break
                    except BufferError:
                        poll(0.05)
                if not i & POLL_MASK:
                    poll(0)
        else:
            for i in range(n):
                while True:
                    try:
                        produce(topic, value, headers=headers, on_delivery=on_delivery)
                        break
                    except BufferError:
                        poll(0.05)
                if not i & POLL_MASK:
                    poll(0)
        remaining = producer.flush(120)
    if remaining or errors[0]:
        raise RuntimeError(f"raw: {remaining} left, {errors[0]} failed")
    return t


def produce_kresilient(
    user: dict[str, Any],
    topic: str,
    value: bytes,
    n: int,
    *,
    full_handles: bool = False,
    **telemetry: Any,
) -> Timer:
    producer = ResilientProducer(user, **telemetry)
    if full_handles:  # diagnostic: every message gets a _FullHandle (before 7bf5c09)
        producer._poolable = False
    produce = producer.produce
    try:
        with Timer() as t:
            for _ in range(n):
                produce(topic, value)
            producer.flush(120)  # raises DeliveryError on any failure
    finally:
        producer.close()
    return t


_QUIX_OWNED = ("bootstrap.servers", "error_cb", "stats_cb", "logger", "on_delivery")


def produce_quix(config: dict[str, Any], topic: str, value: bytes, n: int) -> Timer:
    from quixstreams import Application

    extra = {k: v for k, v in config.items() if k not in _QUIX_OWNED}
    app = Application(
        broker_address=config["bootstrap.servers"],
        producer_extra_config=extra,
        loglevel=None,
        auto_create_topics=False,
    )
    errors = [0]

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors[0] += 1

    with app.get_producer() as producer:
        produce = producer.produce
        with Timer() as t:
            for _ in range(n):
                produce(topic, value, on_delivery=on_delivery)
            remaining = producer.flush(120)
    if remaining or errors[0]:
        raise RuntimeError(f"quix: {remaining} left, {errors[0]} failed")
    return t


# ------------------------------------------------------------------------------- consumer


class _Marks:
    """First/last handled message times; ``done`` set at the n-th."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.first = (0.0, 0.0)
        self.last = (0.0, 0.0)
        self.done = threading.Event()

    def hit(self) -> bool:
        self.count += 1
        if self.count == 1:
            self.first = (time.perf_counter(), time.process_time())
        if self.count == self.n:
            self.last = (time.perf_counter(), time.process_time())
            self.done.set()
            return True
        return False

    def result(self) -> tuple[float, float]:
        if self.count < self.n:
            raise RuntimeError(f"only {self.count} of {self.n} messages handled")
        # n - 1 intervals, scaled to n
        k = self.n / max(self.n - 1, 1)
        return (self.last[0] - self.first[0]) * k, (self.last[1] - self.first[1]) * k


#: ``--start``: "new-group" (every sample a never-committed group) or "restart" (each sample's
#: group pre-committed at offset 0 of every partition with kresilient's clean-end marker).
_START: dict[str, Any] = {"mode": "new-group", "partitions": 6}
#: ``--fetch-queue-backoff-ms``: librdkafka settings added to every consumer arm's config.
_CONSUMER_EXTRA: dict[str, Any] = {}


def _group(arm: str, bootstrap: str | None = None, topic: str | None = None) -> str:
    """A new group id; with ``--start restart`` (and a topic) committed at offset 0 first,
    outside the timed window, as a cleanly stopped consumer of any of the arms leaves it: the
    crash-loop guard's first-start commits (once in a group's life) are then not timed. The
    other arms ignore the commit metadata and start from offset 0 as from ``earliest``."""
    group = f"bench-peers-{arm}-{uuid.uuid4().hex[:8]}"
    if _START["mode"] == "restart" and bootstrap is not None and topic is not None:
        precommit_clean(bootstrap, group, topic, _START["partitions"])
    return group


def consume_raw(
    bootstrap: str, topic: str, n: int, wrap: Callable[[Any], Any] | None = None
) -> tuple[float, float]:
    consumer: Any = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _group("raw", bootstrap, topic),
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "partition.assignment.strategy": "cooperative-sticky",
            **_CONSUMER_EXTRA,
        }
    )
    if wrap is not None:
        consumer = wrap(consumer)
    consumer.subscribe([topic])
    marks = _Marks(n)
    # the official instrumentation's ProxiedConsumer has no store_offsets: the wrapped one's
    store = consumer.store_offsets if wrap is None else consumer.original_consumer().store_offsets
    deadline = time.monotonic() + 600
    try:
        while marks.count < n and time.monotonic() < deadline:
            msgs = consumer.consume(500, 1.0)
            last: dict[int, Any] = {}
            for msg in msgs:
                if msg.error() is None:
                    marks.hit()
                    last[msg.partition()] = msg
            for m in last.values():
                store(message=m)
        return marks.result()
    finally:
        consumer.close()


def consume_kresilient(
    bootstrap: str, topic: str, n: int, *, batch: bool = False, **options: Any
) -> tuple[float, float]:
    """``batch``: a ``batch_handler`` (one call, and one process span, per partition's run of
    a consumed batch) instead of a per-message handler; same per-message work inside."""
    marks = _Marks(n)
    consumer: ResilientConsumer

    def handler(_msg: Any) -> None:
        if marks.hit():
            consumer.stop()

    def batch_handler(msgs: list[Any]) -> None:
        for _msg in msgs:
            if marks.hit():
                consumer.stop()

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": _group("kr", bootstrap, topic),
            **_CONSUMER_EXTRA,
        },
        [topic],
        None if batch else handler,
        batch_handler=batch_handler if batch else None,
        install_signal_handlers=False,
        **options,
    )
    consumer.run()
    return marks.result()


def consume_quix(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    from quixstreams import Application
    from quixstreams.sinks import BatchingSink, SinkBatch

    class NoopSink(BatchingSink):
        def write(self, batch: SinkBatch) -> None:
            return None

    marks = _Marks(n)
    app = Application(
        broker_address=bootstrap,
        consumer_group=_group("quix", bootstrap, topic),
        auto_offset_reset="earliest",
        commit_interval=5.0,
        loglevel=None,
        auto_create_topics=False,
        use_changelog_topics=False,
        consumer_extra_config=dict(_CONSUMER_EXTRA),
    )

    def handler(_value: Any) -> None:
        if marks.hit():
            app.stop()

    t = app.topic(topic, value_deserializer="bytes", key_deserializer="bytes")
    sdf = app.dataframe(t)
    sdf = sdf.update(handler)
    sdf.sink(NoopSink())
    app.run()
    return marks.result()


def consume_arroyo(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    from arroyo.backends.kafka import KafkaConsumer
    from arroyo.backends.kafka.configuration import build_kafka_consumer_configuration
    from arroyo.commit import CommitPolicy
    from arroyo.processing import StreamProcessor
    from arroyo.processing.strategies import CommitOffsets, RunTask
    from arroyo.processing.strategies.abstract import ProcessingStrategyFactory
    from arroyo.types import Topic

    marks = _Marks(n)
    processor: Any = None

    def handler(message: Any) -> Any:
        if marks.hit():
            processor.signal_shutdown()
        return message.payload

    class Factory(ProcessingStrategyFactory[Any]):
        def create_with_partitions(self, commit: Any, partitions: Any) -> Any:
            return RunTask(handler, CommitOffsets(commit))

    consumer = KafkaConsumer(
        build_kafka_consumer_configuration(
            {"bootstrap.servers": bootstrap, **_CONSUMER_EXTRA},
            group_id=_group("arroyo", bootstrap, topic),
            auto_offset_reset="earliest",
        )
    )
    processor = StreamProcessor(
        consumer,
        Topic(topic),
        Factory(),
        CommitPolicy(min_commit_frequency_sec=5.0, min_commit_messages=None),
    )
    processor.run()
    return marks.result()


# ------------------------------------------------------------------------------- tracing


def tracer_provider(sampler_name: str) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased

    class DropExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    sampler = ParentBased(TraceIdRatioBased(0.01)) if sampler_name == "1%" else ALWAYS_ON
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=8192))
    return provider


def _instrument_producer(tp: Any) -> Callable[[Any], Any]:
    from opentelemetry.instrumentation.confluent_kafka import ConfluentKafkaInstrumentor

    return lambda p: ConfluentKafkaInstrumentor().instrument_producer(p, tracer_provider=tp)


def _instrument_consumer(tp: Any) -> Callable[[Any], Any]:
    from opentelemetry.instrumentation.confluent_kafka import ConfluentKafkaInstrumentor

    return lambda c: ConfluentKafkaInstrumentor().instrument_consumer(c, tracer_provider=tp)


def _kr_telemetry(tp: Any) -> dict[str, Any]:
    from opentelemetry import metrics

    return {"tracer_provider": tp, "meter_provider": metrics.NoOpMeterProvider()}


def _traced_input(bootstrap: str, topic: str, n: int) -> None:
    """n x 100 B records with a ``traceparent`` each, 1% of them flagged sampled."""
    import random

    rng = random.Random(18)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "all"})
    value = b"x" * 100
    for i in range(n):
        tid = rng.getrandbits(128)
        sid = rng.getrandbits(64) or 1
        flags = "01" if rng.random() < 0.01 else "00"
        header = f"00-{tid:032x}-{sid:016x}-{flags}".encode()
        while True:
            try:
                producer.produce(topic, value, headers=[("traceparent", header)])
                break
            except BufferError:
                producer.poll(0.05)
        if not i & 0x3FFF:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("input records still queued after 120 s")


def _plain_input(bootstrap: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "acks": "all"})
    value = b"x" * 100
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value, key=b"%d" % i)
                break
            except BufferError:
                producer.poll(0.05)
        if not i & 0x3FFF:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("input records still queued after 120 s")


# ------------------------------------------------------------------------------- driver


def _show(section: str) -> Callable[[Sample], None]:
    def show(s: Sample) -> None:
        tag = "warm-up" if s.round < 0 else f"round {s.round}"
        print(
            f"  {section} {tag:8s} {s.arm:24s} {s.rate:10,.0f} msg/s "
            f"{s.cpu_us_per_msg:7.2f} CPU µs/msg (load {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
            flush=True,
        )

    return show


def _producer_arm(
    cluster: Any,
    args: argparse.Namespace,
    name: str,
    size: int,
    fn: Callable[[str, bytes, int], Timer],
) -> Callable[[int], Sample]:
    value = os.urandom(size)

    def run(round_no: int) -> Sample:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name.replace("%", "pct"))
        topic = f"bench-peers-{slug}-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, args.partitions, 3, {"min.insync.replicas": 2})
        n = args.messages if round_no >= 0 else min(args.messages, 20_000)
        gc.collect()
        try:
            t = fn(topic, value, n)
        finally:
            cluster.delete_topic(topic)
        return Sample(
            arm=name,
            round=round_no,
            messages=n,
            wall_s=t.wall_s,
            cpu_s=t.cpu_s,
            extra={"gc_s": t.gc_s},
        )

    return run


def _consumer_arm(
    name: str, n: int, fn: Callable[[int], tuple[float, float]]
) -> Callable[[int], Sample]:
    def run(round_no: int) -> Sample:
        gc.collect()
        wall, cpu = fn(n)
        return Sample(arm=name, round=round_no, messages=n, wall_s=wall, cpu_s=cpu)

    return run


def section_producer(cluster: Any, args: argparse.Namespace, out: list[str]) -> None:
    bootstrap = cluster.bootstrap_servers
    user = {"bootstrap.servers": bootstrap}
    config = producer_config(user)
    for size in args.sizes:
        arms = {
            "raw": _producer_arm(
                cluster, args, "raw", size, lambda t, v, n: produce_raw(config, t, v, n)
            ),
            "kresilient": _producer_arm(
                cluster, args, "kresilient", size, lambda t, v, n: produce_kresilient(user, t, v, n)
            ),
            "quix": _producer_arm(
                cluster, args, "quix", size, lambda t, v, n: produce_quix(config, t, v, n)
            ),
        }
        arms = {k: v for k, v in arms.items() if k in args.producer_arms}
        samples = run_interleaved(
            arms, rounds=args.rounds, seed=args.seed, on_sample=_show(f"producer {size} B")
        )
        out.append(
            markdown_table(
                samples,
                baseline="raw",
                arms=list(arms),
                title=f"Producer, {size} B values, acks=all + idempotence",
            )
        )
        if "quix" in arms:
            out.append(
                markdown_table(
                    samples,
                    baseline="quix",
                    arms=["kresilient", "quix"],
                    title=f"Producer, {size} B: kresilient vs quix-streams",
                )
            )


def section_consumer(cluster: Any, args: argparse.Namespace, out: list[str]) -> None:
    bootstrap = cluster.bootstrap_servers
    n = args.consume_messages
    topic = cluster.create_topic(
        f"bench-peers-in-{uuid.uuid4().hex[:6]}", args.partitions, 3, {"min.insync.replicas": 2}
    )
    cluster.create_topic(topic + ".dlq", args.partitions, 3, {"min.insync.replicas": 2})
    try:
        _plain_input(bootstrap, topic, n)
        arms = {
            "raw": _consumer_arm("raw", n, lambda k: consume_raw(bootstrap, topic, k)),
            "kresilient": _consumer_arm(
                "kresilient", n, lambda k: consume_kresilient(bootstrap, topic, k)
            ),
            # diagnostic: without crash-loop protection (its first-assignment commits)
            "kresilient-no-crash-guard": _consumer_arm(
                "kresilient-no-crash-guard",
                n,
                lambda k: consume_kresilient(bootstrap, topic, k, max_process_deaths=None),
            ),
            "quix": _consumer_arm("quix", n, lambda k: consume_quix(bootstrap, topic, k)),
            "arroyo": _consumer_arm("arroyo", n, lambda k: consume_arroyo(bootstrap, topic, k)),
        }
        arms = {k: v for k, v in arms.items() if k in args.consumer_arms}
        samples = run_interleaved(
            arms, rounds=args.rounds, seed=args.seed, on_sample=_show("consumer")
        )
    finally:
        cluster.delete_topic(topic)
        cluster.delete_topic(topic + ".dlq")
    title = (
        f"Consumer, at-least-once, trivial handler, {n:,} x 100 B over {args.partitions} partitions"
    )
    out.append(markdown_table(samples, baseline="raw", arms=list(arms), title=title))
    for peer in ("quix", "arroyo"):
        if peer in arms:
            out.append(
                markdown_table(
                    samples,
                    baseline=peer,
                    arms=["kresilient", peer],
                    title=f"Consumer: kresilient vs {peer}",
                )
            )


def section_tracing(cluster: Any, args: argparse.Namespace, out: list[str]) -> None:
    bootstrap = cluster.bootstrap_servers
    user = {"bootstrap.servers": bootstrap}
    config = producer_config(user)
    header = [("traceparent", TRACEPARENT)]
    providers = {name: tracer_provider(name) for name in ("1%", "100%")}
    if "producer" in args.trace_sides:
        n = args.trace_messages
        targs = argparse.Namespace(**{**vars(args), "messages": n})
        arms: dict[str, Callable[[int], Sample]] = {
            "raw": _producer_arm(
                cluster, targs, "raw", 100, lambda t, v, k: produce_raw(config, t, v, k)
            ),
            "raw+header": _producer_arm(
                cluster,
                targs,
                "raw+header",
                100,
                lambda t, v, k: produce_raw(config, t, v, k, headers=header),
            ),
        }
        # diagnostic: the sampled-out path as before 7bf5c09 (a _FullHandle per message)
        arms["kresilient 1% full-handle"] = _producer_arm(
            cluster,
            targs,
            "kresilient 1% full-handle",
            100,
            lambda t, v, k: produce_kresilient(
                user, t, v, k, full_handles=True, **_kr_telemetry(providers["1%"])
            ),
        )
        for name, tp in providers.items():
            arms[f"kresilient {name}"] = _producer_arm(
                cluster,
                targs,
                f"kresilient {name}",
                100,
                lambda t, v, k, tp=tp: produce_kresilient(user, t, v, k, **_kr_telemetry(tp)),
            )
            arms[f"instrumented {name}"] = _producer_arm(
                cluster,
                targs,
                f"instrumented {name}",
                100,
                lambda t, v, k, tp=tp: produce_raw(config, t, v, k, wrap=_instrument_producer(tp)),
            )
        if args.trace_producer_arms is not None:
            arms = {k: v for k, v in arms.items() if k in args.trace_producer_arms}
        else:
            del arms["kresilient 1% full-handle"]
        samples = run_interleaved(
            arms, rounds=args.rounds, seed=args.seed, on_sample=_show("tracing producer")
        )
        out.append(
            markdown_table(
                samples,
                baseline="raw" if "raw" in arms else next(iter(arms)),
                arms=list(arms),
                title="Tracing, producer, 100 B (spans end: kresilient at the "
                "delivery report, instrumented at produce() return)",
            )
        )
        pairs = [
            (f"kresilient {name}", f"instrumented {name}", f"{name}: kresilient vs official")
            for name in providers
        ]
        pairs.append(("kresilient 1%", "raw+header", "1%: kresilient vs raw carrying the header"))
        pairs.append(
            (
                "kresilient 1% full-handle",
                "raw+header",
                "1%, a _FullHandle per message (before 7bf5c09), vs raw carrying the header",
            )
        )
        pairs.append(
            ("kresilient 1%", "kresilient 1% full-handle", "1%: pooled lean handle vs _FullHandle")
        )
        for arm, baseline, what in pairs:
            if arm in arms and baseline in arms:
                out.append(
                    markdown_table(
                        samples,
                        baseline=baseline,
                        arms=[arm, baseline],
                        title=f"Tracing producer {what}",
                    )
                )

    if "consumer" in args.trace_sides:
        cn = args.trace_consume_messages
        topic = cluster.create_topic(
            f"bench-peers-tin-{uuid.uuid4().hex[:6]}",
            args.partitions,
            3,
            {"min.insync.replicas": 2},
        )
        cluster.create_topic(topic + ".dlq", args.partitions, 3, {"min.insync.replicas": 2})
        try:
            _traced_input(bootstrap, topic, cn)
            carms: dict[str, Callable[[int], Sample]] = {
                "raw": _consumer_arm("raw", cn, lambda k: consume_raw(bootstrap, topic, k)),
            }
            for name, tp in providers.items():
                carms[f"kresilient {name}"] = _consumer_arm(
                    f"kresilient {name}",
                    cn,
                    lambda k, tp=tp: consume_kresilient(bootstrap, topic, k, **_kr_telemetry(tp)),
                )
                for mode, (arm, options, _title) in _KR_CONSUMER_MODES.items():
                    if mode in args.kr_consumer_modes:
                        carms[f"{arm} {name}"] = _consumer_arm(
                            f"{arm} {name}",
                            cn,
                            lambda k, tp=tp, options=options: consume_kresilient(
                                bootstrap, topic, k, **options, **_kr_telemetry(tp)
                            ),
                        )
                carms[f"instrumented {name}"] = _consumer_arm(
                    f"instrumented {name}",
                    cn,
                    lambda k, tp=tp: consume_raw(
                        bootstrap, topic, k, wrap=_instrument_consumer(tp)
                    ),
                )
            csamples = run_interleaved(
                carms, rounds=args.rounds, seed=args.seed, on_sample=_show("tracing consumer")
            )
        finally:
            cluster.delete_topic(topic)
            cluster.delete_topic(topic + ".dlq")
        out.append(
            markdown_table(
                csamples,
                baseline="raw",
                arms=list(carms),
                title=f"Tracing, consumer, {cn:,} x 100 B with traceparent "
                "(1% flagged sampled); spans: kresilient one per message "
                "around the handler, instrumented one per consume() call",
            )
        )
        paired = [("kresilient", "")] + [
            (arm, f" {title}")
            for mode, (arm, _options, title) in _KR_CONSUMER_MODES.items()
            if mode in args.kr_consumer_modes
        ]
        for name in providers:
            for arm, title in paired:
                out.append(
                    markdown_table(
                        csamples,
                        baseline=f"instrumented {name}",
                        arms=[f"{arm} {name}", f"instrumented {name}"],
                        title=f"Tracing consumer {name}: kresilient{title} vs official",
                    )
                )
    for tp in providers.values():
        tp.shutdown()


# traced kresilient consumer arms beside the default (a handler, a span per message):
# mode -> (arm name, consume_kresilient options, what its spans are)
_KR_CONSUMER_MODES: dict[str, tuple[str, dict[str, Any], str]] = {
    "batch": (
        "kresilient-batch",
        {"batch": True},
        "batch_handler (one span per partition run, linked)",
    ),
    "call": (
        "kresilient-call",
        {"trace_spans": "call"},
        'handler, trace_spans="call" (one span per consume() result, linked)',
    ),
}

SECTIONS = {"producer": section_producer, "consumer": section_consumer, "tracing": section_tracing}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", type=lambda s: s.split(","), default=list(SECTIONS))
    parser.add_argument("--messages", type=int, default=200_000, help="producer, per arm/round")
    parser.add_argument("--consume-messages", type=int, default=1_000_000)
    parser.add_argument("--trace-messages", type=int, default=50_000, help="tracing producer")
    parser.add_argument("--trace-consume-messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument(
        "--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1024]
    )
    parser.add_argument(
        "--trace-sides", type=lambda s: s.split(","), default=["producer", "consumer"]
    )
    parser.add_argument(
        "--trace-producer-arms",
        type=lambda s: s.split(","),
        default=None,
        help="tracing producer arms to run (default: all but the diagnostic 'kresilient 1%% "
        "full-handle', the sampled-out path with a _FullHandle per message as before 7bf5c09)",
    )
    parser.add_argument(
        "--kr-consumer-modes",
        type=lambda s: s.split(","),
        default=["message", "batch", "call"],
        help="traced kresilient consumer arms: 'message' (a handler, a span per message; "
        "always run), 'batch' (a batch_handler, a span per partition run with links) and "
        "'call' (a handler with trace_spans='call', a span per consume() result with links)",
    )
    parser.add_argument(
        "--producer-arms", type=lambda s: s.split(","), default=["raw", "kresilient", "quix"]
    )
    parser.add_argument(
        "--consumer-arms",
        type=lambda s: s.split(","),
        default=["raw", "kresilient", "quix", "arroyo"],
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--start",
        choices=("new-group", "restart"),
        default="new-group",
        help="consumer arms: each sample in a never-committed group (kresilient's crash-loop "
        "guard commits each partition once before its first record) or restart (pre-committed "
        "at offset 0 with the clean-end marker, the steady state of a restarted service)",
    )
    parser.add_argument(
        "--fetch-queue-backoff-ms",
        type=int,
        default=None,
        help="consumer arms: librdkafka's fetch.queue.backoff.ms in every arm (default: its "
        "default, 1000: a partition whose local queue is over the thresholds is not fetched "
        "for a second, a stall that falls on one arm or another by chance in a short run)",
    )
    args = parser.parse_args()
    _START.update(mode=args.start, partitions=args.partitions)
    if args.fetch_queue_backoff_ms is not None:
        _CONSUMER_EXTRA["fetch.queue.backoff.ms"] = args.fetch_queue_backoff_ms
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    _quiet()
    load_before = os.getloadavg()[0]
    out: list[str] = []
    started = time.time()
    with KafkaCluster() as cluster:  # or the one named by $KRESILIENT_BOOTSTRAP_SERVERS
        env = environment(**versions(), partitions=args.partitions, rounds=args.rounds)
        for name in args.sections:
            SECTIONS[name](cluster, args, out)
            # each section's tables as soon as they exist (a later section may fail)
            print("\n\n".join(out) + "\n", flush=True)
            out.clear()
    label = contention(load_before, os.getloadavg()[0])
    print(f"## Peers ({label}), {time.time() - started:.0f} s\n")
    print(f"\nPeak RSS of the benchmark process: {peak_rss_mib():.0f} MiB")
    print("Environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))


if __name__ == "__main__":
    main()
