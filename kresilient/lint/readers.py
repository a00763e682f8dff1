"""Turn config files into :class:`ConfigUnit` objects with real line and column numbers.

Formats: Java ``.properties``, YAML, JSON, TOML, ``.env`` (``KAFKA_*`` variables) and Python
source (see :mod:`kresilient.lint.pyreader`). A reader never raises on bad input: it returns a
:class:`ParseError` with the location instead.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import yaml

from kresilient import _catalog as catalog
from kresilient.lint.hclreader import read_terraform
from kresilient.lint.model import (
    TOPIC_SPEC_KEYS,
    ConfigUnit,
    Entry,
    Kind,
    ParseError,
    ReadResult,
    has_lone_surrogate,
    is_secret,
)
from kresilient.lint.pyreader import read_python

__all__ = ["KNOWN_EXTENSIONS", "ParseError", "ReadResult", "detect_format", "read_text"]


# ----------------------------------------------------------------------------- shared helpers

#: Section names that say which kind of config a nested mapping holds.
SECTION_HINTS: dict[str, Kind] = {
    "producer": "producer",
    "producers": "producer",
    "producer_config": "producer",
    "consumer": "consumer",
    "consumers": "consumer",
    "consumer_config": "consumer",
    "admin": "admin",
    "admin_client": "admin",
    "broker": "broker",
    "brokers": "broker",
    "server": "broker",
    "topic": "topic",
    "topics": "topic",
}
_SPEC_ALIASES = {
    "replicationFactor": "replication.factor",
    "replication_factor": "replication.factor",
    "numPartitions": "partitions",
    "num_partitions": "partitions",
}
_TOPIC_CONFIG_CHILDREN = frozenset({"config", "configs", "spec", "settings"})
_PLACEHOLDER = re.compile(r"^\s*(\$\{[^}]*\}|\$[A-Za-z_]\w*|\{\{.*\}\}|%\([^)]*\)s)\s*$")
_ENV_KEY = re.compile(r"^KAFKA_[A-Z0-9_]+$")
#: An upper-case environment variable that is not the Kafka image's KAFKA_*.
_OTHER_ENV = re.compile(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$")
#: Deepest nesting a structured file may have (real configs stay under ~20 levels).
MAX_DEPTH = 100
#: Nodes a YAML file may expand to beyond its own length: aliases may reuse a block a few
#: times, a "billion laughs" file (aliases of aliases) stops here instead of eating memory.
YAML_NODE_BUDGET = 100_000
_ENV_ROLE = {"PRODUCER_": "producer", "CONSUMER_": "consumer", "ADMIN_": "admin"}


def is_known_key(name: str) -> bool:
    """True for any client property, broker or topic key (or topic-spec key)."""
    return (
        catalog.lookup(name) is not None
        or catalog.broker_config(name) is not None
        or catalog.topic_config(name) is not None
        or name in TOPIC_SPEC_KEYS
    )


def env_to_key(name: str) -> tuple[str, Kind | None]:
    """``KAFKA_PRODUCER_ENABLE_IDEMPOTENCE`` -> (``enable.idempotence``, ``producer``).

    The Apache Kafka image convention: ``_`` -> ``.``, ``__`` -> ``_``, ``___`` -> ``-``.
    """
    rest = name[len("KAFKA_") :]
    if rest.startswith("CFG_"):  # the bitnami image: KAFKA_CFG_NODE_ID -> node.id
        rest = rest[len("CFG_") :]
    role: Kind | None = None
    for prefix, kind in _ENV_ROLE.items():
        if rest.startswith(prefix):
            rest, role = rest[len(prefix) :], kind  # type: ignore[assignment]
            break
    key = rest.replace("___", "\0").replace("__", "\1").replace("_", ".")
    return key.replace("\0", "-").replace("\1", "_").lower(), role


def _entry(key: str, value: object, line: int, col: int) -> Entry:
    dynamic = isinstance(value, str) and bool(_PLACEHOLDER.match(value))
    return Entry(key=key, value=value, line=line, col=col, dynamic=dynamic)


def looks_like_kafka(entries: dict[str, Entry], hinted: bool) -> bool:
    """Decide whether a mapping is a Kafka config worth linting (avoids linting every YAML).

    Topic-spec keys such as ``name`` only count under a ``topics`` section (``hinted``).
    """
    if not entries:
        return False
    if hinted:
        known = sum(1 for k in entries if is_known_key(k) and k != "name")
        return known >= 1 and known * 3 >= len(entries)
    known = sum(1 for k in entries if is_known_key(k) and k not in TOPIC_SPEC_KEYS)
    return (known >= 2 and known * 2 >= len(entries)) or (known >= 1 and len(entries) == known)


# ----------------------------------------------------------------------------- positional tree


@dataclass(slots=True)
class _Node:
    """A parsed value with the position of its start; maps keep key positions."""

    line: int
    col: int
    scalar: object = None
    mapping: list[tuple[str, int, int, _Node]] | None = None
    sequence: list[_Node] | None = None


def _scalar_text(node: _Node) -> object | None:
    """A scalar, or a list of scalars joined with commas (``["a", "b"]`` -> ``"a,b"``)."""
    if node.mapping is None and node.sequence is None:
        return node.scalar
    if node.sequence is not None and all(
        n.mapping is None and n.sequence is None for n in node.sequence
    ):
        return ",".join(catalog.to_config_string(n.scalar) for n in node.sequence)
    return None


def _flatten(prefix: str, node: _Node) -> Iterator[tuple[str, int, int, object]]:
    assert node.mapping is not None
    for key, line, col, child in node.mapping:
        name = f"{prefix}.{key}"
        value = _scalar_text(child)
        if value is not None or (child.mapping is None and child.sequence is None):
            yield name, line, col, value
        elif child.mapping is not None:
            yield from _flatten(name, child)


# ----------------------------------------------------------------------------- Spring Boot

#: Spring Boot's named ``spring.kafka.[role.]*`` properties, in relaxed form (lower case,
#: no ``-``/``_``; ``enable-auto-commit``, ``enableAutoCommit`` and ``ENABLE_AUTO_COMMIT``
#: all bind to the same property), -> the Kafka client key Spring sets from them
#: (org.springframework.boot.autoconfigure.kafka.KafkaProperties).
SPRING_NAMES: dict[str, str] = {
    "bootstrapservers": "bootstrap.servers",
    "clientid": "client.id",
    "acks": "acks",
    "retries": "retries",
    "batchsize": "batch.size",
    "buffermemory": "buffer.memory",
    "compressiontype": "compression.type",
    "keyserializer": "key.serializer",
    "valueserializer": "value.serializer",
    "transactionidprefix": "transactional.id",
    "autocommitinterval": "auto.commit.interval.ms",
    "autooffsetreset": "auto.offset.reset",
    "enableautocommit": "enable.auto.commit",
    "fetchmaxwait": "fetch.max.wait.ms",
    "fetchminsize": "fetch.min.bytes",
    "groupid": "group.id",
    "heartbeatinterval": "heartbeat.interval.ms",
    "isolationlevel": "isolation.level",
    "keydeserializer": "key.deserializer",
    "valuedeserializer": "value.deserializer",
    "maxpollrecords": "max.poll.records",
    "maxpollinterval": "max.poll.interval.ms",
    "security.protocol": "security.protocol",
    "ssl.keypassword": "ssl.key.password",
    "ssl.keystorecertificatechain": "ssl.keystore.certificate.chain",
    "ssl.keystorekey": "ssl.keystore.key",
    "ssl.keystorelocation": "ssl.keystore.location",
    "ssl.keystorepassword": "ssl.keystore.password",
    "ssl.keystoretype": "ssl.keystore.type",
    "ssl.truststorecertificates": "ssl.truststore.certificates",
    "ssl.truststorelocation": "ssl.truststore.location",
    "ssl.truststorepassword": "ssl.truststore.password",
    "ssl.truststoretype": "ssl.truststore.type",
    "ssl.protocol": "ssl.protocol",
}
_SPRING_ROLES: dict[str, Kind] = {
    "producer": "producer",
    "consumer": "consumer",
    "admin": "admin",
    "streams": "client",
}
#: Spring Duration properties (a bare number is milliseconds) and DataSize ones (bytes).
_SPRING_DURATIONS = frozenset(
    {
        "auto.commit.interval.ms",
        "fetch.max.wait.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
    }
)
_SPRING_SIZES = frozenset({"batch.size", "buffer.memory", "fetch.min.bytes"})
_DURATION = re.compile(r"^\s*(\d+)\s*(ns|us|ms|s|m|h|d)?\s*$", re.IGNORECASE)
_ISO_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$", re.I)
_DATA_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|MB|GB|TB)?\s*$", re.IGNORECASE)
_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_BYTES = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}
#: The only rules run on Spring's ``streams`` settings (Kafka Streams has its own defaults).
SPRING_STREAMS_RULES: frozenset[str] = frozenset({"KR034", "KR035", "KR036", "KR040", "KR041"})
#: What Spring Kafka changes from the Java client's defaults: its listener container commits
#: after processing and sets enable.auto.commit=false unless told otherwise (spring-kafka
#: GH-945, 2.3).
SPRING_CONSUMER_DEFAULTS: dict[str, str] = {"enable.auto.commit": "false"}


def _relaxed(key: str) -> str:
    """Spring's relaxed binding: ``Spring.Kafka.SSL.key_store-password`` ~ lower, no ``-_``."""
    return key.lower().replace("-", "").replace("_", "")


