"""The outbox at its seams (issue 35 #4, #5), on the real cluster.

#4: a message id unique only within one table (``outbox-<table>-<row id>``) is shared by two
databases with the default table name, and by an SQLite row whose id was reused after a
purge: when the second row's first publication failed and it is re-published marked as a
possible duplicate, ``Deduplicator`` drops a real message. Ids are now minted per row
(``outbox-<uuid4>``) at the first claim and stored.

#5: a row ``produce()`` refuses (a value over ``message.max.bytes``) made ``publish_batch()``
raise on every claim: ``run()`` died and the good rows of its batch were never marked sent;
a row the broker refuses (the topic's ``max.message.bytes``) was re-published forever. Such
rows are now dead-lettered byte for byte, or marked failed with their reason; a row that
fails for a reason that passes (a topic not created yet, Kafka unreachable) is retried.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from _producer_helpers import header_dict, read_back
from sqlalchemy import Engine, MetaData, Table, create_engine, select, text

from kresilient.dedupe import Deduplicator
from kresilient.errors import DeliveryError
from kresilient.outbox import OutboxRelay, enqueue, outbox_table

pytestmark = pytest.mark.integration

ID = "kresilient.message.id"
DUP = "kresilient.possible.duplicate"


def _wait(cond: Callable[[], Any], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _outbox(path: Path) -> tuple[Engine, Table]:
    engine = create_engine(f"sqlite:///{path}")
    metadata = MetaData()
    outbox = outbox_table(metadata)  # the default table name in every database
    metadata.create_all(engine)
    return engine, outbox


def _add(engine: Engine, outbox: Table, topic: str, value: bytes, **kw: Any) -> None:
    with engine.begin() as conn:
        enqueue(conn, outbox, topic=topic, value=value, **kw)


def _publish(engine: Engine, outbox: Table, bootstrap: str) -> int:
    with OutboxRelay(
        engine, outbox, {"bootstrap.servers": bootstrap}, lease_s=10, flush_timeout_s=5
    ) as relay:
        n = relay.publish_batch()
        assert relay.pending() == 0
    return n


def _publish_after_a_failed_attempt(
    engine: Engine, outbox: Table, bootstrap: str, closed_port: int
) -> None:
    """The row's first publication fails (Kafka unreachable): after the lease it is published
    again, marked as a possible duplicate, as after a relay's failed flush or crash."""
    down = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": f"127.0.0.1:{closed_port}", "message.timeout.ms": 500},
        lease_s=2.0,
        flush_timeout_s=1.0,
    )
    assert down.publish_batch() == 0 and down.pending() == 1
    down.close()
    with OutboxRelay(
        engine, outbox, {"bootstrap.servers": bootstrap}, lease_s=2.0, flush_timeout_s=1.5
    ) as up:
        _wait(lambda: up.publish_batch() == 1, "the row published after the lease")


def _processed(bootstrap: str, topic: str) -> tuple[list[bytes], list[Any]]:
    """What a consumer with a Deduplicator processes, and every record read."""
    dedupe = Deduplicator()
    records = read_back(bootstrap, topic)
    done = []
    for msg in records:
        if not dedupe.is_duplicate(msg):
            dedupe.processed(msg)
            done.append(msg.value())
    return done, records


def test_two_databases_with_the_default_table_name_never_share_an_id(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path, closed_port: int
) -> None:
    topic = topic_factory()
    bootstrap = kafka_cluster.bootstrap_servers
    a, a_box = _outbox(tmp_path / "a.db")
    b, b_box = _outbox(tmp_path / "b.db")
    _add(a, a_box, topic, b"order from service A")
    assert _publish(a, a_box, bootstrap) == 1
    _add(b, b_box, topic, b"order from service B")
    _publish_after_a_failed_attempt(b, b_box, bootstrap, closed_port)

    done, records = _processed(bootstrap, topic)
    assert [m.value() for m in records] == [b"order from service A", b"order from service B"]
    # control: B's record is a marked copy, the kind Deduplicator drops when its id was seen
    assert header_dict(records[1]).get(DUP) == b"true"
    # c15a167: both were b"outbox-kresilient_outbox-1", and B's order was dropped
    assert done == [b"order from service A", b"order from service B"]
    ids = [header_dict(m)[ID] for m in records]
    assert ids[0] != ids[1], ids


