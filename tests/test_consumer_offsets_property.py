"""Property-based tests of the consumer's offset bookkeeping (issue 11, acceptance 3).

The real :class:`~kresilient.consumer._offsets.OffsetKeeper` and
:class:`~kresilient.consumer._holds.Hold` are driven the way ``ResilientConsumer`` drives them
(store after a handled batch, store-before plus a dead-letter entry on a failure, release,
revoke, loss), by a fake client that checks every ``store_offsets`` call against a model:
whatever the interleaving of handled, failed, retried, dead-lettered (acknowledged or not,
failed) and revoked messages, no offset is ever stored past a message that is neither handled
nor acknowledged in the dead-letter topic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kresilient.consumer._holds import Hold, Verdict
from kresilient.consumer._offsets import OffsetKeeper
from kresilient.errors import DeadLetterError, ProduceError
from kresilient.telemetry import Telemetry

TPS = [("t", 0), ("t", 1)]


class _Msg:
    def __init__(self, tp: tuple[str, int], offset: int) -> None:
        self._tp, self._offset = tp, offset

    def topic(self) -> str:
        return self._tp[0]

    def partition(self) -> int:
        return self._tp[1]

    def offset(self) -> int:
        return self._offset

    def leader_epoch(self) -> None:
        return None


class _Handle:
    """A dead-letter write: pending, acknowledged or failed."""

    def __init__(self) -> None:
        self.state = "pending"

    def done(self) -> bool:
        return self.state != "pending"

    def exception(self, timeout: float | None = None) -> Any:
        if self.state == "failed":
            return ProduceError("write failed")
        return None


@dataclass
class _Partition:
    next_offset: int = 0  #: the next message to deliver
    done: set[int] = field(default_factory=set)  #: handled, or dead-letter acknowledged
    held: Hold | None = None  #: a retry hold (nothing after it is processed)
    dead: dict[int, _Handle] = field(default_factory=dict)  #: dead-lettered offsets
    gone: bool = False  #: revoked or lost

    def first_not_done(self) -> int:
        o = 0
        while o in self.done:
            o += 1
        return o


class _Client:
    """The consumer's client as OffsetKeeper sees it; checks every store against the model."""

    def __init__(self, model: dict[tuple[str, int], _Partition]) -> None:
        self.model = model
        self.stored: dict[tuple[str, int], int] = {}

    def _check(self, tp: tuple[str, int], offset: int) -> None:
        bound = self.model[tp].first_not_done()
        assert offset <= bound, f"stored {tp}@{offset} past undone message {bound}"
        self.stored[tp] = offset

    def store_offsets(self, message: Any = None, offsets: Any = None) -> None:
        if message is not None:
            self._check((message.topic(), message.partition()), message.offset() + 1)
        for tp in offsets or ():
            self._check((tp.topic, tp.partition), tp.offset)

    def commit(self, asynchronous: bool = True) -> list[Any]:
        return []


class _Producer:
    def poll(self, timeout: float = 0) -> int:
        return 0


class _Log:
    def __getattr__(self, _level: str) -> Any:
        return lambda *_a, **_kw: None


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "handle",  # the next message of tp is handled (one batch)
                "batch",  # the next messages of both partitions are handled in one batch
                "fail_dead",  # the next message fails and is dead-lettered at once
                "fail_retry",  # the next message fails and is held for a retry
                "retry_ok",  # the held message succeeds on a later attempt
                "retry_dead",  # the held message exhausts its retries: dead-lettered
                "ack",  # a pending dead-letter write is acknowledged
                "nack",  # a pending dead-letter write fails
                "release",  # the loop serves the dead-letter producer (release())
                "revoke",  # the partition is revoked (wait, then commit)
                "lost",  # the assignment is lost
            ]
        ),
        st.sampled_from(TPS),
        st.integers(min_value=1, max_value=3),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_no_offset_is_ever_stored_past_an_undone_message(ops: list[tuple[str, Any, int]]) -> None:
    model = {tp: _Partition() for tp in TPS}
    client = _Client(model)
    keeper = OffsetKeeper(client, _Log(), Telemetry(), lambda t: t + ".dlq")  # type: ignore[arg-type]
    for op, tp, n in ops:
        p = model[tp]
        if p.gone and op not in ("release", "ack", "nack"):
            continue
        if op in ("handle", "batch"):
            last = {}
            for each in [tp] if op == "handle" else TPS:
                q = model[each]
                if q.gone or q.held is not None:
                    continue  # a held partition delivers nothing new (Verdict.SKIP)
                for _ in range(n):
                    q.done.add(q.next_offset)
                    last[each] = _Msg(each, q.next_offset)
                    q.next_offset += 1
            keeper.store_last(last)  # type: ignore[arg-type]
        elif op in ("fail_dead", "fail_retry"):
            if p.held is not None:
                continue
            offset = p.next_offset
            p.next_offset += 1
            keeper.store(tp, offset)  # everything before the failed message is done
            if op == "fail_retry":
                p.held = Hold(tp=tp, offset=offset, attempts=1)
            else:
                handle = p.dead[offset] = _Handle()
                keeper.add_dead_letters(tp, offset, [handle], offset + 1)
        elif op in ("retry_ok", "retry_dead") and p.held is not None:
            hold, p.held = p.held, None
            hold.resumed = True
            assert hold.verdict(hold.offset) is Verdict.RETRY
            if op == "retry_ok":
                p.done.add(hold.offset)
                keeper.store_last({tp: _Msg(tp, hold.offset)})  # type: ignore[dict-item]
            else:
                handle = p.dead[hold.offset] = _Handle()
                keeper.add_dead_letters(tp, hold.offset, [handle], hold.offset + 1)
        elif op in ("ack", "nack"):
            pending = [o for o, h in p.dead.items() if h.state == "pending"]
            if pending:
                offset = pending[(n - 1) % len(pending)]
                p.dead[offset].state = "ok" if op == "ack" else "failed"
                if op == "ack":
                    p.done.add(offset)
        elif op == "release":
            try:
                keeper.release()
            except DeadLetterError:
                break  # the consumer stops; nothing more is stored
        elif op == "revoke":
            keeper.wait(_Producer(), [tp], 0)
            p.gone = True
        elif op == "lost":
            keeper.drop([tp])
            p.gone = True
    # negative control: the model does detect a store past an undone message
    tp = TPS[0]
    bound = model[tp].first_not_done()
    with pytest.raises(AssertionError, match="past undone"):
        client.store_offsets(offsets=[_TP(tp, bound + 1)])


class _TP:
    def __init__(self, tp: tuple[str, int], offset: int) -> None:
        self.topic, self.partition, self.offset = tp[0], tp[1], offset


@given(
    held=st.integers(min_value=0, max_value=1000),
    other=st.integers(min_value=0, max_value=1000),
    resumed=st.booleans(),
)
def test_a_held_partition_processes_nothing_but_its_held_message(
    held: int, other: int, resumed: bool
) -> None:
    """Before the resume everything that arrives is stale (SKIP); after it only the held
    offset is retried, anything else means the held offset is gone (RELEASE)."""
    hold = Hold(tp=("t", 0), offset=held, resumed=resumed)
    verdict = hold.verdict(other)
    if not resumed:
        assert verdict is Verdict.SKIP
    elif other == held:
        assert verdict is Verdict.RETRY
    else:
        assert verdict is Verdict.RELEASE
