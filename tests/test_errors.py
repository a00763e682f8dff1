"""Error classification (one table over every KafkaError code), the exception tree, translate()."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.error import (
    KeyDeserializationError,
    KeySerializationError,
    ValueDeserializationError,
    ValueSerializationError,
)
from confluent_kafka.serialization import SerializationError

from kresilient import errors
from kresilient._error_table import DELIVERY_ROWS, ROWS
from kresilient.errors import (
    Action,
    CircuitBreakerOpenError,
    Classification,
    CommitError,
    ConfigError,
    ConsumeError,
    DeadLetterError,
    DeliveryError,
    DeliveryFailure,
    ErrorCategory,
    FatalProducerError,
    KafkaClientError,
    KResilientError,
    MessageTooLargeError,
    ProduceError,
    UnsafeConfigError,
    classify,
    translate,
)

KAFKA_CODES: dict[str, int] = {
    name: value
    for name in dir(KafkaError)
    if not name.startswith("__") and isinstance(value := getattr(KafkaError, name), int)
}

LEADERSHIP_FAMILY = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.REPLICA_NOT_AVAILABLE,
    KafkaError.UNKNOWN_LEADER_EPOCH,
    KafkaError.BROKER_NOT_AVAILABLE,
    KafkaError.KAFKA_STORAGE_ERROR,
    KafkaError.OFFSET_NOT_AVAILABLE,
)

#: Codes whose category is UNKNOWN on purpose: no client action is defined for them.
DELIBERATELY_UNKNOWN = {
    "UNKNOWN",  # UnknownServerException: the broker itself does not say
    "_APPLICATION",  # application-defined
    # inter-broker / controller / voter codes a client is not expected to see
    "STALE_CTRL_EPOCH",
    "TRANSACTION_COORDINATOR_FENCED",
    "STALE_BROKER_EPOCH",
    "INCONSISTENT_VOTER_SET",
    "PRINCIPAL_DESERIALIZATION_FAILURE",
    "INVALID_REGISTRATION",
    "FENCED_STATE_EPOCH",
    "INVALID_VOTER_KEY",
    "DUPLICATE_VOTER",
    "VOTER_NOT_FOUND",
}


# --------------------------------------------------------------------------- the table


def test_the_binding_defines_many_codes() -> None:
    # Guard against the enumeration silently finding nothing.
    assert len(KAFKA_CODES) > 150
    assert KAFKA_CODES["NOT_LEADER_FOR_PARTITION"] == 6


@pytest.mark.parametrize("name", sorted(KAFKA_CODES))
def test_every_kafka_error_code_is_in_the_table(name: str) -> None:
    code = KAFKA_CODES[name]
    c = classify(code)
    assert c.code == code
    assert c.name == name, "the table's name must match KafkaError's"
    assert c.remedy and "\n" not in c.remedy
    if name not in DELIBERATELY_UNKNOWN:
        assert c.category is not ErrorCategory.UNKNOWN, f"{name} is unclassified"


def test_the_table_has_one_row_per_code_and_valid_enums() -> None:
    codes = [row.code for row in ROWS]
    assert len(codes) == len(set(codes))
    for row in (*ROWS, *DELIVERY_ROWS):
        ErrorCategory[row.category]
        if row.action is not None:
            Action[row.action]
    # Every code the binding knows is covered (the table may know newer ones).
    assert set(KAFKA_CODES.values()) <= set(codes)


def test_deliberately_unknown_rows_are_exactly_the_documented_ones() -> None:
    unknown = {row.name for row in ROWS if row.category == "UNKNOWN"}
    assert unknown == DELIBERATELY_UNKNOWN


def test_an_unknown_code_is_unknown_and_not_retried() -> None:
    c = classify(31999)
    assert c.category is ErrorCategory.UNKNOWN
    assert c.retriable is False
    assert c.action is Action.ALERT
    assert c.code == 31999
    c2 = classify(KafkaError(31999))
    assert c2.category is ErrorCategory.UNKNOWN and c2.retriable is False


@pytest.mark.parametrize("code", LEADERSHIP_FAMILY)
def test_leadership_family_is_retriable_with_metadata_refresh(code: int) -> None:
    c = classify(code)
    assert c.category is ErrorCategory.LEADERSHIP
    assert c.retriable and c.refresh_metadata
    assert c.action is Action.REFRESH_AND_RETRY
    assert not c.fatal and not c.possibly_persisted


def test_remedy_names_the_java_exceptions_users_search_for() -> None:
    r = classify(KafkaError.NOT_LEADER_FOR_PARTITION).remedy
    assert "NotLeaderOrFollowerException" in r and "NotLeaderForPartitionException" in r
    assert "LeaderNotAvailableException" in classify(KafkaError.LEADER_NOT_AVAILABLE).remedy
    assert "RecordTooLargeException" in classify(KafkaError.MSG_SIZE_TOO_LARGE).remedy
    for row in ROWS:
        if row.java:
            assert row.java in classify(row.code).remedy
    # Every broker (protocol) error except success names its Java exception.
    assert all(row.java for row in ROWS if row.code != 0 and row.code >= -1)


def test_message_too_large_names_both_size_settings() -> None:
    c = classify(KafkaError.MSG_SIZE_TOO_LARGE)
    assert c.category is ErrorCategory.CONFIG and not c.retriable
    assert "max.message.bytes" in c.remedy and "message.max.bytes" in c.remedy


@pytest.mark.parametrize(
    ("code", "category", "persisted"),
    [
        (KafkaError.NOT_ENOUGH_REPLICAS, ErrorCategory.TRANSIENT, False),
        (KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, ErrorCategory.TRANSIENT, True),
        (KafkaError.REQUEST_TIMED_OUT, ErrorCategory.TRANSIENT, True),
        (KafkaError._TRANSPORT, ErrorCategory.TRANSIENT, True),
        (KafkaError._MSG_TIMED_OUT, ErrorCategory.DELIVERY_TIMEOUT, True),
        (KafkaError._PURGE_QUEUE, ErrorCategory.DELIVERY_TIMEOUT, False),
        (KafkaError._QUEUE_FULL, ErrorCategory.BACKPRESSURE, False),
        (KafkaError.PRODUCER_FENCED, ErrorCategory.FATAL_PRODUCER, False),
        (KafkaError.TRANSACTION_ABORTABLE, ErrorCategory.ABORTABLE, False),
        (KafkaError.REBALANCE_IN_PROGRESS, ErrorCategory.GROUP, False),
        (KafkaError.OFFSET_OUT_OF_RANGE, ErrorCategory.OFFSET_RESET, False),
        (KafkaError._VALUE_DESERIALIZATION, ErrorCategory.POISON, False),
        (KafkaError.DUPLICATE_SEQUENCE_NUMBER, ErrorCategory.BENIGN, False),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, ErrorCategory.AUTH, False),
    ],
)
def test_representative_codes(code: int, category: ErrorCategory, persisted: bool) -> None:
    c = classify(code)
    assert c.category is category
    assert c.possibly_persisted is persisted


def test_retriable_flag_of_a_delivery_report_error_is_ignored() -> None:
    # confluent-kafka never sets retriable() on delivery reports; the code decides.
    err = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)
    assert err.retriable() is False
    assert classify(err).retriable is True


def test_fatal_flag_wins_over_the_table() -> None:
    err = KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, "x", fatal=True)
    c = classify(err)
    assert c.fatal and not c.retriable
    assert c.category is ErrorCategory.FATAL_PRODUCER
    assert c.action is Action.RECREATE_PRODUCER
    assert c.code == KafkaError.NOT_LEADER_FOR_PARTITION


def test_fatal_consumer_error_fails_instead_of_recreating_a_producer() -> None:
    c = classify(KafkaError(KafkaError.FENCED_INSTANCE_ID, "x", fatal=True))
    assert c.fatal and c.category is ErrorCategory.GROUP and c.action is Action.FAIL


def test_txn_requires_abort_wins_over_the_table() -> None:
    c = classify(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "x", txn_requires_abort=True))
    assert c.category is ErrorCategory.ABORTABLE
    assert c.action is Action.ABORT_TRANSACTION


def test_retriable_flag_from_an_error_object_is_honoured() -> None:
    # rd_kafka_error_t results (e.g. commit_transaction timing out) do carry retriable().
    c = classify(KafkaError(KafkaError._TIMED_OUT, "x", retriable=True))
    assert c.retriable
    c = classify(KafkaError(KafkaError._STATE, "x", retriable=True))
    assert c.retriable and c.action is Action.RETRY


def test_fatal_is_unwrapped_to_the_underlying_code() -> None:
    text = "Fatal error: Broker: Broker received an out of order sequence number: MsgId 3"
    c = classify(KafkaError(KafkaError._FATAL, text))
    assert c.code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert c.fatal and c.category is ErrorCategory.FATAL_PRODUCER
    c = classify(KafkaError(KafkaError._FATAL, "Fatal error: Broker: Not leader for partition: x"))
    assert c.code == KafkaError.NOT_LEADER_FOR_PARTITION and c.fatal
    c = classify(KafkaError(KafkaError._FATAL, "something else"))
    assert c.code == KafkaError._FATAL and c.fatal


def test_fatal_exception_from_the_binding_is_fatal() -> None:
    exc = KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "x", fatal=True))
    c = classify(exc)
    assert c.fatal and c.code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_buffer_error_is_backpressure() -> None:
    c = classify(BufferError("Local: Queue full"))
    assert c.category is ErrorCategory.BACKPRESSURE
    assert c.code == KafkaError._QUEUE_FULL and c.retriable


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueSerializationError(ValueError("bad")), KafkaError._VALUE_SERIALIZATION),
        (KeySerializationError(ValueError("bad")), KafkaError._KEY_SERIALIZATION),
        (ValueDeserializationError(ValueError("bad")), KafkaError._VALUE_DESERIALIZATION),
        (KeyDeserializationError(ValueError("bad")), KafkaError._KEY_DESERIALIZATION),
        (SerializationError("bad schema"), None),
    ],
)
def test_serialization_errors_are_poison(exc: BaseException, code: int | None) -> None:
    c = classify(exc)
    assert c.category is ErrorCategory.POISON
    assert c.action is Action.DEAD_LETTER and not c.retriable
    assert c.code == code


def test_kafka_exception_is_classified_by_its_error() -> None:
    assert classify(KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))) is classify(
        KafkaError.LEADER_NOT_AVAILABLE
    )
    assert classify(KafkaException("no error object")).category is ErrorCategory.UNKNOWN


def test_other_exceptions_are_unknown_and_not_retried() -> None:
    for exc in (ValueError("x"), RuntimeError(), KeyboardInterrupt()):
        c = classify(exc)
        assert c.category is ErrorCategory.UNKNOWN and not c.retriable and c.code is None


def test_delivery_context_reads_unknown_topic_as_a_missing_topic() -> None:
    err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    assert classify(err).category is ErrorCategory.LEADERSHIP
    c = classify(err, context="delivery")
    assert c.category is ErrorCategory.CONFIG and not c.retriable
    assert "create the topic" in c.remedy and "UnknownTopicOrPartitionException" in c.remedy
    # Codes without a delivery override are unchanged.
    assert classify(KafkaError.NOT_ENOUGH_REPLICAS, context="delivery") is classify(
        KafkaError.NOT_ENOUGH_REPLICAS
    )


def test_classify_is_a_precomputed_lookup() -> None:
    # Same object every time: nothing is built per call on the delivery-report path.
    assert classify(6) is classify(6)
    assert classify(KafkaError(6)) is classify(6)
    fatal = KafkaError(6, "x", fatal=True)
    assert classify(fatal) is classify(KafkaError(6, "y", fatal=True))


def test_classification_is_frozen_and_keyword_only() -> None:
    c = classify(6)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.retriable = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        Classification(6, "X", ErrorCategory.LEADERSHIP)  # type: ignore[call-arg]


def test_real_client_errors_are_classified() -> None:
    # Constructor errors of the real binding (no broker needed).
    with pytest.raises(KafkaException) as info:
        Producer({"no.such.property": 1})
    c = classify(info.value)
    assert c.category is ErrorCategory.CONFIG and c.code == KafkaError._INVALID_ARG
    # The client-side message.max.bytes check raises synchronously from produce().
    # log_level 0: the refused connection to port 1 is not printed over the test output
    p = Producer({"bootstrap.servers": "127.0.0.1:1", "message.max.bytes": 1000, "log_level": 0})
    with pytest.raises(KafkaException) as info:
        p.produce("t", b"x" * 5000)
    assert classify(info.value).code == KafkaError.MSG_SIZE_TOO_LARGE
    assert classify(info.value).category is ErrorCategory.CONFIG


# --------------------------------------------------------------------------- exceptions

TREE: dict[type[BaseException], type[BaseException]] = {
    ConfigError: KResilientError,
    UnsafeConfigError: ConfigError,
    KafkaClientError: KResilientError,
    ProduceError: KafkaClientError,
    MessageTooLargeError: ProduceError,
    FatalProducerError: KafkaClientError,
    CommitError: KafkaClientError,
    ConsumeError: KafkaClientError,
    DeliveryError: KResilientError,
    DeadLetterError: KResilientError,
    CircuitBreakerOpenError: KResilientError,
    errors.SchemaError: ConfigError,
    errors.BatchItemError: KResilientError,
    errors.ReplayMismatchError: KResilientError,
    errors.ClusterError: KResilientError,
    errors.ChaosNotSupportedError: errors.ClusterError,
    errors.SpoolError: ProduceError,
    errors.SpoolCorruptError: errors.SpoolError,
    errors.CrashLoopError: KResilientError,
}


@pytest.mark.parametrize(("cls", "parent"), list(TREE.items()))
def test_exception_tree(cls: type[BaseException], parent: type[BaseException]) -> None:
    assert cls.__bases__ == (parent,)
    assert cls.__name__ in (errors.__doc__ or ""), "the module docstring draws every class"


def test_every_exception_class_of_the_package_is_in_errors() -> None:
    """Issue 12: no exception class outside the tree's module (names exported by errors)."""
    import inspect

    drawn = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, KResilientError)
    }
    assert set(TREE) | {KResilientError} == {getattr(errors, n) for n in drawn}
    assert drawn <= set(errors.__all__)


