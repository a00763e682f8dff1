"""Non-blocking retries through delayed retry topics (issue 17, item 1).

With ``ResilientConsumer(..., retry_topics=RetryTopicPolicy(delays=(5, 60, 600)))`` a record
whose failure the policy retries is moved aside instead of holding its partition:

* it is written to ``<topic>.retry.<delay>`` (``orders.retry.5s``, ``orders.retry.1m`` ...)
  with its original key, value and headers byte for byte, followed by ``kresilient.retry.*``
  headers (tier, due time, original coordinates, first failure, exception type);
* the source offset stays uncommitted until that write is ACKNOWLEDGED (the same mechanism as a
  dead letter: the partition flows on, its stored offset waits);
* the same consumer subscribes to the retry topics. A retry record that is not due yet pauses
  its partition and seeks back to it (a retry hold: the loop keeps polling, nothing sleeps in
  the handler, no rebalance); when it is due the partition resumes and the handler runs;
* a record failing its last tier goes to the dead-letter topic of its ORIGINAL topic, with its
  original key, value and headers (the retry headers stripped) and the original coordinates.

Order: by default (``ordered=False``) a record moved to a retry topic no longer blocks its
partition, so later records of the same key are handled before it: unordered retry topics give
up per-key order. With ``ordered=True`` the key of a moved record is *blocked* in its source
partition (:class:`KeyBlocks`): later records of that key are not handled but moved to the
retry topic its first blocked record is in, behind it, and come back in offset order; the key
is released once every record queued behind it was handled. Keep the in-place
:class:`RetryPolicy` (no retry topics) where a whole partition's order matters.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import tenacity
from tenacity.retry import retry_base

from kresilient.consumer._support import NOT_RETRIED
from kresilient.deadletter import DeadLetterRecord
from kresilient.errors import ConfigError

__all__ = [
    "RETRY_HEADER_PREFIX",
    "KeyBlocked",
    "KeyBlocks",
    "RetryTopicPolicy",
    "RetryView",
    "delay_name",
    "next_tier",
    "retry_record",
]

RETRY_HEADER_PREFIX: Final = "kresilient.retry."
TIER: Final = RETRY_HEADER_PREFIX + "tier"
DUE: Final = RETRY_HEADER_PREFIX + "due"
ORIGINAL_TOPIC: Final = RETRY_HEADER_PREFIX + "original.topic"
ORIGINAL_PARTITION: Final = RETRY_HEADER_PREFIX + "original.partition"
ORIGINAL_OFFSET: Final = RETRY_HEADER_PREFIX + "original.offset"
ORIGINAL_TIMESTAMP: Final = RETRY_HEADER_PREFIX + "original.timestamp"
FIRST_FAILURE: Final = RETRY_HEADER_PREFIX + "first.failure"
EXCEPTION: Final = RETRY_HEADER_PREFIX + "exception.type"


def delay_name(seconds: float) -> str:
    """``2`` -> ``2s``, ``60`` -> ``1m``, ``3600`` -> ``1h``, ``0.5`` -> ``500ms``."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryTopicPolicy:
    """Retry tiers as delayed topics, then the dead-letter topic.

    Args:
        delays: seconds each tier waits before the record is handled again, in order
            (``(5, 60, 600)``: three more attempts, 5 s, 1 min and 10 min after the failures).
        retry: a tenacity retry predicate choosing the failures that go to the retry topics
            (default: all but :data:`NOT_RETRIED`, which go to the dead-letter topic at once).
        infix: topic names are ``<topic><infix><delay>`` (default ``.retry.`` ->
            ``orders.retry.5s``).
        ordered: keep per-key order. ``False`` (default): later records of the key of a
            moved record are handled at once, before it (per-key order given up for the
            records moved). ``True``: the key is blocked in its source partition; its later
            records are moved behind it to the retry topic it is in (without a handler call)
            and handled after it, in offset order. Cost: every record of a blocked key waits
            at least the tier delay and is written once more per tier it is moved through;
            blocked keys are held in memory per consumer (released when their queue is
            empty); records without a key are never blocked; the order holds while the same
            consumer owns the source partition and its retry partitions (a rebalance that
            moves them loses the blocked keys: later records of the key are handled at once).

    Example::

        ResilientConsumer(conf, ["orders"], handle,
                          retry_topics=RetryTopicPolicy(delays=(5, 60, 600)))
        # create orders.retry.5s, orders.retry.1m, orders.retry.10m and orders.dlq first
    """

    delays: Sequence[float] = (5.0, 60.0, 600.0)
    retry: retry_base = dataclasses.field(
        default_factory=lambda: tenacity.retry_if_not_exception_type(NOT_RETRIED)
    )
    infix: str = ".retry."
    ordered: bool = False

    def __post_init__(self) -> None:
        if not self.delays or any(d <= 0 for d in self.delays):
            raise ConfigError("RetryTopicPolicy.delays must be positive seconds, at least one")
        names = [delay_name(d) for d in self.delays]
        if len(set(names)) != len(names):
            raise ConfigError(f"RetryTopicPolicy.delays name the same topic twice: {names}")

    def replace(self, **changes: Any) -> RetryTopicPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def topic(self, source: str, tier: int) -> str:
        """The retry topic of tier ``tier`` (0-based) for records of ``source``."""
        return f"{source}{self.infix}{delay_name(self.delays[tier])}"

    def topics(self, source: str) -> list[str]:
        """Every retry topic of ``source``."""
        return [self.topic(source, i) for i in range(len(self.delays))]

    def retries(self, exc: BaseException) -> bool:
        """Whether ``exc`` goes to the retry topics (the ``retry`` predicate)."""
        state = tenacity.RetryCallState(cast(Any, None), None, (), {})
        state.set_exception((type(exc), exc, exc.__traceback__))
        return bool(self.retry(state))


