"""KR073: lint refuses exactly the ``ordering=`` combinations the consumers refuse (issue 40).

Every combination below is built for real (``ResilientConsumer(...)``, no broker needed: the
refusal comes at construction) and linted as Python source; lint reports KR073 exactly when
the runtime raises, for ``ResilientConsumer`` and for ``AsyncResilientConsumer`` (whose
``ordering="key"``/``"none"`` refuses ``max_concurrency`` other than 1 instead of the sync
consumer's options, which it does not have).
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
    # keyed mode combines unordered retry topics; the ordered policy is refused there
    "retry_topics ordered": (
        "retry_topics=RetryTopicPolicy(ordered=True)",
        {"retry_topics": RetryTopicPolicy(ordered=True)},
    ),
    "retry_topics ordered, replaced": (
        "retry_topics=RetryTopicPolicy(ordered=True).replace(delays=(5.0,))",
        {"retry_topics": RetryTopicPolicy(ordered=True).replace(delays=(5.0,))},
    ),
    "retry_topics ordered, replaced unordered": (
        "retry_topics=RetryTopicPolicy(ordered=True).replace(ordered=False)",
        {"retry_topics": RetryTopicPolicy(ordered=True).replace(ordered=False)},
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
    and sum(c.startswith("retry_topics") for c in combo) <= 1
]


def test_keyed_retry_topics_are_refused_only_when_ordered() -> None:
    # the parity cases above would pass with both sides refusing every retry_topics: pin the
    # runtime's answer (unordered combined, ordered named in the refusal)
    assert not _runtime_refuses("key", {"retry_topics": RetryTopicPolicy()})
    assert not _runtime_refuses("none", {"retry_topics": RetryTopicPolicy(ordered=False)})
    with pytest.raises(ConfigError, match=r"RetryTopicPolicy\(ordered=True\)"):
        ResilientConsumer(
            dict(CONFIG),
            ["t"],
            _handler,
            ordering="key",
            retry_topics=RetryTopicPolicy(ordered=True),
            install_signal_handlers=False,
        )


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
        "ordering='key', trace_spans='call')\n"
    )
    found = [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    assert len(found) == 1 and 'trace_spans="call"' in found[0].message


async def _async_handler(_msg: Message) -> None:
    return None


#: the asyncio consumer's own options, as Python source and as the runtime gets them
AIO_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "max_concurrency=4": ("max_concurrency=4", {"max_concurrency": 4}),
    "max_concurrency=1": ("max_concurrency=1", {"max_concurrency": 1}),
    "max_in_flight=0": ("max_in_flight=0", {"max_in_flight": 0}),
    "max_in_flight=8": ("max_in_flight=8", {"max_in_flight": 8}),
    "max_in_flight_bytes=0": ("max_in_flight_bytes=0", {"max_in_flight_bytes": 0}),
    # a negative literal is a literal (review 7 D5: lint said nothing of it)
    "max_in_flight=-1": ("max_in_flight=-1", {"max_in_flight": -1}),
    # refused by the ordering rule first (ConfigError), as KR073 says (review 7 D5)
    "max_concurrency=0": ("max_concurrency=0", {"max_concurrency": 0}),
}
AIO_CASES = [
    (ordering, combo)
    for ordering in ("partition", "key", "none", "keys")
    for n in range(3)
    for combo in itertools.combinations(AIO_OPTIONS, n)
    if len({c.split("=")[0] for c in combo}) == len(combo)
]


@pytest.mark.parametrize(("ordering", "combo"), AIO_CASES, ids=lambda v: str(v))
def test_lint_refuses_exactly_what_the_asyncio_consumer_refuses(
    tmp_path: Path, ordering: str, combo: tuple[str, ...]
) -> None:
    source = ", ".join([f"ordering={ordering!r}"] + [AIO_OPTIONS[c][0] for c in combo])
    extra: dict[str, Any] = {}
    for c in combo:
        extra.update(AIO_OPTIONS[c][1])
    try:
        AsyncResilientConsumer(dict(CONFIG), ["t"], _async_handler, ordering=ordering, **extra)  # type: ignore[arg-type]
        refused = False
    except ConfigError:
        refused = True
    except ValueError:  # max_concurrency=0 with ordering="partition": a bound, not KR073's
        assert extra.get("max_concurrency") == 0 and ordering == "partition", source
        refused = False
    found = _kr073(tmp_path, f"AsyncResilientConsumer(CONFIG, ['t'], handle, {source})")
    assert bool(found) == refused, (source, refused, found)
    if refused and ordering == "key" and combo == ("max_concurrency=4",):
        assert "max_concurrency" in found[0]


def test_the_sync_consumers_options_are_not_asked_of_the_asyncio_one(tmp_path: Path) -> None:
    # trace_spans is the sync consumer's: lint must not judge the asyncio one by it
    AsyncResilientConsumer(dict(CONFIG), ["t"], _async_handler, ordering="key")
    aio = "AsyncResilientConsumer(CONFIG, ['t'], handle, ordering='key', trace_spans='call')"
    assert _kr073(tmp_path, aio) == []
    # control: the same call to the sync consumer is refused, and flagged
    assert _runtime_refuses("key", {"trace_spans": "call"})
    assert _kr073(tmp_path, aio.removeprefix("Async"))


def test_keyed_mode_with_default_crash_loop_protection_is_taken_and_not_flagged(
    tmp_path: Path,
) -> None:
    # issue 40: crash-loop protection (on by default) combines with "key"/"none" now
    for ordering in ("key", "none"):
        assert not _runtime_refuses(ordering, {})
        assert (
            _kr073(tmp_path, f"ResilientConsumer(CONFIG, ['t'], handle, ordering={ordering!r})")
            == []
        )


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
def test_an_asyncio_consumer_given_a_valid_ordering_is_not_flagged(
    tmp_path: Path, ordering: str
) -> None:
    AsyncResilientConsumer(dict(CONFIG), ["t"], _async_handler, ordering="partition")
    src = tmp_path / "service.py"
    src.write_text(
        "from kresilient.aio import AsyncResilientConsumer\n"
        "MODE = 'key'\n"
        f"c = AsyncResilientConsumer({CONFIG!r}, ['t'], print, ordering={ordering}, "
        "max_concurrency=CONC)\n"
    )
    # a variable max_concurrency beside a variable ordering: not guessed either way
    found = [f for f in lint_paths([str(src)], Settings()) if f.rule == "KR073"]
    assert found == []


def test_a_window_under_one_is_flagged_as_both_consumers_refuse_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        ResilientConsumer(
            dict(CONFIG), ["t"], _handler, max_in_flight=0, install_signal_handlers=False
        )
    found = _kr073(
        tmp_path, "ResilientConsumer(consumer_config(CONFIG), ['t'], handle, max_in_flight=0)"
    )
    assert found and "max_in_flight=0" in found[0]
    # control: a window of 1 is taken, and not flagged
    ResilientConsumer(
        dict(CONFIG), ["t"], _handler, max_in_flight=1, install_signal_handlers=False
    ).close()
    assert _kr073(tmp_path, "ResilientConsumer(CONFIG, ['t'], handle, max_in_flight=1)") == []


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


#: transactions= beside the options it refuses (review 8 D4: lint said nothing of them, or
#: advised max_process_deaths=None for ordering="key", which the constructor still refused)
TXN_OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "retry_topics": ("retry_topics=RetryTopicPolicy()", {"retry_topics": RetryTopicPolicy()}),
    # built since: the blocked keys follow the transactions (put back at an abort)
    "retry_topics ordered": (
        "retry_topics=RetryTopicPolicy(ordered=True)",
        {"retry_topics": RetryTopicPolicy(ordered=True)},
    ),
    "retry_topics ordered=False": (
        "retry_topics=RetryTopicPolicy(ordered=False)",
        {"retry_topics": RetryTopicPolicy(ordered=False)},
    ),
    # review 10 D3: an ordered policy changed by .replace() is still ordered
    "retry_topics ordered, replaced": (
        "retry_topics=RetryTopicPolicy(ordered=True).replace(delays=(5.0,))",
        {"retry_topics": RetryTopicPolicy(ordered=True).replace(delays=(5.0,))},
    ),
    "retry_topics ordered, replaced unordered": (
        "retry_topics=RetryTopicPolicy(ordered=True).replace(ordered=False)",
        {"retry_topics": RetryTopicPolicy(ordered=True).replace(ordered=False)},
    ),
    "max_process_deaths=None": ("max_process_deaths=None", {"max_process_deaths": None}),
    'trace_spans="call"': ('trace_spans="call"', {"trace_spans": "call"}),
}
TXN_CASES = [
    (ordering, combo)
    for ordering in ("partition", "key", "none")
    for n in range(3)
    for combo in itertools.combinations(TXN_OPTIONS, n)
    if sum(c.startswith("retry_topics") for c in combo) <= 1
]


@pytest.mark.parametrize(("ordering", "combo"), TXN_CASES, ids=lambda v: str(v))
def test_lint_refuses_exactly_what_transactions_refuse(
    tmp_path: Path, ordering: str, combo: tuple[str, ...]
) -> None:
    from kresilient import TransactionPolicy

    extra: dict[str, Any] = {"transactions": TransactionPolicy(transactional_id="svc-0")}
    for c in combo:
        extra.update(TXN_OPTIONS[c][1])
    refused = _runtime_refuses(ordering, extra)
    source = ", ".join(
        [f"ordering={ordering!r}", "transactions=TransactionPolicy(transactional_id='svc-0')"]
        + [TXN_OPTIONS[c][0] for c in combo]
    )
    found = _kr073(
        tmp_path,
        f"ResilientConsumer(CONFIG, ['t'], handle, {source})\n"
        "from kresilient import TransactionPolicy",
    )
    assert bool(found) == refused, (source, refused, found)
    if refused:
        assert found[0].startswith("transactions= does not combine"), found
    # the same through consumer_config(...): the consumer's own arguments are still judged
    built = _kr073(
        tmp_path,
        f"ResilientConsumer(consumer_config(CONFIG), ['t'], handle, {source})\n"
        "from kresilient import TransactionPolicy",
    )
    assert bool(built) == refused, (source, refused, built)


#: AsyncResilientConsumer(transactions=): the sync engine drives it, one handler at a time in
#: offset order (issue 41): ordering other than "partition" and max_concurrency other than 1
#: are refused beside it
AIO_TXN_CASES = [
    (ordering, combo)
    for ordering in ("partition", "key", "none", "keys")
    for n in range(2)
    for combo in itertools.combinations(AIO_OPTIONS, n)
]


@pytest.mark.parametrize(("ordering", "combo"), AIO_TXN_CASES, ids=lambda v: str(v))
def test_lint_refuses_exactly_what_the_asyncio_consumer_refuses_with_transactions(
    tmp_path: Path, ordering: str, combo: tuple[str, ...]
) -> None:
    from kresilient import TransactionPolicy

    extra: dict[str, Any] = {"transactions": TransactionPolicy(transactional_id="svc-0")}
    for c in combo:
        extra.update(AIO_OPTIONS[c][1])
    try:
        consumer = AsyncResilientConsumer(
            dict(CONFIG),
            ["t"],
            _async_handler,
            ordering=ordering,  # type: ignore[arg-type]
            **extra,
        )
    except ConfigError:
        refused = True
    else:
        refused = False
        assert consumer._txn is not None
        consumer._txn.consumer.close()  # the sync engine's client, never run
    source = ", ".join(
        [f"ordering={ordering!r}", "transactions=TransactionPolicy(transactional_id='svc-0')"]
        + [AIO_OPTIONS[c][0] for c in combo]
    )
    found = _kr073(
        tmp_path,
        f"AsyncResilientConsumer(CONFIG, ['t'], handle, {source})\n"
        "from kresilient import TransactionPolicy",
    )
    assert bool(found) == refused, (source, refused, found)


#: AsyncResilientConsumer's crash-loop settings: the transactional engine's only
AIO_CRASH_CASES = [
    (txn, deaths, probe)
    for txn in (False, True)
    for deaths in (None, 3, 5, "DEATHS")
    for probe in (20, 7)
]


@pytest.mark.parametrize(("txn", "deaths", "probe"), AIO_CRASH_CASES, ids=lambda v: str(v))
def test_lint_refuses_the_asyncio_crash_loop_settings_exactly_as_the_consumer_does(
    tmp_path: Path, txn: bool, deaths: int | str | None, probe: int
) -> None:
    """Without transactions= the asyncio consumer has no crash-loop protection and refuses
    settings it would not apply; with it, they go to the transactional engine. A name lint
    cannot read (DEATHS) is not guessed."""
    from kresilient import TransactionPolicy

    extra: dict[str, Any] = {"crash_probe_records": probe}
    extra["max_process_deaths"] = 5 if deaths == "DEATHS" else deaths
    if txn:
        extra["transactions"] = TransactionPolicy(transactional_id="svc-0")
    try:
        consumer = AsyncResilientConsumer(dict(CONFIG), ["t"], _async_handler, **extra)
    except ConfigError:
        refused = True
    else:
        refused = False
        if consumer._txn is not None:
            consumer._txn.consumer.close()  # the sync engine's client, never run
    source = f"max_process_deaths={deaths}, crash_probe_records={probe}"
    if txn:
        source += ", transactions=TransactionPolicy(transactional_id='svc-0')"
    found = _kr073(
        tmp_path,
        f"AsyncResilientConsumer(CONFIG, ['t'], handle, {source})\n"
        "from kresilient import TransactionPolicy\nDEATHS = 5",
    )
    if deaths == "DEATHS":
        refused = refused and probe != 20  # lint reads only the literal one
    assert bool(found) == refused, (source, refused, found)
