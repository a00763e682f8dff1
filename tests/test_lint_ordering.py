"""KR073: lint refuses exactly the ``ordering=`` combinations the consumers refuse (issue 40).

Every combination below is built for real (``ResilientConsumer(...)``, no broker needed: the
refusal comes at construction) and linted as Python source; lint reports KR073 exactly when
the runtime raises. ``AsyncResilientConsumer`` takes no ``ordering`` argument yet.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from kresilient import ResilientConsumer
from kresilient.aio import AsyncResilientConsumer
from kresilient.consumer import RetryTopicPolicy
from kresilient.errors import ConfigError
from kresilient.lint import lint_paths
from kresilient.lint.settings import Settings

CONFIG = {"bootstrap.servers": "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", "group.id": "g"}
#: each option as Python source and as the object the runtime gets
OPTIONS: dict[str, tuple[str, Any]] = {
    "max_process_deaths=None": ("max_process_deaths=None", {"max_process_deaths": None}),
    "max_process_deaths=2": ("max_process_deaths=2", {"max_process_deaths": 2}),
    'trace_spans="call"': ('trace_spans="call"', {"trace_spans": "call"}),
    "retry_topics": (
        "retry_topics=RetryTopicPolicy()",
        {"retry_topics": RetryTopicPolicy()},
    ),
}


def _handler(_msg: Message) -> None:
    return None


def _runtime_refuses(ordering: str, extra: dict[str, Any]) -> bool:
    try:
        consumer = ResilientConsumer(
            dict(CONFIG), ["t"], _handler, ordering=ordering, install_signal_handlers=False, **extra
        )
    except ConfigError:
        return True
    consumer.close()
    return False


def _kr073(tmp_path: Path, call: str) -> list[str]:
    src = tmp_path / "service.py"
    src.write_text(
        "from kresilient import ResilientConsumer\n"
        "from kresilient.aio import AsyncResilientConsumer\n"
        "from kresilient.config import consumer_config\n"
        "from kresilient.consumer import RetryTopicPolicy\n"
        "def handle(msg): ...\n"
        f"CONFIG = {CONFIG!r}\n"
        f"consumer = {call}\n"
    )
    return [f.message for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]


CASES = [
    (ordering, combo)
    for ordering in ("partition", "key", "none")
    for n in range(3)
    for combo in itertools.combinations(OPTIONS, n)
    if not ("max_process_deaths=None" in combo and "max_process_deaths=2" in combo)
]


@pytest.mark.parametrize(("ordering", "combo"), CASES, ids=lambda v: str(v))
def test_lint_refuses_exactly_what_the_consumer_refuses(
    tmp_path: Path, ordering: str, combo: tuple[str, ...]
) -> None:
    source = ", ".join([f"ordering={ordering!r}"] + [OPTIONS[c][0] for c in combo])
    extra: dict[str, Any] = {}
    for c in combo:
        extra.update(OPTIONS[c][1])
    refused = _runtime_refuses(ordering, extra)
    found = _kr073(tmp_path, f"ResilientConsumer(CONFIG, ['t'], handle, {source})")
    assert bool(found) == refused, (source, refused, found)
    # the same through consumer_config(...): the inner call's unit is judged apart, and the
    # consumer's own arguments still here
    built = _kr073(tmp_path, f"ResilientConsumer(consumer_config(CONFIG), ['t'], handle, {source})")
    assert bool(built) == refused, (source, refused, built)


def test_kr073_reads_options_around_a_config_builder(tmp_path: Path) -> None:
    src = tmp_path / "service.py"
    src.write_text(
        "from kresilient import ResilientConsumer\n"
        "from kresilient.config import consumer_config\n"
        "def handle(msg): ...\n"
        f"consumer = ResilientConsumer(consumer_config({CONFIG!r}), ['t'], handle, "
        "ordering='key')\n"
    )
    found = [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    assert len(found) == 1 and "max_process_deaths=None" in found[0].message


def test_an_asyncio_consumer_given_an_ordering_is_flagged_as_the_runtime_refuses_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(TypeError, match="ordering"):
        AsyncResilientConsumer(dict(CONFIG), ["t"], _handler, ordering="key")  # type: ignore[call-arg]
    found = _kr073(tmp_path, "AsyncResilientConsumer(CONFIG, ['t'], handle, ordering='key')")
    assert found and "AsyncResilientConsumer" in found[0]
    # control: without ordering, nothing
    assert _kr073(tmp_path, "AsyncResilientConsumer(CONFIG, ['t'], handle)") == []


def test_an_ordering_lint_cannot_read_is_not_guessed(tmp_path: Path) -> None:
    # ordering from a variable: not known before run time, no finding either way
    assert _kr073(tmp_path, "ResilientConsumer(CONFIG, ['t'], handle, ordering=MODE)") == []
