"""Error classification and the kresilient exception tree.

:func:`classify` turns anything a confluent-kafka client can hand you (a ``KafkaError`` from a
delivery report, ``error_cb`` or ``Message.error()``, a ``KafkaException``, an int code, the
``BufferError`` of a full queue, a serialization error, or a kresilient exception) into a
:class:`Classification`: what kind of failure it is, whether a retry is safe, whether metadata
is stale, whether the message may already be written, and what to do. It is a dict lookup on
one data table (``kresilient/_error_table.py``) that covers every code ``KafkaError`` defines;
an unknown code is ``UNKNOWN`` and not retriable.

``KafkaError.retriable()`` is ``False`` on every delivery report and consumer error (the binding
only fills it for ``rd_kafka_error_t`` results), so the classification comes from the code.
When ``err.fatal()`` or ``err.txn_requires_abort()`` is ``True`` it wins over the table.

Exception tree (one base; every class is keyword-constructible and carries
``.classification`` when a Kafka error is behind it)::

    KResilientError
    ├── ConfigError                  bad, unknown or conflicting configuration (.key)
    │   ├── UnsafeConfigError        the config weakens a guarantee; refused unless allowed
    │   └── SchemaError              a DataFrame given to the Spark sink has a wrong column
    ├── KafkaClientError             a Kafka error (.code, .name, .topic, .partition)
    │   ├── ProduceError             one message could not be produced
    │   │   ├── MessageTooLargeError value above a size limit (.size, .limit)
    │   │   └── SpoolError           the local spool cannot store a message (full, disk, I/O)
    │   │       └── SpoolCorruptError the spool file is unreadable; renamed aside (.quarantined)
    │   ├── FatalProducerError       fenced / idempotence state lost: recreate the producer
    │   │   ├── ProducerFencedError      another instance took (or may have taken) the
    │   │   │                            transactional.id: stop, never recreate
    │   │   └── TransactionOutcomeUnknownError a commit/abort timed out: instance replaced
    │   ├── TransactionAbortedError  a transaction was aborted (abortable error): run it again
    │   ├── CommitError              offset commit failed
    │   └── ConsumeError             consumer-side error surfaced by poll
    ├── DeliveryError                flush() found failed messages (.failures)
    ├── DeadLetterError              a dead-letter write failed or was not acknowledged
    ├── CircuitBreakerOpenError      too many dead letters within a window
    ├── BatchItemError               raised by a batch handler: item .index failed (.cause)
    ├── CrashLoopError               a record killed the process max_process_deaths times
    ├── ReplayMismatchError          Spark exactly_once: a replayed micro-batch differs
    └── ClusterError                 the local test cluster failed to start or to act
        └── ChaosNotSupportedError   a chaos operation asked of an external cluster

:func:`translate` is the one place lower-layer errors become kresilient exceptions.

Example::

    def on_delivery(err, msg):
        if err is not None:
            c = classify(err)
            if c.retriable: ...           # safe to produce again
            log.warning("delivery failed", category=c.category.name, remedy=c.remedy)
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeAlias

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.serialization import SerializationError

from kresilient._error_table import CONSUME_ONLY, DELIVERY_ROWS, PRODUCE_ONLY, ROWS, Row
from kresilient.redaction import REDACTED, is_secret_key, redact_text

__all__ = [
    "REGISTRY_AUTH",
    "REGISTRY_NOT_FOUND",
    "REGISTRY_UNAVAILABLE",
    "TOO_LARGE_CODES",
    "Action",
    "BatchItemError",
    "ChaosNotSupportedError",
    "CircuitBreakerOpenError",
    "Classification",
    "ClusterError",
    "CommitError",
    "ConfigError",
    "ConsumeError",
    "Context",
    "CrashLoopError",
    "DeadLetterError",
    "DeliveryError",
    "DeliveryFailure",
    "ErrorCategory",
    "FatalProducerError",
    "KResilientError",
    "KafkaClientError",
    "MessageTooLargeError",
    "Operation",
    "ProduceError",
    "ReplayMismatchError",
    "SchemaError",
    "SpoolCorruptError",
    "SpoolError",
    "UnsafeConfigError",
    "classify",
    "exception_type_name",
    "failure_from_report",
    "is_unproducible",
    "registry_classification",
    "translate",
]


class ErrorCategory(enum.Enum):
    """What kind of failure an error is (see docs/errors.md for every code)."""

    LEADERSHIP = "leadership"  #: leader moved / metadata stale: refresh and retry
    TRANSIENT = "transient"  #: temporary broker or network condition: retry with backoff
    BACKPRESSURE = "backpressure"  #: local queue full or quota: poll, back off, retry
    DELIVERY_TIMEOUT = "delivery_timeout"  #: gave up after message.timeout.ms (or purged)
    CONFIG = "config"  #: wrong configuration, topic or request: fix, do not retry
    AUTH = "auth"  #: authentication / authorization: fix credentials or ACLs
    FATAL_PRODUCER = "fatal_producer"  #: the producer instance is unusable: recreate it
    ABORTABLE = "abortable"  #: abort the transaction and retry it
    GROUP = "group"  #: consumer group membership changed: rejoin
    OFFSET_RESET = "offset_reset"  #: offsets reset: data may have been skipped
    POISON = "poison"  #: this record cannot be processed: dead-letter it
    BENIGN = "benign"  #: informational, nothing to do
    UNKNOWN = "unknown"  #: not known to the table (or internal): do not retry blindly
    #: the record killed the process (OOM, crash in C code, os._exit) on every start:
    #: dead-letter it without calling the handler again (header value ``crash_loop``)
    CRASH_LOOP = "crash_loop"


class Action(enum.Enum):
    """What a client should do about an error."""

    RETRY = "retry"
    REFRESH_AND_RETRY = "refresh_and_retry"
    BACKOFF_AND_RETRY = "backoff_and_retry"
    DEAD_LETTER = "dead_letter"
    FAIL = "fail"
    RECREATE_PRODUCER = "recreate_producer"
    ABORT_TRANSACTION = "abort_transaction"
    REJOIN_GROUP = "rejoin_group"
    IGNORE = "ignore"
    ALERT = "alert"


@dataclass(frozen=True, kw_only=True, slots=True)
class Classification:
    """The verdict on one error.

    ``possibly_persisted`` means the broker may have written the message although the client
    saw a failure: a retry may duplicate it unless the producer is idempotent.
    """

    code: int | None
    name: str
    category: ErrorCategory
    retriable: bool
    refresh_metadata: bool
    possibly_persisted: bool
    fatal: bool
    action: Action
    remedy: str
    java_exception: str = ""


@dataclass(frozen=True, slots=True)
class _Defaults:
    retriable: bool
    refresh: bool
    persisted: bool
    fatal: bool
    action: Action


_CATEGORY_DEFAULTS: Final[Mapping[ErrorCategory, _Defaults]] = {
    ErrorCategory.LEADERSHIP: _Defaults(True, True, False, False, Action.REFRESH_AND_RETRY),
    ErrorCategory.TRANSIENT: _Defaults(True, False, False, False, Action.BACKOFF_AND_RETRY),
    ErrorCategory.BACKPRESSURE: _Defaults(True, False, False, False, Action.BACKOFF_AND_RETRY),
    # A timed-out or purged message is the cluster's (or the caller's) doing, not the record's:
    # it may even be written. It is surfaced (FAIL), never dead-lettered (is_unproducible).
    ErrorCategory.DELIVERY_TIMEOUT: _Defaults(False, False, True, False, Action.FAIL),
    ErrorCategory.CONFIG: _Defaults(False, False, False, False, Action.FAIL),
    ErrorCategory.AUTH: _Defaults(False, False, False, False, Action.FAIL),
    ErrorCategory.FATAL_PRODUCER: _Defaults(False, False, False, True, Action.RECREATE_PRODUCER),
    ErrorCategory.ABORTABLE: _Defaults(False, False, False, False, Action.ABORT_TRANSACTION),
    ErrorCategory.GROUP: _Defaults(False, False, False, False, Action.REJOIN_GROUP),
    ErrorCategory.OFFSET_RESET: _Defaults(False, False, False, False, Action.ALERT),
    ErrorCategory.POISON: _Defaults(False, False, False, False, Action.DEAD_LETTER),
    ErrorCategory.BENIGN: _Defaults(False, False, False, False, Action.IGNORE),
    ErrorCategory.UNKNOWN: _Defaults(False, False, False, False, Action.ALERT),
    ErrorCategory.CRASH_LOOP: _Defaults(False, False, False, False, Action.DEAD_LETTER),
}


def _build_table(rows: tuple[Row, ...]) -> dict[int, Classification]:
    table: dict[int, Classification] = {}
    for row in rows:
        category = ErrorCategory[row.category]
        d = _CATEGORY_DEFAULTS[category]
        java = row.java
        remedy = f"{row.remedy} (Java: {java})" if java else row.remedy
        table[row.code] = Classification(
            code=row.code,
            name=row.name,
            category=category,
            retriable=d.retriable if row.retriable is None else row.retriable,
            refresh_metadata=d.refresh if row.refresh is None else row.refresh,
            possibly_persisted=d.persisted if row.persisted is None else row.persisted,
            fatal=d.fatal if row.fatal is None else row.fatal,
            action=d.action if row.action is None else Action[row.action],
            remedy=remedy,
            java_exception=java,
        )
    return table


#: code -> Classification, built once at import from the data table.
_BY_CODE: Final[dict[int, Classification]] = _build_table(ROWS)

Context = Literal["delivery"]
"""Where an error was seen, when that changes its meaning (see ``DELIVERY_ROWS``)."""

_BY_CONTEXT: Final[Mapping[Context, dict[int, Classification]]] = {
    "delivery": _build_table(DELIVERY_ROWS),
}

#: librdkafka error descriptions (``KafkaError(code).str()``) -> code, to unwrap ``_FATAL``
#: texts of the form "Fatal error: <description>: <reason>".
_BY_DESCRIPTION: Final[dict[str, int]] = {
    KafkaError(code).str(): code for code in _BY_CODE if code not in (0, KafkaError._FATAL)
}
_FATAL_PREFIX: Final = "Fatal error: "

_VARIANTS: dict[tuple[int | None, str, str], Classification] = {}


def _unknown_code(code: int) -> Classification:
    return Classification(
        code=code,
        name=f"ERR_{code}",
        category=ErrorCategory.UNKNOWN,
        retriable=False,
        refresh_metadata=False,
        possibly_persisted=False,
        fatal=False,
        action=Action.ALERT,
        remedy="Error code unknown to this kresilient/librdkafka version: do not retry "
        "blindly; look the code up in the Kafka protocol docs",
    )


def _fatal_variant(base: Classification) -> Classification:
    key = (base.code, base.name, "fatal")
    hit = _VARIANTS.get(key)
    if hit is None:
        if base.fatal and base.category is ErrorCategory.FATAL_PRODUCER:
            hit = base
        elif base.category is ErrorCategory.GROUP:  # a consumer's fatal error
            hit = dataclasses.replace(base, fatal=True, retriable=False, action=Action.FAIL)
        else:
            hit = dataclasses.replace(
                base,
                category=ErrorCategory.FATAL_PRODUCER,
                fatal=True,
                retriable=False,
                action=Action.RECREATE_PRODUCER,
                remedy=f"Fatal: the client instance is unusable, recreate it. {base.remedy}",
            )
        _VARIANTS[key] = hit
    return hit


def _abort_variant(base: Classification) -> Classification:
    key = (base.code, base.name, "abort")
    hit = _VARIANTS.get(key)
    if hit is None:
        hit = dataclasses.replace(
            base,
            category=ErrorCategory.ABORTABLE,
            retriable=False,
            action=Action.ABORT_TRANSACTION,
            remedy=f"abort_transaction(), then retry the transaction. {base.remedy}",
        )
        _VARIANTS[key] = hit
    return hit


def _retriable_variant(base: Classification) -> Classification:
    key = (base.code, base.name, "retriable")
    hit = _VARIANTS.get(key)
    if hit is None:
        action = base.action if base.retriable else Action.RETRY
        hit = dataclasses.replace(base, retriable=True, action=action)
        _VARIANTS[key] = hit
    return hit


def _by_code(code: int, context: Context | None = None) -> Classification:
    if context is not None:
        hit = _BY_CONTEXT[context].get(code)
        if hit is not None:
            return hit
    hit = _BY_CODE.get(code)
    return hit if hit is not None else _unknown_code(code)


def _unwrap_fatal(err: KafkaError) -> Classification:
    """``_FATAL`` only says "fatal": find the underlying code in librdkafka's text."""
    text = err.str() or ""
    if text.startswith(_FATAL_PREFIX):
        rest = text[len(_FATAL_PREFIX) :]
        for description, code in _BY_DESCRIPTION.items():
            if rest.startswith(description):
                return _fatal_variant(_BY_CODE[code])
    return _BY_CODE[KafkaError._FATAL]