class KeyBlocked(Exception):
    """Why a record was moved to a retry topic without a handler call (``ordered=True``): an
    earlier record of its key, in its source partition, is in a retry topic."""


BK = tuple[str, int, bytes]


@dataclass(slots=True)
class _Block:
    tier: int  #: the retry tier (0-based) the first queued record is in
    pending: deque[int] = field(default_factory=deque)  #: original offsets, in order


class KeyBlocks:
    """The keys blocked behind a record in a retry topic (``RetryTopicPolicy(ordered=True)``).

    Keyed by (original topic, original partition, key bytes). ``pending`` holds the original
    offsets of the key's records moved to the retry topics, oldest first: the first is the
    only one handled when it comes back; the others are moved to its tier again (behind it in
    the same retry partition: same key, same partitioner) until it is done.
    """

    __slots__ = ("_journal", "blocked", "retry_topics")

    def __init__(self, retry_topics: Container[str] = frozenset()) -> None:
        self.blocked: dict[BK, _Block] = {}
        #: this consumer's retry topics: only their records are read as retries
        self.retry_topics = retry_topics
        #: ``transactions=``: each key's block as it was before the open transaction first
        #: touched it (``None``: not blocked then), for :meth:`undo`; ``None``: no journal
        self._journal: dict[BK, _Block | None] | None = None

    def key_of(self, msg: Any) -> tuple[BK | None, Any]:
        """``(block key, original record view)`` of ``msg``; no key: ``None``."""
        original: Any = RetryView(msg) if RetryView.is_retry(msg, self.retry_topics) else msg
        key = msg.key()
        if key is None:
            return None, original
        raw = key if isinstance(key, bytes) else str(key).encode()
        return (str(original.topic()), int(original.partition() or 0), raw), original

    def route(self, msg: Any) -> int | None:
        """The tier to move ``msg`` to, behind its blocked key; ``None``: handle it."""
        if not self.blocked:
            return None
        bk, original = self.key_of(msg)
        block = self.blocked.get(bk) if bk is not None else None
        if block is None:
            return None
        offset = int(original.offset())
        if block.pending and block.pending[0] == offset:
            return None  # the first record of the key: its turn
        if offset not in block.pending:
            self._touch(bk)  # type: ignore[arg-type]
            block.pending.append(offset)
        return block.tier

    def moved(self, msg: Any, tier: int) -> None:
        """``msg`` was moved to ``tier`` after a failure: block its key there."""
        bk, original = self.key_of(msg)
        if bk is None:
            return
        offset = int(original.offset())
        self._touch(bk)
        block = self.blocked.get(bk)
        if block is None:
            self.blocked[bk] = _Block(tier=tier, pending=deque([offset]))
            return
        if block.pending and block.pending[0] == offset:
            block.tier = tier  # the first record went one tier on: the others follow it
        elif offset not in block.pending:
            block.pending.append(offset)

    def done(self, msg: Any) -> None:
        """``msg`` was handled or dead-lettered: the next queued record of its key is first."""
        if not self.blocked:
            return
        bk, original = self.key_of(msg)
        block = self.blocked.get(bk) if bk is not None else None
        if block is None:
            return
        offset = int(original.offset())
        self._touch(bk)  # type: ignore[arg-type]
        if block.pending and block.pending[0] == offset:
            block.pending.popleft()
        if not block.pending:
            del self.blocked[bk]  # type: ignore[arg-type]

    # ``transactions=``: the blocks a transaction added, changed or released are undone
    # when it does not commit (its moves hidden, its records handled again). An undo journal
    # of the keys it touched, not a copy of every block: O(keys touched) per transaction.

    def begin(self) -> None:
        """A transaction begins: journal the keys it touches from now on."""
        self._journal = {}

    def settle(self) -> None:
        """It committed: what it did to the blocks stands."""
        self._journal = None

    def undo(self) -> None:
        """It did not commit: each key it touched goes back to its block before it."""
        journal, self._journal = self._journal, None
        for bk, before in (journal or {}).items():
            if before is None:
                self.blocked.pop(bk, None)
            else:
                self.blocked[bk] = before

    def _touch(self, bk: BK) -> None:
        journal = self._journal
        if journal is not None and bk not in journal:
            block = self.blocked.get(bk)
            journal[bk] = None if block is None else _Block(block.tier, deque(block.pending))

    def __len__(self) -> int:
        return len(self.blocked)


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


