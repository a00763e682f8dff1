"""The lint CLI: formats (SARIF validated against the 2.1.0 schema), exit codes, settings,
suppressions, and secrets that never reach the output."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest

from kresilient.cli import main
from kresilient.lint import RULES, lint_paths

DATA = Path(__file__).parent / "data"
SECRET = "Hunter2-S3cr3t!"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["lint", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(name="project")
def _project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "producer.properties").write_text(
        "bootstrap.servers=a:9092,b:9092\nacks=0\nenable.idempotense=true\n"
        f"security.protocol=sasl_ssl\nsasl.password={SECRET}\n"
    )
    (tmp_path / "broken.json").write_text('{"acks": "all",\n  "linger.ms": }\n')
    (tmp_path / "topics.yaml").write_text("topics:\n  t:\n    replication.factor: 1\n")
    return tmp_path


def test_text_format_locations_and_exit_code(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "producer.properties", "topics.yaml")
    assert code == 1
    assert "producer.properties:2:1: KR006 [error] acks=0" in out
    assert (
        "producer.properties:3:1: KR005 [error] unknown property 'enable.idempotense' "
        "(did you mean 'enable.idempotence'?)" in out
    )
    assert "topics.yaml:3:5: KR042" in out
    assert SECRET not in out


def test_parse_error_exits_2_with_location(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "broken.json")
    assert code == 2
    assert "broken.json:2:16: KR000 [error] JSON: Expecting value" in out


def test_exit_codes_follow_fail_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("warn.properties").write_text(
        # acks=1 and idempotence off are refused by ResilientProducer (an error, issue 36
        # #4) unless allowed as unsafe, as here: then they stay warnings
        "bootstrap.servers=a:1,b:1\n# kresilient: allow acks\nacks=1\n"
        "# kresilient: allow enable.idempotence\nenable.idempotence=false\n"
        "partitioner=murmur2_random\n"
    )
    Path("clean.properties").write_text(
        "bootstrap.servers=a:1,b:1\nacks=all\nenable.idempotence=true\n"
        "partitioner=murmur2_random\nmessage.timeout.ms=120000\n"
    )
    assert _run(capsys, "clean.properties")[0] == 0
    assert _run(capsys, "warn.properties")[0] == 0  # warnings only, default --fail-on error
    assert _run(capsys, "warn.properties", "--fail-on", "warning")[0] == 1
    assert _run(capsys, "warn.properties", "--ignore", "KR007,KR008", "--fail-on", "info")[0] == 0
    assert _run(capsys, "--no-such-flag")[0] == 2
    assert _run(capsys, "--select", "KR999", "clean.properties")[0] == 2
    assert _run(capsys, "missing.properties")[0] == 2


def test_json_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--format", "json", "producer.properties")
    assert code == 1
    findings = json.loads(out)
    assert {"rule", "severity", "path", "line", "message"} <= set(findings[0])
    assert {(f["rule"], f["line"]) for f in findings} >= {("KR006", 2), ("KR041", 5)}
    assert SECRET not in out


def test_sarif_is_valid_against_the_schema(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(capsys, "--format", "sarif", ".")
    assert code == 2  # broken.json
    log = json.loads(out)
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(log)
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} == set(RULES)
    assert all(r["help"]["text"] and r["help"]["markdown"] for r in rules)
    by_rule = {r["ruleId"]: r for r in run["results"]}
    region = by_rule["KR006"]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 2, "startColumn": 1}
    assert rules[by_rule["KR006"]["ruleIndex"]]["id"] == "KR006"
    assert by_rule["KR000"]["level"] == "error"
    assert SECRET not in out


def test_sarif_without_regions_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    from kresilient.lint.audit import ClusterSnapshot, PartitionState, check_snapshot
    from kresilient.lint.output import render

    snap = ClusterSnapshot(
        bootstrap="127.0.0.1:9092",
        partitions=[PartitionState(topic="t", partition=0, leader=-1, replicas=(1, 2), isr=())],
    )
    log = json.loads(render(check_snapshot(snap), "sarif", "audit"))
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validators.validator_for(schema)(schema).validate(log)
    assert {r["ruleId"] for r in log["runs"][0]["results"]} >= {"KR060", "KR061", "KR042"}


def test_github_annotations(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "--format", "github", "producer.properties")
    assert "::error file=producer.properties,line=2,col=1,title=KR006 acks-zero::acks=0" in out
    assert SECRET not in out


def test_output_file(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--format", "sarif", "-o", "report.sarif", "producer.properties")
    assert code == 1 and "KR006" in out  # text summary on stdout
    assert json.loads((project / "report.sarif").read_text())["version"] == "2.1.0"


def test_explain_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--explain", "kr006")
    assert code == 0
    assert out.startswith("KR006 acks-zero [error]") and "Why:" in out and "Fix:" in out
    assert _run(capsys, "--explain", "KR998")[0] == 2
    code, out, _ = _run(capsys, "--list-rules")
    assert code == 0 and len(out.splitlines()) == len(RULES)


def test_pyproject_settings_found_from_cwd_and_from_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    proj = tmp_path / "proj"
    (proj / "conf").mkdir(parents=True)
    (proj / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[tool.kresilient.lint]\nignore = ["KR036"]\n'
        'fail-on = "warning"\n[tool.kresilient.lint.severity]\nKR007 = "error"\n'
    )
    (proj / "conf" / "p.properties").write_text("bootstrap.servers=a:1\nacks=1\n")
    monkeypatch.chdir(tmp_path)  # above the project: found by walking up from the path
    code, out, _ = _run(capsys, "proj/conf/p.properties")
    assert code == 1
    assert "KR007 [error]" in out and "KR036" not in out
    monkeypatch.chdir(proj / "conf")
    assert "KR007 [error]" in _run(capsys, "p.properties")[1]
    (proj / "pyproject.toml").write_text("[tool.kresilient.lint]\nselct = []\n")
    code, _, err = _run(capsys, "p.properties")
    assert code == 2 and "selct" in err


def test_inline_suppressions_require_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "# kresilient: ignore-file[KR026] reason: single consumer, rebalances are rare\n"
        "consumer:\n"
        "  group.id: g\n"
        "  auto.offset.reset: latest  # kresilient: ignore[KR021] reason: live metrics only\n"
        "  # kresilient: ignore[KR029]\n"
        "  isolation.level: read_uncommitted\n"
        "  # kresilient: ignore[KR029, KR030] reason: no transactions upstream\n"
        "  client.id: x\n"
    )
    findings = lint_paths([str(path)])
    rules = [(f.rule, f.line) for f in findings]
    assert ("KR021", 4) not in rules and not any(r == "KR026" for r, _ in rules)
    assert ("KR029", 6) in rules  # suppression without reason is not applied...
    assert ("KR099", 5) in rules  # ...and is itself a finding


def test_python_suppression_above_the_call(tmp_path: Path) -> None:
    path = tmp_path / "app.py"
    path.write_text(
        "from confluent_kafka import Producer\n"
        "# kresilient: ignore[KR013, KR014] reason: wrapped by our own delivery layer\n"
        "p = Producer({'bootstrap.servers': 'a,b', 'acks': 'all'})\n"
    )
    assert not {"KR013", "KR014"} & {f.rule for f in lint_paths([str(path)])}


def test_secrets_never_printed_in_any_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {
        "a.properties": f"security.protocol=sasl_plaintext\nsasl.password={SECRET}\n"
        f"ssl.key.password={SECRET}\nsasl.username=u\n",
        "b.yaml": f"producer:\n  sasl.password: {SECRET}\n  sasl.oauthbearer.client.secret: "
        f"{SECRET}\n  acks: 0\n",
        "c.py": "from confluent_kafka import Consumer\n"
        f"Consumer({{'group.id': 'g', 'sasl.password': '{SECRET}'}})\n",
        "d.env": f"KAFKA_SASL_PASSWORD={SECRET}\nKAFKA_ACKS=0\n",
        "server.properties": "node.id=1\nlistener.name.sasl_ssl.plain.sasl.jaas.config="
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{SECRET}";\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for fmt in ("text", "json", "sarif", "github"):
        code, out, err = _run(capsys, "--format", fmt, str(tmp_path))
        assert code == 1
        assert SECRET not in out + err
        assert out.count("KR041") >= 5 if fmt != "sarif" else "KR041" in out


def test_non_utf8_file_is_a_located_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "p.properties"
    path.write_bytes(b"acks=all\nclient.id=\xff\xfe\n")
    (finding,) = lint_paths([str(path)])
    assert (finding.rule, finding.line, finding.col) == ("KR000", 2, 11)


def test_python_module_entry_point(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "p.properties").write_text("acks=0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "kresilient.lint", str(tmp_path / "p.properties")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and "KR006" in proc.stdout


# ----------------------------------------------------------------------------- nothing checked


def test_empty_directory_is_exit_2_not_a_clean_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22 point 7: an empty directory gave "0 finding(s)", exit 0."""
    monkeypatch.chdir(tmp_path)
    Path("empty").mkdir()
    code, out, err = _run(capsys, "empty")
    assert code == 2
    assert "kresilient lint: no Kafka configuration found in empty: no file of a kind" in err
    assert "0 file(s) read" in out