_CLOSED_REMEDY: Final = (
    "The client is closed: nothing can be produced, consumed or committed after close(); "
    "the call was refused and nothing was queued. Create a new client, or stop calling "
    "it after close()"
)


def _closed_variant(base: Classification) -> Classification:
    key = (base.code, base.name, "closed")
    hit = _VARIANTS.get(key)
    if hit is None:
        hit = dataclasses.replace(base, remedy=_CLOSED_REMEDY, action=Action.FAIL)
        _VARIANTS[key] = hit
    return hit


def _classify_kafka_error(err: KafkaError, context: Context | None) -> Classification:
    code = err.code()
    if code == KafkaError._FATAL:
        return _unwrap_fatal(err)
    if code == KafkaError._STATE and "closed" in (err.str() or ""):
        # The clients signal use after close() with _STATE (whose table remedy is about call
        # order, e.g. transactions): say what actually happened.
        return _closed_variant(_BY_CODE[code])
    base = _by_code(code, context)
    if err.fatal():
        return _fatal_variant(base)
    if err.txn_requires_abort():
        return _abort_variant(base)
    if err.retriable():
        return _retriable_variant(base)
    return base


def _synthetic(name: str, category: ErrorCategory, remedy: str, **kw: Any) -> Classification:
    d = _CATEGORY_DEFAULTS[category]
    values: dict[str, Any] = {
        "retriable": d.retriable,
        "refresh_metadata": d.refresh,
        "possibly_persisted": d.persisted,
        "fatal": d.fatal,
        "action": d.action,
    }
    values.update(kw)
    return Classification(code=None, name=name, category=category, remedy=remedy, **values)


