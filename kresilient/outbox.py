"""Transactional outbox: publish rows written in the same database transaction as the data.

The application writes its business rows and an outbox row in ONE transaction
(:func:`enqueue`): either both are committed or neither. A relay (:class:`OutboxRelay`, one
or several processes) publishes committed outbox rows with the idempotent
:class:`~kresilient.ResilientProducer` and marks a row sent only after Kafka acknowledged it.
A rolled-back transaction leaves no outbox row, so it is never published.

How relays share the table (SQLAlchemy Core; PostgreSQL and SQLite tested):

1. *claim*: one statement ``UPDATE outbox SET claimed_until = now + lease, attempts =
   attempts + 1 WHERE id IN (SELECT id ... WHERE sent_ms IS NULL AND failed_ms IS NULL AND
   claimed_until < now ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING ...``, and, in
   the same transaction, a message id for each row claimed for the first time, committed:
   two relays never claim the same row (PostgreSQL skips rows another relay is claiming;
   SQLite serialises writers);
2. *publish*: each row with the header ``kresilient.message.id`` (the row's ``message_id``:
   ``outbox-`` and a random uuid4, minted at its first claim and stored, so every copy of
   the row carries it and no other row of any outbox ever does: two databases with the same
   table name, or an SQLite row id reused after a purge, still give distinct ids), plus
   ``kresilient.possible.duplicate: true`` when ``attempts > 1`` (an earlier claim of the
   row may have published it: its relay crashed, or its flush failed);
3. *mark*: ``UPDATE ... SET sent_ms = now WHERE id IN (acknowledged ids)``, committed.

A relay killed between 2 and 3 leaves its rows claimed until the lease runs out; another
relay (or its restart) then publishes them again, marked. A consumer drops those copies with
:class:`kresilient.dedupe.Deduplicator`. The clocks of relay hosts must agree to well within
the lease (``claimed_until`` is wall-clock time written by the relay).

A row Kafka can never accept as it is (:func:`kresilient.errors.is_unproducible`: a value
over ``message.max.bytes`` of the producer or of the topic, an invalid record) is given up,
never retried forever and never allowed to stop the rows after it: it goes to the relay's
``dead_letter_topic`` byte for byte (original key, value and headers, then kresilient's
dead-letter headers; the row gets ``sent_ms`` and ``failed_ms``) or, without one, is marked
``failed_ms`` with its reason in ``error``, and logged (``outbox_row_dead_lettered`` /
``outbox_row_failed``). Any other failure (Kafka unreachable, a topic not created yet, a
leader moving) leaves the row unsent: it is claimed again after the lease, marked, with the
last failure in ``error``; ``max_attempts`` optionally gives such a row up after that many
claims. To retry a failed row, set its ``failed_ms`` back to ``NULL``.

Tables made by an earlier kresilient (without ``message_id``, ``failed_ms``, ``error``) get
those columns on a relay's first start (``ALTER TABLE ... ADD COLUMN``, safe when several
relays start at once); :func:`enqueue` works before and after. A row an earlier relay
already claimed keeps the id it was published with (``outbox-<table>-<row id>``), so its
re-sent copies are still recognised; every other row gets a new-style id.

Order: one relay publishes in ``id`` order (one batch at a time). Several relays publish
their batches concurrently: rows of one key claimed by two relays may interleave. Run one
relay per table when per-key order matters (the others wait on the lease as standbys).

Example::

    outbox = outbox_table(metadata)                 # once, beside your tables
    with engine.begin() as conn:                    # the business transaction
        conn.execute(orders.insert().values(id=42, total=99))
        enqueue(conn, outbox, topic="orders", key=b"42", value=b'{"total": 99}')

    relay = OutboxRelay(engine, outbox, {"bootstrap.servers": "127.0.0.1:9092"})
    relay.run(stop_event)                           # or relay.publish_batch() in your loop
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    and_,
    bindparam,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError, NoSuchTableError

from kresilient.deadletter import DeadLetterRecord, DeadLetterWriter, dead_letter_headers
from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER
from kresilient.errors import (
    DeadLetterError,
    DeliveryError,
    ErrorCategory,
    FatalProducerError,
    KResilientError,
    ProduceError,
    is_unproducible,
)
from kresilient.producer import ResilientProducer
from kresilient.redaction import Redactor, redact_text

__all__ = ["OutboxRelay", "enqueue", "outbox_table"]

_DEFAULT_TABLE: Final = "kresilient_outbox"
#: ``error`` column width: a failure's reason, truncated.
_ERROR_LIMIT: Final = 1000
#: Columns added after the first release: created on a relay's first start when missing.
_ADDED_COLUMNS: Final = ("message_id", "failed_ms", "error")


def outbox_table(metadata: MetaData, name: str = _DEFAULT_TABLE) -> Table:
    """The outbox table definition (create it with ``metadata.create_all(engine)``).

    Columns: ``id`` (order), ``topic``, ``key``, ``value``, ``headers`` (JSON),
    ``created_ms``, ``attempts`` (claims so far), ``claimed_until`` (ms, lease), ``sent_ms``
    (set once Kafka acknowledged the row, on its topic or on the dead-letter topic; ``NULL``
    until then), ``message_id`` (its ``kresilient.message.id``, minted at the first claim),
    ``failed_ms`` (set when the row was given up: dead-lettered, or failed without being
    written anywhere when ``sent_ms`` is ``NULL``), ``error`` (the last failure's reason).
    """
    return Table(
        name,
        metadata,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("topic", String(255), nullable=False),
        Column("key", LargeBinary, nullable=True),
        Column("value", LargeBinary, nullable=True),
        Column("headers", JSON, nullable=True),
        Column("created_ms", BigInteger, nullable=False),
        Column("attempts", Integer, nullable=False, default=0),
        Column("claimed_until", BigInteger, nullable=False, default=0),
        Column("sent_ms", BigInteger, nullable=True, index=True),
        # Added later (migrated by OutboxRelay); no defaults, so enqueue() never names them
        # and keeps working on a table an earlier kresilient created.
        Column("message_id", String(64), nullable=True),
        Column("failed_ms", BigInteger, nullable=True),
        Column("error", String(_ERROR_LIMIT), nullable=True),
    )


def _migrate(engine: Engine, table: Table) -> None:
    """Add the columns an earlier kresilient's table lacks (idempotent, race-safe).

    Two relays starting at once may both try an ``ADD COLUMN``: the loser's statement fails
    (duplicate column), and the column found present on a second look is success.
    """
    try:
        present = {c["name"] for c in inspect(engine).get_columns(table.name, table.schema)}
    except NoSuchTableError:
        raise ValueError(
            f"outbox table {table.fullname!r} does not exist in the database: create it "
            "(metadata.create_all(engine) with outbox_table(metadata)) before the relay"
        ) from None
    dialect = engine.dialect
    quoted = dialect.identifier_preparer.format_table(table)
    for name in _ADDED_COLUMNS:
        if name in present:
            continue
        column = table.c[name]
        ddl = (
            f"ALTER TABLE {quoted} ADD COLUMN "
            f"{dialect.identifier_preparer.quote(name)} {column.type.compile(dialect)}"
        )
        for attempt in range(3):
            try:
                with engine.begin() as conn:
                    conn.execute(text(ddl))
                break
            except DBAPIError:
                again = {c["name"] for c in inspect(engine).get_columns(table.name, table.schema)}
                if name in again:
                    break  # another relay added it first
                if attempt == 2:  # not a lost race (a lock held too long, no permission)
                    raise


def _encode_headers(headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None) -> Any:
    if headers is None:
        return None
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
    out = []
    for name, value in pairs:
        if not isinstance(name, str):
            raise TypeError(f"outbox header names must be str, got {name!r:.40}")
        if value is None:
            out.append([name, None, "n"])
        elif isinstance(value, str):
            out.append([name, value, "s"])
        elif isinstance(value, bytes):
            out.append([name, base64.b64encode(value).decode(), "b"])
        else:
            raise TypeError(f"outbox header {name!r}: value must be bytes, str or None")
    return out


def _decode_headers(stored: Any) -> list[tuple[str, bytes | str | None]]:
    if not stored:
        return []
    out: list[tuple[str, bytes | str | None]] = []
    for name, value, kind in stored:
        out.append((name, base64.b64decode(value) if kind == "b" else value))
    return out


def _as_bytes(item: bytes | str | None, what: str) -> bytes | None:
    if item is None or isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    raise TypeError(f"outbox {what} must be bytes, str or None, not {type(item).__name__}")


def enqueue(
    conn: Connection,
    table: Table,
    *,
    topic: str,
    value: bytes | str | None,
    key: bytes | str | None = None,
    headers: Mapping[str, Any] | Sequence[tuple[str, Any]] | None = None,
) -> None:
    """Add one message to the outbox inside the caller's transaction (``conn``).

    Nothing is published unless that transaction commits.
    """
    if not topic or not isinstance(topic, str):
        raise ValueError(f"outbox topic must be a non-empty str, got {topic!r:.40}")
    conn.execute(
        table.insert().values(
            topic=topic,
            key=_as_bytes(key, "key"),
            value=_as_bytes(value, "value"),
            headers=_encode_headers(headers),
            created_ms=int(time.time() * 1000),
            attempts=0,
            claimed_until=0,
        )
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Failure:
    """Why a row is given up: its reason and the error for the dead-letter headers."""

    reason: str
    error: BaseException


@dataclasses.dataclass(frozen=True, slots=True)
class _Claimed:
    """One claimed row, with the message id it is published under."""

    id: int
    topic: str
    key: bytes | None = dataclasses.field(repr=False)
    value: bytes | None = dataclasses.field(repr=False)
    headers: Any = dataclasses.field(repr=False)
    attempts: int
    message_id: str
    error: str | None


_Headers = list[tuple[str, bytes | str | None]]


@dataclasses.dataclass(slots=True)
class _Batch:
    """The rows of one claim, sorted by what happened to them."""

    sent: list[int] = dataclasses.field(default_factory=list)
    #: row id -> reason: stays unsent, claimed again after the lease
    retry: dict[int, str] = dataclasses.field(default_factory=dict)
    give_up: list[tuple[_Claimed, _Headers, _Failure]] = dataclasses.field(default_factory=list)
    #: refused by the broker with their produce request: sent again alone
    suspects: list[tuple[_Claimed, _Headers]] = dataclasses.field(default_factory=list)
    #: not published by this claim (the producer stopped taking messages, or a suspect left
    #: for the next claim): released at once, the claim not counted
    unqueued: list[int] = dataclasses.field(default_factory=list)
    stop: KResilientError | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """One batch: rows published to their topic, and rows given up (dead-lettered/failed)."""

    sent: int = 0
    given_up: int = 0


def _reason(exc: BaseException) -> str:
    """A failure's reason as stored in ``error`` and logged (a kresilient error's text names
    its code, classification and remedy already)."""
    return str(exc) if isinstance(exc, KResilientError) else f"{type(exc).__name__}: {exc}"


class OutboxRelay:
    """Publishes committed outbox rows; marks them sent after Kafka's acknowledgement.

    Args:
        engine: a SQLAlchemy ``Engine`` on the application's database.
        table: the outbox :class:`~sqlalchemy.Table` (:func:`outbox_table`). Columns an
            earlier kresilient's table lacks are added on construction.
        producer_config: configuration of the relay's idempotent
            :class:`~kresilient.ResilientProducer` (or pass ``producer=``).
        batch_size: rows claimed and published per batch.
        lease_s: how long a claim is exclusive. A relay that crashed holds its rows this long;
            it must exceed ``flush_timeout_s`` (checked).
        flush_timeout_s: how long a batch waits for Kafka's acknowledgements; rows not
            acknowledged by then stay unsent and are claimed again after the lease (marked).
        poll_interval_s: :meth:`run` sleeps this long when the outbox is empty.
        producer: an existing producer to publish with (the relay does not close it).
        dead_letter_topic: where rows Kafka can never accept go (values over
            ``message.max.bytes``, invalid records), byte for byte with kresilient's
            dead-letter headers; needs ``producer_config`` (the dead-letter writer's
            connection). ``None``: such rows are marked failed (``failed_ms``, ``error``).
        dead_letter_max_bytes: ``message.max.bytes`` of the dead-letter writer.
        max_attempts: give a row up (dead-letter it, or mark it failed) once it was claimed
            this many times without being acknowledged. Every claim counts, also those during
            an outage (one per ``lease_s``): ``None`` (default) retries such rows forever and
            gives up only rows that can never be produced.
        logger: a structlog logger (default ``structlog.get_logger("kresilient.outbox")``).
    """

    def __init__(
        self,
        engine: Engine,
        table: Table,
        producer_config: Mapping[str, Any] | None = None,
        *,
        batch_size: int = 500,
        lease_s: float = 60.0,
        flush_timeout_s: float = 30.0,
        poll_interval_s: float = 0.5,
        producer: ResilientProducer | None = None,
        dead_letter_topic: str | None = None,
        dead_letter_max_bytes: int = 16 * 1024 * 1024,
        max_attempts: int | None = None,
        logger: Any = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if lease_s <= flush_timeout_s:
            raise ValueError(
                f"lease_s ({lease_s}) must exceed flush_timeout_s ({flush_timeout_s}): a batch "
                "still being acknowledged would be claimed by another relay"
            )
        if (producer is None) == (producer_config is None):
            raise ValueError("give exactly one of producer_config and producer")
        if max_attempts is not None and max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1 (or None), got {max_attempts}")
        if dead_letter_topic is not None:
            if not dead_letter_topic or not isinstance(dead_letter_topic, str):
                raise ValueError(
                    f"dead_letter_topic must be a non-empty str: {dead_letter_topic!r:.40}"
                )
            if producer_config is None:
                raise ValueError(
                    "dead_letter_topic needs producer_config (the dead-letter writer connects "
                    "with it), not producer="
                )
        self._engine = engine
        # The relay's own definition of the table: a Table built by an earlier kresilient
        # (or by hand) may lack the columns the relay reads and writes.
        self._table = outbox_table(MetaData(schema=table.schema), table.name)
        self._batch_size = batch_size
        self._lease_ms = int(lease_s * 1000)
        self._flush_timeout = flush_timeout_s
        self._poll_interval = poll_interval_s
        self._max_attempts = max_attempts
        self._log = (logger or structlog.get_logger("kresilient.outbox")).bind(
            outbox_table=table.name
        )
        self._redact: Callable[[str], str] = (
            Redactor.for_config(producer_config) if producer_config is not None else redact_text
        )
        _migrate(engine, self._table)
        self._own_producer = producer is None
        self._producer = (
            producer if producer is not None else ResilientProducer(producer_config or {})
        )
        self._dead_letter_topic = dead_letter_topic
        self._make_writer: Callable[[], DeadLetterWriter] | None = None
        if dead_letter_topic is not None and producer_config is not None:
            config = dict(producer_config)
            self._make_writer = lambda: DeadLetterWriter(
                config,
                message_max_bytes=int(dead_letter_max_bytes),
                logger=self._log,
            )
        self._writer: DeadLetterWriter | None = None
        self._legacy_prefix = f"outbox-{table.name}-"
        #: Rows published and marked sent by this relay.
        self.published = 0
        #: Rows published with the possible-duplicate mark (claimed more than once).
        self.republished = 0
        #: Rows written to ``dead_letter_topic`` instead of their topic.
        self.dead_lettered = 0
        #: Rows marked failed (given up without being written anywhere).
        self.failed = 0

    # ------------------------------------------------------------------ one batch

    def _claim(self) -> list[_Claimed]:
        t = self._table
        now = int(time.time() * 1000)
        candidates = (
            select(t.c.id)
            .where(and_(t.c.sent_ms.is_(None), t.c.failed_ms.is_(None), t.c.claimed_until < now))
            .order_by(t.c.id)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(candidates))
            .values(claimed_until=now + self._lease_ms, attempts=t.c.attempts + 1)
            .returning(
                t.c.id,
                t.c.topic,
                t.c.key,
                t.c.value,
                t.c.headers,
                t.c.attempts,
                t.c.message_id,
                t.c.error,
            )
        )
        with self._engine.begin() as conn:
            rows = list(conn.execute(stmt))
            # A row claimed for the first time gets its id now, in the claim's transaction:
            # every later copy carries the same one. A row without one but claimed before
            # was claimed by an earlier kresilient and published with the table-local id.
            fresh = {
                r.id: f"outbox-{uuid.uuid4().hex}"
                for r in rows
                if r.message_id is None and r.attempts == 1
            }
            if fresh:
                conn.execute(
                    update(t)
                    .where(t.c.id == bindparam("row_id"))
                    .values(message_id=bindparam("new_id")),
                    [{"row_id": k, "new_id": v} for k, v in fresh.items()],
                )
        claimed = [
            _Claimed(
                id=r.id,
                topic=r.topic,
                key=r.key,
                value=r.value,
                headers=r.headers,
                attempts=r.attempts,
                message_id=fresh.get(r.id) or r.message_id or f"{self._legacy_prefix}{r.id}",
                error=r.error,
            )
            for r in rows
        ]
        claimed.sort(key=lambda r: r.id)
        return claimed

    def _headers(self, row: _Claimed) -> _Headers:
        headers = _decode_headers(row.headers)
        headers.append((MESSAGE_ID_HEADER, row.message_id.encode()))
        if row.attempts > 1:
            headers.append((POSSIBLE_DUPLICATE_HEADER, b"true"))
        return headers

    def publish_batch(self) -> int:
        """Claim, publish and mark one batch; return how many rows were marked sent.

        Rows Kafka did not acknowledge within ``flush_timeout_s`` stay unsent (claimed again
        after the lease, marked as possible duplicates); the failures are logged. Rows Kafka
        can never accept are dead-lettered or marked failed (see the module docstring); the
        rest of the batch is published regardless. Raises
        :class:`~kresilient.FatalProducerError` (or the closed producer's
        :class:`~kresilient.ProduceError`) after marking what was acknowledged.
        """
        return self._publish_batch().sent

    def _publish_batch(self) -> _Outcome:
        started = time.monotonic()
        rows = self._claim()
        if not rows:
            return _Outcome()
        batch = _Batch()
        items = []
        for row in rows:
            headers = self._headers(row)
            if self._max_attempts is not None and row.attempts > self._max_attempts:
                reason = (
                    f"not acknowledged in {row.attempts - 1} claims (max_attempts="
                    f"{self._max_attempts}); last error: {row.error or 'none recorded'}"
                )
                error = ProduceError(reason, topic=row.topic)
                batch.give_up.append((row, headers, _Failure(reason, error)))
            else:
                items.append((row, headers))
        self._send(items, batch, alone=False)
        # The broker refuses a whole produce request (one batch per partition) when one record
        # of it is too large or invalid: its other records get the same error. Each refused
        # row is sent again alone, in id order: only a row refused alone is given up.
        if batch.suspects:
            self._log.info(
                "outbox_rows_sent_alone",
                rows=len(batch.suspects),
                note="refused by the broker with their produce request: each is sent again "
                "alone, only a row refused alone is given up",
            )
        lease_s = self._lease_ms / 1000
        for index, item in enumerate(batch.suspects):
            # One flush each: the rest wait for the next claim rather than outlive the lease
            # (another relay would publish them again); the first always goes, so each claim
            # makes progress.
            late = index > 0 and time.monotonic() - started + 2 * self._flush_timeout > lease_s
            if batch.stop is not None or late:
                batch.unqueued += [row.id for row, _ in batch.suspects[index:]]
                break
            self._send([item], batch, alone=True)
        t = self._table
        now = int(time.time() * 1000)
        with self._engine.begin() as conn:
            if batch.sent:
                conn.execute(
                    update(t).where(t.c.id.in_(batch.sent)).values(sent_ms=now, error=None)
                )
            if batch.retry:
                conn.execute(
                    update(t).where(t.c.id == bindparam("row_id")).values(error=bindparam("why")),
                    [
                        {"row_id": k, "why": self._redact(v)[:_ERROR_LIMIT]}
                        for k, v in batch.retry.items()
                    ],
                )
            if batch.unqueued:  # not published by this claim: it does not count as an attempt
                conn.execute(
                    update(t)
                    .where(t.c.id.in_(batch.unqueued))
                    .values(claimed_until=0, attempts=t.c.attempts - 1)
                )
        given_up = self._give_up(batch.give_up)
        self.published += len(batch.sent)
        self.republished += sum(1 for row, _ in items if row.attempts > 1)
        if batch.retry:
            self._log.warning(
                "outbox_publish_failed",
                failed=len(batch.retry),
                batch=len(rows),
                error=self._redact(next(iter(batch.retry.values())))[:500],
                note="these rows stay unsent and are published again after the lease",
            )
        stop = batch.stop
        if stop is not None:
            self._log.warning(
                "outbox_batch_stopped",
                reason=self._redact(_reason(stop))[:500],
                released=len(batch.unqueued),
                note="the rows not handed to the producer are claimable again at once",
            )
            if stop.classification.category is not ErrorCategory.BACKPRESSURE:
                raise stop
        return _Outcome(sent=len(batch.sent), given_up=given_up)

    def _send(self, items: list[tuple[_Claimed, _Headers]], batch: _Batch, *, alone: bool) -> None:
        """Produce ``items``, flush, and sort each row into ``batch`` by its outcome.

        ``alone``: the items are sent one by one (each its own produce request), so a
        broker's refusal names the row itself and gives it up; otherwise such a row is a
        suspect, sent again alone.
        """
        queued = []
        for index, (row, headers) in enumerate(items):
            try:
                handle = self._producer.produce(row.topic, row.value, key=row.key, headers=headers)
            except (FatalProducerError, ProduceError) as exc:
                c = exc.classification
                if isinstance(exc, ProduceError) and is_unproducible(c):
                    # refused by the producer's own check, for this record alone
                    batch.give_up.append((row, headers, _Failure(_reason(exc), exc)))
                    continue
                if (
                    isinstance(exc, FatalProducerError)
                    or c.category is ErrorCategory.BACKPRESSURE
                    or c.name == "_STATE"
                ):
                    # The producer, not this row, cannot take more: stop the batch here.
                    batch.stop = exc
                    batch.unqueued += [r.id for r, _ in items[index:]]
                    break
                batch.retry[row.id] = _reason(exc)  # refused for now (e.g. a local check)
                continue
            queued.append((row, headers, handle))
        if not queued:
            return
        with contextlib.suppress(DeliveryError):  # each handle tells its row's outcome, below
            self._producer.flush(self._flush_timeout)
        for row, headers, handle in queued:
            if not handle.done():
                batch.retry[row.id] = (
                    f"not acknowledged within flush_timeout_s={self._flush_timeout:g}"
                )
                continue
            error = handle.exception(0)
            if error is None:
                written = handle.result(0).topic
                if written != row.topic:  # a producer= with its own dead_letter_topic
                    self._mark_given_up(row, f"dead-lettered to {written} by the producer", True)
                    continue
                batch.sent.append(row.id)
            elif not is_unproducible(error.classification):
                batch.retry[row.id] = _reason(error)
            elif alone:
                batch.give_up.append((row, headers, _Failure(_reason(error), error)))
            else:
                batch.suspects.append((row, headers))

    # ------------------------------------------------------------------ giving rows up

    def _give_up(self, rows: list[tuple[_Claimed, _Headers, _Failure]]) -> int:
        """Dead-letter (or mark failed) rows that will not be published; return how many were
        settled (the others stay claimed: their dead-letter write failed for now)."""
        if not rows:
            return 0
        if self._make_writer is None:
            for row, _, failure in rows:
                self._mark_given_up(row, failure.reason, False)
            return len(rows)
        if self._writer is None:
            self._writer = self._make_writer()
        writer = self._writer
        topic = self._dead_letter_topic
        assert topic is not None
        written = []
        settled = 0
        for row, headers, failure in rows:
            error = failure.error
            record = DeadLetterRecord(
                topic=topic,
                key=row.key,
                value=row.value,
                headers=dead_letter_headers(
                    row.topic,
                    None,
                    None,
                    None,
                    None,
                    error,
                    error.classification if isinstance(error, KResilientError) else None,
                    row.attempts,
                    original_headers=headers,
                    redact=self._redact,
                ),
            )
            try:
                written.append((row, failure, writer.write(record)))
            except DeadLetterError as exc:
                settled += self._dead_letter_failed(row, failure, exc)
        with contextlib.suppress(DeliveryError):  # each handle tells its row's outcome, below
            writer.flush(self._flush_timeout)
        for row, failure, handle in written:
            if not handle.done():
                self._dead_letter_failed(
                    row,
                    failure,
                    None,
                    f"not acknowledged within flush_timeout_s={self._flush_timeout:g}",
                )
                continue
            cause = handle.exception(0)
            if cause is not None:
                settled += self._dead_letter_failed(row, failure, cause)
                continue
            self._mark_given_up(row, f"dead-lettered to {topic}: {failure.reason}", True)
            settled += 1
        return settled

    def _dead_letter_failed(
        self, row: _Claimed, failure: _Failure, cause: DeadLetterError | None, why: str = ""
    ) -> int:
        """The dead-letter write failed: a row the dead-letter topic can never take either is
        marked failed (1); otherwise it stays claimed and comes back after the lease (0)."""
        if cause is not None:
            why = _reason(cause)
        reason = f"{failure.reason}; dead-letter write to {self._dead_letter_topic} failed: {why}"
        if cause is not None and is_unproducible(cause.classification):
            self._mark_given_up(row, reason, False)
            return 1
        self._log.warning(
            "outbox_dead_letter_failed",
            row_id=row.id,
            topic=row.topic,
            dead_letter_topic=self._dead_letter_topic,
            reason=self._redact(reason)[:500],
            note="the row stays unsent and is dead-lettered again after the lease",
        )
        t = self._table
        with self._engine.begin() as conn:
            conn.execute(
                update(t).where(t.c.id == row.id).values(error=self._redact(reason)[:_ERROR_LIMIT])
            )
        return 0

    def _mark_given_up(self, row: _Claimed, reason: str, written: bool) -> None:
        """Record a row given up: dead-lettered (``written``: ``sent_ms`` too) or failed."""
        reason = self._redact(reason)
        now = int(time.time() * 1000)
        t = self._table
        values: dict[str, Any] = {"failed_ms": now, "error": reason[:_ERROR_LIMIT]}
        if written:
            values["sent_ms"] = now
        with self._engine.begin() as conn:
            conn.execute(update(t).where(t.c.id == row.id).values(**values))
        if written:
            self.dead_lettered += 1
        else:
            self.failed += 1
        self._log.warning(
            "outbox_row_dead_lettered" if written else "outbox_row_failed",
            row_id=row.id,
            topic=row.topic,
            message_id=row.message_id,
            attempts=row.attempts,
            value_size=len(row.value) if row.value is not None else 0,
            reason=reason[:500],
            **({} if written else {"note": "never written; set failed_ms to NULL to retry it"}),
        )

    # ------------------------------------------------------------------ loop and state

    def run(self, stop: threading.Event | None = None) -> None:
        """Publish batches until ``stop`` is set (forever without one)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            outcome = self._publish_batch()
            if not (outcome.sent or outcome.given_up):
                stop.wait(self._poll_interval)

    def pending(self) -> int:
        """Rows neither marked sent nor given up yet."""
        t = self._table
        with self._engine.connect() as conn:
            stmt = (
                select(func.count())
                .select_from(t)
                .where(and_(t.c.sent_ms.is_(None), t.c.failed_ms.is_(None)))
            )
            return int(conn.execute(stmt).scalar_one())

    def close(self) -> None:
        """Close the relay's own producer (one passed in is left open) and its dead-letter
        writer.

        Messages Kafka did not acknowledge are only logged: their rows are not marked sent,
        so they are published again (marked) after the lease.
        """
        if self._writer is not None:
            try:
                self._writer.close(self._flush_timeout)
            except DeliveryError as exc:
                self._log.warning(
                    "outbox_dead_letters_unacknowledged_at_close",
                    failed=len(exc.failures),
                    note="their rows stay unsent and are dead-lettered again after the lease",
                )
        if self._own_producer:
            try:
                self._producer.close()
            except DeliveryError as exc:
                self._log.warning(
                    "outbox_unacknowledged_at_close",
                    failed=len(exc.failures),
                    note="their rows stay unsent and are published again after the lease",
                )

    def __enter__(self) -> OutboxRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
