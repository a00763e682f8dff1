"""``engine="jvm"``: Spark's built-in ``kafka`` sink behind kresilient's checks.

A Python data source cannot hand rows to a JVM writer, so this engine is a function:
:func:`write` (batch) and :func:`write_stream` (streaming, one :func:`write` per micro-batch
through ``foreachBatch``). What it does, all on the driver before any row moves:

* the producer settings are the Java client's (``linger.ms``, ``batch.size`` ...): unknown keys
  are refused (checked against the Java ``ProducerConfig``), ``acks=all`` and
  ``enable.idempotence=true`` are forced, weaker values refused naming the key; Spark pools
  producers by their settings, so writes with the same settings share a ``client.id`` (and the
  pooled producers, as the built-in sink's writes do) until one fails: the next write gets a
  new ``client.id``, so it never inherits a producer the failed write left behind;
* the target topics' settings are read with the Java ``Admin`` client (partition count,
  ``max.message.bytes``, ``cleanup.policy``, timestamp type and window); the client stays
  open between writes and what it read serves the writes of the next
  :data:`TOPIC_SETTINGS_TTL` seconds (a streaming query's micro-batches pay it once);
* one SQL projection routes every row that can be known unproducible before sending to the
  dead-letter topic, with ``kresilient.*`` headers built in SQL; every other row goes to its
  topic unchanged; Spark's ``kafka`` sink writes both in one pass (the projection has no
  lambda, so it runs in whole-stage generated code);
* counts come from ``Dataset.observe`` (a row count, and one count per reason the write's
  rows can get) over the V2 write path (the V1 path never reports
  observed metrics, so :class:`pyspark.sql.Observation` would block there): the write runs
  with ``kafka`` removed from ``spark.sql.sources.useV1SourceList`` for its duration;
* secret settings never reach Spark's options: the V2 write node prints its producer settings
  in the SQL tab's plan graph and the event log's ``sparkPlanInfo``, which Spark never
  redacts. Each secret is written to a private file (0600, in a 0700 directory, removed after
  the write) and the options carry a Java ``config.providers`` placeholder
  (``${kresilient:<file>:<key>}``) that the Kafka client resolves when it creates a producer.

What it does NOT do: a row the broker refuses anyway (a limit not visible in the topic's
settings, a compressed batch over the limit, authorization) fails the task, as with the
built-in sink; no per-row classification of delivery errors, no exactly-once. Use
``engine="python"`` for those.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kresilient.errors import ConfigError, SchemaError
from kresilient.redaction import is_secret_key
from kresilient.spark._options import column_layout, redact_plan_options
from kresilient.spark._summary import WriteSummary

__all__ = [
    "JAVA_FORCED",
    "TopicLimits",
    "java_producer_options",
    "retire_client_id",
    "route_plan",
    "write_jvm",
]

#: Settings forced on the Java producer.
JAVA_FORCED: Mapping[str, str] = {"acks": "all", "enable.idempotence": "true"}

_REFUSED = {
    "transactional.id": "engine='jvm' has no exactly-once; use engine='python' with "
    "guarantee='exactly_once' (streaming)",
    "key.serializer": "the sink writes the key column's bytes",
    "value.serializer": "the sink writes the value column's bytes",
}

#: librdkafka names a user may bring from the Python engine, with the Java name to use.
_LIBRDKAFKA_HINTS = {
    "queue.buffering.max.ms": "linger.ms",
    "message.max.bytes": "max.request.size",
    "queue.buffering.max.kbytes": "buffer.memory",
    "message.timeout.ms": "delivery.timeout.ms",
    "batch.num.messages": "batch.size (bytes)",
    "max.in.flight": "max.in.flight.requests.per.connection",
}

_DEFAULT_MAX_REQUEST = 1048576
#: Upper bound of a one-record batch's overhead (Java's
#: ``AbstractRecords.estimateSizeInBytesUpperBound``: 61-byte batch header + 21 per record).
_BATCH_OVERHEAD = 61 + 21
_HEADER_OVERHEAD = 10  # two varint lengths per header, at most 5 bytes each
_DLQ_HEADER_ROOM = 8192  # kresilient's headers on a dead letter (message text capped below)


def java_producer_options(
    options: Mapping[str, Any], *, known: frozenset[str] | None = None
) -> dict[str, str]:
    """Validate Java-client producer settings; return them with the safe ones forced.

    ``known``: the Java ``ProducerConfig`` names (unknown keys are refused when given).
    Raises :class:`~kresilient.ConfigError` naming the key. ``client.id`` becomes
    ``<the user's client.id or kresilient-spark>-<suffix>``: the same suffix for the same
    settings until :func:`retire_client_id` (after a failed write).

    Example::

        >>> o = java_producer_options({"linger.ms": 5, "bootstrap.servers": "b:9092"})
        >>> o["acks"], o["enable.idempotence"], o["linger.ms"]
        ('all', 'true', '5')
    """
    out: dict[str, str] = {}
    for raw, value in options.items():
        key = str(raw)
        if key.startswith("kafka."):
            key = key[len("kafka.") :]
        if key in _REFUSED:
            raise ConfigError(f"option {key!r} is not supported: {_REFUSED[key]}", key=key)
        if known is not None and key not in known and not _is_provider_key(key):
            hint = _LIBRDKAFKA_HINTS.get(key)
            raise ConfigError(
                f"option {key!r} is not a Java producer setting (engine='jvm' runs the Java "
                "client)" + (f": use {hint!r}" if hint else ""),
                key=key,
            )
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    if not out.get("bootstrap.servers"):
        raise ConfigError("bootstrap_servers is required", key="bootstrap.servers")
    acks = out.get("acks", "all").strip().lower()
    if acks not in ("all", "-1"):
        raise ConfigError(
            f"acks={acks!r} can lose acknowledged rows; kresilient forces acks=all", key="acks"
        )
    if out.get("enable.idempotence", "true").strip().lower() != "true":
        raise ConfigError(
            "enable.idempotence=false allows duplicates and reordering on retries; kresilient "
            "forces enable.idempotence=true",
            key="enable.idempotence",
        )
    inflight = out.get("max.in.flight.requests.per.connection")
    if inflight is not None and (not inflight.strip().isdigit() or int(inflight) > 5):
        raise ConfigError(
            f"max.in.flight.requests.per.connection={inflight!r}: idempotence needs 1..5",
            key="max.in.flight.requests.per.connection",
        )
    retries = out.get("retries")
    if retries is not None and retries.strip() in ("0", "-0"):
        raise ConfigError(
            "retries=0 fails rows on the first transient error; idempotence needs retries > 0",
            key="retries",
        )
    out.update(JAVA_FORCED)
    prefix = out.pop("client.id", None) or "kresilient-spark"
    out["client.id"] = f"{prefix}-{_generation(out, prefix)}"
    return out


def _is_provider_key(key: str) -> bool:
    """``config.providers`` and its ``config.providers.<name>.*`` settings: every Java client
    takes them (they resolve ``${provider:path:key}`` placeholders), though ``configNames()``
    does not list them."""
    return key == "config.providers" or key.startswith("config.providers.")


_generations: dict[tuple[tuple[str, str], ...], str] = {}
_generations_lock = threading.Lock()


def _settings_key(config: Mapping[str, str], prefix: str) -> tuple[tuple[str, str], ...]:
    return (*sorted((k, v) for k, v in config.items() if k != "client.id"), ("", prefix))


def _generation(config: Mapping[str, str], prefix: str) -> str:
    """The current ``client.id`` suffix of writes with these settings.

    Spark pools producers by their settings (all of them, ``client.id`` included): writes that
    share a suffix share the pooled producers, as the built-in sink's writes do. A failed write
    retires the suffix (:func:`retire_client_id`), so the next write never inherits a producer
    the failure left behind.
    """
    key = _settings_key(config, prefix)
    with _generations_lock:
        return _generations.setdefault(key, uuid.uuid4().hex[:12])


def retire_client_id(config: Mapping[str, str]) -> None:
    """After a failed write with ``config`` (as :func:`java_producer_options` returned it):
    the next write with the same settings gets a new ``client.id``, so new producers."""
    prefix, _, suffix = config.get("client.id", "").rpartition("-")
    key = _settings_key(config, prefix)
    with _generations_lock:
        if _generations.get(key) == suffix:
            del _generations[key]


@dataclass(frozen=True)
class TopicLimits:
    """What the routing needs to know about one topic (from its settings)."""

    partitions: int
    max_message_bytes: int
    compacted: bool
    create_time: bool = True  #: ``message.timestamp.type=CreateTime``: the window applies
    before_max_ms: int | None = None  #: ``message.timestamp.before.max.ms`` (None: no limit)
    after_max_ms: int | None = None  #: ``message.timestamp.after.max.ms``


def _long(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    n = int(value)
    return None if n >= 2**62 else n


_names_lock = threading.Lock()
#: (the JVM's view, a Java class name) -> that config class's setting names
_names_cache: dict[str, tuple[Any, frozenset[str]]] = {}


def _java_names(jvm: Any, names: Any) -> frozenset[str]:
    """A Java ``Set<String>`` as a frozenset, in one round trip (iterating it through py4j
    costs two per element: about 160 for a client's config names)."""
    return frozenset(str(jvm.java.lang.String.join("\n", names)).split("\n"))


def _config_names(jvm: Any, java_class: str) -> frozenset[str]:
    """``<java_class>.configNames()``, read once per JVM (a catalog fixed by the jars)."""
    with _names_lock:
        cached = _names_cache.get(java_class)
        if cached is not None and cached[0] is jvm:
            return cached[1]
    cls: Any = jvm
    for part in java_class.split("."):
        cls = getattr(cls, part)
    names = _java_names(jvm, cls.configNames())
    with _names_lock:
        _names_cache[java_class] = (jvm, names)
    return names


#: How long topic settings read for one write serve the next writes with the same settings
#: and topics (a streaming query's micro-batches): a change made within this window may route
#: by the old settings; a failed write forgets them at once (:func:`forget_topic_limits`).
TOPIC_SETTINGS_TTL = 10.0
_MAX_ADMINS = 8
_admins_lock = threading.Lock()
#: admin settings -> (the JVM's view, a Java Admin client kept open for the next writes)
_admins: dict[tuple[tuple[str, str], ...], tuple[Any, Any]] = {}
#: (admin settings, topics) -> (time.monotonic() when read, the limits)
_limits_cache: dict[
    tuple[tuple[tuple[str, str], ...], tuple[str, ...]], tuple[float, dict[str, TopicLimits]]
] = {}


def _admin_settings(jvm: Any, config: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    known = _config_names(jvm, "org.apache.kafka.clients.admin.AdminClientConfig")
    out = {k: v for k, v in config.items() if (k in known or _is_provider_key(k))}
    out["client.id"] = f"{config.get('client.id', 'kresilient-spark')}-admin"
    return tuple(sorted(out.items()))


def _admin(jvm: Any, settings: tuple[tuple[str, str], ...]) -> Any:
    """A Java ``Admin`` client with ``settings``, kept open between writes (creating one,
    connecting and closing it cost about 0.1-0.2 s per write)."""
    with _admins_lock:
        pooled = _admins.get(settings)
        if pooled is not None and pooled[0] is jvm:
            return pooled[1]
    props = jvm.java.util.Properties()
    for k, v in settings:
        props.setProperty(k, v)
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    evicted: list[Any] = []
    with _admins_lock:
        old = _admins.pop(settings, None)
        if old is not None:
            evicted.append(old[1])
        while len(_admins) >= _MAX_ADMINS:
            evicted.append(_admins.pop(next(iter(_admins)))[1])
        _admins[settings] = (jvm, admin)
    for a in evicted:
        with contextlib.suppress(Exception):
            a.close()
    return admin


def _drop_admin(settings: tuple[tuple[str, str], ...]) -> None:
    with _admins_lock:
        pooled = _admins.pop(settings, None)
    if pooled is not None:
        with contextlib.suppress(Exception):
            pooled[1].close()


def forget_topic_limits() -> None:
    """After a failed write: the next write reads every topic's settings again."""
    with _admins_lock:
        _limits_cache.clear()


def describe_topics(
    jvm: Any, config: Mapping[str, str], topics: list[str]
) -> dict[str, TopicLimits]:
    """Read ``topics``' settings with the Java ``Admin`` client (the write's own settings).

    Settings read less than :data:`TOPIC_SETTINGS_TTL` seconds ago for the same client
    settings and topics are reused; the ``Admin`` client stays open between writes.
    """
    settings = _admin_settings(jvm, config)
    key = (settings, tuple(topics))
    now = time.monotonic()
    with _admins_lock:
        hit = _limits_cache.get(key)
        if hit is not None and now - hit[0] < TOPIC_SETTINGS_TTL:
            return dict(hit[1])
    admin = _admin(jvm, settings)
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    try:
        described = admin.describeTopics(topics).allTopicNames().get(60, seconds)
    except Exception as exc:
        _drop_admin(settings)  # a client that failed is not kept
        raise ConfigError(
            f"cannot describe topic(s) {', '.join(topics)} (they must exist: engine='jvm' "
            f"reads their settings to route unproducible rows): {_java_message(exc)}",
            key="topic",
        ) from None
    try:
        res_cls = jvm.org.apache.kafka.common.config.ConfigResource
        kind = res_cls.Type.TOPIC
        resources = {t: res_cls(kind, t) for t in topics}
        configs = admin.describeConfigs(list(resources.values())).all().get(60, seconds)
    except BaseException:
        _drop_admin(settings)
        raise
    out: dict[str, TopicLimits] = {}
    for t, res in resources.items():
        cfg = configs.get(res)

        def value(name: str, cfg: Any = cfg) -> str | None:
            entry = cfg.get(name)
            return None if entry is None else entry.value()

        out[t] = TopicLimits(
            partitions=int(described.get(t).partitions().size()),
            max_message_bytes=int(value("max.message.bytes") or 1048588),
            compacted="compact" in (value("cleanup.policy") or ""),
            create_time=(value("message.timestamp.type") or "CreateTime") == "CreateTime",
            before_max_ms=_long(value("message.timestamp.before.max.ms")),
            after_max_ms=_long(value("message.timestamp.after.max.ms")),
        )
    with _admins_lock:
        if len(_limits_cache) >= 256:
            _limits_cache.clear()
        _limits_cache[key] = (now, dict(out))
    return out


def _java_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    causes = [line for line in text if "Exception:" in line]
    return (causes[-1] if causes else (text[0] if text else type(exc).__name__))[:500]


def _sql_str(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _per_topic(t: str, limits: Mapping[str, TopicLimits], attr: str, default: str) -> str:
    """``CASE <t> WHEN 'a' THEN <a's attr> ... ELSE default END`` as SQL."""
    parts = []
    for name, lim in limits.items():
        v = getattr(lim, attr)
        sql = "NULL" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
        parts.append(f"WHEN {_sql_str(name)} THEN {sql}")
    return f"(CASE {t} {' '.join(parts)} ELSE {default} END)"


@dataclass(frozen=True)
class RoutePlan:
    """The SQL of the routing projection (for tests and ``explain``)."""

    reason: str  #: SQL: the kresilient reason code of an unproducible row, else NULL
    size: str  #: SQL: upper bound of the record's size in a batch
    detail: str  #: SQL: the dead letter's ``kresilient.exception.message``
    reasons: tuple[str, ...] = ()  #: the reason codes this write's rows can get


def route_plan(
    *,
    topic_sql: str,
    has: set[str],
    limits: Mapping[str, TopicLimits],
    max_request_size: int,
    fixed_topic: bool | None = None,
) -> RoutePlan:
    """Build the routing expressions over the input columns named in ``has``.

    ``fixed_topic``: ``topic_sql`` is the write's one topic (a literal), not a column; by
    default, when ``topic_sql`` is a quoted literal.
    """
    if fixed_topic is None:
        fixed_topic = topic_sql.startswith("'")
    klen = "coalesce(octet_length(key), 0)" if "key" in has else "0"
    # No lambda (aggregate/filter are interpreted and keep the whole projection out of
    # whole-stage code generation): the keys' and values' bytes joined, plus each header's
    # overhead. concat_ws skips nulls; a binary cast to a string keeps its bytes.
    hlen = (
        "IF(headers IS NULL, 0L, CAST(coalesce(octet_length(concat_ws('', headers.key)), 0) "
        "+ coalesce(octet_length(concat_ws('', CAST(headers.value AS ARRAY<STRING>))), 0) "
        f"+ size(headers) * {_HEADER_OVERHEAD} AS BIGINT))"
        if "headers" in has
        else "0L"
    )
    size = f"({_BATCH_OVERHEAD} + {klen} + coalesce(octet_length(value), 0) + {hlen})"
    limit = f"least({_per_topic(topic_sql, limits, 'max_message_bytes', '0')}, {max_request_size})"
    known = " OR ".join(f"{topic_sql} = {_sql_str(t)}" for t in limits) or "false"
    cases: list[tuple[str, str]] = []
    details: list[str] = []
    if not fixed_topic:  # a literal topic is never null and always among the write's topics
        cases += [
            (f"{topic_sql} IS NULL", "NULL_TOPIC"),
            (f"NOT ({known})", "UNKNOWN_TOPIC_OR_PART"),
        ]
        details += [
            "'the row has no topic (null topic column)'",
            f"concat('topic ', {topic_sql}, ' is not among the topics of this write')",
        ]
    cases.append((f"{size} > {limit}", "MSG_SIZE_TOO_LARGE"))
    details.append(
        f"concat('record of up to ', {size}, ' bytes exceeds ', {limit}, "
        f"' (the topic''s max.message.bytes / the producer''s max.request.size)')"
    )
    if "partition" in has:
        parts = _per_topic(topic_sql, limits, "partitions", "0")
        cases.append((f"partition IS NOT NULL AND (partition < 0 OR partition >= {parts})",
                      "_UNKNOWN_PARTITION"))  # fmt: skip
        details.append(f"concat('partition ', partition, ' does not exist: the topic has ', "
                       f"{parts}, ' partition(s)')")  # fmt: skip
    if any(lim.compacted for lim in limits.values()):
        compacted = _per_topic(topic_sql, limits, "compacted", "false")
        # without a key column every row of a compacted topic lacks a key
        cases.append((f"key IS NULL AND {compacted}" if "key" in has else compacted,
                      "INVALID_RECORD"))  # fmt: skip
        details.append("'a compacted topic refuses records without a key'")
    if "timestamp" in has:
        ts = "unix_millis(timestamp)"
        now = "unix_millis(current_timestamp())"
        create = _per_topic(topic_sql, limits, "create_time", "true")
        before = _per_topic(topic_sql, limits, "before_max_ms", "NULL")
        after = _per_topic(topic_sql, limits, "after_max_ms", "NULL")
        cond = (
            f"timestamp IS NOT NULL AND ({ts} < 0 OR ({create} AND ("
            f"({before} IS NOT NULL AND {ts} < {now} - {before}) OR "
            f"({after} IS NOT NULL AND {ts} > {now} + {after}))))"
        )
        cases.append((cond, "INVALID_TIMESTAMP"))
        details.append(f"concat('timestamp ', {ts}, ' ms is outside the topic''s window "
                       f"(message.timestamp.before.max.ms / after.max.ms)')")  # fmt: skip
    reason = "CASE " + " ".join(f"WHEN {c} THEN {_sql_str(r)}" for c, r in cases) + " END"
    detail = (
        "CASE "
        + " ".join(f"WHEN {c} THEN {d}" for (c, _), d in zip(cases, details, strict=True))
        + " END"
    )
    return RoutePlan(reason=reason, size=size, detail=detail, reasons=tuple(r for _, r in cases))


#: kresilient.error.category of each reason (as :func:`kresilient.errors.classify` names it).
_CATEGORY = {
    "NULL_TOPIC": "config",
    "UNKNOWN_TOPIC_OR_PART": "config",
    "MSG_SIZE_TOO_LARGE": "config",
    "_UNKNOWN_PARTITION": "config",
    "INVALID_RECORD": "poison",
    "INVALID_TIMESTAMP": "poison",
}

#: ``kresilient.exception.type`` of a routed row: no exception was raised (nothing was sent).
ROUTED_TYPE = "kresilient.spark.RoutedBeforeSend"


#: An empty ``headers`` array of the kafka sink's type.
_HEADERS_TYPE = "ARRAY<STRUCT<key: STRING, value: BINARY>>"
_EMPTY_HEADERS = f"CAST(array() AS {_HEADERS_TYPE})"


def _header_sql(name: str, expr: str, nullable: bool) -> str:
    """One header as a one-element array; an empty array when ``nullable`` and ``expr`` is null."""
    one = f"array(named_struct('key', {_sql_str(name)}, 'value', CAST({expr} AS BINARY)))"
    return f"IF(({expr}) IS NULL, {_EMPTY_HEADERS}, {one})" if nullable else one


def _categories_sql(reason: str, reasons: tuple[str, ...] | None = None) -> str:
    from kresilient.errors import classify

    try:  # the library's own table wins where it has the code
        from confluent_kafka import KafkaError

        codes = {
            "MSG_SIZE_TOO_LARGE": KafkaError.MSG_SIZE_TOO_LARGE,
            "_UNKNOWN_PARTITION": KafkaError._UNKNOWN_PARTITION,
            "INVALID_RECORD": KafkaError.INVALID_RECORD,
            "INVALID_TIMESTAMP": KafkaError.INVALID_TIMESTAMP,
        }
        cats = dict(_CATEGORY)
        for name, code in codes.items():
            cats[name] = classify(KafkaError(code)).category.value
    except ImportError:  # pragma: no cover - confluent-kafka is a core dependency
        cats = dict(_CATEGORY)
    if reasons is not None:
        cats = {k: v for k, v in cats.items() if k in reasons}
    return (
        "CASE "
        + " ".join(f"WHEN {reason} = {_sql_str(k)} THEN {_sql_str(v)}" for k, v in cats.items())
        + " END"
    )


#: The ``config.providers`` name under which kresilient's secrets file is referenced.
_PROVIDER = "kresilient"
_FILE_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"
_secrets_lock = threading.Lock()
_secrets_dir: str | None = None
#: secrets file path -> writes in progress that use it
_secrets_users: dict[str, int] = {}


def _properties_escape(text: str) -> str:
    """``text`` as a ``java.util.Properties`` key or value (``Properties.load`` reads it back
    exactly, from a UTF-8 or a Latin-1 reader: everything outside printable ASCII escaped)."""
    out = []
    for ch in text:
        if ch in "\\=:#! ":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            units = ch.encode("utf-16-be")
            out += [f"\\u{units[i] << 8 | units[i + 1]:04x}" for i in range(0, len(units), 2)]
    return "".join(out)


def _secrets_root() -> str:
    global _secrets_dir
    if _secrets_dir is None or not os.path.isdir(_secrets_dir):
        _secrets_dir = tempfile.mkdtemp(prefix="kresilient-spark-")  # mode 0700
        atexit.register(shutil.rmtree, _secrets_dir, True)
    return _secrets_dir


def _plan_secrets(config: Mapping[str, str]) -> dict[str, str]:
    """The settings of ``config`` that must stay out of Spark's options: every secret key's
    value, except a value that is itself a placeholder of the user's ``config.providers``."""
    own_providers = bool(config.get("config.providers", "").strip())
    return {
        k: v for k, v in config.items() if is_secret_key(k) and not (own_providers and "${" in v)
    }


@contextlib.contextmanager
def _secrets_out_of_plan(
    config: Mapping[str, str], *, executors_local: bool
) -> Iterator[dict[str, str]]:
    """The options to hand Spark's ``kafka`` sink: ``config`` with each secret replaced by a
    ``${kresilient:<file>:<key>}`` placeholder the Kafka client resolves (its
    ``FileConfigProvider``) when it creates a producer, the file existing while the block runs.

    Why: the V2 write node (``KafkaWrite``) prints its producer settings in the SQL tab's plan
    graph and in the event log's ``sparkPlanInfo``, texts Spark never redacts. The file (0600,
    in a 0700 directory) is named after the settings' ``client.id``, so the options, and with
    them Spark's pooled producers, stay the same from one write to the next; writes sharing it
    share the file, the last one removes it. ``executors_local``: the executors read the
    driver's files (a ``local`` master); elsewhere a secret given inline is refused.
    """
    secrets = _plan_secrets(config)
    if not secrets:
        yield dict(config)
        return
    if not executors_local:
        key = sorted(secrets)[0]
        raise ConfigError(
            f"option {key!r}: engine='jvm' on a cluster cannot keep a secret out of Spark's "
            "plan graph and event log (the Kafka sink prints its producer settings there); "
            "give it as a placeholder the executors resolve (config.providers, e.g. "
            f"config.providers='file' with config.providers.file.class='{_FILE_PROVIDER}' and "
            f"{key}='${{file:/mounted/secrets.properties:{key}}}'), or use engine='python'",
            key=key,
        )
    with _secrets_lock:
        path = os.path.join(_secrets_root(), f"{config['client.id']}.properties")
        users = _secrets_users.get(path, 0)
        if users == 0:
            body = "".join(f"{_properties_escape(k)}={_properties_escape(v)}\n"
                           for k, v in sorted(secrets.items()))  # fmt: skip
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(body)
        _secrets_users[path] = users + 1
    try:
        providers = [p.strip() for p in config.get("config.providers", "").split(",")]
        options = dict(config)
        options["config.providers"] = ",".join([*(p for p in providers if p), _PROVIDER])
        options[f"config.providers.{_PROVIDER}.class"] = _FILE_PROVIDER
        for k in secrets:
            options[k] = f"${{{_PROVIDER}:{path}:{k}}}"
        yield options
    finally:
        with _secrets_lock:
            users = _secrets_users.pop(path)
            if users > 1:
                _secrets_users[path] = users - 1
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


_V1_LIST = "spark.sql.sources.useV1SourceList"
_V1_DEFAULT = "avro,csv,json,kafka,orc,parquet,text"
_v1_lock = threading.Lock()
#: session -> (writes in progress, the session's value before the first of them)
_v1_users: dict[int, tuple[int, str | None]] = {}


@contextlib.contextmanager
def _kafka_on_v2(spark: Any) -> Iterator[None]:
    """``kafka`` out of ``spark.sql.sources.useV1SourceList`` while the block runs.

    The V2 write path reports observed metrics; the V1 path (Spark's default for kafka) never
    does (``Observation.get`` would wait forever). Writes of one session running at once
    share the change: the first saves the session's value, the last puts it back; toggled
    per write, one write's restore put kafka back under another's planning and the other then
    "restored" the list without kafka for good.
    """
    conf = spark.conf
    key = int(spark._jsparkSession.hashCode())
    with _v1_lock:
        users, before = _v1_users.get(key, (0, None))
        if users == 0:
            before = conf.get(_V1_LIST, None)
            current = before if before is not None else _V1_DEFAULT
            without = ",".join(s for s in current.split(",") if s.strip().lower() != "kafka")
            conf.set(_V1_LIST, without)
        _v1_users[key] = (users + 1, before)
    try:
        yield
    finally:
        with _v1_lock:
            users, before = _v1_users.pop(key)
            if users > 1:
                _v1_users[key] = (users - 1, before)
            elif before is None:
                conf.unset(_V1_LIST)
            else:
                conf.set(_V1_LIST, before)


def write_jvm(
    df: Any,
    *,
    topic: str | None,
    topics: list[str] | None,
    dead_letter_topic: str | None,
    producer: Mapping[str, Any],
    mode: str = "batch",
    batch_id: int | None = None,
) -> WriteSummary:
    """Route, write with Spark's ``kafka`` sink, count. See :func:`kresilient.spark.write`."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    spark = df.sparkSession
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        raise ConfigError(
            "engine='jvm' needs a classic SparkSession (the driver reads topic settings "
            "through the JVM); on Spark Connect use engine='python'",
            key="engine",
        )
    try:
        known = _config_names(jvm, "org.apache.kafka.clients.producer.ProducerConfig")
    except Exception:
        raise ConfigError(
            "engine='jvm' needs Spark's Kafka connector (spark-sql-kafka-0-10) on the driver's "
            "classpath: --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>, "
            "or kresilient.spark.connector.connector_jars() in spark.jars",
            key="engine",
        ) from None
    config = java_producer_options(producer, known=known)
    redact_plan_options(spark)  # the kafka sink's options show in the plan too
    fields = [(f.name, f.dataType.simpleString()) for f in df.schema.fields]
    layout = column_layout(fields, topic_option=topic)
    has = {name.lower() for name, _ in fields} & {
        "key", "value", "topic", "partition", "headers", "timestamp"
    }  # fmt: skip
    if topic is None and not topics:
        raise ConfigError(
            "engine='jvm' with a topic column needs topics=[...] (every topic the rows may "
            "name: their settings decide which rows are routed to the dead-letter topic)",
            key="topics",
        )
    targets = [topic] if topic is not None else list(topics or [])
    dlq = dead_letter_topic or f"{targets[0]}.dlq"
    limits = describe_topics(jvm, config, sorted({*targets, dlq}))
    dlq_limit = limits.pop(dlq) if dlq not in targets else limits[dlq]
    max_request = int(config.get("max.request.size", _DEFAULT_MAX_REQUEST))
    if layout.value is None:  # pragma: no cover - column_layout refuses it
        raise SchemaError("no value column", key="value")
    topic_sql = _sql_str(topic) if topic is not None else "topic"
    plan = route_plan(
        topic_sql=topic_sql,
        has=has,
        limits=limits,
        max_request_size=max_request,
        fixed_topic=topic is not None,
    )
    # Only the columns the input has, with their own types (the kafka sink takes a string or
    # binary key and value): each one the projection adds or casts costs a copy per row.
    passed = [c for c in ("key", "headers", "partition", "timestamp") if c in has]
    failed_at = (
        "date_format(to_utc_timestamp(current_timestamp(), current_timezone()), "
        "\"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'\")"
    )
    routed = df.selectExpr(
        f"{plan.reason} AS _kr_reason",
        f"{plan.detail} AS _kr_detail",  # computed for routed rows only (CASE)
        f"{plan.size} AS _kr_size",
        f"{topic_sql} AS _kr_topic",
        "value AS _kr_value",
        *(f"{c} AS _kr_{c}" for c in passed),
    )
    # Dead letters keep the row's headers first, then kresilient's (built only for them).
    # No lambda (filter() would keep the whole projection out of whole-stage code
    # generation): a header whose value may be null is a one-element array or an empty one.
    message = "concat(_kr_reason, ': ', _kr_detail)"
    own = [
        ("kresilient.original.topic", "_kr_topic", topic is None),
        *(
            [("kresilient.original.partition", "CAST(_kr_partition AS STRING)", True)]
            if "partition" in has
            else []
        ),
        *(
            [("kresilient.original.timestamp", "CAST(unix_millis(_kr_timestamp) AS STRING)", True)]
            if "timestamp" in has
            else []
        ),
        ("kresilient.exception.type", _sql_str(ROUTED_TYPE), False),
        ("kresilient.exception.message", message, False),
        ("kresilient.error.category", _categories_sql("_kr_reason", plan.reasons), False),
        ("kresilient.attempts", "'0'", False),
        ("kresilient.failed.at", failed_at, False),
    ]
    dead_headers = (
        "concat("
        + (f"coalesce(_kr_headers, {_EMPTY_HEADERS}), " if "headers" in has else "")
        + ", ".join(_header_sql(name, expr, nullable) for name, expr, nullable in own)
        + ")"
    )
    keep_value = (
        f"_kr_size + {_DLQ_HEADER_ROOM} <= least({dlq_limit.max_message_bytes}, {max_request})"
    )
    dropped = _header_sql(
        "kresilient.value.dropped.bytes", "CAST(octet_length(_kr_value) AS STRING)", False
    )
    routed_only = [c for c in ("partition", "timestamp") if c in has]  # dead letters: NULL
    out_cols = [
        f"IF(_kr_reason IS NULL, _kr_topic, {_sql_str(dlq)}) AS topic",
        *(["_kr_key AS key"] if "key" in has else []),
        f"IF(_kr_reason IS NULL OR {keep_value}, _kr_value, NULL) AS value",
        "IF(_kr_reason IS NULL, "
        + ("_kr_headers" if "headers" in has else f"CAST(NULL AS {_HEADERS_TYPE})")
        + f", IF({keep_value}, {dead_headers}, concat({dead_headers}, {dropped}))) AS headers",
        *(f"IF(_kr_reason IS NULL, _kr_{c}, NULL) AS {c}" for c in routed_only),
        "_kr_reason",  # the kafka sink ignores a column it does not know
    ]
    projected = routed.selectExpr(*out_cols)
    obs = Observation(f"kresilient-{uuid.uuid4().hex[:12]}")
    # Counted per reason this write's rows can get. With one (a fixed topic, no partition or
    # timestamp column, no compacted topic: only the size) a count of routed rows says it all.
    reasons = plan.reasons
    per_reason = (
        [F.count("_kr_reason").alias(reasons[0])]
        if len(reasons) == 1
        else [F.count(F.when(F.col("_kr_reason") == r, 1)).alias(r) for r in reasons]
    )
    observed = projected.observe(obs, F.count(F.lit(1)).alias("rows"), *per_reason)
    executors_local = str(spark.sparkContext.master).startswith("local")
    try:
        with (
            _secrets_out_of_plan(config, executors_local=executors_local) as options,
            _kafka_on_v2(spark),
        ):
            writer = observed.write.format("kafka").mode("append")
            for k, v in options.items():
                writer = writer.option(f"kafka.{k}", v)
            writer.save()
    except BaseException:
        retire_client_id(config)  # the next write must not inherit this one's producers
        forget_topic_limits()  # a refusal may come from settings changed since they were read
        raise
    metrics = obs.get
    dead = {r: int(metrics.get(r) or 0) for r in sorted(reasons) if metrics.get(r)}
    rows = int(metrics.get("rows") or 0)
    total_dead = sum(dead.values())
    return WriteSummary(
        mode=mode,
        batch_id=batch_id,
        topic=topic,
        guarantee="at_least_once",
        tasks=0,
        rows=rows,
        written=rows - total_dead,
        dead_lettered=total_dead,
        dead_letter_reasons=dead,
        dead_letter_topics=(dlq,) if total_dead else (),
        engine="jvm",
        committed_at=time.time(),
    )
