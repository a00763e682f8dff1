"""``kresilient lint --fix`` / ``--diff``: safe, mechanical fixes in ``.properties`` (and
``.conf``/``.cfg``/``.ini``), YAML, ``.env`` and Python files, keeping every other byte
(comments, layout, quoting, line endings).

What is fixed (only where the rule fired, so suppressions, ``--select``/``--ignore`` and the
client the file is judged by all apply):

===========  ==========================================  ===============================
rule         finding                                     fix
===========  ==========================================  ===============================
KR006/KR007  ``acks`` 0, 1 or above 1                    ``acks`` = ``all``
KR008        ``enable.idempotence`` false or unset       ``enable.idempotence`` = ``true``
             (librdkafka client)                         unless another explicit setting
                                                         conflicts (then left, with a note)
KR012        a partitioner that is not murmur2           ``murmur2_random``
KR018        Spring ``enable-auto-commit: true``         ``false`` (the listener container
                                                         commits after processing)
KR021        ``auto.offset.reset`` latest or unset       ``earliest``
===========  ==========================================  ===============================

A value is replaced in place (its quotes kept); an unset key is added only to a plain
``.properties`` file, after the config's last line. Values on continuation lines, YAML block
scalars, anchors and tags are left alone (a note says so). In Python only a literal written
at the key itself is replaced (``'acks': 1`` -> ``'acks': 'all'``, ``False`` -> ``True``),
located with :mod:`ast`; a value that is a name, an expression, or read from another file
is left, with a note. Every fixed file is linted again:
if the fix would add any finding (or a parse error), the file is left unchanged and a note
names what it would have added. A file with nothing to fix is never written.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kresilient.lint.engine import discover, lint_text
from kresilient.lint.model import REDACTED, ConfigUnit, Entry, Finding, Severity, value_redactor
from kresilient.lint.readers import detect_format
from kresilient.lint.registry import explicit, number
from kresilient.lint.settings import Settings

__all__ = ["FIXABLE", "FileFix", "fix_text", "plan_paths", "write_fixes"]

#: Rule ids ``--fix`` acts on.
FIXABLE = frozenset({"KR006", "KR007", "KR008", "KR012", "KR018", "KR021"})
#: Formats whose values are edited line by line.
_LINE_FORMATS = frozenset({"properties", "yaml", "env"})
_FORMATS = _LINE_FORMATS | {"python"}
_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class _Change:
    setting: str  # the Kafka key (acks)
    value: str  # the new value (all)
    entry: Entry | None  # None: add the key (plain .properties only)
    unit: ConfigUnit
    rule: str


@dataclass(slots=True)
class FileFix:
    """What ``--fix`` would do to one file."""

    path: str
    before: str
    after: str
    fixed: list[Finding] = field(default_factory=list)  #: findings the edit removes
    notes: list[str] = field(default_factory=list)  #: findings left, and why
    #: the file's lines that hold a secret value, each with that value masked (a fix never
    #: edits them, so the same text stands in ``before`` and ``after``)
    masked: dict[str, str] = field(default_factory=dict, repr=False)
    #: removes the file's secret values from any other text printed about it
    redact: Callable[[str], str] = field(default=lambda text: text, repr=False)

    @property
    def changed(self) -> bool:
        return self.after != self.before

    def diff(self) -> str:
        """A unified diff of the change (empty when nothing changes).

        Its context lines are the file's own, so a secret's line is shown with its value
        masked, and any other line without the file's secret values: ``--diff`` prints no
        more of a secret than the findings do (its key).
        """
        if not self.changed:
            return ""
        relative = not os.path.isabs(self.path)
        return "".join(
            difflib.unified_diff(
                self._shown(self.before),
                self._shown(self.after),
                fromfile=f"a/{self.path}" if relative else self.path,
                tofile=f"b/{self.path}" if relative else self.path,
            )
        )

    def _shown(self, text: str) -> list[str]:
        return [self.masked.get(line) or self.redact(line) for line in text.splitlines(True)]


# ----------------------------------------------------------------------------- planning


def _unit_of(finding: Finding, units: list[ConfigUnit]) -> tuple[ConfigUnit, Entry | None] | None:
    for unit in units:
        if unit.path != finding.path:
            continue
        if finding.key is not None:
            for entry in unit.entries.values():
                if entry.key == finding.key and entry.line == finding.line:
                    return unit, entry
        elif (unit.line, unit.col) == (finding.line, finding.col):
            return unit, None
    return None


def _setting(entry: Entry | None, default: str) -> str:
    return (entry.setting or entry.key) if entry is not None else default


def _idempotence_conflict(unit: ConfigUnit, acks_fixed: bool) -> str | None:
    """The explicit setting librdkafka refuses beside enable.idempotence=true (KR001's
    checks, read with the rules' own helpers)."""
    acks = explicit(unit, "acks", "request.required.acks")
    if acks and number(unit, "acks") != -1 and not acks_fixed:
        return f"{acks.key}={acks.shown}"
    inflight = explicit(unit, "max.in.flight", "max.in.flight.requests.per.connection")
    if inflight and (number(unit, "max.in.flight") or 0) > 5:
        return f"{inflight.key}={inflight.shown}"
    retries = explicit(unit, "retries", "message.send.max.retries")
    tries = number(unit, "retries")
    if retries and tries is not None and tries < 1:
        return f"{retries.key}={retries.shown}"
    strategy = explicit(unit, "queuing.strategy")
    if strategy and strategy.text.lower() != "fifo":
        return f"queuing.strategy={strategy.shown}"
    return None


_Planner = Callable[[Finding, ConfigUnit, Entry | None], "tuple[str, str] | str | None"]


def _acks(_f: Finding, _u: ConfigUnit, entry: Entry | None) -> tuple[str, str]:
    return _setting(entry, "acks"), "all"


def _idempotence(f: Finding, unit: ConfigUnit, entry: Entry | None) -> tuple[str, str] | str:
    if entry is not None and (entry.setting or entry.key) != "enable.idempotence":
        return f"{f.rule} at line {f.line} is about {entry.key}, not a value to set"
    if unit.context.get("client") == "java":
        return f"{f.rule} at line {f.line}: a Java client's idempotence is not set mechanically"
    return _setting(entry, "enable.idempotence"), "true"


def _partitioner(_f: Finding, _u: ConfigUnit, entry: Entry | None) -> tuple[str, str]:
    return _setting(entry, "partitioner"), "murmur2_random"


def _auto_commit(f: Finding, unit: ConfigUnit, entry: Entry | None) -> tuple[str, str] | str:
    if unit.context.get("framework") != "Spring Kafka" or entry is None:
        return (
            f"{f.rule} at line {f.line}: not fixed (turning auto-commit off needs code that "
            "commits after processing, such as ResilientConsumer)"
        )
    return _setting(entry, "enable.auto.commit"), "false"


def _offset_reset(_f: Finding, _u: ConfigUnit, entry: Entry | None) -> tuple[str, str]:
    return _setting(entry, "auto.offset.reset"), "earliest"


_PLANNERS: dict[str, _Planner] = {
    "KR006": _acks,
    "KR007": _acks,
    "KR008": _idempotence,
    "KR012": _partitioner,
    "KR018": _auto_commit,
    "KR021": _offset_reset,
}


def _plan(findings: list[Finding], units: list[ConfigUnit], notes: list[str]) -> list[_Change]:
    changes: dict[tuple[int, str], _Change] = {}
    for f in findings:
        planner = _PLANNERS.get(f.rule)
        if planner is None:
            continue
        found = _unit_of(f, units)
        if found is None:
            notes.append(f"{f.rule} at line {f.line}: not fixed (its config was not located)")
            continue
        unit, entry = found
        planned = planner(f, unit, entry)
        if planned is None:
            continue
        if isinstance(planned, str):
            notes.append(planned)
            continue
        setting, value = planned
        if entry is None and unit.source != "properties":
            notes.append(
                f"{f.rule} at line {f.line}: not fixed (adding {setting}={value} is done only "
                f"in .properties files; add it by hand)"
            )
            continue
        if entry is None and unit.get(setting) is not None:
            continue  # set by an alias: another finding covers that entry
        changes[(id(unit), setting)] = _Change(setting, value, entry, unit, f.rule)
    # enable.idempotence=true beside a setting librdkafka refuses with it is not a fix.
    for key, change in list(changes.items()):
        if change.rule != "KR008":
            continue
        acks_fixed = any(
            c.unit is change.unit and c.rule in ("KR006", "KR007") for c in changes.values()
        )
        conflict = _idempotence_conflict(change.unit, acks_fixed)
        if conflict is not None:
            del changes[key]
            line = change.entry.line if change.entry else change.unit.line
            notes.append(
                f"KR008 at line {line}: not fixed ({conflict} conflicts with "
                "enable.idempotence=true; fix that first)"
            )
    return list(changes.values())


# ----------------------------------------------------------------------------- editing


def _value_span_properties(line: str, col: int) -> tuple[int, int] | None:
    i = col - 1
    n = len(line)
    while i < n:  # the key: up to an unescaped separator
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in " \t\f=:":
            break
        i += 1
    while i < n and line[i] in " \t\f":
        i += 1
    if i < n and line[i] in "=:":
        i += 1
    while i < n and line[i] in " \t\f":
        i += 1
    end = n
    while end > i and line[end - 1] in " \t\f":
        end -= 1
    value = line[i:end]
    trailing = len(value) - len(value.rstrip("\\"))
    if trailing % 2:  # a continuation line: the value goes on below
        return None
    return i, end


def _value_span_yaml(line: str, col: int) -> tuple[int, int, str] | None:
    i = col - 1
    n = len(line)
    if i < n and line[i] in "'\"":  # a quoted key
        quote = line[i]
        i += 1
        while i < n and line[i] != quote:
            i += 2 if line[i] == "\\" and quote == '"' else 1
        i += 1
    while i < n and not (line[i] == ":" and (i + 1 == n or line[i + 1] in " \t")):
        i += 1
    if i >= n:
        return None
    i += 1
    while i < n and line[i] in " \t":
        i += 1
    if i >= n or line[i] in "|>&*!{[#":
        return None
    if line[i] in "'\"":
        quote = line[i]
        j = i + 1
        while j < n:
            if line[j] == "\\" and quote == '"':
                j += 2
                continue
            if line[j] == quote:
                if quote == "'" and j + 1 < n and line[j + 1] == "'":
                    j += 2
                    continue
                return i, j + 1, quote
            j += 1
        return None  # a quoted scalar going on below
    flow = "{" in line[:i] or "[" in line[:i]
    j = i
    while j < n:
        if line[j] == "#" and line[j - 1] in " \t":
            break
        if flow and line[j] in ",}]":
            break
        j += 1
    while j > i and line[j - 1] in " \t":
        j -= 1
    return i, j, ""


_ENV_VALUE = re.compile(r"^\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_.]*\s*=\s*")


def _value_span_env(line: str) -> tuple[int, int, str] | None:
    m = _ENV_VALUE.match(line)
    if m is None:
        return None
    i = m.end()
    rest = line[i:]
    stripped = rest.rstrip()
    if len(stripped) >= 2 and stripped[0] == stripped[-1] and stripped[0] in "'\"":
        return i, i + len(stripped), stripped[0]
    comment = re.search(r"\s#", rest)
    end = i + (comment.start() if comment else len(rest))
    while end > i and line[end - 1] in " \t":
        end -= 1
    return i, end, ""


def _replace(line: str, fmt: str, col: int, value: str) -> str | None:
    body = line.rstrip("\r\n")
    ending = line[len(body) :]
    if fmt == "properties":
        span = _value_span_properties(body, col)
        if span is None:
            return None
        start, end = span
        return body[:start] + value + body[end:] + ending
    located = _value_span_yaml(body, col) if fmt == "yaml" else _value_span_env(body)
    if located is None:
        return None
    start, end, quote = located
    return body[:start] + quote + value + quote + body[end:] + ending


def _mask_line(line: str, fmt: str, col: int) -> str:
    """``line`` (holding a secret's key at ``col``) with everything after its key masked."""
    masked = _replace(line, fmt, col, REDACTED) if fmt in _LINE_FORMATS else None
    if masked is not None:
        return masked
    body = line.rstrip("\r\n")
    cut = next((i for i in range(max(col - 1, 0), len(body)) if body[i] in "=:"), None)
    head = body[: cut + 1] + " " if cut is not None else ""
    return head + REDACTED + line[len(body) :]


def _value_lines(lines: list[str], index: int, fmt: str) -> range:
    """The physical lines a value starting on line ``index`` spans (a .properties
    continuation, a YAML block scalar or any more-indented line below its key)."""
    if fmt == "properties":
        return range(index + 1, _logical_end(lines, index) + 1)
    indent = len(lines[index]) - len(lines[index].lstrip())
    end = index + 1
    while end < len(lines):
        text = lines[end]
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        end += 1
    return range(index + 1, end) if fmt == "yaml" else range(0)


def _secret_lines(text: str, fmt: str, units: Iterable[ConfigUnit]) -> dict[str, str]:
    """Each line of ``text`` holding (part of) a secret value -> that line masked."""
    lines = text.splitlines(keepends=True)
    out: dict[str, str] = {}
    for unit in units:
        for entry in unit.entries.values():
            if entry.shown != REDACTED or not 0 < entry.line <= len(lines):
                continue
            index = entry.line - 1
            out[lines[index]] = _mask_line(lines[index], fmt, entry.col)
            for more in _value_lines(lines, index, fmt):
                body = lines[more].rstrip("\r\n")
                out[lines[more]] = (
                    body[: len(body) - len(body.lstrip())] + REDACTED + (lines[more][len(body) :])
                )
    return out


def _logical_end(lines: list[str], index: int) -> int:
    """The last physical line of the .properties logical line starting at ``index``."""
    while index < len(lines) - 1:
        body = lines[index].rstrip("\r\n").rstrip(" \t\f")
        trailing = len(body) - len(body.rstrip("\\"))
        if trailing % 2 == 0:
            break
        index += 1
    return index


def _python_values(text: str) -> dict[tuple[int, int], tuple[ast.expr, ast.expr | None]]:
    """(line, 1-based column) of each key the Python reader records (a dict key, a keyword
    argument, ``d["k"] = ...``) -> (its value node, the key node when it is a literal)."""
    out: dict[tuple[int, int], tuple[ast.expr, ast.expr | None]] = {}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if key is not None:
                    out[(key.lineno, key.col_offset + 1)] = (value, key)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            out[(node.lineno, node.col_offset + 1)] = (node.value, None)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript):
                    out[(target.lineno, target.col_offset + 1)] = (node.value, None)
    return out


