"""Safe client configuration: defaults, validation and redaction of secrets.

:func:`producer_config` and :func:`consumer_config` take the configuration a user would hand to
``confluent_kafka.Producer`` / ``Consumer`` and return a NEW dict (the input is never mutated)
with kresilient's safe defaults filled in, after checking every key against the catalog of the
installed librdkafka:

* unknown keys, values out of range, consumer keys on a producer (and the reverse), and values
  that conflict with each other raise :class:`~kresilient.ConfigError` naming the key, before
  librdkafka sees them (librdkafka would fail later, or silently ignore the key);
* a value that weakens a guarantee (``acks=1``, ``enable.idempotence=false``, ...) raises
  :class:`~kresilient.UnsafeConfigError` naming the key, unless the caller lists that key in
  ``allow_unsafe``; then one warning is logged instead. ``allow_unsafe=("acks",)`` with
  ``acks=0``/``1`` implies ``enable.idempotence=false`` (idempotence requires acks=all), and
  the one warning names both;
* a client without ``bootstrap.servers`` (or its alias ``metadata.broker.list``) is refused
  with a :class:`~kresilient.ConfigError` naming the key (librdkafka's mock cluster,
  ``test.mock.num.brokers``, needs none).

Values may be Python-typed (``True``, ``5``) or strings (``"true"``, ``"5"``); scalar values are
returned as the strings librdkafka would parse. Callbacks (``error_cb``, ``on_delivery``, ...)
are passed through untouched.

Example::

    >>> cfg = producer_config({"bootstrap.servers": "127.0.0.1:9092"})
    >>> cfg["acks"], cfg["enable.idempotence"]
    ('all', 'true')
    >>> producer_config({"bootstrap.servers": "x", "acks": 1})
    Traceback (most recent call last):
    ...
    kresilient.errors.UnsafeConfigError: acks=1 weakens a guarantee: ...

:func:`redact` and :data:`SECRET_KEYS` keep passwords and keys out of sight; they delegate to
:mod:`kresilient.redaction`, the one redaction mechanism (free text, exceptions, log lines).

:func:`credentials_from_env` reads connection and security settings from documented
environment variables (:data:`CREDENTIAL_ENV`), each secret also from a file named by
``<VARIABLE>_FILE`` (the Docker/Kubernetes secrets convention); merge them explicitly::

    config = {**credentials_from_env(), "client.id": "orders"}   # explicit keys win
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal

import structlog

from . import _catalog as catalog
from . import redaction as _redaction
from .errors import ConfigError, UnsafeConfigError

__all__ = [
    "CONSUMER_DEFAULTS",
    "CREDENTIAL_ENV",
    "PRODUCER_DEFAULTS",
    "REDACTED",
    "REFUSALS",
    "SECRET_KEYS",
    "SHARE_CONSUMER_REFUSED",
    "consumer_config",
    "credentials_from_env",
    "is_secret",
    "producer_config",
    "redact",
    "refusals",
]

Role = Literal["producer", "consumer"]

#: What a secret value is replaced with (re-exported from :mod:`kresilient.redaction`).
REDACTED: Final = _redaction.REDACTED

#: Every configuration key whose value must never be printed (:mod:`kresilient.redaction`).
SECRET_KEYS: Final[frozenset[str]] = _redaction.SECRET_KEYS

#: Safe producer defaults, applied where the user set neither the key nor one of its aliases.
#: ``retries`` is unlimited, bounded by ``message.timeout.ms`` (librdkafka retries leadership
#: errors without consuming the retry budget anyway; the timeout is what ends a delivery).
PRODUCER_DEFAULTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "acks": "all",
        "enable.idempotence": "true",
        "max.in.flight.requests.per.connection": "5",
        "retries": "2147483647",
        "message.timeout.ms": "120000",
        "partitioner": "murmur2_random",
        "statistics.interval.ms": "5000",
        "socket.keepalive.enable": "true",
        "client.id": "kresilient-producer",
    }
)

#: Safe consumer defaults: offsets are stored only by the application after processing
#: (``enable.auto.offset.store=false``) and committed in the background; cooperative rebalances.
CONSUMER_DEFAULTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "enable.auto.commit": "true",
        "enable.auto.offset.store": "false",
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "isolation.level": "read_committed",
        "statistics.interval.ms": "5000",
        "socket.keepalive.enable": "true",
        "client.id": "kresilient-consumer",
    }
)

_PYTHON_TYPES: Final = frozenset({"python", "see dedicated API"})
_SHOWN_MAX: Final = 200
_LEADING_NUMBER: Final = re.compile(r"[-+]?\d+(?:\.\d*)?")
_SCOPE_NAME: Final = {"P": "producer", "C": "consumer"}
_EAGER_ASSIGNORS: Final = frozenset({"range", "roundrobin"})
_MAX_IN_FLIGHT_IDEMPOTENT: Final = 5

_log = structlog.get_logger("kresilient.config")


def is_secret(key: str) -> bool:
    """True when the value under ``key`` must never be logged or shown.

    The same test as :func:`kresilient.redaction.is_secret_key` (the one definition).
    """
    return _redaction.is_secret_key(key)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with every secret value replaced by :data:`REDACTED`.

    Delegates to :func:`kresilient.redaction.redact_config`.

    >>> redact({"sasl.username": "u", "sasl.password": "hunter2"})
    {'sasl.username': 'u', 'sasl.password': '[REDACTED]'}
    """
    return _redaction.redact_config(config)


