"""The docs that promise a test for every row name tests that exist.

docs/symptoms.md maps every symptom of the seed documents to a check and its test;
docs/failure-modes.md lists, per component and step, what happens to the data on each fault
and the test that proves it. A renamed or deleted test must not leave a row pointing nowhere.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_QUALIFIED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)")
_BARE = re.compile(r"`(test_\w+)")


@functools.cache  # a file is cited by many rows: parse it once (uncached: 37 s in CI)
def _tests_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    )


@functools.cache
def _all_tests() -> frozenset[str]:
    return frozenset(
        name for path in (ROOT / "tests").glob("test_*.py") for name in _tests_in(path)
    )


def _missing(doc: str) -> list[str]:
    text = (ROOT / "docs" / doc).read_text("utf-8")
    missing = [f"{f}::{t}" for f, t in _QUALIFIED.findall(text) if t not in _tests_in(ROOT / f)]
    # `::name` after a qualified one, and bare names, may live in any test file
    for name in set(_BARE.findall(text)) | set(re.findall(r"`::(test_\w+)", text)):
        if name not in _all_tests():
            missing.append(name)
    return sorted(set(missing))


def test_every_test_named_in_the_symptom_map_exists() -> None:
    text = (ROOT / "docs" / "symptoms.md").read_text("utf-8")
    assert len(_QUALIFIED.findall(text)) >= 25, "the map lost its rows"
    assert not _missing("symptoms.md")


def test_every_covered_symptom_names_a_test() -> None:
    text = (ROOT / "docs" / "symptoms.md").read_text("utf-8")
    covered = text.split("## Symptoms with no automated check")[0]
    rows = [line for line in covered.splitlines() if line.startswith("| 00")]
    assert rows
    assert all(_QUALIFIED.search(row) for row in rows), [
        r for r in rows if not _QUALIFIED.search(r)
    ]


def test_every_failure_mode_row_names_an_existing_test() -> None:
    text = (ROOT / "docs" / "failure-modes.md").read_text("utf-8")
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| step") and "---" not in line
    ]
    assert len(rows) >= 80, "the audit lost its rows"
    unnamed = [r for r in rows if not ("`test_" in r or "`tests/" in r or "`::test_" in r)]
    assert not unnamed, unnamed
    assert not _missing("failure-modes.md")