_SERIALIZATION: Final = _synthetic(
    "SerializationError",
    ErrorCategory.POISON,
    "The record could not be (de)serialized: fix it or dead-letter it "
    "(Java: SerializationException)",
)
_CONFIG: Final = _synthetic(
    "ConfigError", ErrorCategory.CONFIG, "Fix the configuration (Java: ConfigException)"
)
_CIRCUIT_OPEN: Final = _synthetic(
    "CircuitBreakerOpen",
    ErrorCategory.POISON,
    "Too many dead letters in the window: stop and inspect the dead-letter topic",
    action=Action.ALERT,
)
_DEAD_LETTER_FAILED: Final = _synthetic(
    "DeadLetterFailed",
    ErrorCategory.UNKNOWN,
    "The dead-letter write failed: do not commit the source offset; check the DLQ topic",
)
_UNKNOWN_EXCEPTION: Final = _synthetic(
    "UnknownException",
    ErrorCategory.UNKNOWN,
    "Not a Kafka error kresilient knows: do not retry blindly",
)
_CRASH_LOOP: Final = _synthetic(
    "CRASH_LOOP",
    ErrorCategory.CRASH_LOOP,
    "The process died (OOM kill, crash in a C extension, os._exit ...) while handling this "
    "record, once per start: fix the handler or the record, then `kresilient dlq replay`",
)

