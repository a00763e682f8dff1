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
from collections.abc import Callable, Iterable, Mapping
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
    "SECRET_KEYS",
    "consumer_config",
    "credentials_from_env",
    "is_secret",
    "producer_config",
    "redact",
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
        return int(low, 10)
    if prop.type == "float":
        return float(low)
    return low


# --------------------------------------------------------------------------- unsafe settings


@dataclass(frozen=True, kw_only=True, slots=True)
class _UnsafeRule:
    canonical: str
    roles: frozenset[Role]
    is_unsafe: Callable[[object, _View], bool]
    reason: str


_BOTH: Final[frozenset[Role]] = frozenset({"producer", "consumer"})
_PRODUCER: Final[frozenset[Role]] = frozenset({"producer"})
_CONSUMER: Final[frozenset[Role]] = frozenset({"consumer"})

_UNSAFE_RULES: Final[tuple[_UnsafeRule, ...]] = (
    _UnsafeRule(
        canonical="request.required.acks",
        roles=_PRODUCER,
        is_unsafe=lambda v, _: v != -1,
        reason="the leader acknowledges before all in-sync replicas have the record, so a "
        "leader failure loses acknowledged messages (use acks=all)",
    ),
    _UnsafeRule(
        canonical="enable.idempotence",
        roles=_PRODUCER,
        is_unsafe=lambda v, _: v is False,
        reason="without idempotence a retried batch can be written twice or out of order",
    ),
    _UnsafeRule(
        canonical="max.in.flight.requests.per.connection",
        roles=_PRODUCER,
        is_unsafe=lambda v, _: isinstance(v, int) and v > _MAX_IN_FLIGHT_IDEMPOTENT,
        reason="more than 5 in-flight requests per connection can reorder messages on retry "
        "and is incompatible with idempotence",
    ),
    _UnsafeRule(
        canonical="message.send.max.retries",
        roles=_PRODUCER,
        is_unsafe=lambda v, _: v == 0,
        reason="without retries, transient errors (NOT_ENOUGH_REPLICAS, REQUEST_TIMED_OUT) "
        "fail messages at once",
    ),
    _UnsafeRule(
        canonical="message.timeout.ms",
        roles=_PRODUCER,
        is_unsafe=lambda v, _: v == 0,
        reason="0 makes the delivery timeout infinite: an undeliverable message is never "
        "reported and flush() can block forever",
    ),
    _UnsafeRule(
        canonical="enable.auto.offset.store",
        roles=_CONSUMER,
        is_unsafe=lambda v, view: v is True and view.value("enable.auto.commit") is True,
        reason="offsets of messages are stored (and auto-committed) when they are handed to "
        "the application, before they are processed: a crash loses them",
    ),
    _UnsafeRule(
        canonical="auto.offset.reset",
        roles=_CONSUMER,
        is_unsafe=lambda v, _: v in ("latest", "largest", "end"),
        reason="a new group or an out-of-range offset silently skips the backlog",
    ),
    _UnsafeRule(
        canonical="isolation.level",
        roles=_CONSUMER,
        is_unsafe=lambda v, _: v == "read_uncommitted",
        reason="records of aborted transactions are delivered to the application",
    ),
    _UnsafeRule(
        canonical="statistics.interval.ms",
        roles=_BOTH,
        is_unsafe=lambda v, _: v == 0,
        reason="statistics feed the leadership monitor and health(); 0 turns them off",
    ),
    _UnsafeRule(
        canonical="enable.ssl.certificate.verification",
        roles=_BOTH,
        is_unsafe=lambda v, _: v is False,
        reason="broker certificates are not verified (man-in-the-middle risk)",
    ),
    _UnsafeRule(
        canonical="ssl.endpoint.identification.algorithm",
        roles=_BOTH,
        is_unsafe=lambda v, _: v == "none",
        reason="broker host names are not checked against their certificates "
        "(man-in-the-middle risk)",
    ),
)


# --------------------------------------------------------------------------- conflicts


def _conflict(view: _View, canonical: str, message: str) -> ConfigError:
    key = view.key(canonical)
    return ConfigError(f"{key}: {message}", key=key)


def _check_idempotence(view: _View) -> None:
    if view.value("enable.idempotence") is not True:
        if view.user_set("enable.gapless.guarantee") and view.value("enable.gapless.guarantee"):
            raise _conflict(view, "enable.gapless.guarantee", "requires enable.idempotence=true")
        if view.user_set("transactional.id"):
            raise _conflict(view, "enable.idempotence", "transactional.id requires idempotence")
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
            raise _conflict(
                view,
                canonical,
                f"{why} (set enable.idempotence=false, allowed as unsafe, or remove {s.key})",
            )