# --------------------------------------------------------------------------- parsed view


@dataclass(frozen=True, kw_only=True, slots=True)
class _Setting:
    """One key as the user (or a default) set it, with its parsed value."""

    key: str  # the name as written (may be an alias)
    text: str  # the string handed to librdkafka
    value: object  # parsed: int, float, bool or lower-case str
    user: bool  # set by the caller (not a kresilient default)


class _View:
    """Effective settings by canonical librdkafka name (aliases resolved)."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.settings: dict[str, _Setting] = {}

    def get(self, canonical: str) -> _Setting | None:
        return self.settings.get(canonical)

    def value(self, canonical: str, default: object = None) -> object:
        s = self.settings.get(canonical)
        if s is not None:
            return s.value
        prop = catalog.lookup(canonical)
        if prop is None or prop.default is None:
            return default
        return _parse(prop, prop.default)

    def key(self, canonical: str) -> str:
        """The name the user wrote for ``canonical`` (for messages), else the canonical one."""
        s = self.settings.get(canonical)
        return s.key if s is not None else canonical

    def user_set(self, canonical: str) -> bool:
        s = self.settings.get(canonical)
        return s is not None and s.user


def _parse(prop: catalog.Property, text: str) -> object:
    """Parse a value that :meth:`Property.check_value` accepted into a comparable form."""
    low = text.strip().lower()
    if prop.type == "boolean":
        return low in ("true", "t", "1")
    if prop.type == "integer":
        if prop.canonical == "request.required.acks" and low == "all":
            return -1
        try:
            return int(low, 10)
        except ValueError:
            # check_value lets librdkafka's truncating reads through ("0.0", "1.5", "0,x"
            # read as 0 and 1, strtol-style): parse the same leading number instead of
            # raising a bare ValueError
            lead = _LEADING_NUMBER.match(low)
            if lead is None:
                raise _Refused(
                    "invalid-value", f"invalid value for {prop.name!r}: not a number", key=prop.name
                ) from None
            return int(float(lead.group()))
    if prop.type == "float":
        try:
            return float(low)
        except ValueError:
            lead = _LEADING_NUMBER.match(low)
            if lead is None:
                raise _Refused(
                    "invalid-value", f"invalid value for {prop.name!r}: not a number", key=prop.name
                ) from None
            return float(lead.group())
    return low


# --------------------------------------------------------------------------- the refusal table
#
# ONE table decides what the clients refuse and what `kresilient lint` calls an error
# (issue 36 #4): producer_config/consumer_config raise the first refusal of a config, lint
# reports every refusal of a file a kresilient client would read, with the same opt-out
# (``allow_unsafe=`` here, ``# kresilient: allow KEY`` in a file). Each row names the lint
# rules that report it and example configs it refuses (tests/test_lint_runtime_parity.py
# runs every example through both).


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusal:
    """Why a client refuses a config: one row of :data:`REFUSALS` on one key.

    ``key`` is the key as written (None for a missing key); ``unsafe`` refusals are
    :class:`~kresilient.UnsafeConfigError` and accepted by ``allow_unsafe``, the others are
    :class:`~kresilient.ConfigError` (no opt-out). ``lint_rules`` report it in lint.
    """

    row: str
    key: str | None
    value: str | None
    message: str
    unsafe: bool
    lint_rules: tuple[str, ...]

    def error(self) -> ConfigError:
        """The exception the client raises for it."""
        if self.unsafe:
            return UnsafeConfigError(self.message, key=self.key, value=self.value or "")
        return ConfigError(self.message, key=self.key)


#: A row's finder: (canonical name of the key to blame, message) for each hit.
_Finder = Callable[["_View"], Iterable[tuple[str, str]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class RefusalRow:
    """One thing the clients refuse. ``find`` is None for the checks made key by key while
    a config is read (unknown key, bad value ...); ``examples`` are minimal configs this row
    alone refuses (``bootstrap.servers`` and, for a consumer, ``group.id`` are added);
    ``allow`` is the key ``allow_unsafe`` names to accept an unsafe row's examples."""

    name: str
    roles: frozenset[Role]
    unsafe: bool
    lint_rules: tuple[str, ...]
    examples: tuple[Mapping[str, str], ...]
    find: _Finder | None = None
    allow: str | None = None


_BOTH: Final[frozenset[Role]] = frozenset({"producer", "consumer"})
_PRODUCER: Final[frozenset[Role]] = frozenset({"producer"})
_CONSUMER: Final[frozenset[Role]] = frozenset({"consumer"})


def _unsafe(canonical: str, is_unsafe: Callable[[object, _View], bool], reason: str) -> _Finder:
    """A finder for a value that weakens a guarantee (set by the user, not a default)."""

    def find(view: _View) -> Iterator[tuple[str, str]]:
        s = view.get(canonical)
        if s is not None and s.user and is_unsafe(s.value, view):
            yield (
                canonical,
                (
                    f"{s.key}={s.text} weakens a guarantee: {reason}. Pass "
                    f"allow_unsafe=({s.key!r},) to accept it"
                ),
            )

    return find


def _conflict(view: _View, canonical: str, message: str) -> tuple[str, str]:
    return canonical, f"{view.key(canonical)}: {message}"


