"""Precision and recall of `kresilient lint` on real public config files.

The corpus (tests/data/lint/realworld/, origins in tests/data/lint/SOURCES) holds files as
their projects publish them: Kafka's own config/ and docker examples, Strimzi, topicctl,
Jikkou and Terraform topic definitions, aiokafka and confluent-kafka-python examples, Spring
Kafka samples, Confluent's cp-all-in-one, Debezium and bitnami. Every error-level finding on
it was judged by hand, right or wrong for the reader of that file, in
tests/data/lint/realworld/expected.yaml.

Precision = right error findings / all error findings; recall = expected findings found /
expected. An error finding nobody judged fails the test: a rule change that adds findings on
real files must be judged, not waved through.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import yaml

from kresilient.lint import lint_paths
from kresilient.lint.model import LintStats, Severity
from kresilient.lint.settings import Settings

CORPUS = Path(__file__).resolve().parent / "data" / "lint" / "realworld"
EXPECTED = CORPUS / "expected.yaml"
SOURCES = CORPUS.parent / "SOURCES"

Key = tuple[str, str, int]  # (file relative to the corpus, rule, line)


def _expected() -> tuple[set[Key], set[Key], list[Key]]:
    data = yaml.safe_load(EXPECTED.read_text())
    right: set[Key] = set()
    wrong: set[Key] = set()
    for name, judged in data["files"].items():
        assert (CORPUS / name).is_file(), f"expected.yaml names a missing file: {name}"
        right.update((name, rule, line) for rule, line in judged.get("right", []))
        wrong.update((name, rule, line) for rule, line in judged.get("wrong", []))
    missed = [(m["file"], m["rule"], m["line"]) for m in data.get("missed", [])]
    return right, wrong, missed


def _error_findings() -> tuple[list[Key], LintStats]:
    stats = LintStats()
    settings = Settings(exclude=(str(EXPECTED),))
    findings = lint_paths([str(CORPUS)], settings, stats=stats)
    found = [
        (os.path.relpath(f.path, CORPUS), f.rule, f.line)
        for f in findings
        if f.severity == Severity.ERROR
    ]
    return found, stats


def test_every_corpus_file_is_cited_in_sources() -> None:
    cited = {
        line.split()[0]
        for line in SOURCES.read_text().splitlines()
        if "@" in line and not line.startswith("Each")
    }
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file() and p != EXPECTED}
    assert len(files) >= 70
    assert files == cited, f"not cited: {sorted(files - cited)}; cited but absent: {cited - files}"


def test_precision_and_recall_on_real_config_files() -> None:
    right, wrong, missed = _expected()
    found, stats = _error_findings()
    counts = Counter(found)
    assert all(n == 1 for n in counts.values()), f"duplicate findings: {counts.most_common(3)}"
    unjudged = sorted(set(found) - right - wrong)
    assert not unjudged, f"error findings nobody judged (add to expected.yaml): {unjudged}"
    found_right = [f for f in found if f in right]
    precision = len(found_right) / len(found) if found else 1.0
    recall = len(set(found_right)) / len(right) if right else 1.0
    with_misses = len(set(found_right)) / (len(right) + len(missed))
    print(
        f"\nreal-world corpus: {stats.files_read} files ({stats.with_config} with Kafka "
        f"settings, {len(stats.skipped)} without, {stats.failed} unreadable); "
        f"{len(found)} error findings, {len(found_right)} right, "
        f"{len(found) - len(found_right)} wrong; precision {precision:.3f}, "
        f"recall {recall:.3f} ({len(set(found_right))}/{len(right)} expected), "
        f"recall counting {len(missed)} known misses {with_misses:.3f}"
    )
    missing = sorted(right - set(found))
    assert not missing, f"expected findings not reported: {missing}"
    assert precision >= 0.95, f"precision {precision:.3f} below 0.95"
    assert stats.failed == 0  # every real file is read


def test_known_misses_are_still_misses() -> None:
    """A known miss that the linter now reports belongs in `right` (so recall counts it)."""
    _, _, missed = _expected()
    found, _ = _error_findings()
    assert not set(missed) & set(found), "move the now-reported misses to `right`"


def test_dev_stack_files_say_why_their_replication_findings_are_folded() -> None:
    findings = lint_paths([str(CORPUS)], Settings(exclude=(str(EXPECTED),)))
    folded = {os.path.relpath(f.path, CORPUS): f.message for f in findings if f.rule == "KR053"}
    # one line per file, each naming what the file says about itself
    assert folded["apache-kafka/connect-distributed.properties"].startswith(
        "dev stack (the file says so ('single-broker'))"
    )
    assert (
        "a KRaft quorum of one voter"
        in folded["cp-all-in-one/cp-all-in-one-kraft/docker-compose.yml"]
    )
    assert (
        "the compose file runs one broker"
        in folded["cp-all-in-one/cp-all-in-one-community/docker-compose.yml"]
    )
    assert "its cluster has one broker" in folded["strimzi/kafka-single-node.yaml"]
    assert "provider bootstraps from localhost" in folded["terraform/mongey-main.tf"]
    assert "'local-env'" in folded["topicctl/local-cluster/topic-static.yaml"]
    # a three-broker Strimzi cluster and a production Terraform file are not dev stacks
    assert "strimzi/kafka-persistent.yaml" not in folded
    assert "terraform/uw-prod-msk-data-keep.tf" not in folded
