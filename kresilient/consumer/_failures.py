"""Failure handling of :class:`~kresilient.ResilientConsumer`: retry holds and dead letters.

A failed message is either retried (its partition paused and seeked back to it, the consumer
keeps polling; see :mod:`kresilient.consumer._holds`) or dead-lettered (written with its raw
bytes and the ``kresilient.*`` headers; the partition continues at once but its stored offset
waits for the acknowledgement, see :mod:`kresilient.consumer._offsets`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

import tenacity
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from kresilient.consumer._breaker import CircuitBreaker
from kresilient.consumer._holds import TP, Hold
from kresilient.deadletter import DeadLetterPolicy, build_dead_letter_record
from kresilient.errors import (
    Action,
    Classification,
    DeadLetterError,
    ErrorCategory,
    KResilientError,
    ProduceError,
    classify,
)

if TYPE_CHECKING:
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.consumer._support import Deserializing, Watchdog
    from kresilient.producer import ResilientProducer
    from kresilient.telemetry import Telemetry

__all__ = ["FailureMixin"]

#: After a failed seek, how long a held partition waits before trying again.
_SEEK_RETRY: Final = 0.5
_POISON_REMEDY: Final = (
    "The handler rejected this record and the retry policy does not retry that exception "
    "(deserialization/validation): fix the record or the handler, then `kresilient dlq replay`"
)


def poison(classification: Classification) -> Classification:
    """A failure the retry policy does not retry, unknown to the Kafka table, is POISON."""
    if classification.category is not ErrorCategory.UNKNOWN:
        return classification
    return dataclasses.replace(
        classification,
        category=ErrorCategory.POISON,
        action=Action.DEAD_LETTER,
        remedy=_POISON_REMEDY,
    )


class FailureMixin:
    """Retry/dead-letter decisions; mixed into ResilientConsumer (which owns the state)."""

    # state owned by ResilientConsumer
    group_id: str
    _consumer: Consumer
    _log: Any
    _tel: Telemetry
    _offsets: OffsetKeeper
    _holds: dict[TP, Hold]
    _excluded: set[TP]
    _retrying: tenacity.Retrying
    _breaker: CircuitBreaker | None
    _dlq_policy: DeadLetterPolicy | None
    _dlq_producer: ResilientProducer | None
    _deser: Deserializing | None
    _batch: list[Message]
    _batch_mode: bool
    _nonsuccess: int
    _credited: int
    _retries: int
    _traced: bool
    _overrun: bool
    _interrupt: bool
    _watchdog: Watchdog
    _redact: Callable[[str], str]

    # ------------------------------------------------------------------ decision

    def _on_failure(
        self, msg: Message, exc: BaseException, *, batch: list[Message] | None = None
    ) -> None:
        """A handler failed on ``msg``: hold its partition for a retry, or dead-letter it.

        ``batch``: the batch-handler messages that failed as a whole (dead-lettered together).
        """
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        was_excluded = tp in self._excluded
        self._excluded.add(tp)
        self._offsets.store(tp, offset, msg.leader_epoch())  # everything before it is done
        now = time.monotonic()
        hold = self._holds.get(tp)
        if hold is None or hold.offset != offset:
            hold = Hold(
                tp=tp,
                offset=offset,
                first_failure=now,
                state=tenacity.RetryCallState(self._retrying, None, (), {}),
            )
            self._holds[tp] = hold
        hold.attempts += 1
        state = hold.state
        assert state is not None
        state.attempt_number = hold.attempts
        state.set_exception((type(exc), exc, exc.__traceback__))
        classification = classify(exc)
        retrying = self._retrying
        if not retrying.retry(state):
            classification = poison(classification)
        else:
            delay = float(retrying.wait(state))
            state.upcoming_sleep = delay
            if not retrying.stop(state):
                state.idle_for += delay
                self._schedule_retry(hold, exc, classification, now + delay, delay)
                return
        del self._holds[tp]  # a failure is always of a delivered (so unpaused) message
        self._dead_letter(tp, hold.attempts, batch or [msg], exc, classification)
        if not was_excluded:
            self._excluded.discard(tp)  # the rest of the partition flows and is stored

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
        self._retries += 1
        self._pause(hold.tp, hold.offset)
        if self._traced:
            self._tel.retry_event(
                None, hold.attempts, exc, classification=classification, delay_s=delay
            )
        self._log.info(
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
        policy, producer = self._dlq_policy, self._dlq_producer
        if policy is None or producer is None:
            self._log.error(
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
        breaker = self._breaker
        handles: list[Any] = []
        for m in msgs:
            if breaker is not None:
                try:
                    breaker.check()
                except KResilientError as opened:
                    self._tel.circuit_breaker_opened(
                        topic=tp[0], partition=tp[1], offset=m.offset(), **breaker.snapshot()
                    )
                    if handles:
                        self._queued(tp, msgs, handles)
                    raise opened from exc
            handles.append(
                self._write_dead_letter(policy, producer, m, exc, classification, attempts)
            )
            if breaker is not None:
                breaker.record_dead_letter()
        self._queued(tp, msgs, handles)

    def _queued(self, tp: TP, msgs: list[Message], handles: list[Any]) -> None:
        first = msgs[0].offset()
        last = msgs[len(handles) - 1].offset()
        assert first is not None and last is not None
        self._offsets.add_dead_letters(tp, first, handles, last + 1)

    def _credit_before(self, msg: Message) -> None:
        """Credit the breaker with this batch's successes before ``msg`` (per-message mode)."""
        breaker = self._breaker
        if breaker is None or not self._batch or self._batch_mode:
            return
        try:
            index = self._batch.index(msg)
        except ValueError:
            return
        ok = index - self._nonsuccess - self._credited
        if ok > 0:
            breaker.record_successes(ok)
            self._credited += ok

    def _write_dead_letter(
        self,
        policy: DeadLetterPolicy,
        producer: ResilientProducer,
        msg: Message,
        exc: BaseException,
        classification: Classification,
        attempts: int,
    ) -> Any:
        raw = self._deser.raw_bytes(msg) if self._deser is not None else None
        topic = policy.topic_for(msg.topic() or "")
        with self._tel.dead_letter_span(
            topic,
            source=cast(Any, msg),
            reason=exc,
            classification=classification,
            attempts=attempts,
        ):
            carrier = {
                k: v.decode("utf-8") if isinstance(v, bytes) else str(v)
                for k, v in self._tel.inject_headers(None)
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
            try:
                return producer.produce(
                    record.topic, record.value, key=record.key, headers=record.headers
                )
            except ProduceError as err:
                raise DeadLetterError(
                    f"dead-letter write to {record.topic} refused: {self._redact(str(err))}",
                    topic=record.topic,
                    classification=err.classification,
                ) from err

    # ------------------------------------------------------------------ holds

    def _pause(self, tp: TP, offset: int) -> None:
        """Pause ``tp`` and seek it to ``offset`` (drops what was fetched beyond it)."""
        part = TopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([part])
        try:
            self._consumer.seek(part)
        except KafkaException as exc:  # seeked again before resume
            self._log.debug(
                "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
            )

    def _resume(self, tp: TP, offset: int) -> bool:
        """Seek ``tp`` to ``offset`` and resume it; False (still paused) if the seek failed."""
        part = TopicPartition(tp[0], tp[1], offset)
        try:
            self._consumer.seek(part)
        except KafkaException as exc:  # resuming without it could skip the held message
            self._log.warning(
                "seek_failed",
                topic=tp[0],
                partition=tp[1],
                offset=offset,
                error=self._redact(str(exc)),
                note="the partition stays paused; retried shortly",
            )
            return False
        self._consumer.resume([part])
        return True

    def _service_holds(self, timeout: float) -> float:
        """Resume partitions whose retry is due; return the poll timeout to use."""
        now = time.monotonic()
        for tp, hold in self._holds.items():
            if hold.resumed:
                continue
            if hold.due <= now:
                if self._resume(tp, hold.offset):
                    hold.resumed = True
                else:
                    hold.due = now + _SEEK_RETRY
                    timeout = min(timeout, _SEEK_RETRY)
            else:
                timeout = min(timeout, hold.due - now)
        return max(timeout, 0.0)

    def _on_overrun(self) -> None:
        """Watchdog: the batch in progress outlasts half of max.poll.interval.ms."""
        self._overrun = True
        self._interrupt = True

    def _give_back(self, rest: list[Message], *, log: bool = True) -> None:
        """Seek partitions back to their first unprocessed message (after an overrun)."""
        first: dict[TP, int] = {}
        for m in rest:
            if m.error() is None:
                first.setdefault((m.topic(), m.partition()), m.offset())  # type: ignore[arg-type]
        for tp, offset in first.items():
            if tp in self._holds:
                continue
            try:
                self._consumer.seek(TopicPartition(tp[0], tp[1], offset))
            except KafkaException as exc:
                self._log.warning(
                    "seek_failed", topic=tp[0], partition=tp[1], error=self._redact(str(exc))
                )
        if log:
            self._log.info(
                "batch_overrun",
                unprocessed=len(rest),
                budget_s=self._watchdog.budget,
                note="slow handler: the rest of the batch is fetched again",
            )
