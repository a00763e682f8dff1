"""The Terraform fast path reads exactly what python-hcl2 reads, or hands the file over.

kresilient.lint.hclreader reads plain-layout ``.tf`` files with a line scanner (python-hcl2
costs 10-25 ms a file). python-hcl2 stays the reference: for every file the scanner accepts,
the units (names, entries, values, positions, dynamic flags) must equal python-hcl2's, and
the scanner must refuse anything it cannot read exactly.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from kresilient.lint import hclreader
from kresilient.lint.model import ReadResult

ROOT = Path(__file__).resolve().parents[1]


def _signature(result: ReadResult) -> object:
    return (
        result.error,
        [
            (
                u.name,
                u.line,
                u.col,
                u.kind,
                u.source,
                u.context,
                [
                    (k, e.key, e.value, e.line, e.col, e.dynamic, e.setting)
                    for k, e in u.entries.items()
                ],
            )
            for u in result.units
        ],
    )


def _agrees(text: str) -> bool:
    """True when the fast path read ``text``; fails when it read it differently."""
    fast = hclreader._fast(text, "t.tf")
    if fast is None:
        return False
    reference = hclreader._read_hcl2(text, "t.tf")
    assert reference.error is None, f"fast path accepted what python-hcl2 refuses: {text!r}"
    assert _signature(fast) == _signature(reference), text
    return True


PLAIN = """\
terraform {
  required_providers {
    kafka = {
      source  = "Mongey/kafka"
      version = "~> 0.7"
    }
  }
}

provider "kafka" {
  bootstrap_servers = ["kafka-0:9092", "kafka-1:9092"] // two brokers
  tls_enabled       = true
}

# Orders: written by checkout
resource "kafka_topic" "orders" {
  name               = "orders" # trailing comment
  replication_factor = 1
  partitions         = -1

  config = {
    "cleanup.policy"      = "delete",
    "retention.ms"        = 604800000
    "min.insync.replicas" = var.min_isr
    unquoted              = "skipped by python-hcl2 too"
    "flag"                = true
    "nothing"             = null
    "many"                = ["a", "b"]
  }

  lifecycle {
    prevent_destroy = true
  }
}

resource "kafka_topic" "per_env" {
\tname               = local.name
\treplication_factor = each.value.rf
\tpartitions         = 3
\tconfig             = {}
}

resource "confluent_kafka_topic" "cc" {
  kafka_cluster {
    id = var.kafka_id
  }
  topic_name       = "payments"
  partitions_count = 6
  config = {
    "retention.ms" = "86400000"
  }
}

resource "kafka_acl" "not_a_topic" {
  resource_name = "orders"
  config = {
    "ignored" = "1"
  }
}
"""


def test_plain_layout_is_read_by_the_fast_path_exactly_as_python_hcl2_reads_it() -> None:
    assert _agrees(PLAIN)
    units = hclreader.read_terraform(PLAIN, "t.tf").units
    assert [u.name for u in units] == ["orders", None, "payments"]


@pytest.mark.parametrize(
    "text",
    [
        'resource "kafka_topic" "t" {\n  name = "a${var.x}"\n}\n',  # template
        'resource "kafka_topic" "t" {\n  name = "a\\"b"\n}\n',  # escape
        'resource "kafka_topic" "t" {\r\n  partitions = 3\r\n}\r\n',  # CRLF
        'resource "kafka_topic" "t" { partitions = 3 }\n',  # one-line block
        'resource "kafka_topic" "t" {\n  partitions = 3\n',  # unbalanced
        'resource "kafka_topic" "t" {\n  partitions = 1.5\n}\n',  # float
        'resource "kafka_topic" "t" {\n  partitions = max(1, 3)\n}\n',  # function call
        'resource "kafka_topic" "t" {\n  config = {\n    "a" = {\n    }\n  }\n}\n',  # nested
        '/* block */\nresource "kafka_topic" "t" {\n  partitions = 3\n}\n',
        'resource "kafka_topic" "t" {\n  description = <<EOT\nx\nEOT\n}\n',  # heredoc
        "resource kafka_topic t {\n  partitions = 3\n}\n",  # unquoted labels
        'resource "kafka_topic" "t" {\n  partitions = 3\n}\n}\n',  # extra brace
    ],
)
def test_anything_else_is_left_to_python_hcl2(text: str) -> None:
    assert hclreader._fast(text, "t.tf") is None
    # and read_terraform still gives python-hcl2's answer
    assert _signature(hclreader.read_terraform(text, "t.tf")) == _signature(
        hclreader._read_hcl2(text, "t.tf")
    )


def test_every_terraform_file_of_the_corpus_and_the_benchmark_agrees(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import lint as bench  # benchmarks/lint.py
    finally:
        sys.path.pop(0)
    bench.generate(str(tmp_path), 120)
    files = sorted((ROOT / "tests" / "data" / "lint").rglob("*.tf")) + sorted(
        tmp_path.rglob("*.tf")
    )
    read_fast = [f for f in files if _agrees(f.read_text())]
    # the plain files are the fast path's (the fixtures with ${...} templates are not)
    assert len(read_fast) >= len(files) - 3, [str(f) for f in files if f not in read_fast]


def test_mutated_files_are_read_exactly_or_refused() -> None:
    """Random edits of a plain file (characters dropped, doubled or replaced, lines moved):
    whatever the fast path still accepts, python-hcl2 must parse to the same units."""
    rng = random.Random(15)
    alphabet = '{}[]"=#/,.-$% \tabcz019\n'
    accepted = 0
    for _ in range(250):
        chars = list(PLAIN)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(chars))
            action = rng.random()
            if action < 0.4:
                del chars[at]
            elif action < 0.7:
                chars.insert(at, rng.choice(alphabet))
            else:
                chars[at] = rng.choice(alphabet)
        text = "".join(chars)
        if hclreader._fast(text, "t.tf") is None:
            continue
        reference = hclreader._read_hcl2(text, "t.tf")
        if reference.error is not None:  # would be a fast-path acceptance of invalid HCL
            raise AssertionError(f"fast path accepted invalid HCL: {text!r}")
        assert _signature(hclreader._fast(text, "t.tf")) == _signature(reference), text  # type: ignore[arg-type]
        accepted += 1
    assert accepted > 50  # the check ran on many mutants, not on none
