"""The batch-handler path of :class:`~kresilient.ResilientConsumer`.

Each consumed batch is split per partition; the handler gets one partition's messages in
offset order. :class:`~kresilient.BatchItemError` names the failed item (the ones before it
are done, the ones after it are fetched again); any other exception fails the whole group
(retried as one, dead-lettered message by message once the retries are exhausted).

With ``dedupe``, possible duplicates already processed (or whose first copy is earlier in the
same batch) are taken out before the handler call; the handler gets the rest, and the offset
stored after a success is past the whole run, duplicates included.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message

from kresilient.consumer._holds import TP, Hold, Holds, LoopState, Verdict
from kresilient.errors import BatchItemError, classify

if TYPE_CHECKING:
    from kresilient.consumer._breaker import CircuitBreaker
    from kresilient.consumer._failures import FailureHandler
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.dedupe import Deduplicator
    from kresilient.telemetry import Telemetry

__all__ = ["BatchProcessor"]


class BatchProcessor:
    """Batch-handler processing (explicit collaborators).

    Reads/writes of the shared :class:`LoopState`: ``interrupt``, ``overrun``,
    ``stop_requested`` (an overrun gives the rest back), ``processed`` (counted).
    """

    def __init__(
        self,
        *,
        call: Callable[[Any], object],
        state: LoopState,
        holds: Holds,
        failures: FailureHandler,
        offsets: OffsetKeeper,
        breaker: CircuitBreaker | None,
        consume_error: Callable[[Message], None],
        overrun: Callable[[list[Message]], None],
        dedupe: Deduplicator | None = None,
        skipped: Callable[[list[Message]], None] | None = None,
        tel: Telemetry | None = None,
        group: str | None = None,
    ) -> None:
        self.call = call
        self.state = state
        self.holds = holds
        self.failures = failures
        self.offsets = offsets
        self.breaker = breaker
        self.consume_error = consume_error
        self.overrun = overrun
        self.dedupe = dedupe
        self.skipped = skipped
        self.tel = tel
        self.group = group
        self._failed = False  # the handler call in progress failed (recorded on its span)

    def process(self, msgs: list[Message]) -> None:
        """One handler call per partition's run of messages in this batch."""
        groups: dict[TP, list[Message]] = {}
        for m in msgs:
            if m.error() is not None:
                self.consume_error(m)
                continue
            tp = (m.topic(), m.partition())
            group = groups.get(tp)  # type: ignore[arg-type]
            if group is None:
                groups[tp] = [m]  # type: ignore[index]
            else:
                group.append(m)
        pending = list(groups.values())
        state = self.state
        for i, group in enumerate(pending):
            if state.interrupt:
                if state.overrun:
                    self.overrun([g[0] for g in pending[i:]])
                    state.overrun = False
                    state.interrupt = state.stop_requested
                break
            self._handle_group(group)

    def _handle_group(self, group: list[Message]) -> None:
        first = group[0]
        tp: TP = (first.topic(), first.partition())  # type: ignore[assignment]
        holds = self.holds.by_tp
        hold = holds.get(tp)
        if hold is not None and hold.catchup:
            if not hold.resumed:
                return  # fetched before the seek back to the records a probe ran past
            self._passed(tp, first.offset())  # type: ignore[arg-type]
            hold = None  # records in their turn (those handled out of turn taken out below)
        elif hold is not None:
            verdict = hold.verdict(first.offset())  # type: ignore[arg-type]
            if verdict is Verdict.SKIP:
                return
            if verdict is Verdict.RELEASE:
                self.holds.done(tp)
                hold = None
        dedupe = self.dedupe
        todo = group
        ahead = self.holds.ahead.get(tp)
        if ahead:  # handled out of turn (a probe): stored with the run, not handled again
            todo = [m for m in group if m.offset() not in ahead]
        if dedupe is not None:
            todo, duplicates = dedupe.split(group)
            if duplicates and self.skipped is not None:
                self.skipped(duplicates)
        tel = self.tel
        if todo and tel is not None and self.state.traced:
            # one process span per handler call, linked to the messages' producers; what the
            # failure handling raises (breaker open, no DLQ...) leaves after the span ended
            stop: BaseException | None = None
            self._failed = False
            with tel.batch_process_span(todo, group=self.group):
                try:
                    self._run(group, todo, tp, hold)
                except BaseException as raised:
                    if not self._failed:
                        raise  # the handler's own BaseException: recorded on the span
                    stop = raised
            if stop is not None:
                raise stop
        else:
            self._run(group, todo, tp, hold)

    def _run(self, group: list[Message], todo: list[Message], tp: TP, hold: Hold | None) -> None:
        """The handler call for one partition's run and what follows its result."""
        dedupe = self.dedupe
        on_failure = self.failures.on_failure
        if hold is not None and hold.probe is not None:
            self._probe(group, todo, tp, hold)
            return
        try:
            if todo:
                self.call(todo)
        except BatchItemError as exc:
            self._fail(exc.failure())
            index = exc.index
            if not 0 <= index < len(todo):
                on_failure(todo[0], exc, batch=todo)
                return
            if index:
                self._credit(index)
                self._remember(todo[:index])
            failed = todo[index]
            on_failure(failed, exc.failure())
            after = failed.offset()
            assert after is not None
            if self._dead_lettered(tp):
                # the items after it were not handled, fetch them again (the duplicates
                # among them too: their offsets are not stored yet)
                rest = [m for m in group if m.offset() > after]  # type: ignore[operator]
                if rest:
                    self.holds.give_back(rest)
                after += 1
            self._passed(tp, after)
        except Exception as exc:
            self._fail(exc)
            on_failure(todo[0], exc, batch=todo)
        else:
            last = group[-1].offset()
            assert last is not None
            self.offsets.store(tp, last + 1, group[-1].leader_epoch())
            self._credit(len(todo))
            if dedupe is not None:
                self._remember(todo)
            if hold is not None:
                self.holds.done(tp)
            self._passed(tp, last + 1)
        finally:
            self.holds.excluded.clear()

    def _probe(self, group: list[Message], todo: list[Message], tp: TP, hold: Hold) -> None:
        """The run after a held record whose retries are exhausted, tried as evidence
        (:mod:`kresilient.consumer._outage`): handled (or items before a
        :class:`BatchItemError`), the held record is dead-lettered; failed at its first item,
        the held record is held as an outage and this run fetched again after it.

        A run the probe reached past records that proved nothing (poison, skipped
        duplicates) is handled out of turn: the partition goes back to those records, and
        the run's handled offsets are stored in their turn, not handled again
        (:meth:`FailureHandler.probe_succeeded`); an item it failed on is handled in its turn
        too."""
        failures = self.failures
        try:
            if not todo:  # all skipped duplicates: nothing learnt, the probe moves on
                failures.probe_failed(hold, group[-1], None)
                return
            try:
                self.call(todo)
            except BatchItemError as exc:
                self._fail(exc.failure())
                index = exc.index
                if not 0 < index < len(todo):
                    failures.probe_failed(hold, todo[0], exc.failure() if index == 0 else exc)
                    return
                self._credit(index)
                self._remember(todo[:index])
                failed = todo[index]
                after = failed.offset()
                assert after is not None
                handled = [o for m in group if (o := m.offset()) is not None and o < after]
                failures.probe_succeeded(hold, todo[0], handled)
                if tp in self.holds.by_tp and not self.holds.by_tp[tp].resumed:
                    return  # out of turn: the failed item is handled again in its turn
                failures.on_failure(failed, exc.failure())
                if self._dead_lettered(tp):
                    rest = [m for m in group if m.offset() > after]  # type: ignore[operator]
                    if rest:
                        self.holds.give_back(rest)
                    after += 1
                self._passed(tp, after)
            except Exception as exc:
                self._fail(exc)
                failures.probe_failed(hold, todo[0], exc)
            else:
                handled = [o for m in group if (o := m.offset()) is not None]
                # its dead letter first, then past it (or back to the records it ran past)
                failures.probe_succeeded(hold, todo[0], handled)
                self._credit(len(todo))
                self._remember(todo)
                if tp in self.holds.by_tp and not self.holds.by_tp[tp].resumed:
                    return  # out of turn: stored in its turn
                last = group[-1].offset()
                assert last is not None
                self.offsets.store(tp, last + 1, group[-1].leader_epoch())
                self._passed(tp, last + 1)
        finally:
            self.holds.excluded.clear()

    def _dead_lettered(self, tp: TP) -> bool:
        """The record that just failed was dead-lettered (not held): its partition flows."""
        hold = self.holds.by_tp.get(tp)
        return hold is None or hold.catchup

    def _passed(self, tp: TP, offset: int) -> None:
        """The records of ``tp`` before ``offset`` are settled: those among them handled out
        of turn are stored with them; once none is left the partition flows as usual."""
        ahead = self.holds.ahead.get(tp)
        if not ahead:
            return
        ahead.difference_update([o for o in ahead if o < offset])
        if not ahead:
            hold = self.holds.by_tp.get(tp)
            if hold is None or (hold.catchup and hold.resumed):
                self.holds.done(tp)

    def _fail(self, exc: BaseException) -> None:
        """Record the handler's failure on the current span (traced calls only)."""
        self._failed = True
        tel = self.tel
        if tel is not None and self.state.traced:
            tel.set_error(exc, classify(exc))

    def _remember(self, msgs: list[Message]) -> None:
        if self.dedupe is not None:
            for m in msgs:
                self.dedupe.processed(m)

    def _credit(self, count: int) -> None:
        self.state.processed += count
        if self.breaker is not None:
            self.breaker.record_successes(count)
        if count > 0:
            self.failures.succeeded()  # evidence the dependencies work (ends an outage)
