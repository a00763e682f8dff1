"""The ``kresilient`` command line.

- ``kresilient cluster``: run a local Kafka cluster until Ctrl-C or SIGTERM.
- ``kresilient demo``: the README's demo on the local cluster.
- ``kresilient topic create`` (over :mod:`kresilient.admin`).
- ``kresilient dlq inspect`` / ``kresilient dlq replay`` (:mod:`kresilient.deadletter_cli`).
- ``kresilient doctor`` (:mod:`kresilient.doctor`).
- ``kresilient lint`` / ``kresilient audit``: contributed by :mod:`kresilient.lint.cli`
  through its ``register(subparsers)``.

Building the parser imports the standard library only: this module defines the parsers of
its commands, and each command's implementation (confluent-kafka, the lint engine, the test
harness, structlog) is imported when that command runs. ``--help`` used to import all of
them and took 0.7-1.5 s (issue 36); ``benchmarks/cli_help.py`` measures it and
``tests/test_cli_help.py`` checks that no help screen imports them. The ``lint`` and
``audit`` parsers come from :mod:`kresilient.lint.cli`, imported only when one of those two
commands is named (``kresilient --help`` lists them from :data:`_CONTRIBUTED`).

Conventions: results on stdout (one line per result, for scripts), logs and progress on
stderr. Exit codes: 0 success, 1 findings or a failed operation, 2 usage or input error, an
unreachable cluster, or a cluster that refused the login (wrong password, wrong CA, a client
certificate the brokers refuse: the client's settings are the input to fix). An ACL denial
for the operation itself is a failed operation (1).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from kresilient._version import __version__

if TYPE_CHECKING:
    from kresilient.errors import KafkaClientError

_BOOTSTRAP_ENV = "KRESILIENT_BOOTSTRAP_SERVERS"
_FAULTS = ("kill", "isolate", "ack-loss")  # kresilient.testing.demo.FAULTS, without importing it
_EXIT_CODES = (
    "Exit codes: 0 success, 1 findings or a failed operation (an ACL denial included), 2 usage "
    "or input error, an unreachable cluster, or a cluster that refused the login (wrong "
    "password, CA or client certificate: the error names the setting to fix)."
)
#: Commands whose parsers another module registers, with the one-line help ``kresilient
#: --help`` shows for them without importing that module (tests/test_cli_help.py checks
#: that each line is the one the module registers).
_CONTRIBUTED: dict[str, tuple[str, str]] = {
    "lint": (
        "kresilient.lint.cli",
        "Lint Kafka configs: .properties, YAML (Spring Boot, Strimzi, topic specs), JSON, "
        "TOML, .env, Terraform and Python files.",
    ),
    "audit": ("kresilient.lint.cli", "Audit a live cluster through the Admin API."),
}
#: Defaults shown in ``--help`` whose one definition lives in a module the parser must not
#: import; tests/test_cli_help.py asserts each equals its source.
_DLQ_TIMEOUT = 10.0  # kresilient.deadletter_cli.DEFAULT_TIMEOUT
_DLQ_MAX_REPLAYS = 3  # kresilient.deadletter_cli.DEFAULT_MAX_REPLAYS
_DLQ_REPLAY_COUNT = "kresilient.replay.count"  # kresilient.deadletter_cli.REPLAY_COUNT
_DLQ_FIELDS = (  # the filter fields of kresilient.deadletter_cli
    "category",
    "exception",
    "message",
    "topic",
    "partition",
    "group",
    "attempts",
    "format",
)
_DOCTOR_TIMEOUT = 10.0  # the timeout default of kresilient.doctor.diagnose
_DOCTOR_DISK_THRESHOLD = 0.8  # kresilient.clusterinfo.DISK_USAGE_THRESHOLD


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _implemented_in(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """``func`` for a parser: imports ``module`` only when the command runs."""

    def run(args: argparse.Namespace) -> int:
        return int(getattr(importlib.import_module(module), function)(args))

    run.__qualname__ = f"{module}.{function}"
    return run


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

    # `kresilient cluster` starts a cluster, always. KafkaCluster takes $BOOTSTRAP_ENV (set
    # for the test suite or by a user's shell) as an external cluster to wrap when no
    # bootstrap_servers is given, and offers no argument meaning "start one regardless": the
    # variable is taken out of this process's environment while the cluster is built (it is
    # read there only), and put back for callers that run main() in their own process.
    external = os.environ.pop(_BOOTSTRAP_ENV, None)
    try:
        cluster = KafkaCluster(nodes=args.nodes, first_port=args.port)
    except ValueError as exc:
        _err(f"kresilient cluster: {exc}")
        return 2
    finally:
        if external is not None:
            os.environ[_BOOTSTRAP_ENV] = external
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
    from confluent_kafka import KafkaError

    from kresilient.errors import ErrorCategory

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
    from confluent_kafka import KafkaError

    from kresilient.admin import create_topic, parse_config_items
    from kresilient.errors import ConfigError, KafkaClientError

    # A refused login or TLS handshake, or a cluster that never answered: the client's
    # settings are wrong (exit 2, like a wrong --bootstrap-servers).
    input_codes = {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    }

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
        return 2 if exc.code in input_codes else 1
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
    if not 0 < value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.8, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction above 0 and at most 1, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def _add_cluster(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster",
        help="Run a local Apache Kafka (KRaft) cluster on 127.0.0.1 until stopped.",
        description=(
            "Run a local Apache Kafka (KRaft) cluster on 127.0.0.1 for development and demos. "
            "Prints bootstrap.servers=HOSTS on stdout once the cluster accepts writes; "
            "progress goes to stderr. Ctrl-C or SIGTERM stops every node and removes the "
            "data directories. Needs Java 17+ and Maven on PATH. It always starts a "
            f"cluster: ${_BOOTSTRAP_ENV}, which names an existing cluster for the tests, "
            "is ignored here."
        ),
        epilog="Exit codes: 0 stopped cleanly, 1 the cluster failed to start or to run, 2 "
        "a usage error (a bad --nodes or --port).",
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
            "Needs Java 17+ and Maven on PATH."
        ),
        epilog="Exit codes: 0 every acknowledged message was read back exactly once, 1 a "
        "message was missing or duplicated (or the demo was interrupted), 2 a usage error.",
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
        help="Create a topic and wait until every partition has a leader serving it.",
        description=(
            "Create a topic and wait until every partition has a leader serving it. "
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


# The doctor's description is a numbered list: printed as written (RawDescriptionHelpFormatter),
# as argparse's default formatter would run the items into one paragraph. It used to be the
# first paragraph of kresilient.doctor's docstring, which ends with "...an incident:", so
# `doctor --help` stopped mid-sentence, without the list or the exit codes (issue 36).
_DOCTOR_DESCRIPTION = """\
Diagnose the path between one service and one cluster, from a symptom to the fix.
The doctor connects the way the application would (its client config, linted
first) and checks, in order:

  1. config: the client config itself (unknown keys, typos, unsafe settings),
     through kresilient lint;
  2. connectivity: every bootstrap address and every broker the metadata
     advertises: name resolution, TCP connect latency, then authentication and
     TLS through a metadata request;
  3. metadata: the controller, and whether the brokers agree on partition
     leaders;
  4. topics: offline partitions, under-replicated partitions, leaders not on
     their preferred replica, replication factor against min.insync.replicas,
     replicas sharing a rack, unclean leader election, timestamps in the future,
     and log-dir usage per broker;
  5. groups: state, members, lag per partition, and offsets that expired or
     may expire (offsets.retention.minutes);
  6. probe: an acks=all produce and consume round trip on a temporary topic
     (latency percentiles), whose LogAppendTime timestamps also measure the
     clock skew between this machine and the brokers.

