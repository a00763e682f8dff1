"""The spool at its seams (issue 35): one Spool per file, errors at open that are not
corruption, a failing commit shared by several producing threads, and message ids that stay
unique across processes, copies and restarts.

The storage tests use a producer pointed at a closed port (nothing is ever acknowledged, so
what the spool holds is what they inspect); the id tests produce to the real cluster and
read the ids back from the topic.
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kresilient.dedupe import Deduplicator
from kresilient.errors import ErrorCategory
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


def _fill(path: Path, values: list[bytes], topic: str = "t") -> None:
    """Spool ``values`` (never acknowledged) and close: they stay in the file."""
    producer = _producer(Spool(path))
    for v in values:
        producer.produce(topic, v)
    assert producer.flush(0.2) == FlushResult(delivered=0, spooled=len(values))
    producer.close(0.5)


def _stored_values(path: Path) -> list[bytes]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT data FROM segments ORDER BY id").fetchall()
    finally:
        conn.close()
    return [r[2] for (data,) in rows for r in marshal.loads(data)]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


# ------------------------------------------------------------ defect 2: one Spool per file


def test_a_second_spool_on_the_same_file_in_one_process_is_refused(tmp_path: Path) -> None:
    """Issue 35 #2. Two Spool objects on one file shared the spool id and the sequence: two
    distinct messages got one kresilient.message.id. The second is refused, naming the file
    and the holder; the first is untouched."""
    path = tmp_path / "s.db"
    _fill(path, [b"a", b"b"])
    first = Spool(path)
    with pytest.raises(SpoolError) as info:
        Spool(path)
    message = str(info.value)
    assert str(path) in message
    assert f"this process (pid {os.getpid()})" in message
    assert info.value.classification.category is ErrorCategory.CONFIG
    assert first.stored() == (1, 2)  # the refused open changed nothing
    # Negative control: once closed, the path opens again (the lock is released).
    first.close()
    again = Spool(path)
    assert again.stored() == (1, 2)
    again.close()


def test_a_second_spool_on_a_producers_file_is_refused_until_the_producer_closed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    producer = _producer(Spool(path))
    producer.produce("t", b"x")
    with pytest.raises(SpoolError, match="already open"):
        Spool(path)
    producer.close(0.3)
    reopened = Spool(path)  # control: closed with the producer
    assert reopened.stored() == (1, 1)
    reopened.close()


_HOLDER = """
import sys
from kresilient.producer import Spool
spool = Spool(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
spool.close()
print("closed", flush=True)
sys.stdin.readline()
"""

_OPENER = """
import sys
from kresilient.producer import Spool, SpoolError
try:
    spool = Spool(sys.argv[1])
except SpoolError as exc:
    print("refused", exc, flush=True)
else:
    print("opened", spool.stored(), flush=True)
    spool.close()
"""


def _python(code: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], text=True, stdout=subprocess.PIPE, **kwargs
    )


def test_a_second_process_on_the_same_file_is_refused(tmp_path: Path) -> None:
    """Issue 35 #2 across processes (pre-fork workers, a deploy overlap): the lock is an OS
    lock. Each direction, with the holder's pid in the error; then the negative control: once
    the holder closed, the other process opens the file."""
    path = tmp_path / "s.db"
    _fill(path, [b"kept"])
    # This process holds it: another process is refused, naming this pid.
    mine = Spool(path)
    opener = _python(_OPENER, str(path))
    out, _ = opener.communicate(timeout=120)
    assert out.startswith("refused"), out
    assert str(path) in out and f"process {os.getpid()} on" in out
    mine.close()
    # Another process holds it: this process is refused, naming that pid.
    with _python(_HOLDER, str(path), stdin=subprocess.PIPE) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(SpoolError) as info:
            Spool(path)
        assert f"process {holder.pid} on" in str(info.value), info.value
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "closed"
        # Negative control: the holder closed (and still runs): the file opens again.
        reopened = Spool(path)
        assert reopened.stored() == (1, 1)
        reopened.close()
        holder.stdin.write("\n")
        holder.stdin.flush()
    assert holder.returncode == 0


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    """The lock ends with its process (SIGKILL included): a crashed producer's successor
    opens the file and recovers what it holds (no stale lock file to clean up)."""
    path = tmp_path / "s.db"
    _fill(path, [b"kept"])
    with _python(_HOLDER, str(path), stdin=subprocess.PIPE) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(SpoolError, match="already open"):
            Spool(path)  # control: it does hold the lock
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=60)
    spool = Spool(path)
    assert spool.stored() == (1, 1)
    spool.close()


def test_a_forked_child_can_neither_use_nor_reopen_its_parents_spool(tmp_path: Path) -> None:
    """Issue 35 #2, pre-fork workers: a child forked after the spool was opened inherits the
    producer, the spool and a copy of the lock's descriptor. It must not produce through the
    parent's spool (same spool id and sequence: colliding ids, one SQLite connection in two
    processes) nor open the same file; its exit must not release the parent's lock."""
    path = tmp_path / "s.db"
    spool = Spool(path)
    producer = _producer(spool)
    producer.produce("t", b"parent-before")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what each use did; never return into pytest
        code = 1
        try:
            signal.alarm(60)  # a hang (the old code in a forked librdkafka) kills the child
            os.close(read_end)
            results: dict[str, str] = {}
            calls: list[tuple[str, Callable[[], object]]] = [
                ("produce", lambda: producer.produce("t", b"child")),
                ("stored", spool.stored),
                ("reopen", lambda: Spool(path)),
                ("flush", lambda: producer.flush(0)),
            ]
            for name, call in calls:
                try:
                    call()
                    results[name] = "returned"
                except SpoolError as exc:
                    results[name] = f"SpoolError: {exc}"
                except BaseException as exc:
                    results[name] = f"{type(exc).__name__}: {exc}"
            spool.close()  # in the child: must not release the parent's lock
            os.write(write_end, json.dumps(results).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    results = json.loads(data)
    parent = os.getpid()
    for name in ("produce", "stored", "flush"):
        assert results[name].startswith("SpoolError"), results
        assert f"opened by process {parent}" in results[name], results
        assert "fork" in results[name], results
    assert results["reopen"].startswith("SpoolError"), results
    assert f"already open in process {parent} on" in results["reopen"], results
    # The parent's lock survived the child's close() and exit; its spool still works.
    with pytest.raises(SpoolError, match="already open"):
        Spool(path)
    producer.produce("t", b"parent-after")
    assert producer.flush(0.2) == FlushResult(delivered=0, spooled=2)
    producer.close(0.3)
    assert sorted(_stored_values(path)) == [b"parent-after", b"parent-before"]
    reopened = Spool(path)  # control: the parent's close() released it
    reopened.close()


# ---------------------------------------------------------------------- defect 3: not corrupt


def _quarantined(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


def test_a_locked_spool_file_is_not_quarantined(tmp_path: Path) -> None:
    """Issue 35 #3. Another SQLite connection (an sqlite3 shell, a backup) holds the write
    lock: the open fails with "database is locked", which is not corruption. The file is left
    in place, no quarantine copy appears, and once the lock is gone its messages are all
    there (the old code renamed it aside: the next Spool started empty)."""
    path = tmp_path / "s.db"
    values = [b"m%d" % i for i in range(20)]
    _fill(path, values)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        with pytest.raises(SpoolError) as info:
            Spool(path)
        assert not isinstance(info.value, SpoolCorruptError), info.value
        assert "locked" in str(info.value) and str(path) in str(info.value)
        assert "another program holds a lock" in info.value.classification.remedy
        assert path.exists() and not _quarantined(path)
    finally:
        other.execute("ROLLBACK")
        other.close()
    spool = Spool(path)  # the lock is gone: everything is still stored
    assert spool.stored() == (1, 20)
    spool.close()
    assert _stored_values(path) == values


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


def _fill_disk(directory: Path) -> Path:
    """Write a file until the file system is full; return it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == 28, exc  # ENOSPC
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_at_open_is_not_quarantined(tiny_disk: Path) -> None:
    """Issue 35 #3. The disk is full when the spool is opened (SQLite reports "disk I/O
    error": it cannot size the shared-memory file): not corruption. The file stays; once
    space is freed it opens with everything it held."""
    path = tiny_disk / "s.db"
    _fill(path, [b"a", b"b", b"c"])
    filler = _fill_disk(tiny_disk)
    with pytest.raises(SpoolError) as info:
        Spool(path)
    assert not isinstance(info.value, SpoolCorruptError), info.value
    assert "I/O error" in str(info.value) and str(path) in str(info.value)
    assert path.exists() and not _quarantined(path)
    filler.unlink()
    spool = Spool(path)
    assert spool.stored() == (1, 3)
    spool.close()


def test_negative_control_a_corrupt_file_is_still_quarantined(tmp_path: Path) -> None:
    """Real corruption (not a database; a page SQLite's check finds damaged) still is."""
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all\n" * 100)
    with pytest.raises(SpoolCorruptError) as info:
        Spool(garbage)
    assert not garbage.exists() and Path(info.value.quarantined).exists()
    truncated = tmp_path / "truncated.db"
    _fill(truncated, [b"%05d" % i + b"x" * 1000 for i in range(3000)])
    with truncated.open("r+b") as f:
        f.truncate(truncated.stat().st_size // 2)
    with pytest.raises(SpoolCorruptError):
        Spool(truncated)
    assert _quarantined(truncated)
    fresh = Spool(truncated)  # the lock file stays the path's: a new spool opens
    assert fresh.stored() == (0, 0)
    fresh.close()


def test_an_unknown_version_is_refused_not_quarantined(tmp_path: Path) -> None:
    """A file of a newer spool version is intact: refused, left as it is (the old code
    renamed it aside as corrupt)."""
    path = tmp_path / "s.db"
    _fill(path, [b"a"])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET v = '99' WHERE k = 'version'")
    conn.commit()
    conn.close()
    with pytest.raises(SpoolError, match="unknown spool version") as info:
        Spool(path)
    assert not isinstance(info.value, SpoolCorruptError)
    assert path.exists() and not _quarantined(path)


# ---------------------------------------------------------------------- suspicion: os/fsync threads


class _CommitLockAfterSecondProduce:
    """The driver's commit lock, holding the first (armed) commit back until another
    thread's produce() added its message to the open segment: the two messages are then
    stored by one commit, whichever thread's it is (made certain, not left to the scheduler)."""

    def __init__(self, lock: Any, driver: Any) -> None:
        self.lock = lock
        self.driver = driver
        self.armed = False
        self.waiting = threading.Event()

    def __enter__(self) -> Any:
        if self.armed:
            self.armed = False
            target = self.driver._seq + 1  # once the other thread's message has its number
            self.waiting.set()
            _wait_for(lambda: self.driver._seq >= target, "the second produce()")
        return self.lock.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.lock.__exit__(*exc)


def _two_threads_one_commit(producer: ResilientProducer) -> dict[str, Any]:
    """Thread A produces; its commit waits until thread B's message is in the open segment.
    Returns what each produce() returned or raised."""
    driver: Any = producer._spooler
    hook = _CommitLockAfterSecondProduce(driver._commit_lock, driver)
    driver._commit_lock = hook
    outcome: dict[str, Any] = {}

    def produce(name: str) -> None:
        try:
            outcome[name] = producer.produce(f"topic-{name}", name.encode() * 20_000)
        except BaseException as exc:  # recorded, asserted by the test
            outcome[name] = exc

    hook.armed = True
    a = threading.Thread(target=produce, args=("a",))
    a.start()
    assert hook.waiting.wait(60)
    b = threading.Thread(target=produce, args=("b",))
    b.start()
    a.join(120)
    b.join(120)
    assert not a.is_alive() and not b.is_alive()
    driver._commit_lock = hook.lock
    return outcome


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_a_failed_commit_raises_in_every_produce_whose_message_it_held(
    tiny_disk: Path, durability: str
) -> None:
    """Issue 35 suspicion, confirmed: in "os"/"fsync" mode a produce() returns only once its
    message is stored. With two threads, A's commit can take B's message too; when that
    commit fails (a full disk, real), B's produce() returned normally on the old code (its
    message listed by flush() instead), breaking "every returned produce() is stored". Now
    both raise SpoolError naming their topic, and neither is listed again by flush()."""
    path = tiny_disk / "s.db"
    producer = _producer(Spool(path, durability=durability))  # type: ignore[arg-type]
    filler = _fill_disk(tiny_disk)
    outcome = _two_threads_one_commit(producer)
    for name in ("a", "b"):
        error = outcome[name]
        assert isinstance(error, SpoolError), f"produce() of {name} returned {error!r}"
        assert error.topic == f"topic-{name}"
        assert error.classification.category is ErrorCategory.BACKPRESSURE
    filler.unlink()
    # Reported once each: by produce(), not by flush() as well.
    assert producer.flush(0.2) == FlushResult(delivered=0, spooled=0)
    producer.produce("t", b"after")  # the disk has room again: stored
    producer.close(0.3)
    assert _stored_values(path) == [b"after"]


@pytest.mark.parametrize("durability", ["os", "fsync"])
def test_negative_control_with_room_both_produces_return_and_are_stored(
    tmp_path: Path, durability: str
) -> None:
    path = tmp_path / "s.db"
    producer = _producer(Spool(path, durability=durability))  # type: ignore[arg-type]
    outcome = _two_threads_one_commit(producer)
    assert not any(isinstance(v, BaseException) for v in outcome.values()), outcome
    assert producer.flush(0.2) == FlushResult(delivered=0, spooled=2)
    producer.close(0.3)
    assert sorted(_stored_values(path)) == [b"a" * 20_000, b"b" * 20_000]


# ---------------------------------------------------------------------- id audit (issue 35 #4)


def _ids_and_marks(bootstrap: str, topic: str) -> list[tuple[bytes, bytes, bool]]:
    from _producer_helpers import header_dict, read_back

    out = []
    for msg in read_back(bootstrap, topic):
        h = header_dict(msg)
        ident = h["kresilient.message.id"]
        assert ident is not None
        out.append((msg.value(), ident, h.get("kresilient.possible.duplicate") == b"true"))
    return out


def _deliver(bootstrap: str, path: Path, topic: str, values: list[bytes]) -> None:
    with ResilientProducer({"bootstrap.servers": bootstrap}, spool=Spool(path)) as producer:
        for v in values:
            producer.produce(topic, v)
        result = producer.flush(60)
        assert result is not None and result.complete, result


@pytest.mark.integration
def test_copied_restored_and_recreated_spool_files_never_mint_one_id_twice(
    kafka_cluster: Any, topic: str, tmp_path: Path
) -> None:
    """Issue 35 #4 for the spool. A file copied (a backup restored, a VM/container image
    with the file, the same path on two hosts) used to continue the same id and sequence in
    both places: distinct messages got one kresilient.message.id, and a marked re-send of
    one is dropped by Deduplicator as a copy of the other. Each open now mints its own id
    prefix; stored messages keep theirs, so their re-sends are still recognised."""
    bootstrap = kafka_cluster.bootstrap_servers
    original = tmp_path / "host-a" / "spool.db"
    original.parent.mkdir()
    _fill(original, [b"stored-1", b"stored-2"], topic)  # unacknowledged, in the file
    _deliver(bootstrap, original, topic, [b"first-%d" % i for i in range(3)])  # re-sends 2
    copy = tmp_path / "host-b" / "spool.db"
    copy.parent.mkdir()
    _fill(original, [b"stored-3"], topic)
    shutil.copy(original, copy)  # the copy holds stored-3, and the same history
    _deliver(bootstrap, original, topic, [b"original-%d" % i for i in range(3)])
    _deliver(bootstrap, copy, topic, [b"copy-%d" % i for i in range(3)])
    original.unlink()  # deleted and re-created on the same path
    _deliver(bootstrap, original, topic, [b"recreated-%d" % i for i in range(3)])
    records = _ids_and_marks(bootstrap, topic)
    by_value: dict[bytes, set[bytes]] = {}
    for value, ident, _marked in records:
        by_value.setdefault(value, set()).add(ident)
    # One id per message (stored-3 was re-sent from both files: one id, both copies marked)...
    assert all(len(ids) == 1 for ids in by_value.values()), by_value
    assert [marked for v, _, marked in records if v == b"stored-3"] == [True, True]
    # ...and no id shared by two messages.
    owners: dict[bytes, bytes] = {}
    for value, ids in by_value.items():
        (ident,) = ids
        assert owners.setdefault(ident, value) == value, (ident, owners[ident], value)
    # What it means downstream: every distinct message is processed once.
    dedupe = Deduplicator()
    processed = []
    for value, ident, marked in records:
        msg = _Record(value, ident, marked)
        if dedupe.is_duplicate(msg):
            continue
        processed.append(value)
        dedupe.processed(msg)
    assert sorted(processed) == sorted(by_value)


class _Record:
    """A read-back record as Deduplicator sees it (topic and headers)."""

    def __init__(self, value: bytes, ident: bytes, marked: bool) -> None:
        self._headers = [("kresilient.message.id", ident)]
        if marked:
            self._headers.append(("kresilient.possible.duplicate", b"true"))
        self.value = value

    def headers(self) -> list[tuple[str, bytes]]:
        return self._headers

    def topic(self) -> str:
        return "t"


@pytest.mark.integration
def test_a_version_1_file_is_migrated_and_its_messages_keep_their_ids(
    kafka_cluster: Any, topic: str, tmp_path: Path
) -> None:
    """A spool file written before issue 35 (schema version 1: one id for the file) is
    migrated at open: its stored messages are re-sent with the ids they had (marked), the
    new ones get the new open's prefix."""
    import zlib

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE meta(k TEXT PRIMARY KEY, v TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE segments(id INTEGER PRIMARY KEY, n INTEGER NOT NULL,"
        " nbytes INTEGER NOT NULL, crc INTEGER NOT NULL, data BLOB NOT NULL)"
    )
    conn.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("version", "1"), ("id", "00c0ffee00c0ffee"), ("seq", "1")],
    )
    records = [(7, topic, b"old-7", None, -1, 0, None), (8, topic, b"old-8", None, -1, 0, None)]
    data = marshal.dumps(records)
    conn.execute("INSERT INTO segments VALUES (1, 2, 200, ?, ?)", (zlib.crc32(data), data))
    conn.commit()
    conn.close()
    bootstrap = kafka_cluster.bootstrap_servers
    _deliver(bootstrap, path, topic, [b"new-9"])
    got = {value: (ident, marked) for value, ident, marked in _ids_and_marks(bootstrap, topic)}
    assert got[b"old-7"] == (b"00c0ffee00c0ffee-7", True)
    assert got[b"old-8"] == (b"00c0ffee00c0ffee-8", True)
    ident, marked = got[b"new-9"]
    assert ident.endswith(b"-9") and not ident.startswith(b"00c0ffee00c0ffee") and not marked
