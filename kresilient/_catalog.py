"""The one source of truth for Kafka configuration keys, kinds and defaults.

Two catalogs ship as package data, both generated (never hand-edited) by
``kresilient/_data/generate_catalog.py``:

* ``librdkafka_properties.json``: every property of the librdkafka the installed confluent-kafka
  wheel bundles, parsed from ``rd_kafka_conf_properties_show()`` (the table that becomes
  librdkafka's CONFIGURATION.md) for exactly that version. A test compares it with the
  installed library, so a version bump without regeneration fails loudly.
* ``kafka_configs.json``: the broker, topic and Java-client configuration definitions of the
  Apache Kafka jars (``ConfigDef``), so lint and audit know broker/topic keys and can tell a
  Java-only client key from a typo.

Example::

    >>> from kresilient import _catalog as catalog
    >>> catalog.lookup("acks").canonical
    'request.required.acks'
    >>> catalog.suggest("enable.idempotense")
    ['enable.idempotence']
"""

from __future__ import annotations

import ctypes
import ctypes.util
import difflib
import functools
import glob
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

__all__ = [
    "KafkaConfigKey",
    "Property",
    "all_kafka_configs",
    "all_properties",
    "broker_config",
    "is_secret_key",
    "java_client_kinds",
    "kafka_version",
    "librdkafka_version",
    "lookup",
    "parse_properties_table",
    "secret_keys",
    "suggest",
    "topic_config",
]

Scope = Literal["*", "P", "C"]
KafkaKind = Literal["broker", "topic", "producer", "consumer", "admin"]

#: Keys the confluent-kafka Python binding consumes itself (never reach librdkafka), with scope.
PYTHON_BINDING_KEYS: Mapping[str, tuple[Scope, str]] = {
    "error_cb": ("*", "Callback for generic/global error events (errors are dropped without it)."),
    "throttle_cb": ("*", "Callback for broker throttle events."),
    "stats_cb": ("*", "Callback receiving the statistics JSON every statistics.interval.ms."),
    "logger": ("*", "A logging.Logger receiving librdkafka log lines."),
    "oauth_cb": ("*", "Callback returning an OAUTHBEARER token."),
    "default.topic.config": ("*", "Deprecated: topic properties may be set at the top level."),
    "on_delivery": ("P", "Delivery report callback (err, msg) for every produced message."),
    "on_commit": ("C", "Callback (err, partitions) after every offset commit."),
    "key.serializer": ("P", "SerializingProducer key serializer."),
    "value.serializer": ("P", "SerializingProducer value serializer."),
    "key.deserializer": ("C", "DeserializingConsumer key deserializer."),
    "value.deserializer": ("C", "DeserializingConsumer value deserializer."),
    # Hidden librdkafka properties (not in CONFIGURATION.md) that the binding passes through.
    "test.mock.num.brokers": ("*", "Hidden: start librdkafka's mock cluster (tests only)."),
    "test.mock.broker.rtt": ("*", "Hidden: mock cluster round-trip time in ms (tests only)."),
}

#: Integer properties that also accept a symbolic value (librdkafka ``s2i`` table).
_SYMBOLIC_INTS: Mapping[str, Mapping[str, int]] = {"request.required.acks": {"all": -1}}

# A key the catalogs do not know (a connector's, Schema Registry's, a listener-prefixed broker
# key) is secret when its NAME looks like a credential's; a key they know is decided by its
# type alone (see secret_keys()).
_SECRET_NAME = re.compile(
    r"(password|secret|jaas\.config|\.key\.pem|private\.key|oauthbearer\.config|"
    r"[._]token$|credentials?$|api\.key)",
    re.IGNORECASE,
)

#: Keys librdkafka flags sensitive that kresilient still shows, the only exceptions to "the
#: catalogs' types decide" (tests/test_secrets_exits.py pins them): a user name is an identity,
#: not a credential (errors and ``doctor`` must say WHICH principal was refused; the Java client
#: keeps it inside ``sasl.jaas.config``, secret as a whole); ``ssl.key.location`` is the path
#: of the key, not the key (Java types its ``ssl.keystore.location`` STRING; hunting the path
#: in free text would blank the certificate and CA paths errors name beside it).
NOT_SECRET: frozenset[str] = frozenset({"sasl.username", "ssl.key.location"})

