"""Every transaction error librdkafka returns, and the action TransactionalProducer takes.

A real cluster cannot be made to return most of these codes on demand, so a fake
``confluent_kafka.Producer`` raises each one (with the flags librdkafka sets on it) from the
call of ``kresilient._txn.TRANSACTION_ERRORS`` that returns it; each test checks what the
producer did: the call made again, the transaction aborted, the instance replaced, or the
producer stopped. The real-cluster behaviour is in tests/test_transactions.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
import structlog.testing
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from kresilient import Action, FatalProducerError, KResilientError, ProduceError
from kresilient._txn import (
    FENCED_CODES,
    TRANSACTION_CALLS,
    TRANSACTION_ERRORS,
    TransactionErrorKind,
    TransactionErrorRow,
    classify_transaction_error,
)
from kresilient.producer import (
    ProducerFencedError,
    TransactionAbortedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)
from kresilient.producer import _transactional as txn_module

_R, _A, _F = (
    TransactionErrorKind.RETRIABLE,
    TransactionErrorKind.ABORTABLE,
    TransactionErrorKind.FATAL,
)


class FakeProducer:
    """Records every call; raises the scripted error once from the scripted call."""

    instances: list[FakeProducer] = []  # reset by the fixture
    script: dict[str, list[KafkaError]] = {}

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.calls: list[str] = []
        FakeProducer.instances.append(self)

    def _step(self, name: str) -> None:
        self.calls.append(name)
        pending = FakeProducer.script.get(name)
        if pending:
            raise KafkaException(pending.pop(0))

    def init_transactions(self, timeout: float) -> None:
        self._step("init_transactions")

    def begin_transaction(self) -> None:
        self._step("begin_transaction")

    def produce(self, topic: str, value: Any = None, **kwargs: Any) -> None:
        self._step("produce")

    def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
        self._step("send_offsets_to_transaction")

    def commit_transaction(self, timeout: float) -> None:
        self._step("commit_transaction")

    def abort_transaction(self, timeout: float) -> None:
        self._step("abort_transaction")

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0

    def purge(self, **kwargs: Any) -> None:
        self.calls.append("purge")

    def __len__(self) -> int:
        return 0


class FakeConsumer:
    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("in", 0)]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]

    def consumer_group_metadata(self) -> object:
        return object()


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    FakeProducer.instances = []
    FakeProducer.script = {}
    monkeypatch.setattr(txn_module, "Producer", FakeProducer)
    monkeypatch.setattr(txn_module.time, "sleep", lambda s: None)  # the retry backoff
    yield


def _error(row: TransactionErrorRow) -> KafkaError:
    return KafkaError(
        getattr(KafkaError, row.name),
        f"{row.name} (scripted)",
        fatal=row.fatal,
        retriable=row.retriable,
        txn_requires_abort=row.abort,
    )


def _producer() -> TransactionalProducer:
    return TransactionalProducer(
        {"bootstrap.servers": "127.0.0.1:1"}, transactional_id="t-fake", timeout=5
    )


def _fenced(row: TransactionErrorRow) -> bool:
    """Fenced, or possibly: a bare _FATAL (no cause named) cannot exclude fencing."""
    code = getattr(KafkaError, row.name)
    return code == KafkaError._FATAL or (
        code in FENCED_CODES and (row.fatal or row.name != "INVALID_PRODUCER_EPOCH")
    )


def _run_one_transaction(producer: TransactionalProducer, *, fail_block: bool) -> None:
    with producer.transaction():
        producer.produce("out", b"v", b"k")
        producer.send_offsets(FakeConsumer())
        if fail_block:
            raise ValueError("the block failed")


_FLAGS = [(True, False, False), (False, True, False), (False, False, True), (False, False, False)]

ROWS = [pytest.param(r, id=f"{r.call}-{r.name}") for r in TRANSACTION_ERRORS]


def test_every_row_is_classified_as_the_table_says_fake() -> None:
    for row in TRANSACTION_ERRORS:
        verdict = classify_transaction_error(_error(row), row.call)
        assert (verdict.kind, verdict.recreate) == (row.kind, row.recreate), row
        assert verdict.fenced == _fenced(row), row
        assert verdict.reason and verdict.classification.name, row
        c = verdict.classification  # what exceptions and logs show says the same
        if verdict.fenced:
            assert c.action is Action.FAIL and "do not recreate" in c.remedy, row
        elif verdict.recreate:
            assert c.action is Action.RECREATE_PRODUCER and c.fatal, row
        elif row.kind is _A:
            assert c.action is Action.ABORT_TRANSACTION and not c.retriable, row
        elif row.kind is _R:
            assert c.retriable, row
        else:
            assert not c.retriable, row


def test_every_code_and_call_gets_a_coherent_verdict_fake() -> None:
    """Totality: any code librdkafka may return, with any flags, on any call."""
    codes = sorted(
        {getattr(KafkaError, n) for n in dir(KafkaError) if isinstance(getattr(KafkaError, n), int)}
    )
    for code in codes:
        for call in TRANSACTION_CALLS:
            for fatal, retriable, abort in _FLAGS:
                v = classify_transaction_error(
                    KafkaError(
                        code, "x", fatal=fatal, retriable=retriable, txn_requires_abort=abort
                    ),
                    call,
                )
                assert isinstance(v.kind, TransactionErrorKind)
                if v.fenced:  # a zombie is never recreated
                    assert v.kind is _F and not v.recreate, (code, call)
                if v.recreate or v.outcome_unknown:
                    assert v.kind is _F, (code, call)
                if fatal and not v.fenced:
                    assert v.kind is _F, (code, call)
                if call == "abort_transaction":
                    assert v.kind is not _A, (code, call)  # an abort is never "abort again"
                if (
                    not fatal
                    and call in ("commit_transaction", "abort_transaction")
                    and code
                    in (
                        KafkaError._TIMED_OUT,
                        KafkaError.REQUEST_TIMED_OUT,
                    )
                ):
                    assert v.outcome_unknown and v.recreate, (code, call)


@pytest.mark.parametrize("row", ROWS)
def test_the_action_taken_for_each_transaction_error_fake(row: TransactionErrorRow) -> None:
    err = _error(row)
    if row.call == "init_transactions":
        FakeProducer.script = {"init_transactions": [err]}
        if row.kind is _R:
            producer = _producer()
            assert FakeProducer.instances[0].calls == ["init_transactions"] * 2
            _run_one_transaction(producer, fail_block=False)
            assert producer.committed == 1
            return
        expected = ProducerFencedError if _fenced(row) else FatalProducerError
        with pytest.raises(expected) as caught:
            _producer()
        assert row.name in str(caught.value) or caught.value.code == getattr(KafkaError, row.name)
        # recreate: a second instance was built and initialised; otherwise none
        assert len(FakeProducer.instances) == (2 if row.recreate else 1), row
        return

    producer = _producer()
    first = FakeProducer.instances[0]
    FakeProducer.script = {row.call: [err]}
    fail_block = row.call == "abort_transaction"  # an abort happens when the block raises

    raised: BaseException | None = None
    try:
        _run_one_transaction(producer, fail_block=fail_block)
    except BaseException as exc:  # each outcome is checked below
        raised = exc

    if row.kind is _R:
        assert first.calls.count(row.call) == 2, first.calls  # the same call, again
        if fail_block:
            assert isinstance(raised, ValueError) and producer.aborted == 1
            if _unanswered(row):
                # the abort's first EndTxn went unanswered: the next transaction gets a new
                # epoch, which fences that request should it land late (KIP-890)
                _assert_new_epoch(producer, first)
            else:  # answered (a retriable refusal): the same instance goes on
                assert producer.recreations == 0
                _run_one_transaction(producer, fail_block=False)
                assert producer.committed == 1
        else:
            assert raised is None and producer.committed == 1
            assert producer.recreations == 0  # committed: nothing of it can land later
    elif row.kind is _A:
        assert isinstance(raised, TransactionAbortedError | ProduceError), raised
        assert "abort_transaction" in first.calls, first.calls  # aborted, not committed
        assert first.calls.index("abort_transaction") == len(first.calls) - 1 or (
            first.calls[-1] == "purge"
        ), first.calls
        if row.call != "commit_transaction":  # aborted before any commit was tried
            assert "commit_transaction" not in first.calls
        assert producer.aborted == 1 and producer.committed == 0
        if row.call in txn_module._EPOCH_CALLS and _unanswered(row):
            # a send_offsets or commit whose request went unanswered may still land (its
            # TxnOffsetCommit or EndTxn): the aborted transaction's epoch is never used again
            _assert_new_epoch(producer, first)
        else:
            # answered (a rebalance's ILLEGAL_GENERATION ...), or a produce() refused
            # locally: nothing can land later, the same instance goes on
            assert producer.recreations == 0
            _run_one_transaction(producer, fail_block=False)  # the producer stays usable
            assert producer.committed == 1
    elif _fenced(row):
        if fail_block:
            assert isinstance(raised, ValueError)
            assert any("fenced" in n for n in raised.__notes__)
        else:
            assert isinstance(raised, ProducerFencedError), raised
            assert "fenced" in str(raised)
        assert producer.fenced and producer.recreations == 0
        assert len(FakeProducer.instances) == 1  # never recreated: the new owner keeps the id
        with pytest.raises(ProducerFencedError) as again:
            _run_one_transaction(producer, fail_block=False)
        assert again.value.classification is not None
        assert again.value.classification.action is Action.FAIL  # not RECREATE_PRODUCER
    elif row.recreate:
        if fail_block:
            assert isinstance(raised, ValueError)
            assert any("abort failed" in n for n in raised.__notes__)
        elif row.call == "commit_transaction" and row.retriable:
            assert isinstance(raised, TransactionOutcomeUnknownError), raised
        else:
            assert isinstance(raised, FatalProducerError), raised
        assert producer.recreations == 1
        second = FakeProducer.instances[1]
        assert second.calls[0] == "init_transactions"  # the new epoch fences the old one
        assert "purge" in first.calls
        calls_before = len(first.calls)
        _run_one_transaction(producer, fail_block=False)  # on the new instance only
        assert len(first.calls) == calls_before and "commit_transaction" in second.calls
    else:  # fatal, nothing a new instance would fix: stopped
        assert isinstance(raised, FatalProducerError | ValueError), raised
        assert producer.recreations == 0
        assert producer.closed_by is not None and not producer.fenced
        # the fatal error again, never a plain "closed" a caller might retry for ever
        with pytest.raises(FatalProducerError, match="closed by a fatal error"):
            _run_one_transaction(producer, fail_block=False)


def _unanswered(row: TransactionErrorRow) -> bool:
    return getattr(KafkaError, row.name) in txn_module._UNANSWERED_CODES


def _assert_new_epoch(producer: TransactionalProducer, first: FakeProducer) -> None:
    """The aborted transaction's instance was replaced (purged, never used again) and the
    next transaction runs on a new one, initialised first: a new epoch."""
    assert producer.recreations == 1, first.calls
    assert first.calls[-1] == "purge", first.calls
    second = FakeProducer.instances[-1]
    assert second is not first and second.calls[0] == "init_transactions", second.calls
    calls_before = len(first.calls)
    _run_one_transaction(producer, fail_block=False)
    assert len(first.calls) == calls_before and "commit_transaction" in second.calls
    assert producer.committed == 1


def test_an_abort_after_a_timed_out_send_offsets_uses_a_new_epoch_fake() -> None:
    """The defect tests/test_eos_chaos.py found: send_offsets_to_transaction timed out
    (AddOffsetsToTxn unanswered under lost responses), the transaction was aborted and the
    next one ran on the same epoch, so the late TxnOffsetCommit could join it and commit
    offsets past records it did not hold. After such an abort the instance is replaced.
    The negative control: an abort because the block raised, with every request answered,
    keeps the instance (no init_transactions round trip for a handler's retry)."""
    timed_out = KafkaError(
        KafkaError._TIMED_OUT, "Failed to add offsets to transaction: Timed out", retriable=True
    )
    producer = _producer()
    first = FakeProducer.instances[0]
    FakeProducer.script = {"send_offsets_to_transaction": [timed_out] * 10_000}
    clock = iter(range(0, 10_000))
    real = txn_module.time.monotonic
    try:
        txn_module.time.monotonic = lambda: float(next(clock))  # type: ignore[assignment]
        with pytest.raises(KResilientError, match="still failing"), producer.transaction():
            producer.produce("out", b"v")
            producer.send_offsets(FakeConsumer())
    finally:
        txn_module.time.monotonic = real  # type: ignore[assignment]
        FakeProducer.script = {}
    assert producer.aborted == 1 and "abort_transaction" in first.calls
    _assert_new_epoch(producer, first)

    # the control: the block raised, nothing unanswered: the same instance goes on
    second = FakeProducer.instances[-1]
    with pytest.raises(ValueError), producer.transaction():
        producer.produce("out", b"v")
        raise ValueError("the handler failed")
    assert producer.aborted == 2 and producer.recreations == 1
    assert FakeProducer.instances[-1] is second
    _run_one_transaction(producer, fail_block=False)
    assert producer.committed == 2 and second.calls.count("commit_transaction") == 2


@pytest.mark.parametrize(
    "line",
    [
        "Timed out ProduceRequest in flight (after 6006ms, timeout #0)",
        "127.0.0.1:31372/2: Disconnected (after 4512ms in state UP)",
    ],
    ids=["request-timed-out", "disconnected"],
)
def test_an_abort_after_a_request_sent_and_not_answered_uses_a_new_epoch_fake(line: str) -> None:
    """librdkafka puts the records of a produce request that timed out in flight (or whose
    connection was lost) back in the partition's queue as "possibly persisted"; the abort
    purges them and advances the epoch's base msgid past them, so the next transaction's
    first batch to that partition reuses their sequence numbers on the same epoch. If the
    broker wrote the aborted batch, it answers that batch DUPLICATE_SEQUENCE_NUMBER, which
    librdkafka takes for success: the next transaction commits without it (what
    tests/test_eos_chaos.py saw: one output, one dead letter missing). librdkafka says so
    only in its log (the lines below, from rdkafka_broker.c); after such a line in a
    transaction, its abort replaces the instance (a new epoch, fresh sequences). The
    negative control: the same abort after an unrelated line keeps the instance."""
    producer = _producer()
    first = FakeProducer.instances[0]
    with pytest.raises(ValueError), producer.transaction():
        producer.produce("out", b"v")
        producer._bridge.log(5, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", line)
        raise ValueError("the handler failed")
    assert producer.aborted == 1
    _assert_new_epoch(producer, first)

    second = FakeProducer.instances[-1]
    with pytest.raises(ValueError), producer.transaction():
        producer.produce("out", b"v")
        producer._bridge.log(6, "%s [%s] %s", "INIT", "rdkafka#producer-2", "nothing lost")
        raise ValueError("the handler failed")
    assert producer.aborted == 2 and producer.recreations == 1
    assert FakeProducer.instances[-1] is second  # the same instance goes on


def test_a_commit_retried_until_its_timeout_has_an_unknown_outcome_fake() -> None:
    producer = _producer()
    busy = KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, "busy", retriable=True)
    FakeProducer.script = {"commit_transaction": [busy] * 10_000}
    clock = iter(range(0, 10_000))
    real = txn_module.time.monotonic
    try:
        txn_module.time.monotonic = lambda: float(next(clock))  # type: ignore[assignment]
        with pytest.raises(TransactionOutcomeUnknownError, match="unknown"):
            _run_one_transaction(producer, fail_block=False)
    finally:
        txn_module.time.monotonic = real  # type: ignore[assignment]
    assert producer.recreations == 1 and producer.committed == 0


def test_no_fatal_error_recreates_the_instance_except_an_unknown_outcome_fake() -> None:
    """The rule: a transactional producer recreates itself only where this process is known
    to own the transactional.id (a commit or abort whose outcome is unknown)."""
    for row in TRANSACTION_ERRORS:
        unknown = row.call in ("commit_transaction", "abort_transaction") and row.name in (
            "_TIMED_OUT",
            "_PREV_IN_PROGRESS",
        )
        assert row.recreate == unknown, row
    for code in (KafkaError._FATAL, KafkaError._STATE, KafkaError.INVALID_TXN_STATE):
        for call in TRANSACTION_CALLS:
            for fatal in (True, False):
                v = classify_transaction_error(KafkaError(code, "x", fatal=fatal), call)
                assert not v.recreate, (code, call, fatal)


class ErrorCbProducer(FakeProducer):
    """Serves a fatal error through error_cb at the next poll(), as librdkafka does: the
    call itself raised only a bare _FATAL."""

    cause: KafkaError | None = None

    def poll(self, timeout: float = 0) -> int:
        cause, ErrorCbProducer.cause = ErrorCbProducer.cause, None
        if cause is not None:
            self.config["error_cb"](cause)
        return 0


@pytest.mark.parametrize(
    ("cause", "expected"),
    [
        (KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True), "_FENCED"),
        (None, "_FATAL"),
        (
            KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "idempotence gap", fatal=True),
            "OUT_OF_ORDER_SEQUENCE_NUMBER",
        ),
    ],
    ids=["cause-fenced", "cause-unknown", "cause-not-fencing"],
)
def test_a_bare_fatal_never_recreates_and_names_its_cause_from_error_cb_fake(
    monkeypatch: pytest.MonkeyPatch, cause: KafkaError | None, expected: str
) -> None:
    """librdkafka raises a bare _FATAL ("Local: Fatal error") from produce() after a fatal
    error; its cause reaches error_cb later. A real cluster does this for fencing
    (tests/test_transactions.py::test_a_zombie_fenced_before_its_produce_does_not_fence_the_owner);
    a fatal error of another cause cannot be produced there."""
    monkeypatch.setattr(txn_module, "Producer", ErrorCbProducer)
    producer = _producer()
    ErrorCbProducer.cause = cause
    FakeProducer.script = {
        "produce": [KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")]
    }
    with pytest.raises(FatalProducerError) as caught:
        _run_one_transaction(producer, fail_block=False)
    assert caught.value.name == expected, str(caught.value)
    if expected == "OUT_OF_ORDER_SEQUENCE_NUMBER":  # not fencing: closed, not recreated
        assert not isinstance(caught.value, ProducerFencedError)
        assert not producer.fenced
    else:  # fenced, or fencing cannot be excluded
        assert isinstance(caught.value, ProducerFencedError) and producer.fenced
        assert "fenced" in str(caught.value)
    assert "do not recreate" in str(caught.value) or "only if this process" in str(caught.value)
    assert producer.recreations == 0 and len(FakeProducer.instances) == 1
    with pytest.raises(KResilientError):
        _run_one_transaction(producer, fail_block=False)


class FrozenProducer(FakeProducer):
    """A broker that never answers: abort_transaction times out, flush never returns."""

    release = None  # threading.Event set by the test at its end

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append(f"abort_transaction({timeout:g})")
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "abort timed out", retriable=True))

    def flush(self, timeout: float = 0) -> int:
        assert FrozenProducer.release is not None
        FrozenProducer.release.wait()
        return 1

    def purge(self, **kwargs: Any) -> None:
        self.flush()


