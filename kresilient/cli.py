"""The ``kresilient`` command line.

Subcommands are contributed by the modules that own them, each through a
``register(subparsers)`` function that adds its parsers and sets ``func(args) -> int``:

- ``kresilient lint`` / ``kresilient audit`` (:mod:`kresilient.lint.cli`)
- ``kresilient dlq inspect`` / ``kresilient dlq replay`` (:mod:`kresilient.deadletter_cli`)
- ``kresilient cluster`` (this module): run a local 3-node Kafka cluster until Ctrl-C.
- ``kresilient demo`` (this module): the README's demo on the local cluster.

Exit codes: 0 success, 1 findings or a failed check, 2 usage or input error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence

from kresilient import __version__

_CONTRIBUTORS = ("kresilient.lint.cli", "kresilient.deadletter_cli")


def _cmd_cluster(args: argparse.Namespace) -> int:
    from kresilient.testing import KafkaCluster

    with KafkaCluster(nodes=args.nodes) as cluster:
        print(f"bootstrap.servers={cluster.bootstrap_servers}", flush=True)
        print(f"ready in {cluster.start_seconds:.1f}s; pids {cluster.pids()}", flush=True)
        print("Ctrl-C stops the cluster and removes its data.", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from kresilient.testing import _demo

    return _demo.main(messages=args.messages)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every contributed subcommand."""
    parser = argparse.ArgumentParser(
        prog="kresilient",
        description="Kafka clients that are hard to misuse: lint, audit, dead letters, demo.",
    )
    parser.add_argument("--version", action="version", version=f"kresilient {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    cluster = sub.add_parser("cluster", help="run a local 3-node KRaft Kafka cluster")
    cluster.add_argument("--nodes", type=int, default=3, help="number of nodes (default 3)")
    cluster.set_defaults(func=_cmd_cluster)

    demo = sub.add_parser(
        "demo", help="produce through a leader kill on a local cluster and report"
    )
    demo.add_argument("--messages", type=int, default=200_000, help="messages to produce")
    demo.set_defaults(func=_cmd_demo)

    for name in _CONTRIBUTORS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional part missing must not break the rest
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 findings/failure, 2 usage error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    result = func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
