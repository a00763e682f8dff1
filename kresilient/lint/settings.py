"""Lint settings (``[tool.kresilient.lint]`` in pyproject.toml) and inline suppressions.

Example ``pyproject.toml``::

    [tool.kresilient.lint]
    select = ["KR0"]              # id prefixes to run (default: all)
    ignore = ["KR026", "KR030"]   # id prefixes to skip
    fail-on = "warning"           # error (default), warning or info
    exclude = ["tests/fixtures/*"]
    max-file-size = 1048576       # bytes; a larger file is a KR000 finding, not read
    client = "java"               # judge client configs by Java defaults (default: detect)
    [tool.kresilient.lint.severity]
    KR021 = "error"

Inline, on the line of the finding or alone on the line above it (``.properties`` files have
no end-of-line comments, so use the line above there)::

    acks: 1  # kresilient: ignore[KR007] reason: metrics topic, loss is acceptable
    # kresilient: ignore-file[KR030] reason: single-zone test cluster
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import tokenize
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kresilient import _catalog as catalog
from kresilient.errors import ConfigError
from kresilient.lint.model import KINDS, Finding, Kind, Severity
from kresilient.lint.registry import RULES

__all__ = [
    "MAX_FILE_SIZE",
    "Settings",
    "Suppressions",
    "find_pyproject",
    "load_settings",
    "parse_suppressions",
]

#: Default largest file read (bytes). Kafka configs are a few KB; a bigger file would take
#: seconds to parse, so it is reported (KR000) instead of read.
MAX_FILE_SIZE = 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """Which rules run, at which severity, and what fails the run."""

    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    severity: Mapping[str, Severity] = field(default_factory=dict)
    fail_on: Severity = Severity.ERROR
    kind: Kind | None = None
    exclude: tuple[str, ...] = ()
    lag_threshold: int = 1000
    max_file_size: int = MAX_FILE_SIZE
    source: str | None = None
    #: ``java`` or ``librdkafka``: whose defaults judge every client config (None: tell
    #: from the file, e.g. Java serializer class names or Spring Boot keys mean ``java``).
    client: str | None = None

    def enabled(self, rule_id: str) -> bool:
        """Meta rules (parse errors) always run; others obey select/ignore prefixes."""
        if RULES[rule_id].input_error:
            return True
        if self.select and not any(rule_id.startswith(p) for p in self.select):
            return False
        return not any(rule_id.startswith(p) for p in self.ignore)

    def severity_of(self, rule_id: str) -> Severity:
        """The configured severity of a rule (its default unless overridden)."""
        return self.severity.get(rule_id, RULES[rule_id].severity)

    def replace(
        self,
        *,
        select: tuple[str, ...] | None = None,
        ignore: tuple[str, ...] | None = None,
        fail_on: Severity | None = None,
        kind: Kind | None = None,
        client: str | None = None,
    ) -> Settings:
        """A copy with the given (non-None) fields replaced."""
        return dataclasses.replace(
            self,
            client=self.client if client is None else client,
            select=self.select if select is None else select,
            ignore=self.ignore if ignore is None else ignore,
            fail_on=self.fail_on if fail_on is None else fail_on,
            kind=self.kind if kind is None else kind,
        )


def _ids(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in re.split(r"[,\s]+", value) if v]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: expected a list of rule ids", key=where)
    for prefix in value:
        if not re.fullmatch(r"KR\d{0,3}", prefix) or not any(r.startswith(prefix) for r in RULES):
            raise ConfigError(
                f"{where}: unknown rule id or prefix {prefix!r} (no rule id starts with it)",
                key=where,
            )
    return tuple(value)


def settings_from_mapping(data: Mapping[str, object], source: str) -> Settings:
    """Validate a ``[tool.kresilient.lint]`` table; raises ConfigError naming the bad key."""
    allowed = {
        "select",
        "ignore",
        "severity",
        "fail-on",
        "fail_on",
        "kind",
        "exclude",
        "lag-threshold",
        "lag_threshold",
        "max-file-size",
        "max_file_size",
        "client",
    }
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{source}: unknown [tool.kresilient.lint] key {key!r}", key=key)
    settings = Settings(source=source)
    severity: dict[str, Severity] = {}
    raw_sev = data.get("severity", {})
    if not isinstance(raw_sev, Mapping):
        raise ConfigError(f"{source}: severity must be a table", key="severity")
    for rule_id, level in raw_sev.items():
        if rule_id not in RULES or not isinstance(level, str):
            raise ConfigError(f"{source}: bad severity override {rule_id!r}", key="severity")
        try:
            severity[rule_id] = Severity.parse(level)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}", key="severity") from None
    fail_on = data.get("fail-on", data.get("fail_on"))
    kind = data.get("kind")
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"{source}: kind must be one of {', '.join(KINDS)}", key="kind")
    exclude = data.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ConfigError(f"{source}: exclude must be a list of globs", key="exclude")
    lag = data.get("lag-threshold", data.get("lag_threshold", settings.lag_threshold))
    if not isinstance(lag, int) or lag < 0:
        raise ConfigError(f"{source}: lag-threshold must be a non-negative int", key="lag")
    max_size = data.get("max-file-size", data.get("max_file_size", settings.max_file_size))
    if not isinstance(max_size, int) or isinstance(max_size, bool) or max_size <= 0:
        raise ConfigError(
            f"{source}: max-file-size must be a positive int (bytes)", key="max-file-size"
        )
    client = data.get("client")
    if client is not None and client not in ("java", "librdkafka"):
        raise ConfigError(f"{source}: client must be java or librdkafka", key="client")
    try:
        fail = Severity.parse(fail_on) if isinstance(fail_on, str) else settings.fail_on
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}", key="fail-on") from None
    return dataclasses.replace(
        settings,
        select=_ids(data.get("select", []), "select"),
        ignore=_ids(data.get("ignore", []), "ignore"),
        severity=severity,
        fail_on=fail,
        kind=kind,
        exclude=tuple(exclude),
        lag_threshold=lag,
        max_file_size=max_size,
        client=client if isinstance(client, str) else None,
    )


def find_pyproject(starts: Iterable[str]) -> str | None:
    """The nearest pyproject.toml with a ``[tool.kresilient.lint]`` table above ``starts``."""
    for start in starts:
        here = os.path.abspath(start)
        if not os.path.isdir(here):
            here = os.path.dirname(here)
        while True:
            candidate = os.path.join(here, "pyproject.toml")
            if os.path.isfile(candidate):
                try:
                    with open(candidate, "rb") as fh:
                        data = tomllib.load(fh)
                except (OSError, tomllib.TOMLDecodeError):
                    data = {}
                if "lint" in data.get("tool", {}).get("kresilient", {}):
                    return candidate
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    return None


def load_settings(path: str | None = None, *, starts: Iterable[str] = (".",)) -> Settings:
    """Settings from ``path`` or the nearest pyproject.toml (defaults when there is none)."""
    path = path or find_pyproject(starts)
    if path is None:
        return Settings()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", key=None) from None
    table = data.get("tool", {}).get("kresilient", {}).get("lint", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.kresilient.lint] must be a table", key=None)
    return settings_from_mapping(table, path)


# ----------------------------------------------------------------------------- suppressions

_SUPPRESS = re.compile(
    r"(?:#|!|//)\s*kresilient:\s*(?P<what>ignore(?:-file)?)\s*\[(?P<ids>[^\]]*)\](?P<rest>.*)$"
)
_REASON = re.compile(r"^\s*reason\s*:\s*\S")
# ``# kresilient: allow acks, retries`` (optionally ``reason: ...``): the file's spelling of
# ``allow_unsafe=("acks", "retries")``, the runtime's opt-out (see kresilient.lint.parity).
_ALLOW = re.compile(
    r"(?:#|!|//)\s*kresilient:\s*allow(?:\s*\[(?P<bracket>[^\]]*)\]|\s+(?P<plain>[^#]*?))"
    r"\s*(?:reason\s*:.*)?$"
)


@dataclass(kw_only=True, slots=True)
class Suppressions:
    """Inline suppressions of one file: per line, file-wide, and the malformed ones."""

    lines: dict[int, set[str]] = field(default_factory=dict)
    file: set[str] = field(default_factory=set)
    problems: list[tuple[int, int, str]] = field(default_factory=list)
    #: Per line, the keys ``# kresilient: allow KEY`` accepts as unsafe there.
    allows: dict[int, set[str]] = field(default_factory=dict)

    def allowed_at(self, line: int) -> set[str]:
        """The keys allowed as unsafe on ``line`` (a comment on it or alone above it)."""
        return self.allows.get(line, set())

    def covers(self, finding: Finding) -> bool:
        """True when the finding is suppressed (parse errors never are)."""
        if RULES[finding.rule].input_error:
            return False
        return finding.rule in self.file or finding.rule in self.lines.get(finding.line, ())


def _python_comment_lines(text: str) -> set[int] | None:
    """Lines holding a real ``#`` comment in Python source (None if it does not tokenize)."""
    try:
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        return {t.start[0] for t in tokens if t.type == tokenize.COMMENT}
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None


