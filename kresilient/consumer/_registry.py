"""Schema Registry client errors: an outage is not a poison record (issue 17, item 3).

confluent-kafka's ``SchemaRegistryError`` is a plain ``Exception`` carrying
``http_status_code``; its HTTP client raises ``httpx`` transport errors for refused
connections and timeouts. Wrapped by a deserializer into ``ValueDeserializationError`` they
looked like undecodable records and went to the dead-letter topic until the breaker tripped.
:func:`registry_classification` looks through the exception chain:

* 5xx, 429, 408, a malformed (non-JSON) error response, a connection failure or a timeout
  -> TRANSIENT (``BACKOFF_AND_RETRY``): the consumer holds the partition (paused, polling on)
  and retries under its ``outage_retry`` policy (default: until the registry answers);
* 401/403 -> AUTH: also held (a credential problem must not dead-letter good records);
* any other 4xx (40401 subject not found, 40403 schema not found, 422 invalid) -> POISON:
  dead-lettered at once, as are decode errors (bad magic byte, payload not matching).

Nothing here imports the Schema Registry client (it needs the ``schemaregistry`` extra): the
errors are recognised by their type names and attributes.
"""

from __future__ import annotations

from typing import Final

from kresilient.errors import Action, Classification, ErrorCategory

__all__ = ["registry_classification"]

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
_MAX_DEPTH: Final = 8


def _classification(category: ErrorCategory, name: str, remedy: str) -> Classification:
    retried = category is not ErrorCategory.POISON
    return Classification(
        code=None,
        name=name,
        category=category,
        retriable=retried,
        refresh_metadata=False,
        possibly_persisted=False,
        fatal=False,
        action=Action.BACKOFF_AND_RETRY if retried else Action.DEAD_LETTER,
        remedy=remedy,
    )


REGISTRY_UNAVAILABLE: Final = _classification(
    ErrorCategory.TRANSIENT,
    "SCHEMA_REGISTRY_UNAVAILABLE",
    "The Schema Registry is unavailable (5xx, 429, timeout or connection failure): the "
    "record is held and retried; check the registry's health and its URL",
)
REGISTRY_AUTH: Final = _classification(
    ErrorCategory.AUTH,
    "SCHEMA_REGISTRY_AUTH",
    "The Schema Registry refused the credentials (401/403): the record is held and retried; "
    "fix basic.auth.user.info / bearer settings or the registry ACLs",
)
REGISTRY_NOT_FOUND: Final = _classification(
    ErrorCategory.POISON,
    "SCHEMA_REGISTRY_NOT_FOUND",
    "The Schema Registry does not know this record's schema (4xx, e.g. 40403): the record "
    "was written with another registry or a deleted schema; dead-lettered",
)


def _status(exc: BaseException) -> int | None:
    if type(exc).__name__ != "SchemaRegistryError":
        return None
    status = getattr(exc, "http_status_code", None)
    return status if isinstance(status, int) else None


def _is_transport(exc: BaseException) -> bool:
    for cls in type(exc).__mro__:
        root = cls.__module__.partition(".")[0]
        if root in _HTTP_MODULES and cls.__name__ in _TRANSPORT_NAMES:
            return True
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < _MAX_DEPTH:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        inner = getattr(item, "exception", None)  # confluent's (De)SerializationError wrappers
        todo.extend(
            [
                item.__cause__,
                item.__context__,
                inner if isinstance(inner, BaseException) else None,
            ]
        )
    return seen


def registry_classification(exc: BaseException) -> Classification | None:
    """The classification of a Schema Registry client failure anywhere in ``exc``'s chain,
    or ``None`` when ``exc`` has nothing to do with the registry.

    ``errors.classify`` should delegate to this for ``SchemaRegistryError`` (see the module
    docstring for the table).
    """
    for item in _chain(exc):
        status = _status(item)
        if status is not None:
            if status >= 500 or status in (408, 429) or status < 0:
                return REGISTRY_UNAVAILABLE
            if status in (401, 403):
                return REGISTRY_AUTH
            return REGISTRY_NOT_FOUND
        if _is_transport(item):
            return REGISTRY_UNAVAILABLE
    return None


def is_outage(classification: Classification | None) -> bool:
    """Whether a registry classification means "hold and retry", not "dead-letter"."""
    return classification is not None and classification.category is not ErrorCategory.POISON
