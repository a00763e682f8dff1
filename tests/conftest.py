"""Suite-wide checks. In CI (``KRESILIENT_NO_SKIPS=1``) a skipped test fails the run:
every test here must really run there (pyspark, the SDK and the cluster are all installed)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator

import pytest

_skipped: list[str] = []


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


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("KRESILIENT_NO_SKIPS") == "1" and _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
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
