"""Suite-wide checks. In CI (``KRESILIENT_NO_SKIPS=1``) a skipped test fails the run:
every test here must really run there (pyspark, the SDK and the cluster are all installed)."""

from __future__ import annotations

import os

import pytest

_skipped: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
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
