"""tenacity retry predicates driven by :func:`kresilient.errors.classify`.

Each predicate is a :class:`tenacity.retry_base`, so it composes with tenacity's own ``|`` and
``&`` and with tenacity's stock predicates. kresilient does not re-implement backoff: bring your
own ``stop=`` and ``wait=``. Predicates are classes, instantiated like tenacity's
(``retry_if_kafka_retriable()``); a missing ``()`` fails loudly instead of retrying forever.

Example::

    from tenacity import Retrying, stop_after_delay, wait_exponential_jitter
    from kresilient.retry import retry_if_category, retry_if_kafka_retriable
    from kresilient.retry import retry_unless_possibly_persisted

    for attempt in Retrying(
        retry=retry_if_kafka_retriable() & retry_unless_possibly_persisted(),
        stop=stop_after_delay(30),
        wait=wait_exponential_jitter(max=5),
        reraise=True,
    ):
        with attempt:
            producer.produce(...).result()

Only exceptions are judged (a failed attempt); a returned value is never retried by these.
"""

from __future__ import annotations

from collections.abc import Callable

import tenacity

from kresilient.errors import Action, Classification, ErrorCategory, classify

__all__ = [
    "retry_if_action",
    "retry_if_category",
    "retry_if_classification",
    "retry_if_kafka_code",
    "retry_if_kafka_retriable",
    "retry_if_possibly_persisted",
    "retry_if_refresh_metadata",
    "retry_unless_possibly_persisted",
]


class retry_if_classification(tenacity.retry_if_exception):
    """Retry when ``predicate(classify(exception))`` is true."""

    def __init__(self, predicate: Callable[[Classification], bool]) -> None:
        self.classification_predicate = predicate
        super().__init__(self._check)

    def _check(self, exc: BaseException) -> bool:
        return self.classification_predicate(classify(exc))


class retry_if_kafka_retriable(retry_if_classification):
    """Retry errors kresilient classifies as retriable (leadership, transient, backpressure).

    Fatal errors never retry, whatever the table says. Pair with
    :class:`retry_unless_possibly_persisted` (``&``) when duplicates are not acceptable and the
    producer is not idempotent.
    """

    def __init__(self) -> None:
        super().__init__(lambda c: c.retriable and not c.fatal)


class retry_if_category(retry_if_classification):
    """Retry when the error's category is one of ``categories``."""

    def __init__(self, *categories: ErrorCategory) -> None:
        if not categories:
            raise ValueError("retry_if_category needs at least one ErrorCategory")
        wanted = frozenset(categories)
        self.categories = wanted
        super().__init__(lambda c: c.category in wanted)


class retry_if_action(retry_if_classification):
    """Retry when the recommended action is one of ``actions``."""

    def __init__(self, *actions: Action) -> None:
        if not actions:
            raise ValueError("retry_if_action needs at least one Action")
        wanted = frozenset(actions)
        self.actions = wanted
        super().__init__(lambda c: c.action in wanted)


class retry_if_kafka_code(retry_if_classification):
    """Retry when the error's Kafka code is one of ``codes`` (``KafkaError.<NAME>`` ints)."""

    def __init__(self, *codes: int) -> None:
        if not codes:
            raise ValueError("retry_if_kafka_code needs at least one code")
        wanted = frozenset(codes)
        self.codes = wanted
        super().__init__(lambda c: c.code in wanted)


class retry_if_refresh_metadata(retry_if_classification):
    """Retry errors that mean stale metadata (leader moved): the client refreshes first."""

    def __init__(self) -> None:
        super().__init__(lambda c: c.refresh_metadata and not c.fatal)


class retry_if_possibly_persisted(retry_if_classification):
    """True when the failed write may nevertheless have been stored (a retry may duplicate)."""

    def __init__(self) -> None:
        super().__init__(lambda c: c.possibly_persisted)


class retry_unless_possibly_persisted(retry_if_classification):
    """True when the failed write was certainly not stored: a retry cannot duplicate it.

    Compose with ``&``: ``retry_if_kafka_retriable() & retry_unless_possibly_persisted()``.
    """

    def __init__(self) -> None:
        super().__init__(lambda c: not c.possibly_persisted)