def test_batch_item_error_keeps_its_behaviour() -> None:
    cause = ValueError("bad")
    e = errors.BatchItemError(index=2, cause=cause)
    assert str(e) == "batch item 2 failed" and e.index == 2 and e.failure() is cause
    try:
        raise errors.BatchItemError(index=0) from KeyError("k")
    except errors.BatchItemError as caught:
        assert isinstance(caught.failure(), KeyError)
    assert isinstance(errors.BatchItemError(index=1).failure(), errors.BatchItemError)


def test_one_base() -> None:
    assert KResilientError.__bases__ == (Exception,)


def test_kafka_client_error_carries_context() -> None:
    e = ProduceError(
        "Broker: Not leader for partition",
        code=KafkaError.NOT_LEADER_FOR_PARTITION,
        name="NOT_LEADER_FOR_PARTITION",
        topic="orders",
        partition=3,
        classification=classify(6),
    )
    assert (e.code, e.name, e.topic, e.partition) == (6, "NOT_LEADER_FOR_PARTITION", "orders", 3)
    assert e.classification.category is ErrorCategory.LEADERSHIP
    text = str(e)
    assert "NOT_LEADER_FOR_PARTITION" in text and "orders[3]" in text
    assert "NotLeaderOrFollowerException" in text
    # Classification derived from the code when not given.
    assert KafkaClientError("x", code=10).classification is classify(10)