# --------------------------------------------------------------------------- Schema Registry

# confluent-kafka's SchemaRegistryError is a plain Exception with ``http_status_code``; its
# HTTP client raises httpx transport errors for refused connections and timeouts. Both are
# recognised by type name and attributes, so this module never imports the registry client
# (the ``schemaregistry`` extra). An outage must not dead-letter good records (issue 17).
_HTTP_MODULES: Final = frozenset(
    {"httpx", "httpx2", "httpcore", "httpcore2", "requests", "urllib3", "aiohttp"}
)
#: transport-level failures (connection refused/reset, DNS, timeouts) of those clients
_TRANSPORT_NAMES: Final = frozenset(
    {
        "TransportError",
        "NetworkError",
        "ConnectError",
        "ConnectTimeout",
        "TimeoutException",
        "ReadTimeout",
        "ReadError",
        "RemoteProtocolError",
        "ConnectionError",
        "Timeout",
        "ProtocolError",
        "NewConnectionError",
        "MaxRetryError",
        "ClientConnectionError",
    }
)
_CHAIN_DEPTH: Final = 8


def _registry(category: ErrorCategory, name: str, remedy: str) -> Classification:
    # AUTH is held and retried like an outage: a credential problem must not dead-letter
    # good records (the categories' default for AUTH is FAIL).
    retried = category is not ErrorCategory.POISON
    return _synthetic(
        name,
        category,
        remedy,
        retriable=retried,
        action=Action.BACKOFF_AND_RETRY if retried else Action.DEAD_LETTER,
    )


#: 5xx, 429, 408, a non-JSON error page, a connection failure or a timeout.
REGISTRY_UNAVAILABLE: Final = _registry(
    ErrorCategory.TRANSIENT,
    "SCHEMA_REGISTRY_UNAVAILABLE",
    "The Schema Registry is unavailable (5xx, 429, timeout or connection failure): the "
    "record is held and retried; check the registry's health and its URL",
)
#: 401/403.
REGISTRY_AUTH: Final = _registry(
    ErrorCategory.AUTH,
    "SCHEMA_REGISTRY_AUTH",
    "The Schema Registry refused the credentials (401/403): the record is held and retried; "
    "fix basic.auth.user.info / bearer settings or the registry ACLs",
)
#: Any other 4xx (40401 subject not found, 40403 schema not found, 422 invalid).
REGISTRY_NOT_FOUND: Final = _registry(
    ErrorCategory.POISON,
    "SCHEMA_REGISTRY_NOT_FOUND",
    "The Schema Registry does not know this record's schema (4xx, e.g. 40403): the record "
    "was written with another registry or a deleted schema; dead-lettered",
)