def _idempotence_conflicts(view: _View) -> Iterator[tuple[str, str]]:
    if view.value("enable.idempotence") is not True:
        return
    needs = (
        ("request.required.acks", lambda v: v == -1, "must be all when enable.idempotence=true"),
        (
            "max.in.flight.requests.per.connection",
            lambda v: isinstance(v, int) and v <= _MAX_IN_FLIGHT_IDEMPOTENT,
            "must be <= 5 when enable.idempotence=true",
        ),
        ("message.send.max.retries", lambda v: v != 0, "must be >= 1 when enable.idempotence=true"),
        ("queuing.strategy", lambda v: v == "fifo", "must be fifo when enable.idempotence=true"),
    )
    for canonical, ok, why in needs:
        s = view.get(canonical)
        if s is not None and not ok(s.value):
            yield _conflict(
                view,
                canonical,
                f"{why} (set enable.idempotence=false, allowed as unsafe, or remove {s.key})",
            )


def _gapless_conflict(view: _View) -> Iterator[tuple[str, str]]:
    if (
        view.value("enable.idempotence") is not True
        and view.user_set("enable.gapless.guarantee")
        and view.value("enable.gapless.guarantee")
    ):
        yield _conflict(view, "enable.gapless.guarantee", "requires enable.idempotence=true")


def _transactional_conflicts(view: _View) -> Iterator[tuple[str, str]]:
    if not view.user_set("transactional.id"):
        return
    if view.value("enable.idempotence") is not True:
        yield _conflict(view, "enable.idempotence", "transactional.id requires idempotence")


def _transaction_timeout_conflict(view: _View) -> Iterator[tuple[str, str]]:
    if not view.user_set("transactional.id"):
        return
    timeout, txn = view.value("message.timeout.ms"), view.value("transaction.timeout.ms")
    if (
        view.user_set("message.timeout.ms")
        and isinstance(timeout, int)
        and isinstance(txn, int)
        and timeout > txn
    ):
        yield _conflict(
            view, "message.timeout.ms", f"must not exceed transaction.timeout.ms ({txn})"
        )


def _linger_conflict(view: _View) -> Iterator[tuple[str, str]]:
    timeout = view.value("message.timeout.ms")
    linger = view.get("queue.buffering.max.ms")
    if (
        linger is not None
        and isinstance(timeout, int)
        and timeout > 0
        and isinstance(linger.value, float | int)
        and linger.value >= timeout
    ):
        yield _conflict(
            view, "queue.buffering.max.ms", f"must be lower than message.timeout.ms ({timeout})"
        )


def _delivery_report_conflict(view: _View) -> Iterator[tuple[str, str]]:
    if view.value("delivery.report.only.error") is True:
        yield _conflict(
            view,
            "delivery.report.only.error",
            "kresilient needs a delivery report for every message to resolve its handles "
            "and to account for every message",
        )


def _classic(view: _View) -> bool:
    return view.value("group.protocol") != "consumer"


def _consumer_protocol_conflicts(view: _View) -> Iterator[tuple[str, str]]:
    if _classic(view):
        return
    for canonical in ("session.timeout.ms", "heartbeat.interval.ms", "group.protocol.type"):
        if view.user_set(canonical):
            yield _conflict(view, canonical, "is not supported with group.protocol=consumer")
    if view.user_set("partition.assignment.strategy"):
        yield _conflict(
            view,
            "partition.assignment.strategy",
            "is not supported with group.protocol=consumer (use group.remote.assignor)",
        )


def _poll_conflict(view: _View) -> Iterator[tuple[str, str]]:
    poll, session = view.value("max.poll.interval.ms"), view.value("session.timeout.ms")
    if _classic(view) and isinstance(poll, int) and isinstance(session, int) and poll < session:
        yield _conflict(view, "max.poll.interval.ms", f"must be >= session.timeout.ms ({session})")


def _assignor_conflict(view: _View) -> Iterator[tuple[str, str]]:
    strategy = view.value("partition.assignment.strategy")
    if _classic(view) and isinstance(strategy, str):
        names = {s.strip() for s in strategy.split(",") if s.strip()}
        if names & _EAGER_ASSIGNORS and "cooperative-sticky" in names:
            yield _conflict(
                view,
                "partition.assignment.strategy",
                "eager (range, roundrobin) and cooperative (cooperative-sticky) assignors "
                "must not be mixed",
            )


def _fetch_conflict(view: _View) -> Iterator[tuple[str, str]]:
    fetch_max, msg_max = view.value("fetch.max.bytes"), view.value("message.max.bytes")
    if (
        view.user_set("fetch.max.bytes")
        and isinstance(fetch_max, int)
        and isinstance(msg_max, int)
        and fetch_max < msg_max
    ):
        yield _conflict(view, "fetch.max.bytes", f"must be >= message.max.bytes ({msg_max})")


def _refresh_conflict(view: _View) -> Iterator[tuple[str, str]]:
    refresh = view.value("topic.metadata.refresh.interval.ms")
    if isinstance(refresh, int) and refresh <= 0:
        yield _conflict(
            view,
            "topic.metadata.refresh.interval.ms",
            f"{refresh} disables the periodic metadata refresh, so leader changes and new "
            "partitions are only noticed after errors (documented range 1000..3600000; "
            "default 300000)",
        )


