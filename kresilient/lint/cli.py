"""``kresilient lint`` and ``kresilient audit`` subcommands.

Exit codes: 0 clean, 1 a finding at or above ``--fail-on`` (default error), 2 a usage error,
a parse error (lint), no Kafka configuration found (lint) or an unreachable cluster (audit).
Reports go to stdout, messages about the run to stderr.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

from kresilient.clusterinfo import DISK_USAGE_THRESHOLD, FUTURE_TOLERANCE_MS
from kresilient.errors import ConfigError
from kresilient.lint.audit import AuditOptions, audit
from kresilient.lint.commandconfig import read_command_config
from kresilient.lint.engine import exit_code, lint_paths
from kresilient.lint.fix import plan_paths, write_fixes
from kresilient.lint.model import KINDS, Finding, LintStats, Severity
from kresilient.lint.output import FORMATS, render
from kresilient.lint.readers import KNOWN_EXTENSIONS
from kresilient.lint.registry import CLIENTS, RULES, iter_rules
from kresilient.lint.settings import Settings, load_settings

__all__ = ["explain", "main", "register"]


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


def _severity(text: str) -> Severity:
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ids(text: str) -> tuple[str, ...]:
    return tuple(i.strip().upper() for i in text.split(",") if i.strip())


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=sorted(FORMATS),
        default="text",
        help="The report format: text (default), json, sarif (SARIF 2.1.0 for code scanning) "
        "or github (workflow annotations).",
    )
    parser.add_argument(
        "--output",
        "-o",
        metavar="FILE",
        help="Write the report to FILE; a text summary still goes to stdout.",
    )
    parser.add_argument(
        "--fail-on",
        type=_severity,
        default=None,
        metavar="SEVERITY",
        help="Exit 1 when a finding is at or above SEVERITY: error (the default), warning or info.",
    )
    parser.add_argument(
        "--select",
        type=_ids,
        default=None,
        metavar="IDS",
        help="Run only the rules whose ids start with one of these comma-separated ids or "
        "prefixes (KR0, KR006).",
    )
    parser.add_argument(
        "--ignore",
        type=_ids,
        default=None,
        metavar="IDS",
        help="Skip the rules whose ids start with one of these comma-separated ids or prefixes.",
    )
    parser.add_argument(
        "--config",
        metavar="PYPROJECT",
        help="Read the settings from this file (default: the nearest pyproject.toml with a "
        "[tool.kresilient.lint] table).",
    )


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
        client = _client_config(args)
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


def _fraction(text: str) -> float:
    """argparse type: a share between 0 and 1 (``--disk-threshold``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and 1") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 0 and 1")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: a whole number of milliseconds, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _client_config(args: argparse.Namespace) -> dict[str, str]:
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


_EXIT_CODES = (
    "Exit codes: 0 clean, 1 a finding at or above --fail-on, 2 a usage error, a file that "
    "cannot be parsed (KR000) or {what}."
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the ``lint`` and ``audit`` subcommands to the ``kresilient`` CLI."""
    lint = subparsers.add_parser(
        "lint",
        help="Lint Kafka configs: .properties, YAML (Spring Boot, Strimzi, topic specs), JSON, "
        "TOML, .env, Terraform and Python files.",
        description="Lint Kafka client, topic and broker configs for durability, commit, "
        "rebalance, metadata, partitioner, security and size problems. Directories are "
        "walked for the file kinds lint reads.",
        epilog=_EXIT_CODES.format(what="no Kafka configuration found in the paths"),
    )
    lint.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="Files or directories to lint (default: the current directory).",
    )
    lint.add_argument(
        "--kind",
        choices=KINDS,
        help="Treat every config as this kind instead of telling it from its keys.",
    )
    lint.add_argument(
        "--client",
        choices=CLIENTS,
        help="Judge every client config by this library's defaults (default: librdkafka, "
        "or java for Spring Boot files and configs naming Java serializer classes).",
    )
    lint.add_argument(
        "--fix",
        action="store_true",
        help="Fix what is safe to fix mechanically in .properties, YAML and .env files (acks, "
        "idempotence, partitioner, Spring auto-commit, auto.offset.reset; KR006 KR007 KR008 "
        "KR012 KR018 KR021), keeping comments and layout; then report what is left.",
    )
    lint.add_argument(
        "--diff",
        action="store_true",
        help="Print what --fix would change as a unified diff, write nothing (exit 1 when "
        "there is something to fix).",
    )
    lint.add_argument("--explain", metavar="ID", help="Explain one rule, then exit.")
    lint.add_argument("--list-rules", action="store_true", help="List every rule, then exit.")
    lint.add_argument(
        "--allow-no-config",
        action="store_true",
        help="Exit 0, not 2, when no file holds Kafka settings (for a pre-commit hook that "
        "passes every changed file).",
    )
    lint.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="Also list on stderr each file read that holds no Kafka settings.",
    )
    _common(lint)
    lint.set_defaults(func=run_lint)

    audit = subparsers.add_parser(
        "audit",
        help="Audit a live cluster through the Admin API.",
        description="Audit the replication, in-sync replicas, leaders, racks and consumer "
        "lag of a live cluster, and the durability settings of its topics and brokers.",
        epilog=_EXIT_CODES.format(
            what="a cluster that cannot be reached (KR065); a part that cannot be read is "
            "KR066 and the rest is still reported"
        ),
    )
    audit.add_argument(
        "--bootstrap-servers",
        "-b",
        required=True,
        metavar="HOSTS",
        help="The brokers to connect to, as host:port[,host:port].",
    )
    audit.add_argument(
        "--command-config",
        metavar="FILE",
        help="A file of client properties, one key=value per line (e.g. security settings).",
    )
    audit.add_argument(
        "-X",
        dest="property",
        action="append",
        metavar="KEY=VALUE",
        help="An extra client property; repeat it for several.",
    )
    audit.add_argument(
        "--topic",
        action="append",
        metavar="NAME",
        help="Audit only this topic; repeat it for several (default: every topic).",
    )
    audit.add_argument(
        "--group",
        action="append",
        metavar="GROUP",
        help="Check the lag of this consumer group only; repeat it for several (default: "
        "every group).",
    )
    audit.add_argument(
        "--lag-threshold",
        type=int,
        default=None,
        metavar="N",
        help="Report a group lagging more than N messages on a topic (default 1000).",
    )
    audit.add_argument(
        "--disk-threshold",
        type=_fraction,
        default=DISK_USAGE_THRESHOLD,
        metavar="FRACTION",
        help="Report a broker log dir at least this full, 0-1 (default "
        f"{DISK_USAGE_THRESHOLD:g}; 0 skips reading log dirs) (KR067).",
    )
    audit.add_argument(
        "--future-tolerance-ms",
        type=_non_negative_int,
        default=FUTURE_TOLERANCE_MS,
        metavar="MS",
        help="Report a partition whose newest timestamp is more than MS ahead of this "
        f"machine's clock (default {FUTURE_TOLERANCE_MS}) (KR068).",
    )
    audit.add_argument(
        "--include-internal",
        action="store_true",
        help="Also audit internal topics such as __consumer_offsets.",
    )
    audit.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="Seconds to wait for the cluster and for each admin request (default 10).",
    )
    _common(audit)
    audit.set_defaults(func=run_audit)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m kresilient.lint [lint|audit] ...`` (``lint`` is the default)."""
    parser = argparse.ArgumentParser(prog="python -m kresilient.lint")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("lint", "audit", "-h", "--help"):
        argv.insert(0, "lint")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return int(args.func(args))
