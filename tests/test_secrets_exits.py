"""Secrets at every exit (issue 35 #8, #9, #10, #14, #16): dead-letter headers, lint output
(messages, ``--diff``, ``--fix``, JSON, SARIF), the catalog-derived secret set, the Spark
plan regex, and lint/audit inputs (aliases, a Latin-1 ``--command-config``)."""

from __future__ import annotations

import json
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


# --------------------------------------------------------------------------- #10 the secret set


def _catalog_secret_keys() -> set[str]:
    """Read straight from the shipped catalogs: librdkafka's sensitive properties (and their
    aliases) and every Java PASSWORD-typed key, minus the one documented exception."""
    from importlib import resources

    data = resources.files("kresilient").joinpath("_data")
    rdk = json.loads(data.joinpath("librdkafka_properties.json").read_text("utf-8"))
    java = json.loads(data.joinpath("kafka_configs.json").read_text("utf-8"))
    sensitive = {p["name"] for p in rdk["properties"] if p["is_secret"]}
    sensitive |= {p["name"] for p in rdk["properties"] if p["alias_of"] in sensitive}
    passwords = {
        k["name"]
        for kind in ("producer", "consumer", "admin", "broker")
        for k in java[kind]
        if k["type"] == "password"
    }
    return (sensitive | passwords) - {"sasl.username", "ssl.key.location"}


def test_secret_keys_are_exactly_the_catalogs_password_typed_keys() -> None:
    from kresilient import _catalog as catalog
    from kresilient.redaction import SECRET_KEYS

    expected = _catalog_secret_keys()
    assert "ssl.keystore.key" in expected  # the Java inline PEM private key (issue 35 #10)
    assert SECRET_KEYS - {"basic.auth.user.info", "schema.registry.basic.auth.user.info"} == (
        expected
    )
    assert catalog.secret_keys() == expected
    # librdkafka's own flag, read from the installed library, agrees with the catalog
    assert catalog.installed_sensitive_properties() - catalog.NOT_SECRET <= SECRET_KEYS
    assert {"sasl.username", "ssl.key.location"} == catalog.NOT_SECRET  # the documented two


def test_spark_plan_regex_is_generated_from_the_secret_set() -> None:
    import re

    from kresilient.redaction import SECRET_KEYS
    from kresilient.spark._source import PLAN_REDACTION_REGEX

    plan = re.compile(PLAN_REDACTION_REGEX)
    assert {k for k in SECRET_KEYS if plan.match(f"kafka.{k}")} == SECRET_KEYS
    for shown in ("bootstrap.servers", "sasl.username", "ssl.key.location"):
        assert not plan.match(f"kafka.{shown}")


def _value_for(key: str) -> str:
    return f"S3cr{abs(hash(key)) % 10_000:04d}-{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("key", sorted(_catalog_secret_keys()))
