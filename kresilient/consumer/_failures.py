"""Failure handling of :class:`~kresilient.ResilientConsumer`: retry holds and dead letters.

A failed message is either retried (its partition paused and seeked back to it, the consumer
keeps polling; see :mod:`kresilient.consumer._holds`) or dead-lettered (written with its raw
bytes and the ``kresilient.*`` headers; the partition continues at once but its stored offset
waits for the acknowledgement, see :mod:`kresilient.consumer._offsets`).

Two collaborators, composed by the consumer with explicit constructor arguments:

* :class:`DeadLetterSink`: where dead letters are written (the consumer's own producer, a
  user-supplied :class:`~kresilient.ResilientProducer`, or a
  :class:`~kresilient.deadletter.DeadLetterWriter`), always byte for byte;
* :class:`FailureHandler`: the retry/dead-letter decision, the breaker, the writes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, cast

import tenacity
from confluent_kafka import Message

from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._crashloop import is_crash_loop
from kresilient.consumer._holds import TP, Hold, Holds, LoopState
from kresilient.consumer._offsets import MovedHandle, OffsetKeeper
from kresilient.consumer._outage import OutageDecision, OutageDetector
from kresilient.consumer._registry import is_outage, outage_classification
from kresilient.consumer._retrytopics import (
    KeyBlocked,
    KeyBlocks,
    RetryTopicPolicy,
    RetryView,
    next_tier,
    retry_record,
)
from kresilient.deadletter import (
    DeadLetterPolicy,
    DeadLetterRecord,
    DeadLetterWriter,
    build_dead_letter_record,
)
from kresilient.errors import (
    Action,
    Classification,
    DeadLetterError,
    ErrorCategory,
    KResilientError,
    ProduceError,
    classify,
    is_unproducible,
)

if TYPE_CHECKING:
    from kresilient.consumer._support import Deserializing
    from kresilient.deadletter import DeadLetterHandle
    from kresilient.producer import ResilientProducer
    from kresilient.telemetry import Telemetry

__all__ = ["DeadLetterSink", "FailureHandler", "poison"]

#: Probes in a row that prove nothing (poison, crash loops) before the held record is retried.
_MAX_PROBES: Final = 10
#: How long a probe waits for its record before the held record is retried instead (a probe
#: moved on or retried: the record is known to exist).
_PROBE_WAIT: Final = 30.0
#: The least a first probe waits for a record after the held one before retrying the held one.
_PROBE_MIN_WAIT: Final = 5.0
#: The exception text in a log line is cut here (the dead-letter header keeps 4 KiB).
_ERROR_TEXT: Final = 500

_POISON_REMEDY: Final = (
    "The handler rejected this record and the retry policy does not retry that exception "
    "(deserialization/validation): fix the record or the handler, then `kresilient dlq replay`"
)


def poison(classification: Classification) -> Classification:
    """The classification of a failure the retry policy gave up on at once (not retried).

    Unproducible failures (:func:`kresilient.errors.is_unproducible`: a deserialization error,
    a record already classified POISON ...) keep their classification. Anything else the
    Kafka table does not know (``UNKNOWN``: a ``ValueError`` of the handler ...) becomes POISON
    with the replay remedy; a known Kafka category (a ``KafkaException`` raised by the
    handler) is kept as it is.
    """
    if is_unproducible(classification) or classification.category is not ErrorCategory.UNKNOWN:
        return classification
    return dataclasses.replace(
        classification,
        category=ErrorCategory.POISON,
        action=Action.DEAD_LETTER,
        remedy=_POISON_REMEDY,
    )


def _after(hold: Hold) -> int:
    """The first offset after the held record (or after the run a batch handler failed as
    one): where its probe starts, and where the partition continues once it is settled."""
    last = hold.batch[-1].offset() if hold.batch else None
    return (last if last is not None else hold.offset) + 1


class _Ack:
    """The acknowledged coordinates of a dead-letter write, shaped like a delivered message
    for :meth:`~kresilient.telemetry.Telemetry.producer_delivered`."""

    __slots__ = ("_offset", "_partition")

    def __init__(self, partition: int | None, offset: int | None) -> None:
        self._partition = partition
        self._offset = offset

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset


class DeadLetterSink:
    """Writes dead-letter records byte for byte, whichever client it is given.

    ``target``: a :class:`~kresilient.deadletter.DeadLetterWriter` (the consumer's own by
    default, or a user's: untraced itself, so the sink records the PRODUCER span
    ``send {dlq}`` through the consumer's telemetry, child of the ``dead_letter`` span, ended
    at the acknowledgement with partition and offset) or a :class:`~kresilient.ResilientProducer`
    (traced: its own ``send`` span becomes the child of the ``dead_letter`` span; it is asked
    not to propagate its trace context into the record, ``propagate=False``, issue 11 defect
    8). ``owned``: closed by the consumer.
    """

    __slots__ = ("_no_propagation", "_tel", "_writer", "owned", "span_kind", "target")

    def __init__(
        self,
        target: ResilientProducer | DeadLetterWriter,
        *,
        owned: bool,
        propagates: bool,
        tel: Telemetry | None = None,
    ) -> None:
        self.target = target
        self.owned = owned
        self._writer = isinstance(target, DeadLetterWriter)
        self._tel = tel
        # the dead_letter span is INTERNAL whenever a send span is recorded under it (the
        # producer's own, or the sink's for a writer); PRODUCER only for an untraced writer
        self.span_kind: Final = "producer" if self._writer and tel is None else "internal"
        self._no_propagation = propagates and not self._writer

    def send(self, record: DeadLetterRecord) -> Any:
        """Queue ``record``; return its handle (``done()``, ``exception(0)``).

        Raises :class:`~kresilient.DeadLetterError` when the client refuses the record.
        """
        if self._writer:
            writer = cast(DeadLetterWriter, self.target)
            tel = self._tel
            if tel is None:
                return writer.write(record)
            # the send span: started now (child of the current dead_letter span), ended at the
            # acknowledgement; the headers it would inject are dropped (byte for byte)
            value = record.value
            _, token = tel.producer_send(
                record.topic, record.key, len(value) if value else 0, record.headers
            )
            if token is None:
                return writer.write(record)

            def delivered(handle: DeadLetterHandle) -> None:
                error = handle.exception(0)
                if error is None:
                    result = handle.result(0)
                    ack = _Ack(result.partition, result.offset)
                    tel.producer_delivered(token, None, cast(Any, ack))
                else:
                    tel.producer_delivered(token, error, None, error.classification)

            try:
                return writer.write(record, on_delivery=delivered)
            except DeadLetterError as refused:
                tel.producer_delivered(token, refused, None, refused.classification)
                raise
        producer = cast("ResilientProducer", self.target)
        kwargs: dict[str, Any] = {"key": record.key, "headers": record.headers}
        if self._no_propagation:
            kwargs["propagate"] = False
        try:
            return producer.produce(record.topic, record.value, **kwargs)
        except ProduceError as err:
            raise DeadLetterError(
                f"dead-letter write to {record.topic} refused: {err.message}",
                topic=record.topic,
                classification=err.classification,
            ) from err

    def poll(self, timeout: float = 0) -> None:
        """Serve acknowledgements."""
        self.target.poll(timeout)

    def close(self, timeout: float) -> None:
        """Close the client if the consumer made it."""
        if self.owned:
            self.target.close(timeout)


class FailureHandler:
    """Decides, for a failed message, between a retry hold and a dead letter, and does it.

    Reads/writes of the shared :class:`LoopState`: ``batch``, ``nonsuccess``, ``credited``
    (breaker credit in per-message mode), ``retries`` (counted), ``traced``.
    """

    def __init__(
        self,
        *,
        group_id: str,
        state: LoopState,
        holds: Holds,
        offsets: OffsetKeeper,
        retrying: tenacity.Retrying,
        outage_retrying: tenacity.Retrying | None = None,
        retry_topics: RetryTopicPolicy | None = None,
        policy: DeadLetterPolicy | None,
        breaker: CircuitBreaker | None,
        deser: Deserializing | None,
        batch_mode: bool,
        tel: Telemetry,
        log: Any,
        redact: Callable[[str], str],
        interrupted: Callable[[], bool] = lambda: False,
    ) -> None:
        self.group_id = group_id
        #: True once a 2nd signal interrupted the handler in hand (``SignalHandlers``)
        self.interrupted = interrupted
        self.state = state
        self.holds = holds
        self.offsets = offsets
        self.retrying = retrying
        self.outage_retrying = outage_retrying
        #: record or dependency (``None``: ``outage_retry=None``, every failure is the record's)
        self.detector: OutageDetector | None = (
            OutageDetector() if outage_retrying is not None else None
        )
        self.retry_topics = retry_topics
        self.moved = 0  #: records written to a retry topic (acknowledged or not)
        #: the blocked keys of ``RetryTopicPolicy(ordered=True)``
        self.keys: KeyBlocks | None = (
            KeyBlocks() if retry_topics is not None and retry_topics.ordered else None
        )
        self.retry_map = {}
        self.policy = policy
        self.breaker = breaker
        self.deser = deser
        self.batch_mode = batch_mode
        self.tel = tel
        self.log = log
        self.redact = redact
        #: set by the consumer once it started (its own producer is made in ``run()``)
        self.sink: DeadLetterSink | None = None

    @property
    def retry_map(self) -> dict[str, tuple[str, int]]:
        """Retry topic -> (original topic, tier index): this consumer's own retry topics, the
        only records whose ``kresilient.retry.*`` headers are read back."""
        return self._retry_map

    @retry_map.setter
    def retry_map(self, value: dict[str, tuple[str, int]]) -> None:
        self._retry_map = value
        if self.keys is not None:
            self.keys.retry_topics = value

    # ------------------------------------------------------------------ decision

    def on_failure(
        self, msg: Message, exc: BaseException, *, batch: list[Message] | None = None
    ) -> None:
        """A handler failed on ``msg``: hold its partition for a retry, or dead-letter it.

        ``batch``: the batch-handler messages that failed as a whole (dead-lettered together).
        After a 2nd signal a failure is the interruption (its ``KeyboardInterrupt`` turned
        into ``exc`` by the code it landed in, or swallowed there): ``KeyboardInterrupt`` is
        raised, so the message stays uncommitted and is neither retried nor dead-lettered.

        Record or dependency (:mod:`kresilient.consumer._outage`): poison is dead-lettered at
        once; a retriable failure during a dependency outage (or starting one) is held under
        ``outage_retry``; otherwise the ``RetryPolicy`` (or ``retry_topics``) applies, and
        once it is exhausted the record is dead-lettered only if other records succeeded
        since its first failure (else the next record is probed).
        """
        if self.interrupted():
            raise KeyboardInterrupt from exc
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        self.report_successes(msg)
        holds, excluded = self.holds.by_tp, self.holds.excluded
        was_excluded = tp in excluded
        excluded.add(tp)
        self.offsets.store(tp, offset, msg.leader_epoch())  # everything before it is done
        now = time.monotonic()
        detector = self.detector
        hold = holds.get(tp)
        if hold is None or hold.offset != offset or hold.catchup:
            hold = self.holds.new(
                tp,
                offset,
                first_failure=now,
                state=tenacity.RetryCallState(self.retrying, None, (), {}),
                mark=detector.mark() if detector is not None else 0,
            )
        hold.attempts += 1
        hold.failed, hold.exc, hold.batch = msg, exc, batch
        # only the registry's own failures (its client, the deserialization step): the same
        # transport error from the handler's own HTTP dependency is judged by the evidence
        registry = outage_classification(exc) if detector is not None else None
        classification = registry if registry is not None else classify(exc)
        state = hold.state
        if state is None:  # a deferred retry-topic record (not due when first fetched)
            state = hold.state = tenacity.RetryCallState(self.retrying, None, (), {})
        state.attempt_number = max(hold.attempts - hold.retry_base, 1)
        state.set_exception((type(exc), exc, exc.__traceback__))
        # which way a retriable failure goes: a retry topic, or held in place
        to_topic = (
            self.retry_topics is not None
            and not self.batch_mode
            and registry is None
            and self.retry_topics.retries(exc)
        )
        if registry is not None and not is_outage(registry):
            pass  # the registry said 4xx (schema unknown): poison, at once
        elif is_crash_loop(exc):  # the process died on it max_process_deaths times: no retry
            classification = exc.classification  # type: ignore[attr-defined]
            hold.attempts = int(getattr(exc, "deaths", hold.attempts))
        elif registry is None and not to_topic and not self.retrying.retry(state):
            classification = poison(classification)  # no evidence of an outage either way
        else:
            if detector is not None:
                # a record of our retry topics failed before and comes due when its tier says,
                # often with others: no new evidence (it starts no outage), held during one
                if not (self.retry_map and topic in self.retry_map) and detector.failure(
                    (topic, partition, offset),
                    error_type=type(exc).__name__,
                    error=self._error_text(exc),
                    classified=registry is not None,
                ):
                    self._outage_started(hold)
                if detector.active:
                    # a dependency outage: hold the record, dead-letter nothing (not even to
                    # a retry topic: the next tier would fail the same way)
                    self._note_outage()
                    if not self._outage_retry(hold, exc, classification, now):
                        self._give_up(hold, was_excluded, exc, classification, limit=True)
                    return
            if to_topic:
                self.holds.done(tp)
                self._move(tp, msg, exc, hold.attempts)
                if not was_excluded:
                    excluded.discard(tp)
                return
            retrying = self.retrying
            delay = float(retrying.wait(state))
            state.upcoming_sleep = delay
            if not retrying.stop(state):
                state.idle_for += delay
                self._schedule_retry(hold, exc, classification, now + delay, delay)
                return
            if detector is not None:
                decision = detector.exhausted(hold.mark)
                held = decision is not OutageDecision.DEAD_LETTER
                if decision is OutageDecision.PROBE:
                    held = self._probe(hold, exc, classification, now)
                elif decision is OutageDecision.HOLD:
                    held = self._outage_retry(hold, exc, classification, now)
                if held:
                    return
                if decision is not OutageDecision.DEAD_LETTER:
                    self._give_up(hold, was_excluded, exc, classification, limit=True)
                    return
        self._give_up(hold, was_excluded, exc, classification)

    def _give_up(
        self,
        hold: Hold,
        was_excluded: bool,
        exc: BaseException,
        classification: Classification,
        *,
        limit: bool = False,
    ) -> None:
        """Dead-letter the held record (its final failure, logged at WARNING)."""
        tp = hold.tp
        self.holds.done(tp)
        msgs = hold.batch or [hold.failed]
        self._final_failure(hold, exc, classification, limit=limit)
        self._dead_letter(tp, hold.attempts, msgs, exc, classification)
        if not was_excluded:
            self.holds.excluded.discard(tp)  # the rest of the partition flows and is stored

    def _final_failure(
        self, hold: Hold, exc: BaseException, classification: Classification, *, limit: bool
    ) -> None:
        """The one line a person reads about a record given up on (the exception's text,
        redacted), before its dead letter."""
        self.log.warning(
            "message_failed",
            topic=hold.tp[0],
            partition=hold.tp[1],
            offset=hold.offset,
            attempts=hold.attempts,
            error_type=type(exc).__name__,
            error=self._error_text(exc),
            category=classification.category.value,
            reason=(
                "the dependency outage limit (outage_retry) was reached"
                if limit
                else "poison (not retried)"
                if classification.category is ErrorCategory.POISON
                else "failed while other records succeeded"
                if self.detector is not None
                else "retries exhausted"
            ),
        )

    def _error_text(self, exc: BaseException) -> str:
        text = self.redact(str(exc) or type(exc).__name__)
        return text if len(text) <= _ERROR_TEXT else text[:_ERROR_TEXT] + "..."

    # ------------------------------------------------------------------ evidence

    def report_successes(self, msg: Message | None = None) -> None:
        """Tell the detector about the successes of this batch before ``msg`` (per-message
        mode; ``None``: the whole batch, at its end)."""
        detector, state = self.detector, self.state
        if detector is None or self.batch_mode or not state.batch:
            return
        if msg is None:
            ok = len(state.batch) - state.nonsuccess
        else:
            try:
                ok = state.batch.index(msg) - state.nonsuccess
            except ValueError:
                return
        if ok > state.reported:
            state.reported = ok
            self.succeeded()

    def succeeded(self) -> None:
        """Records were handled: evidence the dependency works (ends an outage)."""
        detector = self.detector
        if detector is not None and detector.success():
            self._outage_ended(detector)

    def _outage_started(self, hold: Hold) -> None:
        assert self.detector is not None
        log_outage_started(self.log, self.detector, hold.tp, hold.offset)

    def _note_outage(self) -> None:
        assert self.detector is not None
        note_outage(self.log, self.detector, held_partitions=len(self.holds.by_tp))

    def _outage_ended(self, detector: OutageDetector) -> None:
        """The first success after an outage: log it once; the records it held are retried at
        once, each with its RetryPolicy's whole budget again."""
        now = time.monotonic()
        for hold in self.holds.by_tp.values():
            if hold.outage_state is None:
                continue
            hold.outage_state = None
            hold.retry_base = hold.attempts
            hold.state = tenacity.RetryCallState(self.retrying, None, (), {})
            hold.mark = detector.mark()
            if not hold.resumed:
                hold.due = min(hold.due, now)
        log_outage_ended(self.log, detector)

    def _probe(
        self, hold: Hold, exc: BaseException, classification: Classification, now: float
    ) -> bool:
        """No evidence: try the record after the held one (the held one stays held: its
        offset is not passed); if none comes by the outage policy's next wait, the held one
        is retried. False: the outage limit was reached."""
        delay = self._outage_wait(hold, exc, outage=False)
        if delay is None:
            return False
        self.state.retries += 1
        # the probe's record is fetched within milliseconds when there is one: the wait is
        # for a partition with nothing after the held record (at least _PROBE_MIN_WAIT)
        until = now + max(delay, _PROBE_MIN_WAIT)
        self._probe_at(hold, _after(hold), now, until)
        self.log.debug(
            "message_probe_scheduled",
            topic=hold.tp[0],
            partition=hold.tp[1],
            offset=hold.offset,
            probe=hold.probe,
            attempts=hold.attempts,
            error_type=type(exc).__name__,
            category=classification.category.value,
        )
        return True

    def probe_succeeded(
        self, hold: Hold, msg: Message, handled: Iterable[int] | None = None
    ) -> None:
        """The probe ``msg`` was handled: the held record kept failing while another record
        succeeded, so it is dead-lettered.

        The probe right after the held record: the partition continues after it. A probe that
        ran past records proving nothing (poison, skipped duplicates) was handled out of turn:
        those records are not settled, so the partition is seeked back to the first of them;
        they are handled (dead-lettered) in their turn, and the probe's offset is stored in
        its own, the probe not handled again (``handled``: the offsets handled out of turn,
        by default the probe's). Nothing is stored past an unsettled record meanwhile; a stop
        or a revoke before then hands the probe again to the next run (at-least-once)."""
        tp = hold.tp
        self.report_successes(msg)
        self.succeeded()
        exc = hold.exc
        assert exc is not None
        self.holds.by_tp.pop(tp, None)
        classification = classify(exc)
        self._final_failure(hold, exc, classification, limit=False)
        self._dead_letter(tp, hold.attempts, hold.batch or [hold.failed], exc, classification)
        offset, after = msg.offset(), _after(hold)
        assert offset is not None
        if offset > after:
            self.holds.catch_up(tp, after, [offset] if handled is None else handled)
            return
        self.holds.done(tp)
        self.holds.excluded.discard(tp)

    def probe_failed(self, hold: Hold, msg: Message, exc: BaseException | None) -> None:
        """The probe ``msg`` failed (``exc``) or was not handled (``None``: a duplicate
        ``dedupe`` skips).

        What proves nothing (poison, a crash loop, a skip) moves the probe on to the next
        record. A retriable failure is retried under the probe's own ``RetryPolicy`` (a
        record failing once is no outage; the held record stays held). Once that is
        exhausted too, two distinct records failed with no success between: a dependency
        outage, the held record is retried under ``outage_retry`` and the probe fetched
        again after it; but if other records succeeded since the held record's first
        failure, the held record is bad: dead-lettered, and the probe handled next as any
        record. A classified outage (the registry) or an outage already on: held at once.
        """
        if exc is not None and self.interrupted():
            raise KeyboardInterrupt from exc
        self.report_successes(msg)
        tp, held_exc = hold.tp, hold.exc
        assert held_exc is not None
        offset = msg.offset()
        assert offset is not None
        self.holds.excluded.add(tp)
        now = time.monotonic()
        registry = outage_classification(exc) if exc is not None else None
        inconclusive = True
        state: tenacity.RetryCallState | None = None
        if exc is not None:
            state = hold.probe_state
            if state is None or hold.probe_offset != offset:
                state = hold.probe_state = tenacity.RetryCallState(self.retrying, None, (), {})
                hold.probe_offset, hold.probe_attempts = offset, 0
            hold.probe_attempts += 1
            state.attempt_number = hold.probe_attempts
            state.set_exception((type(exc), exc, exc.__traceback__))
            inconclusive = (
                (registry is not None and not is_outage(registry))
                or is_crash_loop(exc)
                or (registry is None and not self.retrying.retry(state))
            )
        if inconclusive and hold.probes < _MAX_PROBES:
            hold.probes += 1
            hold.probe_state = None
            self._probe_at(hold, offset + 1, now, now + _PROBE_WAIT)
            return
        detector = self.detector
        assert detector is not None
        classification = classify(held_exc)
        if not inconclusive and state is not None and registry is None and not detector.active:
            retrying = self.retrying
            delay = float(retrying.wait(state))
            state.upcoming_sleep = delay
            if not retrying.stop(state):  # the probe's own retry, the held record waiting
                state.idle_for += delay
                self.state.retries += 1
                self._probe_at(hold, offset, now + delay, now + delay + _PROBE_WAIT)
                return
            if detector.exhausted(hold.mark) is OutageDecision.DEAD_LETTER:
                hold.probe = None
                self._give_up(hold, False, held_exc, classification)
                # the probe and the records it moved past are not handled yet: from the
                # first record after the held one, each in its turn
                self.holds.catch_up(tp, _after(hold))
                return
        hold.probe = hold.probe_state = None
        if (
            exc is not None
            and not inconclusive
            and detector.failure(
                (tp[0], tp[1], offset),
                error_type=type(exc).__name__,
                error=self._error_text(exc),
                classified=registry is not None,
            )
        ):
            self._outage_started(hold)
        # the held record's next attempt, after the outage policy's wait
        wait = self._outage_wait(hold, held_exc)
        if wait is None:
            self._give_up(hold, False, held_exc, classification, limit=True)
            self.holds.catch_up(tp, _after(hold))  # the probe was not handled: in its turn
            return
        self._schedule_retry(hold, held_exc, classification, now + wait, wait)

    def _probe_at(self, hold: Hold, offset: int, due: float, until: float) -> None:
        """Try the record at ``offset`` (the held record stays held) from ``due`` on; if none
        came by ``until``, the held record itself is retried."""
        hold.probe = offset
        hold.due = due
        hold.probe_until = until
        hold.resumed = False
        self.holds.pause(hold.tp, offset)

    # ------------------------------------------------------------------ retry topics

    def _move(self, tp: TP, msg: Message, exc: BaseException, attempts: int) -> None:
        """Write ``msg`` to its next retry tier (or, after the last, dead-letter it)."""
        policy = self.retry_topics
        sink = self.sink
        assert policy is not None
        source, tier = next_tier(msg.topic() or "", self.retry_map)
        if tier >= len(policy.delays):
            self._dead_letter(tp, tier + 1, [msg], exc, classify(exc))
            return
        if sink is None:
            raise exc  # no writer (cannot happen: run() makes one for retry topics)
        self._send_retry(tp, msg, source, tier, exc, attempts)
        if self.keys is not None:
            self.keys.moved(msg, tier)  # ordered: later records of its key follow it

    def follow(self, msg: Message, tier: int) -> None:
        """``ordered=True``: move ``msg`` (not handled) behind the blocked first record of its
        key, to the retry tier that record is in."""
        topic, partition = msg.topic(), msg.partition()
        assert topic is not None and partition is not None
        retried = self.retry_map.get(topic)
        source = retried[0] if retried is not None else topic
        self._send_retry(
            (topic, partition),
            msg,
            source,
            tier,
            KeyBlocked("an earlier record of this key is in a retry topic"),
            0,
        )

    def _send_retry(
        self, tp: TP, msg: Message, source: str, tier: int, exc: BaseException, attempts: int
    ) -> None:
        policy, sink = self.retry_topics, self.sink
        assert policy is not None and sink is not None
        raw = self.deser.raw_bytes(msg) if self.deser is not None else None
        record = retry_record(
            msg, policy, source=source, tier=tier, exc=exc, retry_topics=self.retry_map, raw=raw
        )
        topic = record.topic
        handle = sink.send(record)
        offset = msg.offset()
        assert offset is not None
        self.offsets.add_dead_letters(tp, offset, [MovedHandle(handle)], offset + 1)
        self.moved += 1
        # a record following its blocked key (attempts 0) is per-message traffic: DEBUG
        (self.log.info if attempts else self.log.debug)(
            "message_moved_to_retry_topic",
            topic=tp[0],
            partition=tp[1],
            offset=offset,
            retry_topic=topic,
            delay_s=policy.delays[tier],
            attempts=attempts,
            error_type=type(exc).__name__,
        )

    def _outage_wait(self, hold: Hold, exc: BaseException, *, outage: bool = True) -> float | None:
        """The outage policy's next wait for ``hold``; None once its limit is reached.

        ``outage``: the record is held by an outage (after it, the RetryPolicy's whole
        budget again); False: by a probe (its RetryPolicy stays exhausted, so the next
        failure probes again, after a longer wait)."""
        retrying = self.outage_retrying
        assert retrying is not None
        hold.outages += 1
        if outage:
            hold.retry_base = hold.attempts
        state = hold.outage_state
        if state is None:
            state = hold.outage_state = tenacity.RetryCallState(retrying, None, (), {})
        state.attempt_number = hold.outages
        return next_wait(retrying, state, exc)

    def _outage_retry(
        self, hold: Hold, exc: BaseException, classification: Classification, now: float
    ) -> bool:
        """Schedule the next attempt of a record held by an outage; False: the outage limit
        (``outage_retry``'s stop) was reached."""
        delay = self._outage_wait(hold, exc)
        if delay is None:
            return False
        self._schedule_retry(hold, exc, classification, now + delay, delay)
        return True

    def _schedule_retry(
        self,
        hold: Hold,
        exc: BaseException,
        classification: Classification,
        due: float,
        delay: float,
    ) -> None:
        hold.due = due
        hold.resumed = False
        self.state.retries += 1
        self.holds.pause(hold.tp, hold.offset)
        if self.state.traced:
            self.tel.retry_event(
                None, hold.attempts, exc, classification=classification, delay_s=delay
            )
        self.log.debug(  # per-attempt: the outage and the final failure are the loud lines
            "message_retry_scheduled",
            topic=hold.tp[0],
            partition=hold.tp[1],
            offset=hold.offset,
            attempt=hold.attempts,
            delay_s=round(delay, 3),
            error_type=type(exc).__name__,
            category=classification.category.value,
            outage=hold.outage_state is not None,
        )

    # ------------------------------------------------------------------ dead letters

    def _dead_letter(
        self,
        tp: TP,
        attempts: int,
        msgs: list[Message],
        exc: BaseException,
        classification: Classification,
    ) -> None:
        policy, sink = self.policy, self.sink
        if policy is None or sink is None:
            self.log.error(
                "message_failed_without_dead_letter_topic",
                topic=tp[0],
                partition=tp[1],
                offset=msgs[0].offset(),
                attempts=attempts,
                error_type=type(exc).__name__,
                category=classification.category.value,
                note="the consumer stops; the offset is not committed",
            )
            raise exc
        self._credit_before(msgs[0])
        breaker = self.breaker
        handles: list[Any] = []
        for m in msgs:
            if breaker is not None:
                try:
                    breaker.check()
                except KResilientError as opened:
                    self.tel.circuit_breaker_opened(
                        topic=tp[0], partition=tp[1], offset=m.offset(), **breaker.snapshot()
                    )
                    if handles:
                        self._queued(tp, msgs, handles)
                    raise opened from exc
            try:
                handles.append(self._write(policy, sink, m, exc, classification, attempts))
            except BaseException:
                if handles:  # the writes already queued still hold the offset back
                    self._queued(tp, msgs, handles)
                raise
            if breaker is not None:
                breaker.record_dead_letter()
        self._queued(tp, msgs, handles)
        if self.keys is not None:
            for m in msgs:
                self.keys.done(m)  # ordered: the next record of its key may be handled

    def _queued(self, tp: TP, msgs: list[Message], handles: list[Any]) -> None:
        first = msgs[0].offset()
        last = msgs[len(handles) - 1].offset()
        assert first is not None and last is not None
        self.offsets.add_dead_letters(tp, first, handles, last + 1)

    def _credit_before(self, msg: Message) -> None:
        """Credit the breaker with this batch's successes before ``msg`` (per-message mode)."""
        breaker, state = self.breaker, self.state
        if breaker is None or not state.batch or self.batch_mode:
            return
        try:
            index = state.batch.index(msg)
        except ValueError:
            return
        ok = index - state.nonsuccess - state.credited
        if ok > 0:
            breaker.record_successes(ok)
            state.credited += ok

    def _write(
        self,
        policy: DeadLetterPolicy,
        sink: DeadLetterSink,
        msg: Message,
        exc: BaseException,
        classification: Classification,
        attempts: int,
    ) -> Any:
        if self.retry_map and msg.topic() in self.retry_map:
            # a record failing its last retry tier: its ORIGINAL record, to the original's DLQ
            msg = cast(Message, RetryView(msg))
        return write_dead_letter(
            self.tel,
            self.deser,
            policy,
            sink,
            msg,
            exc,
            classification,
            attempts,
            group=self.group_id,
            redact=self.redact,
        )