def _spring_value(name: str, value: object) -> tuple[object, bool]:
    """A Spring Duration (``30s``, ``PT5M``) or DataSize (``16KB``) as the number the
    Kafka key takes (ms, bytes); (value, True) when it cannot be converted."""
    if name in _SPRING_DURATIONS and isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(int(m.group(1)) * _MS[(m.group(2) or "ms").lower()]), False
        iso = _ISO_DURATION.match(value.strip())
        if iso and any(iso.groups()):
            d, h, mi, sec = (float(g) if g else 0.0 for g in iso.groups())
            return int(((d * 24 + h) * 60 + mi) * 60_000 + sec * 1000), False
        return value, True
    if name in _SPRING_SIZES and isinstance(value, str):
        m = _DATA_SIZE.match(value)
        if m:
            return int(m.group(1)) * _BYTES[(m.group(2) or "b").lower()], False
        return value, True
    return value, False


def _spring_key(parts: list[str]) -> tuple[str | None, str | None]:
    """(role or None for shared settings, Kafka key or None) for the key path after
    ``spring.kafka.``; ``properties.*`` maps pass their keys through as written."""
    role: str | None = None
    if parts and _relaxed(parts[0]) in _SPRING_ROLES:
        role, parts = _relaxed(parts[0]), parts[1:]
    if not parts:
        return role, None
    if _relaxed(parts[0]) == "properties":
        raw = ".".join(p.strip("[]") for p in parts[1:])
        return role, raw or None
    return role, SPRING_NAMES.get(".".join(_relaxed(p) for p in parts))


def is_spring_key(key: str) -> bool:
    """True for a ``spring.kafka.*`` key in any relaxed spelling."""
    return _relaxed(key).startswith("spring.kafka.")


def spring_units(items: Iterable[tuple[str, int, int, object]], path: str) -> list[ConfigUnit]:
    """The Kafka client configs Spring Boot builds from the ``spring.kafka.*`` settings
    among ``items`` (key, line, col, value): one per role used (producer, consumer, admin,
    streams), each holding the shared settings too, in Kafka's names, read by the Java
    client with Spring Kafka's defaults. Spring properties Kafka does not see (listener,
    template, retry) are left out."""
    shared: dict[str, Entry] = {}
    roles: dict[str, dict[str, Entry]] = {}
    for key, line, col, value in items:
        if not is_spring_key(key):
            continue
        parts = key.split(".")[2:]
        role, name = _spring_key(parts)
        if role is not None:
            roles.setdefault(role, {})
        if name is None:
            continue
        converted, unknown = _spring_value(name, value)
        dynamic = unknown or _entry(name, value, line, col).dynamic
        entry = Entry(key=key, value=converted, line=line, col=col, dynamic=dynamic, setting=name)
        (roles[role] if role is not None else shared)[name] = entry
    units: list[ConfigUnit] = []
    used = [r for r in _SPRING_ROLES if roles.get(r)] or ([] if not shared else [""])
    for role in used:
        entries = {**shared, **roles.get(role, {})}
        # A finding about an unset key points at the role's block, not the shared settings.
        first = min((roles.get(role) or entries).values(), key=lambda e: (e.line, e.col))
        kind: Kind = _SPRING_ROLES.get(role, "client")
        context: dict[str, object] = {"client": "java", "framework": "Spring Kafka"}
        if role == "consumer":
            context["defaults"] = dict(SPRING_CONSUMER_DEFAULTS)
        if role == "streams":
            context["rules"] = SPRING_STREAMS_RULES
        units.append(
            ConfigUnit(
                path=path,
                line=first.line,
                col=first.col,
                entries=entries,
                kind=kind,
                kind_forced=True,
                name=f"spring.kafka.{role}" if role else "spring.kafka",
                source="spring",
                context=context,
            )
        )
    return units


_ENV_ITEM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)


def _env_list(node: _Node) -> _Node | None:
    """A docker-compose ``environment:`` list (``- KAFKA_NODE_ID=1``) as a mapping node, when
    every item is ``NAME=value`` and one names a ``KAFKA_*`` variable; else None."""
    items: list[tuple[str, int, int, _Node]] = []
    for child in node.sequence or []:
        match = _ENV_ITEM.match(child.scalar) if isinstance(child.scalar, str) else None
        if match is None:
            return None
        value = _Node(line=child.line, col=child.col + len(match.group(1)) + 1)
        value.scalar = match.group(2)
        items.append((match.group(1), child.line, child.col, value))
    if not any(_ENV_KEY.match(name) for name, _, _, _ in items):
        return None
    return _Node(line=node.line, col=node.col, mapping=items)


