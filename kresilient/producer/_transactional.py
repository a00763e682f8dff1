"""TransactionalProducer: Kafka transactions with the errors librdkafka leaves to you handled.

A class of its own rather than ``ResilientProducer(transactional_id=...)``: its lifecycle is
different (``init_transactions()`` before anything, then begin / produce / send offsets /
commit or abort, one transaction at a time), and it has states ``ResilientProducer`` has
not: *fenced* (another instance took the ``transactional.id``: stop for good) and *outcome
unknown* (a commit timed out: the instance is replaced). Delivery handles, spooling,
dead-lettering oversized values and ``flush()`` raising per-message failures do not apply
inside a transaction, where the unit of success is the transaction (docs/transactions.md).

Example (consume-transform-produce)::

    producer = TransactionalProducer(
        {"bootstrap.servers": servers}, transactional_id="orders-enricher-0"
    )
    with producer.transaction():
        for msg in consumer.consume(500, timeout=1.0):
            producer.produce("enriched", enrich(msg.value()), key=msg.key())
        producer.send_offsets(consumer)  # the consumed offsets commit with the records

What each error does (the rule is :func:`kresilient._txn.classify_transaction_error`):

- an exception inside the ``with`` block aborts the transaction and propagates;
- a retriable error of a call is retried until ``timeout``;
- an abortable error aborts the transaction and raises :class:`TransactionAbortedError`: run
  the transaction again (after seeking the consumer back to its committed offsets);
- fenced, or a fatal error whose cause is unknown (fencing cannot be excluded):
  :class:`ProducerFencedError`; the producer is closed and refuses every call. It never
  recreates itself then: a recreated zombie would fence the legitimate owner;
- a commit or abort that timed out: :class:`TransactionOutcomeUnknownError`; the librdkafka
  instance is replaced at once (KIP-890 defence, see the module :mod:`kresilient._txn`);
- another fatal error: :class:`~kresilient.FatalProducerError`; the producer is closed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

import structlog
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from kresilient._txn import (
    FENCED_CODES,
    TransactionCall,
    TransactionErrorKind,
    TransactionVerdict,
    classify_transaction_error,
)
from kresilient._watchdog import bounded_call
from kresilient.config import producer_config
from kresilient.errors import (
    ConfigError,
    FatalProducerError,
    KafkaClientError,
    KResilientError,
    translate,
)
from kresilient.producer._support import DRAIN_TIMEOUT, drain
from kresilient.reachability import LogBridge
from kresilient.redaction import Redactor

__all__ = [
    "ProducerFencedError",
    "TransactionAbortedError",
    "TransactionOutcomeUnknownError",
    "TransactionalProducer",
]

#: How many delivery failures of one transaction are kept to name in its error.
_KEPT_FAILURES: Final = 20
_CALLBACKS: Final = ("on_delivery", "error_cb", "logger")
#: Delivery errors of records purged locally (an abort, a replacement): never sent.
_PURGED: Final = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
#: Seconds a dropped librdkafka instance (replaced or fatal) may take to be purged and
#: destroyed before it is left to a daemon thread (rd_kafka_destroy can block on a frozen
#: broker).
_RELEASE_TIMEOUT: Final = DRAIN_TIMEOUT + 5.0
# How long past its own timeout send_offsets_to_transaction() may take before the instance is
# given up as stuck: librdkafka (2.16 included) can block in it for ever when the group
# coordinator's broker died (its coordinator request timer is never checked, librdkafka
# #5456; a coordinator decommissioned from metadata is waited for until some broker changes
# state, #5511). Seen on the real cluster: tests/test_eos_chaos.py, the coordinator's broker
# SIGKILLed, the call still blocked minutes later.
_STUCK_GRACE_S = 10.0
#: Calls whose failure with one of :data:`_UNANSWERED_CODES` leaves a transaction request
#: possibly processed without its answer: an abort after one replaces the instance (a new
#: epoch), see :meth:`TransactionalProducer._abort`.
_EPOCH_CALLS: Final = frozenset(
    {"send_offsets_to_transaction", "commit_transaction", "abort_transaction"}
)
#: A request sent and not answered (timed out in flight, connection lost): the broker may
#: have processed it. An answered error (ILLEGAL_GENERATION, NOT_COORDINATOR ...) and a
#: request that timed out before it was sent (``_TIMED_OUT_QUEUE``) are not.
_UNANSWERED_CODES: Final = frozenset(
    {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError.REQUEST_TIMED_OUT}
)
#: librdkafka's log lines for a request that was sent and never answered: a request timed
#: out in flight (REQTMOUT, e.g. "Timed out ProduceRequest in flight (after 6006ms ...)"),
#: a connection lost with requests outstanding (FAIL, "... Disconnected ..."). A produce
#: request retried after one carries records the broker may hold ("possibly persisted").
_UNANSWERED_LINE: Final = re.compile(r"Timed out \w+Request in flight|Disconnected")
#: How long an abort waits, at most, for the coordinator to have the open transaction
#: registered (see :meth:`TransactionalProducer._await_registration`); never more than half
#: the abort's own timeout.
_REGISTRATION_WAIT_S = 5.0
#: librdkafka's line when the open transaction fell into its abortable state (TXNERR): its
#: queued records may never be sent, so an abort waits for no delivery any more.
_FAILED_LINE: Final = re.compile(r"Current transaction failed")


class _Stuck(Exception):
    """A librdkafka call did not return within its timeout and the grace."""


class TransactionAbortedError(KafkaClientError):
    """The transaction hit an abortable error and was aborted: nothing of it is visible to
    ``read_committed`` readers. Run it again (a consumer feeding it must seek back to its
    committed offsets first). The producer stays usable."""


class ProducerFencedError(FatalProducerError):
    """Another producer instance initialised the same ``transactional.id`` (or a fatal error
    whose cause librdkafka did not name, where that cannot be excluded): this one is a
    zombie. Nothing it wrote in its open transaction becomes visible; it is closed and must
    not be recreated (a new instance would fence the legitimate owner in turn): stop, and let
    the supervisor decide. A subclass of :class:`~kresilient.FatalProducerError`, whose usual
    remedy is "recreate the client": catch ``ProducerFencedError`` first."""


class TransactionOutcomeUnknownError(FatalProducerError):
    """A commit or abort did not finish within its timeout: the transaction may or may not
    be committed. The librdkafka instance was replaced (a new epoch fences the late request).
    For consume-transform-produce, read the consumer's committed offsets (they committed
    with the transaction, or not) and continue from there."""


class _State(enum.Enum):
    READY = "ready"  #: initialised, no transaction open
    OPEN = "open"  #: a transaction is open
    NEEDS_INIT = "needs_init"  #: a new instance whose init_transactions() has not completed
    FENCED = "fenced"
    CLOSED = "closed"


def _code(exc: KafkaException) -> int | None:
    kerr = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    return kerr.code() if kerr is not None else None


def _unknown_outcome(verdict: TransactionVerdict, call: str, timeout: float) -> TransactionVerdict:
    return dataclasses.replace(
        verdict,
        kind=TransactionErrorKind.FATAL,
        outcome_unknown=True,
        recreate=True,
        reason=f"{call} kept failing ({verdict.classification.name}) for {timeout:g} s: "
        "whether the transaction was committed or aborted is unknown; the instance is "
        "replaced so that a new epoch fences a late EndTxn",
    )


class TransactionalProducer:
    """A transactional producer: ``with producer.transaction():`` commits or aborts.

    Args:
        config: a confluent-kafka producer config (never modified); kresilient's safe
            defaults are applied (:func:`kresilient.producer_config`) and the same refusals
            (``allow_unsafe`` names the keys allowed to weaken a guarantee). ``on_delivery``,
            ``error_cb`` and ``logger`` are called after kresilient's own handling.
        transactional_id: the stable id of this producer's role (e.g. ``<service>-<input
            partition>``): an instance with the same id fences this one. Must match
            ``transactional.id`` if the config sets it too.
        timeout: seconds each transaction call may take, retriable errors included. A commit
            or abort that is still unfinished then has an unknown outcome (the instance is
            replaced); keep it above the time to deliver a transaction's records.
        backpressure_timeout: seconds :meth:`produce` waits for room in a full local queue.
        logger: a structlog logger (bound with the client id and the transactional id).

    ``init_transactions()`` runs in the constructor: it fences every older instance with the
    same id and aborts its open transaction. Not thread-safe: one transaction at a time, from
    one thread (librdkafka's transactional API allows one call at a time).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        *,
        transactional_id: str,
        timeout: float = 60.0,
        backpressure_timeout: float = 60.0,
        allow_unsafe: Iterable[str] = (),
        logger: Any = None,
    ) -> None:
        if not transactional_id:
            raise ConfigError("transactional_id must be a non-empty string", key="transactional.id")
        given = config.get("transactional.id")
        if given is not None and given != transactional_id:
            raise ConfigError(
                f"transactional.id {given!r} in the config differs from transactional_id="
                f"{transactional_id!r}: give it once",
                key="transactional.id",
            )
        if not timeout > 0:
            raise ConfigError(f"timeout must be positive, not {timeout!r}", key="timeout")
        base_log = logger if logger is not None else structlog.get_logger("kresilient.producer")
        allow = tuple([allow_unsafe] if isinstance(allow_unsafe, str) else allow_unsafe)
        cfg = producer_config(
            {**config, "transactional.id": transactional_id}, allow_unsafe=allow, logger=base_log
        )
        self._user_cb: dict[str, Any] = {name: cfg.pop(name, None) for name in _CALLBACKS}
        for name, cb in self._user_cb.items():
            if cb is not None and name != "logger" and not callable(cb):
                raise ConfigError(f"{name} must be callable", key=name)
        self._scrub: Callable[[str], str] = Redactor.for_config(cfg)
        self._cfg = cfg
        self.transactional_id = transactional_id
        self.client_id = str(cfg.get("client.id", ""))
        self._log = base_log.bind(
            client_id=self.client_id,
            kafka_role="producer",
            transactional_id=self._scrub(transactional_id),
        )
        self._timeout = float(timeout)
        self._backpressure_timeout = float(backpressure_timeout)
        self._bridge = LogBridge(
            self._log, self._on_line, self._scrub, user_logger=self._user_cb["logger"]
        )
        self._failures: list[tuple[str, int, KafkaError]] = []
        self._failed = 0
        #: a record of the open transaction was refused by the broker (not purged locally)
        self._refused = False
        #: a request of the open transaction was sent and not answered (timed out in
        #: flight, connection lost): the broker may have processed it (see _abort)
        self._unanswered = False
        #: whether the coordinator is known to hold the open transaction (a record of it
        #: reached a broker, or its offsets were added), or librdkafka failed it: see
        #: _await_registration
        self._registered = False
        self._txn_failed = False
        #: transactions committed / aborted, librdkafka instances replaced, over its life
        self.committed = 0
        self.aborted = 0
        self.recreations = 0
        #: the fatal error librdkafka reported through error_cb (the cause of a bare _FATAL)
        self._fatal_cause: KafkaError | None = None
        #: a delivery report said fenced (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED...)
        self._fence_seen: KafkaError | None = None
        self._state = _State.NEEDS_INIT
        self._replacing = False  # a fatal error while replacing closes instead of recursing
        #: the fatal error that closed the producer (not fenced): later calls raise it again
        self._closed_by: FatalProducerError | None = None
        self._closing = False  # close() never builds a new instance
        self._producer: Any = self._new_instance()
        self._init()

    # ------------------------------------------------------------------ public API

    @property
    def fenced(self) -> bool:
        """True once another instance took the ``transactional.id`` (the producer is closed)."""
        return self._state is _State.FENCED

    @property
    def refused(self) -> bool:
        """The broker refused a record of the last (or the open) transaction (a delivery
        failed with a broker error, not purged locally): its abort was about that record."""
        return self._refused

    @property
    def closed_by(self) -> FatalProducerError | None:
        """The fatal error (not fencing) that closed the producer, if one did: every later
        transaction raises :class:`~kresilient.FatalProducerError` (build a new producer, or
        stop and let a supervisor restart the process)."""
        return self._closed_by

    @property
    def in_transaction(self) -> bool:
        """True between :meth:`transaction`'s begin and its commit or abort."""
        return self._state is _State.OPEN

    @contextlib.contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """Begin a transaction; commit it when the block ends, abort it on an exception.

        Raises (on commit) :class:`TransactionAbortedError` (aborted: run it again),
        :class:`ProducerFencedError`, :class:`TransactionOutcomeUnknownError` or
        :class:`~kresilient.FatalProducerError`. An exception of the block is re-raised
        after the abort; a failure of the abort itself is logged and added to its notes.
        """
        self._ready()
        self._serve()  # the last transaction's reports, before this one's flags are reset
        self._call("begin_transaction", lambda t: self._producer.begin_transaction())
        self._state = _State.OPEN
        self._failures = []
        self._failed = 0
        self._refused = False
        self._unanswered = False
        self._registered = False
        self._txn_failed = False
        try:
            yield self
        except BaseException as exc:
            if self._state is _State.OPEN:
                try:
                    self._abort(f"the transaction's block raised {type(exc).__name__}")
                except KResilientError as abort_failure:
                    exc.add_note(f"kresilient: the abort failed too: {abort_failure}")
            raise
        if self._state is not _State.OPEN:
            raise KResilientError(
                "the transaction ended inside its block (the producer was fenced, failed or "
                "closed there): nothing was committed"
            )
        self._commit()

    def poll(self, timeout: float = 0.0) -> int:
        """Serve librdkafka's callbacks (delivery reports, errors, log lines) for up to
        ``timeout`` seconds; the number of events served. :meth:`produce` serves them too;
        call this while a long transaction waits on something else."""
        if self._producer is None:
            return 0
        return int(self._producer.poll(timeout))

    def topic_exists(self, topic: str, timeout: float = 5.0) -> bool | None:
        """Whether the cluster knows ``topic`` (one metadata request; ``None``: no answer
        within ``timeout``). A record to a topic that does not exist is not refused by
        librdkafka when produced: its delivery fails after ``topic.metadata.propagation.max.ms``
        (30 s) and the transaction with it, so a caller asks first."""
        producer = self._producer
        if producer is None:
            return None
        try:
            meta = producer.list_topics(topic, timeout=timeout)
        except KafkaException:
            return None
        info = meta.topics.get(topic)
        if info is None:
            return False
        err = info.error
        if err is None:
            return True
        if err.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            return False
        return None

    def produce(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        *,
        partition: int | None = None,
        headers: Sequence[tuple[str, bytes | str | None]] | Mapping[str, Any] | None = None,
        timestamp: int = 0,
    ) -> None:
        """Queue a record in the open transaction (visible to ``read_committed`` readers
        only once it commits). A full local queue is waited out for ``backpressure_timeout``.
        A record refused locally raises :class:`~kresilient.ProduceError`: leaving the block
        with it aborts the transaction."""
        if self._state is not _State.OPEN:
            raise self._outside("produce()")
        kwargs: dict[str, Any] = {"key": key, "timestamp": timestamp}
        if partition is not None:
            kwargs["partition"] = partition
        if headers is not None:
            kwargs["headers"] = headers
        deadline: float | None = None
        while True:
            try:
                self._producer.produce(topic, value, **kwargs)
                self._producer.poll(0)
                return
            except BufferError as exc:
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + self._backpressure_timeout
                if now >= deadline:
                    raise translate(exc, topic=topic, operation="produce") from exc
                self._producer.poll(0.1)
            except KafkaException as exc:
                verdict = classify_transaction_error(exc, "produce")
                if verdict.kind is TransactionErrorKind.FATAL:
                    self._fatal(verdict, exc, "produce")
                if verdict.classification.code == KafkaError._STATE:
                    # the transaction is in librdkafka's abortable state (the broker refused
                    # a record of it): abort it now; the failed record is named
                    self._serve()
                    self._abortable(verdict, exc, "produce")
                raise translate(
                    exc, topic=topic, partition=partition, operation="produce", redactor=self._scrub
                ) from exc

    def send_offsets(self, consumer: Any, offsets: Sequence[TopicPartition] | None = None) -> None:
        """Commit ``consumer``'s offsets with the open transaction (consume-transform-produce).

        ``offsets`` default to the consumer's positions on its assignment (the next record to
        read of each partition). The group metadata goes with them (KIP-447): a consumer
        that lost its partitions in a rebalance cannot commit them (an abortable error). The
        consumer needs ``enable.auto.commit=false`` and should read with
        ``isolation.level=read_committed``. Nothing to send (nothing consumed) is a no-op.
        """
        if self._state is not _State.OPEN:
            raise self._outside("send_offsets()")
        if offsets is None:
            offsets = consumer.position(consumer.assignment())
        chosen = [tp for tp in offsets if tp.offset >= 0]
        if not chosen:
            return
        metadata = consumer.consumer_group_metadata()
        producer = self._producer

        def send(timeout: float) -> None:
            # in a daemon thread, waited for its timeout and a grace at most (librdkafka
            # #5456, #5511: the call can block for ever once the group coordinator died)
            done, _ = bounded_call(
                lambda: producer.send_offsets_to_transaction(chosen, metadata, timeout),
                timeout + _STUCK_GRACE_S,
                name="kresilient-txn-send-offsets",
            )
            if not done:
                raise _Stuck(timeout + _STUCK_GRACE_S)

        try:
            self._call("send_offsets_to_transaction", send)
        except _Stuck as stuck:
            self._stuck("send_offsets_to_transaction", float(stuck.args[0]))
        self._registered = True  # AddOffsetsToTxn answered: the coordinator holds it

    def _stuck(self, call: TransactionCall, waited: float) -> None:
        """``call`` is blocked inside librdkafka: the open transaction cannot commit (the
        commit was never asked). The instance is left to the blocked thread, never touched
        again (a purge or destroy beside a call in progress is not safe), and a new one
        replaces it: its init_transactions() bumps the epoch, which fences whatever the old
        one still sends and has the coordinator abort its transaction. Raises
        :class:`~kresilient.KafkaClientError` (the transaction's records are to be redone)."""
        kerr = KafkaError(
            KafkaError._TIMED_OUT,
            f"{call} did not return within {waited:g} s (librdkafka #5456/#5511: blocked "
            "after the group coordinator's broker went away)",
            retriable=True,
        )
        exc = KafkaException(kerr)
        verdict = classify_transaction_error(exc, call)
        self._log.error(
            "transaction_call_stuck",
            call=call,
            waited_s=round(waited, 3),
            note="the librdkafka instance is abandoned to the blocked call and replaced; the "
            "transaction is not committed and its records are redone",
        )
        self._replace(f"{call} blocked for {waited:g} s", abandon=True)
        raise self._error(
            KafkaClientError,
            exc,
            verdict,
            f"{call} blocked; the transaction was not committed (the instance was replaced)",
        ) from exc

    def close(self, timeout: float | None = None) -> None:
        """Abort an open transaction, deliver what is queued outside one, release the client.

        Bounded by ``timeout`` seconds (the constructor's ``timeout`` when ``None``), a frozen
        broker included: what librdkafka has not finished by then is left to a daemon thread
        (one ``close_timed_out`` WARNING). Never builds a new instance: an abort that fails
        here is left to the next owner's ``init_transactions()``, which aborts the open
        transaction. Idempotent."""
        if self._state in (_State.CLOSED, _State.FENCED):
            return
        bound = self._timeout if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + bound
        self._closing = True
        aborted = True
        try:
            if self._state is _State.OPEN:
                aborted = False
                with contextlib.suppress(KResilientError):
                    self._abort("close() with a transaction open", timeout=bound)
                    aborted = True
        finally:
            if not self.fenced:  # fenced during the abort: stays fenced
                self._state = _State.CLOSED
            self._release("close", max(0.0, deadline - time.monotonic()), deliver=aborted)
            self._log.debug(
                "transactional_producer_closed",
                committed=self.committed,
                aborted=self.aborted,
                recreations=self.recreations,
            )

    def __enter__(self) -> TransactionalProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TransactionalProducer(transactional_id={self._scrub(self.transactional_id)!r}, "
            f"state={self._state.value})"
        )

    # ------------------------------------------------------------------ the instance

    def _new_instance(self) -> Any:
        return Producer(
            {
                **self._cfg,
                "on_delivery": self._on_delivery,
                "error_cb": self._on_error,
                "logger": self._bridge,
            }
        )

    def _release(self, what: str, bound: float, *, deliver: bool = False) -> None:
        """Drop the librdkafka instance: flush it (``deliver``, outside a transaction) or
        purge it, then destroy it, in a daemon thread waited for ``bound`` seconds at most
        (rd_kafka_destroy and a flush can block on a frozen broker). Its only reference is
        ``held``: when the wait ends early, the daemon thread destroys it later."""
        held = [self._producer]
        self._producer = None
        if held[0] is None:
            return

        def release() -> None:
            if deliver:
                held[0].flush(bound)
            else:
                drain(held[0])
            held.clear()

        done, _ = bounded_call(release, bound, name="kresilient-txn-release")
        if not done:
            self._log.warning(
                "close_timed_out",
                client="TransactionalProducer",
                step=what,
                waited_s=round(bound, 3),
                note="librdkafka did not release the instance in time; it is left to a daemon "
                "thread (an open transaction is aborted by the next init_transactions() of "
                "this transactional.id, or by the coordinator after transaction.timeout.ms)",
            )

    def _init(self) -> None:
        """``init_transactions()`` on the current instance (retried within ``timeout``)."""
        self._call("init_transactions", lambda t: self._producer.init_transactions(t))
        self._state = _State.READY

    def _ready(self) -> None:
        if self._state is _State.OPEN:
            raise KResilientError(
                "a transaction is already open on this producer: one at a time (nested "
                "transaction() blocks are not supported)"
            )
        if self._state is _State.FENCED:
            raise self._refused_fenced(
                f"transactional.id {self._scrub(self.transactional_id)!r} was (or may have "
                "been) taken over by another producer instance: this one is fenced and closed"
            )
        if self._state is _State.CLOSED or self._producer is None:
            closed_by = self._closed_by
            if closed_by is not None:
                # a fatal error closed it (librdkafka#4849: an abort refused with
                # INVALID_TXN_STATE...): the same error class again, so a caller that treats
                # FatalProducerError as "stop" never retries a closed producer for ever
                raise FatalProducerError(
                    f"the transactional producer was closed by a fatal error: {closed_by}",
                    code=closed_by.code,
                    name=closed_by.name,
                    classification=closed_by.classification,
                ) from closed_by
            raise KResilientError("the transactional producer is closed")
        if self._state is _State.NEEDS_INIT:
            self._init()

    def _replace(self, why: str, *, abandon: bool = False) -> None:
        """Drop the librdkafka instance and build a new one with the same transactional.id.

        The new instance's ``init_transactions()`` bumps the producer epoch: the coordinator
        then refuses every request of the old one (a late EndTxn included) and aborts its
        open transaction, unless the old commit already reached the coordinator. When the
        init cannot complete now (the coordinator unreachable), the next transaction()
        retries it: no transaction ever starts on the old epoch. ``abandon``: a thread is
        blocked in a call of the old instance; it keeps the instance (released when the
        call returns, if ever) and nothing else touches it."""
        self._state = _State.NEEDS_INIT
        if abandon:
            self._producer = None
        else:
            # purge what it still holds; never close(): that would abort/flush
            self._release(f"replace ({why})", _RELEASE_TIMEOUT)
        self._fatal_cause = self._fence_seen = None  # those were the old instance's
        self._producer = self._new_instance()
        self.recreations += 1
        self._log.warning("transactional_producer_recreated", why=why, recreations=self.recreations)
        self._replacing = True
        try:
            self._init()
        except ProducerFencedError:
            raise
        except FatalProducerError:
            raise  # _fatal() closed the producer: a new instance failed fatally at once
        except KResilientError as exc:
            self._log.warning(
                "transactional_producer_init_deferred",
                error=str(exc),
                note="init_transactions() of the new instance did not complete; the next "
                "transaction() calls it again",
            )
        finally:
            self._replacing = False

    # ------------------------------------------------------------------ the calls

    def _call(
        self, call: TransactionCall, fn: Callable[[float], None], timeout: float | None = None
    ) -> None:
        """Run one transaction call; retriable errors again until ``timeout`` (the
        constructor's when ``None``); an abortable one aborts (after a commit) or raises
        :class:`TransactionAbortedError`."""
        limit = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        delay = 0.05
        while True:
            remaining = deadline - time.monotonic()
            try:
                fn(max(remaining, 0.001))
                return
            except KafkaException as exc:
                if call in _EPOCH_CALLS and _code(exc) in _UNANSWERED_CODES:
                    self._unanswered = True
                verdict = classify_transaction_error(exc, call)
                if verdict.kind is TransactionErrorKind.FATAL:
                    self._fatal(verdict, exc, call)
                if verdict.kind is TransactionErrorKind.ABORTABLE:
                    self._abortable(verdict, exc, call)
                if time.monotonic() + delay >= deadline:
                    if call in ("commit_transaction", "abort_transaction"):
                        # retried until the deadline: its EndTxn may have been sent meanwhile
                        self._fatal(_unknown_outcome(verdict, call, limit), exc, call)
                    raise self._error(
                        KafkaClientError,
                        exc,
                        verdict,
                        f"{call} still failing after {limit:g} s",
                    ) from exc
                self._log.debug(
                    "transaction_call_retried", call=call, error=verdict.classification.name
                )
                time.sleep(delay)  # backoff between attempts, bounded by the deadline
                delay = min(delay * 2, 1.0)

    def _commit(self) -> None:
        self._producer.poll(0)
        self._call("commit_transaction", lambda t: self._producer.commit_transaction(t))
        self._state = _State.READY
        self.committed += 1

    def _abort(self, why: str, timeout: float | None = None) -> None:
        limit = self._timeout if timeout is None else timeout
        waited = self._await_registration(min(_REGISTRATION_WAIT_S, limit / 2))
        self._call(
            "abort_transaction",
            lambda t: self._producer.abort_transaction(t),
            max(limit - waited, 0.001),
        )
        self._serve()  # the log lines and delivery reports of the aborted transaction
        self._state = _State.READY
        self.aborted += 1
        self._log.info("transaction_aborted", why=why)
        if self._closing:
            return
        if self._refused:
            # librdkafka 2.16 keeps the sequence numbers of a batch the broker refused
            # (MSG_SIZE_TOO_LARGE...) after the abort: the next transaction then fails with
            # OUT_OF_ORDER_SEQUENCE_NUMBER (seen on the real cluster). A new instance starts
            # with a new epoch and fresh sequences.
            self._replace("records refused by the broker in the aborted transaction")
        elif self._unanswered:
            # A request of the aborted transaction was sent and not answered. (1) A produce
            # request: librdkafka puts its records back in the partition's queue as
            # "possibly persisted", the abort purges them and advances the epoch's base
            # msgid past them, so the NEXT transaction's first batch to that partition reuses
            # their sequence numbers on the same epoch; if the broker had written the aborted
            # batch, it answers DUPLICATE_SEQUENCE_NUMBER, which librdkafka takes for success:
            # the batch is dropped and the transaction commits without it (its offsets past
            # its records). (2) An AddOffsetsToTxn/TxnOffsetCommit/EndTxn the broker processes
            # late joins the next transaction of the same epoch (no KIP-890 epoch per
            # transaction, librdkafka #5423). A new instance starts a new epoch with fresh
            # sequence numbers, and the broker's transaction verification (KIP-890 part 1)
            # refuses requests of the old one.
            self._replace("a request of the aborted transaction went unanswered")

    def _await_registration(self, bound: float) -> float:
        """Before an abort: wait up to ``bound`` seconds until the coordinator is known to
        hold the open transaction; the seconds waited.

        librdkafka#4849: a record queued right after a commit makes librdkafka send
        AddPartitionsToTxn, which the coordinator refuses (CONCURRENT_TRANSACTIONS) while it
        still writes the committed transaction's markers; librdkafka then counts the request
        as sent and, on an abort, sends EndTxn for a transaction the coordinator never began.
        The coordinator, in CompleteCommit, refuses it with INVALID_TXN_STATE, a fatal error
        that closes the instance (seen in CI, and 10 times in 10 on the real cluster with
        the markers slowed by 150 ms: tests/test_transactions.py). A record is only sent
        once its partition is registered, so its first delivery report from a broker (or
        offsets added with :meth:`send_offsets`) proves the transaction is open at the
        coordinator, where an abort is valid. An abort before any record was sent is not
        affected: librdkafka then sends no EndTxn at all. Not waited: a transaction already
        failed (librdkafka's abortable state, whose records may never be sent), a fatal
        error, or no record left queued or in flight. Bounded: with the coordinator
        unreachable the abort goes ahead after ``bound`` (and meets what it meets)."""
        producer = self._producer

        def settled() -> bool:
            # len(): records queued or in flight and reports not served yet; none left
            # means nothing was produced or every report was served (a local failure
            # proves nothing: go ahead)
            return (
                self._registered
                or self._txn_failed
                or self._fatal_cause is not None
                or len(producer) == 0
            )

        if settled():
            return 0.0
        started = time.monotonic()
        deadline = started + bound
        with contextlib.suppress(KafkaException, SystemError):
            while not settled():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._log.debug("transaction_abort_unregistered", waited_s=round(bound, 3))
                    break
                producer.poll(min(remaining, 0.05))
        return time.monotonic() - started

    def _abortable(self, verdict: TransactionVerdict, exc: KafkaException, call: str) -> None:
        if call == "commit_transaction" or self._state is _State.OPEN:
            self._abort(f"{call}: {verdict.classification.name}")
        raise self._error(
            TransactionAbortedError,
            exc,
            verdict,
            f"{call} failed, the transaction was aborted (nothing of it is visible to "
            "read_committed readers): run it again",
        ) from exc

    def _serve(self) -> None:
        """Serve the callbacks librdkafka queued (error_cb, delivery reports) now."""
        if self._producer is not None:
            with contextlib.suppress(KafkaException, SystemError):
                self._producer.poll(0)

    def _cause(
        self, verdict: TransactionVerdict, exc: KafkaException, call: TransactionCall
    ) -> tuple[TransactionVerdict, KafkaException]:
        """The verdict on the fatal error's real cause when librdkafka named it.

        A call after a fatal error raises a bare ``_FATAL`` ("Local: Fatal error"); the cause
        reaches error_cb (``err.fatal()``), or a delivery report says fenced, possibly only
        once their callbacks are served. Returns ``(verdict, exc)``."""
        if verdict.fenced and verdict.classification.code in FENCED_CODES:
            return verdict, exc  # the cause is named already
        self._serve()
        cause = self._fatal_cause
        if cause is None and self._fence_seen is not None:
            seen = self._fence_seen
            cause = KafkaError(seen.code(), seen.str(), fatal=True)
        if cause is None:
            return verdict, exc
        named = classify_transaction_error(cause, call)
        return named, KafkaException(cause)

    def _fatal(
        self, verdict: TransactionVerdict, exc: KafkaException, call: TransactionCall
    ) -> None:
        """Stop (fenced or possibly fenced, or any fatal error), or replace the instance (an
        outcome-unknown commit or abort: this process is known to own the id)."""
        raised = verdict.classification.name
        verdict, exc = self._cause(verdict, exc, call)
        if verdict.kind is not TransactionErrorKind.FATAL:  # the cause, named, is fatal
            verdict = dataclasses.replace(verdict, kind=TransactionErrorKind.FATAL)
        if verdict.fenced:
            self._state = _State.FENCED
            if not self._closing:  # close() releases it within its own bound
                self._release(f"fenced ({call})", _RELEASE_TIMEOUT)
            error = self._error(
                ProducerFencedError,
                exc,
                verdict,
                f"{call}: {verdict.reason}"
                + ("" if raised == verdict.classification.name else f" (the call raised {raised})"),
            )
            self._log.error(
                "transactional_producer_fenced",
                call=call,
                error=verdict.classification.name,
                note="another instance initialised this transactional.id: this one is a zombie "
                "and stops; its open transaction was aborted by the broker",
            )
            raise error from exc
        if verdict.outcome_unknown:
            error = self._error(
                TransactionOutcomeUnknownError, exc, verdict, f"{call}: {verdict.reason}"
            )
        else:
            error = self._error(
                FatalProducerError,
                exc,
                verdict,
                f"{call}: {verdict.reason}"
                + (
                    "" if call == "abort_transaction" else "; the open transaction is not committed"
                ),
            )
        self._log.error(
            "transactional_producer_fatal",
            call=call,
            error=verdict.classification.name,
            outcome_unknown=verdict.outcome_unknown,
            recreate=verdict.recreate and not self._closing and not self._replacing,
        )
        if self._closing:
            self._state = _State.CLOSED  # close() releases the instance, bounded
        elif verdict.recreate and not self._replacing:
            self._replace(f"{call}: {verdict.classification.name}")
        else:
            self._state = _State.CLOSED
            self._closed_by = error if isinstance(error, FatalProducerError) else None
            self._release(f"fatal ({call})", _RELEASE_TIMEOUT)
        raise error from exc

    def _error(
        self,
        cls: type[KafkaClientError],
        exc: KafkaException,
        verdict: TransactionVerdict,
        what: str,
    ) -> KafkaClientError:
        kerr = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        text = self._scrub(kerr.str() if kerr is not None else str(exc))
        failed = ""
        if self._failures:
            topic, partition, err = self._failures[0]
            failed = (
                f"; {self._failed} record(s) not delivered, the first to {topic}[{partition}]: "
                f"{err.name()}"
            )
        return cls(
            f"transactional.id {self._scrub(self.transactional_id)!r}: {what} ({text}){failed}",
            code=verdict.classification.code,
            name=verdict.classification.name,
            classification=verdict.classification,
        )

    def _refused_fenced(self, what: str) -> ProducerFencedError:
        """A call refused after fencing: the classification says stop, never recreate."""
        verdict = classify_transaction_error(
            KafkaError(KafkaError._FENCED, "fenced", fatal=True), "begin_transaction"
        )
        c = verdict.classification
        return ProducerFencedError(what, code=c.code, name=c.name, classification=c)

    def _outside(self, what: str) -> KResilientError:
        if self._state is _State.FENCED:
            return self._refused_fenced(
                f"{what}: the producer was fenced (transactional.id "
                f"{self._scrub(self.transactional_id)!r} taken over, or possibly)"
            )
        return KResilientError(
            f"{what} outside a transaction: call it inside `with producer.transaction():`"
        )

    # ------------------------------------------------------------------ callbacks

    def _on_line(self, text: str) -> None:
        """Each librdkafka log line (served by poll()): a request of the open transaction
        sent and not answered marks it (see :meth:`_abort`)."""
        if self._state is _State.OPEN and _UNANSWERED_LINE.search(text):
            self._unanswered = True
        if self._state is _State.OPEN and _FAILED_LINE.search(text):
            self._txn_failed = True

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None or err.code() > 0:
            # a broker wrote or answered it: its partition was registered (a local error,
            # a negative code, says nothing of that)
            self._registered = True
        if err is not None:
            if err.code() in FENCED_CODES and self._fence_seen is None:
                self._fence_seen = err
            self._failed += 1
            if err.code() not in _PURGED:
                self._refused = True
            if len(self._failures) < _KEPT_FAILURES:
                self._failures.append((msg.topic(), msg.partition(), err))
            self._log.debug(
                "transaction_record_failed",
                topic=msg.topic(),
                partition=msg.partition(),
                error=err.name(),
            )
        user = self._user_cb["on_delivery"]
        if user is not None:
            user(err, msg)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            if self._fatal_cause is None:
                self._fatal_cause = err
            self._log.error(
                "kafka_fatal_error", error=err.name(), message=self._scrub(err.str() or "")
            )
        else:
            self._log.debug("kafka_error", error=err.name(), message=self._scrub(err.str() or ""))
        user = self._user_cb["error_cb"]
        if user is not None:
            user(err)
