"""Schema Registry outages never dead-letter good records (issue 17, item 3).

The registry is a real HTTP server on 127.0.0.1 serving the REST shape confluent-kafka's own
``SchemaRegistryClient`` reads (``GET /schemas/ids/{id}``); the consumer uses confluent-kafka's
``JSONDeserializer`` against it. It answers 503 for the first 20 s, then recovers.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from _producer_helpers import read_back
from test_consumer_integration import Runner, TopicFactory, produce, with_dlq

from kresilient.consumer import ResilientConsumer
from kresilient.consumer._registry import registry_classification
from kresilient.errors import ErrorCategory
from kresilient.testing import KafkaCluster

sr = pytest.importorskip("confluent_kafka.schema_registry")
from confluent_kafka.error import ValueDeserializationError  # noqa: E402
from confluent_kafka.schema_registry.error import SchemaRegistryError  # noqa: E402
from confluent_kafka.schema_registry.json_schema import JSONDeserializer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
OUTAGE_S = 20.0


class FakeRegistry:
    """``/schemas/ids/1`` -> the JSON schema (503 until ``recover_at``), other ids -> 404."""

    def __init__(self) -> None:
        self.recover_at = 0.0
        self.served: list[tuple[float, int]] = []  # (monotonic time, status)
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/schemas/ids/1":
                    if time.monotonic() < registry.recover_at:
                        self._send(503, {"error_code": 50301, "message": "unavailable"})
                    else:
                        self._send(200, {"schema": json.dumps(SCHEMA), "schemaType": "JSON"})
                elif path.startswith("/schemas/ids/"):
                    self._send(404, {"error_code": 40403, "message": "Schema not found"})
                else:
                    self._send(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                registry.served.append((time.monotonic(), status))
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="registry")
def _registry() -> Iterator[FakeRegistry]:
    fake = FakeRegistry()
    try:
        yield fake
    finally:
        fake.close()


def _framed(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + payload


# --------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("status", "category"),
    [
        (503, ErrorCategory.TRANSIENT),
        (500, ErrorCategory.TRANSIENT),
        (429, ErrorCategory.TRANSIENT),
        (-1, ErrorCategory.TRANSIENT),  # a non-JSON error page (a proxy in front)
        (401, ErrorCategory.AUTH),
        (404, ErrorCategory.POISON),
        (422, ErrorCategory.POISON),
    ],
)
def test_registry_http_status_is_classified(status: int, category: ErrorCategory) -> None:
    err = SchemaRegistryError(status, status * 100 + 1, "x")
    try:
        try:
            raise err
        except SchemaRegistryError as inner:  # how the consumer's deserializer wraps it
            raise ValueDeserializationError(exception=inner) from inner
    except ValueDeserializationError as wrapped:
        got = registry_classification(wrapped)
    assert got is not None and got.category is category


def test_connection_refused_and_timeouts_are_outages_others_are_not(
    registry: FakeRegistry,
) -> None:
    client = sr.SchemaRegistryClient({"url": "http://127.0.0.1:9", "max.retries": 0})
    deser = JSONDeserializer(None, schema_registry_client=client)
    from confluent_kafka.serialization import MessageField, SerializationContext

    with pytest.raises(Exception) as info:
        deser(_framed(1, b"{}"), SerializationContext("t", MessageField.VALUE))
    got = registry_classification(info.value)
    assert got is not None and got.category is ErrorCategory.TRANSIENT, repr(info.value)
    assert registry_classification(ValueError("bad json")) is None
    assert registry_classification(ConnectionError("the handler's own")) is None


# --------------------------------------------------------------------------- real outage


def test_registry_outage_holds_records_then_processes_all_and_poison_is_dead_lettered(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, registry: FakeRegistry
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory, partitions=2)
    good = [(b"k%d" % i, _framed(1, json.dumps({"n": i}).encode()), None, i % 2) for i in range(30)]
    bad = [
        (b"bad-magic", b"\x07not-framed", [("h", b"1")], 0),  # undecodable: no registry needed
        (b"unknown-id", _framed(99, b"{}"), None, 1),  # registry: 40403 schema not found
    ]
    registry.recover_at = time.monotonic() + OUTAGE_S
    produce(bootstrap, topic, good[:10] + bad + good[10:])
    client = sr.SchemaRegistryClient({"url": registry.url, "max.retries": 0, "timeout": 5})
    handled: dict[bytes, tuple[float, Any]] = {}

    def handle(msg: Any) -> None:
        handled[msg.key()] = (time.monotonic(), msg.value())

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "max.poll.interval.ms": 10000,  # the outage is twice as long
            "session.timeout.ms": 6000,
        },
        [topic],
        handle,
        value_deserializer=JSONDeserializer(None, schema_registry_client=client),
        install_signal_handlers=False,
        poll_timeout=0.2,
    )
    runner = Runner(consumer)
    try:
        deadline = time.monotonic() + OUTAGE_S + 60
        while len(handled) < 30 and time.monotonic() < deadline and runner.thread.is_alive():
            time.sleep(0.1)  # polling the condition, not settling
        health = consumer.health()
    finally:
        consumer.stop()
        runner.join(60)
    assert runner.error is None, runner.error
    assert sorted(handled) == sorted(k for k, *_ in good)
    assert all(v == {"n": int(k[1:])} for k, (_, v) in handled.items())
    # the outage was real: 503s were served, and no good record was handled before recovery
    assert sum(1 for _, status in registry.served if status == 503) >= 2
    assert min(t for t, _ in handled.values()) >= registry.recover_at
    assert health.rebalances == {"assigned": 1, "revoked": 0, "lost": 0}
    assert health.retries >= 2
    # only the two truly bad records were dead-lettered, byte for byte
    records = {r.key(): r for r in read_back(bootstrap, dlq)}
    assert sorted(records) == [b"bad-magic", b"unknown-id"]
    assert records[b"bad-magic"].value() == b"\x07not-framed"
    assert (records[b"bad-magic"].headers() or [])[0] == ("h", b"1")
    cats = {k: dict(r.headers() or [])["kresilient.error.category"] for k, r in records.items()}
    assert cats == {b"bad-magic": b"poison", b"unknown-id": b"poison"}


# --------------------------------------------------------------------------- classify()


def _wrapped(cls: type[BaseException], inner: BaseException) -> BaseException:
    """``inner`` raised inside a (de)serializer, as confluent-kafka wraps it."""
    try:
        try:
            raise inner
        except BaseException as caught:
            raise cls(exception=caught) from caught  # type: ignore[call-arg]
    except BaseException as outer:
        return outer


@pytest.mark.parametrize(
    ("status", "category", "name"),
    [
        (503, ErrorCategory.TRANSIENT, "SCHEMA_REGISTRY_UNAVAILABLE"),
        (429, ErrorCategory.TRANSIENT, "SCHEMA_REGISTRY_UNAVAILABLE"),
        (408, ErrorCategory.TRANSIENT, "SCHEMA_REGISTRY_UNAVAILABLE"),
        (-1, ErrorCategory.TRANSIENT, "SCHEMA_REGISTRY_UNAVAILABLE"),
        (403, ErrorCategory.AUTH, "SCHEMA_REGISTRY_AUTH"),
        (404, ErrorCategory.POISON, "SCHEMA_REGISTRY_NOT_FOUND"),
        (422, ErrorCategory.POISON, "SCHEMA_REGISTRY_NOT_FOUND"),
    ],
)
def test_classify_knows_schema_registry_errors_alone_and_wrapped(
    status: int, category: ErrorCategory, name: str
) -> None:
    """Issue 17 item 3: ``classify()`` (errors.py, which imports no registry client) gives
    a registry error its HTTP status's class, on the consumer and on the producer side."""
    from confluent_kafka.error import (
        KeyDeserializationError,
        ValueSerializationError,
    )

    from kresilient.errors import classify

    bare = SchemaRegistryError(status, status * 100 + 3, "x")
    for err in (
        bare,
        _wrapped(ValueDeserializationError, bare),
        _wrapped(KeyDeserializationError, bare),
        _wrapped(ValueSerializationError, bare),  # a producer's serializer
    ):
        c = classify(err)
        assert (c.category, c.name) == (category, name), repr(err)
        retried = category is not ErrorCategory.POISON
        assert c.retriable is retried
        assert c.action.name == ("BACKOFF_AND_RETRY" if retried else "DEAD_LETTER")
    assert registry_classification(bare) is classify(bare)  # one table


