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
"""

from __future__ import annotations

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
    "registry_classification",
]


def is_outage(classification: Classification | None) -> bool:
    """Whether a registry classification means "hold and retry", not "dead-letter"."""
    return classification is not None and classification.category is not ErrorCategory.POISON
