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
    writes = 0  # write() calls (a dead letter written twice shows here before it lands)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._acked_at: float | None = None
        self._handle: Handle | None = None

    def write(self, record: Any) -> Handle:
        if Writer.fail:
            raise DeadLetterError("dead-letter topic unreachable", topic=record.topic)
        Writer.writes += 1
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


class EndsIndex:
    """DeadLetterIndex.contains' rule on the fake clock: a topic's high watermarks are read
    again only for a question whose ``since`` is later than their last read, and the answer
    knows the dead letters acknowledged before that read (``landed``: record key -> when
    another member's dead letter of it was acknowledged)."""

    started = True
    landed: dict[Any, float] = {}
    clock: Clock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ends_at = -1.0

    def contains(self, key: Any, timeout: float, *, since: float, topic: Any = None) -> bool:
        if self.ends_at < since:
            self.ends_at = EndsIndex.clock.now
        return EndsIndex.landed.get(key, float("inf")) <= self.ends_at

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
    monkeypatch.setattr(
        sc.ResilientShareConsumer, "_group_settings", lambda self, admin: (30.0, LIMIT)
    )
    # no cluster: the dead-letter topics are not checked, and no dead letter is known
    monkeypatch.setattr(
        sc.ResilientShareConsumer, "_check_dead_letter_topics", lambda s, a, p: None
    )
    monkeypatch.setattr(sc, "DeadLetterIndex", NoIndex)
    FakeShare.batches, FakeShare.poll_takes, FakeShare.clock = [], 0.0, c
    Writer.fail, Writer.ack_after, Writer.clock, Writer.written = False, 0.0, c, []
    Writer.writes = 0
    EndsIndex.landed, EndsIndex.clock = {}, c
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


