"""``kresilient lint --fix`` / ``--diff`` (issue 15): safe mechanical fixes that keep every
other byte, re-lint clean for the fixed rules, and leave a file with nothing to fix
byte-identical (and unwritten)."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kresilient.lint.engine import lint_text
from kresilient.lint.fix import FIXABLE, fix_text
from kresilient.lint.model import Severity
from kresilient.lint.settings import Settings

DATA = Path(__file__).parent / "data" / "lint"
#: --fix acts only on findings that are errors for the file's reader (issue 38 #9); a team
#: that makes the fixable rules errors gets every mechanical fix (the cases below).
STRICT = Settings(severity=dict.fromkeys(FIXABLE, Severity.ERROR))


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kresilient.cli", "lint", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _rules(text: str, path: str, settings: Settings | None = None) -> set[str]:
    return {f.rule for f in lint_text(text, path, settings)}


@pytest.mark.parametrize(
    ("name", "before", "after", "fixed"),
    [
        (
            "producer.properties",
            "# orders\nbootstrap.servers=b:9092\nacks = 1\npartitioner : consistent_random\n",
            "# orders\nbootstrap.servers=b:9092\nacks = all\npartitioner : murmur2_random\n"
            "enable.idempotence=true\n",
            {"KR007", "KR008", "KR012"},
        ),
        (
            "consumer.properties",
            "bootstrap.servers=b:9092\ngroup.id=g\nauto.offset.reset=latest\n",
            "bootstrap.servers=b:9092\ngroup.id=g\nauto.offset.reset=earliest\n",
            {"KR021"},
        ),
        (
            "p.yaml",
            "producer:\n  bootstrap.servers: a:1,b:1\n  acks: '0'   # fast\n"
            "  enable.idempotence: false\n",
            "producer:\n  bootstrap.servers: a:1,b:1\n  acks: 'all'   # fast\n"
            "  enable.idempotence: true\n",
            {"KR006", "KR008"},
        ),
        (
            "flow.yaml",
            "producer: {bootstrap.servers: 'a:1', acks: 1, enable.idempotence: true}\n",
            "producer: {bootstrap.servers: 'a:1', acks: all, enable.idempotence: true}\n",
            {"KR007"},
        ),
        (
            "application.yml",
            "spring:\n  kafka:\n    consumer:\n      enable-auto-commit: true   # why\n"
            '      auto-offset-reset: "latest"\n',
            "spring:\n  kafka:\n    consumer:\n      enable-auto-commit: false   # why\n"
            '      auto-offset-reset: "earliest"\n',
            {"KR018", "KR021"},
        ),
        (
            "application.properties",
            "spring.kafka.producer.acks=1\nspring.kafka.consumer.auto-offset-reset=latest\n",
            "spring.kafka.producer.acks=all\nspring.kafka.consumer.auto-offset-reset=earliest\n",
            # KR008 too: for the Java client acks=1 turned its default idempotence off
            {"KR007", "KR008", "KR021"},
        ),
        (
            ".env",
            "KAFKA_BOOTSTRAP_SERVERS=b:9092\nexport KAFKA_PRODUCER_ACKS=0 # fast\n"
            'KAFKA_PRODUCER_ENABLE_IDEMPOTENCE="false"\n',
            "KAFKA_BOOTSTRAP_SERVERS=b:9092\nexport KAFKA_PRODUCER_ACKS=all # fast\n"
            'KAFKA_PRODUCER_ENABLE_IDEMPOTENCE="true"\n',
            {"KR006", "KR008"},
        ),
    ],
)
def test_fix_each_format_in_place_and_relints_clean(
    name: str, before: str, after: str, fixed: set[str]
) -> None:
    assert fixed <= _rules(before, name)  # negative control: the findings are there first
    fix = fix_text(before, name, STRICT)
    assert fix.after == after, fix.notes
    assert {f.rule for f in fix.fixed} == fixed
    assert not fixed & _rules(fix.after, name)
    # by default only the errors for that file's reader are fixed (issue 38 #9)
    default = fix_text(before, name)
    errors = {f.rule for f in lint_text(before, name) if f.severity >= Severity.ERROR}
    assert {f.rule for f in default.fixed} <= errors


def test_fix_by_default_touches_only_errors_for_the_reader() -> None:
    """Issue 38 #9: a Spring file's acks=1 and auto-offset-reset=latest are warnings for
    the Java client (Spring commits after processing): not edited. A librdkafka file's
    acks=1 is refused by ResilientProducer (an error): fixed; the unset enable.idempotence
    (a warning: kresilient's clients default it on) is not added."""
    spring = "spring.kafka.producer.acks=1\nspring.kafka.consumer.auto-offset-reset=latest\n"
    assert fix_text(spring, "application.properties").after == spring
    plain = "bootstrap.servers=b:9092\nacks=1\n"
    fix = fix_text(plain, "producer.properties")
    assert fix.after == "bootstrap.servers=b:9092\nacks=all\n"
    assert {f.rule for f in fix.fixed} == {"KR007"}


def test_line_endings_bom_and_a_missing_final_newline_are_kept(tmp_path: Path) -> None:
    text = "\ufeffbootstrap.servers=b:9092\r\nacks=1\r\nlinger.ms=5"
    path = tmp_path / "p.properties"
    path.write_bytes(text.encode("utf-8"))
    out = _cli("--fix", str(path), cwd=tmp_path)
    assert "fixed 1 finding(s) in 1 file(s)" in out.stderr, out.stderr
    # acks=1 is an error (ResilientProducer refuses it); the unset enable.idempotence is a
    # warning and is not added (issue 38 #9): STRICT below adds it
    assert path.read_bytes() == (
        "\ufeffbootstrap.servers=b:9092\r\nacks=all\r\nlinger.ms=5"
    ).encode("utf-8")
    strict = fix_text(text[1:], "p.properties", STRICT)
    assert strict.after.endswith("linger.ms=5\r\nenable.idempotence=true\r\n")


def test_a_file_with_nothing_to_fix_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "p.properties"
    path.write_bytes(b"# clean\nbootstrap.servers=b:9092\nacks=all\nenable.idempotence=true\n")
    os.utime(path, (1_000_000_000, 1_000_000_000))
    before = path.read_bytes()
    out = _cli("--fix", str(path), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert path.read_bytes() == before
    assert path.stat().st_mtime == 1_000_000_000  # not rewritten either


def test_a_symlinked_config_is_fixed_through_its_link(tmp_path: Path) -> None:
    real = tmp_path / "real.properties"
    real.write_text("bootstrap.servers=b:9092\nacks=0\nenable.idempotence=true\n")
    real.chmod(0o640)
    link = tmp_path / "p.properties"
    link.symlink_to(real)
    assert _cli("--fix", "p.properties", cwd=tmp_path).returncode == 0
    assert link.is_symlink() and "acks=all" in real.read_text()
    assert real.stat().st_mode & 0o777 == 0o640


def test_diff_writes_nothing_and_exits_1_when_there_is_something_to_fix(tmp_path: Path) -> None:
    path = tmp_path / "p.properties"
    path.write_text("bootstrap.servers=b:9092\nacks=0\nenable.idempotence=true\n")
    before = path.read_bytes()
    out = _cli("--diff", "p.properties", cwd=tmp_path)
    assert out.returncode == 1
    assert "-acks=0\n+acks=all\n" in out.stdout
    assert out.stdout.startswith("--- a/p.properties\n+++ b/p.properties\n")
    assert path.read_bytes() == before
    path.write_text("bootstrap.servers=b:9092\nacks=all\nenable.idempotence=true\n")
    clean = _cli("--diff", "p.properties", cwd=tmp_path)
    assert (clean.returncode, clean.stdout) == (0, "")


def test_fix_reports_what_is_left_and_exits_by_it(tmp_path: Path) -> None:
    path = tmp_path / "p.properties"
    path.write_text("bootstrap.servers=b:9092\nacks=0\nretries=0\n")
    out = _cli("--fix", "--format", "json", "p.properties", cwd=tmp_path)
    # acks fixed; retries=0 is left (no mechanical fix): ResilientProducer refuses it, so
    # it is an error and the exit code says so
    assert path.read_text() == "bootstrap.servers=b:9092\nacks=all\nretries=0\n"
    assert '"KR010"' in out.stdout and '"KR006"' not in out.stdout
    assert out.returncode == 1
    # enable.idempotence=true would conflict with retries=0: not added even when KR008 is
    # an error
    fix = fix_text("bootstrap.servers=b:9092\nacks=0\nretries=0\n", "p.properties", STRICT)
    assert any("KR008 at line 1: not fixed (retries=0 conflicts" in n for n in fix.notes)


def test_idempotence_is_not_set_beside_a_setting_librdkafka_refuses_with_it() -> None:
    text = "bootstrap.servers=b:9092\nacks=all\nmax.in.flight=10\n"
    fix = fix_text(text, "p.properties", STRICT)
    assert fix.after == text
    assert any("max.in.flight=10 conflicts" in n for n in fix.notes)
    # control: without the conflict the same file is fixed
    fixed = fix_text(text.replace("10", "5"), "p.properties", STRICT).after
    assert "enable.idempotence=true" in fixed


def test_suppressed_ignored_and_java_findings_are_not_fixed() -> None:
    suppressed = (
        "producer:\n  bootstrap.servers: a:1\n  enable.idempotence: true\n"
        "  acks: 1  # kresilient: ignore[KR007] reason: metrics, loss acceptable\n"
    )
    assert fix_text(suppressed, "p.yaml").after == suppressed
    assert "KR007" in _rules(suppressed.replace("# kresilient", "# nobody"), "p.yaml")  # control
    text = "bootstrap.servers=b:9092\nacks=1\nenable.idempotence=true\n"
    ignoring = Settings(ignore=("KR007",))
    assert fix_text(text, "p.properties", ignoring).after == text
    # A Java producer: idempotence is on by default, KR008 does not fire, nothing to set.
    java = (
        "bootstrap.servers=b:9092\n"
        "key.serializer=org.apache.kafka.common.serialization.StringSerializer\n"
    )
    assert fix_text(java, "p.properties").after == java


def test_values_that_are_not_one_line_scalars_are_left_with_a_note() -> None:
    continued = "bootstrap.servers=b:9092\nenable.idempotence=true\nacks=\\\n  1\n"
    fix = fix_text(continued, "p.properties")
    assert fix.after == continued
    assert any("not a one-line scalar" in n for n in fix.notes), fix.notes
    block = "producer:\n  bootstrap.servers: a:1\n  enable.idempotence: true\n  acks: >-\n    1\n"
    fix = fix_text(block, "p.yaml")
    assert fix.after == block
    assert any("not a one-line scalar" in n for n in fix.notes), fix.notes


def test_an_unset_key_is_added_only_to_plain_properties() -> None:
    yaml_text = "producer:\n  bootstrap.servers: a:1\n  acks: all\n"
    fix = fix_text(yaml_text, "p.yaml", STRICT)
    assert fix.after == yaml_text
    assert any("add it by hand" in n for n in fix.notes)


@pytest.mark.parametrize(
    "text",
    [
        "producer:\n  acks: [1\n",  # a parse error
        "a: &a [" + "x, " * 10 + "]\n" + "b: " + "[*a, " * 50 + "]" * 50 + "\n",
        "\udcff=1\n",
    ],
)
def test_hostile_or_broken_files_are_left_alone(text: str) -> None:
    fix = fix_text(text, "h.yaml")
    assert fix.after == text and not fix.fixed


def _corpus() -> list[tuple[str, str]]:
    cases = yaml.safe_load((DATA / "rule_cases.yaml").read_text())
    out = [
        (name, content)
        for rule, pair in sorted(cases.items())
        for which in ("bad", "good")
        if isinstance(pair.get(which), dict)
        for name, content in (pair[which].get("files") or {}).items()
    ]
    out += [
        (str(p.relative_to(DATA)), p.read_text())
        for p in sorted(DATA.rglob("*"))
        if p.suffix in (".properties", ".yaml", ".yml", ".env") and p.name != "rule_cases.yaml"
    ]
    return out


def test_round_trip_over_the_whole_lint_corpus() -> None:
    """Acceptance 3 over every corpus file: fixed files re-lint without the fixed findings
    and without any new one; files with nothing to fix come back byte-identical."""
    fixed_files = 0
    for name, text in _corpus():
        default = fix_text(text, name)
        errors = {
            (f.rule, f.message) for f in lint_text(text, name) if f.severity >= Severity.ERROR
        }
        assert {(f.rule, f.message) for f in default.fixed} <= errors, name
        fix = fix_text(text, name, STRICT)
        before = lint_text(text, name, STRICT)
        if not fix.changed:
            assert fix.after == text, name
            continue
        fixed_files += 1
        after = lint_text(fix.after, name, STRICT)
        new = {(f.rule, f.message) for f in after} - {(f.rule, f.message) for f in before}
        assert not new, (name, new)
        left = {(f.rule, f.message) for f in after if f.rule in FIXABLE}
        assert not left & {(f.rule, f.message) for f in fix.fixed}, (name, left)
    assert fixed_files >= 8  # the corpus does exercise the fixer


@pytest.mark.parametrize("key", ["retries", "message.send.max.retries"])
def test_kr001_catches_retries_zero_beside_idempotence(key: str) -> None:
    """librdkafka refuses it ("`retries` must be set >= 1 when `enable.idempotence` is
    true"); KR001 read ``number(...) or 1`` and so never saw the 0 (found writing --fix)."""
    text = f"bootstrap.servers=b:9092\nacks=all\nenable.idempotence=true\n{key}=0\n"
    assert [(f.rule, f.line) for f in lint_text(text, "p.properties") if f.rule == "KR001"] == [
        ("KR001", 4)
    ]
    ok = text.replace(f"{key}=0", f"{key}=3")
    assert "KR001" not in _rules(ok, "p.properties")  # control


# ----------------------------------------------------------------------------- Python, INI


def test_a_resilient_dict_literal_is_fixed_in_python_keeping_its_quotes() -> None:
    """A ResilientProducer/ResilientConsumer dict is read by kresilient: its refused values
    are errors, fixed in place (located with ast; ``False`` becomes ``True``, an int becomes
    a string in the key's quotes); the file still parses and lints clean of them."""
    before = (
        "from kresilient import ResilientProducer, ResilientConsumer\n"
        "p = ResilientProducer({'bootstrap.servers': 'a:9092,b:9092', 'acks': 1,  # fast\n"
        "                       \"enable.idempotence\": False}, topic='t')\n"
        'conf = {"bootstrap.servers": "a:9092,b:9092", "group.id": "g",\n'
        '        "auto.offset.reset": "latest"}\n'
        "c = ResilientConsumer(conf, topics=['t'])\n"
        "c2 = ResilientConsumer(conf, topics=['u'])  # one literal, two clients\n"
    )
    found = lint_text(before, "app.py")
    assert {"KR007", "KR008", "KR021"} <= {
        f.rule for f in found if f.severity >= Severity.ERROR
    }  # negative control: errors first
    fix = fix_text(before, "app.py")
    assert fix.after == (
        before.replace("'acks': 1,", "'acks': 'all',")
        .replace('"enable.idempotence": False', '"enable.idempotence": True')
        .replace('"auto.offset.reset": "latest"', '"auto.offset.reset": "earliest"')
    ), fix.notes
    ast.parse(fix.after)
    assert not {"KR007", "KR008", "KR021"} & _rules(fix.after, "app.py")


def test_a_plain_confluent_kafka_dict_is_a_warning_left_alone_by_default() -> None:
    """acks=1 in a confluent-kafka Producer dict is a warning (its reader is not kresilient):
    not edited by default; with the rule made an error it is. acks=0 is an error for every
    reader: fixed by default."""
    text = "from confluent_kafka import Producer\np = Producer({'acks': 1})\n"
    assert fix_text(text, "p.py").after == text
    assert fix_text(text, "p.py", STRICT).after == text.replace("'acks': 1", "'acks': 'all'")
    zero = text.replace("'acks': 1", "'acks': 0")
    assert fix_text(zero, "p.py").after == text.replace("'acks': 1", "'acks': 'all'")


@pytest.mark.parametrize(
    "value",
    ["ACKS", "f'{n}'", "str(1)", "'''1'''", "b'1'"],
)
def test_a_python_value_that_is_not_a_plain_literal_is_left_with_a_note(value: str) -> None:
    text = (
        "from kresilient import ResilientProducer\nACKS = '1'\nn = 1\n"
        f"p = ResilientProducer({{'bootstrap.servers': 'a:9092,b:9092', 'acks': {value}}})\n"
    )
    fix = fix_text(text, "p.py", STRICT)
    assert fix.after == text
    if "KR007" in _rules(text, "p.py", STRICT):  # a value lint could read: noted, not edited
        assert any("not a literal" in n for n in fix.notes), fix.notes


def test_ini_sections_are_not_keys_and_a_value_under_one_is_fixed() -> None:
    """A librdkafka program's .conf (Metron's fastcapa) and a configparser .ini hold
    ``[section]`` headers: they are no keys (no KR005), and the value is fixed in place."""
    text = (
        "; a comment\n[kafka-global]\nmetadata.broker.list = a:9092,b:9092\n\n"
        "[kafka-topic]\nrequest.required.acks = 1\n"
    )
    for name in ("fastcapa.conf", "client.ini", "client.cfg"):
        assert "KR005" not in _rules(text, name), name
        fix = fix_text(text, name)
        assert fix.after == text.replace("acks = 1", "acks = all"), (name, fix.notes)
        configparser.ConfigParser(interpolation=None).read_string(fix.after)
