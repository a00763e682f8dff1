"""docs/lint-rules.md documents every rule and matches the registry."""

from __future__ import annotations

from pathlib import Path

from kresilient.lint import RULES
from kresilient.lint.output import rules_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "lint-rules.md"


def test_docs_page_lists_every_rule_and_is_current() -> None:
    text = DOC.read_text()
    for rule_id, rule in RULES.items():
        assert f"## {rule_id}" in text and rule.why in text
    assert text == rules_markdown(), "regenerate docs/lint-rules.md (see its header)"