Every finding names the symptom, the likely causes and the fix. The report shows
each problem found, the topics and groups named with --topic and --group (one
line each, also when healthy) and the probe; --verbose adds every check passed.
Results go to stdout, errors to stderr."""

_DOCTOR_EXIT_CODES = """\
Exit codes: 0 healthy, 1 a finding at error level (or at warning level with
--fail-on warning), 2 the cluster cannot be reached (one line naming each host
and the reason) or the input is unusable (a bad option, an unreadable
--command-config, a refused login)."""


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="Diagnose the path between a client and a cluster, from symptom to fix.",
        description=_DOCTOR_DESCRIPTION,
        epilog=_DOCTOR_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument(
        "-b",
        "--bootstrap-servers",
        required=True,
        metavar="HOSTS",
        help="Comma-separated HOST:PORT list of the cluster to diagnose.",
    )
    doctor.add_argument(
        "--command-config",
        metavar="FILE",
        help="The application's client properties file (security settings included); it is "
        "linted first and used for every connection.",
    )
    doctor.add_argument(
        "-X",
        dest="property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A client property such as security.protocol=SSL (repeatable); -X wins over "
        "--command-config.",
    )
    doctor.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="T",
        help="A topic to check, always reported (repeatable; default: every non-internal "
        "topic, reported when something is wrong).",
    )
    doctor.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="G",
        help="A consumer group to check, always reported (repeatable; default: every group, "
        "reported when something is wrong).",
    )
    doctor.add_argument(
        "--format", choices=("text", "json"), default="text", help="Report format on stdout."
    )
    doctor.add_argument(
        "--timeout",
        type=_positive_float,
        default=_DOCTOR_TIMEOUT,
        metavar="SECONDS",
        help=f"Time allowed for each request (default {_DOCTOR_TIMEOUT:g}).",
    )
    doctor.add_argument(
        "--no-probe", action="store_true", help="Skip the produce/consume round trip."
    )
    doctor.add_argument(
        "--probe-topic",
        metavar="T",
        help="Probe on this existing topic instead of creating a temporary one.",
    )
    doctor.add_argument(
        "--disk-threshold",
        type=_fraction,
        default=_DOCTOR_DISK_THRESHOLD,
        metavar="FRACTION",
        help=f"Log-dir usage that is reported (default {_DOCTOR_DISK_THRESHOLD:g}).",
    )
    doctor.add_argument(
        "--fail-on",
        choices=("warning", "error"),
        default="error",
        help="Lowest severity that makes the exit code 1 (default error).",
    )
    doctor.add_argument("--verbose", action="store_true", help="Also list every check that passed.")
    doctor.set_defaults(func=_implemented_in("kresilient.doctor", "main"))


_REPLAY_AGAIN = (
    "Without --group nothing records what was replayed: running the same command again "
    "replays the same records again. Use --group NAME for repeated runs (a run then starts "
    "where the last one stopped)."
)


def _dlq_connection(parser: argparse.ArgumentParser, *, group_help: str) -> None:
    parser.add_argument(
        "--bootstrap-servers",
        "-b",
        default=os.environ.get(_BOOTSTRAP_ENV),
        metavar="HOSTS",
        help=f"The brokers to connect to, as host:port[,host:port] (default: the "
        f"{_BOOTSTRAP_ENV} environment variable).",
    )
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        help="A file of client properties, one key=value per line (e.g. security settings).",
    )
    parser.add_argument(
        "-X",
        dest="property",
        action="append",
        metavar="KEY=VALUE",
        help="An extra client property; repeat it for several.",
    )
    parser.add_argument("--group", default=None, metavar="GROUP", help=group_help)
    parser.add_argument(
        "--timeout",
        type=float,
        default=_DLQ_TIMEOUT,
        metavar="SECONDS",
        help="Seconds to wait for the cluster: to connect, and without progress while "
        f"reading or delivering (default {_DLQ_TIMEOUT:g}).",
    )


def _add_dlq(sub: Any) -> None:
    dlq = sub.add_parser(
        "dlq",
        help="Inspect or replay a dead-letter topic.",
        description="Inspect or replay a dead-letter topic (kresilient, Spring Kafka and "
        "Kafka Streams formats).",
        epilog="Exit codes: 0 done, 1 some records could not be replayed (failed, or refused "
        "at the replay limit), 2 a usage or connection error (a refused login included: "
        "wrong password, CA or client certificate).",
    )
    actions = dlq.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND")
    dlq.set_defaults(func=lambda _args: _usage(dlq))

    inspect = actions.add_parser(
        "inspect",
        help="Show dead-letter records with their decoded headers, and counts by error.",
        description="Show the records of a dead-letter topic with their decoded headers and "
        "sizes, then count them by error and by source topic. Nothing is committed.",
        epilog="Results go to stdout, logs and errors to stderr. Exit codes: 0 done, 2 a "
        "usage or connection error (a refused login included: wrong password, CA or client "
        "certificate).",
    )
    inspect.add_argument("topic", metavar="TOPIC", help="The dead-letter topic to read.")
    inspect.add_argument(
        "--limit",
        type=_count,
        default=50,
        metavar="N",
        help="Show at most N records (default 50); the counts always cover every record.",
    )
    inspect.add_argument(
        "--brief", action="store_true", help="Leave out the list of headers of each record."
    )
    inspect.add_argument(
        "--show-data",
        action="store_true",
        help="Also show each record's key and value: UTF-8 text quoted with control "
        "characters escaped, other bytes as hex (base64 in JSON).",
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="Write JSON lines: one object per record shown, then one summary object.",
    )
    _dlq_connection(
        inspect,
        group_help="Start from this consumer group's committed offsets instead of the "
        "beginning of the topic. Nothing is committed.",
    )
    inspect.set_defaults(func=_implemented_in("kresilient.deadletter_cli", "main_inspect"))

    replay = actions.add_parser(
        "replay",
        help="Write dead-letter records back with their original key, value and headers.",
        description="Write the selected records of a dead-letter topic back to a topic, each "
        "with its original key, value and headers (the dead-letter headers are stripped). "
        + _REPLAY_AGAIN,
        epilog="Filters: FIELD=VALUE matches when equal and FIELD~TEXT when containing, both "
        f"case-insensitive; FIELD is one of {', '.join(_DLQ_FIELDS)}. Results go to stdout, "
        "logs and errors to stderr. Exit codes: 0 done, 1 some records could not be replayed "
        "(failed, or refused at the replay limit: see --max-replays), 2 a usage or "
        "connection error (a refused login included: wrong password, CA or client certificate).",
    )
    replay.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="TOPIC",
        help="The dead-letter topic to read.",
    )
    replay.add_argument(
        "--to",
        dest="target",
        metavar="TOPIC",
        help="Write every record to this topic (default: each record's original topic).",
    )
    replay.add_argument(
        "--filter",
        dest="filters",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="Replay only records that match; repeat it and all filters must match.",
    )
    replay.add_argument(
        "--dry-run",
        action="store_true",
        help="Count what would be replayed without writing or committing anything.",
    )
    replay.add_argument(
        "--limit",
        type=_count,
        default=None,
        metavar="N",
        help="Replay at most N records; the rest are left for a later run.",
    )
    replay.add_argument(
        "--max-replays",
        type=_count,
        default=_DLQ_MAX_REPLAYS,
        metavar="N",
        help=f"Refuse a record already replayed N times, by its {_DLQ_REPLAY_COUNT} header "
        f"(default {_DLQ_MAX_REPLAYS}); refused records are listed and the exit code is "
        "1, so a loop of replays that fail again ends.",
    )
    replay.add_argument(
        "--force",
        action="store_true",
        help="Replay records past --max-replays too (their count still goes up).",
    )
    replay.add_argument(
        "--keep-timestamp",
        action="store_true",
        help="Give each record its original timestamp instead of the time of the replay.",
    )
    replay.add_argument("--json", action="store_true", help="Write the summary as one JSON object.")
    _dlq_connection(
        replay,
        group_help="Start from this consumer group's committed offsets and afterwards commit "
        "past every record replayed or filtered out, never past one left behind. Without it "
        "every run starts from the beginning of the topic and a warning says so.",
    )
    replay.set_defaults(func=_implemented_in("kresilient.deadletter_cli", "main_replay"))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level
    parser's options, --help and --version, take no value)."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. Without ``argv``: every subcommand's whole parser (for tests and
    documentation tools). With ``argv``: the parser for that command line, in which the
    contributed commands other than the one ``argv`` names are listed by their help line
    only, so their modules (the lint engine) are not imported."""
    parser = argparse.ArgumentParser(
        prog="kresilient",
        description=(
            "Kafka clients that are hard to misuse: a local cluster, topic creation, "
            "config lint, cluster audit, dead-letter inspection and replay, a diagnosis "
            "of the path to a cluster, and a demo."
        ),
        epilog=_EXIT_CODES + " Results go to stdout, logs and progress to stderr.",
    )
    parser.add_argument("--version", action="version", version=f"kresilient {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_cluster(sub)
    _add_demo(sub)
    _add_topic(sub)
    named = None if argv is None else _named_command(argv)
    by_module: dict[str, dict[str, str]] = {}
    for command, (module_name, help_line) in _CONTRIBUTED.items():
        by_module.setdefault(module_name, {})[command] = help_line
    for module_name, commands in by_module.items():
        if argv is not None and named not in commands:
            for command, help_line in commands.items():
                sub.add_parser(command, help=help_line, add_help=False)
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # an optional part missing must not break the rest
            if exc.name != module_name:
                raise
            continue
        module.register(sub)
    _add_dlq(sub)
    _add_doctor(sub)
    return parser


@contextmanager
def _logs_to_stderr() -> Iterator[None]:
    # The CLI is an application, so it may configure structlog (a library must not): its
    # logs go to stderr at INFO and up, keeping stdout for results. The previous
    # configuration is restored for callers that run main() inside their own process.
    # Imported here, when a command runs: --help needs no logging.
    import logging

    import structlog

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
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    try:
        args = parser.parse_args(words)
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
