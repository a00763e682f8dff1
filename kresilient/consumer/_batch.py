"""The batch-handler path of :class:`~kresilient.ResilientConsumer`.

Each consumed batch is split per partition; the handler gets one partition's messages in
offset order. :class:`~kresilient.BatchItemError` names the failed item (the ones before it
are done, the ones after it are fetched again); any other exception fails the whole group
(retried as one, dead-lettered message by message once the retries are exhausted).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message

from kresilient.consumer._holds import TP, Hold, Verdict
from kresilient.consumer._support import BatchItemError

if TYPE_CHECKING:
    from kresilient.consumer._breaker import CircuitBreaker
    from kresilient.consumer._offsets import OffsetKeeper

__all__ = ["BatchMixin"]


class BatchMixin:
    """Batch-handler processing; mixed into ResilientConsumer (which owns the state)."""

    _call: Callable[[Any], object]
    _holds: dict[TP, Hold]
    _excluded: set[TP]
    _offsets: OffsetKeeper
    _breaker: CircuitBreaker | None
    _processed: int
    _interrupt: bool
    _overrun: bool
    _stop_requested: bool

    if TYPE_CHECKING:  # provided by the other mixins

        def _consume_error(self, msg: Message) -> None: ...

        def _on_failure(
            self, msg: Message, exc: BaseException, *, batch: list[Message] | None = None
        ) -> None: ...

        def _give_back(self, rest: list[Message], *, log: bool = True) -> None: ...

    def _process_batches(self, msgs: list[Message]) -> None:
        """Batch mode: one handler call per partition's run of messages in this batch."""
        groups: dict[TP, list[Message]] = {}
        for m in msgs:
            if m.error() is not None:
                self._consume_error(m)
                continue
            tp = (m.topic(), m.partition())
            group = groups.get(tp)  # type: ignore[arg-type]
            if group is None:
                groups[tp] = [m]  # type: ignore[index]
            else:
                group.append(m)
        pending = list(groups.values())
        for i, group in enumerate(pending):
            if self._interrupt:
                if self._overrun:
                    self._give_back([g[0] for g in pending[i:]])
                    self._overrun = False
                    self._interrupt = self._stop_requested
                break
            self._handle_group(group)

    def _handle_group(self, group: list[Message]) -> None:
        first = group[0]
        tp: TP = (first.topic(), first.partition())  # type: ignore[assignment]
        hold = self._holds.get(tp)
        if hold is not None:
            verdict = hold.verdict(first.offset())  # type: ignore[arg-type]
            if verdict is Verdict.SKIP:
                return
            if verdict is Verdict.RELEASE:
                del self._holds[tp]
                hold = None
        try:
            self._call(group)
        except BatchItemError as exc:
            index = exc.index
            if not 0 <= index < len(group):
                self._on_failure(first, exc, batch=group)
                return
            if index:
                self._credit(index)
            failed = group[index]
            self._on_failure(failed, exc.failure())
            if tp not in self._holds and index + 1 < len(group):
                # dead-lettered: the items after it were not handled, fetch them again
                self._give_back(group[index + 1 :], log=False)
        except Exception as exc:
            self._on_failure(first, exc, batch=group)
        else:
            last = group[-1].offset()
            assert last is not None
            self._offsets.store(tp, last + 1, group[-1].leader_epoch())
            self._credit(len(group))
            if hold is not None:
                del self._holds[tp]
        finally:
            self._excluded.clear()

    def _credit(self, count: int) -> None:
        self._processed += count
        if self._breaker is not None:
            self._breaker.record_successes(count)