def _registry_status(exc: BaseException) -> int | None:
    if type(exc).__name__ != "SchemaRegistryError":
        return None
    status = getattr(exc, "http_status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _is_transport(exc: BaseException) -> bool:
    for cls in type(exc).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in _HTTP_MODULES and cls.__name__ in _TRANSPORT_NAMES:
            return True
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and what confluent's (de)serialization wrappers
    hold in ``.exception``; breadth first, each once, at most 8."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < _CHAIN_DEPTH:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        inner = getattr(item, "exception", None)
        todo += [
            item.__cause__,
            item.__context__,
            inner if isinstance(inner, BaseException) else None,
        ]
    return seen


def registry_classification(exc: BaseException, *, transport: bool = True) -> Classification | None:
    """The classification of a Schema Registry client failure anywhere in ``exc``'s chain,
    or ``None`` when nothing in it is one.

    A ``SchemaRegistryError`` by its ``http_status_code``: 5xx, 408, 429 and a non-JSON
    error response (status -1) -> :data:`REGISTRY_UNAVAILABLE` (TRANSIENT, retried); 401/403
    -> :data:`REGISTRY_AUTH` (AUTH, held and retried); any other 4xx ->
    :data:`REGISTRY_NOT_FOUND` (POISON, dead-lettered). With ``transport`` (the default), an
    HTTP client's connection failure or timeout counts as an outage too: pass it only for
    errors raised by a (de)serializer, where the registry is the one HTTP peer.

    >>> from confluent_kafka.schema_registry.error import SchemaRegistryError
    >>> registry_classification(SchemaRegistryError(503, 50301, "down")).category.name
    'TRANSIENT'
    """
    for item in _chain(exc):
        status = _registry_status(item)
        if status is not None:
            if status >= 500 or status in (408, 429) or status < 0:
                return REGISTRY_UNAVAILABLE
            if status in (401, 403):
                return REGISTRY_AUTH
            return REGISTRY_NOT_FOUND
        if transport and _is_transport(item):
            return REGISTRY_UNAVAILABLE
    return None


def classify(err: object, *, context: Context | None = None) -> Classification:
    """Classify a Kafka error, exception or code. Cheap (dict lookups); safe on hot paths.

    Accepts ``KafkaError``, ``KafkaException`` (its ``args[0]``), an int code, ``BufferError``
    (librdkafka's ``_QUEUE_FULL``), confluent-kafka serialization errors (``POISON``), a
    :class:`KResilientError`, or any other exception (``UNKNOWN``, not retriable).

    Schema Registry failures (see :func:`registry_classification`): a
    ``SchemaRegistryError`` is classified by its HTTP status, alone or wrapped by a
    (de)serializer, so a registry outage is TRANSIENT instead of POISON; a connection
    failure or timeout of the registry's HTTP client counts only inside a (de)serialization
    error (elsewhere an HTTP error need not be the registry's).

    Pass ``context="delivery"`` for a delivery report's error: librdkafka has then already
    retried what it could, so e.g. ``UNKNOWN_TOPIC_OR_PART`` means a missing topic (CONFIG),
    not a leader move.

    >>> classify(KafkaError.NOT_LEADER_FOR_PARTITION).category
    <ErrorCategory.LEADERSHIP: 'leadership'>
    """
    if isinstance(err, KafkaError):
        return _classify_kafka_error(err, context)
    if isinstance(err, int) and not isinstance(err, bool):
        return _by_code(err, context)
    if isinstance(err, KResilientError):
        return err.classification
    if isinstance(err, SerializationError):
        # confluent wraps the registry's errors in ValueDeserializationError & co, whose
        # KafkaError code says POISON; an outage behind it is not the record's fault.
        registry = registry_classification(err)
        if registry is not None:
            return registry
    if isinstance(err, KafkaException):
        inner = err.args[0] if err.args else None
        if isinstance(inner, KafkaError):
            return _classify_kafka_error(inner, context)
        if isinstance(err, SerializationError):
            return _SERIALIZATION
        return _UNKNOWN_EXCEPTION
    if isinstance(err, BufferError):
        return _BY_CODE[KafkaError._QUEUE_FULL]
    if isinstance(err, BaseException):
        registry = registry_classification(err, transport=False)
        if registry is not None:
            return registry
    return _UNKNOWN_EXCEPTION


#: Kafka codes saying a record is too large to be produced (by the client's
#: ``message.max.bytes``, the topic's ``max.message.bytes`` or the broker's segment size).
TOO_LARGE_CODES: Final[frozenset[int]] = frozenset(
    {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}
)


def is_unproducible(failure: Classification | BaseException | KafkaError | int) -> bool:
    """True when a record can never be produced as it is, whatever the retry: dead-letter it.

    The one definition of "dead-letter-worthy" shared by the producer, the consumer and the
    Spark sink: a value too large, an invalid or corrupt record, a bad timestamp, a partition
    the topic lacks, a (de)serialization failure, or a handler failure the consumer classified
    as poison. Anything retriable, possibly already written (``_MSG_TIMED_OUT``,
    ``_PURGE_INFLIGHT``), purged (``_PURGE_QUEUE``), fatal, or caused by the cluster rather
    than the record (``NOT_ENOUGH_REPLICAS``, leadership, a topic not created yet) is not:
    such a record must be retried or its failure surfaced, never parked as a dead letter.

    Equivalent to ``action is Action.DEAD_LETTER`` on a classification that is neither
    retriable, possibly persisted nor fatal. A Kafka error, exception or code is classified
    in delivery context first.

    >>> is_unproducible(KafkaError.MSG_SIZE_TOO_LARGE), is_unproducible(KafkaError._MSG_TIMED_OUT)
    (True, False)
    """
    c = failure if isinstance(failure, Classification) else classify(failure, context="delivery")
    return (
        c.action is Action.DEAD_LETTER
        and not c.retriable
        and not c.possibly_persisted
        and not c.fatal
    )


def exception_type_name(exc: BaseException | type[BaseException]) -> str:
    """``module.QualName`` of an exception (builtins without a module: ``ValueError``).

    >>> import json
    >>> exception_type_name(json.JSONDecodeError("x", "", 0))
    'json.decoder.JSONDecodeError'
    """
    cls = exc if isinstance(exc, type) else type(exc)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


# --------------------------------------------------------------------------- exceptions

_PROPERTY = re.compile(r'(?:configuration )?property:? "(?P<k>[^"]+)"')


def _rebuild(cls: type[KResilientError], message: str, state: dict[str, Any]) -> KResilientError:
    obj = cls.__new__(cls)
    Exception.__init__(obj, message)
    obj.__dict__.update(state)
    return obj


class KResilientError(Exception):
    """Base of every kresilient exception."""

    def __init__(self, message: str = "", *, classification: Classification | None = None):
        # Every exit of a message goes through redaction: librdkafka echoes config values.
        message = redact_text(message)
        super().__init__(message)
        self.message = message
        self._classification = classification

    @property
    def classification(self) -> Classification:
        """The classification of the failure behind this exception."""
        return self._classification if self._classification is not None else _UNKNOWN_EXCEPTION

    @property
    def remedy(self) -> str:
        """One line on what to do."""
        return self.classification.remedy

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


class ConfigError(KResilientError):
    """Bad, unknown or conflicting configuration; ``key`` names the property when known."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        classification: Classification | None = None,
    ):
        super().__init__(message, classification=classification or _CONFIG)
        self.key = key


class UnsafeConfigError(ConfigError):
    """The configuration would weaken a guarantee; refused unless explicitly allowed.

    ``value`` is kept for programs but never rendered when ``key`` looks secret.
    """

    def __init__(self, message: str, *, key: str | None = None, value: object = None):
        super().__init__(message, key=key)
        self.value = value

    def __repr__(self) -> str:
        shown = REDACTED if self.key is not None and is_secret_key(self.key) else repr(self.value)
        return f"{type(self).__name__}({self.message!r}, key={self.key!r}, value={shown})"


class KafkaClientError(KResilientError):
    """A Kafka error with its code, name, topic/partition (when known) and classification."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        name: str | None = None,
        topic: str | None = None,
        partition: int | None = None,
        classification: Classification | None = None,
    ):
        if classification is None:
            classification = _by_code(code) if code is not None else _UNKNOWN_EXCEPTION
        super().__init__(message, classification=classification)
        self.code = code if code is not None else classification.code
        self.name = name if name is not None else classification.name
        self.topic = topic
        self.partition = partition

    def __str__(self) -> str:
        where = ""
        if self.topic is not None:
            where = f" on {self.topic}" + (
                f"[{self.partition}]" if self.partition is not None else ""
            )
        c = self.classification
        if c is _UNKNOWN_EXCEPTION and self.code is None:
            # raised by kresilient itself, with no Kafka error behind it (a fenced zombie, an
            # outcome it cannot know): its message says it all, no "not a Kafka error" tail
            return f"{self.message}{where}"
        return (
            f"{self.name} ({self.code}){where}: {self.message} "
            f"[{c.category.name}, {c.action.name}] {c.remedy}"
        )


