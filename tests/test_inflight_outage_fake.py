"""A dependency outage with many records in flight: the held records' edges, on a fake client.

``ParallelRunner`` driven directly (the fake client, offsets and log of
tests/test_inflight.py; a fake dead-letter writer): what a hostile review found leaves an
outage that never ends, and which the real-cluster test (tests/test_inflight_outage.py) cannot
provoke on demand: the probe turning out poison after the recovery, the probe reaching its
outage limit, every held partition revoked, and the probe skipped as a duplicate. Each left
the other held records waiting forever before the fix (no probe scheduled, nothing new
started); each test asserts every record is handled or dead-lettered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import tenacity
from test_inflight import _Client, _Log, _Msg, _Offsets

import kresilient.consumer._parallel as parallel
from kresilient.consumer._holds import LoopState
from kresilient.consumer._outage import OutageDetector
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER, Deduplicator


class _Done:
    def done(self) -> bool:
        return True

    def exception(self, timeout: float = 0) -> None:
        return None


class _Policy:
    def topic_for(self, topic: str) -> str:
        return topic + ".dlq"


class _Sink:
    def poll(self, timeout: float = 0) -> None:
        pass


@pytest.fixture
def dead_letters(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, str]]:
    """(partition, offset, exception type) of each record dead-lettered (acknowledged at
    once)."""
    letters: list[tuple[int, int, str]] = []

    def write(*args: Any, **_kw: Any) -> _Done:
        msg, exc = args[4], args[5]
        letters.append((msg.partition(), msg.offset(), type(exc).__name__))
        return _Done()

    monkeypatch.setattr(parallel, "write_dead_letter", write)
    return letters


def _runner(
    call: Callable[[Any], None],
    *,
    ordering: str = "key",
    outage_stop: Any = tenacity.stop_never,
    dedupe: Deduplicator | None = None,
) -> parallel.ParallelRunner:
    runner = parallel.ParallelRunner(
        consumer=_Client(),
        call=call,
        ordering=ordering,  # type: ignore[arg-type]
        max_records=4,
        max_bytes=1 << 20,
        metadata=True,
        retrying=tenacity.Retrying(
            stop=tenacity.stop_after_attempt(2),
            wait=tenacity.wait_fixed(0.01),
            retry=tenacity.retry_if_exception_type(ConnectionError),
        ),
        policy=_Policy(),  # type: ignore[arg-type]
        breaker=None,
        dedupe=dedupe,
        deser=None,
        tel=object(),  # type: ignore[arg-type]
        state=LoopState(),
        offsets=_Offsets(),  # type: ignore[arg-type]
        consume_error=lambda m: None,
        group="g",
        log=_Log(),
        redact=lambda t: t,
        commit_interval=60.0,
        revoke_timeout=5.0,
        detector=OutageDetector(),
        outage_retrying=tenacity.Retrying(
            stop=outage_stop, wait=tenacity.wait_fixed(0.05), retry=tenacity.retry_always
        ),
    )
    runner.sink = _Sink()  # type: ignore[assignment]
    return runner


def _spin(runner: parallel.ParallelRunner, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        runner.service(0.01)


class _Dependency:
    """A handler whose dependency is down until ``up()``; it records what it handled."""

    def __init__(self) -> None:
        self.down = threading.Event()
        self.down.set()
        self.handled: list[tuple[int, int]] = []

    def up(self) -> None:
        self.down.clear()

    def __call__(self, msg: Any) -> None:
        if self.down.is_set():
            raise ConnectionError("dependency down")
        self.handled.append((msg.partition(), msg.offset()))


def _held(runner: parallel.ParallelRunner, n: int) -> None:
    _spin(runner, lambda: runner.held_partitions() != set() and runner.in_flight == n, "holds")


def test_a_probe_that_turns_out_poison_after_the_recovery_ends_nothing_else_waits(
    dead_letters: list[tuple[int, int, str]],
) -> None:
    dependency = _Dependency()
    bad: list[int] = []

    def call(msg: Any) -> None:
        if not dependency.down.is_set():
            if not bad:
                bad.append(msg.offset())  # the first record tried after the recovery...
            if msg.offset() == bad[0]:
                raise ValueError("bad record")  # ...is a bad one: not retried, poison
        dependency(msg)

    runner = _runner(call)
    runner.process([_Msg(0, o, b"k%d" % o) for o in range(4)])
    _spin(runner, lambda: len(runner._held) == 4, "the holds")
    dependency.up()
    _spin(runner, lambda: runner.in_flight == 0, "every record handled or dead-lettered")
    assert len(bad) == 1
    assert sorted(dependency.handled) == [(0, o) for o in range(4) if o != bad[0]]
    assert dead_letters == [(0, bad[0], "ValueError")]
    assert runner.held_partitions() == set()
    runner.close(1.0)


def test_a_probe_at_its_outage_limit_gives_way_to_the_next_held_record(
    dead_letters: list[tuple[int, int, str]],
) -> None:
    dependency = _Dependency()
    runner = _runner(dependency, outage_stop=tenacity.stop_after_attempt(3))
    runner.process([_Msg(0, o, b"k%d" % o) for o in range(4)])
    _spin(runner, lambda: len(dead_letters) >= 1, "the first record at its outage limit")
    dependency.up()
    _spin(runner, lambda: runner.in_flight == 0, "every record handled or dead-lettered")
    assert len(dependency.handled) + len(dead_letters) == 4
    assert {reason for *_, reason in dead_letters} == {"ConnectionError"}
    assert len(dependency.handled) >= 1
    runner.close(1.0)


def test_every_held_partition_revoked_leaves_no_outage_that_blocks_a_new_partition(
    dead_letters: list[tuple[int, int, str]],
) -> None:
    dependency = _Dependency()
    runner = _runner(dependency)
    runner.process([_Msg(0, o, b"k%d" % o) for o in range(3)])
    _spin(runner, lambda: len(runner._held) == 3, "the holds")
    dependency.up()
    runner.revoke({("t", 0)})  # a rebalance takes the held partition away
    runner.process([_Msg(1, o, b"k%d" % o) for o in range(3)])
    _spin(runner, lambda: runner.in_flight == 0, "the new partition's records handled")
    assert sorted(dependency.handled) == [(1, 0), (1, 1), (1, 2)]
    assert runner.held_partitions() == set()  # the outage ended with their success
    assert dead_letters == []
    runner.close(1.0)


def test_a_probe_skipped_as_a_duplicate_gives_way_to_the_next_held_record(
    dead_letters: list[tuple[int, int, str]],
) -> None:
    dependency = _Dependency()
    release = threading.Event()

    def call(msg: Any) -> None:
        if msg.offset() == 0:  # the original: started before the outage, ends during it
            assert release.wait(10)
            dependency.handled.append((0, 0))
            return
        dependency(msg)

    runner = _runner(call, ordering="none", dedupe=Deduplicator())
    runner.process(
        [
            _Msg(0, 0, b"a", [(MESSAGE_ID_HEADER, b"id-1")]),
            _Msg(0, 1, b"a", [(MESSAGE_ID_HEADER, b"id-1"), (POSSIBLE_DUPLICATE_HEADER, b"true")]),
            _Msg(0, 2, b"b"),
            _Msg(0, 3, b"c"),
        ]
    )
    _spin(runner, lambda: len(runner._held) == 3, "the holds")
    release.set()  # the original succeeds: its handler started before the outage
    _spin(runner, lambda: runner._state.duplicates == 1, "the re-sent copy skipped as the probe")
    dependency.up()
    _spin(runner, lambda: runner.in_flight == 0, "every record handled")
    assert sorted(dependency.handled) == [(0, 0), (0, 2), (0, 3)]
    assert dead_letters == []
    runner.close(1.0)


@pytest.mark.parametrize("where", ["value", "headers"])
def test_a_records_headers_count_toward_the_backlogs_byte_bound(where: str) -> None:
    # review5 D5: the backlog's byte bound counted key + value only, so records whose bytes
    # are in their headers filled 5,000 records (175 MiB here) before the partition paused
    gate = threading.Event()
    runner = _runner(lambda msg: gate.wait(30), ordering="none")
    blob = b"x" * (32 << 10)
    offset = 0
    try:
        while ("t", 0) not in runner._paused and offset < 20_000:
            batch = []
            for _ in range(100):
                headers = [("h", blob)] if where == "headers" else None
                msg = _Msg(0, offset, b"k", headers)
                if where == "value":
                    msg.value = lambda blob=blob: blob  # type: ignore[method-assign]
                batch.append(msg)
                offset += 1
            runner.process(batch)  # type: ignore[arg-type]
        # paused on bytes (1 MiB bound: about 32 records of 32 KiB), not on the record count
        assert ("t", 0) in runner._paused
        assert offset <= 200, f"{where}: paused only after {offset} records"
    finally:
        gate.set()
        runner.close(1.0)
