"""The producer spool without a reachable cluster: storage, recovery, corruption, full disk.

A producer pointed at a closed port (127.0.0.1:1) never gets an acknowledgement: everything
it is given stays spooled, which is what these tests inspect. Delivery through a real cluster
is in test_spool_integration.py, crashes and outages in test_spool_process.py/_chaos.py.
"""

from __future__ import annotations

import marshal
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from kresilient.dedupe import Deduplicator, record_id
from kresilient.errors import DeliveryError, ErrorCategory
from kresilient.producer import (
    FlushResult,
    ResilientProducer,
    Spool,
    SpoolCorruptError,
    SpoolError,
)

UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 1500}


def _producer(spool: Spool, **kwargs: Any) -> ResilientProducer:
    return ResilientProducer(UNREACHABLE, spool=spool, **kwargs)


def _fill(path: Path, n: int, durability: str = "group") -> list[bytes]:
    """Spool ``n`` messages that are never acknowledged; close; return their values."""
    values = [b"v%06d" % i for i in range(n)]
    producer = _producer(Spool(path, durability=durability))  # type: ignore[arg-type]
    for i, v in enumerate(values):
        producer.produce("t", v, key=b"k%d" % (i % 3))
    result = producer.flush(0.2)
    assert result == FlushResult(delivered=0, spooled=n)
    producer.close(0.5)
    return values