def test_exceptions_survive_pickling() -> None:
    samples: list[KResilientError] = [
        ProduceError("m", code=6, topic="t", partition=0),
        MessageTooLargeError("big", size=10, limit=5, topic="t"),
        ConfigError("bad", key="acks"),
        UnsafeConfigError("unsafe", key="acks", value="0"),
        CircuitBreakerOpenError(dead_letters=5, window=60.0),
        DeadLetterError("dlq down", topic="t.dlq"),
        errors.BatchItemError(index=3, cause=ValueError("bad item")),
        errors.SchemaError("column 'value' has type int", key="value"),
        errors.ReplayMismatchError("batch 7 differs"),
        errors.ClusterError("broker 2 did not start"),
        errors.ChaosNotSupportedError("external cluster"),
    ]
    for e in samples:
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e)
        assert str(back) == str(e)
        assert back.classification == e.classification
        assert back.__dict__.keys() == e.__dict__.keys()


def test_secrets_never_appear_in_config_errors() -> None:
    e = ConfigError(
        'Invalid value "hunter2" for configuration property "sasl.password"', key="sasl.password"
    )
    assert "hunter2" not in str(e) and "hunter2" not in repr(e)
    u = UnsafeConfigError("refused", key="ssl.key.password", value="hunter2")
    assert "hunter2" not in str(u) and "hunter2" not in repr(u)
    u2 = UnsafeConfigError("refused", key="acks", value="0")
    assert "'0'" in repr(u2)


