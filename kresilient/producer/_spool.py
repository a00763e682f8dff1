"""The crash-safe local spool of :class:`~kresilient.ResilientProducer` (a write-ahead log).

Every message of a spooled producer is appended to a SQLite database in WAL mode before it
is handed to librdkafka, and removed once Kafka acknowledged it. Messages are stored in
*segments*: one row per group commit holding the batch as one ``marshal`` blob with a CRC32
(one row per message cost 4-8 µs per message in SQLite; one row per batch about 1.3 µs,
measured in docs/durability.md). A restarted producer re-sends what its predecessor left, in
the original order, each message carrying its stable ``kresilient.message.id`` header and
``kresilient.possible.duplicate: true`` (it may already be in Kafka).

Two classes:

* :class:`Spool` — the storage (lock, open, check, quarantine, append, delete). Thread-safe;
  one per file (an OS lock), one process (a forked child disowns it).
* ``SpoolDriver`` — the producer side (private): batches ``produce()`` calls, commits them,
  hands committed messages to librdkafka in order, keeps messages whose delivery failed for
  a transient reason (timeout, purge, outage) and re-sends them instead of reporting them lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import marshal
import os
import socket
import sqlite3
import threading
import time
import uuid
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from confluent_kafka import KafkaError, KafkaException

from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER
from kresilient.errors import (
    Classification,
    DeliveryFailure,
    ErrorCategory,
    ProduceError,
    SpoolCorruptError,
    SpoolError,
    classify,
    failure_from_report,
    is_unproducible,
)
from kresilient.producer._handle import DeliveryHandle, _FullHandle

__all__ = [
    "MESSAGE_ID_HEADER",
    "POSSIBLE_DUPLICATE_HEADER",
    "FlushResult",
    "Spool",
    "SpoolCorruptError",
    "SpoolError",
]

Durability = Literal["group", "fsync", "os"]
_DURABILITY: Final = ("group", "fsync", "os")
#: 2: each segment stores the id prefix its messages were sent with (``segments.sid``); a
#: version 1 file (one prefix for the whole file) is migrated at open.
_SCHEMA_VERSION: Final = 2
#: SQLite's primary result codes that mean the file's content is damaged: the only errors at
#: open that quarantine the file (with the spool's own checks, ``_Damaged``).
_CORRUPTION_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_RETRY_OPEN: Final = ", then open the spool again"
#: What to do when the file cannot be opened for another reason, by SQLite's primary result
#: code. The file is left as it is: its messages are still there for the next open.
_OPEN_REMEDIES: Final[Mapping[int, str]] = {
    sqlite3.SQLITE_BUSY: "another program holds a lock on the spool file (an sqlite3 shell, "
    "a backup tool): let it finish" + _RETRY_OPEN,
    sqlite3.SQLITE_LOCKED: "another connection holds a lock on the spool file: let it finish"
    + _RETRY_OPEN,
    sqlite3.SQLITE_FULL: "the spool's disk is full: free space" + _RETRY_OPEN,
    sqlite3.SQLITE_IOERR: "the spool file could not be read or written (an I/O error; a full "
    "disk shows as one too): check its file system and free space" + _RETRY_OPEN,
    sqlite3.SQLITE_READONLY: "the spool file or its directory is read-only: make it writable"
    + _RETRY_OPEN,
    sqlite3.SQLITE_PERM: "the spool file may not be opened: check its permissions" + _RETRY_OPEN,
    sqlite3.SQLITE_CANTOPEN: "the spool file cannot be opened: check the path, its directory "
    "and permissions" + _RETRY_OPEN,
}
_OPEN_REMEDY: Final = "the spool file could not be opened (see the error)" + _RETRY_OPEN
#: Beside the spool file: the OS-level lock that makes a spool file one Spool's at a time.
_LOCK_SUFFIX: Final = ".lock"
#: Per-record bytes counted against max_bytes besides key, value and headers.
_RECORD_OVERHEAD: Final = 64
#: A group commit also happens when the batch reaches this many messages.
_MAX_BATCH: Final = 5000
#: Categories of a failed delivery that keep the message in the spool for a re-send.
_KEEP: Final = frozenset(
    {
        ErrorCategory.DELIVERY_TIMEOUT,
        ErrorCategory.TRANSIENT,
        ErrorCategory.LEADERSHIP,
        ErrorCategory.BACKPRESSURE,
        ErrorCategory.FATAL_PRODUCER,
    }
)

_PENDING: Final = 0
_INFLIGHT: Final = 1
_DONE: Final = 2
#: os/fsync: its commit failed while its produce() was still running (it may have been
#: taken by another thread's commit): that produce() raises ``_error``.
_UNSTORED: Final = 3


def _storage_classification(remedy: str) -> Classification:
    """BACKPRESSURE (the local store cannot take more now) with a storage-specific remedy."""
    base = classify(BufferError())
    return dataclasses.replace(base, remedy=remedy)


def _state_classification(remedy: str) -> Classification:
    """CONFIG (a spool used where it may not be: fix the deployment) with a remedy."""
    base = classify(KafkaError(KafkaError._STATE, "spool"))
    return dataclasses.replace(base, remedy=remedy)


class _Damaged(Exception):
    """What the spool's own checks found wrong in the file's content (it is quarantined)."""


class _Unusable(Exception):
    """The file is intact but cannot be used as it is (it is left untouched)."""


def _sqlite_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of an error (``None`` when SQLite gave none)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


#: Open spools of this process: a forked child disowns them (``_disown_after_fork``).
_OPEN_SPOOLS: Final[weakref.WeakSet[Spool]] = weakref.WeakSet()
#: Connections a forked child inherited: kept, never used nor closed in the child (SQLite: a
#: connection must not cross fork(); closing it there could checkpoint the parent's file).
_INHERITED: Final[list[sqlite3.Connection]] = []


def _disown_after_fork() -> None:
    """In a forked child: every spool of the parent becomes unusable here (see Spool)."""
    for spool in list(_OPEN_SPOOLS):
        spool._disown()
    _OPEN_SPOOLS.clear()


os.register_at_fork(after_in_child=_disown_after_fork)


def _lock_holder(fd: int) -> str:
    """Who holds a spool's lock, as its holder wrote it into the lock file."""
    try:
        fields = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
    except OSError:
        fields = []
    if len(fields) >= 2 and fields[0].isdigit():
        pid, host = int(fields[0]), fields[1]
        if pid == os.getpid() and host == socket.gethostname():
            return f"this process (pid {pid}): another Spool object on the same file"
        return f"process {pid} on {host}"
    return "another process (it has not recorded its pid yet)"


