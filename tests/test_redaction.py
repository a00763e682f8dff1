"""The one redaction mechanism (kresilient.redaction) and rate-limited logging (_ratelimit).

Pure logic, no cluster. The property tests embed a secret (or a slice of it) in arbitrary text
and check that neither the secret nor any slice of MIN_SLICE characters survives.
"""

from __future__ import annotations

import string

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

from kresilient import config as kconfig
from kresilient._ratelimit import RateLimiter
from kresilient.errors import ConfigError, KResilientError, translate
from kresilient.redaction import (
    MIN_SLICE,
    REDACTED,
    SECRET_KEYS,
    Redactor,
    is_secret_key,
    redact_config,
    redact_text,
)

# Secrets and surrounding text drawn without "[" / "]": the replacement itself is "[REDACTED]".
_SECRET_CHARS = string.ascii_letters + string.digits + "-_.+/=!@#$%^&*~"
_TEXT_CHARS = string.ascii_letters + string.digits + " :=,;'\"-_./\n"

# A secret sharing an 8-char slice with "[REDACTED]" itself cannot be told from the marker.
secrets_st = st.text(alphabet=_SECRET_CHARS, min_size=MIN_SLICE, max_size=48).filter(
    lambda s: not any(s[i : i + MIN_SLICE] in REDACTED for i in range(len(s) - MIN_SLICE + 1))
)
texts_st = st.text(alphabet=_TEXT_CHARS, max_size=80)


def _slices(secret: str) -> set[str]:
    return {secret[i : i + MIN_SLICE] for i in range(len(secret) - MIN_SLICE + 1)}


def _no_slice_survives(secret: str, out: str) -> None:
    assert secret not in out
    for piece in _slices(secret):
        assert piece not in out, (piece, out)


# --------------------------------------------------------------------------- keys, configs


def test_secret_keys_cover_librdkafka_and_java_secrets() -> None:
    for key in (
        "sasl.password",
        "ssl.key.password",
        "ssl.key.pem",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.jaas.config",
        "basic.auth.user.info",
    ):
        assert key in SECRET_KEYS or is_secret_key(key), key
        assert is_secret_key(key)
    for key in ("bootstrap.servers", "sasl.username", "client.id", "ssl.ca.location"):
        assert not is_secret_key(key)


def test_redact_config_replaces_secret_values_and_copies() -> None:
    cfg = {"sasl.username": "u", "sasl.password": "p4ssw0rd!", "acks": "all"}
    out = redact_config(cfg)
    assert out == {"sasl.username": "u", "sasl.password": REDACTED, "acks": "all"}
    assert cfg["sasl.password"] == "p4ssw0rd!"  # the caller's dict is not touched


def test_config_redact_delegates_to_the_one_mechanism() -> None:
    cfg = {"sasl.oauthbearer.client.secret": "zzzzzz", "client.id": "c"}
    assert kconfig.redact(cfg) == redact_config(cfg)
    assert kconfig.REDACTED == REDACTED and kconfig.SECRET_KEYS is SECRET_KEYS
    assert kconfig.is_secret("sasl.password") and not kconfig.is_secret("client.id")


# --------------------------------------------------------------------------- patterns


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        ('Invalid value "s3cr3t" for configuration property "sasl.password"', "s3cr3t"),
        ("login failed: clientSecret=abc123xyz scope=x", "abc123xyz"),
        ('JAAS: username="alice" password="al1ce-pw";', "al1ce-pw"),
        ('{"client_secret": "from-json-42", "x": 1}', "from-json-42"),
        ("ssl.key.password: hunter22", "hunter22"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", "eyJhbGciOiJIUzI1NiJ9"),
        ("registry at https://svc:topsecretpw@registry.local/x failed", "topsecretpw"),
        (
            "Failed to acquire SASL OAUTHBEARER token: Unrecognized sasl.oauthbearer.config "
            "beginning at: principalXX=bob extension_a=Sup3rSecretValue",
            "Sup3rSecretValue",
        ),
        ("access_token=abcd", "abcd"),
    ],
)
def test_redact_text_removes_pattern_secrets(text: str, gone: str) -> None:
    out = redact_text(text)
    assert gone not in out
    assert REDACTED in out


@pytest.mark.parametrize(
    "text",
    [
        "Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
        "token expired, refreshing",  # the bare English word "token" is not a key
        'Invalid value "7" for configuration property "linger.ms"',
        "batch.num.messages=10000 linger.ms=5",
        "",
    ],
)
def test_redact_text_leaves_ordinary_text_alone(text: str) -> None:
    assert redact_text(text) == text


def test_redaction_is_idempotent() -> None:
    text = "password=abc123 and clientSecret='xyz987'"
    once = redact_text(text)
    assert redact_text(once) == once
    assert once == f"password={REDACTED} and clientSecret='{REDACTED}'"


# --------------------------------------------------------------------------- Redactor