def _python_literal(line: bytes, value: ast.expr, key: ast.expr | None, new: str) -> str | None:
    """The Python literal that replaces ``value`` by ``new`` (``True`` for ``true``; a
    string in the quotes of the old value or of its key), or None when ``value`` is not a
    one-line literal written at the key (a name, an f-string, a call). Adjacent literals on
    one line ('1' '0') are one constant: the whole of it is replaced."""
    if not isinstance(value, ast.Constant) or value.end_lineno != value.lineno:
        return None
    if value.end_col_offset is None:
        return None
    written = line[value.col_offset : value.end_col_offset].decode("utf-8", "replace")
    if new in ("true", "false"):
        return "True" if new == "true" else "False"
    if isinstance(value.value, str):
        quote = written[:1]
        if quote not in ("'", '"') or written.startswith(quote * 3) or written[-1:] != quote:
            return None  # a prefixed (b'', r'') or triple-quoted string
    elif isinstance(value.value, bool | int | float):
        shown = (
            line[key.col_offset : key.col_offset + 1].decode("utf-8", "replace")
            if isinstance(key, ast.Constant) and key.lineno == value.lineno
            else ""
        )
        quote = shown if shown in ("'", '"') else "'"
    else:
        return None
    return f"{quote}{new}{quote}"


