"""Handler output: ``Output`` records, and consume-transform-produce in Kafka transactions.

A handler of :class:`~kresilient.ResilientConsumer` may return ``None``, one :class:`Output`
or an iterable of them. With ``transactions=TransactionPolicy(...)`` the
:class:`TransactionalBatches` collaborator writes, in ONE Kafka transaction per group of
batches (up to ``max_records`` records or ``max_interval_s`` seconds): the handlers' output
records, the dead letters of the records given up on (the same bytes the
:class:`~kresilient.deadletter.DeadLetterWriter` writes), the records moved to a retry tier
(``retry_topics=``: the same record the non-transactional consumer writes,
:func:`~kresilient.consumer._retrytopics.retry_record`), and the consumed offsets
(``send_offsets_to_transaction`` with the group metadata, KIP-447). All of it commits, or none
of it (docs/transactions.md, "Consume-transform-produce with ResilientConsumer").

What happens on a failure:

- a handler raising a retriable exception: the transaction is aborted, every partition of it
  rewound to the transaction's first record, and the batch redone after the ``RetryPolicy``'s
  wait (what Spring's ``KafkaTransactionManager`` does); once the policy is exhausted (or at
  once for an exception it does not retry) the record is dead-lettered inside the transaction;
- an abortable transaction error (``TransactionAbortedError``): rewound and redone;
- a commit whose outcome is unknown (``TransactionOutcomeUnknownError``: the producer replaced
  its instance): rewound to the group's committed offsets, which say whether it committed;
- fenced (``ProducerFencedError``, or the group fencing this member, ``FENCED_INSTANCE_ID``):
  the consumer stops and ``run()`` raises; a zombie never makes anything visible;
- a rebalance with a transaction open holding records of the revoked partitions (or any loss):
  aborted, and the partitions that stay assigned rewound.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, cast

import tenacity
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from kresilient.consumer._crashloop import is_crash_loop
from kresilient.consumer._failures import log_outage_ended, log_outage_started, next_wait, poison
from kresilient.consumer._holds import TP, LoopState
from kresilient.consumer._offsets import positions_ahead
from kresilient.consumer._outage import OutageDecision, OutageDetector
from kresilient.consumer._retrytopics import (
    KeyBlocked,
    KeyBlocks,
    RetryTopicPolicy,
    RetryView,
    next_tier,
    retry_record,
)
from kresilient.deadletter import DeadLetterPolicy, build_dead_letter_record
from kresilient.errors import (
    Classification,
    ConfigError,
    FatalProducerError,
    KafkaClientError,
    KResilientError,
    classify,
)
from kresilient.producer import (
    ProducerFencedError,
    ResilientProducer,
    TransactionAbortedError,
    TransactionalProducer,
    TransactionOutcomeUnknownError,
)

__all__ = [
    "DEFAULT_MAX_INTERVAL_S",
    "DEFAULT_MAX_RECORDS",
    "OUTPUT_CONFIRM_TIMEOUT",
    "TRANSACTIONS_METRIC",
    "AtLeastOnceOutputs",
    "HandlerOutputError",
    "Output",
    "TransactionPolicy",
    "TransactionalBatches",
    "emitting",
    "outputs_of",
]

#: Records per transaction at most. A commit costs a round trip to the transaction and group
#: coordinators (0.1-0.2 s measured) during which the loop waits: 5,000 records per commit
#: drained a backlog at 0.96x the at-least-once consumer, 2,000 at 0.61x, 500 at 0.19x
#: (docs/transactions.md, "Sizing").
DEFAULT_MAX_RECORDS: Final = 5000
#: Seconds a transaction stays open at most: what a live stream's outputs wait, at most, to
#: become visible to read_committed readers (plus the commit itself).
DEFAULT_MAX_INTERVAL_S: Final = 0.5
#: The observable counter of transactions, per ``outcome`` (committed, aborted, fenced).
TRANSACTIONS_METRIC: Final = "kresilient.consumer.transactions"
_SPAN_NAME: Final = "kresilient.transaction"
#: Codes of send_offsets_to_transaction that mean this member was fenced by the group (a
#: static member with the same group.instance.id): a zombie, like a fenced producer.
_GROUP_FENCED: Final = frozenset({KafkaError.FENCED_INSTANCE_ID})
_INSTRUMENTATION: Final = "kresilient"
#: Consume errors after which librdkafka's consumer is unusable for good. Another static
#: member taking this group.instance.id arrives as _FATAL, not flagged fatal (librdkafka
#: 2.x: "Static consumer fenced by other consumer with same group.instance.id").
_CONSUMER_FATAL: Final = frozenset({KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID})
#: Seconds the at-least-once consumer waits at a batch's end for its outputs' deliveries;
#: one not confirmed by then is its record's failure (retried, then dead-lettered).
OUTPUT_CONFIRM_TIMEOUT: Final = 60.0


class HandlerOutputError(KResilientError, TypeError):
    """A handler returned something that is not ``None``, an :class:`Output` or an iterable
    of them, or an Output with a field of the wrong type: the record's failure (a
    ``TypeError``: not retried, dead-lettered)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """One record a handler asks the consumer to write (returned, not produced).

    ``Output(topic, value=None, key=None, headers=None, partition=None)``. With
    ``transactions=`` it is written in the batch's transaction; without, through a
    :class:`~kresilient.ResilientProducer` whose deliveries are confirmed before the batch's
    offsets are committed (at-least-once).

    Example::

        def double(msg):
            return Output("numbers.doubled", value=b"%d" % (2 * int(msg.value())), key=msg.key())
    """

    topic: str
    value: bytes | str | None = None
    key: bytes | str | None = None
    headers: Sequence[tuple[str, bytes | str | None]] | Mapping[str, Any] | None = None
    partition: int | None = None

    def __post_init__(self) -> None:
        """Fields of the wrong type are refused here, in the handler that builds the
        Output (its record's failure: a TypeError, dead-lettered), not in the producer."""
        if not isinstance(self.topic, str) or not self.topic:
            raise HandlerOutputError(f"Output(topic={self.topic!r}): a non-empty str is needed")
        for name in ("value", "key"):
            field = getattr(self, name)
            if field is not None and not isinstance(field, bytes | str):
                raise HandlerOutputError(
                    f"Output({name}=...) for topic {self.topic!r}: bytes, str or None, "
                    f"not {type(field).__name__}"
                )
        if self.partition is not None and (
            not isinstance(self.partition, int) or isinstance(self.partition, bool)
        ):
            raise HandlerOutputError(
                f"Output(partition={self.partition!r}) for topic {self.topic!r}: an int or None"
            )
        headers = self.headers
        if headers is None:
            return
        # exactly what confluent-kafka's produce() takes: a dict, or a list of (name, value)
        # tuples; names str or bytes, values bytes, str or None
        if isinstance(headers, dict):
            items = list(headers.items())
        elif isinstance(headers, list):
            items = headers
        else:
            raise HandlerOutputError(
                f"Output(headers=...) for topic {self.topic!r}: a dict or a list of (name, "
                f"value) tuples, not {type(headers).__name__}"
            )
        for item in items:
            if (
                not isinstance(item, tuple)
                or len(item) != 2
                or not isinstance(item[0], str | bytes)
                or not (item[1] is None or isinstance(item[1], bytes | str))
            ):
                raise HandlerOutputError(
                    f"Output(headers=...) for topic {self.topic!r}: each header a (str | bytes, "
                    f"bytes | str | None) tuple, not {item!r:.60}"
                )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransactionPolicy:
    """Consume-transform-produce in Kafka transactions (``ResilientConsumer(transactions=)``).

    Args:
        transactional_id: the stable id of this instance (``<service>-<ordinal>``): a new
            instance with the same id fences the old one, which stops.
        max_records: a transaction is committed once it holds this many consumed records.
        max_interval_s: ... or once it has been open this long (checked between batches and
            while idle). Larger: fewer commits per record (throughput); smaller: output
            visible sooner to ``read_committed`` readers (latency). Measured defaults:
            docs/transactions.md, "Sizing".
        timeout: seconds each transaction call may take (``TransactionalProducer(timeout=)``):
            a commit still unfinished then has an unknown outcome (the consumer rewinds to
            its committed offsets).
        producer_config: overrides of the transactional producer's config (derived from the
            consumer's: connection and security keys).
    """

    transactional_id: str
    max_records: int = DEFAULT_MAX_RECORDS
    max_interval_s: float = DEFAULT_MAX_INTERVAL_S
    timeout: float = 60.0
    producer_config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.transactional_id:
            raise ConfigError("TransactionPolicy(transactional_id=) must not be empty")
        if self.max_records < 1 or not self.max_interval_s > 0 or not self.timeout > 0:
            raise ConfigError(
                "TransactionPolicy: max_records >= 1, max_interval_s > 0 and timeout > 0",
                key="transactions",
            )

    def replace(self, **changes: Any) -> TransactionPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)