def test_classify_leaves_other_errors_as_they_were() -> None:
    """Negative controls: a decode error is still POISON, a lone HTTP error is not taken for
    the registry's, and only inside a (de)serializer is a connection failure an outage."""

    class ConnectionError(Exception):  # the name httpx and requests use
        """Recognised like httpx's and requests' by module and name (the real client's
        error is exercised by test_connection_refused_and_timeouts_are_outages_...)."""

    ConnectionError.__module__ = "requests.exceptions"

    from kresilient.errors import classify

    decode = _wrapped(ValueDeserializationError, ValueError("bad magic byte"))
    assert classify(decode).category is ErrorCategory.POISON
    assert classify(decode).name == "_VALUE_DESERIALIZATION"
    refused = ConnectionError("connection refused")
    assert classify(refused).category is ErrorCategory.UNKNOWN
    assert (
        classify(_wrapped(ValueDeserializationError, refused)).category is ErrorCategory.TRANSIENT
    )
    assert classify(ValueError("x")).category is ErrorCategory.UNKNOWN

    class SchemaRegistryError(Exception):  # duck typing: by name and status attribute
        http_status_code = 502

    assert classify(SchemaRegistryError()).category is ErrorCategory.TRANSIENT


def test_errors_module_does_not_import_the_registry_client() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kresilient.errors as e\n"
        "e.classify(ValueError('x'))\n"
        "assert 'confluent_kafka.schema_registry' not in sys.modules, 'imported'\n"
        "assert 'httpx' not in sys.modules, 'httpx imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
