"""The ``kresilient`` command line.

Subcommands are contributed by the modules that own them, each through a
``register(subparsers)`` function that adds its parsers and sets ``func(args) -> int``:

- ``kresilient lint`` / ``kresilient audit`` (:mod:`kresilient.lint.cli`)
- ``kresilient dlq inspect`` / ``kresilient dlq replay`` (:mod:`kresilient.deadletter_cli`)
- ``kresilient topic create`` (this module, over :mod:`kresilient.admin`)
- ``kresilient cluster`` (this module): run a local Kafka cluster until Ctrl-C or SIGTERM.
- ``kresilient demo`` (this module): the README's demo on the local cluster.
- ``kresilient doctor`` (:mod:`kresilient.doctor`)

Conventions: results on stdout (one line per result, for scripts), logs and progress on
stderr. Exit codes: 0 success, 1 findings or a failed operation, 2 usage or input error, an
unreachable cluster, or a cluster that refused the login (wrong password, wrong CA, a client
certificate the brokers refuse: the client's settings are the input to fix). An ACL denial
for the operation itself is a failed operation (1).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import structlog
from confluent_kafka import KafkaError

from kresilient._version import __version__
from kresilient.errors import ConfigError, ErrorCategory, KafkaClientError

_CONTRIBUTORS = ("kresilient.lint.cli", "kresilient.deadletter_cli", "kresilient.doctor")
_BOOTSTRAP_ENV = "KRESILIENT_BOOTSTRAP_SERVERS"
_FAULTS = ("kill", "isolate", "ack-loss")  # kresilient.testing.demo.FAULTS, without importing it
_EXIT_CODES = (
    "Exit codes: 0 success, 1 findings or a failed operation (an ACL denial included), 2 usage "
    "or input error, an unreachable cluster, or a cluster that refused the login (wrong "
    "password, CA or client certificate: the error names the setting to fix)."
)
#: Error codes of a refused login or TLS handshake and of a cluster that never answered: the
#: client's settings are wrong (exit 2, like a wrong --bootstrap-servers).
_INPUT_CODES = frozenset(
    {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._AUTHENTICATION, KafkaError._SSL}
)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- cluster


class _Terminated(Exception):
    """SIGTERM or SIGHUP arrived: leave like Ctrl-C, so the cluster is removed."""


@contextmanager
def _terminate_like_ctrl_c() -> Iterator[None]:
    # The default SIGTERM action kills the process without running `with`/atexit cleanup,
    # which left the data directories (about 1 GB) behind. Raising lets close() run.
    def handler(signum: int, _frame: FrameType | None) -> None:
        raise _Terminated(signal.Signals(signum).name)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    previous.update({sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)})
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def _ticker(what: str, every: float = 5.0) -> Iterator[None]:
    """Print "<what> (Ns)" on stderr every few seconds until the block ends."""
    done = threading.Event()
    began = time.monotonic()

    def tick() -> None:
        while not done.wait(every):
            _err(f"  {what} ({time.monotonic() - began:.0f}s)")

    thread = threading.Thread(target=tick, name="kresilient-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _ignore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)


def _cmd_cluster(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        _err(f"kresilient cluster: --nodes must be at least 1, got {args.nodes}")
        return 2
    if args.port is not None and not 1 <= args.port <= 65535 - args.nodes + 1:
        _err(f"kresilient cluster: --port {args.port} is not a usable port number")
        return 2
    where = f"port {args.port}" if args.port is not None else "free ports"
    # Said before the harness is even imported: the start is silent for 15-40 s otherwise.
    _err(
        f"Starting {args.nodes} Kafka node(s) on 127.0.0.1, {where} (usually 15-40 s; "
        "the first run also downloads the broker jars through Maven) ..."
    )
    from kresilient.testing import KafkaCluster

    try:
        cluster = KafkaCluster(nodes=args.nodes, first_port=args.port)
    except ValueError as exc:
        _err(f"kresilient cluster: {exc}")
        return 2
    with _terminate_like_ctrl_c():
        try:
            with _ticker("still starting"):
                cluster.start_cluster()
            # The result, for people and scripts: the one line on stdout.
            print(f"bootstrap.servers={cluster.bootstrap_servers}", flush=True)
            _err(
                f"Ready in {cluster.start_seconds or 0:.1f}s; node pids {cluster.pids()}. "
                "Ctrl-C or SIGTERM stops the cluster and removes its data."
            )
            while True:
                time.sleep(3600)
        except (KeyboardInterrupt, _Terminated):
            _err("Stopping the cluster and removing its data ...")
        except Exception as exc:
            _err(f"kresilient cluster: {exc}")
            return 1
        finally:
            _ignore_stop_signals()  # a second Ctrl-C must not cut the clean-up short
            cluster.close()
    return 0


# --------------------------------------------------------------------------- demo


def _cmd_demo(args: argparse.Namespace) -> int:
    from kresilient.testing import demo

    if args.messages < 1:
        _err(f"kresilient demo: --messages must be at least 1, got {args.messages}")
        return 2
    with _terminate_like_ctrl_c():
        try:
            return demo.main(messages=args.messages, fault=args.fault)
        except (KeyboardInterrupt, _Terminated):
            _err("demo interrupted; the cluster was stopped")
            return 1


# --------------------------------------------------------------------------- topic


def read_command_config(path: str) -> dict[str, str]:
    """The client properties of a ``--command-config`` file, read like the Kafka tools read
    theirs (Java properties: ``key=value`` or ``key: value``, ``#``/``!`` comments,
    ``\\`` line continuations and escapes; UTF-8, or Latin-1 as Java's ``Properties.load``
    reads, when the file is not valid UTF-8), with the one reader every command uses
    (:func:`kresilient.lint.commandconfig.read_command_config`). A malformed file is a
    :class:`ConfigError` naming the file and line, never its values (they may be secrets)."""
    from kresilient.lint.commandconfig import read_command_config as read

    return read(path)[0]


def _auth_hint(exc: KafkaClientError, args: argparse.Namespace) -> str:
    """For a refused login or ACL: the error's name and what to grant or fix (the broker
    only says "Authorization failed")."""
    if exc.classification.category is not ErrorCategory.AUTH:
        return ""
    if exc.code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED):
        topics = f"{args.name}" + (f" and {args.name}.dlq" if args.dlq else "")
        return (
            f" [{exc.name}]: the user needs CREATE and DESCRIBE on topic {topics} (a "
            "prefixed ACL covers both), or CREATE on the cluster"
        )
    return f" [{exc.name}]: {exc.remedy}"


def _cmd_topic_create(args: argparse.Namespace) -> int:
    from kresilient.admin import create_topic, parse_config_items

    if not args.bootstrap_servers:
        _err(f"kresilient topic create: pass --bootstrap-servers HOSTS or set ${_BOOTSTRAP_ENV}")
        return 2
    try:
        # -X wins over the file, as in the other commands
        path = getattr(args, "command_config", None)
        client = read_command_config(path) if path else {}
        client.update(parse_config_items(args.property or ()))
        results = create_topic(
            args.bootstrap_servers,
            args.name,
            partitions=args.partitions,
            replication_factor=args.replication_factor,
            config=parse_config_items(args.config or ()),
            dead_letter=args.dlq,
            if_not_exists=args.if_not_exists,
            timeout=args.timeout,
            client_config=client,
        )
    except ConfigError as exc:
        _err(f"kresilient topic create: {exc.message}")
        return 2
    except OSError as exc:  # the --command-config file: its name and why, not its content
        _err(f"kresilient topic create: cannot read {exc.filename}: {exc.strerror}")
        return 2
    except KafkaClientError as exc:
        _err(f"kresilient topic create: {exc.message}{_auth_hint(exc, args)}")
        # Nothing answered, or the login was refused: like a wrong --bootstrap-servers, an
        # input error (as dlq, audit and doctor exit); an ACL denial is a failed operation.
        return 2 if exc.code in _INPUT_CODES else 1
    for result in results:
        settings = "".join(f", {k}={v}" for k, v in sorted(result.config.items()))
        verb = "exists (unchanged)" if result.existed else "created"
        print(
            f"{verb} {result.name}: {result.partitions} partition(s), replication factor "
            f"{result.replication_factor}{settings}",
            flush=True,
        )
    return 0


# --------------------------------------------------------------------------- parser


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _add_cluster(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="Run a local Apache Kafka (KRaft) cluster on 127.0.0.1 until stopped.",
        description=(
            "Run a local Apache Kafka (KRaft) cluster on 127.0.0.1 for development and demos. "
            "Prints bootstrap.servers=HOSTS on stdout once the cluster accepts writes; "
            "progress goes to stderr. Ctrl-C or SIGTERM stops every node and removes the "
            "data directories. Needs Java 17+ and Maven on PATH."
        ),
    )
    cluster.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        default=3,
        help="Number of nodes, each a broker and a controller (default: 3).",
    )
    cluster.add_argument(
        "--port",
        type=int,
        metavar="PORT",
        default=None,
        help=(
            "Client port of the first node: node N serves clients on PORT+N-1, so 9092 gives "
            "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094. Without it, free ports are picked "
            "at random. Controller ports are always random."
        ),
    )
    cluster.set_defaults(func=_cmd_cluster)


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="Produce through a fault on a local cluster and prove nothing was lost.",
        description=(
            "Start a local 3-node Kafka cluster, produce numbered messages with "
            "ResilientProducer, inject a fault on the partition leader a third of the way "
            "in (--fault), end it, then read everything back and report missing and "
            "duplicated messages. "
            "Exits 0 when every acknowledged message was read exactly once."
        ),
    )
    demo.add_argument(
        "--messages",
        type=int,
        metavar="N",
        default=200_000,
        help="How many messages to produce (default: 200000).",
    )
    demo.add_argument(
        "--fault",
        choices=_FAULTS,
        default="kill",
        help=(
            "The fault injected on the partition leader a third of the way in: kill "
            "(SIGKILL, then restart), isolate (a network partition from clients and the "
            "other nodes, then heal) or ack-loss (responses to the producer are lost until "
            "it retries). Default: kill."
        ),
    )
    demo.set_defaults(func=_cmd_demo)


def _add_topic(sub: Any) -> None:
    topic = sub.add_parser(
        "topic",
        help="Create topics, with their dead-letter topic if asked.",
        description="Topic administration on any Kafka cluster.",
    )
    topic.set_defaults(func=lambda _args: _usage(topic))
    actions = topic.add_subparsers(dest="topic_command", metavar="ACTION")
    create = actions.add_parser(
        "create",
        help="Create a topic and wait until every partition has a leader.",
        description=(
            "Create a topic and wait until every partition has a leader. "
            "min.insync.replicas defaults to the smaller of 2 and the replication factor. "
            "Prints one line per topic created on stdout."
        ),
        epilog=_EXIT_CODES,
    )
    create.add_argument("name", metavar="NAME", help="Name of the topic to create.")
    create.add_argument(
        "--partitions", type=int, default=1, metavar="N", help="Number of partitions (default: 1)."
    )
    create.add_argument(
        "--replication-factor",
        type=int,
        metavar="N",
        default=3,
        help="Copies of each partition, at most the number of brokers (default: 3).",
    )
    create.add_argument(
        "--dlq",
        action="store_true",
        help=(
            "Also create NAME.dlq, the dead-letter topic, with the same partitions, "
            "replication factor and min.insync.replicas, cleanup.policy=delete, and a "
            "max.message.bytes large enough for any dead letter."
        ),
    )
    create.add_argument(
        "--config",
        action="append",
        metavar="KEY=VALUE",
        help="A topic setting such as retention.ms=604800000; repeat for more.",
    )
    create.add_argument(
        "--if-not-exists",
        action="store_true",
        help="Succeed without changes when a topic exists already.",
    )
    create.add_argument(
        "--bootstrap-servers",
        "-b",
        default=os.environ.get(_BOOTSTRAP_ENV),
        metavar="HOSTS",
        help=f"Comma-separated host:port list of the cluster (default: ${_BOOTSTRAP_ENV}).",
    )
    create.add_argument(
        "--command-config",
        metavar="FILE",
        help="A file of client properties as the Kafka tools take it, one key=value per line "
        "(security.protocol, sasl.*, ssl.*); -X wins over it. Values are never printed.",
    )
    create.add_argument(
        "-X",
        dest="property",
        action="append",
        metavar="KEY=VALUE",
        help="A client property such as security.protocol=SSL; repeat for more.",
    )
    create.add_argument(
        "--timeout",
        type=_positive_float,
        default=8.0,
        metavar="SECONDS",
        help="Give up after this many seconds, including reaching the cluster (default: 8).",
    )
    create.set_defaults(func=_cmd_topic_create)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every contributed subcommand."""
    parser = argparse.ArgumentParser(
        prog="kresilient",
        description=(
            "Kafka clients that are hard to misuse: a local cluster, topic creation, "
            "config lint, cluster audit, dead-letter inspection and replay, and a demo."
        ),
        epilog=_EXIT_CODES + " Results go to stdout, logs and progress to stderr.",
    )
    parser.add_argument("--version", action="version", version=f"kresilient {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_cluster(sub)
    _add_demo(sub)
    _add_topic(sub)
    for name in _CONTRIBUTORS:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional part missing must not break the rest
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


@contextmanager
def _logs_to_stderr() -> Iterator[None]:
    # The CLI is an application, so it may configure structlog (a library must not): its
    # logs go to stderr at INFO and up, keeping stdout for results. The previous
    # configuration is restored for callers that run main() inside their own process.
    was_configured = structlog.is_configured()
    saved = structlog.get_config()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.reset_defaults()
        if was_configured:
            structlog.configure(**saved)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 findings/failure, 2 usage or input error,
    an unreachable cluster or a refused login)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    with _logs_to_stderr():
        result = func(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
