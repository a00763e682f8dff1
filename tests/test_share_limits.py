"""ResilientShareConsumer at ``share.delivery.count.limit`` and at its lock's end, with fakes.

A broker archives a record released (or whose lock expires) at its last delivery: no
path may RELEASE such a record. These paths cannot be produced on demand by a broker (a
dead-letter write failing at the right record, a stop between two records), so the
client's ShareConsumer and the dead-letter writer are fakes, and time is a fake clock.
Each test has its negative control: a record below the limit is released.
"""

from __future__ import annotations

from typing import Any

import pytest
import tenacity

import kresilient.share._consumer as sc
from kresilient import RetryPolicy
from kresilient.errors import DeadLetterError, DeliveryError

LIMIT = 5
CFG = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}


class Clock:
    """Replaces the module's ``time``: monotonic() reads it, sleep() advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


class Msg:
    def __init__(self, offset: int, count: int) -> None:
        self._o, self._c = offset, count

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "jobs"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[Any]:
        return []

    def timestamp(self) -> tuple[int, int]:
        return (1, 1700000000000)

    def delivery_count(self) -> int:
        return self._c

    def leader_epoch(self) -> None:
        return None


class FakeShare:
    batches: list[list[Msg]] = []
    poll_takes = 0.0
    clock: Clock

    def __init__(self, cfg: Any) -> None:
        self.acks: list[tuple[int, str]] = []

    def set_acknowledgement_commit_callback(self, cb: Any) -> None:
        pass

    def subscribe(self, topics: Any) -> None:
        pass

    def poll(self, timeout: float) -> list[Msg]:
        FakeShare.clock.now += FakeShare.poll_takes
        return FakeShare.batches.pop(0) if FakeShare.batches else []

    def acknowledge(self, msg: Msg, kind: Any) -> None:
        self.acks.append((msg.offset(), kind.name))

    def commit_async(self) -> None:
        pass

    def commit_sync(self, timeout: float) -> dict[Any, Any]:
        return {}

    def close(self) -> None:
        pass


class Handle:
    """A write's outcome: done once acknowledged (never failed here)."""

    def __init__(self, record: Any) -> None:
        self.record = record
        self.acked = False

    def done(self) -> bool:
        return self.acked

    def exception(self, timeout: float | None = None) -> None:
        return None


class Writer:
    """A dead-letter writer: ``fail`` refuses every write, ``ack_after`` seconds (fake
    clock) pass between a write and its acknowledgement (flush raises while it is pending)."""

    fail = False
    ack_after = 0.0
    clock: Clock
    written: list[Any] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._acked_at: float | None = None
        self._handle: Handle | None = None

    def write(self, record: Any) -> Handle:
        if Writer.fail:
            raise DeadLetterError("dead-letter topic unreachable", topic=record.topic)
        self._handle = Handle(record)
        self._acked_at = Writer.clock.now + Writer.ack_after
        return self._handle

    def poll(self, timeout: float = 0.0) -> int:
        if self._acked_at is None:
            Writer.clock.now += timeout
            return 0
        wait = self._acked_at - Writer.clock.now
        if wait > timeout:
            Writer.clock.now += timeout
            return 0
        self.flush(None)
        return 1

    def flush(self, timeout: float | None = None) -> None:
        if self._acked_at is None or self._handle is None:
            return
        wait = self._acked_at - Writer.clock.now
        if timeout is not None and wait > timeout:
            Writer.clock.now += timeout
            raise DeliveryError("1 dead letter(s) still unacknowledged after flush")
        Writer.clock.now += max(wait, 0.0)
        Writer.written.append(self._handle.record)
        self._handle.acked = True
        self._acked_at = None

    def close(self, timeout: float | None = None) -> None:
        pass


class NoIndex:
    """A dead-letter reader that has read everything: no dead letter is known."""

    started = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def contains(self, *args: Any, **kwargs: Any) -> bool:
        return False

    def state(self) -> dict[str, Any]:
        return {"state": "reading"}

    def close(self, timeout: float = 0.0) -> None:
        pass


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(sc, "time", c)
    monkeypatch.setattr(sc, "ShareConsumer", FakeShare)
    monkeypatch.setattr(sc, "DeadLetterWriter", Writer)
    monkeypatch.setattr(sc.ResilientShareConsumer, "_group_settings", lambda self: (30.0, LIMIT))
    # no cluster: the dead-letter topics are not checked, and no dead letter is known
    monkeypatch.setattr(sc.ResilientShareConsumer, "_check_dead_letter_topics", lambda s, p: None)
    monkeypatch.setattr(sc, "DeadLetterIndex", NoIndex)
    FakeShare.batches, FakeShare.poll_takes, FakeShare.clock = [], 0.0, c
    Writer.fail, Writer.ack_after, Writer.clock, Writer.written = False, 0.0, c, []
    return c


def _failing(exc: Exception, clock: Clock | None = None, takes: float = 0.0) -> Any:
    def handler(msg: Any) -> None:
        if clock is not None:
            clock.now += takes
        raise exc

    return handler


def _dead_lettered_offsets() -> list[int]:
    out = []
    for record in Writer.written:
        headers = dict(record.headers)
        out.append(int(headers["kresilient.original.offset"]))
    return out


