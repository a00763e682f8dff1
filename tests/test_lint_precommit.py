"""The pre-commit hook: run its entry the way pre-commit does (console script + filenames)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _hook() -> dict[str, object]:
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = [h for h in hooks if h["id"] == "kresilient-lint"]
    return dict(hook)


def _run_like_pre_commit(
    hook: dict[str, object], repo: Path, staged: list[str]
) -> subprocess.CompletedProcess[str]:
    """pre-commit filters staged files with ``files``, then runs ``entry args... files...``."""
    files_re = re.compile(str(hook["files"]))
    exclude = re.compile(str(hook.get("exclude", "^$")))
    chosen = [f for f in staged if files_re.search(f) and not exclude.search(f)]
    bindir = str(Path(sys.executable).parent)
    command = shlex.split(str(hook["entry"])) + list(map(str, hook.get("args", []))) + chosen
    assert shutil.which(command[0], path=bindir), "console script not installed"
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=False)


def test_hook_definition() -> None:
    hook = _hook()
    assert hook["language"] == "python"
    assert str(hook["entry"]).split()[:2] == ["kresilient", "lint"]
    files = re.compile(str(hook["files"]))
    for name in (
        "a.properties",
        "x/c.yaml",
        "c.yml",
        "c.json",
        "k.toml",
        "app.py",
        ".env",
        "deploy/.env.prod",
        "prod.env",
    ):
        assert files.search(name), name
    for name in ("README.md", "image.png", "environment.txt"):
        assert not files.search(name), name


@pytest.fixture(name="repo")
def _repo(tmp_path: Path) -> Path:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "producer.properties").write_text(
        "bootstrap.servers=a:9092,b:9092\nacks=all\nenable.idempotence=true\n"
    )
    (tmp_path / "README.md").write_text("acks=0\n")  # not a config: filtered out by `files`
    return tmp_path


def test_hook_passes_on_clean_files(repo: Path) -> None:
    proc = _run_like_pre_commit(_hook(), repo, ["conf/producer.properties", "README.md"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hook_fails_with_located_findings(repo: Path) -> None:
    (repo / "conf" / "consumer.yaml").write_text(
        "consumer:\n  group.id: g\n  enable.auto.commit: true\n  acks: 0\n"
        "  partition.assignment.strategy: range,cooperative-sticky\n"
    )
    proc = _run_like_pre_commit(
        _hook(), repo, ["conf/producer.properties", "conf/consumer.yaml", "README.md"]
    )
    assert proc.returncode == 1
    assert "conf/consumer.yaml:5:3: KR025 [error]" in proc.stdout
    assert "README.md" not in proc.stdout


def test_hook_reports_parse_errors_with_exit_2(repo: Path) -> None:
    (repo / "bad.toml").write_text('[producer]\nacks = "all\n')
    proc = _run_like_pre_commit(_hook(), repo, ["bad.toml"])
    assert proc.returncode == 2
    assert "bad.toml:2:" in proc.stdout and "KR000" in proc.stdout