def test_every_secret_key_is_redacted_at_every_exit(
    key: str, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each catalog secret: configs (repr/str), Redactor (logs, exceptions, spans), the
    config errors, dead-letter headers and every lint output (text, JSON, SARIF, GitHub,
    --diff, --fix notes) never show its value."""
    from kresilient import config as kconfig
    from kresilient.cli import main as cli_main
    from kresilient.deadletter import _redact_free_text, dead_letter_headers
    from kresilient.errors import ConfigError
    from kresilient.redaction import REDACTED, Redactor, is_secret_key, redact_config

    value = _value_for(key)
    leaks = (value, value[:8], value[-8:])

    def clean(text: str) -> bool:
        return not any(leak in text for leak in leaks)

    assert is_secret_key(key) and kconfig.is_secret(key)
    shown = redact_config({"bootstrap.servers": "b:9092", key: value})
    assert shown[key] == REDACTED and clean(repr(shown)) and clean(str(shown))
    redactor = Redactor.for_config({key: value})
    assert clean(redactor(f"login failed: server said {value!r} (x{value}y)"))
    # a config error about the key: the value is never quoted
    try:
        kconfig.producer_config({"bootstrap.servers": "b:9092", key: value, "acks": "bogus"})
    except (ConfigError, ValueError) as exc:
        assert clean(str(exc)) and clean(repr(exc))
    # dead-letter headers, built with the config's redactor and re-checked by the writer
    try:
        raise RuntimeError(f"handler echoed {value}")
    except RuntimeError as err:
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
        )
    blob = b"".join(v or b"" for _, v in _redact_free_text(headers, redactor))
    assert clean(blob.decode("utf-8", "replace"))
    # lint: every format, --diff and --fix (context lines around the acks fix)
    conf = tmp_path / "client.properties"
    conf.write_text(f"bootstrap.servers=b:9092\n{key}={value}\nacks=1\nlinger.ms=5\n")
    outputs: list[str] = []
    # judged as a librdkafka file (where acks=1 is refused, so fixed): a Java-only secret key
    # (sasl.jaas.config, ssl.keystore.key...) would otherwise make it a Java client's file, for
    # which acks=1 is only a warning and --fix leaves it alone (issue 38)
    rdk = ["--client", "librdkafka"]
    for argv in (
        ["lint", "--diff", *rdk, str(conf)],
        *(["lint", "--format", fmt, str(conf)] for fmt in ("text", "json", "sarif", "github")),
        ["lint", "--kind", "producer", "--client", "java", str(conf)],
        ["lint", "--fix", *rdk, str(conf)],
    ):
        cli_main(argv)
        captured = capsys.readouterr()
        outputs.append(captured.out + captured.err)
    assert "-acks=1" in outputs[0] and "+acks=all" in outputs[0]  # the diff is really shown
    assert key in outputs[0]  # ... with the secret's line as context, its value masked
    assert "acks=all" in conf.read_text()  # --fix did run
    for out in outputs:
        assert clean(out), out


# --------------------------------------------------------------------------- #9 lint --diff


def test_lint_diff_masks_secret_context_lines_in_every_format(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35 #9: the context lines of a fix held literal sasl.password/ssl.key.password
    values (also a short one, and a multi-line PEM in a YAML block scalar); the diff still
    shows the fix and the secrets' keys."""
    from kresilient.cli import main as cli_main

    props = tmp_path / "p.properties"
    props.write_text(
        "bootstrap.servers=b:9092\nsasl.password=Hunter2SuperSecret\nacks=1\n"
        "ssl.key.password=pw7\nssl.keystore.key=-----BEGIN PRIVATE KEY-----MIIEvQIBADAN\n"
    )
    pem = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7"
    yml = tmp_path / "app.yaml"
    yml.write_text(
        "bootstrap.servers: b:9092\nacks: 1\nssl.key.pem: |\n  -----BEGIN PRIVATE KEY-----\n"
        f"  {pem}\n  -----END PRIVATE KEY-----\nsasl.password: 'Quoted-Secret-99'\n"
    )
    for path, key, secrets in (
        (props, "ssl.key.password", ("Hunter2SuperSecret", "pw7", "MIIEvQIBADAN")),
        (yml, "ssl.key.pem", (pem, pem[:8], "Quoted-Secret-99")),
    ):
        # ssl.keystore.key is Java-only: judged as librdkafka's file, where acks=1 is fixed
        code = cli_main(["lint", "--diff", "--client", "librdkafka", str(path)])
        out = capsys.readouterr().out
        assert code == 1 and "+acks" in out and key in out, out
        for secret in secrets:
            assert secret not in out, out
        assert "<redacted>" in out


# --------------------------------------------------------------------------- #14 aliases


def _librdkafka_accepts(config: dict[str, Any]) -> bool:
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({"bootstrap.servers": "127.0.0.1:9", **config})
    except KafkaException:
        return False
    return True


def test_the_last_of_a_key_and_its_aliases_decides_as_in_librdkafka() -> None:
    """Issue 35 #14: acks=all then request.required.acks=1 is acks 1 (librdkafka refuses it
    with idempotence); the reverse order is acks all. Negative control: librdkafka itself."""
    from kresilient.lint.engine import lint_text

    shadowed = (
        "bootstrap.servers=b:9092\nenable.idempotence=true\nacks=all\nrequest.required.acks=1\n"
    )
    assert not _librdkafka_accepts(
        {"enable.idempotence": True, "acks": "all", "request.required.acks": 1}
    )
    found = {(f.rule, f.line) for f in lint_text(shadowed, "p.properties")}
    assert ("KR001", 4) in found and ("KR007", 4) in found, found
    reverse = (
        "bootstrap.servers=b:9092\nenable.idempotence=true\nrequest.required.acks=1\nacks=all\n"
    )
    assert _librdkafka_accepts(
        {"enable.idempotence": True, "request.required.acks": 1, "acks": "all"}
    )
    rules = {f.rule for f in lint_text(reverse, "p.properties")}
    assert not rules & {"KR001", "KR006", "KR007"}, rules


def test_fix_edits_the_line_that_takes_effect() -> None:
    from kresilient.lint.fix import fix_text

    text = "bootstrap.servers=b:9092\nacks=all\nrequest.required.acks=1\n"
    fixed = fix_text(text, "p.properties")
    assert fixed.after.splitlines()[:3] == [
        "bootstrap.servers=b:9092",
        "acks=all",  # the shadowed line is left alone
        "request.required.acks=all",  # the one librdkafka applies last is fixed
    ]
    assert _librdkafka_accepts(
        {"enable.idempotence": True, "acks": "all", "request.required.acks": "all"}
    )
    other = fix_text("acks=1\nrequest.required.acks=0\nbootstrap.servers=b:9092\n", "p.properties")
    assert other.after.splitlines()[:2] == ["acks=1", "request.required.acks=all"]


# --------------------------------------------------------------------------- #16 audit


@pytest.mark.integration
def test_audit_reads_a_latin1_command_config(
    kafka_cluster: KafkaCluster, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35 #16: a Latin-1 file (what Java's Properties.load reads) used to kill audit
    with a UnicodeDecodeError traceback; now it is read (caf\\xe4 -> café) and audit runs."""
    import argparse

    from kresilient.cli import main as cli_main
    from kresilient.lint.cli import _client_config

    path = tmp_path / "admin.properties"
    path.write_bytes(b"# caf\xe4\nclient.id=caf\xe4-audit\nrequest.timeout.ms=20000\n")
    with pytest.raises(UnicodeDecodeError):  # the file really is not UTF-8
        path.read_bytes().decode("utf-8")
    args = argparse.Namespace(command_config=str(path), property=None, bootstrap_servers="b:9092")
    assert _client_config(args)["client.id"] == "caf\u00e4-audit"
    code = cli_main(
        [
            "audit",
            "-b",
            kafka_cluster.bootstrap_servers,
            "--command-config",
            str(path),
            "--format",
            "json",
            "--timeout",
            "20",
        ]
    )
    out = capsys.readouterr().out
    assert code in (0, 1), out
    assert isinstance(json.loads(out), list)
    code = cli_main(["audit", "-b", "127.0.0.1:1", "--command-config", str(tmp_path / "no")])
    assert code == 2 and "no" in capsys.readouterr().err


def test_certificates_are_redacted_but_not_reported_as_literal_credentials() -> None:
    """Certificates are secret by the catalogs' types (never printed) but public material:
    KR041 ("literal credential") does not fire for them; a private key still does."""
    from kresilient.lint.engine import lint_text
    from kresilient.redaction import is_secret_key

    pem = "-----BEGIN CERTIFICATE-----MIIBszCCAVmgAwIBAgIU"
    for key, credential in (
        ("ssl.ca.pem", False),
        ("ssl.truststore.certificates", False),
        ("ssl.keystore.certificate.chain", False),
        ("ssl.keystore.key", True),
        ("ssl.key.pem", True),
    ):
        assert is_secret_key(key)
        findings = lint_text(f"bootstrap.servers=a:9092,b:9092\n{key}={pem}\n", "p.properties")
        assert any(f.rule == "KR041" for f in findings) is credential, (key, findings)
        assert not any(pem[-8:] in f.message for f in findings)