def _max_age_conflict(view: _View) -> Iterator[tuple[str, str]]:
    refresh = view.value("topic.metadata.refresh.interval.ms")
    max_age = view.get("metadata.max.age.ms")
    if (
        max_age is not None
        and isinstance(refresh, int)
        and isinstance(max_age.value, int)
        and max_age.value < refresh
    ):
        yield _conflict(
            view,
            "metadata.max.age.ms",
            f"{max_age.value} is shorter than topic.metadata.refresh.interval.ms ({refresh}): "
            "cached metadata would expire before it is refreshed. In librdkafka the refresh "
            "period is topic.metadata.refresh.interval.ms (Java's metadata.max.age.ms); "
            "metadata.max.age.ms is the cache lifetime and should be about 3x that",
        )


def _backoff_conflict(view: _View) -> Iterator[tuple[str, str]]:
    backoff, backoff_max = (
        view.value("reconnect.backoff.ms"),
        view.value("reconnect.backoff.max.ms"),
    )
    if isinstance(backoff, int) and isinstance(backoff_max, int) and backoff_max < backoff:
        yield _conflict(view, "reconnect.backoff.max.ms", "must be >= reconnect.backoff.ms")


def _row(
    name: str,
    roles: frozenset[Role],
    lint_rules: tuple[str, ...],
    examples: tuple[Mapping[str, str], ...],
    find: _Finder | None = None,
    *,
    unsafe: bool = False,
    allow: str | None = None,
) -> RefusalRow:
    return RefusalRow(
        name=name,
        roles=roles,
        unsafe=unsafe,
        lint_rules=lint_rules,
        examples=tuple(MappingProxyType(dict(e)) for e in examples),
        find=find,
        allow=allow,
    )


#: Keys a share consumer (KIP-932) does not take, with who refuses them. ``"librdkafka"``:
#: librdkafka 2.16's share consumer fails to start ("... is not applicable for share
#: consumer"), with the key set to any value, its default included (tests/test_share_limits.py
#: checks each against the installed client). ``"kresilient"``: librdkafka takes it and
#: ignores it (a consumer-group offset or poll setting: a share group keeps its state on the
#: broker); ResilientShareConsumer refuses it so a setting that does nothing is not trusted.
#: ``share.acknowledgement.mode=implicit`` is refused by ResilientShareConsumer as unsafe
#: (acknowledged before the handler's outcome), not listed here. One table for the runtime
#: (:func:`kresilient.share.share_consumer_config`) and ``kresilient lint`` (KR071).
SHARE_CONSUMER_REFUSED: Final[Mapping[str, str]] = MappingProxyType(
    {
        **dict.fromkeys(
            (
                "allow.auto.create.topics",
                "auto.offset.reset",
                "consume.callback.max.messages",
                "enable.auto.commit",
                "enable.partition.eof",
                "fetch.error.backoff.ms",
                "fetch.queue.backoff.ms",
                "group.instance.id",
                "group.protocol",
                "group.protocol.type",
                "group.remote.assignor",
                "heartbeat.interval.ms",
                "isolation.level",
                "message.copy.max.bytes",
                "partition.assignment.strategy",
                "queued.max.messages.kbytes",
                "queued.min.messages",
                "session.timeout.ms",
                "socket.max.fails",
                "topic.blacklist",
            ),
            "librdkafka",
        ),
        **dict.fromkeys(
            ("auto.commit.interval.ms", "enable.auto.offset.store", "max.poll.interval.ms"),
            "kresilient",
        ),
    }
)


