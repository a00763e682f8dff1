"""Client callbacks of :class:`~kresilient.ResilientConsumer`: commits, errors, rebalances.

librdkafka calls these from inside ``consume()`` (so from the consumer's own thread, between
batches). A user's ``error_cb``/``stats_cb``/``on_commit`` and rebalance listeners are called
after kresilient's own handling.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kresilient.errors import KResilientError, classify, translate

if TYPE_CHECKING:
    from kresilient.consumer._holds import TP, Hold
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.leadership import LeadershipMonitor
    from kresilient.producer import ResilientProducer
    from kresilient.telemetry import Telemetry

__all__ = ["EventsMixin"]

_PARTITION_EOF: Final = KafkaError._PARTITION_EOF
#: Identical consumer/global errors are logged at most once per this many seconds.
_ERROR_LOG_INTERVAL: Final = 5.0


class EventsMixin:
    """librdkafka callbacks; mixed into ResilientConsumer (which owns the state)."""

    _consumer: Consumer
    _log: Any
    _tel: Telemetry
    _monitor: LeadershipMonitor
    _offsets: OffsetKeeper
    _holds: dict[TP, Hold]
    _dlq_producer: ResilientProducer | None
    _user_cb: dict[str, Callable[..., Any] | None]
    _listeners: dict[str, Callable[[list[TopicPartition]], object] | None]
    _rebalances: dict[str, int]
    _redact: Callable[[str], str]
    _revocations: int
    _error_logged: dict[int, float]
    _fatal: KResilientError | None
    _interrupt: bool
    _shutdown_timeout: float

    # ------------------------------------------------------------------ callbacks

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self._offsets.on_commit(err, partitions)
        user = self._user_cb["on_commit"]
        if user is not None:
            user(err, partitions)

    def _on_error(self, err: KafkaError) -> None:
        self._monitor.on_error(err)
        c = classify(err)
        if err.fatal():
            self._fatal = translate(err, operation="consume", redactor=self._redact)
            self._interrupt = True
            self._tel.fatal_error(self._fatal, c)
        else:
            self._log_throttled(
                err.code(),
                "kafka_error",
                error=c.name,
                category=c.category.value,
                detail=self._redact(err.str()),
            )
        user = self._user_cb["error_cb"]
        if user is not None:
            user(err)

    def _on_stats(self, stats_json: str) -> None:
        self._monitor.on_stats(stats_json)
        user = self._user_cb["stats_cb"]
        if user is not None:
            user(stats_json)

    def _consume_error(self, msg: Message) -> None:
        err = msg.error()
        assert err is not None
        if err.code() == _PARTITION_EOF:
            return
        self._monitor.on_error(err, msg.topic(), msg.partition())
        if err.fatal():
            raise translate(
                err,
                topic=msg.topic(),
                partition=msg.partition(),
                operation="consume",
                redactor=self._redact,
            )
        c = classify(err)
        self._log_throttled(
            err.code(),
            "consume_error",
            topic=msg.topic(),
            partition=msg.partition(),
            error=c.name,
            category=c.category.value,
            remedy=c.remedy,
        )

    def _log_throttled(self, code: int, event: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._error_logged.get(code, -_ERROR_LOG_INTERVAL) >= _ERROR_LOG_INTERVAL:
            self._error_logged[code] = now
            self._log.warning(event, **fields)

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rebalances["assigned"] += 1
        # librdkafka keeps an application pause across unassign/assign: a partition paused for
        # a retry whose resume was missed (lost assignment, failed resume) would never be
        # fetched again. A newly assigned partition has no hold, so nothing of it is paused.
        unheld = [p for p in partitions if (p.topic, p.partition) not in self._holds]
        if unheld:
            with contextlib.suppress(KafkaException):
                self._consumer.resume([TopicPartition(p.topic, p.partition) for p in unheld])
        self._log.info("partitions_assigned", partitions=_names(partitions))
        listener = self._listeners["assign"]
        if listener is not None:
            listener(partitions)

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rebalances["revoked"] += 1
        self._revocations += 1
        revoked = {(p.topic, p.partition) for p in partitions}
        if self._dlq_producer is not None and self._offsets.pending:
            try:  # their offsets must not be committed past an unacknowledged dead letter
                self._offsets.wait(self._dlq_producer, revoked, self._shutdown_timeout)
            except Exception as exc:  # never let a callback break consume()
                self._log.warning("dead_letter_wait_failed", error=self._redact(repr(exc)))
        for tp in [tp for tp in self._holds if tp in revoked]:
            del self._holds[tp]
            with contextlib.suppress(KafkaException):
                self._consumer.resume([TopicPartition(tp[0], tp[1])])
        self._offsets.commit_sync("revoke")
        self._log.info("partitions_revoked", partitions=_names(partitions))
        listener = self._listeners["revoke"]
        if listener is not None:
            listener(partitions)

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self._rebalances["lost"] += 1
        self._revocations += 1
        lost = [(p.topic, p.partition) for p in partitions]
        for tp in lost:
            if self._holds.pop(tp, None) is not None:
                # the pause would survive the loss and a later re-assignment (issue 11, 2)
                with contextlib.suppress(KafkaException):
                    self._consumer.resume([TopicPartition(tp[0], tp[1])])
        self._offsets.drop(lost)
        self._log.warning(
            "partitions_lost",
            partitions=_names(partitions),
            note="not committed: their new owner starts from the last commit",
        )
        listener = self._listeners["lost"]
        if listener is not None:
            listener(partitions)


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{p.topic}[{p.partition}]" for p in partitions]
