"""``kresilient lint`` and ``kresilient audit`` subcommands.

Exit codes: 0 clean, 1 a finding at or above ``--fail-on`` (default error), 2 a usage error,
a parse error (lint), no Kafka configuration found (lint) or an unreachable cluster (audit).
Reports go to stdout, messages about the run to stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kresilient.lint.model import Severity

__all__ = ["explain", "main", "register"]

# The parsers are built from the standard library alone, so `kresilient lint --help` loads no
# lint engine, catalog or client (issue 36: --help under 0.3 s); the values they offer are
# copies, checked equal to their sources by tests/test_cli_help.py.
FORMAT_CHOICES = ("github", "json", "sarif", "text")  # sorted(kresilient.lint.output.FORMATS)
KIND_CHOICES = ("producer", "consumer", "admin", "client", "broker", "topic")  # lint.model.KINDS
CLIENT_CHOICES = ("librdkafka", "java")  # kresilient.lint.registry.CLIENTS
DISK_USAGE_THRESHOLD = 0.8  # kresilient.clusterinfo.DISK_USAGE_THRESHOLD
FUTURE_TOLERANCE_MS = 3_600_000  # kresilient.clusterinfo.FUTURE_TOLERANCE_MS


def explain(rule_id: str) -> str:
    """The ``--explain`` text of one rule: id, name, severity, applies to, why, fix."""
    from kresilient.lint._commands import explain as explain_rule

    return explain_rule(rule_id)


def _severity(text: str) -> Severity:
    from kresilient.lint._commands import parse_severity

    return parse_severity(text)


def run_lint(args: argparse.Namespace) -> int:
    from kresilient.lint._commands import run_lint as run

    return run(args)


def run_audit(args: argparse.Namespace) -> int:
    from kresilient.lint._commands import run_audit as run

    return run(args)


def _client_config(args: argparse.Namespace) -> dict[str, str]:
    from kresilient.lint._commands import client_config

    return client_config(args)


def __getattr__(name: str) -> Any:
    # the helpers that moved to _commands (nothing_found, check_rule_prefix...) still import
    # from here
    from kresilient.lint import _commands

    try:
        return getattr(_commands, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _ids(text: str) -> tuple[str, ...]:
    return tuple(i.strip().upper() for i in text.split(",") if i.strip())


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMAT_CHOICES,
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
        choices=KIND_CHOICES,
        help="Treat every config as this kind instead of telling it from its keys.",
    )
    lint.add_argument(
        "--client",
        choices=CLIENT_CHOICES,
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
