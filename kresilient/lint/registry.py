"""The rule registry and the value helpers every rule uses.

A rule is data (id, severity, kinds, why, fix) plus a check function; rules register
themselves with :func:`rule` and are looked up in :data:`RULES`. Ids are stable: never reuse
or renumber one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kresilient import _catalog as catalog
from kresilient.lint.model import CLIENT_KINDS, ConfigUnit, Entry, Severity

__all__ = ["CLIENTS", "RULES", "Hit", "Rule", "client_of", "effective", "number", "rule"]

#: The client libraries whose defaults a client config can be judged by.
CLIENTS: tuple[str, ...] = ("librdkafka", "java")
#: librdkafka names -> the Java client's name for the same setting (for Java defaults).
_JAVA_NAMES = {
    "message.timeout.ms": "delivery.timeout.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "request.required.acks": "acks",
    "message.send.max.retries": "retries",
    "queue.buffering.max.ms": "linger.ms",
}

#: (message, entry whose key position locates the finding or None for the unit's position)
Hit = tuple[str, Entry | None]
UnitCheck = Callable[[ConfigUnit], Iterable[Hit]]
ProjectCheck = Callable[[list[ConfigUnit]], Iterable[tuple[ConfigUnit, str, Entry | None]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One lint/audit rule. ``kinds`` are the config kinds it applies to; ``scope`` is
    ``unit`` (one config), ``project`` (all configs together), ``audit`` (live cluster) or
    ``meta`` (parse errors, suppressions). ``input_error`` findings make the exit code 2."""

    id: str
    name: str
    severity: Severity
    family: str
    kinds: frozenset[str]
    summary: str
    why: str
    fix: str
    scope: str = "unit"
    input_error: bool = False
    #: The client libraries whose configs the rule judges (a librdkafka-only constraint or
    #: default does not apply to a config the Java client reads).
    clients: frozenset[str] = frozenset(CLIENTS)
    check: UnitCheck | None = None
    project_check: ProjectCheck | None = None

    @property
    def help_text(self) -> str:
        """Why and fix in one plain-text block (SARIF ``help.text``, ``--explain``)."""
        return f"{self.summary}\n\nWhy: {self.why}\n\nFix: {self.fix}"


RULES: dict[str, Rule] = {}


def register(new: Rule) -> Rule:
    """Add ``new`` to :data:`RULES` (ids must be unique)."""
    if new.id in RULES:
        raise ValueError(f"duplicate rule id {new.id}")
    RULES[new.id] = new
    return new


def rule(
    rule_id: str,
    name: str,
    severity: Severity,
    kinds: Iterable[str],
    family: str,
    *,
    summary: str,
    why: str,
    fix: str,
    clients: Iterable[str] = CLIENTS,
) -> Callable[[UnitCheck], UnitCheck]:
    """Decorator registering a per-config check ``fn(unit) -> iterable of (message, entry)``;
    ``clients`` limits it to configs read by those client libraries."""

    def decorate(fn: UnitCheck) -> UnitCheck:
        register(
            Rule(
                id=rule_id,
                name=name,
                severity=severity,
                family=family,
                kinds=frozenset(kinds),
                summary=summary,
                why=why,
                fix=fix,
                check=fn,
                clients=frozenset(clients),
            )
        )
        return fn

    return decorate


def project_rule(
    rule_id: str,
    name: str,
    severity: Severity,
    kinds: Iterable[str],
    family: str,
    *,
    summary: str,
    why: str,
    fix: str,
) -> Callable[[ProjectCheck], ProjectCheck]:
    """Decorator registering a check over all configs ``fn(units) -> (unit, message, entry)``."""

    def decorate(fn: ProjectCheck) -> ProjectCheck:
        register(
            Rule(
                id=rule_id,
                name=name,
                severity=severity,
                family=family,
                kinds=frozenset(kinds),
                summary=summary,
                why=why,
                fix=fix,
                scope="project",
                project_check=fn,
            )
        )
        return fn

    return decorate


# ----------------------------------------------------------------------------- value helpers


def _defaults_known(unit: ConfigUnit) -> bool:
    """False when unset keys do not fall back to librdkafka's defaults: kresilient's own
    constructors apply safe defaults, and a config built at run time is unknown."""
    return not unit.context.get("resilient") and bool(unit.context.get("config_known", True))


def client_of(unit: ConfigUnit) -> str:
    """The client library that reads ``unit``: ``java`` or ``librdkafka`` (the default)."""
    client = unit.context.get("client")
    return client if isinstance(client, str) and client in CLIENTS else "librdkafka"