def test_directory_without_kafka_settings_is_exit_2_and_lists_what_it_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("ci.yaml").write_text("name: build\non: [push]\n")
    Path("package.json").write_text('{"name": "web", "version": "1.0.0"}\n')
    Path("README.md").write_text("acks=0\n")  # not a kind lint reads in a directory walk
    code, out, err = _run(capsys, ".", "--verbose")
    assert code == 2
    assert "no Kafka configuration found in .: 2 file(s) read, none holds Kafka settings" in err
    assert "skipped ci.yaml: no Kafka settings found" in err
    assert "skipped package.json: no Kafka settings found" in err
    assert "2 file(s) read: 0 with Kafka settings, 2 skipped (no Kafka settings)" in out
    for fmt in ("json", "sarif"):
        code, out, err = _run(capsys, ".", "--format", fmt)
        assert code == 2 and "no Kafka configuration found" in err
        parsed = json.loads(out)  # stdout stays one parseable document
        if fmt == "sarif":
            (invocation,) = parsed["runs"][0]["invocations"]
            assert invocation["executionSuccessful"] is False
            assert invocation["properties"]["filesSkipped"] == 2
        else:
            assert parsed == []
    assert _run(capsys, ".", "--allow-no-config")[0] == 0  # what a pre-commit hook may want