def test_message_too_large_error_has_sizes() -> None:
    e = MessageTooLargeError("too big", size=5000, limit=1000, topic="t")
    assert (e.size, e.limit, e.code) == (5000, 1000, KafkaError.MSG_SIZE_TOO_LARGE)
    assert e.classification.category is ErrorCategory.CONFIG


class _FakeMsg:
    def __init__(self) -> None:
        self._headers = [("auth", b"token-secret")]

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return -1

    def offset(self) -> int:
        return -1001

    def key(self) -> bytes:
        return b"customer-42"

    def value(self) -> bytes:
        return b"x" * 12

    def headers(self) -> Any:
        return self._headers


def test_delivery_failure_from_report_and_repr_hides_key_and_headers() -> None:
    err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    f = DeliveryFailure.from_report(err, _FakeMsg(), message_id=7)
    assert (f.topic, f.partition, f.offset, f.value_size, f.message_id) == (
        "orders",
        None,
        None,
        12,
        7,
    )
    assert f.classification.category is ErrorCategory.CONFIG  # delivery context
    assert "customer-42" not in repr(f) and "token-secret" not in repr(f)


def test_delivery_error_summarises_failures() -> None:
    timeout = classify(KafkaError._MSG_TIMED_OUT)
    failures = [
        DeliveryFailure(topic="t", partition=0, offset=None, classification=timeout)
        for _ in range(2)
    ]
    failures.append(
        DeliveryFailure(topic="t", partition=0, offset=None, classification=classify(10))
    )
    e = DeliveryError(failures=failures)
    assert len(e.failures) == 3
    assert "3 message(s)" in str(e) and "2 x _MSG_TIMED_OUT" in str(e)
    assert e.classification is timeout