def test_redactor_removes_fragments_of_composite_secrets() -> None:
    """librdkafka echoes the TAIL of a malformed sasl.oauthbearer.config: a key that does not
    look secret (extension_a) next to a secret value only a config-aware redactor knows."""
    r = Redactor.for_config(
        {
            "sasl.oauthbearer.config": "principalXX=bob extension_a=Sup3rSecretValue",
            "sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule "
            'required username="alice" password="alice-pw-9";',
        }
    )
    echoed = "Unrecognized config: extension_a=Sup3rSecretValue (at offset 16)"
    assert "Sup3rSecretValue" not in r(echoed)
    # a truncated echo: only a slice of the value
    assert "Sup3rSecret" not in r("... beginning: Sup3rSecret")
    assert "alice-pw-9" not in r("jaas failed near alice-pw-9")
    # the non-secret parts of a composite value stay readable (no false positives)
    assert r("using org.apache.kafka.common.security.plain.PlainLoginModule") == (
        "using org.apache.kafka.common.security.plain.PlainLoginModule"
    )
    assert r("principal bob logged in") == "principal bob logged in"


def test_redactor_ignores_short_fragments() -> None:
    """A 3-character fragment would blank ordinary words: only its key=value form goes."""
    r = Redactor.for_config({"sasl.oauthbearer.config": "principal=bob scope=abc"})
    assert r("abc of the matter") == "abc of the matter"


def test_redactor_without_secrets_is_pattern_redaction() -> None:
    r = Redactor.for_config({"bootstrap.servers": "h:1", "sasl.password": 5})
    assert r("password=x1y2z3 here") == f"password={REDACTED} here"
    assert "5" not in repr(r) or "secret value" in repr(r)


@settings(max_examples=300, deadline=None)
@given(secret=secrets_st, before=texts_st, after=texts_st)
def test_property_a_whole_secret_never_survives(secret: str, before: str, after: str) -> None:
    r = Redactor.for_config({"sasl.password": secret})
    _no_slice_survives(secret, r(before + secret + after))


@settings(max_examples=300, deadline=None)
@given(
    secret=secrets_st,
    before=texts_st,
    after=texts_st,
    cut=st.tuples(st.integers(min_value=0, max_value=48), st.integers(min_value=0, max_value=48)),
)
def test_property_no_slice_of_a_secret_survives(
    secret: str, before: str, after: str, cut: tuple[int, int]
) -> None:
    """librdkafka may echo part of a value: any >= MIN_SLICE-char slice of it is removed."""
    a, b = sorted(cut)
    piece = secret[a:b]
    r = Redactor.for_config({"ssl.key.password": secret})
    out = r(before + piece + after + secret)
    _no_slice_survives(secret, out)


@settings(max_examples=200, deadline=None)
@given(
    secret=secrets_st,
    before=texts_st,
    after=texts_st,
    key=st.sampled_from(["extension_a", "principal", "scope", "clientSecret"]),
)
def test_property_composite_fragment_never_survives(
    secret: str, before: str, after: str, key: str
) -> None:
    value = f"principal=admin {key}={secret}"
    r = Redactor.for_config({"sasl.oauthbearer.config": value})
    out = r(before + f"beginning at: {key}={secret}" + after)
    _no_slice_survives(secret, out)


@settings(max_examples=200, deadline=None)
@given(secret=secrets_st, before=texts_st)
def test_property_translated_config_error_carries_no_secret(secret: str, before: str) -> None:
    """translate(..., redactor=...) scrubs the message of the exception a user sees."""
    cfg = {"sasl.password": secret}
    err = KafkaException(KafkaError(KafkaError._INVALID_ARG, before + secret))
    exc = translate(err, operation="configure", redactor=Redactor.for_config(cfg))
    assert isinstance(exc, ConfigError)
    _no_slice_survives(secret, str(exc))
    _no_slice_survives(secret, repr(exc))


def test_every_kresilient_exception_message_is_pattern_redacted() -> None:
    exc = KResilientError("failed with password=hunter22xx")
    assert "hunter22xx" not in str(exc) and "hunter22xx" not in repr(exc)
    config_error = translate(
        KafkaException(
            KafkaError(
                KafkaError._INVALID_ARG,
                'Invalid value "plainpw99" for configuration property "sasl.password"',
            )
        ),
        operation="configure",
    )
    assert "plainpw99" not in str(config_error)
    assert config_error.key == "sasl.password"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- rate limiting


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_allows_one_per_interval_and_counts_the_rest() -> None:
    clock = _Clock()
    limiter = RateLimiter(5.0, clock=clock)
    assert limiter.check("a") == (True, 0)
    assert [limiter.allow("a") for _ in range(3)] == [False, False, False]
    assert limiter.allow("b")  # keys are independent
    assert limiter.suppressed("a") == 3 and limiter.total_suppressed() == 3
    clock.now += 4.999
    assert limiter.check("a") == (False, 0)
    clock.now += 0.001
    assert limiter.check("a") == (True, 4)  # the next line reports what was held back
    assert limiter.suppressed("a") == 0
    limiter.reset("a")
    assert limiter.check("a") == (True, 0)


def test_rate_limiter_zero_interval_allows_everything() -> None:
    limiter = RateLimiter(0.0, clock=_Clock())
    assert all(limiter.allow("k") for _ in range(5))
    with pytest.raises(ValueError, match="interval_s"):
        RateLimiter(-1)
