"""Secrets at every exit (issue 35 #8, #9, #10, #14, #16): dead-letter headers, lint output
(messages, ``--diff``, ``--fix``, JSON, SARIF), the catalog-derived secret set, the Spark
plan regex, and lint/audit inputs (aliases, a Latin-1 ``--command-config``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import Runner, produce

from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import DeadLetterPolicy, parse_dead_letter_headers
from kresilient.testing import KafkaCluster

TopicFactory = Callable[..., str]

# A secret value long enough to be hunted whole and by slice, and with no key=value shape:
# pattern-based redaction (redact_text) alone cannot recognise it.
SECRET = "Zq7-pw-" + uuid.uuid4().hex[:16]


# --------------------------------------------------------------------------- #8 dead letters


@pytest.mark.integration
def test_consumer_secret_echoed_by_the_handler_never_reaches_dead_letter_headers(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handler's exception quotes the consumer's own sasl.password (a plaintext cluster
    ignores it): no header kresilient writes (message, Spring/Streams message and stack
    trace) holds it, in Kafka or on ``dlq inspect --json``'s stdout; the record's original
    headers stay byte for byte (only kresilient's text is redacted)."""
    from kresilient.cli import main as cli_main

    topic = topic_factory(partitions=1)
    dlq = topic_factory(partitions=1, name=topic + ".dlq")
    bootstrap = kafka_cluster.bootstrap_servers
    original = [("app.trace", b"keep-me-" + SECRET[:3].encode())]
    produce(bootstrap, topic, [(b"k", b"v0", original, None), (b"k", b"v1", None, None)])
    raised: list[str] = []
    consumer: ResilientConsumer

    def handle(msg: Message) -> None:
        if msg.offset() == 1:
            consumer.stop()
            return
        message = f"upstream said: credentials {SECRET} rejected"
        raised.append(message)
        raise RuntimeError(message)

    consumer = ResilientConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:10]}",
            "sasl.password": SECRET,
        },
        [topic],
        handle,
        install_signal_handlers=False,
        dead_letter=DeadLetterPolicy(compat=("spring", "streams")),
    )
    Runner(consumer).join(90)
    assert raised and SECRET in raised[0]  # the fault is real: the text did hold the secret
    (record,) = read_back(bootstrap, dlq)
    headers = record.headers() or []
    assert headers[0] == original[0]  # originals byte for byte
    blob = b"".join(v or b"" for _, v in headers)
    assert SECRET.encode() not in blob
    assert SECRET[:8].encode() not in blob and SECRET[-8:].encode() not in blob
    info = parse_dead_letter_headers(headers)
    assert info.exception_message == "upstream said: credentials [REDACTED] rejected"
    names = {k for k, _ in headers}
    assert {"kafka_dlt-exception-stacktrace", "__streams.errors.stacktrace"} <= names
    assert "RuntimeError" in (info.stacktrace or "")  # the stack trace is still there
    capsys.readouterr()
    code = cli_main(["dlq", "inspect", dlq, "-b", bootstrap, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[REDACTED]" in out
    assert SECRET not in out and SECRET[:8] not in out


def test_dead_letter_headers_redact_message_and_stack_with_the_given_redactor() -> None:
    """Pure logic: the builder applies the caller's redactor to every free-text header; the
    default (pattern-based) still removes ``key=value`` secrets."""
    from kresilient.deadletter import dead_letter_headers
    from kresilient.redaction import Redactor

    try:
        raise ValueError(f"boom {SECRET} and password=hunter2xx")
    except ValueError as exc:
        err = exc
    redactor = Redactor.for_config({"sasl.password": SECRET})
    for redact, leaks in ((redactor, (SECRET, "hunter2xx")), (None, ("hunter2xx",))):
        kw: dict[str, Any] = {} if redact is None else {"redact": redact}
        headers = dead_letter_headers(
            "t",
            0,
            1,
            2,
            "g",
            err,
            None,
            1,
            original_headers=None,
            compat=("spring", "streams"),
            **kw,
        )
        blob = b"".join(v or b"" for _, v in headers)
        for leak in leaks:
            assert leak.encode() not in blob


def test_writer_redacts_only_kresilient_block_fake_producer() -> None:
    """The writer's last line of defence: a record built without the config's redactor is
    redacted from the last ``kresilient.original.topic`` on; earlier headers of the same
    names (a forwarded/replayed dead letter's) stay byte for byte."""
    from kresilient.deadletter import _redact_free_text
    from kresilient.redaction import Redactor

    forwarded = ("kresilient.exception.message", f"old {SECRET}".encode())
    headers = [
        forwarded,
        ("kresilient.original.topic", b"t"),
        ("kresilient.exception.message", f"new {SECRET}".encode()),
        ("kafka_dlt-exception-stacktrace", f"Traceback {SECRET}".encode()),
        ("kresilient.exception.type", b"ValueError"),
    ]
    out = _redact_free_text(headers, Redactor.for_config({"sasl.password": SECRET}))
    assert out[0] == forwarded
    assert out[2] == ("kresilient.exception.message", b"new [REDACTED]")
    assert out[3] == ("kafka_dlt-exception-stacktrace", b"Traceback [REDACTED]")
    assert out[4] == headers[4]
    clean = [("kresilient.original.topic", b"t"), ("kresilient.exception.message", b"\xff")]
    assert _redact_free_text(clean, Redactor.for_config({}))[1][1] == b"\xff"  # exact bytes
