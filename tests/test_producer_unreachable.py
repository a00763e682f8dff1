"""Issue 22 point 2 (producer): an unreachable cluster gives ONE warning naming each host and
the reason, repeated slowly; at most 5 log lines in the first 10 s; no raw librdkafka line on
stderr; messages that never reached a broker are not "possibly persisted"."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_CHILD = textwrap.dedent(
    """
    import sys, time
    from kresilient.producer import ResilientProducer

    producer = ResilientProducer({"bootstrap.servers": sys.argv[1]}, exit_timeout=0)
    for i in range(5):
        producer.produce("orders", b"m%d" % i)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        producer.poll(0.2)
    print("=== 10 s ===", flush=True)
    """
)


@pytest.mark.parametrize(
    ("host", "reason"),
    [("127.0.0.1:{closed_port}", "refused"), ("no-such-host.invalid:9092", "DNS")],
    ids=["closed-port", "unresolvable-name"],
)
def test_unreachable_cluster_gives_one_warning_naming_host_and_reason(
    host: str, reason: str, closed_port: int
) -> None:
    host = host.format(closed_port=closed_port)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, host],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    first_10s = proc.stdout.split("=== 10 s ===")[0]
    lines = [line for line in first_10s.splitlines() if line.strip()]
    assert len(lines) <= 5, lines
    (warning,) = [line for line in lines if "kafka_unreachable" in line]
    assert host in warning and f"'{reason}'" in warning, warning
    assert "%3|" not in proc.stderr and "%4|" not in proc.stderr and "FAIL" not in proc.stderr
    # negative control: librdkafka did fail to connect (the summary saw the failures). Its
    # count is not stable: a name that does not resolve was once reported "0/2 brokers are
    # down" (the bootstrap entry and a logical broker), usually "1/1".
    assert re.search(r"detail='\d+/\d+ brokers are down'", warning), warning


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
            "(after 0ms in state CONNECT)",
            ("127.0.0.1:1", "refused"),
        ),
        (
            "ssl://127.0.0.1:9093/1: SSL handshake failed: error:0A000086:SSL routines::"
            "certificate verify failed",
            ("127.0.0.1:9093", "TLS"),
        ),
        (
            "[thrd:sasl_ssl://h.invalid:9094/bootstrap]: sasl_ssl://h.invalid:9094/bootstrap: "
            "Failed to resolve 'h.invalid:9094': Name or service not known",
            ("h.invalid:9094", "DNS"),
        ),
        ("Some other librdkafka line", None),
    ],
)
def test_connect_failure_parses_plain_and_protocol_prefixed_broker_names(
    line: str, expected: tuple[str, str] | None
) -> None:
    # A TLS/SASL listener's broker name is "ssl://host:port/id": it was not recognised, so
    # TLS failures (the reason most worth naming) were summarised as nothing.
    from kresilient.producer import connect_failure

    assert connect_failure(line) == expected


# --------------------------------------------------------------------------- refusals (issue 19)
# Texts as librdkafka 2.x reported them on the SASL_SSL and mTLS test clusters.

_SASL = (
    "sasl_ssl://127.0.0.1:46051/bootstrap: SASL authentication error: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
    "(after 324ms in state AUTH_REQ)"
)
_WRONG_CA = (
    "sasl_ssl://127.0.0.1:40121/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
    "certificate verify failed: broker certificate could not be verified, verify that "
    "ssl.ca.location is correctly configured or root CA certificates are installed (install "
    "ca-certificates package) (after 10ms in state SSL_HANDSHAKE)"
)
_ALERT_UNKNOWN = (
    "ssl://127.0.0.1:38837/bootstrap: Receive failed: error:0A000416:SSL routines::ssl/tls "
    "alert certificate unknown: SSL alert number 46 (after 1ms in state APIVERSION_QUERY)"
)
_ALERT_BAD = (
    "ssl://127.0.0.1:38837/bootstrap: Receive failed: error:0A000412:SSL routines::ssl/tls "
    "alert bad certificate: SSL alert number 42 (after 1ms in state APIVERSION_QUERY)"
)


@pytest.mark.parametrize(
    ("text", "code", "cause", "setting"),
    [
        (_SASL, None, "password", "sasl.password"),
        ("[thrd:sasl_ssl://h:9094/bootstrap]: " + _SASL, None, "password", "sasl.password"),
        (_WRONG_CA, None, "ca", "ssl.ca.location"),
        (_ALERT_UNKNOWN, None, "certificate", "ssl.certificate.location"),
        (_ALERT_BAD, None, "certificate", "ssl.certificate.location"),
        ("h:1/bootstrap: something new", -169, "auth", "sasl."),
        ("h:1/bootstrap: something new", -181, "tls", "ssl."),
    ],
)
def test_auth_failure_names_the_cause_and_the_setting(
    text: str, code: int | None, cause: str, setting: str
) -> None:
    from kresilient.errors import ErrorCategory
    from kresilient.reachability import auth_failure

    found = auth_failure(text, code)
    assert found is not None and found.cause == cause
    assert "after" not in found.detail and "thrd" not in found.detail  # librdkafka's noise
    assert found.host is not None  # a broker's verdict (the consumer stops only on those)
    c = found.classification()
    assert c.category is ErrorCategory.AUTH and not c.retriable and not c.possibly_persisted
    assert setting in c.remedy and found.detail in c.remedy


@pytest.mark.parametrize(
    "text",
    [
        "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused",
        "ssl://127.0.0.1:9093/1: Disconnected (after 5000ms in state UP)",
        "ssl://127.0.0.1:9093/1: SSL transport error: Connection reset by peer",
        "h:1/2: Broker: Topic authorization failed",
    ],
)
def test_network_faults_are_not_refusals(text: str) -> None:
    """Negative control: a fault the network or an ACL causes names no credential."""
    from kresilient.reachability import auth_failure

    assert auth_failure(text) is None
    assert auth_failure(text, -195) is None  # _TRANSPORT


def test_a_refusal_without_a_broker_has_no_host() -> None:
    """A local failure (an OAUTHBEARER token librdkafka could not acquire) is named, but it is
    no broker's verdict: the consumer keeps retrying on it."""
    from kresilient.reachability import auth_failure

    found = auth_failure("Failed to acquire SASL OAUTHBEARER token: refused", -169)
    assert found is not None and found.cause == "auth" and found.host is None