def test_summary_counts_files_read_skipped_and_unreadable(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path("notes.yaml").write_text("shopping: [milk, eggs]\n")
    code, out, _ = _run(capsys, ".")
    assert code == 2  # broken.json
    assert (
        "4 file(s) read: 2 with Kafka settings, 1 skipped (no Kafka settings), "
        "1 not readable (KR000)" in out.splitlines()[-1]
    )


@pytest.mark.parametrize("option", ["--select", "--ignore"])
@pytest.mark.parametrize("ids", ["KR9", "KR08", "KR0,KR9999", "XX1"])
def test_unknown_rule_prefix_is_a_usage_error_naming_it(
    project: Path, capsys: pytest.CaptureFixture[str], option: str, ids: str
) -> None:
    """``--select KR9`` matched no rule and the run checked nothing, exit 0."""
    code, out, err = _run(capsys, option, ids, "producer.properties")
    bad = ids.split(",")[-1]
    assert code == 2
    assert f"{option}: unknown rule id or prefix {bad!r}" in err
    assert out == ""


def test_unknown_rule_prefix_in_pyproject_is_a_usage_error(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Path("pyproject.toml").write_text('[tool.kresilient.lint]\nselect = ["KR9"]\n')
    code, _, err = _run(capsys, "producer.properties")
    assert code == 2
    assert "unknown rule id or prefix 'KR9'" in err
    Path("pyproject.toml").write_text('[tool.kresilient.lint]\nselect = ["KR00"]\n')
    assert _run(capsys, "producer.properties")[0] == 1  # a real prefix: KR006 acks=0


# ----------------------------------------------------------------------------- help


def subcommand_parsers(*path: str) -> list[argparse.ArgumentParser]:
    """The parser of ``kresilient <path...>`` and of each of its subcommands."""
    from kresilient.cli import build_parser

    parser = build_parser()
    for name in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += list(action.choices.values())
    return found


def assert_help_is_complete(parser: argparse.ArgumentParser) -> None:
    """Every option has help in plain sentences: capitalised, ending with a full stop, no
    reStructuredText markup, nothing cut mid-sentence."""
    texts = {"description": parser.description or "", "epilog": parser.epilog or ""}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        texts[action.dest] = action.help or ""
    for what, text in texts.items():
        if what == "epilog" and not text:
            continue
        assert text, f"{parser.prog}: {what} has no help"
        assert "``" not in text and ":mod:" not in text, f"{parser.prog} {what}: {text}"
        assert text[0].isupper() and text.rstrip().endswith((".", ".)")), (
            f"{parser.prog} {what}: not a sentence: {text!r}"
        )
    rendered = parser.format_help()
    assert "``" not in rendered and not rendered.rstrip().endswith(",")


@pytest.mark.parametrize("command", ["lint", "audit"])
def test_every_help_is_complete(command: str) -> None:
    """Issue 22: ``lint --help`` ended mid-sentence ("...2 a usage error,"), options of
    ``audit`` had no help at all."""
    for parser in subcommand_parsers(command):
        assert_help_is_complete(parser)