def _lock_file(path: Path) -> int:
    """Take the spool file's lock (``<path>.lock``, flock): raise if another Spool has it.

    ``flock`` locks belong to the open file description: a second ``open()`` of the lock
    file, in this process or any other, is refused while the first holds it, and the lock
    ends with its holder (close, or the process's death: SIGKILL included). It is a lock
    beside the database, not on it, because SQLite's own POSIX locks on the database file
    would be released by any close() of that file in this process.
    """
    lock_path = str(path) + _LOCK_SUFFIX
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise SpoolError(
            f"spool {path}: its lock file {lock_path} cannot be opened ({exc}); the spool "
            "was not opened",
            code=KafkaError._FS,
            name="_FS",
            classification=_storage_classification(
                "the spool's directory must be writable: check its path and permissions"
            ),
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _lock_holder(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise SpoolError(
                f"spool {path}: its lock file {lock_path} cannot be locked ({exc}); the "
                "spool was not opened",
                code=KafkaError._FS,
                name="_FS",
                classification=_storage_classification(
                    "the spool needs a local file system with flock(): do not put it on a "
                    "network file system"
                ),
            ) from exc
        raise SpoolError(
            f"spool file {path} is already open in {holder} (it holds {lock_path}); a "
            "second Spool on the same file is refused: the two would give distinct messages "
            "the same kresilient.message.id. Nothing was read or changed",
            code=KafkaError._STATE,
            name="_STATE",
            classification=_state_classification(
                "one Spool per file: give each process (each pre-fork worker) a path of its "
                "own, or close() the other Spool first (a deploy overlap: the new process "
                "opens the file once the old one closed it)"
            ),
        ) from None
    # Who holds it, for the error of the next opener; only informational (a full disk may
    # refuse the write: the lock itself holds all the same).
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


@dataclass(frozen=True, kw_only=True, slots=True)
class FlushResult:
    """What :meth:`ResilientProducer.flush` of a spooled producer returns.

    ``delivered``: messages acknowledged by Kafka since the previous flush. ``spooled``:
    messages safely stored in the spool but not acknowledged yet (the cluster is down or slow);
    they are re-sent by this producer, or by the next one opened on the same spool file.
    ``complete`` is true when nothing is left (``spooled == 0``). Messages that can never be
    produced (too large, invalid) are not counted here: ``flush()`` raises
    :class:`~kresilient.DeliveryError` for them, as without a spool.
    """

    delivered: int
    spooled: int

    @property
    def complete(self) -> bool:
        """True when every message was acknowledged."""
        return self.spooled == 0


class _Segment:
    """One group commit: its messages (the handles), stored as one row once committed.

    Produced messages join the open segment (``SpoolDriver._open``); a commit stores it and
    opens the next. ``acks``/``fails`` are the driver's report queues, reached from a
    handle's delivery report through its segment (one attribute less per message).
    """

    __slots__ = ("acks", "entries", "fails", "id", "left", "nbytes", "prefix")

    def __init__(self, acks: deque[Any], fails: deque[Any], prefix: bytes) -> None:
        self.id = 0
        #: ``<spool id>-``: the id prefix of the messages of this segment (of the Spool that
        #: stored it: a recovered segment keeps its first producer's).
        self.prefix = prefix
        self.entries: list[Any] = []
        self.nbytes = 0
        self.left = 0
        self.acks = acks
        self.fails = fails


def _spool_report(self: Any, err: Any, msg: Any) -> None:
    """librdkafka's delivery report of a spooled message (the handle is the callback).

    Only attribute stores and deque appends here (see DeliveryHandle.__call__ on why); the
    driver settles outside librdkafka's callback. ``_msg`` is set on success only: a failed
    message the spool keeps is re-sent and its handle stays pending.
    """
    if err is None:
        self._msg = msg
        self._seg.acks.append(self)
    else:
        self._seg.fails.append((self, err, msg))


class _SpoolHandle(DeliveryHandle):
    """The handle of a spooled message, also its spool entry (one object per message).

    ``_rec``: the stored record ``(seq, topic, value, key, partition, timestamp, headers)``;
    ``_seg``: its segment; ``_state``: pending, in flight or done; ``_dup``: re-sent with the
    possible-duplicate mark.
    """

    __slots__ = ("_dup", "_rec", "_seg", "_state")

    _dup: bool
    _rec: tuple[Any, ...]
    _seg: _Segment
    _state: int

    __call__ = _spool_report


class _SpoolFullHandle(_FullHandle):
    """A spooled message with headers, a callback or a span (see ``_SpoolHandle``)."""

    __slots__ = ("_dup", "_rec", "_seg", "_state")

    _dup: bool
    _rec: tuple[Any, ...]
    _seg: _Segment
    _state: int

    __call__ = _spool_report


_new_handle = object.__new__


def _report(handle: Any, err: Any, msg: Any) -> None:
    """A final delivery report for the application's handle (its plain handle behaviour)."""
    if isinstance(handle, _FullHandle):
        _FullHandle.__call__(handle, err, msg)
    else:
        DeliveryHandle.__call__(handle, err, msg)


class Spool:
    """A crash-safe local write-ahead log for :class:`~kresilient.ResilientProducer`.

    Args:
        path: the SQLite file (created with its directory; ``-wal``/``-shm`` files beside it).
        durability: what a stored message survives (docs/durability.md):

            * ``"group"`` (default): ``produce()`` returns at once; messages are committed and
              fsync'ed together every ``group_commit_ms`` (or 5,000 messages, or at
              ``flush()``) and handed to Kafka only then. A committed message survives a
              process kill and a power loss; a crash loses the messages of the last
              ``group_commit_ms``, which were never handed to Kafka either.
            * ``"fsync"``: each ``produce()`` commits and fsyncs its message before returning:
              every returned ``produce()`` survives a power loss. Slow (one fsync each).
            * ``"os"``: each ``produce()`` commits its message to the OS (WAL write, fsync only
              at checkpoints): every returned ``produce()`` survives a process kill; a power
              loss may lose the latest ones (the file stays consistent).
        group_commit_ms: the group-commit interval (``"group"`` only).
        max_bytes: bound of the stored messages (keys, values, headers, 64 bytes each
            besides); a ``produce()`` that would exceed it waits (``backpressure_timeout``)
            and then raises a BACKPRESSURE :class:`SpoolError`. The spool's content is also
            held in memory: this bounds both.

    One Spool per file: the file is locked (``flock`` on ``<path>.lock``, across processes)
    from the open to :meth:`close` (or the process's end); a second ``Spool(path)``, in this
    process or another, raises :class:`SpoolError` naming the holder's pid and host. A
    forked child does not inherit the spool: there every use of it raises
    :class:`SpoolError`; open a Spool on a path of the child's own after the fork.

    Message ids are ``<spool id>-<sequence>``; ``spool_id`` is random (64 bits) for each
    open, so a copied or restored file, a file re-created on the same path or the same path
    on two hosts never mint one id twice. A recovered message keeps the id it was first sent
    with (stored with its segment).

    A file that SQLite or the segment checksums find corrupt is renamed aside to
    ``<path>.corrupt-<UTC time>`` and :class:`SpoolCorruptError` is raised naming it. Any
    other error at open (the file locked by another program, an I/O error, a full disk, an
    unknown version) raises :class:`SpoolError` and leaves the file as it is.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "group",
        group_commit_ms: float = 10.0,
        max_bytes: int = 256 * 1024 * 1024,
    ) -> None:
        if durability not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, got {durability!r}")
        if group_commit_ms <= 0 or max_bytes <= 0:
            raise ValueError("group_commit_ms and max_bytes must be positive")
        self.path = Path(path)
        self.durability: Durability = durability
        self.group_commit_s = float(group_commit_ms) / 1000.0
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        #: Set in a forked child: the pid of the parent that opened the spool.
        self._parent_pid: int | None = None
        #: The attached driver's reaction to a fork (a weak reference: no cycle).
        self._on_fork: weakref.WeakMethod[Callable[[], None]] | None = None
        self._lockfd = -1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lockfd = _lock_file(self.path)
        try:
            self._conn, self.next_seq, self._loaded = self._open()
        except BaseException:
            self._unlock()
            raise
        #: The id prefix of the messages this open stores (fresh for each open, see above).
        self.spool_id = os.urandom(8).hex()
        self.closed = False
        #: The driver attached to this spool (one producer per spool).
        self.attached = False
        _OPEN_SPOOLS.add(self)

    # ------------------------------------------------------------------ open and check

    def _open(self) -> tuple[sqlite3.Connection, int, list[tuple[int, list[Any], int, bytes]]]:
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise _Unusable(f"could not switch to WAL mode (got {mode!r})")
            sync = "NORMAL" if self.durability == "os" else "FULL"
            conn.execute(f"PRAGMA synchronous={sync}")
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise _Damaged(f"quick_check: {check}")
            conn.execute("BEGIN IMMEDIATE")
            try:
                meta = self._prepare(conn)
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            loaded: list[tuple[int, list[Any], int, bytes]] = []
            for seg_id, n, nbytes, crc, data, sid in conn.execute(
                "SELECT id, n, nbytes, crc, data, sid FROM segments ORDER BY id"
            ):
                if zlib.crc32(data) != crc:
                    raise _Damaged(f"segment {seg_id}: checksum mismatch")
                try:
                    records = marshal.loads(data)
                except (ValueError, EOFError, TypeError) as exc:
                    raise _Damaged(f"segment {seg_id}: {exc}") from None
                if not isinstance(records, list) or len(records) != n:
                    raise _Damaged(f"segment {seg_id}: wrong record count")
                if not isinstance(sid, str) or not sid:
                    raise _Damaged(f"segment {seg_id}: no id prefix")
                loaded.append((seg_id, records, nbytes, sid.encode() + b"-"))
            # The sequence is written to meta only when segments are deleted or rewritten; the
            # stored segments carry it otherwise (one statement per commit instead of two).
            next_seq = int(meta["seq"])
            if loaded:
                next_seq = max(next_seq, max(r[0] for r in loaded[-1][1]) + 1)
            return conn, next_seq, loaded
        except _Damaged as exc:
            self._close_quietly(conn)
            raise self._quarantine(exc) from exc
        except (sqlite3.Error, _Unusable, OSError) as exc:
            self._close_quietly(conn)
            if isinstance(exc, sqlite3.Error) and _sqlite_code(exc) in _CORRUPTION_CODES:
                raise self._quarantine(exc) from exc
            raise self._unopenable(exc) from exc

    @staticmethod
    def _prepare(conn: sqlite3.Connection) -> dict[str, str]:
        """Create the tables of a new file, migrate a version 1 file; return the meta rows."""
        conn.execute("CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS segments(id INTEGER PRIMARY KEY, n INTEGER NOT NULL,"
            " nbytes INTEGER NOT NULL, crc INTEGER NOT NULL, data BLOB NOT NULL, sid TEXT)"
        )
        meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
        if not meta:
            meta = {"version": str(_SCHEMA_VERSION), "seq": "1"}
            conn.executemany("INSERT INTO meta VALUES (?, ?)", list(meta.items()))
        elif meta.get("version") == "1":
            # Version 1 had one id for the file (meta 'id'): its segments keep it, new ones
            # get the id of the open that stores them.
            conn.execute("ALTER TABLE segments ADD COLUMN sid TEXT")
            conn.execute("UPDATE segments SET sid = ?", (meta.get("id", ""),))
            conn.execute("UPDATE meta SET v = ? WHERE k = 'version'", (str(_SCHEMA_VERSION),))
            meta["version"] = str(_SCHEMA_VERSION)
        if meta.get("version") != str(_SCHEMA_VERSION):
            raise _Unusable(
                f"unknown spool version {meta.get('version')!r} (this kresilient reads "
                f"{_SCHEMA_VERSION}): written by a newer kresilient?"
            )
        return meta

    @staticmethod
    def _close_quietly(conn: sqlite3.Connection | None) -> None:
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    def _unopenable(self, exc: BaseException) -> SpoolError:
        """An error at open that is not corruption: the file stays as it is."""
        code = _sqlite_code(exc)
        remedy = _OPEN_REMEDIES.get(code, _OPEN_REMEDY) if code is not None else _OPEN_REMEDY
        if isinstance(exc, _Unusable):
            remedy = "open it with the kresilient version that wrote it, or move it aside"
        return SpoolError(
            f"spool file {self.path} could not be opened ({exc}); it was left as it is "
            "(not quarantined: nothing was moved or deleted, its stored messages are still "
            "in it)",
            code=KafkaError._FS,
            name="_FS",
            classification=_storage_classification(remedy),
        )

    def _quarantine(self, exc: BaseException) -> SpoolCorruptError:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{uuid.uuid4().hex[:6]}")
        moved = False
        for suffix in ("", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                src.rename(str(target) + suffix)
                moved = True
        where = str(target) if moved else str(self.path)
        return SpoolCorruptError(
            f"spool file {self.path} is corrupt ({exc}); it was renamed to {where} "
            "(nothing deleted). A new Spool on the same path starts empty; recover what the "
            "old file holds with `sqlite3 <file> .recover` if it matters",
            quarantined=where,
            code=KafkaError._FS,
            name="_FS",
            classification=_storage_classification(
                "the spool file is corrupt and was quarantined: inspect it; its messages were "
                "not re-sent"
            ),
        )

    # ------------------------------------------------------------------ read and write

    def take_loaded(self) -> list[tuple[int, list[Any], int, bytes]]:
        """The segments found at open (``(id, records, nbytes)``), once."""
        loaded, self._loaded = self._loaded, []
        return loaded

    def append(
        self, seg_id: int, records: list[tuple[Any, ...]], nbytes: int, deletes: list[int]
    ) -> None:
        """Store one segment (and delete acknowledged ones) in one transaction."""
        data = marshal.dumps(records)
        last_seq = records[-1][0] + 1 if records else self.next_seq
        row = (seg_id, len(records), nbytes, zlib.crc32(data), data, self.spool_id)
        with self._lock:
            conn = self._connection()
            if not deletes:  # one statement: its own transaction (autocommit)
                conn.execute(_INSERT, row)
                self.next_seq = last_seq
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_INSERT, row)
                conn.executemany("DELETE FROM segments WHERE id = ?", [(i,) for i in deletes])
                conn.execute("UPDATE meta SET v = ? WHERE k = 'seq'", (str(last_seq),))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            self.next_seq = last_seq

    def delete(self, seg_ids: list[int]) -> None:
        """Remove acknowledged segments."""
        if not seg_ids:
            return
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("DELETE FROM segments WHERE id = ?", [(i,) for i in seg_ids])
                conn.execute("UPDATE meta SET v = ? WHERE k = 'seq'", (str(self.next_seq),))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def replace(self, seg_id: int, records: list[tuple[Any, ...]], nbytes: int) -> None:
        """Rewrite a partly acknowledged segment with the records still unacknowledged."""
        data = marshal.dumps(records)
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE segments SET n = ?, nbytes = ?, crc = ?, data = ? WHERE id = ?",
                (len(records), nbytes, zlib.crc32(data), data, seg_id),
            )
            conn.execute("UPDATE meta SET v = ? WHERE k = 'seq'", (str(self.next_seq),))
            conn.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._check_process()
            raise SpoolError(
                f"spool {self.path} is closed",
                code=KafkaError._STATE,
                name="_STATE",
                classification=classify(KafkaError(KafkaError._STATE, "closed")),
            )
        return self._conn

    def stored(self) -> tuple[int, int]:
        """(segments, messages) currently in the file."""
        with self._lock:
            row = self._connection().execute("SELECT count(*), coalesce(sum(n), 0) FROM segments")
            segments, messages = row.fetchone()
        return int(segments), int(messages)

    def close(self) -> None:
        """Close the file and release its lock (idempotent). What it holds is re-sent by the
        next producer. In a forked child it does nothing: the parent's spool stays open."""
        with self._lock:
            conn, self._conn = self._conn, None
            self.closed = True
        try:
            if conn is not None:
                conn.close()
        finally:
            # After the connection's close (its checkpoint): the next opener finds it done.
            self._unlock()
            _OPEN_SPOOLS.discard(self)

    def _unlock(self) -> None:
        fd, self._lockfd = self._lockfd, -1
        if fd < 0:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        # A Spool dropped without close(): its descriptor (and so its lock) goes with it, as
        # the connection does. Never LOCK_UN here: in a child that kept a copy it is the
        # parent's lock (the fork hook closed the child's copy already).
        fd = getattr(self, "_lockfd", -1)
        if fd >= 0 and getattr(self, "_pid", None) == os.getpid():
            self._lockfd = -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def _disown(self) -> None:
        """In a forked child (the fork hook): this spool is the parent's, not ours.

        The child's copy of the lock descriptor is closed without unlocking (the lock is the
        open file description's, shared with the parent: unlocking would release the
        parent's), so it ends with the parent; the connection is kept unused (SQLite: a
        connection must not cross fork()). Every later use raises (``_check_process``).
        """
        self._lock = threading.Lock()  # a parent thread may have held it at the fork
        self._parent_pid = self._pid
        fd, self._lockfd = self._lockfd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)
        conn, self._conn = self._conn, None
        if conn is not None:
            _INHERITED.append(conn)
        callback = self._on_fork() if self._on_fork is not None else None
        if callback is not None:
            callback()

    def _check_process(self) -> None:
        """Raise :class:`SpoolError` in a forked child of the process that opened the spool."""
        if self._parent_pid is None:
            return
        raise SpoolError(
            f"spool {self.path} was opened by process {self._parent_pid} and this process "
            f"({os.getpid()}) inherited it over fork(): a forked child may not use its "
            "parent's spool (the two would give distinct messages the same "
            "kresilient.message.id and share one SQLite connection). Nothing was stored",
            code=KafkaError._STATE,
            name="_STATE",
            classification=_state_classification(
                "open the producer and its Spool after the fork, in each worker, each on a "
                "path of its own (e.g. in the server's post-fork hook)"
            ),
        )

    def __repr__(self) -> str:
        return f"<Spool {str(self.path)!r} durability={self.durability} id={self.spool_id}>"


_INSERT: Final = "INSERT INTO segments(id, n, nbytes, crc, data, sid) VALUES (?, ?, ?, ?, ?, ?)"


def _header_list(headers: Any) -> list[tuple[str, Any]]:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers)


