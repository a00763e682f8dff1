"""Lint of configs built by kresilient's config functions and of values from variables.

``Consumer(consumer_config({...}))`` hands librdkafka what ``consumer_config`` builds (its safe
defaults: ``auto.offset.reset=earliest``, the cooperative assignor): lint judged the inner
dict as if it were passed raw (KR021, KR026 on defaults kresilient sets). A key set from a
variable is set, its value unknown: lint reported ``bootstrap.servers is required`` (KR054)
for ``{"bootstrap.servers": bootstrap}``. Controls: the key really missing, an unsafe literal
inside the builder, are still errors.
"""

from __future__ import annotations

from pathlib import Path

from kresilient.lint.engine import lint_paths


def _lint(tmp_path: Path, body: str) -> list[tuple[str, str | None]]:
    path = tmp_path / "svc.py"
    path.write_text(
        "from confluent_kafka import Consumer\nfrom kresilient.config import consumer_config\n"
        + body
    )
    return [(f.rule, f.key) for f in lint_paths([str(path)])]


def test_keys_set_from_variables_are_not_missing(tmp_path: Path) -> None:
    found = _lint(
        tmp_path,
        "def make(bootstrap, group):\n"
        "    return consumer_config({'bootstrap.servers': bootstrap, 'group.id': group})\n",
    )
    assert ("KR054", "bootstrap.servers") not in found and ("KR054", "group.id") not in found


def test_a_key_really_missing_is_still_refused_control(tmp_path: Path) -> None:
    found = _lint(tmp_path, "c = consumer_config({'bootstrap.servers': 'a:1,b:1'})\n")
    assert ("KR054", "group.id") in found, found  # "group.id is required for a consumer"


def test_a_client_given_a_built_config_is_judged_as_built(tmp_path: Path) -> None:
    found = _lint(
        tmp_path,
        "def make(bootstrap):\n"
        "    return Consumer(consumer_config({'bootstrap.servers': bootstrap, 'group.id': 'g'}))\n",
    )
    assert not [r for r, _ in found if r in ("KR021", "KR026", "KR054")], found


def test_an_unsafe_literal_inside_the_builder_is_an_error_once_control(tmp_path: Path) -> None:
    found = _lint(
        tmp_path,
        "c = Consumer(consumer_config({'bootstrap.servers': 'a:1,b:1', 'group.id': 'g',\n"
        "                              'enable.auto.offset.store': True}))\n",
    )
    assert found.count(("KR054", "enable.auto.offset.store")) == 1, found


def test_a_raw_client_around_a_builder_still_needs_its_callbacks(tmp_path: Path) -> None:
    """The builders add no delivery callback nor error_cb: KR013/KR014 stay on the raw
    client (hostile review of the builder change: they were dropped with the unit)."""
    path = tmp_path / "p.py"
    path.write_text(
        "from confluent_kafka import Producer\nfrom kresilient import producer_config\n"
        "p = Producer(producer_config({'bootstrap.servers': 'a:1,b:1'}))\n"
    )
    found = {(f.rule, f.line) for f in lint_paths([str(path)])}
    assert {("KR013", 3), ("KR014", 3)} <= found, found


def test_transactional_id_keyword_is_the_transactional_id(tmp_path: Path) -> None:
    """TransactionalProducer(config, transactional_id=...): the transactional rules run (the
    constructor refuses message.timeout.ms above transaction.timeout.ms; lint said nothing)."""
    path = tmp_path / "t.py"
    path.write_text(
        "from kresilient import TransactionalProducer\n"
        "q = TransactionalProducer({'bootstrap.servers': 'a:1,b:1', 'transaction.timeout.ms':"
        " 900000, 'message.timeout.ms': 1000000}, transactional_id='orders-1')\n"
    )
    found = [(f.rule, f.severity.name) for f in lint_paths([str(path)])]
    assert ("KR003", "ERROR") in found, found