def test_reachability_keeps_the_refusal_until_a_connection_is_up() -> None:
    import structlog

    from kresilient.producer import Reachability

    reach = Reachability(structlog.get_logger("test"))
    assert reach.failed(_SASL) and reach.refused is not None
    assert reach.refused.cause == "password"
    reach.up(0)
    assert reach.refused is not None  # still no broker up
    reach.up(1)
    assert reach.refused is None and reach.ever_connected


def test_expired_client_certificate_is_named(tmp_path: Path) -> None:
    """A JDK broker answers an expired client certificate with "certificate unknown": the
    client's own check names the expiry; a valid certificate (negative control) does not."""
    pytest.importorskip("cryptography")
    import structlog

    from kresilient.producer import Reachability
    from kresilient.reachability import certificate_expiry
    from kresilient.testing import CertificateAuthority

    ca = CertificateAuthority(tmp_path)
    expired = ca.client_certificate("svc", "pw-" + "x" * 12, expired=True)
    valid = ca.client_certificate("ok", "pw-" + "y" * 12)
    assert certificate_expiry(str(valid.certificate)) is None
    note = certificate_expiry(str(expired.certificate))
    assert note is not None and "expired on" in note and str(expired.certificate) in note
    inline = certificate_expiry(expired.certificate.read_text())
    assert inline is not None and "ssl.certificate.pem" in inline
    assert certificate_expiry(str(tmp_path / "missing.pem")) is None

    reach = Reachability(structlog.get_logger("test"), certificate=str(expired.certificate))
    reach.failed(_ALERT_UNKNOWN)
    assert reach.refused is not None and reach.refused.cause == "expired"
    assert "renew the client certificate" in reach.refused.remedy
    reach = Reachability(structlog.get_logger("test"), certificate=str(valid.certificate))
    reach.failed(_ALERT_UNKNOWN)
    assert reach.refused is not None and reach.refused.cause == "certificate"


def test_health_keeps_naming_the_refusal_through_the_reconnect_failures_after_it() -> None:
    """A wrong CA under load in CI: the refusal came as _SSL, the next broker's (the same
    certificate check) as _TRANSPORT, and health().last_error said _TRANSPORT. After a
    refusal, until a connection is up again, reconnect failures and "all brokers down" are
    its consequences; any other error is still named as itself."""
    from confluent_kafka import KafkaError

    from kresilient.producer import ResilientProducer

    producer = ResilientProducer({"bootstrap.servers": "127.0.0.1:1"}, exit_timeout=0)
    try:
        producer._on_error(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Disconnected"))
        assert producer.health().last_error == "_TRANSPORT"  # no refusal yet: itself
        verify = (
            "sasl_ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:"
            "SSL routines::certificate verify failed"
        )
        producer._on_error(KafkaError(KafkaError._SSL, verify))
        assert producer.health().last_error == "_SSL"
        for code, text in [
            (KafkaError._TRANSPORT, verify.replace("SSL handshake failed: ", "")),
            (KafkaError._TRANSPORT, "127.0.0.1:2/bootstrap: Connect failed: Connection refused"),
            (KafkaError._ALL_BROKERS_DOWN, "3/3 brokers are down"),
        ]:
            producer._on_error(KafkaError(code, text))
            assert producer.health().last_error == "_SSL", text
        producer._on_error(KafkaError(KafkaError._TIMED_OUT, "request timed out"))
        assert producer.health().last_error == "_TIMED_OUT"  # not a connection failure
        producer._reach.connected()  # a connection is up: the refusal is over
        producer._on_error(KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Disconnected"))
        assert producer.health().last_error == "_TRANSPORT"
    finally:
        producer.close(0)