def _check_timeouts(view: _View) -> None:
    timeout = view.value("message.timeout.ms")
    linger = view.get("queue.buffering.max.ms")
    if (
        linger is not None
        and isinstance(timeout, int)
        and timeout > 0
        and isinstance(linger.value, float | int)
        and linger.value >= timeout
    ):
        raise _conflict(
            view, "queue.buffering.max.ms", f"must be lower than message.timeout.ms ({timeout})"
        )
    if view.user_set("transactional.id"):
        txn = view.value("transaction.timeout.ms")
        if (
            view.user_set("message.timeout.ms")
            and isinstance(timeout, int)
            and isinstance(txn, int)
            and timeout > txn
        ):
            raise _conflict(
                view, "message.timeout.ms", f"must not exceed transaction.timeout.ms ({txn})"
            )


def _check_metadata(view: _View) -> None:
    refresh = view.value("topic.metadata.refresh.interval.ms")
    if isinstance(refresh, int) and refresh <= 0:
        raise _conflict(
            view,
            "topic.metadata.refresh.interval.ms",
            f"{refresh} disables the periodic metadata refresh, so leader changes and new "
            "partitions are only noticed after errors (documented range 1000..3600000; "
            "default 300000)",
        )
    max_age = view.get("metadata.max.age.ms")
    if (
        max_age is not None
        and isinstance(refresh, int)
        and isinstance(max_age.value, int)
        and max_age.value < refresh
    ):
        raise _conflict(
            view,
            "metadata.max.age.ms",
            f"{max_age.value} is shorter than topic.metadata.refresh.interval.ms ({refresh}): "
            "cached metadata would expire before it is refreshed. In librdkafka the refresh "
            "period is topic.metadata.refresh.interval.ms (Java's metadata.max.age.ms); "
            "metadata.max.age.ms is the cache lifetime and should be about 3x that",
        )
    backoff, backoff_max = (
        view.value("reconnect.backoff.ms"),
        view.value("reconnect.backoff.max.ms"),
    )
    if isinstance(backoff, int) and isinstance(backoff_max, int) and backoff_max < backoff:
        raise _conflict(view, "reconnect.backoff.max.ms", "must be >= reconnect.backoff.ms")


def _check_producer(view: _View) -> None:
    _check_idempotence(view)
    _check_timeouts(view)
    if view.value("delivery.report.only.error") is True:
        raise _conflict(
            view,
            "delivery.report.only.error",
            "kresilient needs a delivery report for every message to resolve its handles "
            "and to account for every message",
        )


def _check_consumer(view: _View) -> None:
    group = view.get("group.id")
    if group is None or not group.text.strip():
        raise ConfigError("group.id is required for a consumer", key="group.id")
    classic = view.value("group.protocol") != "consumer"
    if not classic:
        for canonical in ("session.timeout.ms", "heartbeat.interval.ms", "group.protocol.type"):
            if view.user_set(canonical):
                raise _conflict(view, canonical, "is not supported with group.protocol=consumer")
        if view.user_set("partition.assignment.strategy"):
            raise _conflict(
                view,
                "partition.assignment.strategy",
                "is not supported with group.protocol=consumer (use group.remote.assignor)",
            )
    else:
        poll, session = view.value("max.poll.interval.ms"), view.value("session.timeout.ms")
        if isinstance(poll, int) and isinstance(session, int) and poll < session:
            raise _conflict(
                view, "max.poll.interval.ms", f"must be >= session.timeout.ms ({session})"
            )
    strategy = view.value("partition.assignment.strategy")
    if classic and isinstance(strategy, str):
        names = {s.strip() for s in strategy.split(",") if s.strip()}
        if names & _EAGER_ASSIGNORS and "cooperative-sticky" in names:
            raise _conflict(
                view,
                "partition.assignment.strategy",
                "eager (range, roundrobin) and cooperative (cooperative-sticky) assignors "
                "must not be mixed",
            )
    fetch_max, msg_max = view.value("fetch.max.bytes"), view.value("message.max.bytes")
    if (
        view.user_set("fetch.max.bytes")
        and isinstance(fetch_max, int)
        and isinstance(msg_max, int)
        and fetch_max < msg_max
    ):
        raise _conflict(view, "fetch.max.bytes", f"must be >= message.max.bytes ({msg_max})")


