"""A failing and a passing case for every registered rule (tests/data/lint/rule_cases.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kresilient.clusterinfo import LogDir
from kresilient.lint import RULES, Finding, lint_paths
from kresilient.lint.audit import ClusterSnapshot, PartitionState, check_snapshot
from kresilient.lint.model import Severity

CASES: dict[str, dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "data" / "lint" / "rule_cases.yaml").read_text()
)


def _snapshot(raw: dict[str, Any]) -> ClusterSnapshot:
    return ClusterSnapshot(
        bootstrap="127.0.0.1:9092",
        racks={int(k): v for k, v in raw.get("racks", {}).items()},
        partitions=[
            PartitionState(topic=t, partition=p, leader=lead, replicas=tuple(r), isr=tuple(i))
            for t, p, lead, r, i in raw.get("partitions", [])
        ],
        group_lag=raw.get("group_lag", {}),
        lag_unknown={
            group: {
                (tp.rsplit("/", 1)[0], int(tp.rsplit("/", 1)[1])): why for tp, why in parts.items()
            }
            for group, parts in raw.get("lag_unknown", {}).items()
        },
        incomplete=[(tuple(where), message) for where, message in raw.get("incomplete", [])],
        errors=raw.get("errors", []),
        topic_configs=raw.get("topic_configs", {}),
        broker_configs={int(k): v for k, v in raw.get("broker_configs", {}).items()},
        log_dirs={int(k): [LogDir(*d) for d in v] for k, v in raw.get("log_dirs", {}).items()},
        max_timestamps={
            (tp.rsplit("/", 1)[0], int(tp.rsplit("/", 1)[1])): ts
            for tp, ts in raw.get("max_timestamps", {}).items()
        },
        now_ms=raw.get("now_ms", 0),
        idle_ms=raw.get("idle_ms", {}),
        no_offsets=raw.get("no_offsets", []),
    )


def _run(case: dict[str, Any], tmp_path: Path) -> list[Finding]:
    if "snapshot" in case:
        return check_snapshot(_snapshot(case["snapshot"]))
    paths = []
    for name, text in case["files"].items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(str(path))
    return lint_paths(paths)


def test_every_rule_has_cases() -> None:
    missing = sorted(set(RULES) - set(CASES))
    assert not missing, f"rules without a bad/good case in rule_cases.yaml: {missing}"
    assert not set(CASES) - set(RULES), "cases for rules that do not exist"
    for rule_id, case in CASES.items():
        assert {"bad", "good"} <= set(case), rule_id


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_bad_case_is_reported(rule_id: str, tmp_path: Path) -> None:
    case = CASES[rule_id]["bad"]
    hits = [f for f in _run(case, tmp_path) if f.rule == rule_id]
    assert hits, f"{rule_id} not reported for its bad case"
    # the rule's severity, or error where kresilient's clients refuse the setting (issue
    # 36 #4: lint = runtime, kresilient.lint.parity)
    assert all(
        f.severity is RULES[rule_id].severity
        or (f.severity is Severity.ERROR and "refuse" in f.message)
        for f in hits
    ), [(f.severity, f.message) for f in hits]
    if "line" in case:
        assert case["line"] in {f.line for f in hits}, [(f.line, f.message) for f in hits]


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_good_case_is_clean(rule_id: str, tmp_path: Path) -> None:
    hits = [f for f in _run(CASES[rule_id]["good"], tmp_path) if f.rule == rule_id]
    assert not hits, [f.message for f in hits]


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_rule_metadata_is_complete(rule_id: str) -> None:
    rule = RULES[rule_id]
    assert rule.id == rule_id and len(rule_id) == 5
    assert rule.name and rule.summary and rule.why and rule.fix and rule.family
    assert rule.scope in {"unit", "project", "meta", "audit"}
