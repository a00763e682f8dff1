"""What to do about an error of librdkafka's transaction API: the one rule, shared.

:func:`classify_transaction_error` turns the error one of ``init_transactions``,
``begin_transaction``, ``produce``, ``send_offsets_to_transaction``, ``commit_transaction`` or
``abort_transaction`` raised into a :class:`TransactionVerdict`:

- ``RETRIABLE``: call the same function again (the transaction is intact);
- ``ABORTABLE``: ``abort_transaction()``, then run the whole transaction again;
- ``FATAL``: this producer instance is unusable. ``fenced`` says another instance took over
  the ``transactional.id``, or that this cannot be excluded (a bare ``_FATAL`` whose cause
  librdkafka did not name): stop, never recreate (a recreated zombie would fence the
  instance that legitimately owns the id). ``recreate`` is set only where the owner is known
  to be this process: a commit or abort whose outcome is unknown (below). Every other fatal
  error closes the producer: whether a new instance is safe is the application's decision.

The order of the checks is the rule: fencing, librdkafka's own ``fatal()`` flag, a commit or
abort whose outcome is unknown, ``txn_requires_abort()``, ``retriable()``, then the code.

A commit or abort that timed out (``_TIMED_OUT`` and friends) is retriable to librdkafka, but
its EndTxn request may still be on its way and land later. librdkafka does not implement
KIP-890's server-side defence (confluentinc/librdkafka#5423), so a late EndTxn of the old epoch
could complete the *next* transaction of the same instance. Here such an outcome is unknown and
``FATAL`` with ``recreate``: a new instance's ``init_transactions()`` bumps the producer epoch,
and the coordinator refuses any late request of the old epoch (docs/transactions.md).

:data:`TRANSACTION_ERRORS` lists every error code librdkafka's transaction manager returns
to the application, with the flags it sets and the verdict; ``tests/test_transactions_fake.py``
drives each through a fake producer and checks the action taken.

Used by :class:`kresilient.producer.TransactionalProducer` and the Spark sink's exactly-once
commit (``kresilient/spark/_eos.py``).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from confluent_kafka import KafkaError, KafkaException

from kresilient.errors import Action, Classification, ErrorCategory, classify

__all__ = [
    "FENCED_CODES",
    "TRANSACTION_CALLS",
    "TRANSACTION_ERRORS",
    "TransactionCall",
    "TransactionErrorKind",
    "TransactionErrorRow",
    "TransactionVerdict",
    "classify_transaction_error",
]

TransactionCall = Literal[
    "init_transactions",
    "begin_transaction",
    "produce",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
]

TRANSACTION_CALLS: Final[tuple[TransactionCall, ...]] = (
    "init_transactions",
    "begin_transaction",
    "produce",
    "send_offsets_to_transaction",
    "commit_transaction",
    "abort_transaction",
)

_ENDING: Final = frozenset({"commit_transaction", "abort_transaction"})


class TransactionErrorKind(enum.Enum):
    """What a transaction error asks for."""

    RETRIABLE = "retriable"  #: call the same function again
    ABORTABLE = "abortable"  #: abort the transaction, then run it again
    FATAL = "fatal"  #: the producer instance is unusable


@dataclass(frozen=True, kw_only=True, slots=True)
class TransactionVerdict:
    """The verdict on one transaction error (see the module docstring)."""

    kind: TransactionErrorKind
    #: another instance owns the transactional.id now: stop, do not recreate
    fenced: bool
    #: a commit or abort whose outcome is unknown (timed out): the EndTxn may still land
    outcome_unknown: bool
    #: FATAL only: closing this instance and building a new one with the same id is safe
    recreate: bool
    classification: Classification
    #: one line on why, for logs and exceptions
    reason: str


#: Fencing: a newer instance with the same transactional.id initialised (``_FENCED`` is
#: librdkafka's normalised form; ``INVALID_PRODUCER_EPOCH`` is fencing when raised as fatal).
FENCED_CODES: Final = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)

#: Codes a commit or abort reports when its outcome is unknown (its own timer ran out, or
#: it asked again while the timed-out call was still under way).
_UNKNOWN_OUTCOME_CODES: Final = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._PREV_IN_PROGRESS,
    }
)

#: Codes a new instance would meet again: fix the configuration, permissions or cluster.
_NOT_RECREATABLE: Final = frozenset(
    {
        KafkaError._NOT_CONFIGURED,
        KafkaError._UNSUPPORTED_FEATURE,
        KafkaError._INVALID_ARG,
        KafkaError._DESTROY,
        KafkaError.INVALID_TRANSACTION_TIMEOUT,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.UNSUPPORTED_VERSION,
    }
)


def _kafka_error(err: KafkaError | KafkaException) -> KafkaError:
    if isinstance(err, KafkaError):
        return err
    if err.args and isinstance(err.args[0], KafkaError):
        return err.args[0]
    return KafkaError(KafkaError._FAIL, str(err))


def classify_transaction_error(
    err: KafkaError | KafkaException, call: TransactionCall
) -> TransactionVerdict:
    """The verdict on ``err``, raised by the transaction API function ``call``.

    Example::

        try:
            producer.commit_transaction(30)
        except KafkaException as exc:
            v = classify_transaction_error(exc, "commit_transaction")
            if v.kind is TransactionErrorKind.RETRIABLE: ...  # commit again
            elif v.kind is TransactionErrorKind.ABORTABLE: ...  # abort, run it again
            elif v.fenced: ...  # stop this instance
            elif v.recreate: ...  # close it, build a new one with the same transactional.id
    """
    kerr = _kafka_error(err)
    c = classify(kerr)
    code = c.code if c.code is not None else kerr.code()  # _FATAL unwrapped by classify
    fatal = kerr.fatal() or kerr.code() == KafkaError._FATAL
    if code == KafkaError._FATAL:  # no cause in the error: fencing cannot be excluded
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            fenced=True,
            reason="a fatal error whose cause librdkafka did not name: possibly fenced (another "
            "instance may own the transactional.id now), so this instance stops and is never "
            "recreated (a new one would fence that owner)",
        )
    if code in FENCED_CODES and (fatal or code != KafkaError.INVALID_PRODUCER_EPOCH):
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            fenced=True,
            reason="fenced: another producer instance initialised the same transactional.id "
            "after this one; this instance must stop (its open transaction was aborted by the "
            "broker and nothing it writes is visible to read_committed readers)",
        )
    if fatal:
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            reason="fatal producer error: this instance is unusable and is closed, not recreated"
            + (
                " (only the application knows it still owns the transactional.id)"
                if code not in _NOT_RECREATABLE
                else "; a new instance would meet it again: fix the configuration or ACLs"
            ),
        )
    if call in _ENDING and code in _UNKNOWN_OUTCOME_CODES:
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            outcome_unknown=True,
            recreate=True,
            reason=f"{call} did not finish in time: whether the transaction was committed or "
            "aborted is unknown and its EndTxn request may still land (librdkafka has no "
            "KIP-890 defence); the instance is replaced so that a new epoch fences that request",
        )
    if kerr.txn_requires_abort():
        if call == "abort_transaction":  # cannot abort an abort
            return _verdict(
                TransactionErrorKind.FATAL,
                c,
                reason="abort_transaction() itself asked for an abort: the instance is closed",
            )
        return _verdict(
            TransactionErrorKind.ABORTABLE,
            c,
            reason="the transaction cannot commit: abort it and run it again",
        )
    if kerr.retriable():
        return _verdict(
            TransactionErrorKind.RETRIABLE,
            c,
            reason=f"{call} may be called again: the transaction is intact",
        )
    if call == "produce" and code == KafkaError._STATE:
        # TransactionalProducer produces only inside a transaction: librdkafka refuses a
        # record with _STATE once the transaction is in its abortable state (the broker
        # refused one of its records)
        return _verdict(
            TransactionErrorKind.ABORTABLE,
            c,
            reason="the transaction cannot commit (a record of it was refused): it is aborted",
        )
    state = code in (KafkaError._STATE, KafkaError._CONFLICT, KafkaError.INVALID_TXN_STATE)
    if call == "produce" and not state and code not in _NOT_RECREATABLE:
        return _verdict(
            TransactionErrorKind.ABORTABLE,
            c,
            reason="a record was refused locally: the transaction cannot hold all of its "
            "records, so it is aborted",
        )
    if code in _NOT_RECREATABLE or (c.category.name in ("AUTH", "CONFIG") and not state):
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            reason="a configuration, permission or usage error: a new instance would meet it "
            "again; fix it",
        )
    if call in _ENDING or state:
        # librdkafka#4849/#3928: an abort or commit refused in a state the application did
        # not cause. A new instance's init_transactions() would abort what is left open, but
        # it would also fence an instance that owns the id now: the producer is closed.
        return _verdict(
            TransactionErrorKind.FATAL,
            c,
            reason=f"{call} failed in an unexpected transaction state: the instance is closed "
            "(not recreated: a new one would fence another owner of the transactional.id)",
        )
    return _verdict(
        TransactionErrorKind.ABORTABLE,
        c,
        reason="not flagged by librdkafka: the transaction is aborted to be safe",
    )


def _verdict(
    kind: TransactionErrorKind,
    c: Classification,
    *,
    reason: str,
    fenced: bool = False,
    outcome_unknown: bool = False,
    recreate: bool = False,
) -> TransactionVerdict:
    return TransactionVerdict(
        kind=kind,
        fenced=fenced,
        outcome_unknown=outcome_unknown,
        recreate=recreate,
        classification=_in_transaction(c, kind, reason, fenced, outcome_unknown, recreate),
        reason=reason,
    )


def _in_transaction(
    c: Classification,
    kind: TransactionErrorKind,
    reason: str,
    fenced: bool,
    outcome_unknown: bool,
    recreate: bool,
) -> Classification:
    """The code's classification, with what it means in a transaction where that differs
    (a timed-out commit is not "retry"; an unflagged produce refusal aborts)."""
    if kind is TransactionErrorKind.RETRIABLE:
        return c if c.retriable else dataclasses.replace(c, retriable=True, action=Action.RETRY)
    if kind is TransactionErrorKind.ABORTABLE:
        if c.category is ErrorCategory.ABORTABLE:
            return c
        return dataclasses.replace(
            c,
            category=ErrorCategory.ABORTABLE,
            retriable=False,
            action=Action.ABORT_TRANSACTION,
            remedy=f"Abort the transaction and run it again. {c.remedy}",
        )
    if fenced:  # stop: a recreated zombie would fence the legitimate owner in turn
        return dataclasses.replace(
            c,
            category=ErrorCategory.FATAL_PRODUCER,
            retriable=False,
            fatal=True,
            action=Action.FAIL,
            remedy="Fenced, or a fatal error whose cause excludes no fencing: another instance "
            "may own this transactional.id now. Stop this one; do not recreate it (it would "
            "fence that owner): let the supervisor restart the process if it must",
        )
    if outcome_unknown:
        return dataclasses.replace(
            c,
            category=ErrorCategory.FATAL_PRODUCER,
            retriable=False,
            fatal=True,
            action=Action.RECREATE_PRODUCER,
            remedy="The transaction's outcome is unknown; the producer instance is replaced "
            "(a new epoch fences the late request). Consume-transform-produce: seek the "
            "consumer to its committed offsets, which committed with the transaction or not",
        )
    if recreate and c.action is not Action.RECREATE_PRODUCER:
        return dataclasses.replace(
            c,
            retriable=False,
            fatal=True,
            action=Action.RECREATE_PRODUCER,
            remedy=f"{reason}. {c.remedy}",
        )
    # closed, not recreated: a new instance fences any other owner of the id, so building
    # one is the application's decision (RECREATE_PRODUCER would suggest doing it blindly)
    return dataclasses.replace(
        c,
        retriable=False,
        action=Action.FAIL,
        remedy=f"{reason}. Build a new TransactionalProducer only if this process still owns "
        f"the transactional.id. {c.remedy}",
    )


class TransactionErrorRow(NamedTuple):
    """An error librdkafka's transaction API returns: the code, the call returning it, the
    flags librdkafka sets on it there, and the verdict (what :func:`classify_transaction_error`
    gives and ``tests/test_transactions_fake.py`` checks)."""

    name: str
    call: TransactionCall
    fatal: bool
    retriable: bool
    abort: bool
    kind: TransactionErrorKind
    recreate: bool
    note: str


_R, _A, _F = (
    TransactionErrorKind.RETRIABLE,
    TransactionErrorKind.ABORTABLE,
    TransactionErrorKind.FATAL,
)

# Sources: librdkafka src/rdkafka_txnmgr.c (which codes each call's reply carries and which
# rd_kafka_error_t flags it sets), INTRODUCTION.md "Transactional Producer > Error handling",
# and librdkafka#4849/#3928 (abort refused with INVALID_TXN_STATE by a single producer).
# fmt: off
TRANSACTION_ERRORS: Final[tuple[TransactionErrorRow, ...]] = (
    # ---- init_transactions ----
    TransactionErrorRow("_TIMED_OUT", "init_transactions", False, True, False, _R, False,
                        "coordinator not reached in time: call again"),
    TransactionErrorRow("_PREV_IN_PROGRESS", "init_transactions", False, True, False, _R, False,
                        "a timed-out init still under way: call again"),
    TransactionErrorRow("_FENCED", "init_transactions", True, False, False, _F, False,
                        "a newer instance initialised meanwhile"),
    TransactionErrorRow("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "init_transactions", True,
                        False, False, _F, False, "ACL on the transactional.id"),
    TransactionErrorRow("CLUSTER_AUTHORIZATION_FAILED", "init_transactions", True, False, False,
                        _F, False, "IdempotentWrite/cluster ACL"),
    TransactionErrorRow("INVALID_TRANSACTION_TIMEOUT", "init_transactions", True, False, False,
                        _F, False, "transaction.timeout.ms above the broker's maximum"),
    TransactionErrorRow("_UNSUPPORTED_FEATURE", "init_transactions", True, False, False, _F,
                        False, "brokers without transactions"),
    TransactionErrorRow("_NOT_CONFIGURED", "init_transactions", False, False, False, _F, False,
                        "no transactional.id"),
    TransactionErrorRow("_STATE", "init_transactions", False, False, False, _F, False,
                        "called twice"),
    TransactionErrorRow("_CONFLICT", "init_transactions", False, False, False, _F, False,
                        "another transaction call running on another thread"),
    TransactionErrorRow("_DESTROY", "init_transactions", False, False, False, _F, False,
                        "the client is being closed"),
    TransactionErrorRow("_FATAL", "init_transactions", True, False, False, _F, False,
                        "cause not named: possibly fenced"),
    # ---- begin_transaction ----
    TransactionErrorRow("_STATE", "begin_transaction", False, False, False, _F, False,
                        "not initialised, or a transaction already open"),
    TransactionErrorRow("_CONFLICT", "begin_transaction", False, False, False, _F, False,
                        "another transaction call running"),
    TransactionErrorRow("_FENCED", "begin_transaction", True, False, False, _F, False,
                        "fenced before this transaction"),
    TransactionErrorRow("_FATAL", "begin_transaction", True, False, False, _F, False,
                        "cause not named: possibly fenced"),
    # ---- produce (inside the transaction) ----
    TransactionErrorRow("_STATE", "produce", False, False, False, _A, False,
                        "the transaction needs an abort: the broker refused a record of it"),
    TransactionErrorRow("_FENCED", "produce", True, False, False, _F, False, "fenced"),
    TransactionErrorRow("_FATAL", "produce", True, False, False, _F, False,
                        "cause not named: possibly fenced"),
    TransactionErrorRow("_UNKNOWN_PARTITION", "produce", False, False, False, _A, False,
                        "a record refused locally: the transaction cannot hold it"),
    TransactionErrorRow("MSG_SIZE_TOO_LARGE", "produce", False, False, False, _A, False,
                        "a record above message.max.bytes"),
    TransactionErrorRow("_UNKNOWN_TOPIC", "produce", False, False, False, _A, False,
                        "a topic that does not exist"),
    # ---- send_offsets_to_transaction ----
    TransactionErrorRow("_TIMED_OUT", "send_offsets_to_transaction", False, True, False, _R,
                        False, "call again"),
    TransactionErrorRow("_INVALID_ARG", "send_offsets_to_transaction", False, False, False, _F,
                        False, "no offsets, or no group metadata"),
    TransactionErrorRow("_STATE", "send_offsets_to_transaction", False, False, False, _F, False,
                        "no open transaction"),
    TransactionErrorRow("UNKNOWN_MEMBER_ID", "send_offsets_to_transaction", False, False, True,
                        _A, False, "KIP-447: the consumer left the group (rebalance)"),
    TransactionErrorRow("ILLEGAL_GENERATION", "send_offsets_to_transaction", False, False, True,
                        _A, False, "KIP-447: a rebalance happened meanwhile"),
    TransactionErrorRow("FENCED_INSTANCE_ID", "send_offsets_to_transaction", False, False, True,
                        _A, False, "KIP-447: another member with the group.instance.id"),
    TransactionErrorRow("GROUP_AUTHORIZATION_FAILED", "send_offsets_to_transaction", False,
                        False, True, _A, False, "no READ on the group"),
    TransactionErrorRow("TOPIC_AUTHORIZATION_FAILED", "send_offsets_to_transaction", False,
                        False, True, _A, False, "no READ on a consumed topic"),
    TransactionErrorRow("UNSUPPORTED_FOR_MESSAGE_FORMAT", "send_offsets_to_transaction", False,
                        False, True, _A, False, "old message format"),
    TransactionErrorRow("UNKNOWN_PRODUCER_ID", "send_offsets_to_transaction", False, False,
                        True, _A, False, "KIP-360: the producer's state expired; abort bumps"),
    TransactionErrorRow("INVALID_PRODUCER_ID_MAPPING", "send_offsets_to_transaction", False,
                        False, True, _A, False, "KIP-360: as above"),
    TransactionErrorRow("TRANSACTION_ABORTABLE", "send_offsets_to_transaction", False, False,
                        True, _A, False, "KIP-890: the broker asks for an abort"),
    TransactionErrorRow("INVALID_PRODUCER_EPOCH", "send_offsets_to_transaction", True, False,
                        False, _F, False, "fenced (an old epoch)"),
    TransactionErrorRow("PRODUCER_FENCED", "send_offsets_to_transaction", True, False, False,
                        _F, False, "fenced"),
    TransactionErrorRow("INVALID_TXN_STATE", "send_offsets_to_transaction", True, False, False,
                        _F, False, "the coordinator refused the state"),
    TransactionErrorRow("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "send_offsets_to_transaction",
                        True, False, False, _F, False, "ACL"),
    # ---- commit_transaction ----
    TransactionErrorRow("_TIMED_OUT", "commit_transaction", False, True, False, _F, True,
                        "outcome unknown (KIP-890 defence: recreate)"),
    TransactionErrorRow("_PREV_IN_PROGRESS", "commit_transaction", False, True, False, _F, True,
                        "a timed-out commit still under way: outcome unknown"),
    TransactionErrorRow("COORDINATOR_NOT_AVAILABLE", "commit_transaction", False, True, False,
                        _R, False, "EndTxn not sent yet: call again"),
    TransactionErrorRow("NOT_COORDINATOR", "commit_transaction", False, True, False, _R, False,
                        "coordinator moved: call again"),
    TransactionErrorRow("CONCURRENT_TRANSACTIONS", "commit_transaction", False, True, False,
                        _R, False, "the previous transaction still completing: call again"),
    TransactionErrorRow("_MSG_TIMED_OUT", "commit_transaction", False, False, True, _A, False,
                        "a record was not delivered"),
    TransactionErrorRow("_PURGE_QUEUE", "commit_transaction", False, False, True, _A, False,
                        "records purged before delivery"),
    TransactionErrorRow("MSG_SIZE_TOO_LARGE", "commit_transaction", False, False, True, _A,
                        False, "a record refused by the broker"),
    TransactionErrorRow("TOPIC_AUTHORIZATION_FAILED", "commit_transaction", False, False, True,
                        _A, False, "no WRITE on a topic"),
    TransactionErrorRow("UNKNOWN_PRODUCER_ID", "commit_transaction", False, False, True, _A,
                        False, "KIP-360: abort bumps the epoch"),
    TransactionErrorRow("OUT_OF_ORDER_SEQUENCE_NUMBER", "commit_transaction", False, False,
                        True, _A, False, "idempotence gap inside a transaction: abort bumps"),
    TransactionErrorRow("TRANSACTION_ABORTABLE", "commit_transaction", False, False, True, _A,
                        False, "KIP-890"),
    TransactionErrorRow("_FENCED", "commit_transaction", True, False, False, _F, False,
                        "fenced: a zombie"),
    TransactionErrorRow("PRODUCER_FENCED", "commit_transaction", True, False, False, _F, False,
                        "fenced"),
    TransactionErrorRow("INVALID_PRODUCER_EPOCH", "commit_transaction", True, False, False, _F,
                        False, "fenced (old epoch)"),
    TransactionErrorRow("INVALID_TXN_STATE", "commit_transaction", True, False, False, _F, False,
                        "the coordinator refused the state"),
    TransactionErrorRow("_STATE", "commit_transaction", False, False, False, _F, False,
                        "no open transaction, or the state needs an abort"),
    TransactionErrorRow("_FATAL", "commit_transaction", True, False, False, _F, False,
                        "cause not named: possibly fenced"),
    # ---- abort_transaction ----
    TransactionErrorRow("_TIMED_OUT", "abort_transaction", False, True, False, _F, True,
                        "outcome unknown: recreate (a new init aborts it anyway)"),
    TransactionErrorRow("_PREV_IN_PROGRESS", "abort_transaction", False, True, False, _F, True,
                        "a timed-out abort still under way"),
    TransactionErrorRow("COORDINATOR_NOT_AVAILABLE", "abort_transaction", False, True, False,
                        _R, False, "call again"),
    TransactionErrorRow("_FENCED", "abort_transaction", True, False, False, _F, False,
                        "fenced: the broker aborted it already"),
    TransactionErrorRow("INVALID_TXN_STATE", "abort_transaction", True, False, False, _F, False,
                        "librdkafka#4849: closed (a new instance would abort it)"),
    TransactionErrorRow("_STATE", "abort_transaction", False, False, False, _F, False,
                        "librdkafka#3928: abort refused; closed"),
    TransactionErrorRow("_FATAL", "abort_transaction", True, False, False, _F, False,
                        "cause not named: possibly fenced"),
)
# fmt: on
