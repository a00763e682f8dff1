"""Lint = runtime (issue 36 #4): `kresilient lint` exits 1 on every config the clients refuse.

kresilient.config.REFUSALS is the one table of what ResilientProducer/ResilientConsumer refuse.
These tests run every example of every row through the runtime (producer_config /
consumer_config) and through lint, as a `.properties` file and as a dict passed to the
kresilient client in Python source, and assert they agree: lint exits 1 exactly when the
runtime raises. The opt-out is the same on both sides: `allow_unsafe=` in code,
`# kresilient: allow KEY` in a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import pytest

from kresilient import config as runtime
from kresilient.errors import ConfigError, UnsafeConfigError
from kresilient.lint import lint_paths
from kresilient.lint.engine import exit_code
from kresilient.lint.model import Finding, Severity
from kresilient.lint.settings import Settings

Role = Literal["producer", "consumer"]
BOOTSTRAP = "k1:9092,k2:9092,k3:9092"
#: Rows only a complete config (a dict in code) can show: a file may be one part of a config.
CODE_ONLY = frozenset({"other-role-key", "bootstrap-required", "group-id-required"})


def _base(role: Role) -> dict[str, str]:
    return {"bootstrap.servers": BOOTSTRAP, **({"group.id": "g"} if role == "consumer" else {})}


def _runtime_refuses(role: Role, config: Mapping[str, str], allow: tuple[str, ...] = ()) -> bool:
    build = runtime.producer_config if role == "producer" else runtime.consumer_config
    try:
        build(config, allow_unsafe=allow)
    except ConfigError:
        return True
    return False


def _lint(path: Path) -> tuple[int, list[Finding]]:
    settings = Settings()
    findings = lint_paths([str(path)], settings)
    return exit_code(findings, settings), findings


def _properties(tmp_path: Path, config: Mapping[str, str], allow: tuple[str, ...] = ()) -> Path:
    lines = ["client.id=app"]  # a file needs two Kafka keys to be read as a Kafka config
    for key, value in config.items():
        if allow and key not in ("bootstrap.servers", "group.id"):
            lines.append(f"# kresilient: allow {', '.join(allow)}")
        lines.append(f"{key}={value}")
    path = tmp_path / "client.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


def _python(
    tmp_path: Path, role: Role, config: Mapping[str, str], allow: tuple[str, ...] = ()
) -> Path:
    cls = "ResilientProducer" if role == "producer" else "ResilientConsumer"
    extra = f", allow_unsafe={allow!r}" if allow else ""
    path = tmp_path / "app.py"
    path.write_text(f"from kresilient import {cls}\n\nclient = {cls}({dict(config)!r}{extra})\n")
    return path


def _cases() -> list[tuple[str, Role, dict[str, str]]]:
    cases = []
    for row in runtime.REFUSALS:
        for role in sorted(row.roles):
            for example in row.examples:
                cases.append((row.name, role, {**_base(role), **example}))  # type: ignore[arg-type]
    # rows whose examples depend on the role, or on what is missing
    cases += [
        ("other-role-key", "producer", {**_base("producer"), "group.id": "g"}),
        ("other-role-key", "consumer", {**_base("consumer"), "acks": "all"}),
        ("bootstrap-required", "producer", {"acks": "all"}),
        ("group-id-required", "consumer", {"bootstrap.servers": BOOTSTRAP}),
    ]
    return cases


CASES = _cases()
ALL_ALLOWS = tuple(row.allow for row in runtime.REFUSALS if row.allow)


def test_every_row_of_the_table_has_a_case() -> None:
    assert {name for name, _, _ in CASES} == {row.name for row in runtime.REFUSALS}


@pytest.mark.parametrize(("row", "role", "config"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_runtime_refuses_each_example_for_that_row(
    row: str, role: Role, config: dict[str, str]
) -> None:
    assert _runtime_refuses(role, config)
    # the row is among the reasons (gapless with idempotence off is refused first for
    # idempotence off; allowing that, for gapless)
    rows = {r.row for r in runtime.refusals(config, role)[0]}
    rows |= {r.row for r in runtime.refusals(config, role, allow_unsafe=ALL_ALLOWS)[0]}
    assert row in rows, rows
    unsafe = runtime.refusals(config, role)[0][0].unsafe  # the one the client raises
    build = runtime.producer_config if role == "producer" else runtime.consumer_config
    with pytest.raises(ConfigError) as info:
        build(config)
    assert isinstance(info.value, UnsafeConfigError) == unsafe


@pytest.mark.parametrize(("row", "role", "config"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_lint_exits_1_on_every_refused_config(
    tmp_path: Path, row: str, role: Role, config: dict[str, str]
) -> None:
    code, findings = _lint(_python(tmp_path, role, config))
    assert code == 1, findings
    if row not in CODE_ONLY:
        code, findings = _lint(_properties(tmp_path, config))
        assert code == 1, findings
        errors = {f.rule for f in findings if f.severity == Severity.ERROR}
        reporting = next(r for r in runtime.REFUSALS if r.name == row).lint_rules
        assert errors & {*reporting, "KR054"}, (errors, reporting)


UNSAFE = [
    (row.name, role, {**_base(role), **example}, (row.allow,))
    for row in runtime.REFUSALS
    if row.unsafe and row.allow
    for role in sorted(row.roles)
    for example in row.examples
]


@pytest.mark.parametrize(
    ("row", "role", "config", "allow"), UNSAFE, ids=[f"{c[0]}-{c[1]}" for c in UNSAFE]
)
def test_the_runtime_opt_out_is_the_lint_opt_out(
    tmp_path: Path, row: str, role: Role, config: dict[str, str], allow: tuple[str, ...]
) -> None:
    """allow_unsafe= / `# kresilient: allow KEY`: lint fails exactly when the runtime still
    refuses (max.in.flight=6 allowed still conflicts with the default idempotence)."""
    refuses = _runtime_refuses(role, config, allow)
    code, findings = _lint(_python(tmp_path, role, config, allow))
    assert (code == 1) == refuses, findings
    code, findings = _lint(_properties(tmp_path, config, allow))
    assert (code == 1) == refuses, findings
    if not refuses:
        assert any(f.severity == Severity.WARNING for f in findings)  # still visible


def test_acks_one_in_a_producer_file_is_an_error(tmp_path: Path) -> None:
    """The issue's case: ResilientProducer refuses acks=1; lint gave a warning (exit 0)."""
    path = tmp_path / "producer.properties"
    path.write_text(f"bootstrap.servers={BOOTSTRAP}\nacks=1\n")
    code, findings = _lint(path)
    assert code == 1
    acks = [f for f in findings if f.line == 2]
    assert [(f.rule, f.severity) for f in acks] == [("KR007", Severity.ERROR)]
    assert "ResilientProducer refuses it" in acks[0].message
    assert "# kresilient: allow acks" in acks[0].message