@pytest.mark.parametrize("written_meanwhile", [True, False])
def test_index_question_reads_the_ends_after_this_batch_returned(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, written_meanwhile: bool
) -> None:
    """review14 F3: batch 1's poison record asks the index (its ends are read then). Another
    member then dead-letters r and dies before its ACCEPT; r comes to this member in batch 2.
    The question for r must read the ends again (``since`` = batch 2's return), not reuse
    batch 1's, which cannot hold r's dead letter: a confident False writes a second one.
    Control (no dead letter of r anywhere): r is dead-lettered by this member."""
    monkeypatch.setattr(sc, "DeadLetterIndex", EndsIndex)
    FakeShare.poll_takes = 0.1
    FakeShare.batches = [[Msg(0, 1)], [Msg(1, 2)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=30.0
    )
    c.poll_once(0.1)
    assert c._consumer.acks == [(0, "ACCEPT")]
    if written_meanwhile:  # after batch 1's question, before batch 2 is acquired
        EndsIndex.landed = {sc.record_key(Msg(1, 2)): clock.now + 0.05}
    c.poll_once(0.1)
    assert c._consumer.acks == [(0, "ACCEPT"), (1, "ACCEPT")]
    if written_meanwhile:
        assert _dead_lettered_offsets() == [0]  # no second dead letter of r
        assert c.stats.dead_letters_found == 1
        assert c.stats.dead_lettered == 1
    else:
        assert _dead_lettered_offsets() == [0, 1]
        assert c.stats.dead_letters_found == 0
        assert c.stats.dead_lettered == 2


@pytest.mark.parametrize("hung", [True, False])
def test_in_flight_dead_letter_does_not_stall_the_rest_of_the_batch_past_its_lock(
    clock: Clock, hung: bool
) -> None:
    """review14 F2: x's dead letter hangs (the writer's connection frozen). The batch's other
    records, y at its last delivery among them, are handled and ACCEPTed within the lock;
    only then does the member wait for x's dead letter (x is never RELEASEd before the
    broker's lock ended, nor written twice, also when it comes back while still pending).
    Control (the dead letter acknowledged at once): x is ACCEPTed in place."""
    Writer.ack_after = 1000.0 if hung else 0.1
    FakeShare.batches = [[Msg(0, 1), Msg(1, LIMIT), Msg(2, 1)], [Msg(0, 2), Msg(3, LIMIT)]]
    accepted_at: dict[int, float] = {}

    def handler(msg: Any) -> None:
        clock.now += 0.1
        if msg.offset() == 0:
            raise ValueError("not JSON")
        accepted_at[msg.offset()] = clock.now

    c = sc.ResilientShareConsumer(CFG, ["jobs"], handler, lock_duration=30.0, outage=None)
    c.poll_once(0.1)
    assert accepted_at[1] < 1000.0 + 30.0 and accepted_at[2] < 1000.0 + 30.0
    assert c.stats.lock_expired == 0  # nothing archived, no delivery spent
    assert c.stats.lost_at_limit == 0
    if not hung:
        assert c._consumer.acks == [(0, "ACCEPT"), (1, "ACCEPT"), (2, "ACCEPT")]
        assert c.stats.dead_lettered == 1
        return
    assert c._consumer.acks == [(1, "ACCEPT"), (2, "ACCEPT"), (0, "RELEASE")]
    assert clock.now >= 1000.0 + 30.0  # x's RELEASE after the broker's lock ended
    assert c.stats.dead_letters_in_flight == 1
    # x comes back while its dead letter is still pending: the record behind it is
    # ACCEPTed first, x is not written again
    c.poll_once(0.1)
    assert c._consumer.acks[3:] == [(3, "ACCEPT"), (0, "RELEASE")]
    assert Writer.writes == 1
    assert c.stats.lock_expired == 0


@pytest.mark.parametrize("position", [2, 6])
def test_poison_late_in_a_long_batch_is_dead_lettered_at_its_first_delivery(
    clock: Clock, position: int
) -> None:
    """review14 F1: no fault, no prefetch; batches of 10 records at 2 s each (20 s of a 30 s
    lock). A poison record late in the batch that follows another long batch is dead-lettered
    at its first delivery, not RELEASEd as a lock expiry (the lock is counted from this
    poll's start, as for the handler's ACCEPT). Control: one early in the batch."""

    def handler(msg: Any) -> None:
        clock.now += 2.0
        if msg.offset() == 999:
            raise ValueError("not JSON")

    second = [Msg(100 + i, 1) for i in range(10)]
    second[position] = Msg(999, 1)
    FakeShare.batches = [[Msg(i, 1) for i in range(10)], second]
    c = sc.ResilientShareConsumer(CFG, ["jobs"], handler, lock_duration=30.0, outage=None)
    c.poll_once(0.1)
    c.poll_once(0.1)
    assert (999, "ACCEPT") in c._consumer.acks
    assert (999, "RELEASE") not in c._consumer.acks
    assert _dead_lettered_offsets() == [999]
    assert c.stats.dead_lettered == 1
    assert c.stats.lock_expired == 0
    assert c.stats.accepted == 19


def test_health_in_flight_figure_goes_down_once_the_dead_letter_lands(clock: Clock) -> None:
    """review14 F5: a dead letter in flight past its record's lock lands later, while no
    other dead letter is written: the next poll serves the writer's reports and health()
    stops counting it. Control: while it is still pending, it is counted."""
    Writer.ack_after = 45.0  # past the lock (30 s) and the in-flight wait
    FakeShare.batches = [[Msg(0, 1)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=30.0
    )
    try:
        c.poll_once(0.1)
        assert c._consumer.acks == [(0, "RELEASE")]
        assert c.health()["dead_letters_in_flight"] == 1
        c.poll_once(0.1)  # an empty poll: still pending
        assert c.health()["dead_letters_in_flight"] == 1
        clock.now += 20.0  # past its acknowledgement
        assert c.poll_once(0.1) == 0
        assert c.health()["dead_letters_in_flight"] == 0
        assert _dead_lettered_offsets() == [0]
    finally:
        c._probes.running = False


@pytest.mark.parametrize("comes_back", [True, False])
def test_landed_in_flight_dead_letter_keeps_no_record_bytes_and_is_forgotten(
    clock: Clock, comes_back: bool
) -> None:
    """review14 F4: a dead letter in flight past its record's lock that lands is kept
    without the record (its bytes would pile up on a long-running member): the record's next
    delivery to this member is still ACCEPTed with no second write; a record that never
    comes back (another member got it) is forgotten once no delivery can still be pending
    (the delivery-count limit times the lock)."""
    Writer.ack_after = 45.0
    FakeShare.batches = [[Msg(0, 1)]]
    c = sc.ResilientShareConsumer(
        CFG, ["jobs"], _failing(ValueError("not JSON"), clock, 0.5), lock_duration=30.0
    )
    try:
        c.poll_once(0.1)
        clock.now += 20.0
        c.poll_once(0.1)  # the dead letter lands
        (flight,) = c._in_flight.values()
        assert flight.done() and flight.exception(0) is None
        assert getattr(flight.record, "value", None) is None  # the record's bytes are gone
        if comes_back:
            FakeShare.batches = [[Msg(0, 2)]]
            c.poll_once(0.1)
            assert c._consumer.acks == [(0, "RELEASE"), (0, "ACCEPT")]
            assert Writer.writes == 1
            assert c.stats.dead_lettered == 1
            assert not c._in_flight
            return
        clock.now += LIMIT * 30.0 - 1.0
        c.poll_once(0.1)
        assert len(c._in_flight) == 1  # still within the window
        clock.now += 2.0
        c.poll_once(0.1)
        assert not c._in_flight
    finally:
        c._probes.running = False