def _java_default(unit: ConfigUnit, key: str) -> str | None:
    """The Java client's default for ``key`` (or its Java name), from Kafka's ConfigDef."""
    names = [key, _JAVA_NAMES.get(key, key)]
    prop = catalog.lookup(key)
    if prop is not None:
        names += [prop.canonical, _JAVA_NAMES.get(prop.canonical, prop.canonical), *prop.aliases]
    kinds = (unit.kind,) if unit.kind in ("producer", "consumer", "admin") else ()
    for name in names:
        owners = catalog.java_client_kinds(name)
        for kind in kinds or owners[:1]:
            if kind in owners:
                return _java_defaults(kind).get(name)
    return None


@functools.cache
def _java_defaults(kind: str) -> dict[str, str | None]:
    return {k.name: k.default for k in catalog.all_kafka_configs(kind)}  # type: ignore[arg-type]


def default_of(unit: ConfigUnit, key: str) -> str | None:
    """The default a key takes when unset, for this unit's kind and client (None if
    unknown). A framework's own defaults (``context["defaults"]``, e.g. Spring Kafka's
    ``enable.auto.commit=false``) come first."""
    if not _defaults_known(unit):
        return None
    overrides = unit.context.get("defaults")
    if isinstance(overrides, dict) and key in overrides:
        return str(overrides[key])
    if unit.kind in CLIENT_KINDS and client_of(unit) == "java":
        return _java_default(unit, key)
    if unit.kind == "broker":
        broker = catalog.broker_config(key)
        return broker.default if broker else None
    if unit.kind == "topic":
        return None  # topic defaults come from the broker, which a topic file does not show
    prop = catalog.lookup(key)
    return prop.default if prop else None


def effective(unit: ConfigUnit, key: str) -> str | None:
    """The lower-case value a key has (explicit, else default); None when dynamic/unknown."""
    entry = unit.get(key)
    if entry is not None:
        return None if entry.dynamic else entry.text.strip().lower()
    default = default_of(unit, key)
    return default.lower() if default is not None else None


def number(unit: ConfigUnit, key: str) -> float | None:
    """The numeric value of a key (explicit or default), None when unknown or not a number."""
    value = effective(unit, key)
    if value is None:
        return None
    if key in ("acks", "request.required.acks") and value == "all":
        return -1.0
    try:
        return float(value)
    except ValueError:
        return None


def truthy(unit: ConfigUnit, key: str) -> bool | None:
    """True/False for a boolean key (explicit or default), None when unknown."""
    value = effective(unit, key)
    if value in ("true", "t", "1"):
        return True
    if value in ("false", "f", "0"):
        return False
    return None


def explicit(unit: ConfigUnit, *keys: str) -> Entry | None:
    """The first of ``keys`` set in the config with a literal value."""
    for key in keys:
        entry = unit.get(key)
        if entry is not None and not entry.dynamic:
            return entry
    return None


def is_client(unit: ConfigUnit) -> bool:
    """True for producer, consumer, admin and generic client configs."""
    return unit.kind in CLIENT_KINDS


def idempotent(unit: ConfigUnit) -> bool | None:
    """Whether the producer runs idempotent (``transactional.id`` implies it).

    The Java client (3.0.1, 3.1.1, 3.2+; KAFKA-13598) defaults to idempotence, but turns it
    off silently when it is not set explicitly and acks, retries or max.in.flight conflict
    with it (KAFKA-13673).
    """
    if explicit(unit, "transactional.id"):
        # Only an explicit false counts: an unset key's default does not turn it off.
        entry = explicit(unit, "enable.idempotence")
        return not (entry is not None and truthy(unit, "enable.idempotence") is False)
    if client_of(unit) == "java" and unit.get("enable.idempotence") is None:
        overrides = unit.context.get("defaults")
        if not _defaults_known(unit) or (
            isinstance(overrides, dict) and "enable.idempotence" in overrides
        ):
            return truthy(unit, "enable.idempotence")
        acks, inflight = number(unit, "acks"), number(unit, "max.in.flight")
        retries = number(unit, "retries")
        if acks not in (None, -1.0) or (inflight or 0) > 5 or retries == 0:
            return False
    return truthy(unit, "enable.idempotence")


def fmt(value: float) -> str:
    """``5.0`` -> ``"5"``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def iter_rules(*, scope: str | None = None) -> Iterator[Rule]:
    """Registered rules in id order (optionally of one scope)."""
    for rule_id in sorted(RULES):
        found = RULES[rule_id]
        if scope is None or found.scope == scope:
            yield found