_TRUE = frozenset({"true", "t", "1"})
_FALSE = frozenset({"false", "f", "0"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Property:
    """One librdkafka configuration property (or a key the Python binding consumes).

    ``scope`` is ``"*"`` (any client), ``"P"`` (producer) or ``"C"`` (consumer); ``level`` is
    ``"global"`` or ``"topic"`` (topic-level properties may be set at the top level too).
    ``alias_of`` names the canonical property for an alias such as ``acks``.
    """

    name: str
    scope: Scope
    level: Literal["global", "topic"]
    type: str
    default: str | None
    minimum: float | None
    maximum: float | None
    allowed: tuple[str, ...]
    importance: str
    description: str
    deprecated: bool
    experimental: bool
    alias_of: str | None
    aliases: tuple[str, ...]
    is_secret: bool
    source: Literal["librdkafka", "python"]

    @property
    def canonical(self) -> str:
        """The property name librdkafka stores the value under (resolves aliases)."""
        return self.alias_of or self.name

    def check_value(self, value: object) -> str | None:
        """Return why ``value`` would be rejected by librdkafka, or ``None`` if accepted.

        Mirrors ``rd_kafka_anyconf_set_prop0``: integers parsed like ``strtol(s, &end, 0)``
        (trailing characters ignored) and floats like ``strtod``, then range-checked;
        booleans ``true/false/t/f/1/0``; enum values and CSV flags case-insensitively.
        """
        text = to_config_string(value)
        if self.type == "boolean":
            if text.lower() in _TRUE | _FALSE:
                return None
            return "expected true or false"
        if self.type in ("integer", "float"):
            if text.lower() in _SYMBOLIC_INTS.get(self.canonical, {}):
                return None
            number, _ = parse_number(text, integer=self.type == "integer")
            if number is None:
                return f"expected {'an integer' if self.type == 'integer' else 'a number'}"
            if self.minimum is not None and number < self.minimum:
                return f"below the minimum {_fmt(self.minimum)}"
            if self.maximum is not None and number > self.maximum:
                return f"above the maximum {_fmt(self.maximum)}"
            return None
        allowed = {a.lower() for a in self.allowed}
        if self.type == "enum" and allowed and text.lower() not in allowed:
            return f"expected one of {', '.join(self.allowed)}"
        if self.type == "csv flags" and allowed:
            flags = [p.strip() for p in text.split(",")]
            bad = [f for f in flags if f and f.lower() not in allowed]
            if bad:
                return f"unknown flag(s) {', '.join(bad)}; expected {', '.join(self.allowed)}"
            if not any(flags):
                return "expected at least one flag"
        return None

    def ignored_suffix(self, value: object) -> str:
        """Characters librdkafka silently ignores after a number (``"1.5"`` -> ``".5"``)."""
        if self.type not in ("integer", "float"):
            return ""
        text = to_config_string(value)
        number, rest = parse_number(text, integer=self.type == "integer")
        return rest if number is not None else ""


_STRTOL = re.compile(r"\s*([+-]?)(?:0[xX]([0-9a-fA-F]+)|(0[0-7]*)|([1-9][0-9]*))")
_STRTOD = re.compile(
    r"\s*[+-]?(?:nan|inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)", re.IGNORECASE
)


def parse_number(text: str, *, integer: bool) -> tuple[float | None, str]:
    """(value, ignored rest) as C ``strtol(text, &end, 0)`` / ``strtod`` read it."""
    if integer:
        m = _STRTOL.match(text)
        if not m:
            return None, text
        sign = -1 if m.group(1) == "-" else 1
        if m.group(2):
            return sign * int(m.group(2), 16), text[m.end() :]
        if m.group(3):
            return sign * int(m.group(3), 8), text[m.end() :]
        return sign * int(m.group(4)), text[m.end() :]
    m = _STRTOD.match(text)
    if not m:
        return None, text
    return float(m.group()), text[m.end() :]


@dataclass(frozen=True, kw_only=True, slots=True)
class KafkaConfigKey:
    """A broker, topic or Java-client configuration key of Apache Kafka (from ``ConfigDef``).

    ``synonym`` is, for a topic key, the broker key that supplies its default (e.g.
    ``max.message.bytes`` -> ``message.max.bytes``); for a broker key, its dynamic update
    mode (``read-only``, ``per-broker`` or ``cluster-wide``).
    """

    name: str
    kind: KafkaKind
    type: str
    default: str | None
    valid: str | None
    importance: str
    internal: bool
    synonym: str | None
    description: str

    @property
    def is_secret(self) -> bool:
        """True for ``PASSWORD``-typed keys (and keys the other catalog calls secret)."""
        return self.type == "password" or is_secret_key(self.name)


def _fmt(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def to_config_string(value: object) -> str:
    """Render a config value the way confluent-kafka hands it to librdkafka."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def is_secret_key(name: str) -> bool:
    """True when the value under ``name`` must never be printed (passwords, keys, tokens).

    A key of either catalog is secret when its type says so (:func:`secret_keys`); a key
    neither catalog knows, when its name looks like a credential's (``database.password``,
    ``listener.name.x.sasl.jaas.config``, ``bearer.auth.token``).
    """
    if name in secret_keys():
        return True
    if name in NOT_SECRET or _is_catalog_key(name):
        return False
    return bool(_SECRET_NAME.search(name))


@functools.cache
def secret_keys() -> frozenset[str]:
    """Every key whose value must never be printed, as the catalogs' TYPES decide it.

    * librdkafka: every property librdkafka itself flags sensitive (``_RK_SENSITIVE``: the
      values it blanks in its own ``debug=conf`` dump, recorded as ``is_secret`` by the
      generator), and the aliases of those;
    * Java (producer, consumer, admin and broker ``ConfigDef``): every ``PASSWORD``-typed key
      (what the Java clients print as ``[hidden]``), ``ssl.keystore.key`` included;

    minus :data:`NOT_SECRET`. Not a hand list: regenerating the catalogs updates it.
    """
    props = _properties()
    rdk = {p.name for p in props.values() if p.is_secret}
    rdk |= {p.name for p in props.values() if p.alias_of in rdk}
    kinds: tuple[KafkaKind, ...] = ("producer", "consumer", "admin", "broker")
    java = {k.name for kind in kinds for k in _kafka_keys(kind).values() if k.type == "password"}
    return frozenset((rdk | java) - NOT_SECRET)


@functools.cache
def _catalog_keys() -> frozenset[str]:
    kinds: tuple[KafkaKind, ...] = ("producer", "consumer", "admin", "broker", "topic")
    return frozenset(_properties()) | {n for kind in kinds for n in _kafka_keys(kind)}


def _is_catalog_key(name: str) -> bool:
    return name in _catalog_keys()


# --------------------------------------------------------------------------- loading


def _read_json(name: str) -> Any:
    return json.loads(resources.files("kresilient").joinpath("_data", name).read_text("utf-8"))


@functools.cache
def _librdkafka_data() -> dict[str, Any]:
    data: dict[str, Any] = _read_json("librdkafka_properties.json")
    return data


@functools.cache
def _kafka_data() -> dict[str, Any]:
    data: dict[str, Any] = _read_json("kafka_configs.json")
    return data


def _property_from_json(raw: Mapping[str, Any], aliases: tuple[str, ...]) -> Property:
    return Property(
        name=raw["name"],
        scope=raw["scope"],
        level=raw["level"],
        type=raw["type"],
        default=raw["default"],
        minimum=raw["minimum"],
        maximum=raw["maximum"],
        allowed=tuple(raw["allowed"]),
        importance=raw["importance"],
        description=raw["description"],
        deprecated=raw["deprecated"],
        experimental=raw["experimental"],
        alias_of=raw["alias_of"],
        aliases=aliases,
        is_secret=raw["is_secret"],
        source="librdkafka",
    )


@functools.cache
def _properties() -> dict[str, Property]:
    raws: list[dict[str, Any]] = _librdkafka_data()["properties"]
    alias_map: dict[str, list[str]] = {}
    for raw in raws:
        if raw["alias_of"]:
            alias_map.setdefault(raw["alias_of"], []).append(raw["name"])
    props: dict[str, Property] = {}
    # Global definitions win over topic ones of the same name, as in rd_kafka_conf_set().
    for level in ("global", "topic"):
        for raw in raws:
            if raw["level"] == level and raw["name"] not in props:
                aliases = tuple(sorted(alias_map.get(raw["name"], ())))
                props[raw["name"]] = _property_from_json(raw, aliases)
    for name, (scope, doc) in PYTHON_BINDING_KEYS.items():
        props.setdefault(
            name,
            Property(
                name=name,
                scope=scope,
                level="global",
                type="python",
                default=None,
                minimum=None,
                maximum=None,
                allowed=(),
                importance="medium",
                description=doc,
                deprecated=name == "default.topic.config",
                experimental=False,
                alias_of=None,
                aliases=(),
                is_secret=False,
                source="python",
            ),
        )
    return props


@functools.cache
def _kafka_keys(kind: KafkaKind) -> dict[str, KafkaConfigKey]:
    out: dict[str, KafkaConfigKey] = {}
    for raw in _kafka_data()[kind]:
        out[raw["name"]] = KafkaConfigKey(
            name=raw["name"],
            kind=kind,
            type=raw["type"],
            default=raw["default"],
            valid=raw["valid"],
            importance=raw["importance"],
            internal=raw["internal"],
            synonym=raw["synonym"],
            description=raw["description"],
        )
    return out


# --------------------------------------------------------------------------- public lookups


def librdkafka_version() -> str:
    """The librdkafka version the shipped property catalog was generated from."""
    return str(_librdkafka_data()["librdkafka_version"])


def kafka_version() -> str:
    """The Apache Kafka version the shipped broker/topic catalog was generated from."""
    return str(_kafka_data()["kafka_version"])


def lookup(name: str) -> Property | None:
    """The librdkafka (or Python binding) property called ``name``, or ``None`` if unknown."""
    return _properties().get(name)


def all_properties() -> tuple[Property, ...]:
    """Every known client property (librdkafka's and the binding's), sorted by name."""
    return tuple(sorted(_properties().values(), key=lambda p: p.name))


def broker_config(name: str) -> KafkaConfigKey | None:
    """The Kafka broker configuration key ``name`` (``server.properties``), or ``None``."""
    return _kafka_keys("broker").get(name)


def topic_config(name: str) -> KafkaConfigKey | None:
    """The Kafka topic-level configuration key ``name``, or ``None``."""
    return _kafka_keys("topic").get(name)


def all_kafka_configs(kind: KafkaKind) -> tuple[KafkaConfigKey, ...]:
    """Every Kafka configuration key of one kind, sorted by name."""
    return tuple(sorted(_kafka_keys(kind).values(), key=lambda k: k.name))


def java_client_kinds(name: str) -> tuple[str, ...]:
    """Which Java clients (``producer``, ``consumer``, ``admin``) know the key ``name``."""
    kinds: tuple[KafkaKind, ...] = ("producer", "consumer", "admin")
    return tuple(k for k in kinds if name in _kafka_keys(k))


def suggest(
    name: str,
    *,
    among: Iterable[str] | None = None,
    kind: KafkaKind | Literal["client"] = "client",
    n: int = 3,
) -> list[str]:
    """Close matches for a misspelled ``name`` ("did you mean"), best first.

    Candidates are the client properties, or the Kafka keys of ``kind`` (``broker``,
    ``topic`` ...), or ``among`` when given. Results for catalog pools are cached.
    """
    if among is not None:
        return _close(name, tuple(among), n)
    return list(_suggest_cached(name, kind, n))


@functools.lru_cache(maxsize=4096)
def _suggest_cached(name: str, kind: str, n: int) -> tuple[str, ...]:
    pool = tuple(_properties()) if kind == "client" else tuple(_kafka_keys(kind))
    return tuple(_close(name, pool, n))


def _close(name: str, candidates: tuple[str, ...], n: int) -> list[str]:
    lowered = name.lower().replace("_", ".").replace("-", ".")
    exact = [c for c in candidates if c.lower() == lowered and c != name]
    close = difflib.get_close_matches(lowered, candidates, n=n, cutoff=0.75)
    return list(dict.fromkeys(exact + close))[:n]


# --------------------------------------------------------------------------- generation support


def parse_properties_table(text: str, sensitive: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Parse the Markdown table printed by ``rd_kafka_conf_properties_show()``.

    Returns one JSON-ready dict per row, with ``level`` set from the section heading.
    ``sensitive`` are the properties librdkafka flags sensitive
    (:func:`installed_sensitive_properties`; the table does not show the flag): they, and their
    aliases, get ``is_secret``.
    """
    secret = set(sensitive)
    level = "global"
    rows: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("## Topic configuration"):
            level = "topic"
            continue
        cells = [c.strip() for c in line.split("|", 5)]
        if len(cells) != 6 or cells[0] in ("Property", "") or cells[0].startswith("---"):
            continue
        name, scope, rng, default, importance, desc = cells
        type_match = re.search(r"<br>\*Type: ([^*]+)\*\s*$", desc)
        ptype = type_match.group(1).strip() if type_match else "string"
        ptype = {"enum value": "enum", "CSV flags": "csv flags"}.get(ptype, ptype)
        description = desc[: type_match.start()].strip() if type_match else desc
        alias = re.search(r"Alias for `([^`]+)`", description)
        minimum = maximum = None
        allowed: list[str] = []
        bounds = re.fullmatch(r"(-?[\d.]+) \.\. (-?[\d.]+)", rng)
        if bounds:
            conv = int if ptype == "integer" else float
            minimum, maximum = conv(bounds.group(1)), conv(bounds.group(2))
        elif rng and ptype in ("enum", "csv flags", "boolean"):
            allowed = [v.strip() for v in rng.split(",") if v.strip()]
        rows.append(
            {
                "name": name,
                "scope": scope,
                "level": level,
                "type": ptype,
                "default": default if default != "" else None,
                "minimum": minimum,
                "maximum": maximum,
                "allowed": allowed,
                "importance": importance,
                "description": re.sub(r"\s+", " ", description),
                "deprecated": "**DEPRECATED**" in description,
                "experimental": "**EXPERIMENTAL**" in description,
                "alias_of": alias.group(1) if alias else None,
                "is_secret": name in secret or (alias is not None and alias.group(1) in secret),
            }
        )
    return rows


def _librdkafka_library() -> ctypes.CDLL:
    """Load the librdkafka confluent-kafka uses (the wheel-bundled one, else the system's)."""
    import confluent_kafka  # local import: only generation and the drift test need it

    pkg_dir = os.path.dirname(os.path.dirname(confluent_kafka.__file__))
    bundled = sorted(glob.glob(os.path.join(pkg_dir, "confluent_kafka.libs", "librdkafka*.so*")))
    path = bundled[0] if bundled else ctypes.util.find_library("rdkafka")
    if not path:
        raise OSError("librdkafka not found next to confluent_kafka nor on the system")
    return ctypes.CDLL(path)


def installed_properties_table() -> tuple[str, str]:
    """(version, table text) of the installed librdkafka, via ``rd_kafka_conf_properties_show``."""
    import tempfile

    lib = _librdkafka_library()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_version_str.restype = ctypes.c_char_p
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "conf.md")
        handle = libc.fopen(path.encode(), b"w")
        if not handle:
            raise OSError(f"cannot open {path}")
        lib.rd_kafka_conf_properties_show(handle)
        libc.fclose(handle)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    return lib.rd_kafka_version_str().decode(), text


#: What :func:`installed_sensitive_properties` sets each probed property to.
_PROBE_VALUE = "kresilient-probe-value"


def installed_sensitive_properties() -> frozenset[str]:
    """The properties the installed librdkafka flags sensitive (``_RK_SENSITIVE``).

    The flag is in neither the properties table nor ``rd_kafka_conf_dump``; librdkafka shows
    it only by printing ``[redacted]`` for such a value in the ``debug=conf`` dump of a new
    client. So each string property (not an alias: an alias shares its property's flag) is set
    alone on a producer that never connects, and the dump read back. A property whose probe
    value the client refuses (a callback, a path it opens) is not sensitive there; the drift
    test compares the result with the shipped catalog.
    """
    import logging

    import confluent_kafka  # local import: only generation and the drift test need it

    lines: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger("kresilient._catalog.probe")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    handler = _Collect()
    log.addHandler(handler)
    found: set[str] = set()
    try:
        for prop in _properties().values():
            if prop.source != "librdkafka" or prop.alias_of or prop.type != "string":
                continue
            lines.clear()
            conf = {
                "bootstrap.servers": "127.0.0.1:9",
                "debug": "conf",
                "logger": log,
                prop.name: _PROBE_VALUE,
            }
            try:
                client = confluent_kafka.Producer(conf)
            except (confluent_kafka.KafkaException, TypeError, ValueError):
                continue
            client.poll(0)
            del client
            if any(f" {prop.name} = [redacted]" in line for line in lines):
                found.add(prop.name)
    finally:
        log.removeHandler(handler)
    return frozenset(found)
