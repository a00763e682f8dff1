"""KR041 (credential-in-file) precision, issue 15: literal secrets are found wherever they
sit (JAAS options such as ``clientSecret``), and what only stands for a secret (file names,
placeholders, templates, masks) is not a finding."""

from __future__ import annotations

from pathlib import Path

import pytest

from kresilient.lint import lint_paths, lint_text

SECRET = "Sup3r-S3cret!"
BASE = "bootstrap.servers=a:9092,b:9092\nsecurity.protocol=sasl_ssl\nsasl.mechanism=PLAIN\n"


def _kr041(text: str, name: str = "c.properties") -> list[tuple[int, str]]:
    findings = lint_text(text, name)
    assert all(SECRET not in f.message for f in findings)
    return [(f.line, f.message) for f in findings if f.rule == "KR041"]


@pytest.mark.parametrize(
    "value",
    [
        "<ccloud secret>",
        "<API_SECRET>",
        "dummy",
        "changeme",
        "{{ CLUSTER_API_SECRET }}",
        "{{ .Values.kafka.password }}",
        "${KAFKA_PASSWORD}",
        "${file:/etc/kafka/secrets.properties:password}",
        "$KAFKA_PASSWORD",
        "****",
        "xxxxxx",
        "CLUSTER_API_SECRET",
        "your-api-secret",
        "ENC(G6N718UuyPE5bHyWKyuLQSm02auQPUtm)",
        "[REDACTED]",
    ],
)
def test_a_stand_in_for_a_secret_is_not_a_finding(value: str) -> None:
    assert _kr041(f"{BASE}sasl.username=svc\nsasl.password={value}\n") == []
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="svc" password="{value}";'
    )
    assert _kr041(f"{BASE}sasl.jaas.config={jaas}\n") == []


def test_literal_password_is_a_finding_negative_control() -> None:
    assert _kr041(f"{BASE}sasl.username=svc\nsasl.password={SECRET}\n") == [
        (5, "sasl.password holds a literal credential (value not shown)")
    ]


def test_confluent_image_credentials_variables_name_files_not_secrets(tmp_path: Path) -> None:
    """``KAFKA_SSL_KEYSTORE_CREDENTIALS=keystore_creds`` is the image's name of the file
    holding the password, not the password."""
    env = tmp_path / "broker.env"
    env.write_text(
        "KAFKA_NODE_ID=1\nKAFKA_SSL_KEYSTORE_FILENAME=kafka.keystore.jks\n"
        "KAFKA_SSL_KEYSTORE_CREDENTIALS=keystore_creds\nKAFKA_SSL_KEY_CREDENTIALS=key_creds\n"
        "KAFKA_SSL_TRUSTSTORE_CREDENTIALS=truststore_creds\n"
        f"KAFKA_SSL_KEY_PASSWORD={SECRET}\n"
    )
    found = [(f.line, f.key) for f in lint_paths([str(env)]) if f.rule == "KR041"]
    assert found == [(6, "ssl.key.password")]  # the literal one still is


@pytest.mark.parametrize(
    ("module", "option"),
    [
        (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            f'clientId="svc" clientSecret="{SECRET}" scope="kafka";',
            "clientSecret",
        ),
        (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="svc" password="{SECRET}";',
            "password",
        ),
    ],
)
def test_literal_secret_inside_a_jaas_string_is_a_finding(module: str, option: str) -> None:
    """A ``clientSecret`` inside a JAAS string was missed (only ``password=`` was looked at)."""
    assert _kr041(f"{BASE}sasl.jaas.config={module}\n") == [
        (4, f"sasl.jaas.config holds a literal {option} (value not shown)")
    ]


def test_literal_client_secret_in_librdkafka_oauthbearer_config_is_a_finding() -> None:
    text = (
        "bootstrap.servers=a:9092,b:9092\nsecurity.protocol=sasl_ssl\n"
        f"sasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.config=clientId=svc clientSecret={SECRET}\n"
    )
    assert _kr041(text) == [
        (4, "sasl.oauthbearer.config holds a literal clientSecret (value not shown)")
    ]


SPRING_YAML = f"""\
spring:
  application:
    name: billing
  kafka:
    bootstrap-servers: a:9092,b:9092
    ssl:
      key-store-location: classpath:kafka.jks
      key-store-password: {SECRET}
      trust-store-password: ${{TRUSTSTORE_PASSWORD}}
      key-password: changeme
    consumer:
      enable-auto-commit: true
"""


def test_spring_boot_yaml_store_password_is_a_finding_and_nothing_else() -> None:
    """Spring's ``*-store-password`` with a literal value was missed: the file was not read
    as a Kafka config at all. The other findings are about the consumer settings (read in
    Spring's dialect with Java and Spring Kafka defaults); nothing about file names,
    references or placeholders, and no librdkafka-only finding."""
    findings = lint_text(SPRING_YAML, "application.yml")
    secret = [(f.rule, f.line, f.key) for f in findings if f.rule == "KR041"]
    assert secret == [("KR041", 8, "spring.kafka.ssl.key-store-password")]
    assert {f.rule for f in findings} == {"KR041", "KR018", "KR021", "KR030"}
    assert all(SECRET not in f.message for f in findings)


@pytest.mark.parametrize("key", ["key-store-password", "keyStorePassword", "key_store_password"])
def test_spring_boot_properties_store_password_is_a_finding(key: str) -> None:
    text = (
        "spring.kafka.bootstrap-servers=a:9092,b:9092\n"
        f"spring.kafka.ssl.{key}={SECRET}\nspring.kafka.ssl.trust-store-password=${{X}}\n"
    )
    assert _kr041(text, "application.properties") == [
        (2, f"spring.kafka.ssl.{key} holds a literal credential (value not shown)")
    ]


def test_other_yaml_with_a_password_is_not_read_as_spring_negative_control() -> None:
    text = f"database:\n  url: jdbc:x\n  password: {SECRET}\n"
    assert lint_text(text, "app.yml") == []
