"""Hypothesis: random and malformed files never crash the linter; parse errors are located
findings with exit code 2."""

from __future__ import annotations

import ast
import json
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kresilient import _catalog as catalog
from kresilient.lint import RULES, Finding, Settings, exit_code, lint_paths

EXTENSIONS = ["p.properties", "c.yaml", "c.json", "c.toml", ".env", "app.py"]
KEYS = sorted(
    {p.name for p in catalog.all_properties()}
    | {"replication.factor", "min.insync.replicas", "node.id", "broker.rack", "name"}
)
FUZZ = settings(
    max_examples=int(__import__("os").environ.get("KR_FUZZ", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _lint_file(name: str, content: str | bytes) -> list[Finding]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", errors="surrogatepass")
        findings = lint_paths([str(path)])
    for f in findings:
        assert f.rule in RULES
        assert f.line >= 0 and f.col >= 0
        assert f.message
    return findings


def _parser_rejects(name: str, text: str) -> bool:
    parsers: dict[str, Any] = {
        ".json": json.loads,
        ".yaml": lambda t: list(yaml.safe_load_all(t)),
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


def _assert_parse_error_located(findings: list[Finding], text: str) -> None:
    errors = [f for f in findings if f.rule == "KR000"]
    assert errors, "malformed file without a KR000 finding"
    assert all(1 <= f.line <= text.count("\n") + 2 and f.col >= 1 for f in errors)
    assert exit_code(findings, Settings()) == 2


@FUZZ
@given(name=st.sampled_from(EXTENSIONS), text=st.text(max_size=400))
def test_random_text_never_crashes(name: str, text: str) -> None:
    if "\x00" in text and name.endswith(".py"):
        text = "import confluent_kafka\n" + text
    findings = _lint_file(name, text)
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


@FUZZ
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
