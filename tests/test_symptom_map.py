"""docs/symptoms.md names a test for every symptom of the seed documents: each must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def test_every_test_named_in_the_symptom_map_exists() -> None:
    text = (ROOT / "docs" / "symptoms.md").read_text("utf-8")
    named = _NAMED.findall(text)
    assert len(named) >= 25, "the map lost its rows"
    missing = [f"{f}::{t}" for f, t in named if t not in _tests_in(ROOT / f)]
    assert not missing, missing


def test_every_covered_row_names_a_test() -> None:
    text = (ROOT / "docs" / "symptoms.md").read_text("utf-8")
    covered = text.split("## Symptoms with no automated check")[0]
    rows = [line for line in covered.splitlines() if line.startswith("| 00")]
    assert rows
    assert all(_NAMED.search(row) for row in rows), [r for r in rows if not _NAMED.search(r)]
