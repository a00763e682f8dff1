"""One trace from a producer through a consumer to the dead-letter topic, printed as a tree.

Run it against any cluster (``KRESILIENT_BOOTSTRAP_SERVERS=host:9092``) or let it start a local
3-node KRaft cluster (needs Java; ~30 s)::

    pip install 'kresilient[otel]'
    python examples/otel_tracing.py

Spans go to an in-memory exporter so the example can print them; set
``OTEL_EXPORTER_OTLP_ENDPOINT`` (and install ``opentelemetry-exporter-otlp-proto-http``) to send
them to a collector as well. The structlog output uses kresilient's recommended production
configuration, so every log line carries ``trace_id``/``span_id``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

import structlog
import tenacity
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kresilient.consumer import ResilientConsumer, RetryPolicy
from kresilient.deadletter import DeadLetterPolicy
from kresilient.producer import ResilientProducer
from kresilient.telemetry import production_config
from kresilient.testing import KafkaCluster


def setup_otel() -> tuple[InMemorySpanExporter, InMemoryMetricReader]:
    """Global SDK providers: in-memory for printing, plus OTLP when an endpoint is set."""
    resource = Resource.create({"service.name": "kresilient-example"})
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    readers: list[Any] = [reader]
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[import-not-found, unused-ignore]
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))
    return spans, reader


def print_tree(spans: list[ReadableSpan]) -> None:
    children: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        children.setdefault(parent, []).append(s)

    def show(span: ReadableSpan, depth: int) -> None:
        attrs = dict(span.attributes or {})
        detail = ", ".join(
            f"{k}={attrs[k]}"
            for k in (
                "messaging.destination.partition.id",
                "messaging.kafka.offset",
                "messaging.kafka.message.key",  # producer spans only: it opted in
                "error.type",
            )
            if k in attrs
        )
        print(f"{'   ' * depth}{span.name} [{span.kind.name}] {detail}")
        for child in children.get(span.context.span_id, []):
            show(child, depth + 1)

    for root in children.get(None, []):
        print(f"trace {root.context.trace_id:032x}")
        show(root, 1)


def main() -> None:
    structlog.configure(**production_config(level=logging.INFO))
    spans, reader = setup_otel()
    cluster = KafkaCluster()
    with cluster:
        bootstrap = cluster.bootstrap_servers
        topic = f"orders-{uuid.uuid4().hex[:6]}"
        cluster.create_topic(topic, 1, 3, {"min.insync.replicas": 2})
        cluster.create_topic(f"{topic}.dlq", 1, 3, {"min.insync.replicas": 2})

        # Message keys stay out of spans by default (they are often personal data); a service
        # whose keys are safe to show opts in. Partitions are on spans, not on metrics
        # (cardinality: see docs/telemetry.md). A span processor or exporter that raises never
        # changes what happens to a message: it is logged as kafka_telemetry_failed.
        with ResilientProducer(
            {"bootstrap.servers": bootstrap, "client.id": "orders-api"}, record_message_key=True
        ) as p:
            p.produce(topic, b'{"id": 1, "qty": 2}', key=b"order-1")
            p.produce(topic, b'{"id": 2, "qty": -1}', key=b"order-2")

        def handle(msg: Any) -> None:
            if b'"qty": -1' in (msg.value() or b""):
                raise RuntimeError("inventory service refused a negative quantity")

        consumer = ResilientConsumer(
            {"bootstrap.servers": bootstrap, "group.id": f"{topic}-worker"},
            [topic],
            handle,
            retry=RetryPolicy(stop=tenacity.stop_after_attempt(2), wait=tenacity.wait_fixed(0.5)),
            dead_letter=DeadLetterPolicy(),
            install_signal_handlers=False,
            poll_timeout=0.2,
        )
        worker = threading.Thread(target=consumer.run, daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
            s.name == f"send {topic}.dlq" for s in spans.get_finished_spans()
        ):
            time.sleep(0.1)
        time.sleep(1.0)  # let a commit happen
        consumer.stop()
        worker.join(30)

    print()
    print_tree(list(spans.get_finished_spans()))
    data = reader.get_metrics_data()
    print()
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                total = 0.0
                for dp in m.data.data_points:
                    value: Any = getattr(dp, "value", None)
                    total += value if value is not None else getattr(dp, "count", 0)
                print(f"{m.name}: {total}")


if __name__ == "__main__":
    main()
