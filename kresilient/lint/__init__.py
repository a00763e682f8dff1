"""Kafka configuration lint and live cluster audit (``kresilient lint`` / ``kresilient audit``).

Example::

    >>> from kresilient.lint import lint_text
    >>> [f.rule for f in lint_text("acks=0\\nbootstrap.servers=a:9092,b:9092\\n", "p.properties")]
    ['KR006', ...]

Rules live in :data:`RULES` (stable ids ``KR000``...); every rule is documented in
``docs/lint-rules.md`` and by ``kresilient lint --explain ID``.
"""

from __future__ import annotations

import importlib
import typing

if typing.TYPE_CHECKING:  # for type checkers; at run time each name is loaded on first use
    from kresilient.lint.engine import detect_kind, exit_code, lint_paths, lint_text
    from kresilient.lint.model import ConfigUnit, Entry, Finding, LintStats, Severity
    from kresilient.lint.output import FORMATS, render
    from kresilient.lint.registry import RULES, Rule
    from kresilient.lint.settings import Settings, load_settings

# Each public name and its module, imported on first access (PEP 562): `kresilient lint --help`
# imports kresilient.lint.cli, which must not load the engine, the catalogs and the readers.
_EXPORTS: dict[str, str] = {
    "detect_kind": "kresilient.lint.engine",
    "exit_code": "kresilient.lint.engine",
    "lint_paths": "kresilient.lint.engine",
    "lint_text": "kresilient.lint.engine",
    "ConfigUnit": "kresilient.lint.model",
    "Entry": "kresilient.lint.model",
    "Finding": "kresilient.lint.model",
    "LintStats": "kresilient.lint.model",
    "Severity": "kresilient.lint.model",
    "FORMATS": "kresilient.lint.output",
    "render": "kresilient.lint.output",
    "RULES": "kresilient.lint.registry",
    "Rule": "kresilient.lint.registry",
    "Settings": "kresilient.lint.settings",
    "load_settings": "kresilient.lint.settings",
}


def __getattr__(name: str) -> typing.Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
