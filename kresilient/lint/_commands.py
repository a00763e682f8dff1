"""The work behind ``kresilient lint`` and ``kresilient audit`` (their parsers are in
:mod:`kresilient.lint.cli`, which imports this module only when a command runs).

Exit codes: 0 clean, 1 a finding at or above ``--fail-on`` (default error), 2 a usage error,
a parse error (lint), no Kafka configuration found (lint) or an unreachable cluster (audit).
Reports go to stdout, messages about the run to stderr.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

from kresilient.errors import ConfigError
from kresilient.lint.audit import AuditOptions, audit
from kresilient.lint.commandconfig import read_command_config
from kresilient.lint.engine import exit_code, lint_paths
from kresilient.lint.fix import plan_paths, write_fixes
from kresilient.lint.model import Finding, LintStats, Severity
from kresilient.lint.output import render
from kresilient.lint.readers import KNOWN_EXTENSIONS
from kresilient.lint.registry import RULES, iter_rules
from kresilient.lint.settings import Settings, load_settings

__all__ = [
    "check_rule_prefix",
    "client_config",
    "explain",
    "nothing_found",
    "parse_severity",
    "run_audit",
    "run_lint",
]


def explain(rule_id: str) -> str:
    """The ``--explain`` text of one rule: id, name, severity, applies to, why, fix."""
    found = RULES[rule_id.upper()]
    kinds = ", ".join(sorted(found.kinds))
    wrap = textwrap.TextWrapper(width=88, subsequent_indent="  ")
    return (
        "\n".join(
            [
                f"{found.id} {found.name} [{found.severity.label}] ({found.family}; {kinds})",
                "",
                wrap.fill(found.summary),
                "",
                wrap.fill(f"Why: {found.why}"),
                "",
                wrap.fill(f"Fix: {found.fix}"),
                "",
                f"Suppress: # kresilient: ignore[{found.id}] reason: <why it does not apply>",
            ]
        )
        + "\n"
    )


def _list_rules() -> str:
    return "".join(
        f"{r.id}  {r.severity.label:<7}  {r.name:<36} {r.summary}\n" for r in iter_rules()
    )


def parse_severity(text: str) -> Severity:
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _settings(args: argparse.Namespace, starts: Sequence[str]) -> Settings:
    settings = load_settings(args.config, starts=[".", *starts])
    for option, ids in (("--select", args.select or ()), ("--ignore", args.ignore or ())):
        for prefix in ids:
            check_rule_prefix(prefix, option)
    return settings.replace(
        fail_on=args.fail_on,
        select=args.select,
        ignore=args.ignore,
        kind=getattr(args, "kind", None),
        client=getattr(args, "client", None),
    )


def _emit(
    findings: list[Finding], args: argparse.Namespace, tool: str, stats: LintStats | None = None
) -> None:
    report = render(findings, args.format, tool, stats=stats)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(report)
        if args.format != "text":
            sys.stdout.write(render(findings, "text", tool, stats=stats))
    else:
        sys.stdout.write(report)


def run_lint(args: argparse.Namespace) -> int:
    """``kresilient lint``: returns the exit code."""
    if args.list_rules:
        sys.stdout.write(_list_rules())
        return 0
    if args.explain:
        if args.explain.upper() not in RULES:
            print(f"kresilient lint: unknown rule {args.explain!r}", file=sys.stderr)
            return 2
        sys.stdout.write(explain(args.explain))
        return 0
    paths = args.paths or ["."]
    try:
        settings = _settings(args, paths)
    except ConfigError as exc:
        print(f"kresilient lint: {exc}", file=sys.stderr)
        return 2
    if args.fix or args.diff:
        fixes = plan_paths(paths, settings)
        for fix in fixes:
            for note in fix.notes:
                print(f"kresilient lint: {fix.path}: {note}", file=sys.stderr)
        changed = [f for f in fixes if f.changed]
        if args.diff:
            sys.stdout.write("".join(f.diff() for f in changed))
            return 1 if changed else 0
        try:
            written = write_fixes(changed)
        except OSError as exc:
            print(f"kresilient lint: --fix could not write: {exc}", file=sys.stderr)
            return 2
        count = sum(len(f.fixed) for f in changed)
        print(f"kresilient lint: fixed {count} finding(s) in {written} file(s)", file=sys.stderr)
    stats = LintStats()
    findings = lint_paths(paths, settings, stats=stats)
    _emit(findings, args, "lint", stats)
    if args.verbose:
        for path in stats.skipped:
            print(f"kresilient lint: skipped {path}: no Kafka settings found", file=sys.stderr)
    nothing = not stats.with_config and not any(f.rule == "KR000" for f in findings)
    if nothing and not args.allow_no_config:
        # Exit 2, not 0: a clean result must mean "checked and clean", never "nothing read".
        print(f"kresilient lint: {nothing_found(paths, stats)}", file=sys.stderr)
        return 2
    return exit_code(findings, settings)


def nothing_found(paths: Sequence[str], stats: LintStats) -> str:
    """The message for a run that found no Kafka configuration in ``paths``."""
    where = ", ".join(paths)
    if not stats.files_read:
        return (
            f"no Kafka configuration found in {where}: no file of a kind lint reads "
            f"({', '.join(KNOWN_EXTENSIONS)}, .env)"
        )
    return (
        f"no Kafka configuration found in {where}: {stats.files_read} file(s) read, none "
        "holds Kafka settings (use --verbose to list them)"
    )


def check_rule_prefix(prefix: str, option: str) -> None:
    """Raise ConfigError unless ``prefix`` is a rule id or the prefix of at least one."""
    if not prefix.startswith("KR") or not any(r.startswith(prefix) for r in RULES):
        raise ConfigError(
            f"{option}: unknown rule id or prefix {prefix!r} (no rule id starts with it; "
            "see kresilient lint --list-rules)",
            key=option.lstrip("-"),
        )


def run_audit(args: argparse.Namespace) -> int:
    """``kresilient audit``: returns the exit code."""
    try:
        settings = _settings(args, [])
        client = client_config(args)
    except (ConfigError, OSError) as exc:
        print(f"kresilient audit: {exc}", file=sys.stderr)
        return 2
    options = AuditOptions(
        topics=tuple(args.topic or ()),
        groups=tuple(args.group or ()),
        lag_threshold=args.lag_threshold
        if args.lag_threshold is not None
        else settings.lag_threshold,
        include_internal=args.include_internal,
        timeout=args.timeout,
        disk_threshold=None if args.disk_threshold == 0 else args.disk_threshold,
        future_tolerance_ms=args.future_tolerance_ms,
    )
    findings = audit(client, options=options, settings=settings)
    _emit(findings, args, "audit")
    return exit_code(findings, settings)


def client_config(args: argparse.Namespace) -> dict[str, str]:
    config: dict[str, str] = {}
    if args.command_config:
        # the one reader of every command's --command-config: UTF-8 when valid, else Latin-1
        # (what Java's Properties.load reads); a malformed file is a ConfigError, an
        # unreadable one an OSError, both reported by run_audit as a usage error
        config.update(read_command_config(args.command_config)[0])
    for item in args.property or ():
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"-X expects key=value, got {key!r}", key=key)
        config[key.strip()] = value.strip()
    config["bootstrap.servers"] = args.bootstrap_servers
    return config
