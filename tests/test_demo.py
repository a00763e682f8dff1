"""The README's main job: the demo survives a leader crash with nothing lost."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kresilient.testing import BOOTSTRAP_ENV

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_demo_survives_a_leader_kill() -> None:
    env = {k: v for k, v in os.environ.items() if k != BOOTSTRAP_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "kresilient.cli", "demo", "--messages", "20000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "SIGKILL node" in out.stdout
    assert "missing 0, duplicates 0, in order: True" in out.stdout
    assert "RESULT: no acknowledged message lost, none duplicated" in out.stdout


@pytest.mark.parametrize("fault", ["isolate", "ack-loss"])
def test_demo_survives_a_network_fault(fault: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != BOOTSTRAP_ENV}
    out = subprocess.run(
        [sys.executable, "-m", "kresilient.cli", "demo", "--fault", fault, "--messages", "20000"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # the marker line proves that fault (not the default kill) ran: `--fault` reached the demo
    marker = {"isolate": "ISOLATED node", "ack-loss": "DROPPED "}[fault]
    assert marker in out.stdout and "SIGKILL node" not in out.stdout, out.stdout[-3000:]
    assert "missing 0, duplicates 0, in order: True" in out.stdout
