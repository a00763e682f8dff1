"""kresilient.outbox on SQLite and on a real PostgreSQL, publishing to the real cluster.

PostgreSQL comes from Debian's packages (``initdb``/``pg_ctl`` on PATH or under
/usr/lib/postgresql/*/bin), started in a temp directory on 127.0.0.1 and a free port as the
``nobody`` user (postgres refuses to run as root), ``fsync=off`` (the relay is under test, not
PostgreSQL's own durability). Issue 20 acceptance 3: 10,000 business transactions (every
tenth rolled back), two relays, one of them SIGKILLed twice mid-way.

Run as a script, this file is a relay process (``python test_outbox.py relay ...``).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

TRANSACTIONS = 10_000


def _tables(metadata: Any) -> tuple[Any, Any]:
    from sqlalchemy import Column, Integer, String, Table

    from kresilient.outbox import outbox_table

    orders = Table(
        "orders", metadata, Column("id", Integer, primary_key=True), Column("item", String(40))
    )
    return orders, outbox_table(metadata)


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None
    )
    if found is None:
        pytest.fail(f"{name} not found: apt-get install postgresql")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", name="postgres_url")
def _postgres_url() -> Iterator[str]:
    base = Path(tempfile.mkdtemp(prefix="kresilient-pg-"))
    data = base / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses root: run it as nobody
        shutil.chown(base, "nobody")
        os.chmod(base, 0o700)
        as_user = ["runuser", "-u", "nobody", "--"]
    subprocess.run(
        [
            *as_user,
            _pg_bin("initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",  # the host's LANG may name a locale it never generated
        ],
        check=True,
        capture_output=True,
    )
    for attempt in range(3):  # the free port can be taken before postgres binds it
        port = _free_port()
        options = (
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        )
        started = subprocess.run(
            [
                *as_user,
                _pg_bin("pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(base / "log"),
                "-o",
                options,
                "-w",
                "start",
            ],
            check=attempt == 2,
            capture_output=True,
        )
        if started.returncode == 0:
            break
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_user, _pg_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


def _write_business(url: str, n: int, topic: str) -> tuple[set[int], set[int]]:
    """n transactions: an order and its outbox row; every tenth rolled back."""
    from sqlalchemy import MetaData, create_engine

    from kresilient.outbox import enqueue

    engine = create_engine(url)
    metadata = MetaData()
    orders, outbox = _tables(metadata)
    metadata.create_all(engine)
    committed: set[int] = set()
    rolled_back: set[int] = set()
    for i in range(n):
        conn = engine.connect()
        trans = conn.begin()
        conn.execute(orders.insert().values(id=i, item=f"item-{i}"))
        enqueue(
            conn,
            outbox,
            topic=topic,
            key=b"k%02d" % (i % 20),
            value=b"%07d" % i,
            headers={"order": str(i)},
        )
        if i % 10 == 9:
            trans.rollback()
            rolled_back.add(i)
        else:
            trans.commit()
            committed.add(i)
        conn.close()
    engine.dispose()
    return committed, rolled_back


def _relay_main(url: str, bootstrap: str) -> None:
    import logging

    import structlog
    from sqlalchemy import MetaData, create_engine

    from kresilient.outbox import OutboxRelay

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    engine = create_engine(url)
    _, outbox = _tables(MetaData())
    relay = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": bootstrap},
        batch_size=100,
        lease_s=4.0,
        flush_timeout_s=3.0,
        poll_interval_s=0.1,
    )
    while True:
        if not relay.publish_batch() and not relay.pending():
            break
        time.sleep(0.02)  # pace the relay so the test can kill it mid-way
    relay.close()
    print("relay done", relay.published, flush=True)


def _spawn_relay(url: str, bootstrap: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, __file__, "relay", url, bootstrap], stdout=out, stderr=out
        )


def _sent(url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        n = int(
            conn.execute(
                text("SELECT count(*) FROM kresilient_outbox WHERE sent_ms IS NOT NULL")
            ).scalar_one()
        )
    engine.dispose()
    return n


def _wait(cond: Any, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _check_topic(
    bootstrap: str, topic: str, committed: set[int], rolled_back: set[int]
) -> dict[str, int]:
    from _producer_helpers import header_dict, read_back

    from kresilient.dedupe import Deduplicator

    copies: dict[int, int] = defaultdict(int)
    unmarked_extra = 0
    dedupe = Deduplicator()
    processed: dict[int, int] = defaultdict(int)
    for msg in read_back(bootstrap, topic):
        i = int(msg.value())
        h = header_dict(msg)
        assert h["kresilient.message.id"] is not None and h["order"] == str(i).encode()
        copies[i] += 1
        if copies[i] > 1 and h.get("kresilient.possible.duplicate") != b"true":
            unmarked_extra += 1
        if not dedupe.is_duplicate(msg):
            processed[i] += 1
            dedupe.processed(msg)
    assert set(copies) == committed  # every committed row, no rolled-back row
    assert not set(copies) & rolled_back
    assert unmarked_extra == 0  # duplicates only marked ones
    assert max(processed.values()) == 1 and set(processed) == committed
    return {"duplicates": sum(c - 1 for c in copies.values())}


def test_outbox_postgres_relays_sigkilled_twice(
    kafka_cluster: Any, topic_factory: Any, postgres_url: str, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=3)
    bootstrap = kafka_cluster.bootstrap_servers
    committed, rolled_back = _write_business(postgres_url, TRANSACTIONS, topic)
    assert len(committed) == 9_000
    log = tmp_path / "relays.log"
    victim = _spawn_relay(postgres_url, bootstrap, log)
    other = _spawn_relay(postgres_url, bootstrap, log)
    kills = 0
    try:
        for threshold in (2_500, 5_500):
            _wait(lambda t=threshold: _sent(postgres_url) >= t, f"{threshold} rows sent")
            assert victim.poll() is None, log.read_text()[-2000:]
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(30)
            kills += 1
            victim = _spawn_relay(postgres_url, bootstrap, log)
        assert _sent(postgres_url) < len(committed)  # the kills happened mid-way
        _wait(lambda: _sent(postgres_url) == len(committed), "every committed row sent", 300)
    finally:
        for proc in (victim, other):
            if proc.poll() is None:
                proc.wait(120)
    assert victim.returncode == 0 and other.returncode == 0, log.read_text()[-3000:]
    assert kills == 2
    stats = _check_topic(bootstrap, topic, committed, rolled_back)
    print("postgres:", stats)


def test_outbox_sqlite_single_relay(kafka_cluster: Any, topic_factory: Any, tmp_path: Path) -> None:
    from sqlalchemy import MetaData, create_engine

    from kresilient.outbox import OutboxRelay, enqueue

    topic = topic_factory(partitions=1)
    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metadata = MetaData()
    orders, outbox = _tables(metadata)
    metadata.create_all(engine)
    committed, rolled_back = set(), set()
    for i in range(300):
        with engine.connect() as conn:
            trans = conn.begin()
            conn.execute(orders.insert().values(id=i, item="x"))
            enqueue(
                conn, outbox, topic=topic, value=b"%07d" % i, key=b"k", headers=[("order", str(i))]
            )
            if i % 7 == 3:
                trans.rollback()
                rolled_back.add(i)
            else:
                trans.commit()
                committed.add(i)
    with OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": kafka_cluster.bootstrap_servers},
        batch_size=50,
        lease_s=10,
        flush_timeout_s=5,
    ) as relay:
        assert relay.pending() == len(committed)
        while relay.publish_batch():
            pass
        assert relay.pending() == 0 and relay.published == len(committed)
        assert relay.republished == 0
    stats = _check_topic(kafka_cluster.bootstrap_servers, topic, committed, rolled_back)
    assert stats["duplicates"] == 0
    from _producer_helpers import read_back

    values = [int(m.value()) for m in read_back(kafka_cluster.bootstrap_servers, topic)]
    assert values == sorted(committed)  # one relay, one partition: id order


def test_outbox_rows_not_acknowledged_stay_unsent_and_come_back_marked(tmp_path: Path) -> None:
    """Negative path: Kafka unreachable -> nothing marked sent; after the lease the rows are
    claimed again with attempts=2 (they would carry the possible-duplicate mark)."""
    from sqlalchemy import MetaData, create_engine, select

    from kresilient.outbox import OutboxRelay, enqueue

    engine = create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    metadata = MetaData()
    _, outbox = _tables(metadata)
    metadata.create_all(engine)
    with engine.begin() as conn:
        for i in range(5):
            enqueue(conn, outbox, topic="t", value=b"v%d" % i)
    relay = OutboxRelay(
        engine,
        outbox,
        {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 500},
        batch_size=10,
        # A lease well beyond the first attempt (under load a 1 s lease expired before the
        # check below ran, and the rows were claimed a third time: attempts {3}).
        lease_s=8.0,
        flush_timeout_s=0.9,
    )
    assert relay.publish_batch() == 0
    assert relay.pending() == 5
    assert relay._claim() == []  # still leased: nothing claimed (and nothing counted)
    _wait(lambda: relay._claim() != [], "lease expiry", 60)
    with engine.connect() as conn:
        attempts = {r.attempts for r in conn.execute(select(outbox.c.attempts))}
    assert attempts == {2}
    with pytest.raises(ValueError, match="lease_s"):
        OutboxRelay(engine, outbox, {"bootstrap.servers": "x:1"}, lease_s=1, flush_timeout_s=2)
    relay.close()


_LEGACY_PG_DDL = (
    "CREATE TABLE kresilient_outbox (id BIGSERIAL PRIMARY KEY, topic VARCHAR(255) NOT NULL,"
    " key BYTEA, value BYTEA, headers JSON, created_ms BIGINT NOT NULL, attempts INTEGER NOT"
    " NULL, claimed_until BIGINT NOT NULL, sent_ms BIGINT)"
)


def test_outbox_postgres_two_databases_one_migrated_never_share_an_id(
    kafka_cluster: Any, topic_factory: Any, postgres_url: str
) -> None:
    """Issue 35 #4 on PostgreSQL: two databases, each with the default table name (one as an
    earlier kresilient created it, migrated by two relays starting at once), publish to one
    topic: every row has its own id (c15a167: both ``outbox-kresilient_outbox-1``); the row
    an earlier relay had claimed keeps its old id, so its re-sent copy is still recognised."""
    import threading

    from _producer_helpers import header_dict, read_back
    from sqlalchemy import MetaData, create_engine, text

    from kresilient.outbox import OutboxRelay, enqueue, outbox_table

    topic = topic_factory()
    bootstrap = kafka_cluster.bootstrap_servers
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        for name in ("service_a", "service_b"):
            conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    base = postgres_url.rsplit("/", 1)[0]
    engines = {name: create_engine(f"{base}/{name}") for name in ("service_a", "service_b")}
    with engines["service_a"].begin() as conn:  # the earlier release's table
        conn.execute(text(_LEGACY_PG_DDL))
    metadata = MetaData()
    outbox = outbox_table(metadata)
    metadata.create_all(engines["service_b"])
    for name, engine in engines.items():
        with engine.begin() as conn:
            enqueue(conn, outbox, topic=topic, value=f"{name} first".encode())
            enqueue(conn, outbox, topic=topic, value=f"{name} second".encode())
    with engines["service_a"].begin() as conn:  # claimed (maybe published) by an old relay
        conn.execute(text("UPDATE kresilient_outbox SET attempts = 1 WHERE id = 1"))

    barrier = threading.Barrier(2)
    relays: list[Any] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            relays.append(
                OutboxRelay(
                    engines["service_a"],
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
    assert relays[0].publish_batch() == 2
    for relay in relays:
        relay.close()
    with OutboxRelay(
        engines["service_b"],
        outbox,
        {"bootstrap.servers": bootstrap},
        lease_s=10,
        flush_timeout_s=5,
    ) as relay:
        assert relay.publish_batch() == 2
    for engine in engines.values():
        engine.dispose()

    ids = {m.value(): header_dict(m)["kresilient.message.id"] for m in read_back(bootstrap, topic)}
    assert len(ids) == 4 and len(set(ids.values())) == 4, ids
    assert ids[b"service_a first"] == b"outbox-kresilient_outbox-1"  # kept: claimed before
    for value in (b"service_a second", b"service_b first", b"service_b second"):
        assert ids[value].startswith(b"outbox-") and len(ids[value]) == 39


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "relay":
    _relay_main(sys.argv[2], sys.argv[3])
