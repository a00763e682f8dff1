"""Tracing a batch handler: one span per call, linked to every message's producer.

A consumer with ``batch_handler=`` gets one partition's run of a consumed batch per call. With
an OpenTelemetry SDK configured, each call runs inside one CONSUMER span ``process {topic}``
that carries ``messaging.batch.message_count`` and a span link to each message's ``send`` span
(up to the SDK's link limit, 128 by default). The handler's own spans become its children.

``--per-message`` keeps a per-message handler but passes ``trace_spans="call"``: one such span
per ``consume()`` result (all its partitions), the handler called inside it once per message.

Run it against any cluster (``--bootstrap host:9092``) or let it start a local 3-node KRaft
cluster (needs Java; ~30 s)::

    pip install 'kresilient[otel]'
    python examples/otel_batch_tracing.py [--bootstrap host:9092] [--messages 300] [--per-message]
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kresilient.admin import create_topic
from kresilient.consumer import ResilientConsumer
from kresilient.producer import ResilientProducer
from kresilient.testing import KafkaCluster


@contextlib.contextmanager
def bootstrap_servers(given: str | None) -> Iterator[str]:
    if given:
        yield given
        return
    with KafkaCluster() as cluster:
        yield cluster.bootstrap_servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="bootstrap servers (default: start a local cluster)")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument(
        "--per-message",
        action="store_true",
        help='a per-message handler with trace_spans="call" instead of a batch handler',
    )
    args = parser.parse_args()

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = provider.get_tracer("billing")

    with bootstrap_servers(args.bootstrap) as bootstrap:
        topic = f"invoices-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, partitions=3, replication_factor=3)
        with ResilientProducer({"bootstrap.servers": bootstrap}, tracer_provider=provider) as p:
            for i in range(args.messages):
                p.produce(topic, b'{"invoice": %d}' % i, key=b"customer-%d" % (i % 7))

        handled = 0
        all_done = threading.Event()

        def handle_batch(msgs: list[Any]) -> None:
            nonlocal handled
            # one database write for the whole run: its span is a child of the batch span
            with tracer.start_as_current_span("insert invoices"):
                handled += len(msgs)
            if handled >= args.messages:
                all_done.set()

        def handle(msg: Any) -> None:
            nonlocal handled
            # one write per message: its span is a child of the consume() result's span
            with tracer.start_as_current_span("insert invoices"):
                handled += 1
            if handled >= args.messages:
                all_done.set()

        per_message: dict[str, Any] = {"handler": handle, "trace_spans": "call"}
        consumer = ResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": f"{topic}-billing"},
            [topic],
            **(per_message if args.per_message else {"batch_handler": handle_batch}),
            dead_letter=None,
            install_signal_handlers=False,
            poll_timeout=0.2,
            tracer_provider=provider,
        )
        worker = threading.Thread(target=consumer.run, daemon=True)
        worker.start()
        finished = all_done.wait(120)
        consumer.stop()
        worker.join(60)
        if not finished:
            raise SystemExit(f"only {handled} of {args.messages} messages handled in 120 s")

    finished_spans = spans.get_finished_spans()
    sends = {s.context.span_id for s in finished_spans if s.name == f"send {topic}"}
    batches = [s for s in finished_spans if s.name == f"process {topic}"]
    for span in sorted(batches, key=lambda s: s.start_time or 0):
        attrs = dict(span.attributes or {})
        linked = sum(1 for link in span.links if link.context.span_id in sends)
        children = sorted(
            {
                s.name
                for s in finished_spans
                if s.parent is not None and s.parent.span_id == span.context.span_id
            }
        )
        # a batch handler's call is one partition's run; a consume() result may hold several
        partition = attrs.get("messaging.destination.partition.id", "*")
        print(
            f"{span.name} partition={partition} "
            f"messages={attrs['messaging.batch.message_count']} "
            f"links_to_send_spans={linked} children={children}"
        )
    print(
        f"handled={handled} send_spans={len(sends)} batch_spans={len(batches)} "
        f"trace={trace.format_trace_id(batches[0].context.trace_id) if batches else '-'}"
    )


if __name__ == "__main__":
    main()