class RetryView:
    """A record consumed from one of this consumer's retry topics, read back as its ORIGINAL
    record.

    ``topic()``/``partition()``/``offset()``/``timestamp()`` are the original coordinates;
    ``headers()`` the original headers, so the dead-letter record of a record failing its last
    tier is the original byte for byte.

    Only the LAST ``kresilient.retry.*`` block is kresilient's (the one the consumer appended
    when it moved the record, starting at the last ``kresilient.retry.tier``): a block before
    it came with the original record (a service forwarding ``msg.headers()`` of an upstream
    retry record) and stays part of the original headers, byte for byte (issue 35, defect
    6). Build a view only of a record :meth:`is_retry` accepts: on a record of a source topic
    every retry header is someone else's.
    """

    __slots__ = ("_headers", "_msg", "_retry", "tier")

    def __init__(self, msg: Any) -> None:
        self._msg = msg
        headers = list(msg.headers() or [])
        start = len(headers)
        for i in range(len(headers) - 1, -1, -1):
            if headers[i][0] == TIER:
                start = i
                break
        own = headers[start:]
        self._headers = headers[:start] + [
            (k, v) for k, v in own if not k.startswith(RETRY_HEADER_PREFIX)
        ]
        self._retry = {k: _text(v) for k, v in own if k.startswith(RETRY_HEADER_PREFIX)}
        self.tier = int(self._retry.get(TIER) or 0)

    @staticmethod
    def is_retry(msg: Any, retry_topics: Container[str]) -> bool:
        """Whether ``msg`` is a record of one of ``retry_topics`` (this consumer's own) carrying
        the retry headers. Retry headers on any other record were forwarded from elsewhere and
        mean nothing here."""
        return msg.topic() in retry_topics and any(k == TIER for k, _ in msg.headers() or [])

    def due_ms(self) -> int | None:
        due = self._retry.get(DUE)
        return int(due) if due else None

    def first_failure_ms(self) -> int | None:
        first = self._retry.get(FIRST_FAILURE)
        return int(first) if first else None

    def topic(self) -> str | None:
        return self._retry.get(ORIGINAL_TOPIC) or self._msg.topic()

    def partition(self) -> int | None:
        part = self._retry.get(ORIGINAL_PARTITION)
        return int(part) if part else self._msg.partition()

    def offset(self) -> int | None:
        off = self._retry.get(ORIGINAL_OFFSET)
        return int(off) if off else self._msg.offset()

    def timestamp(self) -> tuple[int, int]:
        ts = self._retry.get(ORIGINAL_TIMESTAMP)
        return (1, int(ts)) if ts else self._msg.timestamp()

    def headers(self) -> list[tuple[str, bytes | None]]:
        return list(self._headers)

    def key(self) -> Any:
        return self._msg.key()

    def value(self) -> Any:
        return self._msg.value()

    def leader_epoch(self) -> int | None:
        return self._msg.leader_epoch()  # type: ignore[no-any-return]