def test_circuit_breaker_error() -> None:
    e = CircuitBreakerOpenError(dead_letters=12, window=60.0)
    assert (e.dead_letters, e.window) == (12, 60.0)
    assert "12 dead letters" in str(e)
    assert classify(e).action is Action.ALERT


def test_classify_a_kresilient_exception() -> None:
    assert classify(ProduceError("x", code=19)) is classify(19)
    assert classify(ConfigError("x")).category is ErrorCategory.CONFIG
    assert classify(KResilientError("x")).category is ErrorCategory.UNKNOWN


# --------------------------------------------------------------------------- translate


def test_translate_size_error() -> None:
    e = translate(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)), topic="t", partition=1)
    assert type(e) is MessageTooLargeError
    assert (e.topic, e.partition, e.code) == ("t", 1, KafkaError.MSG_SIZE_TOO_LARGE)


def test_translate_fatal_error() -> None:
    exc = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    e = translate(exc, operation="produce")
    assert type(e) is FatalProducerError and e.classification.fatal


@pytest.mark.parametrize(
    ("exc", "operation", "cls"),
    [
        (KafkaException(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS)), None, ProduceError),
        (KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT)), None, ProduceError),
        (KafkaException(KafkaError(KafkaError._PARTITION_EOF)), None, ConsumeError),
        (KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS)), "commit", CommitError),
        (KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), None, KafkaClientError),
        (KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), "consume", ConsumeError),
        (BufferError("Local: Queue full"), None, ProduceError),
        (ValueSerializationError(ValueError("x")), None, ProduceError),
        (ValueDeserializationError(ValueError("x")), None, ConsumeError),
        (ValueError("boom"), None, KResilientError),
    ],
)
def test_translate_picks_the_class(exc: BaseException, operation: Any, cls: type) -> None:
    e = translate(exc, operation=operation)
    assert type(e) is cls
    assert e.classification == classify(exc)


