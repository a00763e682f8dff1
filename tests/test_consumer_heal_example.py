"""examples/consumer_heal.py runs as written, on the suite's network-fault cluster: the
consumer's connections frozen, the stall healed, every order handled."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kresilient.testing import KafkaCluster

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "consumer_heal.py"


def test_consumer_heal_example_heals_a_hung_consumer_and_handles_every_order(
    kafka_network_cluster: KafkaCluster,
) -> None:
    spec = importlib.util.spec_from_file_location("consumer_heal_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    handled, heals = example.run(kafka_network_cluster)
    assert (handled, heals) == (example.ORDERS, 1)