class ProduceError(KafkaClientError):
    """One message could not be produced."""


class MessageTooLargeError(ProduceError):
    """A value exceeds a size limit (``size`` and ``limit`` in bytes, when known)."""

    def __init__(
        self, message: str, *, size: int | None = None, limit: int | None = None, **kwargs: Any
    ):
        kwargs.setdefault("code", KafkaError.MSG_SIZE_TOO_LARGE)
        super().__init__(message, **kwargs)
        self.size = size
        self.limit = limit


class SpoolError(ProduceError):
    """The spool could not store a message (disk full, I/O error), is full (BACKPRESSURE),
    or its file cannot be opened: in use by another ``Spool`` (the OS lock), locked by
    another program, an I/O error, or used in a forked child. Nothing is moved or deleted.

    A message named by this error was not stored and never handed to Kafka.
    """


class SpoolCorruptError(SpoolError):
    """The spool file is not readable; it was renamed aside (``quarantined``), not deleted.

    The next ``Spool(path)`` starts empty. The quarantined file keeps what it held for
    inspection (``sqlite3 <file> .recover``).
    """

    def __init__(self, message: str, *, quarantined: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.quarantined = quarantined


class FatalProducerError(KafkaClientError):
    """The producer instance is unusable (fenced, idempotence state lost): recreate it."""


class CommitError(KafkaClientError):
    """An offset commit failed."""


class ConsumeError(KafkaClientError):
    """A consumer-side error surfaced by poll/consume."""


HeadersLike: TypeAlias = (
    Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None
)


@dataclass(frozen=True, kw_only=True)
class DeliveryFailure:
    """One message that failed delivery. ``key`` and ``headers`` stay out of ``repr``."""

    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None = field(default=None, repr=False)
    value_size: int = 0
    headers: HeadersLike = field(default=None, repr=False)
    classification: Classification
    error: KafkaError | None = None
    message_id: int = 0

    @classmethod
    def from_report(cls, err: KafkaError, msg: Any, *, message_id: int = 0) -> DeliveryFailure:
        """Build from a delivery report's ``(err, msg)`` pair (see :func:`failure_from_report`)."""
        return failure_from_report(err, msg, message_id=message_id)


class _Unset(enum.Enum):
    UNSET = enum.auto()


_UNSET: Final = _Unset.UNSET


def failure_from_report(
    err: KafkaError,
    msg: Any = None,
    *,
    topic: str | _Unset = _UNSET,
    partition: int | _Unset | None = _UNSET,
    offset: int | _Unset | None = _UNSET,
    key: bytes | str | _Unset | None = _UNSET,
    value: bytes | str | _Unset | None = _UNSET,
    headers: HeadersLike | _Unset = _UNSET,
    classification: Classification | None = None,
    message_id: int = 0,
) -> DeliveryFailure:
    """The one builder of a :class:`DeliveryFailure` from a delivery report.

    ``msg`` is the report's ``confluent_kafka.Message`` (or ``None``); each keyword given
    replaces what the message says (delivery reports drop headers, so a caller that kept them
    passes ``headers=``; a caller without a message passes the fields). A negative partition
    or offset means "unknown" and becomes ``None``; a ``str`` key is UTF-8 encoded.
    ``classification`` defaults to :func:`classify` of ``err`` in delivery context.
    """
    if topic is _UNSET:
        topic = msg.topic() if msg is not None else ""
    if partition is _UNSET:
        partition = msg.partition() if msg is not None else None
    if offset is _UNSET:
        offset = msg.offset() if msg is not None else None
    if key is _UNSET:
        key = msg.key() if msg is not None else None
    if value is _UNSET:
        value = msg.value() if msg is not None else None
    if headers is _UNSET:
        headers = msg.headers() if msg is not None else None
    if isinstance(value, str):
        value_size = len(value.encode("utf-8", "replace"))
    else:
        value_size = len(value) if value is not None else 0
    return DeliveryFailure(
        topic=topic or "",
        partition=partition if partition is not None and partition >= 0 else None,
        offset=offset if offset is not None and offset >= 0 else None,
        key=key.encode("utf-8", "replace") if isinstance(key, str) else key,
        value_size=value_size,
        headers=headers,
        classification=(
            classification if classification is not None else classify(err, context="delivery")
        ),
        error=err,
        message_id=message_id,
    )


#: At most this many (topic, error) groups are spelled out in a DeliveryError's message.
_SUMMARY_GROUPS: Final = 10


def _delivery_summary(failures: Sequence[DeliveryFailure]) -> str:
    """``N message(s) failed delivery: <topic>: <n> x <NAME> (<CATEGORY>) — <remedy> | ...``.

    One group per topic and error, largest first within a topic; each remedy is quoted once
    (a later group with the same remedy says so instead of repeating it).
    """
    groups: dict[tuple[str, str, str], int] = {}
    remedies: dict[tuple[str, str, str], str] = {}
    for f in failures:
        c = f.classification
        key = (f.topic or "?", c.name, c.category.name)
        groups[key] = groups.get(key, 0) + 1
        remedies.setdefault(key, c.remedy)
    ordered = sorted(groups.items(), key=lambda item: (item[0][0], -item[1], item[0][1]))
    quoted: set[str] = set()
    parts: list[str] = []
    for (topic, name, category), n in ordered[:_SUMMARY_GROUPS]:
        remedy = remedies[(topic, name, category)]
        if remedy in quoted:
            told = "same remedy as above"
        else:
            quoted.add(remedy)
            told = remedy
        parts.append(f"{topic}: {n} x {name} ({category}) — {told}")
    if len(ordered) > _SUMMARY_GROUPS:
        rest = sum(n for _, n in ordered[_SUMMARY_GROUPS:])
        parts.append(f"and {rest} more in {len(ordered) - _SUMMARY_GROUPS} other group(s)")
    return f"{len(failures)} message(s) failed delivery: " + " | ".join(parts)


class DeliveryError(KResilientError):
    """``flush()`` found failed messages; ``failures`` lists them (classified).

    Without an explicit message, the message groups the failures by topic and error and
    quotes each group's remedy once::

        100 message(s) failed delivery: orders: 100 x UNKNOWN_TOPIC_OR_PART (CONFIG) — The
        topic (or partition) does not exist: ... create the topic ...
    """

    def __init__(self, message: str = "", *, failures: Sequence[DeliveryFailure] = ()):
        self.failures: tuple[DeliveryFailure, ...] = tuple(failures)
        if not message:
            message = _delivery_summary(self.failures)
        first = self.failures[0].classification if self.failures else None
        super().__init__(message, classification=first)


class DeadLetterError(KResilientError):
    """A dead-letter write failed or was not acknowledged (do not commit the source offset)."""

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        classification: Classification | None = None,
    ):
        super().__init__(message, classification=classification or _DEAD_LETTER_FAILED)
        self.topic = topic