def test_translate_config_error_names_the_key() -> None:
    with pytest.raises(KafkaException) as info:
        Producer({"no.such.property": 1})
    e = translate(info.value, operation="configure")
    assert type(e) is ConfigError and e.key == "no.such.property"


def test_translate_keeps_kresilient_errors_and_raw_kafka_errors() -> None:
    original = ProduceError("x", code=6)
    assert translate(original) is original
    e = translate(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), topic="t", context="delivery")
    assert isinstance(e, KafkaClientError) and e.classification.category is ErrorCategory.CONFIG


# --------------------------------------------------------------------------- docs


def test_docs_table_is_generated_from_the_data_table() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "errors.md"
    text = doc.read_text()
    assert errors._render_markdown() in text, "regenerate docs/errors.md (see its header)"


# --------------------------------------------------------------------------- unproducible


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._VALUE_SERIALIZATION,
        KafkaError._KEY_SERIALIZATION,
    ],
)
def test_records_that_can_never_be_produced_are_unproducible(code: int) -> None:
    assert errors.is_unproducible(code)
    assert errors.is_unproducible(classify(code, context="delivery"))
    assert errors.is_unproducible(KafkaException(KafkaError(code)))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,  # may be written; the partition was unwritable, not the row
        KafkaError._PURGE_QUEUE,
        KafkaError._PURGE_INFLIGHT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,  # in delivery context: topic not (yet) created
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._QUEUE_FULL,
        KafkaError._BAD_MSG,  # in a delivery report: an unparsable RESPONSE, possibly written
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    ],
)
def test_retriable_or_possibly_written_failures_are_not_unproducible(code: int) -> None:
    """Issue 11 defect 1: a timed-out row was dead-lettered (action DEAD_LETTER) and the
    Spark task succeeded. Only the record's own fault makes a dead letter."""
    assert not errors.is_unproducible(code)
    c = classify(code, context="delivery")
    assert c.action is not Action.DEAD_LETTER, c


def test_dead_letter_action_means_unproducible_in_every_table() -> None:
    """Whoever reads Action.DEAD_LETTER gets the same answer as is_unproducible()."""
    for table in (errors._BY_CODE, *errors._BY_CONTEXT.values()):
        for c in table.values():
            assert (c.action is Action.DEAD_LETTER) == errors.is_unproducible(c), c.name
    for variant in (errors._fatal_variant, errors._retriable_variant, errors._abort_variant):
        assert not errors.is_unproducible(variant(classify(KafkaError.INVALID_RECORD)))


def test_too_large_codes_are_public_and_unproducible() -> None:
    assert {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
    } == errors.TOO_LARGE_CODES
    assert all(errors.is_unproducible(code) for code in errors.TOO_LARGE_CODES)
    exc = translate(KafkaError(KafkaError.RECORD_LIST_TOO_LARGE), operation="produce")
    assert isinstance(exc, MessageTooLargeError)


# --------------------------------------------------------------------------- failure_from_report