def test_dead_letter_failed_at_the_limit_is_never_released_and_stops_naming_the_record(
    clock: Clock,
) -> None:
    Writer.fail = True
    FakeShare.batches = [[Msg(0, LIMIT), Msg(1, 1)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ConnectionError("db down")), outage=None, lock_duration=2.0
    )
    with pytest.raises(DeadLetterError, match=r"jobs\[0\]@0 is at its last delivery"):
        c.poll_once(0.1)
    acks = c._consumer.acks
    assert not [a for a in acks if a[0] == 0], acks  # no RELEASE (nor any ack) at the limit
    assert (1, "RELEASE") in acks  # the rest of the batch: stopped, below the limit: released
    assert c.stats.lost_at_limit == 1
    assert c.stats.dead_lettered == 0
    # the write was retried inside the lock, not given up at the first failure
    assert clock.now >= 1000.0 + 2.0 - sc._margin(2.0)
    with pytest.raises(DeadLetterError):  # a later call does not poll again
        c.poll_once(0.1)


def test_negative_control_dead_letter_failed_below_the_limit_is_released(clock: Clock) -> None:
    Writer.fail = True
    FakeShare.batches = [[Msg(0, 2)]]
    retry = RetryPolicy(stop=tenacity.stop_after_attempt(2))
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ConnectionError("db down")), retry=retry, outage=None
    )
    assert c.poll_once(0.1) == 1
    assert c._consumer.acks == [(0, "RELEASE")]
    assert c.stats.lost_at_limit == 0


def test_outage_hold_ending_at_the_limit_dead_letters_instead_of_releasing(clock: Clock) -> None:
    # an outage policy whose wait outlives the lock: every hold ends at once
    outage = RetryPolicy(wait=tenacity.wait_fixed(60))
    FakeShare.batches = [[Msg(1, 1), Msg(2, 2), Msg(3, LIMIT)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ConnectionError("db down")), outage=outage, lock_duration=30.0
    )
    c._stopping.wait = lambda timeout=None: False  # type: ignore[method-assign]
    c.poll_once(0.1)
    acks = c._consumer.acks
    assert c._detector.active
    assert (3, "RELEASE") not in acks, acks
    assert (3, "ACCEPT") in acks  # after its dead letter was acknowledged
    assert _dead_lettered_offsets() == [3]
    assert c.stats.dead_lettered == 1
    # negative control: the held record below the limit is released (one delivery)
    assert (2, "RELEASE") in acks
    assert c.stats.outage_releases >= 1


def test_stop_mid_batch_dead_letters_the_record_at_its_limit_and_releases_the_others(
    clock: Clock,
) -> None:
    FakeShare.batches = [[Msg(10, 1), Msg(11, LIMIT), Msg(12, 2)]]
    holder: dict[str, Any] = {}
    c = sc.ResilientShareConsumer(CFG, ["jobs"], lambda m: holder["c"].stop())
    holder["c"] = c
    c.poll_once(0.1)
    assert c._consumer.acks == [(10, "ACCEPT"), (11, "ACCEPT"), (12, "RELEASE")]
    assert _dead_lettered_offsets() == [11]
    headers = dict(Writer.written[0].headers)
    assert b"_Stop" in headers["kresilient.exception.type"]


def test_dead_letter_acknowledged_after_the_lock_is_not_accepted(clock: Clock) -> None:
    # at the limit: the write is kept going past the lock (the dead letter is the record's
    # only trace), but its ACCEPT would come after the lock: reported, not sent, not counted
    Writer.ack_after = 1.0
    FakeShare.batches = [[Msg(0, LIMIT)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=1.0
    )
    c.poll_once(0.1)
    assert _dead_lettered_offsets() == [0]
    assert (0, "ACCEPT") not in c._consumer.acks
    assert c.stats.dead_lettered == 0
    assert c.stats.lock_expired == 1


def test_dead_letter_below_the_limit_in_flight_at_the_lock_end_is_not_released_early(
    clock: Clock,
) -> None:
    # the dead letter outlives the lock: no RELEASE while the broker still holds the record
    # (its next delivery would write a second dead letter); the RELEASE comes after the lock
    # (refused by the broker, needed by the client), and the next delivery to this member
    # ACCEPTs it without a second write (review13 finding 1)
    Writer.ack_after = 1.2  # written at 1000.5, acknowledged at 1001.7: in the next lock
    FakeShare.batches = [[Msg(0, 1)], [Msg(0, 2)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=1.0
    )
    c.poll_once(0.1)
    assert c._consumer.acks == [(0, "RELEASE")]
    assert clock.now >= 1000.0 + 1.0  # sent after the lock's end, not before
    assert c.stats.dead_lettered == 0
    assert c.stats.dead_letters_in_flight == 1
    c.poll_once(0.1)
    assert c._consumer.acks == [(0, "RELEASE"), (0, "ACCEPT")]
    assert _dead_lettered_offsets() == [0]  # one dead letter
    assert c.stats.dead_lettered == 1  # counted once


def test_negative_control_dead_letter_acknowledged_in_time_is_accepted(clock: Clock) -> None:
    Writer.ack_after = 0.1
    FakeShare.batches = [[Msg(0, 1)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=1.0
    )
    c.poll_once(0.1)
    assert c._consumer.acks == [(0, "ACCEPT")]
    assert c.stats.dead_lettered == 1
    assert c.stats.lock_expired == 0


@pytest.mark.parametrize(("poll_takes", "ran"), [(1.0, False), (0.0, True)])
def test_lock_is_counted_from_before_the_poll(clock: Clock, poll_takes: float, ran: bool) -> None:
    FakeShare.poll_takes = poll_takes  # a poll that took the whole lock: its batch is stale
    FakeShare.batches = [[Msg(0, 1)]]
    calls: list[int] = []
    c = sc.ResilientShareConsumer(CFG, ["jobs"], lambda m: calls.append(1), lock_duration=1.0)
    c.poll_once(0.1)
    assert bool(calls) is ran
    assert ((0, "ACCEPT") in c._consumer.acks) is ran
    assert c.stats.lock_expired == (0 if ran else 1)