def _apply_python(text: str, changes: list[_Change], notes: list[str]) -> str:
    """``text`` with the literal values of ``changes`` replaced, located with :mod:`ast`
    (its offsets are UTF-8 bytes of a line)."""
    lines = text.splitlines(keepends=True)
    values = _python_values(text)
    done: set[tuple[int, int]] = set()  # a literal shared by two clients is edited once
    # right to left, so an edit never moves the offsets of another on the same line
    edits: list[tuple[int, int, int, str]] = []
    for change in changes:
        entry = change.entry
        if entry is None or (entry.line, entry.col) in done:
            continue
        found = values.get((entry.line, entry.col))
        index = entry.line - 1
        literal = None
        if found is not None and 0 <= index < len(lines):
            value, key = found
            literal = _python_literal(lines[index].encode("utf-8"), value, key, change.value)
        if literal is None or found is None:
            notes.append(
                f"{change.rule} at line {entry.line}: not fixed (the value of {entry.key} is "
                "not a literal written at the key: a name, an expression or another file's)"
            )
            continue
        done.add((entry.line, entry.col))
        value = found[0]
        assert value.end_col_offset is not None
        edits.append((index, value.col_offset, value.end_col_offset, literal))
    for index, start, end, literal in sorted(edits, reverse=True):
        raw = lines[index].encode("utf-8")
        lines[index] = (raw[:start] + literal.encode("utf-8") + raw[end:]).decode("utf-8")
    return "".join(lines)