class _Report:
    """What a delivery report's Message exposes (pure logic: a fake is enough)."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw

    def topic(self) -> str:
        return str(self.kw.get("topic", "orders"))

    def partition(self) -> int:
        return int(self.kw.get("partition", -1))

    def offset(self) -> int:
        return int(self.kw.get("offset", -1001))

    def key(self) -> bytes | None:
        return self.kw.get("key", b"k")  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self.kw.get("value", b"12345")  # type: ignore[no-any-return]

    def headers(self) -> Any:
        return self.kw.get("headers")


def test_failure_from_report_reads_the_message() -> None:
    err = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    f = errors.failure_from_report(err, _Report(partition=2, offset=7), message_id=9)
    assert (f.topic, f.partition, f.offset, f.key, f.value_size) == ("orders", 2, 7, b"k", 5)
    assert f.message_id == 9 and f.error is err
    # delivery context: a missing topic is CONFIG, not a leader move
    assert f.classification.category is ErrorCategory.CONFIG
    assert DeliveryFailure.from_report(err, _Report(partition=2, offset=7), message_id=9) == f


def test_failure_from_report_unknown_partition_and_offset_become_none() -> None:
    f = errors.failure_from_report(KafkaError(KafkaError._MSG_TIMED_OUT), _Report())
    assert f.partition is None and f.offset is None


def test_failure_from_report_keywords_replace_the_message() -> None:
    """Reports drop headers: the producer passes the ones it kept; Spark passes fields."""
    kept = [("traceparent", b"00-abc")]
    f = errors.failure_from_report(KafkaError(KafkaError._MSG_TIMED_OUT), _Report(), headers=kept)
    assert f.headers == kept
    g = errors.failure_from_report(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
        None,
        topic="t",
        partition=-1,
        key="clé",
        value="é",
        headers=None,
        message_id=3,
    )
    assert (g.topic, g.partition, g.offset, g.key, g.value_size) == (
        "t",
        None,
        None,
        "clé".encode(),
        2,
    )
    custom = classify(KafkaError.INVALID_RECORD)
    assert (
        errors.failure_from_report(KafkaError(1), None, classification=custom).classification
        is custom
    )


def test_exception_type_name_has_one_home() -> None:
    import json

    from kresilient import deadletter

    assert errors.exception_type_name(ValueError()) == "ValueError"
    assert errors.exception_type_name(json.JSONDecodeError) == "json.decoder.JSONDecodeError"
    assert deadletter.exception_type_name is errors.exception_type_name


# --------------------------------------------------------------------------- DeliveryError text


def test_delivery_error_names_the_topic_and_quotes_the_remedy_once() -> None:
    """Issue 22.4: the summary said '100 x UNKNOWN_TOPIC_OR_PART (CONFIG)', no topic, no fix."""
    missing = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    failures = [errors.failure_from_report(missing, None, topic="orders") for _ in range(100)]
    text = str(DeliveryError(failures=failures))
    assert text.startswith(
        "100 message(s) failed delivery: orders: 100 x UNKNOWN_TOPIC_OR_PART (CONFIG) \u2014 "
    )
    remedy = classify(missing, context="delivery").remedy
    assert "create the topic" in remedy
    assert text.count(remedy) == 1


def test_delivery_error_groups_by_topic_and_error() -> None:
    def fail(code: int, topic: str) -> DeliveryFailure:
        return errors.failure_from_report(KafkaError(code), None, topic=topic)

    failures = (
        [fail(KafkaError.UNKNOWN_TOPIC_OR_PART, "orders")] * 3
        + [fail(KafkaError._MSG_TIMED_OUT, "orders")] * 5
        + [fail(KafkaError.UNKNOWN_TOPIC_OR_PART, "payments")] * 2
    )
    text = str(DeliveryError(failures=failures))
    assert text.startswith("10 message(s) failed delivery: ")
    groups = text.split(": ", 1)[1].split(" | ")
    assert [g.split(" \u2014 ")[0] for g in groups] == [
        "orders: 5 x _MSG_TIMED_OUT (DELIVERY_TIMEOUT)",
        "orders: 3 x UNKNOWN_TOPIC_OR_PART (CONFIG)",
        "payments: 2 x UNKNOWN_TOPIC_OR_PART (CONFIG)",
    ]
    assert groups[2].endswith("same remedy as above")
    assert text.count(classify(KafkaError._MSG_TIMED_OUT).remedy) == 1


def test_delivery_error_summary_is_bounded() -> None:
    failures = [
        errors.failure_from_report(KafkaError(KafkaError._MSG_TIMED_OUT), None, topic=f"t{i:02d}")
        for i in range(25)
    ]
    text = str(DeliveryError(failures=failures))
    assert "t09: 1 x" in text and "t10: 1 x" not in text
    assert text.endswith("and 15 more in 15 other group(s)")
    assert str(DeliveryError("explicit", failures=failures)) == "explicit"


def test_use_after_close_says_the_client_is_closed_not_transactions() -> None:
    """Issue 22.8: produce after close carried _STATE's remedy about transactional calls."""
    closed = KafkaException(KafkaError(KafkaError._STATE, "producer is closed"))
    c = classify(closed)
    assert "closed" in c.remedy and "transaction" not in c.remedy
    assert c.code == KafkaError._STATE and not c.retriable
    error = translate(closed, topic="orders", operation="produce")
    assert isinstance(error, ProduceError) and "client is closed" in str(error)
    # the table's _STATE remedy still applies to the other wrong-state calls
    other = classify(KafkaError(KafkaError._STATE, "Operation not valid in state Ready"))
    assert other is classify(KafkaError._STATE) and "transactional" in other.remedy