class CircuitBreakerOpenError(KResilientError):
    """Too many dead letters (``dead_letters``) within ``window`` seconds."""

    def __init__(self, message: str = "", *, dead_letters: int, window: float):
        if not message:
            message = f"{dead_letters} dead letters within {window:g} s: circuit breaker open"
        super().__init__(message, classification=_CIRCUIT_OPEN)
        self.dead_letters = dead_letters
        self.window = window


class BatchItemError(KResilientError):
    """Raise from a batch handler: messages before ``index`` succeeded, ``index`` failed.

    Example::

        def handle_batch(messages):
            for i, msg in enumerate(messages):
                try:
                    store(msg)
                except Exception as exc:
                    raise BatchItemError(index=i) from exc

    Any other exception fails the whole batch (retried as one; dead-lettered message by
    message once the retries are exhausted).
    """

    def __init__(self, message: str = "", *, index: int, cause: BaseException | None = None):
        super().__init__(message or f"batch item {index} failed")
        self.index = index
        self.cause = cause

    def failure(self) -> BaseException:
        """The exception of the failed item (``cause``, else ``__cause__``, else self)."""
        return self.cause or self.__cause__ or self


class CrashLoopError(KResilientError):
    """A record killed the consuming process (OOM kill, a crash in a C extension,
    ``os._exit``) on ``deaths`` starts in a row, ``max_deaths`` being the limit: the consumer
    dead-letters it (``kresilient.error.category=crash_loop``, ``kresilient.attempts`` =
    ``deaths``) without calling the handler again. Classified :attr:`ErrorCategory.CRASH_LOOP`.
    """

    def __init__(
        self,
        message: str = "",
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        deaths: int,
        max_deaths: int,
    ):
        super().__init__(
            message
            or f"the process died {deaths} times while handling {topic}[{partition}]@{offset} "
            f"(max_process_deaths={max_deaths}): dead-lettered without calling the handler "
            "again",
            classification=_CRASH_LOOP,
        )
        self.topic, self.partition, self.offset = topic, partition, offset
        self.deaths, self.max_deaths = deaths, max_deaths


