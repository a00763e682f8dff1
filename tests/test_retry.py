"""tenacity predicates: driven by classify(), composable with tenacity's | and &."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import tenacity
from confluent_kafka import KafkaError, KafkaException

from kresilient.errors import Action, ErrorCategory, ProduceError
from kresilient.retry import (
    retry_if_action,
    retry_if_category,
    retry_if_classification,
    retry_if_kafka_code,
    retry_if_kafka_retriable,
    retry_if_possibly_persisted,
    retry_if_refresh_metadata,
    retry_unless_possibly_persisted,
)


def _failing(codes: list[int]) -> tuple[list[int], Callable[[], str]]:
    """A callable raising KafkaException for each code in turn, then returning 'ok'."""
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if codes:
            raise KafkaException(KafkaError(codes.pop(0)))
        return "ok"

    return calls, fn


def _run(retry: tenacity.retry_base, codes: list[int]) -> tuple[int, object]:
    calls, fn = _failing(codes)
    r = tenacity.Retrying(
        retry=retry, stop=tenacity.stop_after_attempt(5), wait=tenacity.wait_none(), reraise=True
    )
    try:
        result: object = r(fn)
    except KafkaException as exc:
        result = exc
    return len(calls), result


def test_leadership_errors_are_retried_until_success() -> None:
    attempts, result = _run(
        retry_if_kafka_retriable(),
        [KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE],
    )
    assert (attempts, result) == (3, "ok")


def test_permanent_errors_are_not_retried() -> None:
    attempts, result = _run(retry_if_kafka_retriable(), [KafkaError.MSG_SIZE_TOO_LARGE])
    assert attempts == 1
    assert isinstance(result, KafkaException)


def test_unknown_and_fatal_errors_are_not_retried() -> None:
    pred = retry_if_kafka_retriable()
    assert _run(pred, [31999])[0] == 1

    calls: list[int] = []

    def fatal() -> None:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "x", fatal=True))

    with pytest.raises(KafkaException):
        tenacity.Retrying(retry=pred, stop=tenacity.stop_after_attempt(5), reraise=True)(fatal)
    assert len(calls) == 1


def test_and_with_unless_possibly_persisted() -> None:
    pred = retry_if_kafka_retriable() & retry_unless_possibly_persisted()
    assert isinstance(pred, tenacity.retry_all)
    # NOT_ENOUGH_REPLICAS: not written, safe to retry.
    assert _run(pred, [KafkaError.NOT_ENOUGH_REPLICAS])[0] == 2
    # REQUEST_TIMED_OUT: may be written; without idempotence a retry could duplicate.
    assert _run(pred, [KafkaError.REQUEST_TIMED_OUT])[0] == 1


def test_or_with_tenacitys_own_predicates() -> None:
    pred = retry_if_category(ErrorCategory.POISON) | tenacity.retry_if_exception_type(
        ZeroDivisionError
    )
    assert isinstance(pred, tenacity.retry_any)
    assert _run(pred, [KafkaError._VALUE_SERIALIZATION])[0] == 2
    assert _run(pred, [KafkaError.NOT_LEADER_FOR_PARTITION])[0] == 1
    # and the other order, and a three-way chain
    chain = (
        tenacity.retry_if_exception_type(ZeroDivisionError)
        | retry_if_kafka_code(19)
        | (retry_if_refresh_metadata())
    )
    assert _run(chain, [19, KafkaError.NOT_LEADER_FOR_PARTITION])[0] == 3


def test_possibly_persisted_and_action_predicates() -> None:
    assert _run(retry_if_possibly_persisted(), [KafkaError._MSG_TIMED_OUT])[0] == 2
    assert _run(retry_if_possibly_persisted(), [KafkaError.NOT_ENOUGH_REPLICAS])[0] == 1
    assert _run(retry_if_action(Action.REFRESH_AND_RETRY), [KafkaError.FENCED_LEADER_EPOCH])[0] == 2
    assert _run(retry_if_action(Action.REFRESH_AND_RETRY), [KafkaError.REQUEST_TIMED_OUT])[0] == 1


def test_kresilient_exceptions_and_buffer_error_are_classified() -> None:
    pred = retry_if_kafka_retriable()
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ProduceError("x", code=KafkaError.NOT_LEADER_FOR_PARTITION)
        if len(calls) == 2:
            raise BufferError("Local: Queue full")
        return "ok"

    assert tenacity.Retrying(retry=pred, stop=tenacity.stop_after_attempt(5))(fn) == "ok"
    assert len(calls) == 3


def test_custom_classification_predicate() -> None:
    pred = retry_if_classification(lambda c: c.code == KafkaError.INVALID_MSG)
    assert _run(pred, [KafkaError.INVALID_MSG])[0] == 2


def test_a_returned_value_is_never_retried() -> None:
    assert _run(retry_if_kafka_retriable(), [])[0] == 1


def test_predicates_need_arguments_and_parentheses() -> None:
    for cls in (retry_if_category, retry_if_action, retry_if_kafka_code):
        with pytest.raises(ValueError):
            cls()
    # Forgetting "()" fails loudly (tenacity would call the class with a RetryCallState).
    with pytest.raises(TypeError):
        retry_if_kafka_retriable(object())  # type: ignore[call-arg]