def _walk(
    node: _Node, path: str, hint: Kind | None, label: str | None, out: list[ConfigUnit]
) -> None:
    if node.sequence is not None:
        env = _env_list(node)
        if env is not None:
            _walk(env, path, hint, label, out)
            return
        for child in node.sequence:
            _walk(child, path, hint, label, out)
        return
    if node.mapping is None:
        return
    entries: dict[str, Entry] = {}
    children: list[tuple[str, _Node]] = []
    if hint is None and _is_topic_spec(node):
        hint = "topic"  # {"name", "replication.factor", "config": {...}}: one topic
    for key, line, col, child in node.mapping:
        if child.sequence is not None:
            child = _env_list(child) or child  # compose's list form of environment:
        value = _scalar_text(child)
        env_role: Kind | None = None
        if _ENV_KEY.match(key):
            key, env_role = env_to_key(key)
            hint = hint or env_role
        elif _OTHER_ENV.match(key) and (value is not None or child.mapping is None):
            # an environment variable of another image (Debezium's NODE_ID, CLUSTER_ID):
            # not a Kafka key, whatever it resembles (issue 38 #5)
            continue
        if hint == "topic":
            key = _SPEC_ALIASES.get(key, key)
        if value is not None or (child.mapping is None and child.sequence is None):
            entries[key] = _entry(key, value, line, col)
            continue
        if child.mapping is not None:
            if hint == "topic" and key in _TOPIC_CONFIG_CHILDREN:
                for sub, sline, scol, sval in _flatten("", child):
                    name = _SPEC_ALIASES.get(sub[1:], sub[1:])
                    entries[name] = _entry(name, sval, sline, scol)
                continue
            flat = list(_flatten(key, child))
            if key.lower() not in SECTION_HINTS and any(is_known_key(f[0]) for f in flat):
                for name, fline, fcol, fval in flat:
                    entries[name] = _entry(name, fval, fline, fcol)
                continue
        children.append((key, child))
    if looks_like_kafka(entries, hint is not None):
        unit_name: str | None = (
            entries["name"].text if hint == "topic" and "name" in entries else label
        )
        out.append(
            ConfigUnit(
                path=path,
                line=node.line,
                col=node.col,
                entries=entries,
                name=unit_name,
                kind=hint or "client",
                kind_forced=hint is not None,
                source="tree",
            )
        )
    for key, child in children:
        child_hint = SECTION_HINTS.get(key.lower(), hint)
        child_label = key if hint == "topic" and key.lower() not in SECTION_HINTS else label
        _walk(child, path, child_hint, child_label, out)


_SPEC_RF = frozenset({"replication.factor", "replicationFactor", "replication_factor"})


def _is_topic_spec(node: _Node) -> bool:
    """A topic spec (topic-as-code JSON/YAML): a name, a top-level replication factor and a
    ``config``/``configs`` object of topic configs. Its replication factor and its configs
    are one topic (issue 38 #7: KR044 needs both)."""
    if node.mapping is None:
        return False
    keys = {k for k, _, _, _ in node.mapping}
    return bool(keys & _SPEC_RF) and "name" in keys and bool(keys & {"config", "configs"})


# ----------------------------------------------------------------------------- Kafka Connect

#: Keys only a Kafka Connect worker config has.
_CONNECT_WORKER_KEYS = frozenset(
    {
        "offset.storage.topic",
        "config.storage.topic",
        "status.storage.topic",
        "offset.storage.file.filename",
        "plugin.path",
        "key.converter",
        "value.converter",
    }
)
#: What the Connect worker sets on its own clients unless told otherwise (Worker.java:
#: acks=all, one request in flight, unbounded delivery; idempotence off since 3.2,
#: KAFKA-13759; sink consumers commit through the framework, from the earliest offset).
CONNECT_PRODUCER_DEFAULTS = {
    "acks": "all",
    "max.in.flight.requests.per.connection": "1",
    "enable.idempotence": "false",
    "delivery.timeout.ms": "2147483647",
}
CONNECT_CONSUMER_DEFAULTS = {"enable.auto.commit": "false", "auto.offset.reset": "earliest"}
_CONNECT_INTERNAL = ("offset", "config", "status")


_OVERRIDES = ("producer.override.", "consumer.override.", "admin.override.")
#: A Connect worker's own connection keys and the rules that judge them.
_CONNECT_CONNECTION = ("bootstrap.servers", "security.protocol", "ssl.", "sasl.")
_CONNECT_CLIENT_PREFIXES = ("producer.", "consumer.", "admin.")
_CONNECT_WORKER_RULES = frozenset({"KR034", "KR035", "KR036", "KR040", "KR041"})


def is_connect(entries: dict[str, Entry]) -> bool:
    """True for a Kafka Connect worker or connector config."""
    keys = entries.keys()
    return "connector.class" in keys or (sum(1 for k in keys if k in _CONNECT_WORKER_KEYS) >= 2)


def connect_units(entries: dict[str, Entry], path: str) -> list[ConfigUnit]:
    """The client configs of a Connect worker (``producer.*``, ``consumer.*``,
    ``admin.*``) or connector (``producer.override.*``, ``consumer.override.*``), read by
    the Java client with Connect's defaults; the worker's internal topics as topic
    configs (their replication factor); a connector's own settings (``errors.*``)."""
    connector = "connector.class" in entries
    units: list[ConfigUnit] = []
    prefixes = (
        (
            ("producer.override.", "producer"),
            ("consumer.override.", "consumer"),
            ("admin.override.", "admin"),
        )
        if connector
        else (("producer.", "producer"), ("consumer.", "consumer"), ("admin.", "admin"))
    )
    for prefix, kind in prefixes:
        sub: dict[str, Entry] = {}
        for key, entry in entries.items():
            if key.startswith(prefix):
                name = key[len(prefix) :]
                sub[name] = Entry(
                    key=key,
                    value=entry.value,
                    line=entry.line,
                    col=entry.col,
                    dynamic=entry.dynamic,
                    setting=name,
                )
        if not sub:
            continue
        defaults = CONNECT_PRODUCER_DEFAULTS if kind == "producer" else CONNECT_CONSUMER_DEFAULTS
        first = min(sub.values(), key=lambda e: (e.line, e.col))
        units.append(
            ConfigUnit(
                path=path,
                line=first.line,
                col=first.col,
                entries=sub,
                kind=kind,  # type: ignore[arg-type]
                kind_forced=True,
                name=prefix.rstrip("."),
                source="connect",
                context={
                    "client": "java",
                    "framework": "Kafka Connect",
                    "defaults": dict(defaults) if kind != "admin" else {},
                },
            )
        )
    if not connector:
        # The worker's own connection settings (bootstrap, security, TLS, SASL), which all
        # its clients use: a worker file is read as such, never "no Kafka settings"
        # (issue 38: connect-standalone.properties was skipped).
        conn = {
            k: e
            for k, e in entries.items()
            if k.startswith(_CONNECT_CONNECTION) and not k.startswith(_CONNECT_CLIENT_PREFIXES)
        }
        if conn:
            first = min(conn.values(), key=lambda e: (e.line, e.col))
            units.append(
                ConfigUnit(
                    path=path,
                    line=first.line,
                    col=first.col,
                    entries=conn,
                    kind="client",
                    kind_forced=True,
                    name="connect worker",
                    source="connect",
                    context={
                        "client": "java",
                        "framework": "Kafka Connect",
                        "rules": _CONNECT_WORKER_RULES,
                    },
                )
            )
        for topic in _CONNECT_INTERNAL:
            rf = entries.get(f"{topic}.storage.replication.factor")
            if rf is None:
                continue
            topic_name = entries.get(f"{topic}.storage.topic")
            rf_entry = Entry(
                key=rf.key,
                value=rf.value,
                line=rf.line,
                col=rf.col,
                dynamic=rf.dynamic or rf.text.strip() == "-1",  # -1: the broker's default
                setting="replication.factor",
            )
            units.append(
                ConfigUnit(
                    path=path,
                    line=rf.line,
                    col=rf.col,
                    entries={"replication.factor": rf_entry},
                    kind="topic",
                    kind_forced=True,
                    name=topic_name.text if topic_name else f"connect-{topic}s",
                    source="connect",
                    context={"tool": "connect", "rules": frozenset({"KR042"})},
                )
            )
    else:
        # The connector's own settings: error handling, its topics, and its credentials
        # (database.password, connection.password ...), literal or ${file:...} references.
        own = {
            k: e
            for k, e in entries.items()
            if k.startswith("errors.")
            or k in ("topics", "topics.regex")
            or (is_secret(k) and not k.startswith(_OVERRIDES))
        }
        first_key = entries["connector.class"]
        units.append(
            ConfigUnit(
                path=path,
                line=first_key.line,
                col=first_key.col,
                entries={**own, "connector.class": first_key},
                kind="client",
                kind_forced=True,
                name=entries["name"].text if "name" in entries else None,
                source="connect",
                context={"connector": True, "rules": frozenset({"KR050", "KR041"})},
            )
        )
    return units