#: Everything ResilientProducer/ResilientConsumer refuse, in the order the clients check it
#: (the first refusal of a config is the one raised). Rows without ``find`` are checked key
#: by key while reading (:func:`_validated`, :func:`_require_bootstrap`).
REFUSALS: Final[tuple[RefusalRow, ...]] = (
    _row("unknown-key", _BOTH, ("KR005",), ({"acks.mode": "all"}, {"lingerms": "5"})),
    _row(
        "invalid-value",
        _BOTH,
        ("KR037", "KR006"),
        (
            {"socket.timeout.ms": "-5"},
            {"security.protocol": "tls"},
            {"statistics.interval.ms": "often"},
        ),
    ),
    _row("other-role-key", _BOTH, ("KR032",), ()),  # examples per role: see the parity test
    _row("alias-conflict", _BOTH, ("KR054",), ({"metadata.broker.list": "other:9092"},)),
    _row("bootstrap-required", _BOTH, ("KR054",), ()),
    _row("group-id-required", _CONSUMER, ("KR054",), ()),
    # -- values that weaken a guarantee: UnsafeConfigError, allow_unsafe accepts them
    _row(
        "acks-not-all",
        _PRODUCER,
        ("KR006", "KR007"),
        ({"acks": "1"}, {"acks": "0"}, {"request.required.acks": "1"}),
        _unsafe(
            "request.required.acks",
            lambda v, _: v != -1,
            "the leader acknowledges before all in-sync replicas have the record, so a "
            "leader failure loses acknowledged messages (use acks=all)",
        ),
        unsafe=True,
        allow="acks",
    ),
    _row(
        "idempotence-off",
        _PRODUCER,
        ("KR008",),
        ({"enable.idempotence": "false"},),
        _unsafe(
            "enable.idempotence",
            lambda v, _: v is False,
            "without idempotence a retried batch can be written twice or out of order",
        ),
        unsafe=True,
        allow="enable.idempotence",
    ),
    _row(
        "in-flight-above-5",
        _PRODUCER,
        ("KR001", "KR009"),
        ({"max.in.flight.requests.per.connection": "10"}, {"max.in.flight": "6"}),
        _unsafe(
            "max.in.flight.requests.per.connection",
            lambda v, _: isinstance(v, int) and v > _MAX_IN_FLIGHT_IDEMPOTENT,
            "more than 5 in-flight requests per connection can reorder messages on retry "
            "and is incompatible with idempotence",
        ),
        unsafe=True,
        allow="max.in.flight.requests.per.connection",
    ),
    _row(
        "retries-zero",
        _PRODUCER,
        ("KR001", "KR010"),
        ({"retries": "0"}, {"message.send.max.retries": "0"}),
        _unsafe(
            "message.send.max.retries",
            lambda v, _: v == 0,
            "without retries, transient errors (NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT) "
            "fail messages at once",
        ),
        unsafe=True,
        allow="retries",
    ),
    _row(
        "message-timeout-infinite",
        _PRODUCER,
        ("KR054",),
        ({"message.timeout.ms": "0"}, {"delivery.timeout.ms": "0"}),
        _unsafe(
            "message.timeout.ms",
            lambda v, _: v == 0,
            "0 makes the delivery timeout infinite: an undeliverable message is never "
            "reported and flush() can block forever",
        ),
        unsafe=True,
        allow="message.timeout.ms",
    ),
    _row(
        "auto-offset-store",
        _CONSUMER,
        ("KR018",),
        ({"enable.auto.offset.store": "true"},),
        _unsafe(
            "enable.auto.offset.store",
            lambda v, view: v is True and view.value("enable.auto.commit") is True,
            "offsets of messages are stored (and auto-committed) when they are handed to "
            "the application, before they are processed: a crash loses them",
        ),
        unsafe=True,
        allow="enable.auto.offset.store",
    ),
    _row(
        "offset-reset-latest",
        _CONSUMER,
        ("KR021",),
        ({"auto.offset.reset": "latest"}, {"auto.offset.reset": "largest"}),
        _unsafe(
            "auto.offset.reset",
            lambda v, _: v in ("latest", "largest", "end"),
            "a new group or an out-of-range offset silently skips the backlog",
        ),
        unsafe=True,
        allow="auto.offset.reset",
    ),
    _row(
        "read-uncommitted",
        _CONSUMER,
        ("KR029",),
        ({"isolation.level": "read_uncommitted"},),
        _unsafe(
            "isolation.level",
            lambda v, _: v == "read_uncommitted",
            "records of aborted transactions are delivered to the application",
        ),
        unsafe=True,
        allow="isolation.level",
    ),
    _row(
        "statistics-off",
        _BOTH,
        ("KR054",),
        ({"statistics.interval.ms": "0"},),
        _unsafe(
            "statistics.interval.ms",
            lambda v, _: v == 0,
            "statistics feed the leadership monitor and health(); 0 turns them off",
        ),
        unsafe=True,
        allow="statistics.interval.ms",
    ),
    _row(
        "tls-verification-off",
        _BOTH,
        ("KR034",),
        ({"enable.ssl.certificate.verification": "false"},),
        _unsafe(
            "enable.ssl.certificate.verification",
            lambda v, _: v is False,
            "broker certificates are not verified (man-in-the-middle risk)",
        ),
        unsafe=True,
        allow="enable.ssl.certificate.verification",
    ),
    _row(
        "hostname-verification-off",
        _BOTH,
        ("KR034",),
        ({"ssl.endpoint.identification.algorithm": "none"},),
        _unsafe(
            "ssl.endpoint.identification.algorithm",
            lambda v, _: v == "none",
            "broker host names are not checked against their certificates (man-in-the-middle risk)",
        ),
        unsafe=True,
        allow="ssl.endpoint.identification.algorithm",
    ),
    # -- conflicts: ConfigError, no opt-out (librdkafka or kresilient cannot run them)
    _row(
        "gapless-without-idempotence",
        _PRODUCER,
        ("KR004",),
        ({"enable.gapless.guarantee": "true", "enable.idempotence": "false"},),
        _gapless_conflict,
    ),
    _row(
        "transactional-without-idempotence",
        _PRODUCER,
        ("KR003",),
        ({"transactional.id": "t", "enable.idempotence": "false"},),
        _transactional_conflicts,
    ),
    _row(
        "idempotence-constraints",
        _PRODUCER,
        ("KR001",),
        ({"enable.idempotence": "true", "queuing.strategy": "lifo"},),
        _idempotence_conflicts,
    ),
    _row(
        "linger-not-below-timeout",
        _PRODUCER,
        ("KR002",),
        ({"linger.ms": "130000"}, {"message.timeout.ms": "5000", "linger.ms": "5000"}),
        _linger_conflict,
    ),
    _row(
        "message-timeout-above-transaction-timeout",
        _PRODUCER,
        ("KR003",),
        (
            {
                "transactional.id": "t",
                "message.timeout.ms": "70000",
                "transaction.timeout.ms": "60000",
            },
        ),
        _transaction_timeout_conflict,
    ),
    _row(
        "delivery-report-only-error",
        _PRODUCER,
        ("KR054",),
        ({"delivery.report.only.error": "true"},),
        _delivery_report_conflict,
    ),
    _row(
        "consumer-protocol-client-settings",
        _CONSUMER,
        ("KR024",),
        (
            {"group.protocol": "consumer", "session.timeout.ms": "45000"},
            {"group.protocol": "consumer", "partition.assignment.strategy": "range"},
        ),
        _consumer_protocol_conflicts,
    ),
    _row(
        "poll-interval-below-session",
        _CONSUMER,
        ("KR022",),
        ({"max.poll.interval.ms": "10000", "session.timeout.ms": "45000"},),
        _poll_conflict,
    ),
    _row(
        "mixed-assignors",
        _CONSUMER,
        ("KR025",),
        ({"partition.assignment.strategy": "range,cooperative-sticky"},),
        _assignor_conflict,
    ),
    _row(
        "fetch-below-message-max",
        _CONSUMER,
        ("KR028",),
        ({"fetch.max.bytes": "1000", "message.max.bytes": "2000"},),
        _fetch_conflict,
    ),
    _row(
        "metadata-refresh-off",
        _BOTH,
        ("KR016",),
        ({"topic.metadata.refresh.interval.ms": "-1"},),
        _refresh_conflict,
    ),
    _row(
        "metadata-max-age-below-refresh",
        _BOTH,
        ("KR039",),
        ({"metadata.max.age.ms": "60000"},),
        _max_age_conflict,
    ),
    _row(
        "reconnect-backoff-max-below-backoff",
        _BOTH,
        ("KR015",),
        ({"reconnect.backoff.ms": "5000", "reconnect.backoff.max.ms": "1000"},),
        _backoff_conflict,
    ),
)