def parse_suppressions(text: str, *, python: bool = False) -> Suppressions:
    """Collect ``kresilient: ignore[...] reason: ...`` comments from a file's text.

    In Python source only real comments count (not strings that look like one).
    """
    out = Suppressions()
    if "kresilient:" not in text:
        return out
    lines = text.splitlines()
    comment_lines = _python_comment_lines(text) if python else None
    for number, line in enumerate(lines, start=1):
        if comment_lines is not None and number not in comment_lines:
            continue
        allow = _ALLOW.search(line)
        if allow:
            _add_allow(out, lines, number, allow)
            continue
        match = _SUPPRESS.search(line)
        if not match:
            continue
        col = match.start() + 1
        ids = {i.strip() for i in match.group("ids").split(",") if i.strip()}
        unknown = sorted(i for i in ids if i not in RULES)
        if unknown or not ids:
            out.problems.append(
                (
                    number,
                    col,
                    f"suppression names unknown rule id(s) {', '.join(unknown) or '(none)'}",
                )
            )
            continue
        if not _REASON.match(match.group("rest")):
            out.problems.append(
                (
                    number,
                    col,
                    f"suppression of {', '.join(sorted(ids))} has no "
                    "reason (add 'reason: ...'); not applied",
                )
            )
            continue
        if match.group("what") == "ignore-file":
            out.file.update(ids)
            continue
        target = number
        if line[: match.start()].strip() == "":
            # A comment alone on its line applies to the next line with content.
            for nxt in range(number, len(lines)):
                stripped = lines[nxt].strip()
                if stripped and not stripped.startswith(("#", "!", "//")):
                    target = nxt + 1
                    break
            out.lines.setdefault(number, set()).update(ids)
        out.lines.setdefault(target, set()).update(ids)
    return out


def _next_content_line(lines: list[str], number: int) -> int:
    """The 1-based number of the first line after ``number`` that is not a comment."""
    for nxt in range(number, len(lines)):
        stripped = lines[nxt].strip()
        if stripped and not stripped.startswith(("#", "!", "//")):
            return nxt + 1
    return number


def _add_allow(out: Suppressions, lines: list[str], number: int, match: re.Match[str]) -> None:
    names = match.group("bracket") if match.group("bracket") is not None else match.group("plain")
    keys = {k.strip() for k in (names or "").replace(" ", ",").split(",") if k.strip()}
    unknown = sorted(k for k in keys if catalog.lookup(k) is None)
    if unknown or not keys:
        out.problems.append(
            (
                number,
                match.start() + 1,
                "'kresilient: allow' names no librdkafka property "
                f"{', '.join(repr(k) for k in unknown) or '(none)'}; not applied",
            )
        )
        return
    target = number
    if lines[number - 1][: match.start()].strip() == "":
        target = _next_content_line(lines, number)  # alone on its line: the next setting
    out.allows.setdefault(target, set()).update(keys)
    out.allows.setdefault(number, set()).update(keys)
