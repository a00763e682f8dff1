"""``kresilient dlq inspect`` / ``dlq replay`` (7g on the real cluster) and their CLI wiring."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from _producer_helpers import read_back
from confluent_kafka import Message, Producer
from test_consumer_integration import (
    FAST_RETRY,
    Item,
    Runner,
    TopicFactory,
    committed,
    config,
    produce,
    with_dlq,
)

from kresilient.cli import main as cli_main
from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import dead_letter_headers
from kresilient.deadletter_cli import main_inspect, main_replay
from kresilient.testing import KafkaCluster


def test_dlq_commands_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["dlq", "inspect", "--help"]) == 0
    assert "--bootstrap-servers" in capsys.readouterr().out
    assert cli_main(["dlq", "replay", "--help"]) == 0
    assert "--filter" in capsys.readouterr().out
    assert cli_main(["dlq"]) == 2


def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KRESILIENT_BOOTSTRAP_SERVERS", raising=False)
    assert cli_main(["dlq", "inspect", "t.dlq"]) == 2
    assert "no bootstrap servers" in capsys.readouterr().err
    args = ["dlq", "replay", "--from", "t.dlq", "-b", "127.0.0.1:9", "--filter", "colour=red"]
    assert cli_main(args) == 2
    assert "bad filter" in capsys.readouterr().err


class _Args:
    def __init__(self, **kw: Any) -> None:
        defaults = {
            "bootstrap_servers": None,
            "command_config": None,
            "property": None,
            "group": None,
            "timeout": 30.0,
            "limit": 50,
            "brief": False,
            "json": False,
            "filters": [],
            "dry_run": False,
            "keep_timestamp": False,
            "target": None,
        }
        defaults.update(kw)
        self.__dict__.update(defaults)


@pytest.mark.integration
def test_7g_dlq_inspect_and_replay_bring_records_back(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    items: list[Item] = []
    for i in range(200):
        if i % 20 == 3:
            items.append((b"k%d" % i, b"bad-json-%d" % i, [("id", b"%d" % i)], None))
        elif i % 20 == 13:
            items.append((b"k%d" % i, b"flaky-%d" % i, [("id", b"%d" % i)], None))
        else:
            items.append((b"k%d" % i, b"%d" % i, [("id", b"%d" % i)], None))
    produce(bootstrap, topic, items)
    group = f"g-{uuid.uuid4().hex[:10]}"
    handled: list[bytes] = []

    def strict(msg: Message) -> None:
        value = msg.value() or b""
        if value.startswith(b"flaky"):
            raise RuntimeError("downstream says no")
        int(value)  # bad-json-*: ValueError, dead-lettered at once
        handled.append(value)
        if len(handled) == 180:
            consumer.stop()

    consumer = ResilientConsumer(
        config(kafka_cluster, group),
        [topic],
        strict,
        retry=FAST_RETRY,
        install_signal_handlers=False,
    )
    Runner(consumer).join(120)
    assert len(read_back(bootstrap, dlq)) == 20

    assert main_inspect(_Args(topic=dlq, bootstrap_servers=bootstrap, limit=3)) == 0
    text = capsys.readouterr().out
    assert f"{dlq}: 20 records" in text
    assert "   10  poison            ValueError" in text
    assert "   10  unknown           RuntimeError" in text
    assert "kresilient.exception.message = downstream says no" in text
    assert main_inspect(_Args(topic=dlq, bootstrap_servers=bootstrap, json=True)) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1]["summary"]["records"] == 20

    # replay only the poison ones (the handler was fixed for them), then the rest
    replayed: list[Message] = []

    def fixed(msg: Message) -> None:
        replayed.append(msg)
        if len(replayed) == want:
            consumer.stop()

    want = 10
    for flt in ("category=poison", "exception~runtime"):
        args = _Args(source=dlq, target=topic, bootstrap_servers=bootstrap, filters=[flt])
        assert main_replay(args) == 0
        assert f"replayed 10 of 20 records from {dlq}" in capsys.readouterr().out
        replayed.clear()
        consumer = ResilientConsumer(
            config(kafka_cluster, group), [topic], fixed, install_signal_handlers=False
        )
        Runner(consumer).join(120)
        prefix = b"bad-json" if flt.startswith("category") else b"flaky"
        assert sorted(m.value() for m in replayed) == sorted(  # type: ignore[type-var]
            v for _, v, _, _ in items if v.startswith(prefix)
        )
        for m in replayed:  # original key and headers, no dead-letter headers
            assert m.key() == b"k" + (m.value() or b"").split(b"-")[-1]
            assert m.headers() == [("id", (m.value() or b"").split(b"-")[-1])]
    assert (
        main_replay(
            _Args(source=dlq, target=topic, bootstrap_servers=bootstrap, filters=["bogus=1"])
        )
        == 2
    )


def _dead_letters(bootstrap: str, dlq: str, source: str, values: list[bytes | None]) -> None:
    """Write one dead letter per value (``None``: a record with no dead-letter headers)."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i, value in enumerate(values):
        if value is None:
            producer.produce(dlq, value=b"stray-%d" % i, key=b"k%d" % i)
            continue
        headers = dead_letter_headers(
            source,
            0,
            i,
            None,
            "g0",
            ValueError("bad"),
            None,
            1,
            original_headers=[("id", b"%d" % i)],
        )
        producer.produce(dlq, value=value, key=b"k%d" % i, headers=headers)
    assert producer.flush(30) == 0


@pytest.mark.integration
def test_replay_with_group_and_limit_commits_only_what_it_replayed(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11 defect 3: three runs of ``--limit 3`` over 10 dead letters replay 9."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, dlq = topic_factory(), topic_factory()
    values = [b"v%d" % i for i in range(10)]
    _dead_letters(bootstrap, dlq, source, list(values))
    group = f"replay-{uuid.uuid4().hex[:10]}"
    args = _Args(source=dlq, bootstrap_servers=bootstrap, group=group, limit=3)
    for _ in range(3):
        assert main_replay(args) == 0
    capsys.readouterr()
    assert [m.value() for m in read_back(bootstrap, source)] == values[:9]
    assert committed(bootstrap, group, dlq, [0]) == {0: 9}
    assert main_replay(args) == 0  # the tenth, then nothing is left
    assert main_replay(args) == 0
    assert [m.value() for m in read_back(bootstrap, source)] == values
    assert committed(bootstrap, group, dlq, [0]) == {0: 10}


@pytest.mark.integration
def test_replay_with_group_stops_its_commit_at_a_record_without_original_topic(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record replay cannot send (no original topic, no ``--to``) holds the group there."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, dlq = topic_factory(), topic_factory()
    _dead_letters(bootstrap, dlq, source, [b"a", b"b", None, b"d"])
    group = f"replay-{uuid.uuid4().hex[:10]}"
    assert main_replay(_Args(source=dlq, bootstrap_servers=bootstrap, group=group)) == 0
    out = capsys.readouterr().out
    assert "1 without an original topic" in out and "1 held back" in out
    assert committed(bootstrap, group, dlq, [0]) == {0: 2}
    assert (
        main_replay(_Args(source=dlq, target=source, bootstrap_servers=bootstrap, group=group)) == 0
    )
    assert [m.value() for m in read_back(bootstrap, source)] == [b"a", b"b", b"stray-2", b"d"]
    assert committed(bootstrap, group, dlq, [0]) == {0: 4}