def _table_refusals(
    view: _View, role: Role, allowed: frozenset[str]
) -> tuple[list[Refusal], list[Refusal]]:
    """(refused, accepted): every row's verdict on ``view``; ``accepted`` holds the unsafe
    refusals ``allowed`` (canonical names) lets through."""
    refused: list[Refusal] = []
    accepted: list[Refusal] = []
    blamed: set[str] = set()  # one refusal per key: the first says what to change
    for row in REFUSALS:
        if row.find is None or role not in row.roles:
            continue
        for canonical, message in row.find(view):
            if canonical in blamed:
                continue
            s = view.get(canonical)
            found = Refusal(
                row=row.name,
                key=view.key(canonical),
                value=s.text if s is not None else None,
                message=message,
                unsafe=row.unsafe,
                lint_rules=row.lint_rules,
            )
            if row.unsafe and canonical in allowed:
                accepted.append(found)
            else:
                blamed.add(canonical)
                refused.append(found)
    return refused, accepted


# --------------------------------------------------------------------------- entry points


def _unknown_key(key: str) -> ConfigError:
    hint = ""
    kinds = catalog.java_client_kinds(key)
    if kinds:
        hint = f" (a Java {'/'.join(kinds)} property that librdkafka does not support)"
    suggestions = catalog.suggest(key)
    if suggestions:
        hint += f"; did you mean {', '.join(repr(s) for s in suggestions)}?"
    return ConfigError(f"unknown configuration property {key!r}{hint}", key=key)


class _Refused(ConfigError):
    """A key-by-key refusal, tagged with its row of :data:`REFUSALS`."""

    def __init__(self, row: str, message: str, *, key: str | None) -> None:
        super().__init__(message, key=key)
        self.row = row


def _validated(key: object, raw: object, role: Role) -> tuple[str, object, _Setting | None]:
    """Check one user key; return (key, value for librdkafka, parsed setting or None)."""
    if not isinstance(key, str):
        raise _Refused(
            "invalid-value",
            f"configuration keys must be strings, got {type(key).__name__}",
            key=None,
        )
    prop = catalog.lookup(key)
    if prop is None:
        unknown = _unknown_key(key)
        raise _Refused("unknown-key", str(unknown), key=key)
    other = _SCOPE_NAME.get(prop.scope)
    if other is not None and other != role:
        raise _Refused(
            "other-role-key", f"{key!r} is a {other} property; a {role} would ignore it", key=key
        )
    if prop.type in _PYTHON_TYPES:
        if isinstance(raw, Mapping):
            raise _Refused(
                "invalid-value",
                f"{key!r}: nested configuration is not supported; set topic properties at "
                "the top level",
                key=key,
            )
        return key, raw, None
    if not isinstance(raw, str | bool | int | float):
        raise _Refused(
            "invalid-value",
            f"{key!r}: expected a string, bool, int or float, got {type(raw).__name__}",
            key=key,
        )
    text = catalog.to_config_string(raw)
    why = prop.check_value(text)
    if why is not None:
        # a value quoted in the message is cut: a 300 kB value made every error (and its
        # redaction pass) that large
        got = repr(raw)
        got = got if len(got) <= _SHOWN_MAX else f"{got[:_SHOWN_MAX]}... ({len(got)} chars)"
        shown = "" if is_secret(key) else f" (got {got})"
        raise _Refused("invalid-value", f"invalid value for {key!r}: {why}{shown}", key=key)
    return key, text, _Setting(key=key, text=text, value=_parse(prop, text), user=True)


_ROWS: Final[Mapping[str, RefusalRow]] = MappingProxyType({r.name: r for r in REFUSALS})


def _as_refusal(exc: _Refused, value: object = None) -> Refusal:
    row = _ROWS[exc.row]
    text = None if value is None or exc.key is None or is_secret(exc.key) else str(value)
    return Refusal(
        row=row.name,
        key=exc.key,
        value=text,
        message=str(exc),
        unsafe=False,
        lint_rules=row.lint_rules,
    )


@dataclass(kw_only=True, slots=True)
class _Assembled:
    out: dict[str, Any]
    view: _View
    refused: list[Refusal]
    accepted: list[Refusal]
    implied: tuple[str, str] | None