# ----------------------------------------------------------------------------- Kafka resources


def _child(node: _Node | None, *keys: str) -> tuple[int, int, _Node] | None:
    """The value under ``keys`` (a path of mapping keys) with its key's position."""
    found: tuple[int, int, _Node] | None = None
    for key in keys:
        if node is None or node.mapping is None:
            return None
        found = next(((ln, c, v) for k, ln, c, v in node.mapping if k == key), None)
        if found is None:
            return None
        node = found[2]
    return found


def _spec_entry(spelled: str, setting: str, at: tuple[int, int, _Node], scale: int = 1) -> Entry:
    """An entry for a resource field (``spec.replicas``) that sets the Kafka key
    ``setting`` (``replication.factor``), its value scaled (topicctl's minutes -> ms)."""
    line, col, node = at
    value = node.scalar
    if scale != 1 and isinstance(value, int) and not isinstance(value, bool):
        value = value * scale
    entry = _entry(setting, value, line, col)
    return Entry(
        key=spelled, value=value, line=line, col=col, dynamic=entry.dynamic, setting=setting
    )


def _config_entries(at: tuple[int, int, _Node] | None, into: dict[str, Entry]) -> None:
    if at is None or at[2].mapping is None:
        return
    for name, line, col, value in _flatten("", at[2]):
        into[name[1:]] = _entry(name[1:], value, line, col)


#: Topic fields of topic-as-code resources: (path under the document, Kafka key, scale).
_TOPIC_FIELDS: dict[str, tuple[tuple[tuple[str, ...], str, int], ...]] = {
    "strimzi": (
        (("spec", "replicas"), "replication.factor", 1),
        (("spec", "partitions"), "partitions", 1),
    ),
    "jikkou": (
        (("spec", "replicas"), "replication.factor", 1),
        (("spec", "partitions"), "partitions", 1),
    ),
    "topicctl": (
        (("spec", "replicationFactor"), "replication.factor", 1),
        (("spec", "partitions"), "partitions", 1),
        (("spec", "retentionMinutes"), "retention.ms", 60_000),
    ),
}
_TOPIC_CONFIGS = {"strimzi": "config", "jikkou": "configs", "topicctl": "settings"}


def _resource_kind(root: _Node) -> tuple[str, str] | None:
    """(tool, kind) of a Strimzi or Jikkou custom resource or a topicctl topic spec."""
    api = _child(root, "apiVersion")
    kind = _child(root, "kind")
    api_text = str(api[2].scalar) if api else ""
    kind_text = str(kind[2].scalar) if kind else ""
    if api_text.startswith("kafka.strimzi.io/"):
        return "strimzi", kind_text
    if api_text.startswith("kafka.jikkou.io/"):
        return "jikkou", kind_text
    if _child(root, "meta", "name") and (
        _child(root, "spec", "partitions") or _child(root, "spec", "replicationFactor")
    ):
        return "topicctl", "Topic"
    if _child(root, "meta", "name") and _child(root, "spec", "bootstrapAddrs"):
        return "topicctl", "Cluster"
    return None


def resource_units(root: _Node, path: str) -> list[ConfigUnit] | None:
    """The topic and broker configs of a Strimzi ``KafkaTopic``/``Kafka``, a Jikkou
    ``KafkaTopic``/``KafkaTopicList`` or a topicctl topic spec; None when ``root`` is
    none of these (an unrelated Kubernetes resource of those tools gives [])."""
    found = _resource_kind(root)
    if found is None:
        return None
    tool, kind = found
    if tool == "jikkou" and kind == "KafkaTopicList":
        items = _child(root, "items")
        units: list[ConfigUnit] = []
        for item in (items[2].sequence or []) if items else []:
            units.extend(_topic_resource(item, path, tool))
        return units
    if kind in ("KafkaTopic", "Topic"):
        return _topic_resource(root, path, tool)
    if tool == "topicctl" and kind == "Cluster":
        return _topicctl_cluster(root, path)
    if tool == "strimzi" and kind == "Kafka":
        return _strimzi_kafka(root, path)
    if tool == "strimzi" and kind == "KafkaConnect":
        entries: dict[str, Entry] = {}
        _config_entries(_child(root, "spec", "config"), entries)
        return connect_units(entries, path) if entries else []
    if tool == "strimzi" and kind == "KafkaMirrorMaker2":
        return _mirror_maker(root, path)
    return []


#: topicctl cluster config fields (its own Go client's options) -> the Kafka setting they
#: are, for the rules that judge them (a literal SASL password, TLS verification off).
_TOPICCTL_CLUSTER = (
    (("spec", "sasl", "password"), "sasl.password"),
    (("spec", "tls", "skipVerify"), "enable.ssl.certificate.verification"),
)