_ROLE_CHECKS: Final[Mapping[Role, Callable[[_View], None]]] = {
    "producer": _check_producer,
    "consumer": _check_consumer,
}


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


def _validated(key: object, raw: object, role: Role) -> tuple[str, object, _Setting | None]:
    """Check one user key; return (key, value for librdkafka, parsed setting or None)."""
    if not isinstance(key, str):
        raise ConfigError(f"configuration keys must be strings, got {type(key).__name__}", key=None)
    prop = catalog.lookup(key)
    if prop is None:
        raise _unknown_key(key)
    other = _SCOPE_NAME.get(prop.scope)
    if other is not None and other != role:
        raise ConfigError(f"{key!r} is a {other} property; a {role} would ignore it", key=key)
    if prop.type in _PYTHON_TYPES:
        if isinstance(raw, Mapping):
            raise ConfigError(
                f"{key!r}: nested configuration is not supported; set topic properties at "
                "the top level",
                key=key,
            )
        return key, raw, None
    if not isinstance(raw, str | bool | int | float):
        raise ConfigError(
            f"{key!r}: expected a string, bool, int or float, got {type(raw).__name__}", key=key
        )
    text = catalog.to_config_string(raw)
    why = prop.check_value(text)
    if why is not None:
        shown = "" if is_secret(key) else f" (got {raw!r})"
        raise ConfigError(f"invalid value for {key!r}: {why}{shown}", key=key)
    return key, text, _Setting(key=key, text=text, value=_parse(prop, text), user=True)


def _build(
    user: Mapping[str, Any],
    role: Role,
    defaults: Mapping[str, str],
    allow_unsafe: Iterable[str],
    logger: Any,
) -> dict[str, Any]:
    if not isinstance(user, Mapping):
        raise ConfigError(f"configuration must be a mapping, got {type(user).__name__}", key=None)
    allowed = _canonical_names(allow_unsafe)
    out: dict[str, Any] = {}
    view = _View(role)
    for raw_key, raw in user.items():
        key, value, setting = _validated(raw_key, raw, role)
        out[key] = value
        if setting is None:
            continue
        canonical = catalog.lookup(key).canonical  # type: ignore[union-attr]
        previous = view.settings.get(canonical)
        if previous is not None and previous.value != setting.value:
            raise ConfigError(
                f"{previous.key!r} and {key!r} are the same property with different values",
                key=key,
            )
        view.settings[canonical] = setting
    _require_bootstrap(view, user, role)
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
    accepted = _check_unsafe(view, role, allowed | ({implied[0]} if implied else set()))
    _ROLE_CHECKS[role](view)
    _check_metadata(view)
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
    return out


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
        return None  # refused by _check_unsafe with its own message
    idem = view.get("enable.idempotence")
    if idem is not None and idem.user:
        if idem.value is True:
            return None  # explicit contradiction: _check_idempotence names it
        return ("enable.idempotence", idem.key)  # already off: implied, not a second opt-out
    key = idem.key if idem is not None else "enable.idempotence"
    out[key] = "false"
    view.settings["enable.idempotence"] = _Setting(key=key, text="false", value=False, user=False)
    return ("enable.idempotence", key)


def _require_bootstrap(view: _View, user: Mapping[str, Any], role: Role) -> None:
    """No broker list: librdkafka would start and wait forever for a cluster it cannot name."""
    servers = view.get("metadata.broker.list")
    if servers is not None and servers.text.strip():
        return
    if "test.mock.num.brokers" in user:
        return  # librdkafka's mock cluster brings its own brokers
    key = servers.key if servers is not None else "bootstrap.servers"
    raise ConfigError(
        f"{key} is required: a {role} needs the broker list to connect to "
        "(e.g. {'bootstrap.servers': 'host1:9092,host2:9092'})",
        key=key,
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


def _check_unsafe(view: _View, role: Role, allowed: Iterable[str]) -> list[tuple[str, str]]:
    accepted: list[tuple[str, str]] = []
    for rule in _UNSAFE_RULES:
        if role not in rule.roles:
            continue
        s = view.get(rule.canonical)
        if s is None or not s.user or not rule.is_unsafe(s.value, view):
            continue
        if rule.canonical in allowed:
            accepted.append((s.key, s.text))
            continue
        raise UnsafeConfigError(
            f"{s.key}={s.text} weakens a guarantee: {rule.reason}. Pass "
            f"allow_unsafe=({s.key!r},) to accept it",
            key=s.key,
            value=s.text,
        )
    return accepted


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