def _assemble(
    user: Mapping[str, Any],
    role: Role,
    defaults: Mapping[str, str],
    allowed: frozenset[str],
    *,
    collect: bool,
    fragment: bool = False,
) -> _Assembled:
    """Validate ``user``, apply ``defaults`` and judge the result by :data:`REFUSALS`.

    ``collect=False`` (the clients) raises at the first key-by-key refusal; ``collect=True``
    (lint) records every one and goes on. ``fragment`` (a file that is part of a config)
    skips the keys another role or no client reads and the required keys a file may leave
    to its application."""
    if not isinstance(user, Mapping):
        raise ConfigError(f"configuration must be a mapping, got {type(user).__name__}", key=None)
    out: dict[str, Any] = {}
    view = _View(role)
    early: list[Refusal] = []
    for raw_key, raw in user.items():
        try:
            key, value, setting = _validated(raw_key, raw, role)
        except _Refused as exc:
            if not collect:
                raise
            if not (fragment and exc.row in ("other-role-key", "unknown-key", "invalid-value")):
                early.append(_as_refusal(exc, raw))
            continue
        out[key] = value
        if setting is None:
            continue
        canonical = catalog.lookup(key).canonical  # type: ignore[union-attr]
        previous = view.settings.get(canonical)
        if previous is not None and previous.value != setting.value:
            clash = _Refused(
                "alias-conflict",
                f"{previous.key!r} and {key!r} are the same property with different values",
                key=key,
            )
            if not collect:
                raise clash
            early.append(_as_refusal(clash))
        view.settings[canonical] = setting
    if not fragment:
        for missing in _required(view, user, role):
            if not collect:
                raise missing
            early.append(_as_refusal(missing))
    transactional = "transactional.id" in view.settings
    for key, text in defaults.items():
        prop = catalog.lookup(key)
        assert prop is not None, key  # guarded by tests
        if prop.canonical in view.settings:
            continue
        if transactional and prop.canonical == "message.timeout.ms":
            continue  # librdkafka derives it from transaction.timeout.ms
        if (
            role == "consumer"
            and key == "partition.assignment.strategy"
            and (view.value("group.protocol") == "consumer")
        ):
            continue
        out[key] = text
        view.settings[prop.canonical] = _Setting(
            key=key, text=text, value=_parse(prop, text), user=False
        )
    implied = _imply_idempotence_off(view, role, allowed, out) if role == "producer" else None
    refused, accepted = _table_refusals(view, role, allowed | ({implied[0]} if implied else set()))
    return _Assembled(
        out=out, view=view, refused=early + refused, accepted=accepted, implied=implied
    )


def _build(
    user: Mapping[str, Any],
    role: Role,
    defaults: Mapping[str, str],
    allow_unsafe: Iterable[str],
    logger: Any,
) -> dict[str, Any]:
    allowed = _canonical_names(allow_unsafe)
    done = _assemble(user, role, defaults, allowed, collect=False)
    if done.refused:
        raise done.refused[0].error()
    view, implied = done.view, done.implied
    accepted = [(r.key or "", r.value or "") for r in done.accepted]
    if implied is not None:
        accepted.append((implied[1], "false"))
    if accepted:
        note = "allowed explicitly with allow_unsafe; a guarantee is weakened"
        acks = view.get("request.required.acks")
        if implied is not None and acks is not None:
            note += (
                f"; {implied[1]}=false is implied by {acks.key}={acks.text} "
                "(idempotence requires acks=all)"
            )
        (logger or _log).warning(
            "unsafe_config_accepted",
            role=role,
            settings={k: v for k, v in accepted},
            note=note,
        )
    return done.out


def refusals(
    user: Mapping[str, Any],
    role: Role,
    *,
    allow_unsafe: Iterable[str] = (),
    fragment: bool = False,
) -> tuple[list[Refusal], list[Refusal]]:
    """(refused, accepted): every refusal :func:`producer_config` / :func:`consumer_config`
    would make of ``user`` (they raise the first), and the unsafe ones ``allow_unsafe``
    accepts. ``kresilient lint`` judges files by this, the one table (:data:`REFUSALS`).

    ``fragment=True`` judges a file that is one part of a config: keys another role, or no
    librdkafka client, reads are left to the linter's own rules, and ``bootstrap.servers``
    / ``group.id`` may be supplied by the application. Unknown names in ``allow_unsafe``
    are ignored (lint reports them)."""
    allowed = frozenset(
        p.canonical for p in (catalog.lookup(n) for n in allow_unsafe) if p is not None
    )
    defaults = PRODUCER_DEFAULTS if role == "producer" else CONSUMER_DEFAULTS
    done = _assemble(user, role, defaults, allowed, collect=True, fragment=fragment)
    return done.refused, done.accepted


def _imply_idempotence_off(
    view: _View, role: Role, allowed: frozenset[str], out: dict[str, Any]
) -> tuple[str, str] | None:
    """``allow_unsafe=("acks",)`` with a weaker acks turns idempotence off (it requires
    acks=all) unless the user set ``enable.idempotence=true`` themselves (then the conflict is
    theirs, a ConfigError). Returns (canonical, key as written) of the implied setting."""
    acks = view.get("request.required.acks")
    if acks is None or not acks.user or acks.value == -1:
        return None
    if "request.required.acks" not in allowed:
        return None  # refused by the acks-not-all row with its own message
    idem = view.get("enable.idempotence")
    if idem is not None and idem.user:
        if idem.value is True:
            return None  # explicit contradiction: the idempotence-constraints row names it
        return ("enable.idempotence", idem.key)  # already off: implied, not a second opt-out
    key = idem.key if idem is not None else "enable.idempotence"
    out[key] = "false"
    view.settings["enable.idempotence"] = _Setting(key=key, text="false", value=False, user=False)
    return ("enable.idempotence", key)