def _topicctl_cluster(root: _Node, path: str) -> list[ConfigUnit]:
    """A topicctl cluster config (``meta`` + ``spec.bootstrapAddrs``): not a Kafka
    properties map (its keys are topicctl's), so only the literal SASL password (KR041) and
    ``tls.skipVerify: true`` (KR034) are judged."""
    entries: dict[str, Entry] = {}
    for keys, setting in _TOPICCTL_CLUSTER:
        found = _child(root, *keys)
        if found is None or found[2].scalar is None:
            continue
        line, col, node = found
        value: object = node.scalar
        if setting == "enable.ssl.certificate.verification":
            if str(value).lower() != "true":
                continue
            value = "false"  # skipVerify: true is verification off
        entries[setting] = Entry(
            key=".".join(keys), value=value, line=line, col=col, setting=setting
        )
    if not entries:
        return []
    return [
        ConfigUnit(
            path=path,
            line=root.line,
            col=root.col,
            entries=entries,
            kind="client",
            kind_forced=True,
            source="topicspec",
            context={"tool": "topicctl", "rules": frozenset({"KR034", "KR041"})},
        )
    ]


#: MirrorMaker 2 connector -> (its topics' replication-factor keys, topic described).
_MM2_TOPICS = {
    "sourceConnector": (
        ("replication.factor", "mirrored topics"),
        ("offset-syncs.topic.replication.factor", "mm2-offset-syncs"),
    ),
    "checkpointConnector": (("checkpoints.topic.replication.factor", "checkpoints"),),
    "heartbeatConnector": (("heartbeats.topic.replication.factor", "heartbeats"),),
}


#: The replication-factor keys of a MirrorMaker 2 properties file (connect-mirror-maker.sh)
#: and the topics they create: its connectors' topics and its Connect internal topics.
_MM2_PROPERTIES_RF = (
    ("replication.factor", "mirrored topics"),
    ("offset-syncs.topic.replication.factor", "mm2-offset-syncs"),
    ("checkpoints.topic.replication.factor", "checkpoints"),
    ("heartbeats.topic.replication.factor", "heartbeats"),
    ("offset.storage.replication.factor", "mm2-offsets"),
    ("config.storage.replication.factor", "mm2-configs"),
    ("status.storage.replication.factor", "mm2-status"),
)


def is_mirror_maker(entries: dict[str, Entry]) -> bool:
    """A MirrorMaker 2 properties file: ``clusters = A, B`` with ``A.bootstrap.servers``."""
    clusters = entries.get("clusters")
    if clusters is None or clusters.dynamic:
        return False
    names = [c.strip() for c in clusters.text.split(",") if c.strip()]
    return any(f"{n}.bootstrap.servers" in entries for n in names)


def mirror_maker_units(entries: dict[str, Entry], path: str) -> list[ConfigUnit]:
    """The topics a MirrorMaker 2 properties file creates, with their replication factors
    (issue 38: read as such, not skipped as "no Kafka settings"); ``-1`` (the target's
    default) is not judged. A ``{cluster}.`` or ``{source}->{target}.`` prefixed key
    applies to that cluster or flow and is read the same way."""
    units: list[ConfigUnit] = []
    clusters = [c.strip() for c in entries["clusters"].text.split(",") if c.strip()]
    servers = [entries.get(f"{c}.bootstrap.servers") for c in clusters]
    local = all(
        s is not None
        and all(h.strip().split(":")[0] in ("localhost", "127.0.0.1") for h in s.text.split(","))
        for s in servers
    )
    for key, entry in entries.items():
        bare = key
        for rf_key, name in _MM2_PROPERTIES_RF:
            if bare != rf_key and not bare.endswith("." + rf_key):
                continue
            if (
                rf_key == "replication.factor"
                and bare != rf_key
                and (bare.endswith(("storage.replication.factor", "topic.replication.factor")))
            ):
                continue
            rf = Entry(
                key=entry.key,
                value=entry.value,
                line=entry.line,
                col=entry.col,
                dynamic=entry.dynamic or entry.text.strip() == "-1",
                setting="replication.factor",
            )
            units.append(
                ConfigUnit(
                    path=path,
                    line=entry.line,
                    col=entry.col,
                    entries={"replication.factor": rf},
                    kind="topic",
                    kind_forced=True,
                    name=name if bare == rf_key else f"{name} ({bare[: -len(rf_key) - 1]})",
                    source="connect",
                    context={
                        "tool": "mirror-maker",
                        "rules": frozenset({"KR042"}),
                        # every cluster it mirrors is on localhost: a dev set-up
                        **({"dev_stack": "its clusters bootstrap from localhost"} if local else {}),
                    },
                )
            )
            break
    return units


def _mirror_maker(root: _Node, path: str) -> list[ConfigUnit]:
    """The topics a Strimzi ``KafkaMirrorMaker2`` creates (mirrored topics, offset syncs,
    checkpoints, heartbeats) and its Connect cluster's internal topics, with their
    replication factors (-1: the target brokers' default, not judged)."""
    units: list[ConfigUnit] = []
    clusters = _child(root, "spec", "clusters")
    for cluster in (clusters[2].sequence or []) if clusters else []:
        entries: dict[str, Entry] = {}
        _config_entries(_child(cluster, "config"), entries)
        units.extend(u for u in connect_units(entries, path) if u.kind == "topic")
    mirrors = _child(root, "spec", "mirrors")
    for mirror in (mirrors[2].sequence or []) if mirrors else []:
        for connector, topics in _MM2_TOPICS.items():
            config: dict[str, Entry] = {}
            _config_entries(_child(mirror, connector, "config"), config)
            for key, name in topics:
                rf = config.get(key)
                if rf is None:
                    continue
                entry = Entry(
                    key=rf.key,
                    value=rf.value,
                    line=rf.line,
                    col=rf.col,
                    dynamic=rf.dynamic or rf.text.strip() == "-1",
                    setting="replication.factor",
                )
                units.append(
                    ConfigUnit(
                        path=path,
                        line=rf.line,
                        col=rf.col,
                        entries={"replication.factor": entry},
                        kind="topic",
                        kind_forced=True,
                        name=name,
                        source="strimzi",
                        context={"tool": "strimzi", "rules": frozenset({"KR042"})},
                    )
                )
    return units


def _topic_resource(root: _Node, path: str, tool: str) -> list[ConfigUnit]:
    entries: dict[str, Entry] = {}
    for keys, setting, scale in _TOPIC_FIELDS[tool]:
        at = _child(root, *keys)
        if at is not None and at[2].mapping is None and at[2].sequence is None:
            entries[setting] = _spec_entry(".".join(keys), setting, at, scale)
    _config_entries(_child(root, "spec", _TOPIC_CONFIGS[tool]), entries)
    name_at = (
        _child(root, "spec", "topicName")
        or _child(root, "metadata", "name")
        or _child(root, "meta", "name")
    )
    spec = _child(root, "spec")
    line, col = (spec[0], spec[1]) if spec else (root.line, root.col)
    context: dict[str, object] = {"tool": tool}
    if tool == "topicctl":  # where the topic goes: a "local-env" says it is a dev cluster
        for field in ("environment", "cluster"):
            at = _child(root, "meta", field)
            if at is not None and isinstance(at[2].scalar, str):
                context[field] = at[2].scalar
    return [
        ConfigUnit(
            path=path,
            line=line,
            col=col,
            entries=entries,
            kind="topic",
            kind_forced=True,
            name=str(name_at[2].scalar) if name_at else None,
            source="strimzi" if tool == "strimzi" else "topicspec",
            context=context,
        )
    ]


