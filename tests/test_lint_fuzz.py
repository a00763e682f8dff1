"""Hypothesis and hostile input: no file crashes or hangs the linter, and EVERY output format
renders EVERY generated file (issue 11, defect 7: the old fuzz test never wrote the report, so
a lone surrogate that broke the text and SARIF writers went unseen). Files that cannot be read
(invalid UTF-8, text that is not valid Unicode, nesting too deep, YAML alias bombs, files over
the size limit) are a located KR000 finding with exit code 2."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kresilient import _catalog as catalog
from kresilient.lint import FORMATS, RULES, Finding, Settings, exit_code, lint_paths, render
from kresilient.lint.readers import MAX_DEPTH, YAML_NODE_BUDGET
from kresilient.lint.settings import MAX_FILE_SIZE

DATA = Path(__file__).parent / "data"
EXTENSIONS = ["p.properties", "c.yaml", "c.json", "c.toml", ".env", "app.py"]
KEYS = sorted(
    {p.name for p in catalog.all_properties()}
    | {"replication.factor", "min.insync.replicas", "node.id", "broker.rack", "name"}
)
FUZZ = settings(
    max_examples=int(os.environ.get("KR_FUZZ", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
HOSTILE = settings(FUZZ, max_examples=max(10, int(os.environ.get("KR_FUZZ", "150")) // 5))
# One example of the structured-config test is one document written as four files (YAML, JSON,
# .properties, Python), each linted and each report rendered in every format (a SARIF report
# alone carries every rule's help, ~120 KB of JSON): a third of the budget, 50 documents, is
# still 200 files a run, more files than each single-file fuzz test above reads (at 150
# documents it took 60-65 s of a loaded CI worker).
FOUR_FILES = settings(FUZZ, max_examples=max(10, int(os.environ.get("KR_FUZZ", "150")) // 3))
SARIF_SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())
SARIF_VALIDATOR = jsonschema.validators.validator_for(SARIF_SCHEMA)(SARIF_SCHEMA)


def check_reports(findings: list[Finding], *, validate_sarif: bool = False) -> None:
    """Render ``findings`` in every output format and check each report is whole: strictly
    encodable as UTF-8 (what writing it to stdout or a file does), one line per finding in
    the line formats (no value forges a line), and the JSON formats parse back."""
    for f in findings:
        assert f.rule in RULES
        assert f.line >= 0 and f.col >= 0
        assert f.message
    for fmt in sorted(FORMATS):
        report = render(findings, fmt)
        report.encode("utf-8")  # strict: a lone surrogate raised UnicodeEncodeError here
        if fmt == "text":
            assert len(report.splitlines()) == len(findings) + 1, report
        elif fmt == "github":
            lines = report.splitlines()
            assert len(lines) == len(findings) and all(ln.startswith("::") for ln in lines)
        elif fmt == "json":
            parsed = json.loads(report)
            assert [(d["rule"], d["line"], d["column"]) for d in parsed] == [
                (f.rule, f.line, f.col) for f in findings
            ]
        elif fmt == "sarif":
            log = json.loads(report)
            (run,) = log["runs"]
            assert [r["ruleId"] for r in run["results"]] == [f.rule for f in findings]
            failed = any(f.rule == "KR000" for f in findings)
            assert run["invocations"][0]["executionSuccessful"] is not failed
            if validate_sarif:
                SARIF_VALIDATOR.validate(log)


def _lint_file(
    name: str, content: str | bytes, lint_settings: Settings | None = None
) -> list[Finding]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        findings = lint_paths([str(path)], lint_settings)
    check_reports(findings)
    return findings


def _parser_rejects(name: str, text: str) -> bool:
    parsers: dict[str, Any] = {
        ".json": json.loads,
        # The loader the reader uses: libyaml accepts some input the pure-Python loader
        # refuses ("0\t", a tab after a scalar), and the reader must agree with its parser.
        ".yaml": lambda t: list(
            yaml.load_all(t, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        ),
        ".toml": tomllib.loads,
        ".py": ast.parse,
    }
    for ext, parse in parsers.items():
        if name.endswith(ext):
            try:
                parse(text)
            except Exception:
                return True
            return False
    return False


def _assert_parse_error_located(findings: list[Finding], text: str) -> list[Finding]:
    errors = [f for f in findings if f.rule == "KR000"]
    assert errors, "malformed file without a KR000 finding"
    assert all(1 <= f.line <= text.count("\n") + 2 and f.col >= 1 for f in errors)
    assert exit_code(findings, Settings()) == 2
    return errors


def _no_parse_error(findings: list[Finding]) -> None:
    assert not [f for f in findings if f.rule == "KR000"], findings
    assert exit_code(findings, Settings()) != 2


# ----------------------------------------------------------------------------- random input

any_text = st.text(
    alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"])), max_size=400
)


@FUZZ
@given(name=st.sampled_from(EXTENSIONS), text=any_text)
def test_random_text_never_crashes(name: str, text: str) -> None:
    if "\x00" in text and name.endswith(".py"):
        text = "import confluent_kafka\n" + text
    findings = _lint_file(name, text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # written with surrogatepass: the file is not valid UTF-8
        _assert_parse_error_located(findings, text)
        return
    if _parser_rejects(name, text) and (not name.endswith(".py") or "confluent_kafka" in text):
        _assert_parse_error_located(findings, text)


@FUZZ
@given(name=st.sampled_from(EXTENSIONS), data=st.binary(max_size=300))
def test_random_bytes_never_crash(name: str, data: bytes) -> None:
    findings = _lint_file(name, data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        _assert_parse_error_located(findings, data.decode("utf-8", "replace"))


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=True, allow_infinity=False),
    st.text(max_size=20),
    st.text(alphabet=st.characters(max_codepoint=0x9F), max_size=20),  # control characters
    st.sampled_from(["all", "0", "1", "-1", "true", "none", "earliest", "${X}", "a:1,b:2"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=8,
)
configs = st.dictionaries(st.sampled_from(KEYS), values, min_size=1, max_size=12)
sections = st.dictionaries(
    st.sampled_from(["producer", "consumer", "admin", "topics", "broker", "kafka", "x"]),
    configs,
    max_size=3,
)


@FOUR_FILES
@given(doc=st.one_of(configs, sections))
def test_structured_configs_with_odd_values_never_crash(doc: dict[str, Any]) -> None:
    _lint_file("c.yaml", yaml.safe_dump(doc))
    _lint_file("c.json", json.dumps(doc))
    props = "".join(f"{k}={v}\n" for k, v in doc.items() if not isinstance(v, dict))
    _lint_file("p.properties", props)
    body = ", ".join(f"{k!r}: {v!r}" for k, v in doc.items())
    _lint_file("app.py", f"from confluent_kafka import Producer\nProducer({{{body}}})\n")


@FUZZ
@given(doc=configs, cut=st.integers(min_value=1))
def test_truncated_json_is_a_located_parse_error(doc: dict[str, Any], cut: int) -> None:
    text = json.dumps(doc, indent=2)
    prefix = text[: 1 + cut % (len(text) - 1)].rstrip()
    findings = _lint_file("c.json", prefix)
    _assert_parse_error_located(findings, prefix)


# ----------------------------------------------------------------------------- hostile input

BASE = [("bootstrap.servers", "a:9092,b:9092"), ("client.id", "svc")]


def _config_file(fmt: str, items: list[tuple[str, str]]) -> tuple[str, str]:
    """A config file of ``items`` whose values are written verbatim (escapes included):
    (file name, text); item ``i`` is on line ``i + 2`` in every format."""
    if fmt == "properties":
        return "p.properties", "# c\n" + "".join(f"{k}={v}\n" for k, v in items)
    if fmt == "json":
        body = ",\n".join(f'  "{k}": "{v}"' for k, v in items)
        return "c.json", "{\n" + body + "\n}\n"
    if fmt == "yaml":
        return "c.yaml", "producer:\n" + "".join(f'  {k}: "{v}"\n' for k, v in items)
    body = "\n".join(f'    "{k}": "{v}",' for k, v in items)
    return "app.py", "from confluent_kafka import Producer\nProducer({" + body + "})\n"


@HOSTILE
@given(
    fmt=st.sampled_from(["properties", "json", "yaml", "python"]),
    unit=st.integers(min_value=0xD800, max_value=0xDFFF),
    where=st.integers(min_value=0, max_value=len(BASE)),
    around=st.tuples(st.text("ab1", max_size=3), st.text("ab1", max_size=3)),
)
def test_lone_surrogate_escape_is_a_located_parse_error(
    fmt: str, unit: int, where: int, around: tuple[str, str]
) -> None:
    """``\\uD800`` (an unpaired UTF-16 code unit) in a value: located at its entry."""
    value = f"{around[0]}\\u{unit:04x}{around[1]}"
    items = [*BASE[:where], ("acks", value), *BASE[where:]]
    name, text = _config_file(fmt, items)
    findings = _lint_file(name, text)
    errors = _assert_parse_error_located(findings, text)
    if fmt == "yaml" and any(e.message.startswith("YAML:") for e in errors):
        return  # PyYAML itself may refuse the escape: still a located KR000
    assert [e.line for e in errors] == [where + 2], errors
    assert "not valid Unicode" in errors[0].message


@pytest.mark.parametrize("fmt", ["properties", "json"])
def test_surrogate_pair_escapes_are_one_character_not_an_error(fmt: str) -> None:
    """Negative control: a PAIR of escapes is a valid character (Java and JSON read it so)."""
    name, text = _config_file(fmt, [*BASE, ("client.id", "svc-\\uD83D\\uDE00")])
    _no_parse_error(_lint_file(name, text))


def _nested(fmt: str, depth: int) -> tuple[str, str]:
    if fmt == "json":
        return "c.json", '{"bootstrap.servers": "a:1,b:1", "x": ' + "[" * depth + "]" * depth + "}"
    if fmt == "yaml-flow":
        return "c.yaml", "bootstrap.servers: a:1,b:1\nx: " + "[" * depth + "]" * depth + "\n"
    if fmt == "yaml-block":
        body = "".join(" " * i + f"k{i}:\n" for i in range(depth))
        return "c.yaml", "bootstrap.servers: a:1,b:1\nx:\n" + " ".join(["", body])
    if fmt == "toml":
        return "c.toml", "x = " + "[" * depth + "]" * depth + "\n"
    depth = max(depth, 201)  # CPython's own parser refuses more than 200 nested brackets
    return "app.py", "import confluent_kafka\nx = " + "[" * depth + "]" * depth + "\n"


@HOSTILE
@given(
    fmt=st.sampled_from(["json", "yaml-flow", "yaml-block", "toml", "python"]),
    depth=st.integers(min_value=MAX_DEPTH + 2, max_value=20_000),
)
def test_deep_nesting_is_a_located_parse_error(fmt: str, depth: int) -> None:
    name, text = _nested(fmt, depth)
    _assert_parse_error_located(_lint_file(name, text), text)


@pytest.mark.parametrize("fmt", ["json", "yaml-flow", "yaml-block", "toml"])
def test_nesting_within_the_limit_is_read(fmt: str) -> None:
    """Negative control: the depth limit, not the format, makes the KR000 above."""
    name, text = _nested(fmt, MAX_DEPTH - 5)
    _no_parse_error(_lint_file(name, text))


def _alias_bomb(width: int, levels: int) -> str:
    lines = ["bootstrap.servers: a:1,b:1", "l0: &l0 [" + ", ".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


@HOSTILE
@given(width=st.integers(min_value=2, max_value=12), levels=st.integers(min_value=3, max_value=40))
def test_yaml_alias_bomb_is_a_located_parse_error(width: int, levels: int) -> None:
    """A "billion laughs" file: aliases of aliases expand to width**levels nodes."""
    text = _alias_bomb(width, levels)
    # Nodes once every alias is expanded: the root, each key, each list with its items
    # (counting only the deepest level, as before, undercounted: width=4, levels=8 is 87,380
    # by that count but 116,515 nodes, over the limit, and the negative control failed).
    size = 1 + width
    expanded = 1 + 2 + 1 + size
    for _ in range(1, levels):
        size = 1 + width * size
        expanded += 1 + size
    findings = _lint_file("c.yaml", text)
    if expanded <= YAML_NODE_BUDGET:
        _no_parse_error(findings)  # negative control: modest reuse of anchors is fine
        return
    if expanded <= YAML_NODE_BUDGET + len(text):
        return  # the limit grows with the file's own length: either answer is right here
    (error,) = _assert_parse_error_located(findings, text)
    assert "alias" in error.message


def test_yaml_merge_keys_reusing_a_block_are_read() -> None:
    text = (
        "base: &base\n  bootstrap.servers: a:1,b:1\n  acks: all\n"
        "producer:\n  <<: *base\n  acks: 0\n"
        "other:\n  producer:\n    <<: *base\n"
    )
    findings = _lint_file("c.yaml", text)
    _no_parse_error(findings)
    assert any(f.rule == "KR006" and f.line == 6 for f in findings)  # acks: 0 after the merge


@HOSTILE
@given(
    name=st.sampled_from(EXTENSIONS),
    limit=st.integers(min_value=64, max_value=4096),
    extra=st.integers(min_value=1, max_value=5000),
)
def test_file_over_the_size_limit_is_a_located_parse_error(
    name: str, limit: int, extra: int
) -> None:
    text = ("bootstrap.servers=a:1,b:1\n" * (1 + (limit + extra) // 26))[: limit + extra]
    findings = _lint_file(name, text, Settings(max_file_size=limit))
    (error,) = _assert_parse_error_located(findings, text)
    assert f"larger than {limit} bytes" in error.message
    at_limit = _lint_file(name, text[:limit], Settings(max_file_size=limit))
    assert not [f for f in at_limit if "larger than" in f.message]  # negative control


def test_file_over_the_default_size_limit_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.properties"
    with path.open("w") as fh:
        fh.write("acks=0\n")
        fh.write("x" * MAX_FILE_SIZE + "\n")
    findings = lint_paths([str(path)])
    check_reports(findings)
    assert [(f.rule, f.line) for f in findings] == [("KR000", 1)]


def test_a_device_or_fifo_named_on_the_command_line_is_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.properties"
    os.mkfifo(fifo)  # opening it for reading would block forever
    findings = lint_paths([str(fifo), "/dev/zero"])
    check_reports(findings)
    assert [(f.rule, f.message) for f in findings] == [("KR000", "not a regular file")] * 2


SPECIAL = " \t\\#!:=[]{}\"'$&*-,.%"


@pytest.mark.parametrize("fmt", ["properties", "json", "yaml", "toml", "env", "python"])
@pytest.mark.parametrize("char", list(SPECIAL), ids=[f"{ord(c):02x}" for c in SPECIAL])
def test_long_runs_of_one_character_are_read_in_linear_time(fmt: str, char: str) -> None:
    """300,000 of one character inside a value: a regular expression that backtracks
    (``\\s+#.*$`` in the .env reader did) turns this into hours; the suite's timeout fails it."""
    run = char * 300_000
    name, text = {
        "properties": ("p.properties", f"bootstrap.servers=a:1,b:1\nacks=a{run}b\n"),
        "json": ("c.json", '{"bootstrap.servers": "a:1,b:1", "acks": "a' + run + 'b"}\n'),
        "yaml": ("c.yaml", f"bootstrap.servers: a:1,b:1\nacks: a{run}b\n"),
        "toml": ("c.toml", f'x = """\n[a{run}b\n"""\nacks = "a{run}b"\n'),
        "env": (".env", f"KAFKA_BOOTSTRAP_SERVERS=a:1,b:1\nKAFKA_ACKS=a{run}b\n"),
        "python": (
            "app.py",
            "from confluent_kafka import Producer\n"
            f"Producer({{'bootstrap.servers': 'a:1,b:1', 'acks': {('a' + run + 'b')!r}}})\n",
        ),
    }[fmt]
    _lint_file(name, text)


def test_control_characters_in_values_cannot_forge_report_lines() -> None:
    text = (
        "bootstrap.servers=a:1,b:1\nacks=x\\nfake.properties:1:1: KR000 [error] forged\\u001b[2J\n"
    )
    findings = _lint_file("p.properties", text)
    (bad,) = [f for f in findings if f.rule == "KR037"]
    assert "\n" not in bad.message and "\x1b" not in bad.message
    assert "\\x0afake.properties" in bad.message


# ----------------------------------------------------------------------------- the real CLI


def _hostile_corpus(root: Path) -> list[Path]:
    files = {
        "surrogate.properties": "bootstrap.servers=a:1,b:1\nacks=\\uD800\n",
        "surrogate.json": '{"bootstrap.servers": "a:1,b:1", "acks": "\\ud800"}\n',
        "surrogate.py": (
            "from confluent_kafka import Producer\n"
            "Producer({'bootstrap.servers': 'a:1,b:1', 'acks': '\\ud800'})\n"
        ),
        "bomb.yaml": _alias_bomb(9, 9),
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep.yaml": "x: " + "[" * 5_000 + "]" * 5_000 + "\n",
        "deep.toml": "x = " + "[" * 5_000 + "]" * 5_000 + "\n",
        "deep.py": "import confluent_kafka\nx = " + "-" * 1_000_000 + "1\n",
    }
    paths = []
    for name, text in files.items():
        (root / name).write_text(text)
        paths.append(root / name)
    (root / "latin1.properties").write_bytes(b"bootstrap.servers=a:1\nsasl.password=caf\xe9\n")
    (root / "huge.json").write_bytes(b'{"acks": "' + b"x" * MAX_FILE_SIZE + b'"}')
    return [*paths, root / "latin1.properties", root / "huge.json"]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cli_reports_every_hostile_file_in_every_format(tmp_path: Path, fmt: str) -> None:
    """End to end, in a subprocess writing to a real UTF-8 pipe (capsys keeps str and would
    not see an encoding error): each hostile file is one located KR000, exit code 2."""
    files = _hostile_corpus(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "kresilient.lint", "lint", "--format", fmt, *map(str, files)],
        capture_output=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr.decode(errors="replace")
    assert proc.stderr == b""
    out = proc.stdout.decode("utf-8")  # strict
    if fmt == "json":
        located = {(d["path"], d["rule"]) for d in json.loads(out) if d["line"] >= 1}
    elif fmt == "sarif":
        log = json.loads(out)
        SARIF_VALIDATOR.validate(log)
        located = {
            (
                r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
                r["ruleId"],
            )
            for r in log["runs"][0]["results"]
            if r["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
        }
    elif fmt == "github":
        located = {
            (line.split("file=")[1].split(",")[0], line.split("title=")[1][:5])
            for line in out.splitlines()
            if "line=" in line
        }
    else:
        located = {
            (line.split(":")[0], line.split(": ")[1][:5])
            for line in out.splitlines()
            if line.count(":") >= 3
        }
    assert {(f.name, "KR000") for f in files} <= {(os.path.basename(p), r) for p, r in located}, out
