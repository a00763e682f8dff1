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


#: (source of the call's arguments after the handler, the same for the runtime, module
#: source defining names it uses): a ** argument or a name may carry any option
SPELLINGS: list[tuple[str, dict[str, Any], str]] = [
    (
        "ordering='key', **OPTS",
        {"ordering": "key", "max_process_deaths": None},
        "OPTS = {'max_process_deaths': None}",
    ),
    (
        "ordering='key', **{'max_process_deaths': None}",
        {"ordering": "key", "max_process_deaths": None},
        "",
    ),
    ("**{'ordering': 'key'}", {"ordering": "key"}, ""),
    (
        "**{'ordering': 'key', 'max_process_deaths': None}",
        {"ordering": "key", "max_process_deaths": None},
        "",
    ),
    (
        "ordering='key', max_process_deaths=None, retry_topics=RT",
        {"ordering": "key", "max_process_deaths": None, "retry_topics": None},
        "RT = None",
    ),
    (
        "ordering='key', max_process_deaths=None, retry_topics=RetryTopicPolicy()",
        {"ordering": "key", "max_process_deaths": None, "retry_topics": RetryTopicPolicy()},
        "",
    ),
    (
        "ordering='key', max_process_deaths=DEATHS",
        {"ordering": "key", "max_process_deaths": None},
        "DEATHS = None",
    ),
    (
        "ordering='KEY', max_process_deaths=None",
        {"ordering": "KEY", "max_process_deaths": None},
        "",
    ),
]


@pytest.mark.parametrize(
    ("args", "runtime_kw", "prelude"), SPELLINGS, ids=[s[0] for s in SPELLINGS]
)
def test_kr073_never_guesses_what_a_splat_or_a_name_carries(
    tmp_path: Path, args: str, runtime_kw: dict[str, Any], prelude: str
) -> None:
    # lint reports only what it can read: no finding where the runtime accepts the call
    try:
        ResilientConsumer(
            dict(CONFIG), ["t"], _handler, install_signal_handlers=False, **runtime_kw
        ).close()
        refused = False
    except ConfigError:
        refused = True
    src = tmp_path / "service.py"
    src.write_text(
        "from kresilient import ResilientConsumer\n"
        "from kresilient.consumer import RetryTopicPolicy\n"
        "def handle(msg): ...\n"
        f"CONFIG = {CONFIG!r}\n"
        f"{prelude}\n"
        f"consumer = ResilientConsumer(CONFIG, ['t'], handle, {args})\n"
    )
    found = [f.message for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    assert bool(found) == refused, (args, refused, found)


@pytest.mark.parametrize("ordering", ["'partition'", "MODE"])
def test_an_asyncio_consumer_given_any_ordering_is_flagged(tmp_path: Path, ordering: str) -> None:
    with pytest.raises(TypeError, match="ordering"):
        AsyncResilientConsumer(dict(CONFIG), ["t"], _handler, ordering="partition")  # type: ignore[call-arg]
    src = tmp_path / "service.py"
    src.write_text(
        "from kresilient.aio import AsyncResilientConsumer\n"
        "MODE = 'partition'\n"
        f"c = AsyncResilientConsumer({CONFIG!r}, ['t'], print, ordering={ordering})\n"
    )
    found = [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    assert len(found) == 1


def test_a_batch_handler_named_by_its_def_is_known_to_be_given(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="batch_handler"):
        ResilientConsumer(
            dict(CONFIG),
            ["t"],
            batch_handler=lambda msgs: None,
            ordering="key",
            max_process_deaths=None,
            install_signal_handlers=False,
        )
    src = tmp_path / "service.py"
    body = (
        "ResilientConsumer(CONFIG, ['t'], batch_handler=BATCH, ordering='key', "
        "max_process_deaths=None)"
    )
    src.write_text(
        "from kresilient import ResilientConsumer\n"
        f"CONFIG = {CONFIG!r}\n"
        "def BATCH(msgs): ...\n"
        f"c = {body}\n"
    )
    assert [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    # control: the same name bound to something lint cannot read is not guessed
    src.write_text(
        f"from kresilient import ResilientConsumer\nCONFIG = {CONFIG!r}\nBATCH = None\nc = {body}\n"
    )
    assert not [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