def _where(msg: Any) -> str:
    return f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"


def outputs_of(result: object, msg: Any, *, strict: bool = True) -> tuple[Output, ...]:
    """The :class:`Output` records of a handler's ``result`` for ``msg``.

    ``strict``: anything else raises :class:`HandlerOutputError` naming the record. Not
    strict (the at-least-once consumer, where handlers returned anything before): only an
    iterable mixing outputs with other values is refused; other values mean no output."""
    if result is None:
        return ()
    if isinstance(result, Output):
        return (result,)
    if isinstance(result, str | bytes | bytearray | memoryview | Mapping) or not isinstance(
        result, Iterable
    ):
        if not strict:
            return ()
        raise HandlerOutputError(
            f"the handler returned a {type(result).__name__} for {_where(msg)}: return None, "
            "an Output or an iterable of Output"
        )
    items = tuple(cast(Iterable[object], result))
    bad = next((item for item in items if not isinstance(item, Output)), _NO_BAD)
    if bad is not _NO_BAD and (strict or any(isinstance(i, Output) for i in items)):
        raise HandlerOutputError(
            f"the handler returned a {type(bad).__name__} among its outputs for {_where(msg)}: "
            "every item must be an Output"
        )
    return cast(tuple[Output, ...], items) if bad is _NO_BAD else ()


#: ``outputs_of``'s "no bad item" (``None`` is a bad item: ``[Output(...), None]``).
_NO_BAD: Final = object()


class _Redo(Exception):
    """Abort the open transaction, rewind, and redo after ``wait`` seconds."""

    def __init__(self, why: str, wait: float = 0.0) -> None:
        super().__init__(why)
        self.why = why
        self.wait = wait


class _Failure:
    """A record's failed attempts so far (kept across the redone transactions)."""

    __slots__ = ("attempts", "mark", "outage", "state")

    def __init__(self, retrying: tenacity.Retrying, mark: int) -> None:
        self.state = tenacity.RetryCallState(retrying, None, (), {})
        self.outage: tenacity.RetryCallState | None = None
        self.attempts = 0
        self.mark = mark


class _TxnSink:
    """What :func:`write_dead_letter` needs of a sink: the dead letter into the open
    transaction (``headers`` byte for byte, the record's timestamp kept as the writer does)."""

    span_kind: Final = "producer"

    def __init__(self, producer: TransactionalProducer) -> None:
        self._producer = producer

    def send(self, record: Any) -> None:
        self._producer.produce(
            record.topic,
            record.value,
            record.key,
            headers=record.headers,
            timestamp=record.timestamp or 0,
        )


