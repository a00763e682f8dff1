"""Suite-wide checks. In CI (``KRESILIENT_NO_SKIPS=1``) a skipped test fails the run:
every test here must really run there (pyspark, the SDK and the cluster are all installed)."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kresilient.pytest_plugin import session_kafka_version
from kresilient.testing import BOOTSTRAP_ENV, KafkaCluster

_skipped: list[str] = []
_file_seconds: dict[str, float] = {}

# Worker-seconds per test file (setup, calls and teardown of a CI run with --durations=0).
# Under `-n 2 --dist loadfile --no-loadscope-reorder` (.ci/test) xdist hands out files in
# collection order, each worker taking the next when it runs dry: the costliest go first, so
# the last files handed out are short and neither worker idles long at the end. By default
# xdist orders files by their number of tests, which put the few-test chaos files (minutes
# each) last. A file not in the table counts _UNKNOWN_FILE_COST_S per test.
_FILE_COSTS = Path(__file__).with_name("file_costs.json")
_UNKNOWN_FILE_COST_S = 1.5

# Test files that share one costly fixture, by group name. Under `--dist loadfile` a group is
# one unit of work (pytest_xdist_make_scheduler below): all its files run on one worker, one
# after the other, so the group's fixture (sasl_ssl_cluster) starts once for them all rather
# than once per file. Their tests must not depend on a pristine cluster: each makes its own
# users, topics, groups and ACLs under unique names and asserts about those only.
#
# "network": the files that use the network-fault cluster (``kafka_network_cluster``, below). Left
# to the plugin's session fixture, every worker that ran one of them started a 3-node cluster
# with its fault proxies and kept it to the end of the run (three, alive 955-1,065 s each, in
# a sampled four-worker run, 2026-12-01): a 3-node cluster costs about 11-12 CPU-s to start
# and 4.6 CPU-s a minute at rest, on two cores shared with the rest. A file that asks for it
# outside the group fails at once, naming the group (_group_cluster).
_FILE_GROUPS: dict[str, str] = {
    "tests/test_security.py": "security",
    "tests/test_security_cli.py": "security",
    "tests/test_security_refusals.py": "security",
    "tests/test_security_spark.py": "security",
    "tests/test_aio_consumer_parity.py": "network",
    "tests/test_consumer_heal.py": "network",
    "tests/test_consumer_heal_example.py": "network",
    "tests/test_network_faults.py": "network",
    "tests/test_tools_seams.py": "network",
    "tests/test_transactions.py": "network",
}


def _unit(path: str) -> str:
    """What xdist hands out whole: a file's group, or the file itself."""
    group = _FILE_GROUPS.get(path)
    return f"group:{group}" if group else path


# The host's environment must not decide a test: OTEL_* variables (OTEL_SDK_DISABLED,
# OTEL_TRACES_SAMPLER, OTEL_SPAN_LINK_COUNT_LIMIT, an OTLP endpoint...) reconfigure every SDK
# object the telemetry tests build and reach the CLI and example subprocesses; a
# PYSPARK_PYTHON pointing at another interpreter would run Spark's Python workers without
# kresilient (the Spark fixtures rely on this). Tests that need an OTEL_* variable set it
# themselves (monkeypatch).
def _pin_environment() -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        del os.environ[name]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Every server a test talks to is on loopback: a host's HTTP(S)_PROXY must not route the
    # probe, registry, Spark-master and OTLP requests through a proxy.
    for name in ("NO_PROXY", "no_proxy"):
        kept = [h for h in os.environ.get(name, "").split(",") if h.strip()]
        os.environ[name] = ",".join([*kept, "127.0.0.1", "localhost"])