def _node_pool_brokers(root: _Node) -> tuple[str, int] | None:
    """(cluster, replicas) of a Strimzi ``KafkaNodePool`` with the broker role, else None
    (the replicas of a pool without a literal count are unknown: None too)."""
    found = _resource_kind(root)
    if found != ("strimzi", "KafkaNodePool"):
        return None
    roles = _child(root, "spec", "roles")
    names = [str(n.scalar) for n in (roles[2].sequence or [])] if roles else []
    replicas = _child(root, "spec", "replicas")
    cluster = _child(root, "metadata", "labels", "strimzi.io/cluster")
    count = replicas[2].scalar if replicas else None
    if "broker" not in names or cluster is None or not isinstance(count, int):
        return None
    return str(cluster[2].scalar), count


def _strimzi_kafka(root: _Node, path: str) -> list[ConfigUnit]:
    """The broker config of a Strimzi ``Kafka``: ``spec.kafka.config``; Strimzi sets
    ``broker.rack`` itself from ``spec.kafka.rack``."""
    kafka = _child(root, "spec", "kafka")
    if kafka is None:
        return []
    entries: dict[str, Entry] = {}
    _config_entries(_child(kafka[2], "config"), entries)
    context: dict[str, object] = {"tool": "strimzi"}
    replicas = _child(kafka[2], "replicas")  # a cluster without node pools
    if replicas is not None and isinstance(replicas[2].scalar, int):
        context["brokers"] = replicas[2].scalar
    rack = _child(kafka[2], "rack")
    if rack is not None:
        entries["broker.rack"] = Entry(
            key="spec.kafka.rack",
            value="<set by Strimzi>",
            line=rack[0],
            col=rack[1],
            dynamic=True,
            setting="broker.rack",
        )
    return [
        ConfigUnit(
            path=path,
            line=kafka[0],
            col=kafka[1],
            entries=entries,
            kind="broker",
            kind_forced=True,
            name=str(n[2].scalar) if (n := _child(root, "metadata", "name")) else None,
            source="strimzi",
            context=context,
        )
    ]


# ----------------------------------------------------------------------------- YAML


class _TooComplex(Exception):
    """A file nested too deeply or expanding too far; carries where (1-based) and why."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


class _YamlTree:
    """Builds the positional tree of a composed YAML document, bounded in depth and in the
    number of nodes aliases may expand to."""

    def __init__(self, loader: yaml.SafeLoader, budget: int) -> None:
        self.loader = loader
        self.left = budget

    def node(self, node: yaml.Node, depth: int = 0) -> _Node:
        mark = node.start_mark
        line, col = mark.line + 1, mark.column + 1
        self.left -= 1
        if self.left < 0:
            raise _TooComplex(
                line, col, "YAML: aliases expand to too many nodes (an alias bomb?); not read"
            )
        if depth > MAX_DEPTH:
            raise _TooComplex(line, col, f"YAML: nested deeper than {MAX_DEPTH} levels")
        out = _Node(line=line, col=col)
        if isinstance(node, yaml.MappingNode):
            items: list[tuple[str, int, int, _Node]] = []
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    merged = self.node(value_node, depth + 1)
                    items.extend(merged.mapping or [])
                    continue
                key = self.loader.construct_object(key_node)
                kmark = key_node.start_mark
                items.append(
                    (str(key), kmark.line + 1, kmark.column + 1, self.node(value_node, depth + 1))
                )
            out.mapping = items
        elif isinstance(node, yaml.SequenceNode):
            out.sequence = [self.node(n, depth + 1) for n in node.value]
        else:
            out.scalar = self.loader.construct_object(node)
        return out


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _expanded_size(
    node: yaml.Node, cap: int, sizes: dict[int, int], active: set[int], depth: int = 0
) -> int:
    """How many nodes ``node`` becomes once its aliases are expanded (at most ``cap + 1``),
    counted on the composed graph, where an anchored node is shared, so in linear time."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    mark = node.start_mark
    if key in active:
        raise _TooComplex(mark.line + 1, mark.column + 1, "YAML: an alias refers to its own anchor")
    if depth > MAX_DEPTH:
        raise _TooComplex(
            mark.line + 1, mark.column + 1, f"YAML: nested deeper than {MAX_DEPTH} levels"
        )
    active.add(key)
    total = 1
    for child in _yaml_children(node):
        total += _expanded_size(child, cap, sizes, active, depth + 1)
        if total > cap:
            break
    active.discard(key)
    sizes[key] = min(total, cap + 1)
    return sizes[key]


def _check_expansion(doc: yaml.Node, cap: int) -> None:
    """Raise :class:`_TooComplex` at the top-level entry where aliases make ``doc`` expand
    past ``cap`` nodes (a "billion laughs" file)."""
    sizes: dict[int, int] = {}
    if _expanded_size(doc, cap, sizes, set()) <= cap:
        return
    total = 1
    entries: list[tuple[yaml.Node, list[yaml.Node]]] = (
        [(k, [k, v]) for k, v in doc.value]
        if isinstance(doc, yaml.MappingNode)
        else [(n, [n]) for n in _yaml_children(doc)]
    )
    at = doc.start_mark
    for where, nodes in entries:
        total += sum(sizes.get(id(n), 1) for n in nodes)
        if total > cap:
            at = where.start_mark
            break
    raise _TooComplex(
        at.line + 1,
        at.column + 1,
        f"YAML: aliases expand this document past {cap} nodes (an alias bomb?); not read",
    )


def _read_yaml(text: str, path: str, kind: Kind | None) -> ReadResult:
    result = ReadResult()
    loader_cls: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        docs = list(yaml.compose_all(text, Loader=loader_cls))
        cap = YAML_NODE_BUDGET + len(text)
        tree = _YamlTree(yaml.SafeLoader(""), cap)
        pools: dict[str, int] = {}  # Strimzi cluster -> brokers of its node pools in this file
        for doc in docs:
            if doc is not None:
                _check_expansion(doc, cap)
                root = tree.node(doc)
                resources = resource_units(root, path)
                if resources is not None:
                    result.units.extend(resources)
                    pool = _node_pool_brokers(root)
                    if pool is not None:
                        pools[pool[0]] = pools.get(pool[0], 0) + pool[1]
                    continue
                if root.mapping is not None and any(
                    _relaxed(k) == "spring" or is_spring_key(k) for k, _, _, _ in root.mapping
                ):
                    flat = [(k[1:], line, col, v) for k, line, col, v in _flatten("", root)]
                    result.units.extend(spring_units(flat, path))
                    # Spring's tree is read above; the rest of the document as usual.
                    rest = [m for m in root.mapping if not _relaxed(m[0]).startswith("spring")]
                    root = _Node(line=root.line, col=root.col, mapping=rest)
                _walk(root, path, kind, None, result.units)
        for unit in result.units:
            if unit.source == "strimzi" and unit.kind == "broker" and unit.name in pools:
                unit.context["brokers"] = pools[unit.name]
    except _TooComplex as exc:
        result.units.clear()
        result.error = ParseError(line=exc.line, col=exc.col, message=exc.message)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        result.error = ParseError(line=line, col=col, message=f"YAML: {exc.problem or exc}")
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        result.error = ParseError(line=1, col=1, message=f"YAML: {_exc_text(exc)}")
    return result