def test_sqlite_row_id_reused_after_a_purge_gets_a_new_message_id(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path, closed_port: int
) -> None:
    topic = topic_factory()
    bootstrap = kafka_cluster.bootstrap_servers
    engine, outbox = _outbox(tmp_path / "app.db")
    _add(engine, outbox, topic, b"first order")
    assert _publish(engine, outbox, bootstrap) == 1
    with engine.begin() as conn:  # the application's housekeeping: drop sent rows
        conn.execute(outbox.delete().where(outbox.c.sent_ms.is_not(None)))
    _add(engine, outbox, topic, b"second order")
    with engine.connect() as conn:
        # control: SQLite really hands the purged row id out again
        assert list(conn.execute(select(outbox.c.id))) == [(1,)]
    _publish_after_a_failed_attempt(engine, outbox, bootstrap, closed_port)

    done, records = _processed(bootstrap, topic)
    assert [m.value() for m in records] == [b"first order", b"second order"]
    assert header_dict(records[1]).get(DUP) == b"true"  # control: a marked copy
    assert done == [b"first order", b"second order"]  # c15a167: the second one dropped
    assert header_dict(records[0])[ID] != header_dict(records[1])[ID]


_LEGACY_DDL = (
    "CREATE TABLE kresilient_outbox (id INTEGER NOT NULL PRIMARY KEY, topic VARCHAR(255) NOT NULL,"
    " key BLOB, value BLOB, headers JSON, created_ms BIGINT NOT NULL, attempts INTEGER NOT NULL,"
    " claimed_until BIGINT NOT NULL, sent_ms BIGINT)"
)