def test_close_is_bounded_by_its_timeout_and_builds_no_instance_fake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close(timeout) with the coordinator frozen: the abort gets close's bound, not the
    constructor's, no replacement is built and initialised, and the release of the frozen
    instance is left to a daemon thread (the real-cluster frozen-broker run is in the notes:
    SIGSTOP of the only broker would stall the shared cluster)."""
    release = threading.Event()
    FrozenProducer.release = release
    monkeypatch.setattr(txn_module, "Producer", FrozenProducer)
    producer = TransactionalProducer(
        {"bootstrap.servers": "127.0.0.1:1"}, transactional_id="t-fake", timeout=600
    )
    first = FakeProducer.instances[0]
    closer = threading.Thread(target=lambda: None)
    try:
        with structlog.testing.capture_logs() as logs:
            ctx = producer.transaction()
            ctx.__enter__()
            producer.produce("out", b"v")
            closer = threading.Thread(target=producer.close, args=(0.2,), daemon=True)
            closer.start()
            closer.join(60)  # a deadline: the unbounded close takes 600 s and more
            assert not closer.is_alive(), "close(0.2) did not return"
    finally:
        release.set()
    aborts = [c for c in first.calls if c.startswith("abort_transaction(")]
    assert aborts and all(float(c[18:-1]) <= 0.2 for c in aborts), aborts
    assert len(FakeProducer.instances) == 1 and producer.recreations == 0
    assert any(e["event"] == "close_timed_out" for e in logs), logs
    with pytest.raises(KResilientError, match="closed"):
        _run_one_transaction(producer, fail_block=False)


def test_the_spark_sink_commit_uses_the_shared_rule_fake() -> None:
    """Spark's exactly-once commit: a retriable error is committed again; a timed-out commit
    (outcome unknown) is fatal, not retried on the same epoch."""
    from kresilient.spark import _eos

    class Committer:
        def __init__(self, errors: list[KafkaError]) -> None:
            self.errors = errors
            self.calls = 0

        def commit_transaction(self, timeout: float) -> None:
            self.calls += 1
            if self.errors:
                raise KafkaException(self.errors.pop(0))

    retried = Committer([KafkaError(KafkaError.NOT_COORDINATOR, "moved", retriable=True)])
    _eos._commit(retried)  # type: ignore[arg-type]
    assert retried.calls == 2
    timed_out = Committer([KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)])
    with pytest.raises(FatalProducerError, match="unknown"):
        _eos._commit(timed_out)  # type: ignore[arg-type]
    assert timed_out.calls == 1


def test_errors_leaving_the_producer_are_redacted_fake() -> None:
    secret = "s3cr3t-Passw0rd-value"
    producer = TransactionalProducer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": secret,
        },
        transactional_id="t-fake",
        timeout=5,
    )
    FakeProducer.script = {
        "commit_transaction": [KafkaError(KafkaError._FENCED, f"fenced, {secret}", fatal=True)]
    }
    with pytest.raises(ProducerFencedError) as caught:
        _run_one_transaction(producer, fail_block=False)
    assert secret not in str(caught.value) and secret not in repr(producer)
    assert "fenced" in str(caught.value)


def test_misuse_is_refused_fake() -> None:
    producer = _producer()
    with pytest.raises(KResilientError, match="outside a transaction"):
        producer.produce("out", b"v")
    with (
        producer.transaction(),
        pytest.raises(KResilientError, match="already open"),
        producer.transaction(),
    ):
        pass
    with pytest.raises(KResilientError, match="differs"):
        TransactionalProducer(
            {"bootstrap.servers": "127.0.0.1:1", "transactional.id": "a"}, transactional_id="b"
        )
    producer.close()
    with pytest.raises(KResilientError, match="closed"):
        _run_one_transaction(producer, fail_block=False)


def render_table() -> str:
    """The classification table of docs/transactions.md, from kresilient._txn."""

    def action(row: TransactionErrorRow) -> str:
        if row.kind is _R:
            return "calls it again (within `timeout`)"
        if row.kind is _A:
            if row.call == "produce" and row.name != "_STATE":
                return "raises `ProduceError`; leaving the block aborts"
            return "aborts; raises `TransactionAbortedError`"
        if _fenced(row):
            return "stops for good: `ProducerFencedError`, never recreated"
        if row.call in ("commit_transaction", "abort_transaction") and row.retriable:
            return "replaces the instance: `TransactionOutcomeUnknownError`"
        if row.recreate:
            return "replaces the instance: `FatalProducerError`"
        return "closes: `FatalProducerError`, never recreated"

    lines = [
        "| call | error | librdkafka flags | kind | TransactionalProducer | why |",
        "|---|---|---|---|---|---|",
    ]
    for row in TRANSACTION_ERRORS:
        named = (("fatal", row.fatal), ("retriable", row.retriable), ("abort", row.abort))
        flags = ", ".join(n for n, on in named if on)
        lines.append(
            f"| `{row.call}` | `{row.name}` | {flags or '-'} | {row.kind.value} | "
            f"{action(row)} | {row.note} |"
        )
    return "\n".join(lines)


def test_the_docs_table_is_the_classification_table_fake() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "transactions.md").read_text()
    start = doc.index("<!-- table:start -->") + len("<!-- table:start -->")
    end = doc.index("<!-- table:end -->")
    assert doc[start:end].strip() == render_table(), "regenerate: tests/test_transactions_fake.py"


def test_a_new_instance_failing_fatally_at_once_closes_instead_of_recreating_again_fake() -> None:
    producer = _producer()
    timed_out = KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True)
    fatal = KafkaError(KafkaError.INVALID_TRANSACTION_TIMEOUT, "refused", fatal=True)
    FakeProducer.script = {"commit_transaction": [timed_out], "init_transactions": [fatal] * 100}
    with pytest.raises(FatalProducerError):
        _run_one_transaction(producer, fail_block=False)
    assert producer.recreations == 1 and len(FakeProducer.instances) == 2  # not a loop
    with pytest.raises(KResilientError, match="closed"):
        _run_one_transaction(producer, fail_block=False)


def test_send_offsets_blocked_in_librdkafka_replaces_the_instance_untouched_fake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka #5456/#5511: send_offsets_to_transaction() can block for ever once the group
    coordinator's broker died (seen on the real cluster in tests/test_eos_chaos.py). The call
    is given up after its timeout and a grace: the transaction is not committed (the error
    says to redo it, not to count it against the records), the blocked instance is never
    touched again (no purge or destroy beside the call in progress) and a new instance, whose
    init_transactions() fences the old epoch, commits the next transaction."""
    monkeypatch.setattr(txn_module, "_STUCK_GRACE_S", 0.2)
    release = threading.Event()
    entered = threading.Event()

    class Wedged(FakeProducer):
        def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
            self.calls.append("send_offsets_to_transaction")
            if len(FakeProducer.instances) == 1:  # the first instance only
                entered.set()
                release.wait(30)

    monkeypatch.setattr(txn_module, "Producer", Wedged)
    producer = TransactionalProducer(
        {"bootstrap.servers": "127.0.0.1:1"}, transactional_id="t-fake", timeout=0.3
    )
    try:
        with pytest.raises(KResilientError, match="blocked") as caught:
            _run_one_transaction(producer, fail_block=False)
        assert entered.is_set()
        # neither an abort (count it against the records) nor a fatal stop: redo the records
        assert not isinstance(caught.value, (TransactionAbortedError, FatalProducerError))
        first, second = FakeProducer.instances
        assert first.calls[-1] == "send_offsets_to_transaction"  # nothing after it
        assert "purge" not in first.calls and "abort_transaction" not in first.calls
        assert second.calls == ["init_transactions"] and producer.recreations == 1
        _run_one_transaction(producer, fail_block=False)  # the new instance commits
        assert second.calls[-1] == "commit_transaction" and producer.committed == 1
    finally:
        release.set()