class SchemaError(ConfigError):
    """The DataFrame written to the sink has a column of the wrong type, or lacks ``value``."""


class ReplayMismatchError(KResilientError):
    """A replayed micro-batch differs from the committed one, or the marker is another query's."""


class ClusterError(KResilientError):
    """The local cluster failed to start, or an operation on it failed."""


class ChaosNotSupportedError(ClusterError):
    """A chaos operation was asked of an external cluster (``KRESILIENT_BOOTSTRAP_SERVERS``)."""


# --------------------------------------------------------------------------- translate

Operation = Literal["produce", "consume", "commit", "configure"]

_OPERATION_CLASS: Final[Mapping[Operation | None, type[KafkaClientError]]] = {
    "produce": ProduceError,
    "consume": ConsumeError,
    "commit": CommitError,
    None: KafkaClientError,
}

_CODE_OF_NAME: Final[Mapping[str, int]] = {row.name: row.code for row in ROWS}
#: Codes that only arise on one side (from the table): used when the caller does not say.
_CODE_SIDE: Final[Mapping[int, Operation]] = {
    **{_CODE_OF_NAME[n]: "produce" for n in PRODUCE_ONLY},
    **{_CODE_OF_NAME[n]: "consume" for n in CONSUME_ONLY},
}


def _kafka_error_of(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def translate(
    exc: BaseException | KafkaError,
    *,
    topic: str | None = None,
    partition: int | None = None,
    operation: Operation | None = None,
    context: Context | None = None,
    redactor: Callable[[str], str] | None = None,
) -> KResilientError:
    """Turn a lower-layer error into a kresilient exception (the one place this happens).

    ``operation`` says what was being done ("produce", "consume", "commit" or "configure");
    without it the code decides when it only arises on one side, else the result is a plain
    :class:`KafkaClientError`. ``context`` is passed to :func:`classify` (use
    ``"delivery"`` for a delivery report's error). Fatal errors become
    :class:`FatalProducerError` (producer side), size errors :class:`MessageTooLargeError`.
    A kresilient exception is returned unchanged. The message is redacted: by pattern always,
    and by value with ``redactor`` (a client's
    :meth:`kresilient.redaction.Redactor.for_config`). Raise the result ``from exc``::

        except KafkaException as exc:
            raise translate(exc, topic=topic, operation="produce") from exc
    """
    if isinstance(exc, KResilientError):
        return exc
    scrub = redactor if redactor is not None else redact_text
    classification = classify(exc, context=context)
    kerr = exc if isinstance(exc, KafkaError) else _kafka_error_of(exc)
    if kerr is not None:
        message = scrub(kerr.str() or "")
    elif isinstance(exc, BufferError):
        message = str(exc) or "Local: Queue full"
    else:
        message = scrub(str(exc)) or type(exc).__name__

    code = classification.code
    if operation == "configure":
        m = _PROPERTY.search(message)
        return ConfigError(message, key=m.group("k") if m else None, classification=classification)
    if operation is None:
        if isinstance(exc, BufferError):
            operation = "produce"
        elif code is not None:
            operation = _CODE_SIDE.get(code)
        elif classification is _SERIALIZATION:
            operation = "consume" if "Deserializ" in type(exc).__name__ else "produce"
        if operation is None and kerr is None and classification is _UNKNOWN_EXCEPTION:
            return KResilientError(message, classification=classification)

    cls: type[KafkaClientError]
    if classification.fatal and operation != "consume" and operation != "commit":
        cls = FatalProducerError
    elif code in TOO_LARGE_CODES and operation in (None, "produce"):
        cls = MessageTooLargeError
    else:
        cls = _OPERATION_CLASS[operation]
    return cls(
        message,
        code=code,
        name=classification.name,
        topic=topic,
        partition=partition,
        classification=classification,
    )


def _render_markdown() -> str:
    """The docs/errors.md code table, generated from the data table."""
    lines = [
        "| Code | Name | Category | Retriable | Refresh metadata | Possibly persisted "
        "| Fatal | Action | Remedy |",
        "|---:|---|---|---|---|---|---|---|---|",
    ]
    yn = {True: "yes", False: "no"}
    for code in sorted(_BY_CODE):
        c = _BY_CODE[code]
        lines.append(
            f"| {code} | `{c.name}` | {c.category.name} | {yn[c.retriable]} "
            f"| {yn[c.refresh_metadata]} | {yn[c.possibly_persisted]} | {yn[c.fatal]} "
            f"| {c.action.name} | {c.remedy.replace('|', '/')} |"
        )
    return "\n".join(lines) + "\n"