def next_wait(
    retrying: tenacity.Retrying, state: tenacity.RetryCallState, exc: BaseException
) -> float | None:
    """Record ``exc`` on ``state``: the policy's next wait, or None once its ``stop`` says
    so (the outage limit)."""
    state.set_exception((type(exc), exc, exc.__traceback__))
    delay = float(retrying.wait(state))
    state.upcoming_sleep = delay
    if retrying.stop(state):
        return None
    state.idle_for += delay
    return delay


def log_outage_started(log: Any, detector: OutageDetector, tp: TP, offset: int) -> None:
    """The one WARNING a dependency outage starts with (both consumer paths)."""
    log.warning(
        "dependency_outage_started",
        topic=tp[0],
        partition=tp[1],
        offset=offset,
        error_type=detector.error_type,
        error=detector.error,
        note="distinct records fail in a row with no success between: the records are "
        "held and retried (outage_retry), nothing is dead-lettered until a record succeeds",
    )


def note_outage(log: Any, detector: OutageDetector, **held: int) -> None:
    """During an outage, a reminder at most once per :data:`._outage.REMINDER_S`."""
    suppressed = detector.reminder()
    if suppressed is not None:
        log.warning(
            "dependency_outage_continues",
            since_s=round(detector.duration(), 1),
            failures=detector.failures,
            suppressed=suppressed,
            error_type=detector.error_type,
            **held,
        )