def _apply(text: str, fmt: str, changes: list[_Change], notes: list[str]) -> str:
    """``text`` with ``changes`` applied (a change that cannot be made is noted)."""
    if fmt == "python":
        return _apply_python(text, changes, notes)
    lines = text.splitlines(keepends=True)
    newline = m.group() if (m := _NEWLINE.search(text)) else "\n"
    additions: dict[int, list[str]] = {}
    for change in changes:
        entry = change.entry
        if entry is not None:
            index = entry.line - 1
            new = (
                _replace(lines[index], fmt, entry.col, change.value)
                if 0 <= index < len(lines)
                else None
            )
            if new is None:
                notes.append(
                    f"{change.rule} at line {entry.line}: not fixed (the value of {entry.key} "
                    "is not a one-line scalar)"
                )
                continue
            lines[index] = new
            continue
        last = max((e.line for e in change.unit.entries.values()), default=len(lines))
        after = _logical_end(lines, last - 1) if lines else 0
        additions.setdefault(after, []).append(f"{change.setting}={change.value}")
    for after in sorted(additions, reverse=True):
        if lines and not lines[after].endswith(("\n", "\r")):
            lines[after] += newline
        lines[after + 1 : after + 1] = [add + newline for add in additions[after]]
    return "".join(lines)