def _exc_text(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return type(exc).__name__ if isinstance(exc, MemoryError) else f"{type(exc).__name__}: {exc}"


# ----------------------------------------------------------------------------- JSON


class _JsonPositions:
    """A tiny JSON parser that keeps positions (the input is already validated by json)."""

    _WS = re.compile(r"[ \t\n\r]*")
    _STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
    _OTHER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def pos(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.starts, index)
        return line, index - self.starts[line - 1] + 1

    def skip(self, i: int) -> int:
        m = self._WS.match(self.text, i)
        return m.end() if m else i

    def parse(self, i: int, depth: int = 0) -> tuple[_Node, int]:
        i = self.skip(i)
        line, col = self.pos(i)
        if depth > MAX_DEPTH:
            raise _TooComplex(line, col, f"JSON: nested deeper than {MAX_DEPTH} levels")
        char = self.text[i]
        if char == "{":
            items: list[tuple[str, int, int, _Node]] = []
            i = self.skip(i + 1)
            while self.text[i] != "}":
                m = self._STRING.match(self.text, i)
                assert m is not None
                kline, kcol = self.pos(i)
                i = self.skip(m.end()) + 1  # the ':'
                child, i = self.parse(i, depth + 1)
                items.append((json.loads(m.group()), kline, kcol, child))
                i = self.skip(i)
                if self.text[i] == ",":
                    i = self.skip(i + 1)
            return _Node(line=line, col=col, mapping=items), i + 1
        if char == "[":
            seq: list[_Node] = []
            i = self.skip(i + 1)
            while self.text[i] != "]":
                child, i = self.parse(i, depth + 1)
                seq.append(child)
                i = self.skip(i)
                if self.text[i] == ",":
                    i = self.skip(i + 1)
            return _Node(line=line, col=col, sequence=seq), i + 1
        m = self._STRING.match(self.text, i) or self._OTHER.match(self.text, i)
        assert m is not None
        return _Node(line=line, col=col, scalar=json.loads(m.group())), m.end()


def _read_json(text: str, path: str, kind: Kind | None) -> ReadResult:
    result = ReadResult()
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        result.error = ParseError(line=exc.lineno, col=exc.colno, message=f"JSON: {exc.msg}")
        return result
    except (RecursionError, ValueError) as exc:
        result.error = ParseError(line=1, col=1, message=f"JSON: {_exc_text(exc)}")
        return result
    try:
        node, _ = _JsonPositions(text).parse(0)
    except _TooComplex as exc:
        result.error = ParseError(line=exc.line, col=exc.col, message=exc.message)
        return result
    connector = _rest_connector(node) if kind is None else None
    if connector is not None:
        result.units.extend(connect_units(connector, path))
        return result
    _walk(node, path, kind, None, result.units)
    return result


def _rest_connector(node: _Node) -> dict[str, Entry] | None:
    """The settings of a Kafka Connect REST connector document: ``{"name": ...,
    "config": {"connector.class": ...}}`` (POST /connectors) or the bare config
    (PUT /connectors/NAME/config); None for any other JSON."""
    config = _child(node, "config")
    body = config[2] if config is not None and config[2].mapping is not None else node
    if body.mapping is None or not any(k == "connector.class" for k, *_ in body.mapping):
        return None
    entries: dict[str, Entry] = {}
    for key, line, col, child in body.mapping:
        value = _scalar_text(child)
        if value is not None or (child.mapping is None and child.sequence is None):
            entries[key] = _entry(key, value, line, col)
    return entries


# ----------------------------------------------------------------------------- TOML

# No two quantifiers here may match the same characters: "[a" + 300,000 blanks (inside a
# multi-line string) took minutes with a lazy name followed by \s*.
_TOML_HEADER = re.compile(r"^[ \t]*\[(\[?)([^\]]*)\]\]?[ \t]*(?:#.*)?$")
_TOML_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
    + r"""(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'))*)\s*="""
)
_TOML_PART = re.compile(r"""[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*'""")


def _toml_parts(expr: str) -> list[str]:
    parts = []
    for token in _TOML_PART.findall(expr):
        if token.startswith('"'):
            parts.append(json.loads(token))
        elif token.startswith("'"):
            parts.append(token[1:-1])
        else:
            parts.append(token)
    return parts


