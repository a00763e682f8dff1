"""A spooled ResilientProducer on the real cluster: headers, handles, callbacks, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _producer_helpers import header_dict, read_back

from kresilient.errors import MessageTooLargeError
from kresilient.producer import FlushResult, ResilientProducer, Spool

pytestmark = pytest.mark.integration


def test_every_message_carries_a_unique_id_and_first_sends_are_unmarked(
    kafka_cluster: Any, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(partitions=3)
    spool = Spool(tmp_path / "s.db")
    called: list[Any] = []
    with ResilientProducer(
        {"bootstrap.servers": kafka_cluster.bootstrap_servers}, spool=spool
    ) as p:
        handles = [
            p.produce(topic, b"%05d" % i, key=b"k%d" % (i % 7), headers=[("app", b"x%d" % i)])
            for i in range(2000)
        ]
        last = p.produce(topic, b"last", on_delivery=lambda err, msg: called.append(err))
        result = p.flush(60)
        assert result == FlushResult(delivered=2001, spooled=0)
        assert p.spool is spool
        assert handles[0].result().topic == topic and last.result().offset >= 0
    assert called == [None]
    assert Spool(tmp_path / "s.db").stored() == (0, 0)  # acknowledged: removed
    records = read_back(kafka_cluster.bootstrap_servers, topic)
    assert len(records) == 2001
    ids = set()
    for msg in records:
        h = header_dict(msg)
        ids.add(h["kresilient.message.id"])
        assert "kresilient.possible.duplicate" not in h
        if msg.value() != b"last":
            assert h["app"] == b"x%d" % int(msg.value())
    assert len(ids) == 2001


def test_oversized_value_is_refused_before_it_is_stored(
    kafka_cluster: Any, topic: str, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "s.db")
    config = {"bootstrap.servers": kafka_cluster.bootstrap_servers, "message.max.bytes": 10_000}
    with ResilientProducer(config, spool=spool) as p, pytest.raises(MessageTooLargeError):
        p.produce(topic, b"x" * 20_000)
    assert Spool(tmp_path / "s.db").stored() == (0, 0)


def test_the_unspooled_path_is_the_class_method(tmp_path: Path) -> None:
    """No spool: produce() is ResilientProducer.produce itself (no per-message indirection)."""
    config = {"bootstrap.servers": "127.0.0.1:1"}
    plain = ResilientProducer(config)
    assert "produce" not in vars(plain) and plain.spool is None
    spooled = ResilientProducer(config, spool=Spool(tmp_path / "s.db"))
    assert "produce" in vars(spooled)
    plain.close(0)
    spooled.close(0)