def test_auto_offset_store_with_auto_commit_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "consumer.properties"
    path.write_text(f"bootstrap.servers={BOOTSTRAP}\ngroup.id=g\nenable.auto.offset.store=true\n")
    code, findings = _lint(path)
    assert code == 1
    assert ("KR018", Severity.ERROR) in [(f.rule, f.severity) for f in findings]


def test_a_file_with_producer_and_consumer_keys_is_judged_per_role(tmp_path: Path) -> None:
    """acks in a file with group.id: judged as the producer reads it, never 'ignored by a
    consumer'; the consumer keys as the consumer reads them."""
    path = tmp_path / "client.properties"
    path.write_text(
        f"bootstrap.servers={BOOTSTRAP}\ngroup.id=g\nacks=1\nauto.offset.reset=latest\n"
    )
    code, findings = _lint(path)
    assert code == 1
    assert not [f for f in findings if "ignored by a" in f.message], findings
    by_line = {(f.line, f.rule): f.severity for f in findings}
    assert by_line[(3, "KR007")] == Severity.ERROR
    assert by_line[(4, "KR021")] == Severity.ERROR
    assert "KR032" not in {f.rule for f in findings}


def test_allow_comment_turns_the_error_into_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "producer.yaml"
    path.write_text(f"bootstrap.servers: {BOOTSTRAP}\nacks: 1  # kresilient: allow acks\n")
    code, findings = _lint(path)
    assert code == 0
    assert [(f.rule, f.severity) for f in findings if f.line == 2] == [("KR007", Severity.WARNING)]
    # control: without the comment it is an error
    path.write_text(f"bootstrap.servers: {BOOTSTRAP}\nacks: 1\n")
    assert _lint(path)[0] == 1


def test_allow_naming_an_unknown_property_is_reported_and_not_applied(tmp_path: Path) -> None:
    path = tmp_path / "producer.properties"
    path.write_text(f"bootstrap.servers={BOOTSTRAP}\n# kresilient: allow akcs\nacks=1\n")
    code, findings = _lint(path)
    assert code == 1
    assert any(f.rule == "KR099" and "akcs" in f.message for f in findings)


def test_java_client_files_keep_their_own_severities(tmp_path: Path) -> None:
    """A file the Java client reads is not read by ResilientProducer: acks=1 stays a warning."""
    path = tmp_path / "producer.properties"
    path.write_text(
        f"bootstrap.servers={BOOTSTRAP}\nacks=1\n"
        "key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
    )
    code, findings = _lint(path)
    assert code == 0
    assert ("KR007", Severity.WARNING) in [(f.rule, f.severity) for f in findings]
