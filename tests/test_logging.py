"""Issue 36, item 3: ``kresilient.logging.configure()`` puts logs on stderr at a level.

Unconfigured, structlog prints every level on stdout, mixed with the program's output; the
helper is for programs without a logging set-up of their own (the library never calls it)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import structlog

import kresilient.logging
from kresilient.testing import KafkaCluster


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """structlog's configuration is process-global: put back what the suite had."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def test_configure_filters_by_level_and_writes_to_the_stream() -> None:
    out = io.StringIO()
    kresilient.logging.configure("WARNING", out)
    log = structlog.get_logger("app")
    log.info("quiet", n=1)
    log.warning("loud", n=2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "loud" in lines[0] and "n=2" in lines[0], lines
    assert "[warning" in lines[0]


def test_configure_defaults_to_info_on_stderr_as_it_is_at_the_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kresilient.logging.configure()
    log = structlog.get_logger("app")
    log.debug("hidden")
    log.info("shown")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "shown" in captured.err and "hidden" not in captured.err


def test_configure_accepts_a_level_number_and_refuses_an_unknown_name() -> None:
    out = io.StringIO()
    kresilient.logging.configure(logging.DEBUG, out)
    structlog.get_logger("app").debug("seen")
    assert "seen" in out.getvalue()
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        kresilient.logging.configure("LOUD")


def test_importing_the_package_does_not_configure_structlog() -> None:
    """The library never configures structlog (process-global state belongs to the app)."""
    code = (
        "import structlog; before = structlog.get_config(); "
        "import kresilient, kresilient.producer, kresilient.consumer, kresilient.logging; "
        "assert structlog.get_config() == before; "
        "import logging; assert logging.getLogger is not None and logging.__name__ == 'logging'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


_CHILD = textwrap.dedent(
    """
    import sys
    import kresilient.logging
    from kresilient import ResilientProducer

    kresilient.logging.configure()
    with ResilientProducer({"bootstrap.servers": sys.argv[1]}) as producer:
        for n in range(10):
            producer.produce(sys.argv[2], b"%d" % n)
        producer.flush()
    print("sent 10")
    """
)


def test_a_producer_script_with_configure_prints_only_its_output_on_stdout(
    kafka_cluster: KafkaCluster, topic: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, kafka_cluster.bootstrap_servers, topic],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "sent 10\n"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert all("facility=GETPID" in line for line in lines), lines  # at most the explained one
