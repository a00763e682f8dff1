"""Schema Registry client errors: an outage is not a poison record (issue 17, item 3).

confluent-kafka's ``SchemaRegistryError`` is a plain ``Exception`` carrying
``http_status_code``; its HTTP client raises ``httpx`` transport errors for refused
connections and timeouts. Wrapped by a deserializer into ``ValueDeserializationError`` they
looked like undecodable records and went to the dead-letter topic until the breaker tripped.

The table is :func:`kresilient.errors.registry_classification` (one definition, also used by
:func:`~kresilient.errors.classify`):

* 5xx, 429, 408, a malformed (non-JSON) error response, a connection failure or a timeout
  -> TRANSIENT (``BACKOFF_AND_RETRY``): the consumer holds the partition (paused, polling on)
  and retries under its ``outage_retry`` policy (default: until the registry answers);
* 401/403 -> AUTH: also held (a credential problem must not dead-letter good records);
* any other 4xx (40401 subject not found, 40403 schema not found, 422 invalid) -> POISON:
  dead-lettered at once, as are decode errors (bad magic byte, payload not matching).

Nothing here imports the Schema Registry client (it needs the ``schemaregistry`` extra): the
errors are recognised by their type names and attributes.

Whose failure it is (issue 35, defect 1): a ``SchemaRegistryError`` is the registry's wherever
it is raised, but an HTTP client's connection failure or timeout (``requests``, ``httpx`` ...)
is the registry's only when it was raised by the deserialization step of the consumer or
passed through the registry client's code (:func:`outage_classification`). The same error
from the application's own HTTP dependency, raised in the handler, is an ordinary failure:
the user's ``RetryPolicy``/``retry_topics`` and the dead-letter topic apply to it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Final

from kresilient.consumer._support import Deserializing
from kresilient.errors import (
    REGISTRY_AUTH,
    REGISTRY_NOT_FOUND,
    REGISTRY_UNAVAILABLE,
    Classification,
    ErrorCategory,
    registry_classification,
)

__all__ = [
    "REGISTRY_AUTH",
    "REGISTRY_NOT_FOUND",
    "REGISTRY_UNAVAILABLE",
    "is_outage",
    "outage_classification",
    "registry_classification",
]

#: Frames of these modules on an exception's way up make it the registry client's.
_REGISTRY_CLIENT: Final = "confluent_kafka.schema_registry"
#: The consumer's deserialization step (where the registry is the one HTTP peer).
_DESERIALIZE: Final = Deserializing.deserialize.__code__
_CHAIN_DEPTH: Final = 8


def is_outage(classification: Classification | None) -> bool:
    """Whether a registry classification means "hold and retry", not "dead-letter"."""
    return classification is not None and classification.category is not ErrorCategory.POISON


def outage_classification(exc: BaseException) -> Classification | None:
    """The registry classification of a failure of the consumer's per-message path, or
    ``None`` when it is not the registry's.

    A ``SchemaRegistryError`` anywhere in ``exc``'s chain is classified by its status; an HTTP
    client's connection failure or timeout only when it was raised inside the consumer's
    deserialization step or passed through the Schema Registry client
    (``confluent_kafka.schema_registry``, a handler calling the client itself). A transport
    error of the handler's own HTTP calls is not an outage.
    """
    return registry_classification(exc, transport=_raised_by_registry(exc))


def _raised_by_registry(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it wraps) came up through the deserialization step or
    the registry client: judged by the frames its traceback crossed (failure path only)."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(seen) < _CHAIN_DEPTH:
        item = todo.pop(0)
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        if _crossed_registry(item.__traceback__):
            return True
        inner = getattr(item, "exception", None)  # confluent's (de)serialization wrappers
        todo += [
            item.__cause__,
            item.__context__,
            inner if isinstance(inner, BaseException) else None,
        ]
    return False


def _crossed_registry(tb: TracebackType | None) -> bool:
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is _DESERIALIZE:
            return True
        module = frame.f_globals.get("__name__")
        if isinstance(module, str) and module.startswith(_REGISTRY_CLIENT):
            return True
        tb = tb.tb_next
    return False