def retry_headers(
    msg: Any,
    *,
    tier: int,
    delay: float,
    exc: BaseException,
    retry_topics: Container[str],
    now_ms: int | None = None,
) -> list[tuple[str, bytes | None]]:
    """The headers of ``msg`` moved to retry tier ``tier``: its original headers byte for
    byte, then the ``kresilient.retry.*`` block. The original coordinates are kept from an
    earlier tier only for a record of one of ``retry_topics`` (this consumer's own): a
    source record's forwarded retry headers are part of its original headers."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if RetryView.is_retry(msg, retry_topics):
        view = RetryView(msg)
        original: list[tuple[str, bytes | None]] = view.headers()
        first = view.first_failure_ms() or now_ms
        src: Any = view
    else:
        original = list(msg.headers() or [])
        first = now_ms
        src = msg
    ts_type, ts = src.timestamp()
    block = [
        (TIER, str(tier + 1)),
        (DUE, str(now_ms + round(delay * 1000))),
        (ORIGINAL_TOPIC, src.topic()),
        (ORIGINAL_PARTITION, str(src.partition())),
        (ORIGINAL_OFFSET, str(src.offset())),
        (ORIGINAL_TIMESTAMP, str(ts) if ts_type != 0 else ""),
        (FIRST_FAILURE, str(first)),
        (EXCEPTION, f"{type(exc).__module__}.{type(exc).__qualname__}"),
    ]
    return original + [(k, v.encode("utf-8")) for k, v in block if v]


def next_tier(topic: str, retry_map: Mapping[str, tuple[str, int]]) -> tuple[str, int]:
    """``(source topic, 0-based tier)`` a failed record of ``topic`` moves to: tier 0 for a
    record of a source topic, the next tier for a record of one of ``retry_map``'s retry
    topics (a tier past the policy's last means: dead-letter it)."""
    retried = retry_map.get(topic)
    return (retried[0], retried[1] + 1) if retried is not None else (topic, 0)


def retry_record(
    msg: Any,
    policy: RetryTopicPolicy,
    *,
    source: str,
    tier: int,
    exc: BaseException,
    retry_topics: Container[str],
    raw: tuple[bytes | None, bytes | None] | None = None,
) -> DeadLetterRecord:
    """The record moving ``msg`` to retry tier ``tier`` of ``source``: its key and value as
    read (``raw``: the bytes before a deserializer), its headers by :func:`retry_headers`.
    Written by the dead-letter writer, or inside the batch's transaction
    (``transactions=``): the same record either way."""
    return DeadLetterRecord(
        topic=policy.topic(source, tier),
        key=raw[0] if raw is not None else msg.key(),
        value=raw[1] if raw is not None else msg.value(),
        headers=retry_headers(
            msg, tier=tier, delay=policy.delays[tier], exc=exc, retry_topics=retry_topics
        ),
    )
