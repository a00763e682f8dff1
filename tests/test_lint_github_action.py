"""The GitHub Action's lint step runs as written: valid flags, SARIF written, exit code out."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ACTION = ROOT / "integrations" / "github-action" / "action.yml"


def _lint_step() -> dict[str, object]:
    action = yaml.safe_load(ACTION.read_text())
    (step,) = [s for s in action["runs"]["steps"] if s.get("id") == "lint"]
    return dict(step)


@pytest.mark.parametrize(("content", "expected"), [("acks=all\n", "0"), ("acks=0\n", "1")])
def test_action_lint_step(tmp_path: Path, content: str, expected: str) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not available")
    step = _lint_step()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "producer.properties").write_text(
        "bootstrap.servers=a:1,b:1\nenable.idempotence=true\n" + content
    )
    output = tmp_path / "github_output"
    env_spec = {str(k): str(v) for k, v in dict(step["env"]).items()}  # type: ignore[call-overload]
    inputs = {"paths": "conf", "fail-on": "error", "sarif-file": "out.sarif", "annotations": "true"}
    env = {
        **os.environ,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
        "GITHUB_OUTPUT": str(output),
    }
    for name, expr in env_spec.items():
        key = expr.removeprefix("${{ inputs.").removesuffix(" }}")
        env[name] = inputs[key]
    proc = subprocess.run(
        [bash, "-e", "-c", str(step["run"])],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert output.read_text().strip() == f"exit-code={expected}"
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    assert sarif["version"] == "2.1.0"
    if expected == "1":
        assert "::error file=conf/producer.properties,line=3" in proc.stdout
