"""The in-partition concurrency core (issue 40): scheduling, gap-safe offsets, the metadata.

Pure bookkeeping (kresilient/consumer/_inflight.py), driven here without a client: examples
for each rule, then hypothesis properties over any interleaving of completions and retries.
The real-cluster guarantees built on it are tested where the consumer uses it.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kresilient.consumer._crashloop import CLEAN, PREFIX, parse_marker
from kresilient.consumer._inflight import (
    METADATA_MAX_BYTES,
    Finished,
    InflightWindow,
    OffsetTracker,
    encode_finished,
    encode_ranges,
    finished_from,
    with_finished,
)

# ---------------------------------------------------------------------- examples


def _window(ordering: str = "key", **kw: int) -> InflightWindow[int]:
    kw.setdefault("max_records", 100)
    kw.setdefault("max_bytes", 1 << 30)
    return InflightWindow(ordering, **kw)  # type: ignore[arg-type]


def test_key_mode_runs_one_record_per_key_in_offset_order() -> None:
    w = _window()
    for offset, key in enumerate([b"a", b"b", b"a", b"c", b"b"]):
        assert w.offer(offset, key, 1, offset)
    assert w.ready(0) == [0, 1, 3]  # the second a and b wait for the first
    w.finish(1)
    assert w.ready(0) == [4]
    w.finish(0)
    assert w.ready(0) == [2]


def test_keyless_records_are_one_chain_in_key_mode() -> None:
    w = _window()
    for offset in range(3):
        w.offer(offset, None, 1, offset)
    w.offer(3, b"k", 1, 3)
    assert w.ready(0) == [0, 3]
    w.finish(0)
    assert w.ready(0) == [1]


def test_partition_mode_is_one_at_a_time_and_none_mode_is_unordered() -> None:
    w = _window("partition")
    for offset in range(3):
        w.offer(offset, bytes([offset]), 1, offset)
    assert w.ready(0) == [0]
    assert w.blocked  # the window of "partition" is one record
    w.finish(0)
    assert w.ready(0) == [1]
    n = _window("none")
    for offset in range(3):
        n.offer(offset, b"same", 1, offset)
    assert n.ready(0) == [0, 1, 2]


def test_a_retry_blocks_only_its_key_until_due() -> None:
    w = _window()
    for offset, key in enumerate([b"a", b"b", b"a", b"b"]):
        w.offer(offset, key, 1, offset)
    assert w.ready(0) == [0, 1]
    w.retry(0, due=10.0)
    w.finish(1)
    assert w.ready(5.0) == [3]  # b continues, a waits behind its retrying head
    assert w.next_due() == 10.0
    assert w.ready(10.0) == [0]
    w.finish(0)
    assert w.ready(10.0) == [2]


def test_a_held_record_waits_until_rescheduled_and_only_due_retries_start_when_asked() -> None:
    """A dependency outage: a record held at ``inf`` never comes due by itself; rescheduled,
    its old place in the queue is stale; ``new=False`` starts due retries, nothing new."""
    w = _window()
    for offset, key in enumerate([b"a", b"b", b"c"]):
        w.offer(offset, key, 1, offset)
    assert w.ready(0, new=False) == []  # nothing new starts during an outage
    assert w.ready(0) == [0, 1, 2]
    w.retry(0, due=math.inf)  # held
    w.retry(1, due=3.0)
    assert w.next_due() == 3.0
    w.reschedule(1, 50.0)  # its entry at 3.0 is stale now
    assert w.next_due() == 50.0
    assert w.ready(10.0, new=False) == []
    w.reschedule(0, 20.0)  # the probe
    w.offer(3, b"d", 1, 3)  # a new record: not started while only retries may start
    assert w.ready(20.0, new=False) == [0]
    assert w.ready(20.0) == [3]
    with pytest.raises(KeyError):
        w.reschedule(0, 1.0)  # running, not waiting
    w.finish(0)
    assert w.ready(60.0) == [1]


def test_a_waiting_record_finished_by_a_dead_letter_is_not_started_again() -> None:
    w = _window()
    w.offer(0, b"a", 1, 0)
    w.offer(1, b"a", 1, 1)
    assert w.ready(0) == [0]
    w.retry(0, due=5.0)
    w.finish(0)  # given up while waiting: dead-lettered
    assert w.next_due() is None
    assert w.ready(100.0) == [1]


def test_a_full_window_blocks_the_partition_by_count_and_by_bytes() -> None:
    w = _window(max_records=2)
    for offset in range(4):
        w.offer(offset, bytes([offset]), 1, offset)
    assert w.admitted == 2 and w.blocked
    assert w.ready(0) == [0, 1]
    w.finish(1)
    assert w.admitted == 2 and w.blocked  # 2 admitted, 3 waits
    w.finish(0)
    w.finish(2)
    assert not w.blocked
    b = _window(max_bytes=10)
    b.offer(0, b"a", 6, 0)
    b.offer(1, b"b", 6, 1)
    assert b.admitted == 1 and b.blocked
    big = _window(max_bytes=10)
    big.offer(0, b"a", 50, 0)  # over the limit alone: admitted when the window is empty
    assert big.ready(0) == [0]


def test_a_backlog_blocks_over_its_limit_until_half_of_it_went_in() -> None:
    w = _window("none", max_records=2, max_backlog=4)
    for offset in range(6):  # 2 in the window, 4 wait: not over the limit
        w.offer(offset, None, 1, offset)
    assert not w.blocked
    w.offer(6, None, 1, 6)  # 5 wait
    assert w.blocked
    assert w.ready(0) == [0, 1]
    w.finish(0)  # 4 wait
    assert w.blocked
    assert w.ready(0) == [2]
    w.finish(1)  # 3 wait
    assert w.blocked
    w.finish(2)  # 2 wait: half
    assert not w.blocked


def test_a_backlog_blocks_over_its_byte_limit_until_half_of_its_bytes_went_in() -> None:
    # large records: the byte limit pauses the partition long before the count would
    w = _window("none", max_records=1, max_backlog=1000, max_backlog_bytes=100)
    for offset in range(3):  # 1 in the window, 2 wait: 80 bytes
        w.offer(offset, None, 40, offset)
    assert not w.blocked
    w.offer(3, None, 40, 3)  # 120 bytes wait
    assert w.blocked
    assert w.ready(0) == [0]
    w.finish(0)  # 80 bytes wait: under the limit, over half of it
    assert w.blocked
    assert w.ready(0) == [1]
    w.finish(1)  # 40 bytes wait: half
    assert not w.blocked
    # control: without a byte limit the same records never block
    c = _window("none", max_records=1, max_backlog=1000)
    for offset in range(4):
        c.offer(offset, None, 40, offset)
    assert not c.blocked


def test_finishing_a_record_that_never_started_is_refused() -> None:
    w = _window()
    w.offer(0, b"a", 1, 0)
    w.offer(1, b"a", 1, 1)
    with pytest.raises(KeyError):
        w.finish(1)
    with pytest.raises(KeyError):
        w.retry(1, 0.0)


def test_the_committable_offset_is_the_lowest_unfinished_one() -> None:
    t = OffsetTracker()
    assert t.committable() is None
    for offset in (5, 7, 8, 9):  # 6: a transaction marker, never delivered
        t.offer(offset)
    t.finish(8)
    t.finish(7)
    # the hole (6) counts as finished: no record has it, and it keeps the ranges merged
    assert t.committable() == 5 and t.finished() == [6, 7, 8]
    t.finish(5)
    assert t.committable() == 9 and t.finished() == []
    t.finish(9)
    assert t.committable() == 10
    with pytest.raises(ValueError):
        t.offer(3)


def test_metadata_combines_with_every_crash_loop_marker() -> None:
    inflight = PREFIX + '{"x":12,"d":1,"t":1764403200000}'
    waiting = PREFIX + '{"x":12,"d":0,"t":5,"w":1}'
    for marker in (None, CLEAN, inflight, waiting, PREFIX + "{}"):
        meta = with_finished(marker, 10, [12, 13, 20])
        assert meta is not None and meta.startswith(PREFIX)
        assert parse_marker(meta) == (parse_marker(marker) or parse_marker(PREFIX + "{}"))
        got = finished_from(meta, 10)
        assert got is not None and got.offsets() == [12, 13, 20]
    # an older version's markers carry no list; someone else's metadata is left alone
    assert finished_from(CLEAN, 10) is None
    assert finished_from(inflight, 10) is None
    assert with_finished("their-metadata", 10, [11]) == "their-metadata"
    # a list belongs to its offset: another committed offset ignores it
    assert finished_from(with_finished(None, 10, [12]), 11) is None


def test_the_shorter_encoding_is_chosen() -> None:
    dense = encode_finished(0, range(1, 400, 2))  # alternating: the bitmap wins
    assert dense is not None and "b" in dense
    sparse = encode_finished(0, [5, 100_000])  # far apart: the run lengths win
    assert sparse is not None and sparse["r"] == "4.1.255m.1"  # 255m: 99994 in base 36
    assert encode_finished(7, [3, 7]) is None  # nothing above the base


def test_a_list_that_does_not_fit_falls_back_to_the_bare_marker() -> None:
    spread = list(range(2, 200_000, 7))
    assert with_finished(CLEAN, 0, spread) == CLEAN
    assert with_finished(None, 0, spread) is None
    assert len(with_finished(CLEAN, 0, spread, limit=1 << 20) or "") > METADATA_MAX_BYTES


@pytest.mark.parametrize(
    "meta",
    [
        PREFIX + '{"g":{"o":3,"r":"zz.-1"}}',
        PREFIX + '{"g":{"o":3,"r":"1.!"}}',
        PREFIX + '{"g":{"o":3,"b":"***"}}',
        PREFIX + '{"g":{"o":3}}',
        PREFIX + '{"g":[3]}',
        PREFIX + '{"g":{"o":3,"r":""}}',
        PREFIX + "[1]",
        PREFIX + "{bad json",
        "",
    ],
)
def test_malformed_lists_are_ignored(meta: str) -> None:
    """Ignoring a list only redoes records: never a reason to fail an assignment."""
    assert finished_from(meta, 3) is None


def test_a_restarted_window_skips_the_listed_records() -> None:
    w = _window(skip=finished_from(with_finished(None, 10, [11, 13]), 10))
    assert [w.offer(o, b"k%d" % o, 1, o) for o in range(10, 16)] == [
        True,
        False,
        True,
        False,
        True,
        True,
    ]
    assert w.skipped == 2 and w.skip is None  # the list is dropped once passed
    assert w.ready(0) == [10, 12, 14, 15]


def test_a_restarted_window_keeps_listing_what_it_has_not_fetched_again() -> None:
    """The previous owner's list reaches beyond what the new owner fetched so far: its
    commits keep those records listed, or a second crash would redo them."""
    w = _window(skip=finished_from(with_finished(None, 10, [11, 13, 40, 41]), 10))
    for o in range(10, 13):
        w.offer(o, b"k%d" % o, 1, o)
    meta = w.metadata(None)
    got = finished_from(meta, 10)
    assert got is not None and got.offsets() == [11, 13, 40, 41]


# ---------------------------------------------------------------------- properties


@dataclass
class _Run:
    """What a fake consumer saw while driving a window."""

    starts: dict[bytes | None, list[int]] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)


_KEYS = st.sampled_from([b"a", b"b", b"c", b"d", None])


@st.composite
def _workloads(draw: st.DrawFn) -> tuple[list[tuple[int, bytes | None, int]], list[int]]:
    n = draw(st.integers(1, 60))
    gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    offsets, cursor = [], draw(st.integers(0, 1000))
    for g in gaps:
        cursor += g
        offsets.append(cursor)
    keys = draw(st.lists(_KEYS, min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    choices = draw(st.lists(st.integers(0, 10_000), min_size=2 * n, max_size=4 * n))
    return list(zip(offsets, keys, sizes, strict=True)), choices


@settings(max_examples=150, deadline=None)
@given(
    work=_workloads(),
    ordering=st.sampled_from(["partition", "key", "none"]),
    max_records=st.integers(1, 8),
    max_bytes=st.integers(1, 120),
    max_backlog=st.integers(0, 6),
    poll_batch=st.integers(1, 10),
)
def test_any_interleaving_keeps_order_bound_and_gap_safety(
    work: tuple[list[tuple[int, bytes | None, int]], list[int]],
    ordering: str,
    max_records: int,
    max_bytes: int,
    max_backlog: int,
    poll_batch: int,
) -> None:
    records, choices = work
    key_of = {o: k for o, k, _ in records}
    size_of = {o: s for o, _, s in records}
    w: InflightWindow[int] = InflightWindow(
        ordering,  # type: ignore[arg-type]
        max_records=max_records,
        max_bytes=max_bytes,
        max_backlog=max_backlog,
    )
    run = _Run()
    running: list[int] = []
    waiting: list[int] = []
    fed, now = 0, 0.0
    picks = iter(choices)
    while len(run.finished) < len(records):
        # poll: more records only while the partition is not paused
        if not w.blocked and fed < len(records):
            for o, k, s in records[fed : fed + poll_batch]:
                w.offer(o, k, s, o)
            fed = min(len(records), fed + poll_batch)
        started = w.ready(now)
        for o in started:
            if o not in waiting:  # a first start (a retry restarts the same record)
                run.starts.setdefault(key_of[o], []).append(o)
            else:
                waiting.remove(o)
        running += started
        # the window: count and bytes (one oversized record alone is allowed)
        assert w.admitted <= (1 if ordering == "partition" else max_records)
        assert w.admitted_bytes <= max_bytes or w.admitted == 1
        # held in memory: the window, the backlog allowed, and one poll
        held = fed - len(run.finished)
        assert held <= w.admitted + max_backlog + poll_batch
        if ordering != "none":  # no two records of one chain at once
            chains = [key_of[o] if ordering == "key" else 0 for o in running + waiting]
            assert len(chains) == len(set(chains))
        if not running:
            if waiting:
                now = max(now, w.next_due() or now)
                continue
            assert fed < len(records) and not w.blocked, "stalled"
            continue
        pick = next(picks, 1)  # choices spent: finish, never retry again
        o = running.pop(pick % len(running))
        if pick % 5 == 0 and o not in run.finished:
            w.retry(o, due=now + (pick % 3))
            waiting.append(o)
        else:
            w.finish(o)
            run.finished.add(o)
        # gap safety: the committable offset never passes an unfinished record, and every
        # finished record above it is listed, or the metadata is bare
        base = w.committable()
        assert base is not None
        offered = [r[0] for r in records[:fed]]
        assert all(x >= base for x in offered if x not in run.finished)
        above = sorted(x for x in run.finished if x > base)
        meta = w.metadata(CLEAN)
        listed = finished_from(meta, base)
        listed_offered = [x for x in (listed.offsets() if listed else []) if x in offered]
        assert listed_offered == above or meta == CLEAN
        assert meta is not None and len(meta.encode()) <= METADATA_MAX_BYTES
        assert parse_marker(meta) == parse_marker(CLEAN)
    assert w.committable() == records[-1][0] + 1 and w.idle
    for key, offsets in run.starts.items():
        if ordering != "none":
            assert offsets == sorted(offsets), key
    assert sum(size_of.values()) >= 0


@settings(max_examples=150, deadline=None)
@given(
    base=st.integers(0, 1 << 40),
    rel=st.sets(st.integers(-5, 30_000), max_size=400),
    marker=st.sampled_from(
        [None, CLEAN, PREFIX + "{}", PREFIX + '{"x":9,"d":2,"t":1764403200000,"w":1}']
    ),
)
def test_encode_decode_round_trip(base: int, rel: set[int], marker: str | None) -> None:
    finished = sorted(base + r for r in rel)
    meta = with_finished(marker, base, finished)
    above = [o for o in finished if o > base]
    got = finished_from(meta, base)
    if meta == marker:  # bare: nothing above, or it did not fit
        assert got is None or marker is not None
        assert not above or len(json.dumps(encode_finished(base, above))) > 3000
    else:
        assert meta is not None and len(meta.encode()) <= METADATA_MAX_BYTES
        assert got is not None and got.offsets() == above
        assert all(o in got for o in above)
        assert all(o not in got for o in range(base - 2, base + 40) if o not in above)
        assert parse_marker(meta) == (parse_marker(marker) or parse_marker(PREFIX + "{}"))


def test_finished_membership_at_the_edges() -> None:
    f = Finished(base=10, ranges=((12, 14), (20, 21)))
    assert [o for o in range(9, 23) if o in f] == [12, 13, 20]
    assert len(f) == 3 and f.last == 20
    assert "12" not in f


# ---------------------------------------------------------------------- bounds (review finding 4)


def test_finished_offsets_behind_a_stuck_record_stay_one_range() -> None:
    t = OffsetTracker()
    t.offer(0)  # waits for its retries
    for offset in range(1, 10_001):
        t.offer(offset)
        t.finish(offset)
    assert t.committable() == 0 and t.unfinished() == 1
    assert t.finished_ranges() == [(1, 10_001)]  # not 10 000 ints
    assert t.ahead() == 10_000
    t.finish(0)
    assert t.committable() == 10_001 and t.finished_ranges() == [] and t.ahead() == 0


def test_out_of_order_finishes_merge_into_ranges() -> None:
    t = OffsetTracker()
    for offset in (0, 1, 2, 3, 5, 6):  # 4: a hole, counted finished
        t.offer(offset)
    for offset in (3, 1, 5, 2):
        t.finish(offset)
    assert t.finished_ranges() == [(1, 6)] and t.committable() == 0
    assert encode_ranges(0, t.finished_ranges()) == encode_finished(0, range(1, 6))


def test_a_partition_too_far_past_its_stuck_record_is_blocked_until_it_finishes() -> None:
    w = _window(max_records=8, max_ahead=100)
    w.offer(0, b"stuck", 1, 0)
    assert w.ready(0.0) == [0]
    w.retry(0, due=1e18)
    for offset in range(1, 102):
        w.offer(offset, b"k%d" % (offset % 5), 1, offset)
        for item in w.ready(0.0):
            w.finish(item)
        assert w.blocked == (offset > 100)
    w.ready(2e18)
    w.finish(0)
    assert not w.blocked and w.committable() == 102
    meta = w.metadata(None)
    assert meta is None  # nothing finished above the committable offset


# ---------------------------------------------------------------------- the runner, with fakes
# (review findings 2, 3, 5 and the dead-letter re-raise; no client: the guarantees on a
# real cluster are in tests/test_inflight_consumer.py)


class _Msg:
    def __init__(
        self,
        partition: int,
        offset: int,
        key: bytes,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self._p, self._o, self._k, self._h = partition, offset, key, headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes:
        return self._k

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._h


class _Client:
    def __init__(self) -> None:
        self.commits: list[list[tuple[str, int, int]]] = []

    def pause(self, parts: object) -> None:
        pass

    def resume(self, parts: object) -> None:
        pass

    def commit(self, offsets: list[Any], asynchronous: bool = True) -> None:
        self.commits.append([(p.topic, p.partition, p.offset) for p in offsets])


class _Offsets:
    dead_lettered = 0

    def store_metadata(self, tp: object, offset: int, meta: object) -> None:
        pass

    def commit_failed(self, *args: object) -> None:
        raise AssertionError(args)


class _Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append(event)


def _runner(call: Any, *, max_records: int = 4, dedupe: Any = None) -> Any:
    import tenacity

    from kresilient.consumer._holds import LoopState
    from kresilient.consumer._parallel import ParallelRunner

    return ParallelRunner(
        consumer=_Client(),
        call=call,
        ordering="key",
        max_records=max_records,
        max_bytes=1 << 20,
        metadata=True,
        retrying=tenacity.Retrying(stop=tenacity.stop_after_attempt(1)),
        policy=None,
        breaker=None,
        dedupe=dedupe,
        deser=None,
        tel=object(),
        state=LoopState(),
        offsets=_Offsets(),
        consume_error=lambda msg: None,
        group="g",
        log=_Log(),
        redact=lambda text: text,
        commit_interval=60.0,
        revoke_timeout=30.0,
    )


def _until(condition: Any, runner: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        runner.service(0.01)


def test_a_resent_copy_right_behind_its_original_is_skipped_at_its_turn() -> None:
    from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator

    calls: list[int] = []
    r = _runner(lambda msg: calls.append(msg.offset()), dedupe=Deduplicator())
    original = _Msg(0, 0, b"k", [(MESSAGE_ID_HEADER, b"id-1")])
    copy = _Msg(0, 1, b"k", [(MESSAGE_ID_HEADER, b"id-1"), (POSSIBLE_DUPLICATE_HEADER, b"true")])
    try:
        r.process([original, copy])  # one poll: the copy is polled before the original ran
        _until(lambda: r.windows[("t", 0)].idle, r)
        assert calls == [0] and r._state.duplicates == 1
        assert r.windows[("t", 0)].committable() == 2
    finally:
        r.close(5.0)


def test_records_of_a_revoked_partition_queued_in_the_pool_never_run() -> None:
    release = threading.Event()
    calls: list[tuple[int, int]] = []

    def call(msg: Any) -> None:
        calls.append((msg.partition(), msg.offset()))
        if msg.partition() == 1:
            assert release.wait(30)

    r = _runner(call, max_records=1)  # one worker: t[0]'s records queue behind t[1]'s
    try:
        r.process([_Msg(1, 0, b"a"), _Msg(0, 0, b"x")])
        r.revoke({("t", 0)})
        assert ("t", 0) not in r.windows
        assert "in_flight_abandoned" not in r._log.events  # not started: nothing abandoned
        assert r._consumer.commits[-1] == [("t", 0, 0)]
        release.set()
        _until(lambda: r.windows[("t", 1)].idle, r)
        r._pool.shutdown(wait=True)  # anything still queued has run now
        assert calls == [(1, 0)]  # negative control: t[1]'s record ran; t[0]'s never did
    finally:
        release.set()
        r.close(5.0)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, ValueError])  # fatal / no dead-letter policy
def test_a_fatal_outcome_leaves_nothing_running_for_close_to_wait_for(
    raised: type[BaseException],
) -> None:
    def call(msg: Any) -> None:
        raise raised("boom")

    r = _runner(call)
    r.process([_Msg(0, 0, b"k"), _Msg(0, 1, b"k")])
    with pytest.raises(raised):
        _until(lambda: False, r)
    window = r.windows[("t", 0)]
    assert window.running == 0 and window.committable() == 0  # stays uncommitted
    r.close(30.0)
    assert "in_flight_abandoned" not in r._log.events
    assert r._consumer.commits[-1] == [("t", 0, 0)]


def test_a_failed_dead_letter_write_is_raised_once_and_the_revoke_still_commits() -> None:
    from kresilient.errors import DeadLetterError

    class _Handle:
        def done(self) -> bool:
            return True

        def exception(self, timeout: float) -> Exception:
            failed = RuntimeError("broker down")
            failed.classification = None  # type: ignore[attr-defined]
            return failed

    r = _runner(lambda msg: None)
    try:
        r.process([_Msg(0, 0, b"k")])
        _until(lambda: r.windows[("t", 0)].idle, r)
        r.process([_Msg(0, 1, b"k")])
        window = r.windows[("t", 0)]
        r._dead_letters.append((window, ("t", 0), 1, _Handle()))
        with pytest.raises(DeadLetterError):
            r._check_dead_letters()
        r._check_dead_letters()  # raised once, not at every later call
        _until(lambda: window.running == 0, r)
        r.revoke({("t", 0)})
        assert ("t", 0) not in r.windows
        assert r._consumer.commits[-1][0][:2] == ("t", 0)
    finally:
        r.close(5.0)
