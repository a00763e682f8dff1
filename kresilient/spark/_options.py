"""Options and input schema of the ``kresilient`` Spark sink (pure: no pyspark needed).

The sink accepts what Spark's built-in Kafka sink accepts, so switching a job is
``format("kafka")`` -> ``format("kresilient")``:

* options ``kafka.bootstrap.servers`` (required), any other ``kafka.<key>`` (handed to the
  producer without the prefix), ``topic`` (overrides a ``topic`` column), ``includeHeaders``
  (accepted and ignored: a ``headers`` column is always written, as the built-in sink does);
* columns ``value`` (required, string or binary), ``key`` (string or binary), ``topic``
  (string), ``partition`` (int), ``headers`` (``array<struct<key:string,value:binary>>``) and
  ``timestamp`` (timestamp). Other columns are ignored, as the built-in sink ignores them.

kresilient's own options have no ``kafka.`` prefix: ``deadLetterTopic``, ``guarantee``
(``at_least_once`` or, for streaming, ``exactly_once``), ``transactionalIdPrefix`` and
``markerTopic``. Spark
lower-cases option names; matching here is case-insensitive too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from kresilient.errors import ConfigError, SchemaError
from kresilient.redaction import SECRET_KEYS

__all__ = [
    "PLAN_REDACTION_REGEX",
    "PLAN_STRING_REDACTION_REGEX",
    "ColumnLayout",
    "SchemaError",
    "SinkOptions",
    "column_layout",
    "parse_options",
    "redact_plan_options",
]

_KAFKA_PREFIX = "kafka."

#: ``kafka.*`` keys the sink refuses, with the reason shown to the user.
_REFUSED_KAFKA_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "key.serializer": "the sink writes the key column's bytes; serialize in the DataFrame",
        "value.serializer": "the sink writes the value column's bytes; serialize in the DataFrame",
        "transactional.id": "the sink manages transactional ids itself: use the option "
        "guarantee=exactly_once (streaming) and, if needed, transactionalIdPrefix",
        "on_delivery": "delivery reports are handled by the sink",
        "error_cb": "errors are handled by the sink",
    }
)

#: Java-client producer keys with no librdkafka twin of the same name: name the one to use.
_JAVA_ONLY_HINTS: Mapping[str, str] = MappingProxyType(
    {
        "max.request.size": "kafka.message.max.bytes",
        "buffer.memory": "kafka.queue.buffering.max.kbytes",
        "max.block.ms": "nothing: the sink waits for queue space while polling",
        "partitioner.class": "kafka.partitioner (a librdkafka partitioner name)",
        "interceptor.classes": "nothing: interceptors are JVM classes",
    }
)

#: The sink's own options (lower-cased, as Spark hands them over).
_OWN_OPTIONS = frozenset(
    {
        "topic",
        "includeheaders",
        "deadlettertopic",
        "guarantee",
        "transactionalidprefix",
        "markertopic",
        "writeid",
        "path",
    }
)

#: Options Spark itself adds to a streaming query's options.
_SPARK_OPTIONS = frozenset({"checkpointlocation", "queryname"})

GUARANTEES = ("at_least_once", "exactly_once")


@dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """The parsed options of one write (picklable: it travels to the executors).

    ``producer`` holds the ``kafka.*`` options without their prefix, as strings; kresilient's
    safe defaults and validation are applied when the producer is built (on the driver at
    planning time too, so a bad key fails the job before a task starts).
    """

    producer: Mapping[str, str]
    topic: str | None = None
    dead_letter_topic: str | None = None
    dead_letter_enabled: bool = True
    guarantee: str = "at_least_once"
    transactional_id_prefix: str | None = None
    marker_topic: str | None = None  #: exactly_once: the compacted topic of durable markers
    #: ``writeId``: names this write's summary (set by :func:`kresilient.spark.write`, which
    #: returns the summary of its own write, not the newest of the directory).
    write_id: str | None = None

    @property
    def marker_topic_name(self) -> str:
        """``markerTopic``, else ``<topic>.kresilient-markers`` (exactly_once only)."""
        return self.marker_topic or f"{self.topic}.kresilient-markers"

    def dead_letter_topic_for(self, topic: str | None) -> str | None:
        """The dead-letter topic of a row aimed at ``topic`` (``None``: dead letters disabled).

        An explicit ``deadLetterTopic`` wins; otherwise ``<topic>.dlq``.
        """
        if not self.dead_letter_enabled:
            return None
        if self.dead_letter_topic:
            return self.dead_letter_topic
        return f"{topic}.dlq" if topic else None

    def __repr__(self) -> str:  # producer options may hold secrets: show only their names
        return (
            f"SinkOptions(topic={self.topic!r}, dead_letter_topic={self.dead_letter_topic!r}, "
            f"guarantee={self.guarantee!r}, producer_keys={sorted(self.producer)!r})"
        )


def parse_options(options: Mapping[str, str]) -> SinkOptions:
    """Parse Spark writer options into :class:`SinkOptions`, refusing what the sink cannot honour.

    Raises :class:`~kresilient.ConfigError` naming the offending option.

    Example::

        >>> o = parse_options({"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t"})
        >>> o.producer["bootstrap.servers"], o.dead_letter_topic_for("t")
        ('127.0.0.1:9092', 't.dlq')
    """
    producer: dict[str, str] = {}
    extra: dict[str, str] = {}
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    for key, value in lowered.items():
        if key.startswith(_KAFKA_PREFIX):
            name = key[len(_KAFKA_PREFIX) :]
            if name in _REFUSED_KAFKA_KEYS:
                raise ConfigError(
                    f"option {key!r} is not supported: {_REFUSED_KAFKA_KEYS[name]}", key=key
                )
            if name in _JAVA_ONLY_HINTS:
                raise ConfigError(
                    f"option {key!r} is a Java-client setting; the kresilient sink runs "
                    f"librdkafka: use {_JAVA_ONLY_HINTS[name]}",
                    key=key,
                )
            producer[name] = value
        elif key not in _OWN_OPTIONS and key not in _SPARK_OPTIONS:
            extra[key] = value
    if extra:
        unknown = sorted(extra)[0]
        raise ConfigError(
            f"unknown option {unknown!r} for the kresilient sink: producer settings take the "
            f"'kafka.' prefix (e.g. 'kafka.{unknown}'); the sink's own options are "
            "topic, deadLetterTopic, guarantee, transactionalIdPrefix, markerTopic",
            key=unknown,
        )
    if not producer.get("bootstrap.servers"):
        raise ConfigError(
            "option 'kafka.bootstrap.servers' is required", key="kafka.bootstrap.servers"
        )
    guarantee = lowered.get("guarantee", "at_least_once").strip().lower().replace("-", "_")
    if guarantee not in GUARANTEES:
        raise ConfigError(
            f"option 'guarantee' must be one of {', '.join(GUARANTEES)}, not {guarantee!r}",
            key="guarantee",
        )
    if guarantee == "exactly_once" and not lowered.get("topic"):
        raise ConfigError(
            "guarantee=exactly_once needs the 'topic' option (one target topic: it also holds "
            "the batch markers' offsets)",
            key="topic",
        )
    dlq_raw = lowered.get("deadlettertopic")
    dlq_enabled = dlq_raw is None or dlq_raw.strip().lower() not in ("", "none", "false")
    return SinkOptions(
        producer=MappingProxyType(producer),
        topic=lowered.get("topic") or None,
        dead_letter_topic=dlq_raw.strip() if dlq_enabled and dlq_raw else None,
        dead_letter_enabled=dlq_enabled,
        guarantee=guarantee,
        transactional_id_prefix=lowered.get("transactionalidprefix") or None,
        marker_topic=(lowered.get("markertopic") or "").strip() or None,
        write_id=(lowered.get("writeid") or "").strip() or None,
    )


@dataclass(frozen=True, kw_only=True)
class ColumnLayout:
    """Where each sink column sits in the input (``None``: absent); picklable."""

    value: int
    key: int | None = None
    topic: int | None = None
    partition: int | None = None
    headers: int | None = None
    timestamp: int | None = None


_ALLOWED_TYPES: Mapping[str, tuple[frozenset[str], str]] = MappingProxyType(
    {
        "value": (frozenset({"string", "binary"}), "string or binary"),
        "key": (frozenset({"string", "binary"}), "string or binary"),
        "topic": (frozenset({"string"}), "string"),
        "partition": (frozenset({"int"}), "int"),
        "headers": (
            frozenset({"array<struct<key:string,value:binary>>"}),
            "array<struct<key:string,value:binary>>",
        ),
        "timestamp": (frozenset({"timestamp", "timestamp_ntz"}), "timestamp"),
    }
)


def column_layout(fields: Iterable[tuple[str, str]], *, topic_option: str | None) -> ColumnLayout:
    """Check the input schema, given as ``(name, simpleString type)`` pairs, and locate columns.

    Raises :class:`SchemaError` naming the column when ``value`` is missing, a known column has
    the wrong type, or there is neither a ``topic`` column nor a ``topic`` option.

    Example::

        >>> column_layout([("key", "binary"), ("value", "string")], topic_option="t").value
        1
    """
    found: dict[str, int] = {}
    for index, (name, type_name) in enumerate(fields):
        lowered = name.lower()
        if lowered not in _ALLOWED_TYPES:
            continue
        allowed, shown = _ALLOWED_TYPES[lowered]
        if type_name.replace(" ", "").lower() not in allowed:
            raise SchemaError(f"column {name!r} must be {shown}, not {type_name}", key=name)
        found[lowered] = index
    if "value" not in found:
        raise SchemaError(
            "the DataFrame has no 'value' column (string or binary); the Kafka sinks require one",
            key="value",
        )
    if "topic" not in found and not topic_option:
        raise SchemaError(
            "no topic: give the 'topic' option or a 'topic' column (string)", key="topic"
        )
    return ColumnLayout(
        value=found["value"],
        key=found.get("key"),
        topic=found.get("topic"),
        partition=found.get("partition"),
        headers=found.get("headers"),
        timestamp=found.get("timestamp"),
    )


#: Spark shows a write's options in its plan (``EXPLAIN``, the SQL tab of the UI, event logs),
#: hiding only those whose key or value matches ``spark.redaction.regex`` (``secret``,
#: ``password``, ``token``) or ``spark.sql.redaction.options.regex``. Some client secrets
#: match neither (``ssl.key.pem``, ``sasl.jaas.config`` without a password in it ...):
#: :func:`redact_plan_options` adds every secret key of :mod:`kresilient.redaction` to the
#: latter. Both engines' writes name their producer settings ``kafka.<key>``.
PLAN_REDACTION_REGEX = (
    "(?i)^kafka\\.(?:" + "|".join(re.escape(k) for k in sorted(SECRET_KEYS)) + ")$"
)
_OPTIONS_REDACTION_CONF = "spark.sql.redaction.options.regex"

#: The same keys' values inside plan *text*: Spark's ``kafka`` sink (``engine="jvm"``) prints
#: its producer settings without the prefix in the plan node ``KafkaWrite(None,{k=v, ...})``,
#: out of reach of the options regex. ``spark.sql.redaction.string.regex`` redacts what it
#: matches in explain output: a secret key's value, up to the next ``, key=`` or the map's end.
PLAN_STRING_REDACTION_REGEX = (
    "(?s:(?<=\\b(?:kafka\\.)?(?:"
    + "|".join(re.escape(k) for k in sorted(SECRET_KEYS))
    + ")=).*?(?=, [A-Za-z0-9._-]+=|\\}|\\)|$))"
)
_STRING_REDACTION_CONF = "spark.sql.redaction.string.regex"


def redact_plan_options(spark: Any) -> None:
    """Extend ``spark``'s (a ``SparkSession``) ``spark.sql.redaction.options.regex`` with
    :data:`PLAN_REDACTION_REGEX` and ``spark.sql.redaction.string.regex`` with
    :data:`PLAN_STRING_REDACTION_REGEX` (once each), so that no secret producer setting of a
    write shows in its plan; called by :func:`kresilient.spark.register` and by every
    ``engine="jvm"`` write."""
    current = spark.conf.get(_OPTIONS_REDACTION_CONF, None)
    if not current:
        spark.conf.set(_OPTIONS_REDACTION_CONF, f"(?i)url|{PLAN_REDACTION_REGEX}")
    elif PLAN_REDACTION_REGEX not in current:
        spark.conf.set(_OPTIONS_REDACTION_CONF, f"{current}|{PLAN_REDACTION_REGEX}")
    text = spark.conf.get(_STRING_REDACTION_CONF, None)
    if not text:
        spark.conf.set(_STRING_REDACTION_CONF, PLAN_STRING_REDACTION_REGEX)
    elif PLAN_STRING_REDACTION_REGEX not in text:
        spark.conf.set(_STRING_REDACTION_CONF, f"{text}|{PLAN_STRING_REDACTION_REGEX}")
