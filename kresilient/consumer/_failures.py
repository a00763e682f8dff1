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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

import tenacity
from confluent_kafka import Message

from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._crashloop import is_crash_loop
from kresilient.consumer._holds import TP, Hold, Holds, LoopState
from kresilient.consumer._offsets import MovedHandle, OffsetKeeper
from kresilient.consumer._registry import is_outage, outage_classification
from kresilient.consumer._retrytopics import (
    KeyBlocked,
    KeyBlocks,
    RetryTopicPolicy,
    RetryView,
    retry_headers,
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
        """
        if self.interrupted():
            raise KeyboardInterrupt from exc
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        holds, excluded = self.holds.by_tp, self.holds.excluded
        was_excluded = tp in excluded
        excluded.add(tp)
        self.offsets.store(tp, offset, msg.leader_epoch())  # everything before it is done
        now = time.monotonic()
        hold = holds.get(tp)
        if hold is None or hold.offset != offset:
            hold = Hold(
                tp=tp,
                offset=offset,
                first_failure=now,
                state=tenacity.RetryCallState(self.retrying, None, (), {}),
            )
            holds[tp] = hold
        hold.attempts += 1
        # only the registry's own failures (its client, the deserialization step): the same
        # transport error from the handler's own HTTP dependency follows the user's policy
        outage = outage_classification(exc) if self.outage_retrying is not None else None
        if outage is not None and is_outage(outage):
            # the Schema Registry is down, not the record: hold under the outage policy
            if self._outage_retry(hold, exc, outage, now):
                return
            classification = outage
            del holds[tp]
            self._dead_letter(tp, hold.attempts, batch or [msg], exc, classification)
            if not was_excluded:
                excluded.discard(tp)
            return
        if (
            self.retry_topics is not None
            and not self.batch_mode
            and not is_crash_loop(exc)
            and self.retry_topics.retries(exc)
        ):
            del holds[tp]
            self._move(tp, msg, exc, hold.attempts)
            if not was_excluded:
                excluded.discard(tp)
            return
        state = hold.state
        if state is None:  # a deferred retry-topic record (not due when first fetched)
            state = hold.state = tenacity.RetryCallState(self.retrying, None, (), {})
        state.attempt_number = hold.attempts - hold.outages
        state.set_exception((type(exc), exc, exc.__traceback__))
        classification = outage if outage is not None else classify(exc)
        retrying = self.retrying
        if outage is not None:  # registry said 4xx (schema unknown): poison, at once
            pass
        elif is_crash_loop(exc):  # the process died on it max_process_deaths times: no retry
            classification = exc.classification  # type: ignore[attr-defined]
            hold.attempts = int(getattr(exc, "deaths", hold.attempts))
        elif not retrying.retry(state):
            classification = poison(classification)
        else:
            delay = float(retrying.wait(state))
            state.upcoming_sleep = delay
            if not retrying.stop(state):
                state.idle_for += delay
                self._schedule_retry(hold, exc, classification, now + delay, delay)
                return
        del holds[tp]  # a failure is always of a delivered (so unpaused) message
        self._dead_letter(tp, hold.attempts, batch or [msg], exc, classification)
        if not was_excluded:
            excluded.discard(tp)  # the rest of the partition flows and is stored

    def _move(self, tp: TP, msg: Message, exc: BaseException, attempts: int) -> None:
        """Write ``msg`` to its next retry tier (or, after the last, dead-letter it)."""
        policy = self.retry_topics
        sink = self.sink
        assert policy is not None
        retried = self.retry_map.get(msg.topic() or "")
        if retried is not None:
            source, tier = retried[0], retried[1] + 1
        else:
            source, tier = msg.topic() or "", 0
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
        topic = policy.topic(source, tier)
        record = DeadLetterRecord(
            topic=topic,
            key=raw[0] if raw is not None else msg.key(),
            value=raw[1] if raw is not None else msg.value(),
            headers=retry_headers(
                msg, tier=tier, delay=policy.delays[tier], exc=exc, retry_topics=self.retry_map
            ),
        )
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

    def _outage_retry(
        self, hold: Hold, exc: BaseException, classification: Classification, now: float
    ) -> bool:
        """Schedule the next attempt of a record failed by an outage; False: policy gave up."""
        retrying = self.outage_retrying
        assert retrying is not None
        hold.outages += 1
        state = hold.outage_state
        if state is None:
            state = hold.outage_state = tenacity.RetryCallState(retrying, None, (), {})
        state.attempt_number = hold.outages
        state.set_exception((type(exc), exc, exc.__traceback__))
        if not retrying.retry(state):
            return False
        delay = float(retrying.wait(state))
        state.upcoming_sleep = delay
        if retrying.stop(state):
            return False
        state.idle_for += delay
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
        self.log.info(
            "message_retry_scheduled",
            topic=hold.tp[0],
            partition=hold.tp[1],
            offset=hold.offset,
            attempt=hold.attempts,
            delay_s=round(delay, 3),
            error_type=type(exc).__name__,
            category=classification.category.value,
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
        raw = self.deser.raw_bytes(msg) if self.deser is not None else None
        if self.retry_map and msg.topic() in self.retry_map:
            # a record failing its last retry tier: its ORIGINAL record, to the original's DLQ
            msg = cast(Message, RetryView(msg))
        topic = policy.topic_for(msg.topic() or "")
        with self.tel.dead_letter_span(
            topic,
            source=cast(Any, msg),
            reason=exc,
            classification=classification,
            attempts=attempts,
            kind=sink.span_kind,
        ):
            carrier = {
                k: v.decode("utf-8") if isinstance(v, bytes) else str(v)
                for k, v in self.tel.inject_headers(None)
                if v
            }
            record = build_dead_letter_record(
                msg,
                policy=policy,
                group=self.group_id,
                exc=exc,
                attempts=attempts,
                classification=classification,
                raw_key=raw[0] if raw is not None else None,
                raw_value=raw[1] if raw is not None else None,
                raw=raw is not None,
                trace_context=carrier,
            )
            return sink.send(record)