def _records(path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT data FROM segments ORDER BY id").fetchall()
    finally:
        conn.close()
    return [r for (data,) in rows for r in marshal.loads(data)]


# ---------------------------------------------------------------------- storage


@pytest.mark.parametrize("durability", ["group", "fsync", "os"])
def test_unacknowledged_messages_stay_stored_in_order(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "spool.db"
    values = _fill(path, 200, durability)
    records = _records(path)
    assert [r[2] for r in records] == values  # (seq, topic, value, key, ...)
    seqs = [r[0] for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == 200


def test_producing_threads_racing_the_commits_store_each_message_once(tmp_path: Path) -> None:
    """Three threads produce while the spool thread commits every 0.2 ms and another thread
    calls flush() (a commit) in a loop, with the GIL switching every 10 µs: every message is
    stored exactly once, each thread's in its order. A guarantee test (it also passed on the
    defect the next test reproduces deterministically)."""
    path = tmp_path / "spool.db"
    producer = _producer(Spool(path, group_commit_ms=0.2))
    per_thread = 3000

    def work(t: int) -> None:
        for i in range(per_thread):
            producer.produce("t", b"%d-%d" % (t, i))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(3)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for thread in threads:
            thread.start()
        while any(thread.is_alive() for thread in threads):
            producer.flush(0)
        for thread in threads:
            thread.join()
        result = producer.flush(0.2)
    finally:
        sys.setswitchinterval(interval)
    assert result == FlushResult(delivered=0, spooled=3 * per_thread)
    producer.close(0.5)
    records = _records(path)
    values = [r[2] for r in records]
    assert len(values) == len(set(values)) == 3 * per_thread
    assert len({r[0] for r in records}) == 3 * per_thread  # sequence numbers unique
    for t in range(3):  # each thread's messages in its order
        mine = [v for v in values if v.startswith(b"%d-" % t)]
        assert mine == [b"%d-%d" % (t, i) for i in range(per_thread)]


class _ProduceWhileCommitWaits:
    """The spool driver's state lock, letting one produce() in at the first acquisition after
    it is armed: a commit waiting for the lock while another thread produces, made certain."""

    def __init__(self, lock: Any, producer: ResilientProducer) -> None:
        self.lock = lock
        self.producer = producer
        self.armed = False

    def __enter__(self) -> Any:
        if self.armed:
            self.armed = False
            self.producer.produce("t", b"landed-during-commit")
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.lock.__exit__(*exc)

    def acquire(self, blocking: bool = True) -> bool:
        return bool(self.lock.acquire(blocking))

    def release(self) -> None:
        self.lock.release()


def test_a_commit_that_finds_nothing_to_store_does_not_take_the_open_segment(
    tmp_path: Path,
) -> None:
    """A commit finding the open segment empty, then waiting for the state lock while a
    produce() adds a message to it, must not store that still-open segment: it would be
    stored (and sent) again by the next commit. Failed before the fix: the file held the
    message twice (the benchmark saw delivered > produced and a negative spooled count)."""
    path = tmp_path / "spool.db"
    producer = _producer(Spool(path, group_commit_ms=60_000))
    driver: Any = producer._spooler
    hook = _ProduceWhileCommitWaits(driver._state, producer)
    driver._state = hook
    producer.produce("t", b"first")
    producer.flush(0)  # stored: the open segment is empty now
    hook.armed = True
    driver.commit()  # finds it empty; the hook's produce() lands while it waits
    for i in range(5):
        producer.produce("t", b"after-%d" % i)
    result = producer.flush(0.2)
    assert result == FlushResult(delivered=0, spooled=7)
    producer.close(0.5)
    values = [r[2] for r in _records(path)]
    assert sorted(values) == sorted(
        [b"first", b"landed-during-commit", *(b"after-%d" % i for i in range(5))]
    )


def test_a_reopened_spool_keeps_stored_ids_and_continues_the_sequence(tmp_path: Path) -> None:
    """Stored messages keep the id prefix of the open that stored them (their re-sends carry
    their first id); each open mints a fresh prefix for new ones (issue 35: a copied or
    restored file must not mint one id twice); the sequence continues."""
    path = tmp_path / "spool.db"
    _fill(path, 10)
    conn = sqlite3.connect(path)
    (stored_sid,) = conn.execute("SELECT DISTINCT sid FROM segments").fetchone()
    conn.close()
    first = Spool(path)
    spool_id, next_seq = first.spool_id, first.next_seq
    assert [seg[3] for seg in first.take_loaded()] == [stored_sid.encode() + b"-"]
    first.close()
    again = Spool(path)
    assert again.next_seq == next_seq
    assert again.spool_id not in (spool_id, stored_sid)
    assert again.stored() == (1, 10)
    again.close()


@pytest.mark.parametrize("durability", ["group", "os"])
def test_flush_reports_spooled_not_failed_during_an_outage(tmp_path: Path, durability: str) -> None:
    """Past message.timeout.ms (1.5 s) with no broker: kept, never a DeliveryError; the
    outage is logged once (librdkafka itself never times a spooled message out)."""
    with structlog.testing.capture_logs() as logs:
        producer = _producer(Spool(tmp_path / "s.db", durability=durability))  # type: ignore[arg-type]
        handles = [producer.produce("t", b"x%d" % i) for i in range(50)]
        result = producer.flush(4.0)  # > 2 delivery timeouts
    assert result is not None and result.spooled == 50 and not result.complete
    deferred = [e for e in logs if e["event"] == "spool_delivery_deferred"]
    assert len(deferred) == 1 and deferred[0]["spooled"] == 50, logs
    assert deferred[0]["category"] == "DELIVERY_TIMEOUT"
    assert not any(h.done() for h in handles)  # neither delivered nor failed
    assert producer.health().spooled == 50
    producer.close(0.5)
    assert Spool(tmp_path / "s.db").stored()[1] == 50


def test_negative_control_without_spool_the_outage_is_a_failure() -> None:
    producer = ResilientProducer(UNREACHABLE)
    for i in range(5):
        producer.produce("t", b"x%d" % i)
    with pytest.raises(DeliveryError) as info:
        producer.flush(4.0)
    assert len(info.value.failures) == 5
    producer.close(0)


def test_spool_full_is_a_classified_backpressure_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db", max_bytes=10_000)
    producer = _producer(spool, backpressure_timeout=0.2)
    stored = 0
    with pytest.raises(SpoolError) as info:
        for _ in range(1000):
            producer.produce("t", b"x" * 1000)
            stored += 1
    assert info.value.classification.category is ErrorCategory.BACKPRESSURE
    assert "spool" in str(info.value) and "full" in str(info.value)
    assert 5 <= stored < 10
    producer.close(0.5)
    assert Spool(tmp_path / "s.db").stored()[1] == stored


def test_a_spool_serves_one_producer(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.db")
    producer = _producer(spool)
    with pytest.raises(ValueError, match="already used"):
        _producer(spool)
    producer.close(0)


def test_bad_types_are_refused_before_storing(tmp_path: Path) -> None:
    producer = _producer(Spool(tmp_path / "s.db"))
    with pytest.raises(TypeError, match="value"):
        producer.produce("t", 12)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="headers"):
        producer.produce("t", b"v", headers=[("h", 3)])
    assert producer.flush(0) == FlushResult(delivered=0, spooled=0)
    producer.close(0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="durability"):
        Spool("/tmp/never.db", durability="sometimes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- corruption


def _assert_quarantined(path: Path, error: SpoolCorruptError) -> None:
    assert not path.exists()
    assert Path(error.quarantined).exists()
    assert ".corrupt-" in error.quarantined
    assert error.classification.category is ErrorCategory.BACKPRESSURE
    assert str(path) in str(error)
    fresh = Spool(path)  # starts empty beside the quarantined file
    assert fresh.stored() == (0, 0)
    fresh.close()


def test_garbage_file_is_quarantined_not_deleted(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"not a database at all\n" * 100)
    with pytest.raises(SpoolCorruptError) as info:
        Spool(path)
    _assert_quarantined(path, info.value)
    assert Path(info.value.quarantined).read_bytes().startswith(b"not a database")


def test_truncated_file_is_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _fill(path, 3000)
    size = path.stat().st_size
    assert size > 8192 and not Path(str(path) + "-wal").exists()  # checkpointed at close
    with path.open("r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(SpoolCorruptError) as info:
        Spool(path)
    _assert_quarantined(path, info.value)


def test_flipped_byte_in_a_segment_is_detected_by_its_checksum(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _fill(path, 50)
    conn = sqlite3.connect(path)
    (data,) = conn.execute("SELECT data FROM segments").fetchone()
    broken = bytearray(data)
    broken[len(broken) // 2] ^= 0xFF
    conn.execute("UPDATE segments SET data = ?", (bytes(broken),))
    conn.commit()
    conn.close()
    with pytest.raises(SpoolCorruptError, match="checksum") as info:
        Spool(path)
    _assert_quarantined(path, info.value)


def test_negative_control_an_intact_file_opens(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    _fill(path, 50)
    spool = Spool(path)
    assert spool.stored() == (1, 50)
    spool.close()


# ---------------------------------------------------------------------- full disk


@pytest.fixture(name="tiny_disk")
def _tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only: mount), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("durability", ["os", "group"])
def test_full_disk_is_a_classified_error_and_nothing_unstored_is_acknowledged(
    tiny_disk: Path, durability: str
) -> None:
    path = tiny_disk / "s.db"
    producer = _producer(Spool(path, durability=durability))  # type: ignore[arg-type]
    returned: list[bytes] = []
    error: SpoolError | None = None
    try:
        for i in range(3000):  # 3 MiB of values into 1 MiB
            value = b"%06d" % i + b"x" * 1018
            producer.produce("t", value)
            returned.append(value)
    except SpoolError as exc:
        error = exc
    if error is None:  # group mode: the failing commit ran on the spool thread
        with pytest.raises(SpoolError) as info:
            producer.flush(0.2)
        error = info.value
    assert error is not None
    assert error.classification.category is ErrorCategory.BACKPRESSURE
    assert "disk is full" in error.classification.remedy
    failed: list[Any] = []
    try:
        producer.close(0.2)
    except DeliveryError as exc:
        failed = list(exc.failures)
    # What the file holds: reopened from a copy (the full tmpfs cannot take a new -shm).
    copy = Path(str(tiny_disk.parent / "copy.db"))
    subprocess.run(["cp", str(path), str(copy)], check=True)
    if Path(str(path) + "-wal").exists():
        subprocess.run(["cp", str(path) + "-wal", str(copy) + "-wal"], check=True)
    stored = {r[2] for r in _records(copy)}
    if durability == "os":
        # Every produce() that returned was stored; the one that raised was not.
        assert stored == set(returned)
        assert not failed
    else:
        # Returned but in a batch that could not be stored: reported failed, never silent.
        unstored = set(returned) - stored
        assert unstored and len(failed) == len(unstored)
        assert all(f.classification.category is ErrorCategory.BACKPRESSURE for f in failed)
    assert stored <= set(returned)


# ---------------------------------------------------------------------- dedupe


class _Msg:
    def __init__(self, ident: bytes | None, marked: bool, topic: str = "t") -> None:
        self._topic = topic
        self._headers: list[tuple[str, bytes]] = []
        if ident is not None:
            self._headers.append(("kresilient.message.id", ident))
        if marked:
            self._headers.append(("kresilient.possible.duplicate", b"true"))

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def topic(self) -> str:
        return self._topic


def test_dedupe_drops_only_marked_copies_of_processed_ids() -> None:
    d = Deduplicator(window=10)
    first = _Msg(b"a-1", False)
    assert not d.is_duplicate(first)
    d.processed(first)
    assert d.is_duplicate(_Msg(b"a-1", True))
    assert not d.is_duplicate(_Msg(b"a-1", False))  # unmarked: never dropped
    assert not d.is_duplicate(_Msg(b"a-2", True))  # marked, first copy never seen
    assert not d.is_duplicate(_Msg(b"a-1", True, topic="other"))  # per topic
    assert not d.is_duplicate(_Msg(None, True))  # no id: cannot tell
    assert (d.dropped, d.marked_unseen) == (1, 2)


def test_dedupe_window_is_bounded_least_recent_first() -> None:
    d = Deduplicator(window=3)
    for i in range(5):
        d.processed(_Msg(b"%d" % i, False))
    assert len(d) == 3
    assert not d.is_duplicate(_Msg(b"0", True))
    assert d.is_duplicate(_Msg(b"4", True))
    restored = Deduplicator(window=3, ids=d.snapshot())
    assert restored.is_duplicate(_Msg(b"3", True))


def test_dedupe_check_and_record_id() -> None:
    d = Deduplicator()
    assert not d.check(_Msg(b"x", True))  # first sight, even marked: processed
    assert d.check(_Msg(b"x", True))
    assert record_id(_Msg(b"x", True)) == (b"x", True)
    with pytest.raises(ValueError):
        Deduplicator(window=0)


def test_unique_ids_across_reopen(tmp_path: Path) -> None:
    """Ids stay unique after the spool emptied and reopened (the sequence is stored)."""
    path = tmp_path / f"{uuid.uuid4().hex}.db"
    _fill(path, 5)
    first = {r[0] for r in _records(path)}
    conn = sqlite3.connect(path)
    segments = [i for (i,) in conn.execute("SELECT id FROM segments")]
    conn.close()
    spool = Spool(path)
    spool.delete(segments)  # as when Kafka acknowledged them: the file is empty now
    assert spool.stored() == (0, 0)
    spool.close()
    _fill(path, 5)
    second = {r[0] for r in _records(path)}
    assert not first & second