class TransactionalBatches:
    """The consumer's collaborator for ``transactions=``: batches handled in transactions.

    Owns the :class:`~kresilient.TransactionalProducer` (closed with it). Called on the loop
    thread only (``process``, ``tick``) and from the rebalance callbacks librdkafka serves
    inside ``consume()`` on that same thread.
    """

    def __init__(
        self,
        *,
        consumer: Any,
        producer: TransactionalProducer,
        policy: TransactionPolicy,
        call: Callable[[Any], object],
        dead_letter: DeadLetterPolicy | None,
        retrying: tenacity.Retrying,
        outage_retrying: tenacity.Retrying | None,
        detector: OutageDetector | None,
        deser: Any,
        breaker: Any,
        dedupe: Any,
        tel: Any,
        state: LoopState,
        consume_error: Callable[[Any], None],
        group: str,
        log: Any,
        redact: Callable[[str], str],
        tracer_provider: Any = None,
        on_committed: Callable[[Mapping[TP, int]], None] | None = None,
        retry_topics: RetryTopicPolicy | None = None,
        retry_map: Mapping[str, tuple[str, int]] | None = None,
        probing: Callable[[TP], bool] | None = None,
    ) -> None:
        self._consumer = consumer
        #: crash-loop protection: whether a partition is probed after an unclean end. Each of
        #: its records then commits in a transaction of its own, so its progress is durable
        #: before the next record's marker, as without transactions: a death aborts only
        #: the record in flight, a crash-loop dead letter commits before the next record
        #: runs, and each restart moves on past what it probed (review 11, #2 and #3)
        self._probing = probing
        self._retry_topics = retry_topics
        #: retry topic -> (source topic, 0-based tier): the consumer subscribes to them
        self._retry_map: dict[str, tuple[str, int]] = dict(retry_map or {})
        #: retry-topic partitions whose next record is not due: (monotonic due, its offset);
        #: paused and sought back to it, resumed by ``tick`` (no transaction waits for them)
        self._deferred: dict[TP, tuple[float, int]] = {}
        #: records moved to a retry topic in the open transaction / in committed ones
        self._moving = 0
        self.moved = 0
        #: ``RetryTopicPolicy(ordered=True)``: the keys blocked behind a record in a retry
        #: topic. Memory beside the transaction, so kept in step with it: a snapshot taken
        #: when a transaction begins is put back when it does not commit (its moves hidden,
        #: its records redone), dropped when it does
        self._keys: KeyBlocks | None = (
            KeyBlocks(self._retry_map)
            if retry_topics is not None and retry_topics.ordered
            else None
        )
        #: records whose outputs were half written when they failed, moved in the redo
        self._to_move: dict[tuple[str, int, int], BaseException] = {}
        self._on_committed = on_committed
        self.producer = producer
        self._policy = policy
        self._call = call
        self._dlq = dead_letter
        self._retrying = retrying
        self._outage_retrying = outage_retrying
        self.detector = detector
        self._deser = deser
        self._breaker = breaker
        self._dedupe = dedupe
        self._tel = tel
        self._state = state
        self._consume_error = consume_error
        self._group = group
        self._log = log.bind(transactional_id=redact(policy.transactional_id))
        self._redact = redact
        self._sink = _TxnSink(producer)
        self._max_records = policy.max_records
        #: records per transaction now: halved after an aborted commit (to find the record
        #: whose output the broker refuses), doubled back after each commit
        self._limit = policy.max_records
        self._last: tuple[str, int, int] | None = None  #: the last record handled
        self._max_interval = policy.max_interval_s
        self._topics_known: set[str] = set()  # output topics the cluster said exist
        txn_timeout = (policy.producer_config or {}).get("transaction.timeout.ms", 60000)
        try:
            self._txn_timeout_s = float(txn_timeout) / 1000.0
        except (TypeError, ValueError):
            self._txn_timeout_s = 60.0
        self._cm: AbstractContextManager[Any] | None = None  # the open transaction
        self._started = 0.0
        self._records = 0
        self._first: dict[TP, int] = {}  #: each partition's first offset in the transaction
        self._next: dict[TP, int] = {}  #: each partition's offset to commit
        #: each partition's offset this owner committed last (advance_idle moves it)
        self._committed_at: dict[TP, int] = {}
        self._done: list[Any] = []  #: records processed in it (dedupe marks them at commit)
        self._dead: int = 0  #: dead letters in it
        self._ok: int = 0  #: records handled in it (``processed`` once it commits)
        #: records of it that had failed before (their attempts end when it commits)
        self._settled: list[tuple[str, int, int]] = []
        self._failures: dict[tuple[str, int, int], _Failure] = {}
        self._doomed: dict[tuple[str, int, int], tuple[BaseException, Classification, int]] = {}
        #: partitions rewound by a rebalance callback: messages of them returned by the same
        #: consume() call are stale (fetched before the seek)
        self.rewound: dict[TP, int] = {}
        self._rewind: dict[TP, int] = {}  #: where the last failed commit rewound to
        self._paused: list[TopicPartition] = []
        self._resume_at = 0.0
        self._span: Any = None
        self._tracer_provider = tracer_provider
        self._tracer: Any = None
        self.committed = 0
        self.aborted = 0
        self.fenced = False
        self.dead_lettered = 0
        #: fencing found inside a rebalance callback (raised by the loop, not in consume())
        self.fatal: BaseException | None = None

    @property
    def open(self) -> bool:
        """A transaction is open."""
        return self._cm is not None

    @property
    def blocked_keys(self) -> int:
        """Keys held behind a record in a retry topic (``RetryTopicPolicy(ordered=True)``)."""
        return len(self._keys) if self._keys is not None else 0

    def committed_position(self, tp: TP) -> int | None:
        """Where ``tp``'s committed progress is: the first offset of the open transaction
        for it (every record before it committed), else the offset this owner committed
        last; ``None``: not known here."""
        first = self._first.get(tp)
        return first if first is not None else self._committed_at.get(tp)

    # ------------------------------------------------------------------ the loop's calls

    def timeout(self, timeout: float) -> float:
        """The loop's consume() timeout: bounded by the open transaction's remaining time
        and by the next deferred retry record's due time."""
        if self._deferred:
            # at least 50 ms: a resume whose seek failed is tried again, not spun on
            due = min(d for d, _ in self._deferred.values())
            timeout = min(timeout, max(0.05, due - time.monotonic()))
        if self._cm is None:
            return timeout
        return max(0.0, min(timeout, self._started + self._max_interval - time.monotonic()))

    def tick(self, now: float) -> None:
        """Between consume() calls: commit an open transaction past its interval, resume the
        partitions held for a redo's wait."""
        if self._paused and now >= self._resume_at:
            self._resume()
        if self._deferred:
            self._resume_due(now)
        if self._cm is not None and now - self._started >= self._max_interval:
            self.commit()

    def advance_idle(self) -> None:
        """Idle (the last consume() returned nothing): commit each partition this owner
        committed before at the consumer's position when that is ahead, in a transaction
        holding only those offsets. The position passes a transaction's commit or abort marker
        that no record arrives for (a transactional source topic; the retry topics this
        consumer writes in its own transactions), so the committed offset would otherwise stay
        one below the end for good: lag 1, a false stall (and, with ``on_stall="heal"``, a
        heal for nothing). Not while a transaction is open or a redo waits; a partition with
        a deferred retry record keeps its offset."""
        if self._cm is not None or self._paused or self.fenced or not self._committed_at:
            return
        try:
            assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        except (KafkaException, RuntimeError):
            return
        asked = [tp for tp in self._committed_at if tp in assigned and tp not in self._deferred]
        ahead = positions_ahead(self._consumer, asked, self._committed_at, self._log, self._redact)
        if not ahead:
            return
        try:
            self._begin()
        except _Redo:
            return  # the producer not ready (a replaced instance's init): the next idle call
        for tp, position in ahead.items():
            self._first.setdefault(tp, position)
            self._next[tp] = position
        self.commit()

    def drop_rewound(self, msgs: list[Message]) -> list[Message]:
        """Drop messages of partitions a rebalance callback rewound during these consume()
        calls, and seek those partitions again (a later call of the same iteration may have
        returned records from the rewound offset: dropped too, so fetched again)."""
        rewound, self.rewound = self.rewound, {}
        if not rewound:
            return msgs
        kept = [m for m in msgs if (m.topic(), m.partition()) not in rewound]
        if len(kept) != len(msgs):
            self._seek(rewound)
        return kept

    def process(self, msgs: list[Message]) -> None:
        """Handle ``msgs`` in the open transaction (begun at the first record)."""
        state = self._state
        index = 0
        n = len(msgs)
        retry_map = self._retry_map
        held: set[TP] = set()  # deferred partitions whose later records are dropped here
        try:
            while index < n:
                msg = msgs[index]
                index += 1
                error = msg.error()
                if error is not None:
                    if error.code() in _CONSUMER_FATAL:
                        self._consumer_fatal(error)
                    self._consume_error(msg)
                    continue
                if retry_map and self._held(msg, held):
                    continue
                if self._cm is None:
                    self._begin()
                probed = self._probing is not None and self._probing(
                    (msg.topic(), msg.partition())  # type: ignore[arg-type]
                )
                self._one(msg)
                if (
                    probed
                    or self._records >= self._limit
                    or time.monotonic() - self._started >= self._max_interval
                ) and not self.commit():
                    self._give_back(msgs[index:], skip=self._rewind)
                    return
                if state.interrupt:
                    break
        except _Redo as redo:
            self._redo(redo, msgs[index - 1 :])
            return
        except TransactionAbortedError as exc:
            # produce() met the transaction librdkafka must abort (a record the broker
            # refused): the producer aborted it already; rewound and redone
            self._redo(
                _Redo(f"{type(exc).__name__}: {self._redact(str(exc))[:300]}"), msgs[index - 1 :]
            )
            return
        except ProducerFencedError as exc:
            if self.fenced:  # said and counted where it was found (a commit)
                raise
            cm, self._cm = self._cm, None
            if cm is not None:
                self._close_block(cm, exc)
            self._end_span("fenced", str(exc))
            self._fenced(exc)
        except BaseException:
            self._give_back(msgs[index - 1 :])
            self.abort("stopping")
            raise
        if index < n:  # interrupted (stop, watchdog overrun): the rest is fetched again
            self._give_back(msgs[index:])
        if state.overrun:
            state.overrun = False
            state.interrupt = state.stop_requested
        if self._cm is not None and time.monotonic() - self._started >= self._max_interval:
            self.commit()

    # ------------------------------------------------------------------ one record

    def _one(self, msg: Message) -> None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        self._first.setdefault(tp, offset)
        key = self._last = (topic, partition, offset)
        doomed = self._doomed.pop(key, None) if self._doomed else None
        moving = self._to_move.pop(key, None) if self._to_move else None
        if doomed is not None:  # its outputs could not be written: dead-lettered at once
            self._dead_letter(msg, *doomed)
        elif moving is not None:  # the same, but its failure goes to a retry topic
            self._move(msg, key, moving, 0)
        elif (
            (keys := self._keys) is not None
            and keys.blocked
            and (tier := keys.route(msg)) is not None
        ):  # ordered: behind the earlier record of its key, in its retry tier
            self._follow(msg, key, tier)
        elif self._dedupe is not None and self._dedupe.is_duplicate(self._original(msg)):
            self._state.duplicates += 1
            if self._keys is not None and self._keys.blocked:
                self._keys.done(msg)  # done with, like a processed one: its key flows on
        else:
            try:
                if self._state.traced:
                    with self._tel.process_span(msg, group=self._group) as span:
                        self._link(span, topic, partition, offset)
                        outputs = outputs_of(self._call(msg), msg)
                else:
                    outputs = outputs_of(self._call(msg), msg)
            except _Redo:
                raise
            except Exception as exc:
                self._failed(msg, key, exc)
            else:
                self._write(msg, key, outputs)
                if self._keys is not None and self._keys.blocked:
                    self._keys.done(msg)  # ordered: the next record of its key may go
        self._next[tp] = offset + 1
        self._records += 1

    def _write(self, msg: Message, key: tuple[str, int, int], outputs: tuple[Output, ...]) -> None:
        produce = self.producer.produce
        for out in outputs:
            if out.topic in self._topics_known:
                continue
            exists = self.producer.topic_exists(out.topic)
            if exists is False:
                # librdkafka would accept it and fail its delivery after
                # topic.metadata.propagation.max.ms (30 s), aborting the transaction each
                # attempt: the record's failure now, before anything of it is produced
                self._failed(
                    msg,
                    key,
                    KafkaClientError(
                        f"the output topic {out.topic!r} of {_where(msg)} does not exist",
                        code=KafkaError.UNKNOWN_TOPIC_OR_PART,
                        topic=out.topic,
                    ),
                )
                return
            if exists:
                self._topics_known.add(out.topic)
        try:
            for out in outputs:
                produce(out.topic, out.value, out.key, partition=out.partition, headers=out.headers)
        except (ProducerFencedError, TransactionAbortedError, TransactionOutcomeUnknownError):
            raise
        except FatalProducerError:
            raise
        except KResilientError as exc:
            # refused locally (unknown topic, too large ...): the outputs already queued for
            # it are in the transaction, so it is aborted; the record is retried by its
            # policy, and once that gives up it is dead-lettered without calling the handler
            self._failed(msg, key, exc, partial=True)
        else:
            if self._failures and key in self._failures:
                self._settled.append(key)  # its attempts are forgotten once this commits
            if self.detector is not None and self.detector.success():
                log_outage_ended(self._log, self.detector)
            if self._breaker is not None:
                self._breaker.record_successes(1)
            if self._dedupe is not None:
                self._done.append(msg)
            self._ok += 1

    def _failed(
        self, msg: Message, key: tuple[str, int, int], exc: Exception, *, partial: bool = False
    ) -> None:
        """The record failed: redo (raises ``_Redo``) or dead-letter it in the transaction."""
        if is_crash_loop(exc):
            # the process died on it max_process_deaths times (crash-loop protection, its
            # deaths counted in markers committed outside the transactions): no retry, no
            # retry topic, dead-lettered in this transaction without calling the handler
            self._failures.pop(key, None)
            deaths = int(getattr(exc, "deaths", 1))
            self._give_up(msg, key, exc, classify(exc), deaths, partial)
            return
        failure = self._failures.get(key)
        detector = self.detector
        if failure is None:
            failure = self._failures[key] = _Failure(
                self._retrying, detector.mark() if detector is not None else 0
            )
        failure.attempts += 1
        state = failure.state
        state.attempt_number = failure.attempts
        state.set_exception((type(exc), exc, exc.__traceback__))
        classification = classify(exc)
        retrying = self._retrying
        # a failure the retry topics take goes there (after the outage check), in the
        # transaction, instead of redoing the transaction under the RetryPolicy
        to_topic = self._retry_topics is not None and self._retry_topics.retries(exc)
        if not to_topic and not retrying.retry(state):
            self._give_up(msg, key, exc, poison(classification), failure.attempts, partial)
            return
        if detector is not None:
            # a retry-topic record comes due when its tier says, often with others: no new
            # evidence of an outage (as without transactions), but held during one
            if not (self._retry_map and key[0] in self._retry_map) and detector.failure(
                key, error_type=type(exc).__name__, error=self._redact(str(exc))[:500]
            ):
                log_outage_started(self._log, detector, (key[0], key[1]), key[2])
            if detector.active:
                self._outage_redo(msg, key, exc, classification, failure, partial)
        if to_topic:
            if partial:  # its outputs half in the transaction: moved in the redo
                self._to_move[key] = exc
                raise _Redo(f"{_where(msg)}: its outputs could not be written")
            self._move(msg, key, exc, failure.attempts)
            return
        delay = float(retrying.wait(state))
        state.upcoming_sleep = delay
        if not retrying.stop(state):
            state.idle_for += delay
            self._state.retries += 1
            raise _Redo(f"{_where(msg)} failed ({type(exc).__name__}): retried", delay)
        decision = (
            detector.exhausted(failure.mark) if detector is not None else OutageDecision.DEAD_LETTER
        )
        if decision is not OutageDecision.DEAD_LETTER:
            # no record succeeded since its first failure: possibly a dependency outage (no
            # probe of the next record inside a transaction: held under outage_retry)
            self._outage_redo(msg, key, exc, classification, failure, partial)
        self._give_up(msg, key, exc, classification, failure.attempts, partial)

    def _outage_redo(
        self,
        msg: Message,
        key: tuple[str, int, int],
        exc: Exception,
        classification: Classification,
        failure: _Failure,
        partial: bool,
    ) -> None:
        outage = self._outage_retrying
        if outage is None:
            return
        if failure.outage is None:
            failure.outage = tenacity.RetryCallState(outage, None, (), {})
        failure.outage.attempt_number += 1
        wait = next_wait(outage, failure.outage, exc)
        if wait is None:  # the outage limit: dead-lettered
            self._give_up(msg, key, exc, classification, failure.attempts, partial)
            return
        self._state.retries += 1
        raise _Redo(f"{_where(msg)} failed during a dependency outage: held", wait)

    # ------------------------------------------------------------------ retry topics

    def _original(self, msg: Message) -> Any:
        """``msg``, or for a record of a retry topic the original record it stands for."""
        return RetryView(msg) if self._retry_map and msg.topic() in self._retry_map else msg

    def _held(self, msg: Message, held: set[TP]) -> bool:
        """A retry-topic record not due yet: its partition is paused and sought back to it
        until it is (as without transactions: nothing sleeps, no transaction waits for it);
        True for it and for every later record of a deferred partition (fetched again)."""
        tp: TP = (msg.topic(), msg.partition())  # type: ignore[assignment]
        if tp in held:
            return True
        deferred = self._deferred.get(tp)
        if deferred is not None:
            # delivered though paused (a seek raced the fetch): paused and sought again
            held.add(tp)
            self._pause_at(tp, deferred[1])
            return True
        if msg.topic() not in self._retry_map:
            return False
        due_ms = RetryView(msg).due_ms()
        wait = due_ms / 1000.0 - time.time() if due_ms is not None else 0.0
        if wait <= 0:
            return False
        offset = msg.offset()
        assert offset is not None
        self._deferred[tp] = (time.monotonic() + wait, offset)
        held.add(tp)
        self._pause_at(tp, offset)
        self._log.debug(
            "retry_record_deferred", topic=tp[0], partition=tp[1], offset=offset, wait_s=wait
        )
        return True

    def deferred(self) -> Collection[TP]:
        """The retry-topic partitions paused until their record is due (for the probes)."""
        return list(self._deferred)

    def _pause_at(self, tp: TP, offset: int) -> None:
        part = TopicPartition(tp[0], tp[1], offset)
        try:
            self._consumer.pause([part])
            self._consumer.seek(part)
        except KafkaException as exc:  # sought again at its resume
            self._log.debug(
                "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
            )

    def _resume_due(self, now: float) -> None:
        """Resume the deferred retry-topic partitions whose record is due, from it."""
        for tp, (due, offset) in list(self._deferred.items()):
            if now < due:
                continue
            part = TopicPartition(tp[0], tp[1], offset)
            try:
                self._consumer.seek(part)
            except KafkaException as exc:  # resuming without it could skip the record
                self._log.debug(
                    "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
                )
                if not self._assigned(tp):
                    # not this member's any more (a heal, a rebalance callback missed): its
                    # owner reads it from the committed offsets; a stale offset kept here
                    # would redo records committed meanwhile once it came back
                    del self._deferred[tp]
                continue
            del self._deferred[tp]
            if now < self._resume_at and any((p.topic, p.partition) == tp for p in self._paused):
                continue  # a redo's wait (an outage hold) holds it too: _resume() lets it go
            with contextlib.suppress(KafkaException, RuntimeError):
                self._consumer.resume([part])

    def _assigned(self, tp: TP) -> bool:
        try:
            return any((p.topic, p.partition) == tp for p in self._consumer.assignment())
        except (KafkaException, RuntimeError):
            return True  # cannot tell: keep it

    def forget(self, tps: Iterable[TP]) -> None:
        """The librdkafka consumer was recreated (``on_stall="heal"``, no transaction open):
        the new member is assigned anew and reads from the committed offsets, so the
        deferred retry records of ``tps`` are dropped (a stale offset kept would redo records
        another member committed meanwhile); one fetched again is deferred again."""
        for tp in tps:
            self._deferred.pop(tp, None)

    def _move(
        self, msg: Message, key: tuple[str, int, int], exc: BaseException, attempts: int
    ) -> None:
        """Write ``msg`` to its next retry tier inside the open transaction (after the last
        tier: its original record is dead-lettered); the transaction goes on."""
        policy = self._retry_topics
        assert policy is not None
        self._failures.pop(key, None)
        source, tier = next_tier(key[0], self._retry_map)
        if tier >= len(policy.delays):
            self._give_up(msg, key, exc, classify(exc), tier + 1, False)
            return
        raw = self._deser.raw_bytes(msg) if self._deser is not None else None
        record = retry_record(
            msg, policy, source=source, tier=tier, exc=exc, retry_topics=self._retry_map, raw=raw
        )
        self._sink.send(record)
        self._moving += 1
        if self._keys is not None:
            self._keys.moved(msg, tier)  # ordered: later records of its key follow it
        self._log.info(
            "message_moved_to_retry_topic",
            topic=key[0],
            partition=key[1],
            offset=key[2],
            retry_topic=record.topic,
            delay_s=policy.delays[tier],
            attempts=attempts,
            error_type=type(exc).__name__,
            transactional=True,
        )

    def _follow(self, msg: Message, key: tuple[str, int, int], tier: int) -> None:
        """``RetryTopicPolicy(ordered=True)``: write ``msg`` (not handled) to retry tier
        ``tier``, behind the earlier record of its key there, inside the open transaction."""
        policy = self._retry_topics
        assert policy is not None
        retried = self._retry_map.get(key[0])
        source = retried[0] if retried is not None else key[0]
        raw = self._deser.raw_bytes(msg) if self._deser is not None else None
        record = retry_record(
            msg,
            policy,
            source=source,
            tier=tier,
            exc=KeyBlocked("an earlier record of this key is in a retry topic"),
            retry_topics=self._retry_map,
            raw=raw,
        )
        self._sink.send(record)
        self._moving += 1
        self._log.debug(  # per-message traffic, as without transactions
            "message_moved_to_retry_topic",
            topic=key[0],
            partition=key[1],
            offset=key[2],
            retry_topic=record.topic,
            delay_s=policy.delays[tier],
            attempts=0,
            error_type=KeyBlocked.__name__,
            transactional=True,
        )

    def _give_up(
        self,
        msg: Message,
        key: tuple[str, int, int],
        exc: BaseException,
        classification: Classification,
        attempts: int,
        partial: bool,
    ) -> None:
        self._failures.pop(key, None)
        self._log.warning(
            "message_failed",
            topic=key[0],
            partition=key[1],
            offset=key[2],
            attempts=attempts,
            error_type=type(exc).__name__,
            error=self._redact(str(exc) or type(exc).__name__)[:500],
            category=classification.category.value,
            transactional=True,
        )
        if partial:  # its outputs half in the transaction: dead-lettered in the redo
            self._doomed[key] = (exc, classification, attempts)
            raise _Redo(f"{_where(msg)}: its outputs could not be written")
        self._dead_letter(msg, exc, classification, attempts)

    def _dead_letter(
        self, msg: Message, exc: BaseException, classification: Classification, attempts: int
    ) -> None:
        policy = self._dlq
        if policy is None:
            self._log.error(
                "message_failed_without_dead_letter_topic",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                note="the consumer stops; the transaction is aborted, nothing of it committed",
            )
            raise exc
        breaker = self._breaker
        if breaker is not None:
            try:
                breaker.check()
            except KResilientError as opened:
                self._tel.circuit_breaker_opened(
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=msg.offset(),
                    **breaker.snapshot(),
                )
                raise opened from exc
        raw = self._deser.raw_bytes(msg) if self._deser is not None else None
        # a record failing its last retry tier: its ORIGINAL record, to the original's DLQ
        msg = cast(Message, self._original(msg))
        topic = policy.topic_for(msg.topic() or "")
        with self._tel.dead_letter_span(
            topic,
            source=cast(Any, msg),
            reason=exc,
            classification=classification,
            attempts=attempts,
            kind=self._sink.span_kind,
        ):
            carrier = {
                k: v.decode("utf-8") if isinstance(v, bytes) else str(v)
                for k, v in self._tel.inject_headers(None)
                if v
            }
            record = build_dead_letter_record(
                msg,
                policy=policy,
                group=self._group,
                exc=exc,
                attempts=attempts,
                classification=classification,
                raw_key=raw[0] if raw is not None else None,
                raw_value=raw[1] if raw is not None else None,
                raw=raw is not None,
                trace_context=carrier,
                redact=self._redact,
            )
            self._sink.send(record)
        if breaker is not None:
            breaker.record_dead_letter()
        self._dead += 1
        if self._keys is not None and self._keys.blocked:
            self._keys.done(msg)  # ordered: the next record of its key may go

    # ------------------------------------------------------------------ transactions

    def _begin(self) -> None:
        cm = self.producer.transaction()
        try:
            cm.__enter__()
        except FatalProducerError:  # fenced, or closed by a fatal error: the consumer stops
            raise
        except KResilientError as exc:
            # init_transactions() of a replaced instance not done yet (the coordinator
            # unreachable): the batch waits and is tried again
            raise _Redo(f"begin_transaction failed: {self._redact(str(exc))[:300]}", 1.0) from exc
        self._cm = cm
        self._started = time.monotonic()
        self._span = self._start_span()
        if self._keys is not None:
            self._keys.begin()

    def commit(self) -> bool:
        """Commit the open transaction with its offsets; on an abortable error or an unknown
        outcome, rewind (the records are read again) and return False; fenced: raise."""
        cm = self._cm
        if cm is None:
            return True
        self._cm = None
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._next.items()]
        try:
            if offsets:
                self.producer.send_offsets(self._consumer, offsets)
        except BaseException as exc:
            self._close_block(cm, exc)
            self._after_failure(exc, "send_offsets")
            return False
        try:
            cm.__exit__(None, None, None)
        except BaseException as exc:
            self._after_failure(exc, "commit")
            return False
        self._landed(self._next)
        if self._limit < self._max_records:
            self._limit = min(self._max_records, self._limit * 2)
        self._end_span("committed")
        self._reset(committed=True)
        return True

    def _landed(self, offsets: Mapping[TP, int]) -> None:
        """The open transaction committed: what it did counts, ``offsets`` are committed."""
        self.committed += 1
        if self._dedupe is not None:
            for msg in self._done:
                self._dedupe.processed(self._original(msg))
        self.dead_lettered += self._dead
        self.moved += self._moving
        for key in self._settled:
            self._failures.pop(key, None)
        self._note_committed(offsets)
        self._state.processed += self._ok  # counted once committed (a redo handles it again)

    def _note_committed(self, offsets: Mapping[TP, int]) -> None:
        """``offsets`` are the group's committed offsets now. They feed the crash-loop
        markers' position and the clean-end commit (plain commits): a stale one there would
        move the group's offset back past a committed transaction (review 11, #4)."""
        self._committed_at.update(offsets)
        if self._on_committed is not None:
            self._on_committed(offsets)  # the probes' progress and lag, the clean-end commit

    def abort(self, why: str, rewind: Iterable[TP] | None = None) -> None:
        """Abort the open transaction (nothing of it visible); rewind ``rewind`` (default:
        every partition of it) to its first offset. Never raises but for fencing."""
        cm = self._cm
        if cm is None:
            return
        self._cm = None
        targets = {tp: self._first[tp] for tp in (self._first if rewind is None else rewind)}
        targets = {tp: off for tp, off in targets.items() if tp in self._first}
        self._close_block(cm, _Aborting(why))
        self.aborted += 1
        self._end_span("aborted", why)
        self._reset()
        self._seek(targets)
        self._check_fenced()

    def on_revoke(self, partitions: list[TopicPartition], *, lost: bool = False) -> None:
        """A rebalance: abort the open transaction (on a revoke, only if it holds records of
        a revoked partition; always on a loss) and rewind the partitions that stay."""
        gone = {(p.topic, p.partition) for p in partitions}
        for tp in gone:
            self._committed_at.pop(tp, None)
        for attempts in (self._failures, self._doomed, self._to_move):
            # their new owner (or this member, assigned them again) starts their records'
            # attempts afresh from the committed offsets, as without transactions
            for key in [k for k in attempts if (k[0], k[1]) in gone]:
                del attempts[key]
        if self._deferred:
            # their new owner reads them from the committed offsets, paused by no one
            revoked = [tp for tp in self._deferred if tp in gone]
            for tp in revoked:
                del self._deferred[tp]
            with contextlib.suppress(KafkaException, RuntimeError):
                if revoked:
                    self._consumer.resume([TopicPartition(t, p) for t, p in revoked])
        if self._cm is None:
            return
        if not lost and not gone & self._first.keys():
            # none of its records is of a revoked partition (cooperative rebalancing): it
            # goes on; its commit carries the group metadata of the generation then
            return
        staying = {tp: off for tp, off in self._first.items() if tp not in gone}
        try:
            self.abort("partitions lost" if lost else "partitions revoked", rewind=staying)
        except FatalProducerError as exc:  # fenced, or the abort closed the producer
            self.fatal = exc  # raised by the loop (never from inside consume())
            return
        self.rewound.update(staying)

    def finish(self, commit: bool) -> None:
        """At shutdown: commit what was processed (or abort), then close the producer."""
        try:
            if commit and not self.fenced:
                self.commit()
            else:
                self.abort("shutdown after an error")
        finally:
            self.producer.close()

    # ------------------------------------------------------------------ helpers

    def _close_block(self, cm: AbstractContextManager[Any], exc: BaseException) -> None:
        """End the transaction() block with ``exc``: it aborts the transaction if still open
        (a failure of that abort is logged; fencing is checked by the caller)."""
        try:
            cm.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException as failed:  # the block's own error re-raised, or a new one
            if failed is not exc:
                self._log.warning("transaction_abort_failed", error=self._redact(str(failed)))

    def _after_failure(self, exc: BaseException, step: str) -> None:
        """A commit (or its send_offsets) failed: the transaction is not committed."""
        if not isinstance(exc, FatalProducerError) and not self.producer.fenced:
            self._check_fenced()  # the abort that followed closed the producer: stop
        aborted = isinstance(exc, TransactionAbortedError)
        fenced = isinstance(exc, ProducerFencedError) or self.producer.fenced
        if aborted and getattr(exc, "code", None) in _GROUP_FENCED:
            fenced = True
        if fenced:
            self._end_span("fenced", str(exc))
            self._fenced(exc)
        if isinstance(exc, TransactionOutcomeUnknownError):
            # the producer replaced its instance; the group's committed offsets say whether
            # the transaction committed: go on from there
            self._rewind = self._committed(self._first)
            self._seek(self._rewind)
            # it did commit if the group's offsets moved to its end (a transaction commits
            # all of it or none): then it counts as committed, and the blocks it added or
            # released stand
            landed = bool(self._next) and all(
                self._rewind.get(tp, -1) >= offset for tp, offset in self._next.items()
            )
            self._log.warning(
                "transaction_outcome_unknown",
                error=self._redact(str(exc)),
                committed=landed,
                note="rewound to the committed offsets (they committed with the transaction "
                "or not at all)",
            )
            if landed:
                self._landed(self._rewind)
                self._end_span("committed")
            else:
                # the offsets read are the truth either way: a later plain commit (crash-loop
                # marker, clean end) must not carry an older one
                self._note_committed(self._rewind)
                self.aborted += 1
                self._end_span("aborted", f"{step}: {type(exc).__name__}")
            self._reset(committed=landed)
            return
        self.aborted += 1
        self._end_span("aborted", f"{step}: {type(exc).__name__}")
        if isinstance(exc, KResilientError) and not isinstance(exc, FatalProducerError):
            if isinstance(exc, TransactionAbortedError):
                self._bisect(exc)
            self._log.info(
                "transaction_redone",
                step=step,
                records=self._records,
                next_limit=self._limit,
                error=self._redact(str(exc))[:500],
            )
            self._rewind = dict(self._first)
            self._seek(self._rewind)
        else:
            self._reset()
            raise exc
        self._reset()

    def _bisect(self, exc: TransactionAbortedError) -> None:
        """An aborted commit (a record the broker refused, or a transient cause): the redo
        runs transactions of half the size, down to one record; a one-record transaction
        that fails is that record's attempt, and once its ``RetryPolicy`` gives up it is
        dead-lettered (without calling the handler) instead of aborting forever."""
        records, key = self._records, self._last
        self._limit = max(1, records // 2)
        if records != 1 or key is None or not self.producer.refused:
            # an abort for another cause (a rebalance's ILLEGAL_GENERATION at send_offsets,
            # a coordinator timing out) is not the record's: one-record transactions are
            # what a probed partition runs after a crash, and counting those aborts
            # dead-lettered a healthy record without calling its handler (review 16, F1)
            return
        failure = self._failures.get(key)
        if failure is None:
            failure = self._failures[key] = _Failure(self._retrying, 0)
        failure.attempts += 1
        state = failure.state
        state.attempt_number = failure.attempts
        state.set_exception((type(exc), exc, exc.__traceback__))
        retrying = self._retrying
        if retrying.retry(state) and not retrying.stop(state):
            return
        self._failures.pop(key, None)
        self._log.warning(
            "message_failed",
            topic=key[0],
            partition=key[1],
            offset=key[2],
            attempts=failure.attempts,
            error_type=type(exc).__name__,
            error=self._redact(str(exc))[:500],
            reason="its transaction, holding only this record, was aborted at each commit",
            transactional=True,
        )
        self._doomed[key] = (exc, exc.classification, failure.attempts)

    def _consumer_fatal(self, error: KafkaError) -> None:
        """librdkafka's consumer is in its fatal state: abort the open transaction and stop
        (fenced by the group: ``ProducerFencedError``, the zombie rule)."""
        self.abort("the consumer failed fatally")
        if error.code() == KafkaError.FENCED_INSTANCE_ID or classify(error).name == (
            "FENCED_INSTANCE_ID"
        ):
            self._fenced(KafkaException(error))
        raise KafkaException(error)

    def _check_fenced(self) -> None:
        """After an abort: fenced, or closed by a fatal error of the abort itself
        (librdkafka#4849: INVALID_TXN_STATE with a single producer): raise, the consumer
        stops. A closed producer is never waited on (each batch would be redone for ever)."""
        if self.producer.fenced:
            self._fenced(
                ProducerFencedError(
                    f"transactional.id {self._redact(self._policy.transactional_id)!r} was "
                    "taken over by another instance (found while aborting)"
                )
            )
        closed_by = self.producer.closed_by
        if closed_by is not None:
            self._log.error(
                "transactional_producer_closed",
                error=self._redact(str(closed_by))[:500],
                note="the abort failed fatally and closed the transactional producer: the "
                "consumer stops (run() raises); nothing of the open transaction is committed, "
                "a restarted instance redoes it (its init_transactions() aborts it)",
            )
            raise closed_by

    def _fenced(self, exc: BaseException) -> None:
        self.fenced = True
        open_for = time.monotonic() - self._started if self._started else 0.0
        self._reset()
        fields: dict[str, Any] = {}
        if open_for >= self._txn_timeout_s:
            # the coordinator aborts a transaction open past transaction.timeout.ms and bumps
            # the epoch: the producer then reads as fenced though no other instance exists
            fields["open_s"] = round(open_for, 1)
            fields["hint"] = (
                f"the transaction was open {open_for:.0f} s, past transaction.timeout.ms "
                f"({self._txn_timeout_s:.0f} s): the coordinator aborted it. A handler call "
                "or a batch that long needs a larger transaction.timeout.ms "
                "(TransactionPolicy(producer_config=)) or a smaller max_records"
            )
        self._log.error(
            "consumer_fenced",
            error=self._redact(str(exc)),
            note="another instance took this transactional.id (or this member's partitions), "
            "or the coordinator aborted a transaction past its timeout: this one stops; "
            "nothing of its open transaction is visible",
            **fields,
        )
        if isinstance(exc, ProducerFencedError):
            raise exc
        kafka = cast(Any, exc)
        raise ProducerFencedError(
            f"fenced by the consumer group: {self._redact(str(exc))}",
            code=getattr(kafka, "code", None),
            name=getattr(kafka, "name", None),
            classification=getattr(kafka, "classification", None),
        ) from exc

    def _redo(self, redo: _Redo, rest: list[Message]) -> None:
        """Abort, rewind every partition of the transaction and of the rest of the batch,
        and hold them for ``redo.wait`` seconds."""
        targets = dict(self._first)
        for m in rest:
            if m.error() is None:
                targets.setdefault((m.topic(), m.partition()), m.offset())  # type: ignore[arg-type]
        self._log.info("transaction_redo", why=redo.why, wait_s=round(redo.wait, 3))
        cm = self._cm
        if cm is not None:
            self._cm = None
            self._close_block(cm, _Aborting(redo.why))
            self.aborted += 1
            self._end_span("aborted", redo.why)
        self._reset()
        self._check_fenced()
        self._seek(targets, pause=redo.wait > 0)
        if redo.wait > 0:
            self._resume_at = time.monotonic() + redo.wait

    def _give_back(self, rest: list[Message], skip: Mapping[TP, int] | None = None) -> None:
        """Seek the partitions of ``rest`` (not handled) back to their first message there,
        but those of ``skip`` (rewound already)."""
        first: dict[TP, int] = {}
        for m in rest:
            if m.error() is None and (skip is None or (m.topic(), m.partition()) not in skip):
                first.setdefault((m.topic(), m.partition()), m.offset())  # type: ignore[arg-type]
        self._seek(first)

    def _seek(self, targets: Mapping[TP, int], *, pause: bool = False) -> None:
        deferred = self._deferred
        for tp, offset in targets.items():
            if tp in deferred and offset < deferred[tp][1]:
                # rewound before its deferred record: resumed from there
                deferred[tp] = (deferred[tp][0], offset)
        parts = [TopicPartition(t, p, o) for (t, p), o in targets.items()]
        if pause and parts:
            try:
                self._consumer.pause(parts)
                self._paused.extend(parts)
            except KafkaException as exc:
                self._log.debug("pause_failed", error=self._redact(str(exc)))
        for part in parts:
            try:
                self._consumer.seek(part)
            except KafkaException as exc:  # not assigned any more: its new owner reads it
                self._log.debug(
                    "seek_failed",
                    topic=part.topic,
                    partition=part.partition,
                    error=self._redact(str(exc)),
                )

    def _resume(self) -> None:
        parts, self._paused = self._paused, []
        try:
            assigned = {(p.topic, p.partition) for p in self._consumer.assignment()}
            # a retry-topic partition waiting for its record's due time stays paused
            mine = [
                p
                for p in parts
                if (p.topic, p.partition) in assigned
                and (p.topic, p.partition) not in self._deferred
            ]
            if mine:
                self._consumer.resume(mine)
        except (KafkaException, RuntimeError) as exc:
            self._log.debug("resume_failed", error=self._redact(str(exc)))

    def _committed(self, first: Mapping[TP, int]) -> dict[TP, int]:
        """The group's committed offsets of ``first``'s partitions (the first offset of the
        transaction where none is committed)."""
        if not first:
            return {}
        asked = [TopicPartition(t, p) for t, p in first]
        for attempt in range(3):
            try:
                got = self._consumer.committed(asked, timeout=self._policy.timeout)
                break
            except KafkaException as exc:
                self._log.warning(
                    "committed_offsets_unknown", attempt=attempt + 1, error=self._redact(str(exc))
                )
        else:
            # guessing either way could be wrong: "not committed" redoes a committed
            # transaction (its outputs visible twice), "committed" skips its records. Stop:
            # a restarted member reads the group's committed offsets when it joins.
            raise TransactionOutcomeUnknownError(
                "a transaction's outcome is unknown and the group's committed offsets could "
                f"not be read for {', '.join(f'{t}[{p}]' for t, p in first)}: the consumer "
                "stops rather than risk a duplicate or a skip (a restart reads them)"
            )
        out = dict(first)
        for part in got:
            if part.error is None and part.offset >= 0:
                out[(part.topic, part.partition)] = part.offset
        return out

    def _reset(self, *, committed: bool = False) -> None:
        """The transaction ended; ``committed``: with its records (else they are redone)."""
        if self._keys is not None:
            if committed:
                self._keys.settle()
            else:
                self._keys.undo()  # its moves are hidden, its records handled again
        self._first = {}
        self._next = {}
        self._done = []
        self._records = 0
        self._dead = 0  # _failures, _doomed and _to_move are kept across a redo on purpose
        self._moving = 0
        self._ok = 0
        self._settled = []

    # ------------------------------------------------------------------ telemetry

    def _start_span(self) -> Any:
        if not self._state.traced:
            return None
        try:
            if self._tracer is None:
                from opentelemetry import trace

                provider = self._tracer_provider or trace.get_tracer_provider()
                self._tracer = provider.get_tracer(_INSTRUMENTATION)
            return self._tracer.start_span(
                _SPAN_NAME,
                attributes={
                    "kresilient.transactional_id": self._redact(self._policy.transactional_id),
                    "messaging.consumer.group.name": self._group,
                },
            )
        except Exception:  # telemetry never breaks the consumer
            return None

    def _link(self, record_span: Any, topic: str, partition: int, offset: int) -> None:
        """Link the transaction's span to a record's ``process`` span (itself the child of
        that record's producer): the transaction names every record it holds, as the
        messaging conventions link a batch to its messages. The SDK keeps at most
        ``OTEL_SPAN_LINK_COUNT_LIMIT`` links (128 by default); the span's
        ``messaging.batch.message_count`` still counts them all."""
        span = self._span
        if span is None or record_span is None:
            return
        try:
            context = record_span.get_span_context()
            if context.is_valid:
                span.add_link(
                    context,
                    {
                        "messaging.destination.name": topic,
                        "messaging.destination.partition.id": str(partition),
                        "messaging.kafka.offset": offset,
                    },
                )
        except Exception:  # telemetry never breaks the consumer
            return

    def _end_span(self, outcome: str, why: str | None = None) -> None:
        span, self._span = self._span, None
        if span is None:
            return
        try:
            span.set_attribute("kresilient.transaction.outcome", outcome)
            span.set_attribute("messaging.batch.message_count", self._records)
            span.set_attribute("kresilient.transaction.dead_letters", self._dead)
            if why is not None:
                span.set_attribute("kresilient.transaction.reason", self._redact(why)[:500])
            if outcome != "committed":
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end()
        except Exception:
            return

    def register_metrics(self, meter_provider: Any) -> None:
        """The observable counter ``kresilient.consumer.transactions`` per ``outcome``."""
        try:
            from opentelemetry import metrics

            provider = (
                meter_provider if meter_provider is not None else metrics.get_meter_provider()
            )
            meter = provider.get_meter(_INSTRUMENTATION)
            meter.create_observable_counter(
                TRANSACTIONS_METRIC,
                callbacks=[self._observe],
                unit="{transaction}",
                description="Consume-transform-produce transactions, per outcome",
            )
        except Exception:  # telemetry never breaks the consumer
            return

    def _observe(self, _options: Any) -> Iterator[Any]:
        from opentelemetry.metrics import Observation

        attrs = {"messaging.consumer.group.name": self._group}
        yield Observation(self.committed, {**attrs, "outcome": "committed"})
        yield Observation(self.aborted, {**attrs, "outcome": "aborted"})
        yield Observation(int(self.fenced), {**attrs, "outcome": "fenced"})

    def snapshot(self) -> dict[str, Any]:
        """For ``health().transactions``."""
        return {
            "transactional_id": self._redact(self._policy.transactional_id),
            "committed": self.committed,
            "aborted": self.aborted,
            "fenced": self.fenced,
            "closed": self.producer.closed_by is not None,
            "open": self._cm is not None,
            "recreations": self.producer.recreations,
        }


class TxnCrashOffsets:
    """What crash-loop protection commits its markers through with ``transactions=``.

    The guard (:class:`~kresilient.consumer._crashloop.CrashGuard`) counts a record's deaths
    in the group's committed metadata before each handler call of a probed partition. Those
    marker commits are plain commits of the consumer, outside the transactions: a death
    aborts the open transaction, and a marker committed inside it would never be seen. They
    must claim no progress, so each commits the partition's *committed* position (the open
    transaction's first offset), never a record handled in the open transaction: its
    offsets still commit only with it (``send_offsets_to_transaction``, written after the
    marker, so it wins once the transaction commits). The guard's ``store`` (progress
    between markers, without transactions) is ignored here for the same reason.
    """

    def __init__(self, offsets: Any, position: Callable[[TP], int | None]) -> None:
        self._offsets = offsets
        self._position = position

    def commit_marker(self, tp: TP, offset: int | None, metadata: str) -> None:
        committed = self._position(tp)
        if committed is None:
            # not known here: ``offset`` could be a record of the open transaction (progress
            # it has not committed): no marker rather than a wrong offset
            return
        self._offsets.commit_marker(tp, committed, metadata)

    def commit_markers(self, offsets: Mapping[TP, int], metadata: str) -> list[TP]:
        # the seed of a new group's partitions, in the assignment callback: not fetched yet
        return cast(list[TP], self._offsets.commit_markers(offsets, metadata))

    def store(self, tp: TP, offset: int, epoch: int | None = None) -> None:
        return  # progress is the transaction's


class _Aborting(Exception):
    """The reason handed to the transaction() block to make it abort."""


# --------------------------------------------------------------------------- at-least-once


class AtLeastOnceOutputs:
    """Outputs of the consumer without ``transactions=``: produced through a
    :class:`~kresilient.ResilientProducer` (made at the first output), and confirmed at the
    batch's end before its offsets are stored: :meth:`confirm` flushes and returns, per
    partition, the earliest record an output of which was not delivered (its failure)."""

    def __init__(
        self, make: Callable[[], ResilientProducer], timeout: float = OUTPUT_CONFIRM_TIMEOUT
    ) -> None:
        self._make = make
        self._timeout = timeout
        self.producer: ResilientProducer | None = None
        self.sent: list[tuple[Any, Any]] = []  #: (source record, delivery handle)
        #: failures found by :meth:`floor` (a crash marker's commit), returned by the next
        #: :meth:`confirm` (the batch's end handles them as the records' failures)
        self._carried: dict[TP, tuple[Any, BaseException]] = {}

    def send(self, msg: Any, outputs: tuple[Output, ...]) -> None:
        """Queue ``msg``'s outputs (a local refusal raises: the record's failure)."""
        producer = self.producer
        if producer is None:
            producer = self.producer = self._make()
        sent = self.sent
        for out in outputs:
            handle = producer.produce(
                out.topic, out.value, out.key, headers=out.headers, partition=out.partition
            )
            sent.append((msg, handle))

    def confirm(self) -> list[tuple[Any, BaseException]]:
        """Flush; the earliest record per partition whose outputs failed, with the error."""
        sent, self.sent = self.sent, []
        failed, self._carried = self._carried, {}
        producer = self.producer
        if producer is None or not sent:
            return list(failed.values())
        with contextlib.suppress(KResilientError):  # each failure is read from its handle
            producer.flush(self._timeout)
        for msg, handle in sent:
            tp = (msg.topic(), msg.partition())
            if tp in failed:
                continue
            if not handle.done():
                error: BaseException | None = KResilientError(
                    f"an output of {_where(msg)} was not delivered within {self._timeout:g} s"
                )
            else:
                error = handle.exception(0)
            if error is not None:
                failed[tp] = (msg, error)
        return list(failed.values())

    @property
    def pending(self) -> bool:
        """Outputs not confirmed yet, or failures found by :meth:`floor` not returned yet."""
        return bool(self.sent or self._carried)

    def floor(self, tp: TP) -> int | None:
        """Flush; the offset of ``tp``'s earliest record whose outputs were not delivered
        (``None``: all delivered). The failures are kept for the next :meth:`confirm`."""
        if self.sent:
            for msg, exc in self.confirm():
                self._carried[(msg.topic(), msg.partition())] = (msg, exc)
        carried = self._carried.get(tp)
        return None if carried is None else int(carried[0].offset())

    def close(self, timeout: float) -> None:
        """Flush what is left and release the producer."""
        if self.producer is not None:
            self.producer.close(timeout)


def emitting(
    call: Callable[[Any], object], outputs: AtLeastOnceOutputs | None
) -> Callable[[Any], object]:
    """``call`` (the handler) with its :class:`Output` results queued on ``outputs``; with
    ``None`` (a mode that cannot confirm them before its commit) an output is refused."""

    if outputs is None:

        def refusing(msg: Any) -> object:
            result = call(msg)
            if result is not None and outputs_of(result, msg, strict=False):
                raise HandlerOutputError(
                    f"the handler returned Output records for {_where(msg)}: outputs need "
                    "ordering='partition' or transactions="
                )
            return result

        return refusing
    send = outputs.send

    def emit(msg: Any) -> object:
        result = call(msg)
        if result is not None:
            produced = outputs_of(result, msg, strict=False)
            if produced:
                send(msg, produced)
        return result

    return emit


def refusing_batch_outputs(call: Callable[[Any], object]) -> Callable[[Any], object]:
    """A ``batch_handler`` whose result holds :class:`Output` records fails the batch
    (:class:`HandlerOutputError`): a batch handler's outputs are not written (nor may they be
    dropped silently)."""

    def batch(msgs: Any) -> object:
        result = call(msgs)
        if result is None or isinstance(result, str | bytes | bytearray | memoryview | Mapping):
            return result
        if isinstance(result, Output) or (
            isinstance(result, list | tuple) and any(isinstance(i, Output) for i in result)
        ):
            first = msgs[0] if msgs else None
            where = _where(first) if first is not None else "an empty batch"
            raise HandlerOutputError(
                f"the batch handler returned Output records (batch from {where}): outputs are "
                "written for a per-message handler only (handler=), never dropped"
            )
        return result

    return batch