def test_a_table_of_the_earlier_release_is_migrated_by_relays_starting_at_once(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path
) -> None:
    """An outbox table as kresilient 0.x created it: enqueue() works on it before and after the
    migration; two relays constructed at once both add the missing columns without error; a row
    an earlier relay claimed keeps its old id (its re-sent copy stays recognisable), new rows
    get new ones."""
    topic = topic_factory()
    bootstrap = kafka_cluster.bootstrap_servers
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.begin() as conn:
        conn.execute(text(_LEGACY_DDL))
    outbox = outbox_table(MetaData())
    _add(engine, outbox, topic, b"claimed by the old relay")  # before the migration
    with engine.begin() as conn:  # an earlier relay claimed it (and maybe published it)
        conn.execute(text("UPDATE kresilient_outbox SET attempts = 1"))

    barrier = threading.Barrier(2)
    relays: list[OutboxRelay] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            relays.append(
                OutboxRelay(
                    engine,
                    outbox,
                    {"bootstrap.servers": bootstrap},
                    lease_s=10,
                    flush_timeout_s=5,
                )
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    _add(engine, outbox, topic, b"new row")
    assert relays[0].publish_batch() == 2
    for relay in relays:
        relay.close()
    records = read_back(bootstrap, topic)
    headers = [header_dict(m) for m in records]
    assert [m.value() for m in records] == [b"claimed by the old relay", b"new row"]
    assert headers[0][ID] == b"outbox-kresilient_outbox-1" and headers[0][DUP] == b"true"
    assert headers[1][ID].startswith(b"outbox-") and len(headers[1][ID]) == 39
    assert DUP not in headers[1]


# ------------------------------------------------------------------ #5 unproducible rows

PRODUCER_MAX = 10_000  # the relay producer's message.max.bytes
TOPIC_MAX = 4_096  # the topic's max.message.bytes


def _rows(engine: Engine, outbox: Table, topic: str) -> dict[str, bytes]:
    """good0, too big for the producer, good1, too big for the topic, good2 (by name)."""
    values = {
        "good0": b"g0",
        "local": b"L" * (2 * PRODUCER_MAX),
        "good1": b"g1",
        "broker": b"B" * (TOPIC_MAX + 2_000),
        "good2": b"g2",
    }
    for name, value in values.items():
        _add(
            engine,
            outbox,
            topic,
            value,
            key=f"key-{name}".encode(),
            headers=[("row", name), ("raw", b"\x00\xff" + name.encode())],
        )
    return values


def _state(engine: Engine, outbox: Table) -> dict[bytes, Any]:
    with engine.connect() as conn:
        return {
            r.key: r
            for r in conn.execute(
                select(outbox.c.key, outbox.c.sent_ms, outbox.c.failed_ms, outbox.c.error)
            )
        }


@pytest.fixture(name="running")
def _running() -> Iterator[Callable[[OutboxRelay], threading.Thread]]:
    """Start ``relay.run(stop)`` in a thread; the thread records how run() ended."""
    stop = threading.Event()
    started: list[threading.Thread] = []

    def start(relay: OutboxRelay) -> threading.Thread:
        def target() -> None:
            try:
                relay.run(stop)
            except BaseException as exc:  # what c15a167 did: run() died on the refused row
                worker.died = exc  # type: ignore[attr-defined]

        worker = threading.Thread(target=target, daemon=True)
        worker.died = None  # type: ignore[attr-defined]
        worker.start()
        started.append(worker)
        return worker

    yield start
    stop.set()
    for worker in started:
        worker.join(60)


def test_unproducible_rows_are_dead_lettered_byte_identical_and_the_rest_flows(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path, running: Any
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(config={"max.message.bytes": TOPIC_MAX})
    dlq = topic_factory()
    engine, outbox = _outbox(tmp_path / "app.db")
    values = _rows(engine, outbox, topic)
    relay = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": bootstrap, "message.max.bytes": PRODUCER_MAX},
        dead_letter_topic=dlq,
        lease_s=10,
        flush_timeout_s=5,
        poll_interval_s=0.1,
    )
    with structlog.testing.capture_logs() as logs:
        worker = running(relay)
        _wait(lambda: relay.pending() == 0 or not worker.is_alive(), "every row settled")
        assert worker.is_alive(), f"run() died: {worker.died!r}"
    relay.close()

    published = read_back(bootstrap, topic)
    assert [m.value() for m in published] == [b"g0", b"g1", b"g2"]
    dead = read_back(bootstrap, dlq)
    assert sorted(m.key() for m in dead) == [b"key-broker", b"key-local"]
    for msg in dead:
        name = msg.key().decode()[4:]
        assert msg.value() == values[name]  # byte for byte
        headers = msg.headers()
        assert headers[:2] == [("row", name.encode()), ("raw", b"\x00\xff" + name.encode())]
        h = header_dict(msg)
        assert h["kresilient.original.topic"] == topic.encode()
        assert h[ID].startswith(b"outbox-")
        assert b"MSG_SIZE_TOO_LARGE" in h["kresilient.exception.message"]
    state = _state(engine, outbox)
    for name in ("good0", "good1", "good2"):
        row = state[f"key-{name}".encode()]
        assert row.sent_ms is not None and row.failed_ms is None and row.error is None
    for name in ("local", "broker"):
        row = state[f"key-{name}".encode()]
        assert row.sent_ms is not None and row.failed_ms is not None
        assert row.error.startswith(f"dead-lettered to {dlq}") and "MSG_SIZE_TOO_LARGE" in row.error
    assert relay.dead_lettered == 2 and relay.failed == 0 and relay.published == 3
    events = [e for e in logs if e["event"] == "outbox_row_dead_lettered"]
    assert sorted(e["row_id"] for e in events) == [2, 4]


def test_unproducible_row_without_a_dead_letter_topic_is_marked_failed_with_its_reason(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path, running: Any
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = topic_factory(config={"max.message.bytes": TOPIC_MAX})
    engine, outbox = _outbox(tmp_path / "app.db")
    _rows(engine, outbox, topic)
    relay = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": bootstrap, "message.max.bytes": PRODUCER_MAX},
        lease_s=10,
        flush_timeout_s=5,
        poll_interval_s=0.1,
    )
    with structlog.testing.capture_logs() as logs:
        worker = running(relay)
        _wait(lambda: relay.pending() == 0 or not worker.is_alive(), "every row settled")
        assert worker.is_alive(), f"run() died: {worker.died!r}"
        # later batches go on: a row enqueued now is published by the same run()
        _add(engine, outbox, topic, b"g3", key=b"key-good3")
        _wait(lambda: relay.pending() == 0, "the later row published")
    relay.close()

    assert [m.value() for m in read_back(bootstrap, topic)] == [b"g0", b"g1", b"g2", b"g3"]
    state = _state(engine, outbox)
    for name in ("local", "broker"):
        row = state[f"key-{name}".encode()]
        assert row.sent_ms is None and row.failed_ms is not None  # never written anywhere
        assert "MSG_SIZE_TOO_LARGE" in row.error
    failed = {e["row_id"]: e for e in logs if e["event"] == "outbox_row_failed"}
    assert sorted(failed) == [2, 4]
    assert all("MSG_SIZE_TOO_LARGE" in e["reason"] for e in failed.values())
    assert relay.failed == 2 and relay.published == 4


def test_a_row_whose_topic_is_not_created_yet_is_retried_not_given_up(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path
) -> None:
    """A passing failure (the relay runs before the deploy created the topic; the cluster does
    not auto-create topics) leaves the row unsent with its reason, never dead-lettered."""
    bootstrap = kafka_cluster.bootstrap_servers
    dlq = topic_factory()
    topic = f"{dlq}-later"
    engine, outbox = _outbox(tmp_path / "app.db")
    _add(engine, outbox, topic, b"v", key=b"k")
    relay = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": bootstrap, "message.timeout.ms": 1_500},
        dead_letter_topic=dlq,
        lease_s=4,
        flush_timeout_s=3,
    )
    assert relay.publish_batch() == 0
    row = _state(engine, outbox)[b"k"]
    assert row.sent_ms is None and row.failed_ms is None and row.error  # the fault was real
    assert relay.pending() == 1 and relay.dead_lettered == relay.failed == 0
    topic_factory(name=topic)
    _wait(lambda: relay.publish_batch() == 1, "the row published once its topic exists")
    relay.close()
    (msg,) = read_back(bootstrap, topic)
    assert msg.value() == b"v" and header_dict(msg)[DUP] == b"true"
    assert read_back(bootstrap, dlq) == []
    row = _state(engine, outbox)[b"k"]
    assert row.sent_ms is not None and row.failed_ms is None and row.error is None