def _toml_positions(text: str) -> dict[tuple[object, ...], tuple[int, int]]:
    positions: dict[tuple[object, ...], tuple[int, int]] = {}
    table: tuple[object, ...] = ()
    array_counts: dict[tuple[object, ...], int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        header = _TOML_HEADER.match(line)
        if header:
            parts = tuple(_toml_parts(header.group(2)))
            if header.group(1):
                index = array_counts.get(parts, -1) + 1
                array_counts[parts] = index
                table = (*parts, index)
            else:
                table = parts
            positions.setdefault(table, (number, line.index("[") + 1))
            continue
        key = _TOML_KEY.match(line)
        if key:
            col = len(line) - len(line.lstrip()) + 1
            positions.setdefault((*table, *_toml_parts(key.group(1))), (number, col))
    return positions


def _toml_node(
    value: object,
    path: tuple[object, ...],
    pos: dict[tuple[object, ...], tuple[int, int]],
    default: tuple[int, int],
) -> _Node:
    line, col = pos.get(path, default)
    if len(path) > MAX_DEPTH:
        raise _TooComplex(line, col, f"TOML: nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        items = []
        for key, child in value.items():
            kline, kcol = pos.get((*path, key), (line, col))
            items.append(
                (str(key), kline, kcol, _toml_node(child, (*path, key), pos, (kline, kcol)))
            )
        return _Node(line=line, col=col, mapping=items)
    if isinstance(value, list):
        seq = [_toml_node(v, (*path, i), pos, (line, col)) for i, v in enumerate(value)]
        return _Node(line=line, col=col, sequence=seq)
    return _Node(line=line, col=col, scalar=value)


def _read_toml(text: str, path: str, kind: Kind | None) -> ReadResult:
    result = ReadResult()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line, col = (int(match.group(1)), int(match.group(2))) if match else (1, 1)
        message = re.sub(r"\s*\(at .*\)$", "", str(exc))
        result.error = ParseError(line=line, col=col, message=f"TOML: {message}")
        return result
    except (RecursionError, ValueError) as exc:
        result.error = ParseError(line=1, col=1, message=f"TOML: {_exc_text(exc)}")
        return result
    if "tool" in data and isinstance(data["tool"], dict):
        data["tool"].pop("kresilient", None)  # our own settings are not a Kafka config
    try:
        root = _toml_node(data, (), _toml_positions(text), (1, 1))
    except _TooComplex as exc:
        result.error = ParseError(line=exc.line, col=exc.col, message=exc.message)
        return result
    _walk(root, path, kind, None, result.units)
    return result


# ----------------------------------------------------------------------------- .properties

_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape_properties(raw: str, line: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        char = raw[i]
        if char != "\\" or i + 1 >= len(raw):
            out.append(char)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            m = _UNICODE_ESCAPE.match(raw, i)
            if not m:
                raise _PropertiesError(line, i + 1, "malformed \\uxxxx escape")
            out.append(chr(int(m.group(1), 16)))
            i = m.end()
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    text = "".join(out)
    if has_lone_surrogate(text):
        # \uXXXX escapes are UTF-16 code units: a pair is one character (Java reads it so).
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return text


class _PropertiesError(Exception):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(message)
        self.line, self.col, self.message = line, col, message


def _logical_lines(text: str) -> Iterator[tuple[int, int, str]]:
    """(line, column of the first character, logical line) with ``\\`` continuations joined."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start, raw = i + 1, lines[i]
        stripped = raw.lstrip(" \t\f")
        col = len(raw) - len(stripped) + 1
        i += 1
        if not stripped or stripped[0] in "#!":
            continue
        parts = [stripped]
        # Parts are collected, not concatenated, so a long run of continuations stays linear.
        while _continues(parts[-1]):
            parts[-1] = parts[-1][:-1]
            if i >= len(lines):
                break
            parts.append(lines[i].lstrip(" \t\f"))
            i += 1
        yield start, col, "".join(parts)


def _continues(line: str) -> bool:
    """True when ``line`` ends in an odd number of backslashes (a continuation)."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _split_property(logical: str) -> tuple[str, str]:
    i = 0
    while i < len(logical):
        char = logical[i]
        if char == "\\":
            i += 2
            continue
        if char in "=: \t\f":
            key = logical[:i]
            rest = logical[i:].lstrip(" \t\f")
            if char in " \t\f" and rest[:1] in ("=", ":"):
                rest = rest[1:].lstrip(" \t\f")
            elif char in "=:":
                rest = logical[i + 1 :].lstrip(" \t\f")
            return key, rest
        i += 1
    return logical, ""


#: An INI section header (``[kafka-global]``, ``[consumer]``): librdkafka applications and
#: Python's configparser read ``.conf``/``.cfg``/``.ini`` files in sections; it is no key.
_INI_SECTION = re.compile(r"\[[^\]=:]+\]")


def _read_properties(text: str, path: str, kind: Kind | None) -> ReadResult:
    result = ReadResult()
    entries: dict[str, Entry] = {}
    try:
        for line, col, logical in _logical_lines(text):
            if logical[0] == ";" or _INI_SECTION.fullmatch(logical.rstrip()):
                # An INI comment or section header. Sections are read as one config, the
                # way the files' readers merge them (configparser's [default] plus
                # [consumer]; librdkafka takes topic settings at the global level).
                continue
            raw_key, raw_value = _split_property(logical)
            key = _unescape_properties(raw_key, line)
            entries[key] = _entry(key, _unescape_properties(raw_value, line), line, col)
    except _PropertiesError as exc:
        result.error = ParseError(line=exc.line, col=exc.col, message=exc.message)
        return result
    spring = [(e.key, e.line, e.col, e.value) for e in entries.values() if is_spring_key(e.key)]
    if spring:
        result.units.extend(spring_units(spring, path))
        entries = {k: e for k, e in entries.items() if not k.lower().startswith("spring.")}
    if kind is None and is_mirror_maker(entries):
        result.units.extend(mirror_maker_units(entries, path))
        return result
    if kind is None and is_connect(entries):
        result.units.extend(connect_units(entries, path))
        return result
    if entries and (kind is not None or looks_like_kafka(entries, False)):
        # A finding about an unset key points at the first setting, not at line 1 (often a
        # licence comment).
        first = min(entries.values(), key=lambda e: (e.line, e.col))
        result.units.append(
            ConfigUnit(
                path=path,
                line=first.line,
                col=first.col,
                entries=entries,
                kind=kind or "client",
                kind_forced=kind is not None,
                source="properties",
            )
        )
    return result


# ----------------------------------------------------------------------------- .env

_ENV_COMMENT = re.compile(r"\s#")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*)$")


def _env_value(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        inner = raw[1:-1]
        return inner.replace('\\"', '"') if raw[0] == '"' else inner
    comment = _ENV_COMMENT.search(raw)  # linear; r"\s+#.*$" was quadratic on long blanks
    return raw[: comment.start()].rstrip() if comment else raw


def _read_env(text: str, path: str, kind: Kind | None) -> ReadResult:
    result = ReadResult()
    entries: dict[str, Entry] = {}
    roles: set[Kind] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            result.error = ParseError(
                line=number,
                col=len(line) - len(line.lstrip()) + 1,
                message="not a NAME=value line",
            )
            return result
        if not _ENV_KEY.match(m.group(1)):
            continue
        key, role = env_to_key(m.group(1))
        if role:
            roles.add(role)
        entries[key] = _entry(key, _env_value(m.group(2)), number, m.start(1) + 1)
    hint = kind or (roles.pop() if len(roles) == 1 else None)
    if entries:
        result.units.append(
            ConfigUnit(
                path=path,
                line=1,
                col=1,
                entries=entries,
                kind=hint or "client",
                kind_forced=hint is not None,
                source="env",
            )
        )
    return result


# ----------------------------------------------------------------------------- dispatch

Reader = Callable[[str, str, "Kind | None"], ReadResult]
_EXTENSIONS: dict[str, str] = {
    ".properties": "properties",
    ".conf": "properties",
    ".cfg": "properties",
    ".ini": "properties",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".json": "json",
    ".toml": "toml",
    ".env": "env",
    ".py": "python",
    ".pyi": "python",
    ".tf": "terraform",
}


#: The file name extensions a directory walk picks up (``.env`` files are matched by name).
KNOWN_EXTENSIONS: tuple[str, ...] = tuple(sorted(_EXTENSIONS))


def detect_format(path: str, text: str | None = None) -> str | None:
    """The format of ``path`` from its name (``.env.prod`` and ``prod.env`` are env files)."""
    base = os.path.basename(path)
    if base == ".env" or base.startswith(".env.") or base.endswith(".env"):
        return "env"
    ext = os.path.splitext(base)[1].lower()
    if ext in _EXTENSIONS:
        return _EXTENSIONS[ext]
    if text is not None:
        head = text.lstrip()[:1]
        return "json" if head in ("{", "[") else "properties"
    return None


def read_text(text: str, path: str, fmt: str, kind: Kind | None = None) -> ReadResult:
    """Parse ``text`` (the content of ``path``) in format ``fmt``; never raises on bad input."""
    readers: dict[str, Reader] = {
        "properties": _read_properties,
        "yaml": _read_yaml,
        "json": _read_json,
        "toml": _read_toml,
        "env": _read_env,
        "python": read_python,
        "terraform": read_terraform,
    }
    return readers[fmt](text, path, kind)