# --------------------------------------------------------------------------- crash loops


def test_crash_loop_is_a_category_of_its_own_with_the_header_value_crash_loop() -> None:
    """Issue 17 item 2: one definition of the crash-loop category and exception, in errors."""
    from kresilient.consumer import _crashloop

    assert ErrorCategory.CRASH_LOOP.value == "crash_loop"
    exc = errors.CrashLoopError(topic="orders", partition=2, offset=41, deaths=3, max_deaths=3)
    c = classify(exc)
    assert c is exc.classification
    assert (c.category, c.name, c.action) == (
        ErrorCategory.CRASH_LOOP,
        "CRASH_LOOP",
        Action.DEAD_LETTER,
    )
    assert not c.retriable and not c.fatal and not c.possibly_persisted
    assert errors.is_unproducible(c)
    assert "kresilient dlq replay" in c.remedy and "os._exit" in c.remedy
    assert str(exc) == (
        "the process died 3 times while handling orders[2]@41 (max_process_deaths=3): "
        "dead-lettered without calling the handler again"
    )
    assert (exc.topic, exc.partition, exc.offset, exc.deaths, exc.max_deaths) == (
        "orders",
        2,
        41,
        3,
        3,
    )
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), back.deaths, back.classification) == (errors.CrashLoopError, 3, c)
    # the consumer's crash guard uses this very classification and exception, no stand-in
    assert _crashloop.CRASH_LOOP is c
    assert _crashloop.is_crash_loop(exc)
    assert not _crashloop.is_crash_loop(KResilientError("x", classification=c))
    assert not hasattr(_crashloop, "_Category")


def test_every_category_has_a_default_action() -> None:
    for category in ErrorCategory:
        assert errors._CATEGORY_DEFAULTS[category].action in Action, category


def test_destroy_in_a_delivery_report_is_a_vanished_partition_not_a_closed_client() -> None:
    # A report is only served by a live client: librdkafka fails the messages of a partition
    # it dropped (topic deleted) with _DESTROY. Outside a report it stays "client closed".
    report = classify(KafkaError(KafkaError._DESTROY), context="delivery")
    assert report.category is ErrorCategory.CONFIG
    assert report.possibly_persisted and not report.retriable
    assert "deleted" in report.remedy
    plain = classify(KafkaError(KafkaError._DESTROY))
    assert plain.category is ErrorCategory.TRANSIENT and "close" in plain.remedy