def log_outage_ended(log: Any, detector: OutageDetector) -> None:
    """The one WARNING an outage ends with: how long it lasted, the failures held back."""
    log.warning(
        "dependency_outage_ended",
        lasted_s=round(detector.last_duration or 0.0, 3),
        failures=detector.last_failures,
        error_type=detector.error_type,
    )


def write_dead_letter(
    tel: Any,
    deser: Any,
    policy: DeadLetterPolicy,
    sink: DeadLetterSink,
    msg: Message,
    exc: BaseException,
    classification: Classification,
    attempts: int,
    *,
    group: str | None,
    redact: Any,
) -> Any:
    """Build ``msg``'s dead-letter record (raw bytes as read, the trace context of its span,
    this consumer's secrets out of the exception text) and queue it on ``sink``: the one
    dead-letter write of the per-partition and the in-flight (``ordering=``) consumers."""
    raw = deser.raw_bytes(msg) if deser is not None else None
    topic = policy.topic_for(msg.topic() or "")
    with tel.dead_letter_span(
        topic,
        source=cast(Any, msg),
        reason=exc,
        classification=classification,
        attempts=attempts,
        kind=sink.span_kind,
    ):
        carrier = {
            k: v.decode("utf-8") if isinstance(v, bytes) else str(v)
            for k, v in tel.inject_headers(None)
            if v
        }
        record = build_dead_letter_record(
            msg,
            policy=policy,
            group=group,
            exc=exc,
            attempts=attempts,
            classification=classification,
            raw_key=raw[0] if raw is not None else None,
            raw_value=raw[1] if raw is not None else None,
            raw=raw is not None,
            trace_context=carrier,
            # this consumer's secrets out of the exception text, whatever writes the record
            redact=redact,
        )
        return sink.send(record)