def pytest_configure(config: pytest.Config) -> None:
    _pin_environment()
    config.addinivalue_line(
        "markers",
        "streaming_source: writeStream.format('kresilient'), which needs pyspark>=4.1 "
        "(DataSourceStreamArrowWriter); .ci/test deselects it on the lowest supported pyspark",
    )
    config.addinivalue_line(
        "markers",
        "broker_smoke: the broker-version smoke subset (producer and consumer chaos, DLQ, "
        "doctor) that .ci/test runs again on the newest Kafka 4.x ($KRESILIENT_KAFKA_VERSION)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the units of work (a file, or a group of files: _FILE_GROUPS)
    costliest first, a group costing the sum of its files; inside a group its files go
    costliest first, each file's tests in their order. Equal costs keep collection order.
    Every worker computes the same order, which the scheduler keeps (--no-loadscope-reorder)."""
    if not hasattr(config, "workerinput") or not _FILE_COSTS.exists():
        return
    known: dict[str, float] = json.loads(_FILE_COSTS.read_text())["seconds"]
    counts = Counter(item.nodeid.split("::", 1)[0] for item in items)
    cost = {p: known.get(p, counts[p] * _UNKNOWN_FILE_COST_S) for p in counts}
    paths = sorted(counts, key=lambda p: -cost[p])
    unit_cost: dict[str, float] = {}
    unit_first: dict[str, int] = {}
    for i, path in enumerate(paths):
        unit_cost[_unit(path)] = unit_cost.get(_unit(path), 0.0) + cost[path]
        unit_first.setdefault(_unit(path), i)
    paths.sort(key=lambda p: (-unit_cost[_unit(p)], unit_first[_unit(p)]))
    rank = {path: i for i, path in enumerate(paths)}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: without it, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, except that the files of a group (_FILE_GROUPS) are one unit of work:
    one worker runs them all, so the group's shared fixture starts once. Every other file is
    its own unit as before, and the units are handed out in collection order under
    --no-loadscope-reorder (pytest_collection_modifyitems keeps a group's files together)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(super()._split_scope(nodeid))

    return GroupedFileScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Once a group's last test has run here (the next test is of another unit, or none), close
    what the group shared, after its files' own module fixtures were torn down."""
    try:
        return (yield)
    finally:
        unit = _unit(item.nodeid.split("::", 1)[0])
        if nextitem is None or _unit(nextitem.nodeid.split("::", 1)[0]) != unit:
            _close_shared(unit)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    for unit in list(_shared_clusters):  # a run stopped early (-x, Ctrl-C) leaves them here
        _close_shared(unit)
    if os.environ.get("KRESILIENT_NO_SKIPS") == "1" and _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if terminalreporter.config.getoption("durations", None) is not None and _file_seconds:
        costly = sorted(_file_seconds.items(), key=lambda kv: -kv[1])
        terminalreporter.write_sep("=", "worker-seconds per test file (setup+call+teardown)")
        terminalreporter.write_line(f"{sum(_file_seconds.values()):.0f}s in all")
        for path, seconds in costly[:40]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    out = os.environ.get("KRESILIENT_FILE_COSTS_OUT")
    if out and _file_seconds:  # a new table for pytest_collection_modifyitems
        table = {p: round(t, 1) for p, t in sorted(_file_seconds.items(), key=lambda kv: -kv[1])}
        Path(out).write_text(json.dumps({"seconds": table}, indent=1) + "\n")
    if os.environ.get("KRESILIENT_NO_SKIPS") == "1" and _skipped:
        terminalreporter.write_line(
            f"KRESILIENT_NO_SKIPS=1: {len(_skipped)} test(s) skipped, which fails this run: "
            + ", ".join(_skipped[:10]),
            red=True,
        )


@pytest.fixture(autouse=True)
def _structlog_defaults() -> object:
    """Every test starts and ends with structlog's defaults.

    structlog's configuration is process-global: a test (or a CLI run in-process) that
    configures it, or a logger cached while another test's capture was active, must not change
    what the next test's clients log.
    """
    import structlog

    structlog.reset_defaults()
    yield None
    structlog.reset_defaults()


@pytest.fixture(name="closed_port")
def _closed_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test: bound, never listening.

    Held, not bound-then-released: a released port can be taken by another test's broker or
    Spark worker (the suite runs clusters side by side) before this test connects to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture(scope="module", name="lone_cluster")
def _lone_cluster() -> Iterator[KafkaCluster]:
    """A 1-node cluster of the module's own: freezing its node (``freeze()``) would stall
    every test sharing the session cluster."""
    if os.environ.get(BOOTSTRAP_ENV):
        pytest.skip(f"freezes a node: needs a cluster started here, not ${BOOTSTRAP_ENV}")
    cluster = KafkaCluster(nodes=1, version=session_kafka_version())
    try:
        cluster.start_cluster()
        yield cluster
    finally:
        cluster.close()


# The group's shared clusters on this process, by unit: started by the group's first test that
# asks, closed when the process leaves the group (pytest_runtest_teardown). Without xdist a
# group's files given apart on the command line each start one, as they did with their own.
_shared_clusters: dict[str, KafkaCluster] = {}


def _close_shared(unit: str) -> None:
    cluster = _shared_clusters.pop(unit, None)
    if cluster is not None:
        cluster.close()


def _group_cluster(request: pytest.FixtureRequest, group: str, **options: Any) -> KafkaCluster:
    """The cluster the files of ``group`` share (started by the first test that asks)."""
    path = request.node.nodeid.split("::", 1)[0]
    unit = _unit(path)
    if unit != f"group:{group}":
        raise RuntimeError(f"{path} is not in the {group!r} group of tests/conftest.py")
    cluster = _shared_clusters.get(unit)
    if cluster is None:
        cluster = KafkaCluster(**options)
        try:
            cluster.start_cluster()
        except BaseException:
            cluster.close()
            raise
        _shared_clusters[unit] = cluster
    return cluster


@pytest.fixture(scope="module", name="kafka_network_cluster")
def _kafka_network_cluster(request: pytest.FixtureRequest) -> KafkaCluster:
    """The plugin's ``kafka_network_cluster`` (a 3-node cluster with ``network_faults=True``),
    shared by the files of the "network" group and closed when this process leaves the group,
    instead of one per worker kept to the end of the run. The plugin's autouse fixture heals
    it after each test that used it, as before."""
    if os.environ.get(BOOTSTRAP_ENV):
        pytest.skip(
            f"network faults need a cluster started by kresilient.testing; {BOOTSTRAP_ENV} "
            "points at an external cluster"
        )
    return _group_cluster(request, "network", network_faults=True)


@pytest.fixture(scope="module", name="sasl_ssl_cluster")
def _sasl_ssl_cluster(request: pytest.FixtureRequest) -> KafkaCluster:
    """A 3-node SASL_SSL cluster (``KafkaCluster(security="sasl_ssl")``: SCRAM users, TLS,
    ACLs on, ``admin`` the super user) shared by the files of the "security" group.

    Its tests share brokers, so none may rely on a pristine cluster: each creates its own users
    (so its own ACLs, all granted to that user), topics and consumer groups under unique names,
    and asserts only about those; none stops, restarts or reconfigures a node."""
    return _group_cluster(request, "security", security="sasl_ssl")