def _signature(f: Finding) -> tuple[str, str | None, str]:
    return f.rule, f.key, f.message


def fix_text(text: str, path: str, settings: Settings | None = None) -> FileFix:
    """Plan and check the fixes of one file's ``text`` (nothing is written)."""
    settings = settings or Settings()
    result = FileFix(path=path, before=text, after=text)
    fmt = detect_format(path, text)
    if fmt not in _FORMATS:
        return result
    units: list[ConfigUnit] = []
    findings = lint_text(text, path, settings, units_out=units)
    result.masked = _secret_lines(text, fmt, units)
    result.redact = value_redactor(units)
    if any(f.rule == "KR000" for f in findings):
        return result
    # Only a finding that is an error for this file's reader is fixed (issue 38 #9): a
    # warning may be inapplicable (a Java default, a shared snippet), and an edit made on
    # a guess is worse than a report.
    wanted = [f for f in findings if f.rule in FIXABLE and f.severity >= Severity.ERROR]
    if not wanted:
        return result
    changes = _plan(wanted, units, result.notes)
    if changes:
        _finish(result, text, fmt, changes, findings, wanted, settings)
    result.notes = [result.redact(note) for note in result.notes]
    return result


def _finish(
    result: FileFix,
    text: str,
    fmt: str,
    changes: list[_Change],
    findings: list[Finding],
    wanted: list[Finding],
    settings: Settings,
) -> None:
    path = result.path
    after = _apply(text, fmt, changes, result.notes)
    if after == text:
        return
    again = lint_text(after, path, settings)
    before_sigs = {_signature(f) for f in findings}
    added = [f for f in again if _signature(f) not in before_sigs]
    if added:
        what = ", ".join(sorted({f"{f.rule} ({f.message})" for f in added}))
        result.notes.append(f"not fixed: the fix would add {what}")
        return
    after_sigs = {_signature(f) for f in again}
    result.fixed = [f for f in wanted if _signature(f) not in after_sigs]
    if result.fixed:
        result.after = after


def plan_paths(paths: Sequence[str], settings: Settings | None = None) -> list[FileFix]:
    """:func:`fix_text` for every file ``kresilient lint`` would read under ``paths``."""
    settings = settings or Settings()
    out: list[FileFix] = []
    for path in discover(paths, settings.exclude):
        display = os.path.relpath(path) if not os.path.isabs(path) else path
        if detect_format(display, "") not in _FORMATS:
            continue
        try:
            with open(path, "rb") as fh:
                data = fh.read(settings.max_file_size + 1)
        except OSError:
            continue  # lint reports it (KR000)
        if len(data) > settings.max_file_size:
            continue
        bom = data.startswith(b"\xef\xbb\xbf")
        try:
            text = data[3 if bom else 0 :].decode("utf-8")
        except UnicodeDecodeError:
            continue
        fix = fix_text(text, display, settings)
        fix.path = display
        if bom:
            fix.before, fix.after = "\ufeff" + fix.before, "\ufeff" + fix.after
        out.append(fix)
    return out


def write_fixes(fixes: Sequence[FileFix]) -> int:
    """Write every changed file (atomically, keeping its mode); return how many."""
    written = 0
    for fix in fixes:
        if not fix.changed:
            continue
        target = os.path.realpath(fix.path)  # a symlink stays a symlink: write its target
        directory = os.path.dirname(target)
        mode = os.stat(target).st_mode & 0o7777
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".kresilient-fix-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(fix.after.encode("utf-8"))
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        written += 1
    return written