def test_send_offsets_returning_within_the_grace_keeps_the_instance_fake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The negative control: a slow call that returns is no stuck call."""
    monkeypatch.setattr(txn_module, "_STUCK_GRACE_S", 5.0)

    class Slow(FakeProducer):
        def send_offsets_to_transaction(self, offsets: Any, metadata: Any, timeout: float) -> None:
            self.calls.append("send_offsets_to_transaction")
            threading.Event().wait(0.05)

    monkeypatch.setattr(txn_module, "Producer", Slow)
    producer = _producer()
    _run_one_transaction(producer, fail_block=False)
    assert producer.recreations == 0 and producer.committed == 1
    assert len(FakeProducer.instances) == 1


class _StubConsumer:
    """What TransactionalBatches asks of a consumer here (no broker)."""

    def __init__(self) -> None:
        self.seeks: list[tuple[str, int]] = []

    def seek(self, part: TopicPartition) -> None:
        self.seeks.append((part.topic, part.offset))

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition("s", 0)]

    def consumer_group_metadata(self) -> object:
        return object()


class _StubMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def topic(self) -> str:
        return "s"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def error(self) -> None:
        return None

    def key(self) -> None:
        return None

    def value(self) -> bytes:
        return b"1"

    def headers(self) -> None:
        return None


def test_an_abort_closing_the_producer_inside_a_commit_stops_the_consumer_at_once_fake() -> None:
    """Review 16, F5: send_offsets kept timing out until the policy's timeout, the abort
    that followed was refused fatally (librdkafka#4849, INVALID_TXN_STATE) and closed the
    producer; the commit took that for an ordinary redo (``transaction_redone``), and the
    consumer stopped only if another record came (health still good meanwhile). Now the
    commit's failure path checks the producer: ``transactional_producer_closed`` (ERROR),
    FatalProducerError out of process(), ``closed`` in the snapshot. A real TransactionalProducer
    over the fake librdkafka; the consumer side is a stub."""
    from kresilient import Output, RetryPolicy, TransactionPolicy
    from kresilient.consumer._holds import LoopState
    from kresilient.consumer._output import TransactionalBatches

    producer = TransactionalProducer(
        {"bootstrap.servers": "127.0.0.1:1"}, transactional_id="t", timeout=0.3
    )
    batches = TransactionalBatches(
        consumer=_StubConsumer(),
        producer=producer,
        policy=TransactionPolicy(transactional_id="t", max_records=1),
        call=lambda m: Output("out", b"v"),
        dead_letter=None,
        retrying=RetryPolicy().retrying(),
        outage_retrying=None,
        detector=None,
        deser=None,
        breaker=None,
        dedupe=None,
        tel=None,
        state=LoopState(),
        consume_error=lambda m: None,
        group="g",
        log=structlog.get_logger(),
        redact=str,
    )
    batches._topics_known.add("out")  # the fake has no list_topics
    timed_out = KafkaError(
        KafkaError._TIMED_OUT, "Failed to add offsets: Timed out", retriable=True
    )
    refused = KafkaError(KafkaError.INVALID_TXN_STATE, "EndTxn refused (scripted)", fatal=True)
    FakeProducer.script = {
        "send_offsets_to_transaction": [timed_out] * 1000,
        "abort_transaction": [refused],
    }
    with structlog.testing.capture_logs() as logs, pytest.raises(FatalProducerError):
        batches.process(cast(Any, [_StubMessage(0)]))
    events = [e["event"] for e in logs]
    assert "transactional_producer_closed" in events, events
    assert "transaction_redone" not in events, events
    assert producer.closed_by is not None and batches.snapshot()["closed"] is True
