"""Transactional outbox: publish rows written in the same database transaction as the data.

The application writes its business rows and an outbox row in ONE transaction
(:func:`enqueue`): either both are committed or neither. A relay (:class:`OutboxRelay`, one
or several processes) publishes committed outbox rows with the idempotent
:class:`~kresilient.ResilientProducer` and marks a row sent only after Kafka acknowledged it.
A rolled-back transaction leaves no outbox row, so it is never published.

How relays share the table (SQLAlchemy Core; PostgreSQL and SQLite tested):

1. *claim*: one statement ``UPDATE outbox SET claimed_until = now + lease, attempts =
   attempts + 1 WHERE id IN (SELECT id ... WHERE sent_at IS NULL AND claimed_until < now
   ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING ...``, committed: two relays never
   claim the same row (PostgreSQL skips rows another relay is claiming; SQLite serialises
   writers);
2. *publish*: each row with the header ``kresilient.message.id: outbox-<table>-<id>``
   (stable), plus ``kresilient.possible.duplicate: true`` when ``attempts > 1`` (an earlier
   claim of the row may have published it: its relay crashed, or its flush failed);
3. *mark*: ``UPDATE ... SET sent_at = now WHERE id IN (acknowledged ids)``, committed.

A relay killed between 2 and 3 leaves its rows claimed until the lease runs out; another
relay (or its restart) then publishes them again, marked. A consumer drops those copies with
:class:`kresilient.dedupe.Deduplicator`. The clocks of relay hosts must agree to well within
the lease (``claimed_until`` is wall-clock time written by the relay).

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
import threading
import time
from collections.abc import Mapping, Sequence
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
    func,
    select,
    update,
)

from kresilient.dedupe import MESSAGE_ID_HEADER, POSSIBLE_DUPLICATE_HEADER
from kresilient.errors import DeliveryError
from kresilient.producer import ResilientProducer

__all__ = ["OutboxRelay", "enqueue", "outbox_table"]

_DEFAULT_TABLE: Final = "kresilient_outbox"


def outbox_table(metadata: MetaData, name: str = _DEFAULT_TABLE) -> Table:
    """The outbox table definition (create it with ``metadata.create_all(engine)``).

    Columns: ``id`` (order and identity), ``topic``, ``key``, ``value``, ``headers`` (JSON),
    ``created_ms``, ``attempts`` (claims so far), ``claimed_until`` (ms, lease), ``sent_ms``
    (set once Kafka acknowledged; ``NULL`` until then).
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
    )


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


class OutboxRelay:
    """Publishes committed outbox rows; marks them sent after Kafka's acknowledgement.

    Args:
        engine: a SQLAlchemy ``Engine`` on the application's database.
        table: the outbox :class:`~sqlalchemy.Table` (:func:`outbox_table`).
        producer_config: configuration of the relay's idempotent
            :class:`~kresilient.ResilientProducer` (or pass ``producer=``).
        batch_size: rows claimed and published per batch.
        lease_s: how long a claim is exclusive. A relay that crashed holds its rows this long;
            it must exceed ``flush_timeout_s`` (checked).
        flush_timeout_s: how long a batch waits for Kafka's acknowledgements; rows not
            acknowledged by then stay unsent and are claimed again after the lease (marked).
        poll_interval_s: :meth:`run` sleeps this long when the outbox is empty.
        producer: an existing producer to publish with (the relay does not close it).
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
        self._engine = engine
        self._table = table
        self._batch_size = batch_size
        self._lease_ms = int(lease_s * 1000)
        self._flush_timeout = flush_timeout_s
        self._poll_interval = poll_interval_s
        self._log = (logger or structlog.get_logger("kresilient.outbox")).bind(
            outbox_table=table.name
        )
        self._own_producer = producer is None
        self._producer = (
            producer if producer is not None else ResilientProducer(producer_config or {})
        )
        self._prefix = f"outbox-{table.name}-"
        #: Rows published and marked sent by this relay.
        self.published = 0
        #: Rows published with the possible-duplicate mark (claimed more than once).
        self.republished = 0

    # ------------------------------------------------------------------ one batch

    def _claim(self) -> list[Any]:
        t = self._table
        now = int(time.time() * 1000)
        candidates = (
            select(t.c.id)
            .where(and_(t.c.sent_ms.is_(None), t.c.claimed_until < now))
            .order_by(t.c.id)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            update(t)
            .where(t.c.id.in_(candidates))
            .values(claimed_until=now + self._lease_ms, attempts=t.c.attempts + 1)
            .returning(t.c.id, t.c.topic, t.c.key, t.c.value, t.c.headers, t.c.attempts)
        )
        with self._engine.begin() as conn:
            rows = list(conn.execute(stmt))
        rows.sort(key=lambda r: r.id)
        return rows

    def publish_batch(self) -> int:
        """Claim, publish and mark one batch; return how many rows were marked sent.

        Rows Kafka did not acknowledge within ``flush_timeout_s`` stay unsent (claimed again
        after the lease, marked as possible duplicates); the failures are logged.
        """
        rows = self._claim()
        if not rows:
            return 0
        handles = []
        for row in rows:
            headers = _decode_headers(row.headers)
            headers.append((MESSAGE_ID_HEADER, (self._prefix + str(row.id)).encode()))
            if row.attempts > 1:
                headers.append((POSSIBLE_DUPLICATE_HEADER, b"true"))
            handles.append(
                (row, self._producer.produce(row.topic, row.value, key=row.key, headers=headers))
            )
        try:
            self._producer.flush(self._flush_timeout)
        except DeliveryError as exc:
            self._log.warning(
                "outbox_publish_failed",
                failed=len(exc.failures),
                batch=len(rows),
                error=str(exc)[:500],
                note="unacknowledged rows stay unsent and are published again after the lease",
            )
        sent = [row.id for row, h in handles if h.done() and h.exception(0) is None]
        if sent:
            t = self._table
            with self._engine.begin() as conn:
                conn.execute(
                    update(t).where(t.c.id.in_(sent)).values(sent_ms=int(time.time() * 1000))
                )
        self.published += len(sent)
        self.republished += sum(1 for row, _ in handles if row.attempts > 1)
        return len(sent)

    def run(self, stop: threading.Event | None = None) -> None:
        """Publish batches until ``stop`` is set (forever without one)."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if not self.publish_batch():
                stop.wait(self._poll_interval)

    def pending(self) -> int:
        """Rows not marked sent yet."""
        t = self._table
        with self._engine.connect() as conn:
            stmt = select(func.count()).select_from(t).where(t.c.sent_ms.is_(None))
            return int(conn.execute(stmt).scalar_one())

    def close(self) -> None:
        """Close the relay's own producer (one passed in is left open).

        Messages Kafka did not acknowledge are only logged: their rows are not marked sent,
        so they are published again (marked) after the lease.
        """
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
