"""Kafka configuration lint and live cluster audit (``kresilient lint`` / ``kresilient audit``).

Example::

    >>> from kresilient.lint import lint_text
    >>> [f.rule for f in lint_text("acks=0\\nbootstrap.servers=a:9092,b:9092\\n", "p.properties")]
    ['KR006', ...]

Rules live in :data:`RULES` (stable ids ``KR000``...); every rule is documented in
``docs/lint-rules.md`` and by ``kresilient lint --explain ID``.
"""

from __future__ import annotations

from kresilient.lint.engine import detect_kind, exit_code, lint_paths, lint_text
from kresilient.lint.model import ConfigUnit, Entry, Finding, LintStats, Severity
from kresilient.lint.output import FORMATS, render
from kresilient.lint.registry import RULES, Rule
from kresilient.lint.settings import Settings, load_settings

__all__ = [
    "FORMATS",
    "RULES",
    "ConfigUnit",
    "Entry",
    "Finding",
    "LintStats",
    "Rule",
    "Settings",
    "Severity",
    "detect_kind",
    "exit_code",
    "lint_paths",
    "lint_text",
    "load_settings",
    "render",
]
