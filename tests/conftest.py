"""Suite-wide checks. In CI (``KRESILIENT_NO_SKIPS=1``) a skipped test fails the run:
every test here must really run there (pyspark, the SDK and the cluster are all installed)."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

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
    """On an xdist worker, order the test files costliest first (the tests of a file keep
    their order; equal costs keep collection order). Both workers compute the same order."""
    if not hasattr(config, "workerinput") or not _FILE_COSTS.exists():
        return
    known: dict[str, float] = json.loads(_FILE_COSTS.read_text())["seconds"]
    counts = Counter(item.nodeid.split("::", 1)[0] for item in items)
    paths = sorted(counts, key=lambda p: -known.get(p, counts[p] * _UNKNOWN_FILE_COST_S))
    rank = {path: i for i, path in enumerate(paths)}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)
    path = report.nodeid.split("::", 1)[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
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