def _required(view: _View, user: Mapping[str, Any], role: Role) -> Iterator[_Refused]:
    """No broker list: librdkafka would start and wait forever for a cluster it cannot name;
    no group.id: a consumer cannot subscribe."""
    servers = view.get("metadata.broker.list")
    if not (servers is not None and servers.text.strip()) and "test.mock.num.brokers" not in user:
        key = servers.key if servers is not None else "bootstrap.servers"
        yield _Refused(
            "bootstrap-required",
            f"{key} is required: a {role} needs the broker list to connect to "
            "(e.g. {'bootstrap.servers': 'host1:9092,host2:9092'})",
            key=key,
        )
    if role == "consumer":
        group = view.get("group.id")
        if group is None or not group.text.strip():
            yield _Refused(
                "group-id-required", "group.id is required for a consumer", key="group.id"
            )


def _canonical_names(names: Iterable[str]) -> frozenset[str]:
    if isinstance(names, str):
        names = (names,)
    result = set()
    for name in names:
        prop = catalog.lookup(name)
        if prop is None:
            raise ConfigError(f"allow_unsafe names an unknown property {name!r}", key=name)
        result.add(prop.canonical)
    return frozenset(result)


def producer_config(
    user: Mapping[str, Any], *, allow_unsafe: Iterable[str] = (), logger: Any = None
) -> dict[str, Any]:
    """Validate ``user`` and return a copy with kresilient's safe producer defaults.

    Raises :class:`~kresilient.ConfigError` (unknown key, bad value, conflict, consumer-only
    key, no ``bootstrap.servers``) or :class:`~kresilient.UnsafeConfigError` (a weakening value
    not in ``allow_unsafe``), each naming the key. ``logger`` receives the one warning logged
    when ``allow_unsafe`` lets a weakening value through.

    ``allow_unsafe=("acks",)`` with ``acks`` 0 or 1 also turns idempotence off (it requires
    acks=all): the one warning names both settings. Setting ``enable.idempotence=true``
    explicitly together with a weaker ``acks`` stays a :class:`~kresilient.ConfigError`.
    """
    return _build(user, "producer", PRODUCER_DEFAULTS, allow_unsafe, logger)


def consumer_config(
    user: Mapping[str, Any], *, allow_unsafe: Iterable[str] = (), logger: Any = None
) -> dict[str, Any]:
    """Validate ``user`` and return a copy with kresilient's safe consumer defaults.

    Defaults make "commit only after processing" true: ``enable.auto.offset.store=false``
    (the application stores offsets after handling a message), background commits of stored
    offsets, ``auto.offset.reset=earliest`` and the cooperative-sticky assignor. Errors as in
    :func:`producer_config`; ``group.id`` is required.
    """
    return _build(user, "consumer", CONSUMER_DEFAULTS, allow_unsafe, logger)


#: Environment variable -> client property read by :func:`credentials_from_env`. Each may
#: instead be given as ``<VARIABLE>_FILE`` naming a file that holds the value (one trailing
#: newline is dropped), e.g. ``KAFKA_SASL_PASSWORD_FILE=/run/secrets/kafka``.
CREDENTIAL_ENV: Final[Mapping[str, str]] = MappingProxyType(
    {
        "KAFKA_BOOTSTRAP_SERVERS": "bootstrap.servers",
        "KAFKA_SECURITY_PROTOCOL": "security.protocol",
        "KAFKA_SASL_MECHANISM": "sasl.mechanism",
        "KAFKA_SASL_USERNAME": "sasl.username",
        "KAFKA_SASL_PASSWORD": "sasl.password",
        "KAFKA_SSL_CA_LOCATION": "ssl.ca.location",
        "KAFKA_SSL_CERTIFICATE_LOCATION": "ssl.certificate.location",
        "KAFKA_SSL_KEY_LOCATION": "ssl.key.location",
        "KAFKA_SSL_KEY_PASSWORD": "ssl.key.password",
    }
)


def credentials_from_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Client settings from the variables in :data:`CREDENTIAL_ENV` (default ``os.environ``).

    Returns only what is set, as a new dict to merge under your own keys
    (``{**credentials_from_env(), **config}``); nothing is picked up implicitly, so a variable
    left in a shell never silently changes a client that did not ask for it. ``VAR_FILE``
    reads the value from that file. Raises :class:`~kresilient.ConfigError` naming the
    variable (never its value) when both ``VAR`` and ``VAR_FILE`` are set, when the file
    cannot be read, or when the value is empty.
    """
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for var, key in CREDENTIAL_ENV.items():
        direct, path = env.get(var), env.get(f"{var}_FILE")
        if direct is not None and path is not None:
            raise ConfigError(f"both {var} and {var}_FILE are set; set one of them", key=key)
        if path is not None:
            try:
                value = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise ConfigError(
                    f"{var}_FILE={path}: cannot read the {key} file ({reason})", key=key
                ) from None
            value = value[:-1] if value.endswith("\n") else value
            value = value[:-1] if value.endswith("\r") else value
            source = f"{var}_FILE={path}"
        elif direct is not None:
            value, source = direct, var
        else:
            continue
        if not value.strip():
            raise ConfigError(f"{source} is empty: {key} needs a value", key=key)
        out[key] = value
    return out