def _check_types(topic: Any, value: Any, key: Any, headers: Any) -> None:
    """What librdkafka would refuse at hand-off, refused at produce() (nothing stored)."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be str, not {type(topic).__name__}")
    for name, item in (("value", value), ("key", key)):
        if item is not None and not isinstance(item, (bytes, str)):
            raise TypeError(f"{name} must be bytes, str or None, not {type(item).__name__}")
    if headers is not None:
        for pair in _header_list(headers):
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not (pair[1] is None or isinstance(pair[1], (bytes, str)))
            ):
                raise TypeError(
                    "headers must be a dict or a list of (str, bytes | str | None) pairs, "
                    f"got {pair!r:.80}"
                )


class SpoolDriver:
    """The spooled path of one producer (private; created by ``ResilientProducer(spool=)``).

    ``owner`` is a weak proxy to the producer; the driver calls its raw ``_produce``, its
    lock and failure list, and ``_handle_fatal``.

    One object per message: the :class:`_SpoolHandle` that ``produce()`` returns is also the
    spool entry and librdkafka's delivery callback; its record tuple (with its sequence
    number, assigned at ``produce()``) is what the segment stores.

    Locks, always taken in this order: ``_commit_lock`` (one commit at a time, so segments are
    stored and handed over in order), then ``_lock`` (the open segment: held for an append
    only, so ``produce()`` never waits for a disk write) or ``_state`` (segments, hand-off,
    reports). The SQLite write itself runs under ``_commit_lock`` alone (it releases the GIL).

    Group commit: the spool thread stores a segment and leaves its hand-off to librdkafka to
    the application's next ``produce()``/``poll()``/``flush()`` (``_handoff``), so the
    application's thread does the per-message Python work and the spool thread holds the GIL
    only briefly; if the application makes no such call for a whole ``group_commit_ms``, the
    spool thread hands the segment over itself.
    """

    def __init__(
        self,
        owner: Any,
        spool: Spool,
        *,
        log: Any,
        handle_owner: Any,
        resend_backoff: float = 1.0,
        backpressure_timeout: float = 60.0,
        delivery_timeout: float = 300.0,
    ) -> None:
        spool._check_process()
        if spool.attached or spool.closed:
            raise ValueError(f"{spool!r} is already used by a producer or closed")
        spool.attached = True
        spool._on_fork = weakref.WeakMethod(self._disowned)
        self._owner = owner
        self._howner = handle_owner
        self._ids = owner._ids
        self._lean: bool = owner._lean
        self._max_message = owner._max_bytes
        self.spool = spool
        self._log = log
        self._resend_backoff = resend_backoff
        self._backpressure_timeout = backpressure_timeout
        self._delivery_timeout = delivery_timeout
        self._group = spool.durability == "group"
        self._interval = spool.group_commit_s
        self._max = spool.max_bytes
        self._prefix = spool.spool_id.encode() + b"-"
        self._commit_lock = threading.Lock()
        self._lock = threading.Lock()
        self._state = threading.RLock()
        self._wake = threading.Event()
        self._acks: deque[Any] = deque()
        self._fails: deque[tuple[Any, Any, Any]] = deque()
        self._open = _Segment(self._acks, self._fails, self._prefix)
        self._bytes = 0
        self._segments: dict[int, _Segment] = {}
        self._next_seg = 1
        self._seq = spool.next_seq
        self._pending: deque[Any] = deque()
        self._inflight = 0
        self._handoff = False
        self._deletes: list[int] = []
        self._rewind = False
        self._resume_at = 0.0
        self._outage_logged = False
        self._progress = (-1, 0.0)  # (delivered, when it last changed): the stall watch
        self._store_error: SpoolError | None = None
        self.delivered = 0
        self._delivered_mark = 0
        self.resent = 0
        self.kept_failures = 0
        self.recovered = 0
        self._closed = False
        self._recover()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._group:
            self._thread = threading.Thread(
                target=self._run, name=f"kresilient-spool-{spool.spool_id}", daemon=True
            )
            self._thread.start()

    # ------------------------------------------------------------------ recovery

    def _recover(self) -> None:
        loaded = self.spool.take_loaded()
        howner = self._howner
        for seg_id, records, nbytes, prefix in loaded:
            seg = _Segment(self._acks, self._fails, prefix)
            seg.id = seg_id
            seg.nbytes = nbytes
            seg.left = len(records)
            entries = seg.entries
            for rec in records:
                h: _SpoolHandle = _new_handle(_SpoolHandle)
                h._owner = howner
                h._id = 0  # no application handle: a previous producer's message
                h._rec = rec
                h._seg = seg
                h._dup = True
                h._state = _PENDING
                entries.append(h)
            self._segments[seg_id] = seg
            self._pending.extend(entries)
            self._bytes += nbytes
            self._next_seg = seg_id + 1
            self.recovered += len(records)
        if self.recovered:
            self._log.warning(
                "spool_recovered",
                path=str(self.spool.path),
                messages=self.recovered,
                segments=len(loaded),
                note=(
                    "messages a previous producer stored but Kafka did not acknowledge are "
                    "re-sent first, in their original order, marked "
                    f"{POSSIBLE_DUPLICATE_HEADER}: true"
                ),
            )
            with self._state:
                self._pump()

    # ------------------------------------------------------------------ produce

    def produce(
        self,
        topic: str,
        value: bytes | str | None,
        key: bytes | str | None = None,
        headers: Any = None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
        *,
        propagate: bool = True,
    ) -> Any:
        """``ResilientProducer.produce`` of a spooled producer (same contract, see there)."""
        if value.__class__ is not bytes or key.__class__ not in _KEY_TYPES or headers is not None:
            _check_types(topic, value, key, headers)
        if self._closed:
            self._refuse(topic)
        if self._store_error is not None:  # a group commit failed on the spool thread
            error, self._store_error = self._store_error, None
            if error is not None:
                raise error  # before this message is taken: it was not stored either
        size = (
            (len(value) if value is not None else 0)
            + (len(key) if key is not None else 0)
            + _RECORD_OVERHEAD
        )
        part = -1 if partition is None else partition
        ts = 0 if timestamp is None else timestamp
        n = next(self._ids)
        h: Any
        if on_delivery is None and headers is None and self._lean:
            h = _new_handle(_SpoolHandle)
            h._owner = self._howner
            h._id = n
            sent = None
        else:
            h, sent = self._full_handle(n, topic, key, value, headers, partition, on_delivery)
            if not propagate:
                sent = headers
        if size - _RECORD_OVERHEAD > self._max_message:
            exc = KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "value too large"))
            return self._owner._too_large(exc, topic, value, key, part, h, ts, headers)
        if sent is not None:
            hl = _header_list(sent)
            size += sum(len(k) + (len(v) if v is not None else 0) for k, v in hl)
            sent = hl
        if self._bytes + self._open.nbytes + size > self._max:
            try:
                self._wait_for_room(size, topic)
            except BaseException as exc:
                self._owner._end_span(h, exc, getattr(exc, "classification", None))
                raise
        h._dup = False
        h._state = _PENDING
        with self._lock:
            seq = self._seq
            self._seq = seq + 1
            h._rec = (seq, topic, value, key, part, ts, sent)
            seg = self._open
            h._seg = seg
            entries = seg.entries
            entries.append(h)
            seg.nbytes += size
            full = len(entries) >= _MAX_BATCH
        if not self._group:
            self._commit()
            if h._state == _UNSTORED:  # its batch failed (this thread's commit or another's)
                h._state = _DONE
                raise h._error
        elif full:
            self._wake.set()
        elif self._handoff:
            self._hand_off()
        if not n & 1023:
            owner = self._owner
            owner._tick()  # serves delivery reports (and settles them here), picks up tracing
            self._lean = owner._lean
        return h

    def _full_handle(
        self,
        n: int,
        topic: str,
        key: Any,
        value: Any,
        headers: Any,
        partition: int | None,
        on_delivery: Any,
    ) -> tuple[_SpoolFullHandle, Any]:
        """ResilientProducer._full_handle for a spooled message (headers, callback or span)."""
        owner = self._owner
        token = None
        sent = headers
        if owner._tracing:
            sent, token = owner._tel.producer_send(
                topic, key, len(value) if value is not None else 0, headers, partition
            )
        cb = owner._default_cb if on_delivery is None else on_delivery
        return _SpoolFullHandle(self._howner, n, headers, cb, token), sent

    def _hand_off(self) -> None:
        """Hand a segment the spool thread stored to librdkafka (from the application's call)."""
        if not self._state.acquire(blocking=False):
            return  # another thread is at it: it pumps what is pending
        try:
            self._pump()
        finally:
            self._state.release()

    def _wait_for_room(self, size: int, topic: str) -> None:
        deadline = time.monotonic() + self._backpressure_timeout
        while self._bytes + self._open.nbytes + size > self._max:
            if time.monotonic() >= deadline:
                self._owner._refused += 1
                raise SpoolError(
                    f"spool {self.spool.path} is full: {self._bytes + self._open.nbytes} of "
                    f"max_bytes={self._max} bytes stored and not acknowledged for "
                    f"{self._backpressure_timeout:g} s; the message was not stored",
                    code=KafkaError._QUEUE_FULL,
                    name="_QUEUE_FULL",
                    topic=topic,
                    classification=_storage_classification(
                        "the spool is full (Kafka is not acknowledging as fast as you "
                        "produce, or is down): back off and retry, or raise max_bytes"
                    ),
                )
            self._commit()
            self._owner.poll(0.05)

    def _commit(self, *, pump: bool = True) -> None:
        """Store the open segment, then hand it over; on failure fail all of it.

        ``"group"``: the error is kept for the application's next call and the batch listed
        by ``flush()``. ``"os"``/``"fsync"``: every message of the batch belongs to a
        ``produce()`` still running (each commits before it returns; with several threads
        one commit can take the others' messages): each of them raises (``_UNSTORED``).
        ``pump=False`` (the spool thread): leave the hand-off to the application's next call.
        """
        with self._commit_lock:
            with self._lock:
                seg = self._open
                batch: list[Any] = seg.entries
                if batch:
                    self._open = _Segment(self._acks, self._fails, self._prefix)
                else:
                    # Not the open segment's list: produce() may append to it meanwhile.
                    batch = []
            with self._state:
                deletes, self._deletes = self._deletes, []
            if not batch:
                if len(deletes) >= 256:
                    try:
                        self.spool.delete(deletes)
                        deletes = []
                    except sqlite3.Error:
                        pass
                if deletes:
                    with self._state:
                        self._deletes[:0] = deletes
                return
            seg_id = self._next_seg
            try:
                self.spool.append(seg_id, [h._rec for h in batch], seg.nbytes, deletes)
            except (sqlite3.Error, OSError, SpoolError) as exc:
                with self._state:
                    self._deletes[:0] = deletes
                error = self._store_failed(exc, batch)
                if self._group:
                    self._store_error = error
                return
            self._next_seg = seg_id + 1
            seg.id = seg_id
            seg.left = len(batch)
            with self._state:
                self._segments[seg_id] = seg
                self._bytes += seg.nbytes
                self._pending.extend(batch)
                if pump:
                    self._pump()
                else:
                    self._handoff = True

    def _store_failed(self, exc: BaseException, batch: list[Any]) -> SpoolError:
        """A commit failed: nothing of the batch was stored or handed to Kafka; say so.

        ``"group"``: listed as failures (``flush()`` raises them). ``"os"``/``"fsync"``: each
        message's own ``produce()`` raises instead (see ``_commit``), never listed twice.
        """
        full = isinstance(exc, sqlite3.Error) and "full" in str(exc).lower()
        remedy = (
            "the spool's disk is full: free space (or move the spool), then produce again"
            if full
            else "the spool could not be written: check the file system of the spool"
        )
        c = _storage_classification(remedy)
        owner = self._owner
        failures: list[DeliveryFailure] = []
        err = KafkaError(KafkaError._FS, f"spool write failed: {exc}")
        sync = not self._group
        refused = 0
        for handle in batch:
            _, topic, value, key, part, _ts, headers = handle._rec
            handle._error = error = SpoolError(
                f"not stored in spool {self.spool.path}: {exc}; not sent",
                code=KafkaError._FS,
                name="_FS",
                topic=topic,
                classification=c,
            )
            error.__cause__ = exc
            owner._end_span(handle, error, c)
            if sync:  # its produce() raises it: not listed
                handle._state = _UNSTORED
                refused += 1
                continue
            handle._state = _DONE
            failures.append(
                failure_from_report(
                    err,
                    None,
                    topic=topic,
                    partition=part if part >= 0 else None,
                    offset=None,
                    key=key,
                    value=value,
                    headers=headers,
                    classification=c,
                    message_id=handle._id,
                )
            )
        with owner._lock:
            owner._failures.extend(failures)
            owner._failed_total += len(failures)
            owner._refused += refused
        self._log.error(
            "spool_write_failed",
            path=str(self.spool.path),
            messages=len(batch),
            error=str(exc),
            disk_full=full,
        )
        return SpoolError(
            f"spool {self.spool.path} could not store {len(batch)} message(s): {exc}; "
            "none of them was handed to Kafka (flush() lists them as failed)",
            code=KafkaError._FS,
            name="_FS",
            classification=c,
        )

    # ------------------------------------------------------------------ hand-off

    def _pump(self) -> None:
        """Hand stored messages to librdkafka in order (under ``_state``)."""
        self._handoff = False
        if self._rewind:
            if self._inflight or time.monotonic() < self._resume_at:
                return
            self._rewind = False
            self._pending = deque(
                e for seg in self._segments.values() for e in seg.entries if e._state == _PENDING
            )
            if self._pending:
                self._log.info("spool_resend", messages=len(self._pending))
        pending = self._pending
        if not pending:
            return
        owner = self._owner
        produce = owner._produce
        prefix = self._prefix
        popleft = pending.popleft
        sent = 0  # added to _inflight (and resent) once, not per message
        resent = 0
        try:
            while pending:
                e = popleft()
                seq, topic, value, key, part, ts, headers = e._rec
                dup = e._dup
                if dup:  # a re-send: a recovered message keeps the id its first open gave it
                    ident = (MESSAGE_ID_HEADER, e._seg.prefix + str(seq).encode())
                    hdrs = [*headers, ident, _DUP_HEADER] if headers else [ident, _DUP_HEADER]
                else:
                    ident = (MESSAGE_ID_HEADER, prefix + str(seq).encode())
                    hdrs = [*headers, ident] if headers else [ident]
                try:
                    produce(topic, value, key, part, e, None, ts, hdrs)
                except BufferError:
                    pending.appendleft(e)
                    return  # librdkafka's queue is full: the next pump continues here
                except KafkaException as exc:
                    self._inflight += sent
                    self.resent += resent
                    sent = resent = 0
                    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                    if err is not None and (err.fatal() or err.code() == KafkaError._FATAL):
                        pending.appendleft(e)
                        if owner._closed:
                            return
                        owner._handle_fatal(exc, owner._recreations)  # raises unless recreated
                        produce = owner._produce
                        # The old instance's messages came back failed (_fails): they are
                        # earlier than this one, so take them back before anything else goes.
                        self._settle_locked()
                        if self._rewind:
                            return
                        continue
                    self._inflight += 1
                    e._state = _INFLIGHT
                    # Settled now, not at the next settle(): if it is kept, nothing behind it
                    # may be handed over before its re-send (the rewind stops this loop).
                    self._failed(e, err or KafkaError(KafkaError._FAIL, str(exc)), None)
                    if self._rewind:
                        return
                    continue
                e._state = _INFLIGHT
                sent += 1
                if dup:
                    resent += 1
        finally:
            self._inflight += sent
            self.resent += resent

    # ------------------------------------------------------------------ delivery reports

    def settle(self, *, wait: bool = False) -> None:
        """Account for delivery reports (outside librdkafka callbacks), then hand more over.

        From ``poll()`` it gives way (``wait=False``) when another thread holds the state.
        """
        if self._inflight and not self._group:  # (the group-commit thread watches otherwise)
            self._watch_stall()
        if not self._acks and not self._fails and not self._pending and not self._rewind:
            return
        if not self._state.acquire(blocking=wait):
            return
        try:
            self._settle_locked()
            self._pump()
        finally:
            self._state.release()

    def _watch_stall(self) -> None:
        """Log once when nothing was acknowledged for ``message.timeout.ms`` with messages
        on their way (librdkafka keeps a spooled message until Kafka takes it)."""
        delivered, since = self._progress
        now = time.monotonic()
        if delivered != self.delivered:
            self._progress = (self.delivered, now)
            if self._outage_logged:
                self._outage_logged = False
                self._log.info("spool_delivery_resumed", delivered=self.delivered)
        elif now - since >= self._delivery_timeout:
            self._log_deferred("_MSG_TIMED_OUT", ErrorCategory.DELIVERY_TIMEOUT.name)

    def _log_deferred(self, error: str, category: str) -> None:
        """The one ``spool_delivery_deferred`` warning of an outage (again after it ends)."""
        if self._outage_logged:
            return
        self._outage_logged = True
        self._log.warning(
            "spool_delivery_deferred",
            error=error,
            category=category,
            spooled=self._inflight + len(self._pending),
            note="not acknowledged in time: the messages stay in the spool and are delivered "
            "in order when Kafka answers again",
        )

    def _settle_locked(self) -> None:
        acks = self._acks
        if acks:
            popleft = acks.popleft
            delivered = 0
            inflight = 0
            try:
                while acks:
                    e = popleft()
                    if e._state == _INFLIGHT:
                        inflight += 1
                    e._state = _DONE
                    delivered += 1
                    seg = e._seg
                    seg.left -= 1
                    if not seg.left:
                        self._segment_done(seg)
                    if e.__class__ is _SpoolFullHandle:  # a callback or a span to end
                        _FullHandle.__call__(e, None, e._msg)
            finally:
                self._inflight -= inflight
                self.delivered += delivered
        fails = self._fails
        while fails:
            e, err, msg = fails.popleft()
            self._failed(e, err, msg)

    def _segment_done(self, seg: _Segment) -> None:
        """Every message of a segment finished: delete its row at the next commit."""
        del self._segments[seg.id]
        self._bytes -= seg.nbytes
        self._deletes.append(seg.id)
        seg.entries = []  # no handle -> segment -> handle cycle left for the collector

    def _finish(self, e: Any) -> None:
        if e._state == _INFLIGHT:
            self._inflight -= 1
        e._state = _DONE
        seg = e._seg
        seg.left -= 1
        if seg.left == 0:
            self._segment_done(seg)

    def _failed(self, e: Any, err: KafkaError, msg: Any) -> None:
        c = classify(err, context="delivery")
        if c.category in _KEEP and not is_unproducible(c):
            persisted = c.possibly_persisted
            if persisted and msg is not None:
                part = msg.partition()
                persisted = part is not None and part >= 0  # never assigned: never sent
            if e._state == _INFLIGHT:
                self._inflight -= 1
            e._state = _PENDING
            e._dup = e._dup or persisted
            self.kept_failures += 1
            if not self._rewind:
                self._rewind = True
                self._resume_at = time.monotonic() + self._resend_backoff
                producer = self._owner._producer
                if producer is not None:
                    # What is queued behind it must not overtake it: fail it back too.
                    with contextlib.suppress(KafkaException):
                        producer.purge(in_queue=True, in_flight=False, blocking=False)
                self._log_deferred(err.name(), c.category.name)
            return
        # Cannot be produced, ever (too large, invalid, topic or authorization trouble):
        # reported as failed like without a spool, and removed from the spool.
        self._finish(e)
        if msg is None:
            _seq, topic, value, key, part, _ts, headers = e._rec
            failure = failure_from_report(
                err,
                None,
                topic=topic,
                partition=part if part >= 0 else None,
                offset=None,
                key=key,
                value=value,
                headers=headers,
                classification=c,
                message_id=e._id,
            )
            owner = self._owner
            with owner._lock:
                owner._failures.append(failure)
                owner._failed_total += 1
            e._error = ProduceError(
                err.str(), code=err.code(), name=err.name(), topic=topic, classification=c
            )
            return
        _report(e, err, msg)

    # ------------------------------------------------------------------ flush and close

    def unsettled(self) -> int:
        """Messages batched or stored and not finished (delivered, or failed for good)."""
        with self._state:
            n = len(self._open.entries)
            for seg in self._segments.values():
                n += seg.left
            return n

    def commit(self) -> None:
        """Store the current batch now (``flush()`` does this first); raise if it failed."""
        self.spool._check_process()
        self._commit()
        error, self._store_error = self._store_error, None
        if error is not None:
            raise error

    def take_delivered(self) -> int:
        """Messages acknowledged since the previous call."""
        delivered = self.delivered - self._delivered_mark
        self._delivered_mark = self.delivered
        return delivered

    def _run(self) -> None:
        """The group commits: every ``group_commit_ms``, or at once when the batch is full."""
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._closed:
                return
            try:
                if self._handoff or self._rewind:
                    # No produce(), poll() or flush() took the last segment over for a whole
                    # interval (or a re-send is due): hand it over from here.
                    with self._state:
                        self._pump()
                self._commit(pump=False)
                if self._inflight:
                    self._watch_stall()
            except Exception as exc:  # kept for the application's next call
                self._log.debug("spool_thread_error", error=str(exc))

    def _disowned(self) -> None:
        """The fork hook, in the child (through the spool): nothing may be produced here.

        Fresh locks: a thread of the parent (the spool thread) may have held one at the fork,
        and ``close()``/``flush()`` of the child must not wait for it forever.
        """
        self._closed = True
        self._commit_lock = threading.Lock()
        self._lock = threading.Lock()
        self._state = threading.RLock()

    def _refuse(self, topic: str) -> None:
        """produce() after close(), or in a forked child: raise, nothing stored."""
        try:
            self.spool._check_process()
        except SpoolError as exc:
            exc.topic = topic
            raise
        _closed_error(topic)

    def close(self) -> int:
        """Stop the commit thread, rewrite partly acknowledged segments, close the spool.

        Returns how many messages stay stored (re-sent by the next producer on this file).
        In a forked child: nothing (the parent's process owns the spool and its messages).
        """
        if self.spool._parent_pid is not None:
            return 0
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30.0)
        kept = 0
        with self._commit_lock, self._state:
            # Reports that arrived during the final purge: in-flight ones are "possibly
            # written" and stay stored.
            self._settle_locked()
            try:
                with self._lock:
                    batch = self._open.entries
                    nbytes = self._open.nbytes
                    if batch:
                        self._open = _Segment(self._acks, self._fails, self._prefix)
                if batch:  # produce() raced with close(): store it, do not drop it
                    self.spool.append(self._next_seg, [h._rec for h in batch], nbytes, [])
                    kept += len(batch)
                self.spool.delete(self._deletes)
                self._deletes = []
                for seg in self._segments.values():
                    left = [e._rec for e in seg.entries if e._state != _DONE]
                    kept += len(left)
                    if len(left) < len(seg.entries):
                        nbytes = sum(
                            _RECORD_OVERHEAD + len(r[2] or b"") + len(r[3] or b"") for r in left
                        )
                        self.spool.replace(seg.id, left, nbytes)
            finally:
                self.spool.close()
        if kept:
            self._log.warning(
                "spool_kept",
                path=str(self.spool.path),
                messages=kept,
                note="not acknowledged by Kafka yet: the next producer on this spool re-sends "
                "them first (marked as possible duplicates)",
            )
        return kept


_KEY_TYPES: Final = (bytes, type(None))
_DUP_HEADER: Final = (POSSIBLE_DUPLICATE_HEADER, b"true")


def _closed_error(topic: str) -> None:
    raise ProduceError(
        "produce() after close(): the producer is closed; the message was not stored",
        code=KafkaError._STATE,
        name="_STATE",
        topic=topic,
        classification=classify(KafkaError(KafkaError._STATE, "closed")),
    )