def test_max_attempts_gives_an_unacknowledged_row_up_with_its_last_error(
    tmp_path: Path, closed_port: int
) -> None:
    """Kafka unreachable (a real refused connection, no fake): the row is claimed twice, then
    marked failed with the last error; without max_attempts it would be retried forever."""
    engine, outbox = _outbox(tmp_path / "app.db")
    _add(engine, outbox, "t", b"v", key=b"k")
    config = {"bootstrap.servers": f"127.0.0.1:{closed_port}", "message.timeout.ms": 300}
    with OutboxRelay(
        engine, outbox, config, lease_s=2.0, flush_timeout_s=1.0, max_attempts=2
    ) as relay:
        _wait(lambda: (relay.publish_batch(), relay.failed)[1] == 1, "the row given up", 60)
        assert relay.pending() == 0
    row = _state(engine, outbox)[b"k"]
    assert row.sent_ms is None and row.failed_ms is not None
    assert "max_attempts=2" in row.error and "none recorded" not in row.error  # its last error
    with engine.connect() as conn:
        assert conn.execute(select(outbox.c.attempts)).scalar_one() == 3


def test_a_producer_with_its_own_dead_letter_topic_marks_the_row_dead_lettered(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path
) -> None:
    """``producer=`` built with ``dead_letter_topic``: the producer diverts the oversized row
    itself; the relay records it as dead-lettered, not as published to its topic."""
    from kresilient import ResilientProducer

    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = topic_factory(), topic_factory()
    engine, outbox = _outbox(tmp_path / "app.db")
    _add(engine, outbox, topic, b"x" * (2 * PRODUCER_MAX), key=b"big")
    _add(engine, outbox, topic, b"small", key=b"small")
    config = {"bootstrap.servers": bootstrap, "message.max.bytes": PRODUCER_MAX}
    with ResilientProducer(config, dead_letter_topic=dlq) as producer:
        relay = OutboxRelay(engine, outbox, producer=producer, lease_s=10, flush_timeout_s=5)
        assert relay.publish_batch() == 1
        producer.flush(10)
    assert relay.published == 1 and relay.dead_lettered == 1 and relay.pending() == 0
    state = _state(engine, outbox)
    assert state[b"big"].error == f"dead-lettered to {dlq} by the producer"
    assert state[b"big"].failed_ms is not None and state[b"big"].sent_ms is not None
    assert [m.value() for m in read_back(bootstrap, topic)] == [b"small"]
    assert [m.key() for m in read_back(bootstrap, dlq)] == [b"big"]


def test_a_full_producer_queue_stops_the_batch_and_releases_the_rest(
    tmp_path: Path, closed_port: int
) -> None:
    """Kafka unreachable and a one-message local queue (real librdkafka backpressure): the
    batch stops at the refused row without raising; the rows never handed to the producer are
    claimable again at once and their claim is not counted (they were not published)."""
    from kresilient import ResilientProducer

    engine, outbox = _outbox(tmp_path / "app.db")
    for i in range(3):
        _add(engine, outbox, "t", b"v%d" % i)
    config = {
        "bootstrap.servers": f"127.0.0.1:{closed_port}",
        "queue.buffering.max.messages": 1,
        "message.timeout.ms": 60_000,
    }
    producer = ResilientProducer(config, backpressure_timeout=0.2)
    with structlog.testing.capture_logs() as logs:
        relay = OutboxRelay(engine, outbox, producer=producer, lease_s=10, flush_timeout_s=0.5)
        assert relay.publish_batch() == 0  # no exception: the next batch will try again
    with pytest.raises(DeliveryError):  # the one queued message, purged (never written)
        producer.close(0.5)
    with engine.connect() as conn:
        rows = list(conn.execute(select(outbox.c.id, outbox.c.attempts, outbox.c.claimed_until)))
    assert rows[0].attempts == 1 and rows[0].claimed_until > 0  # queued: leased as usual
    assert [(r.attempts, r.claimed_until) for r in rows[1:]] == [(0, 0), (0, 0)]
    (stopped,) = [e for e in logs if e["event"] == "outbox_batch_stopped"]
    assert stopped["released"] == 2 and "BACKPRESSURE" in stopped["reason"]
