"""Issue 17 item 4: ``kresilient dlq replay`` counts replays in ``kresilient.replay.count``
and refuses a record past ``--max-replays`` unless ``--force``, so a replay loop ends.

The integration test runs the loop for real: a consumer dead-letters every record it gets,
replayed ones included, and ``dlq replay --group`` runs again and again until it refuses.
"""

from __future__ import annotations

import io
import json
import uuid

import pytest
from _producer_helpers import read_back
from confluent_kafka import Message
from test_consumer_integration import (
    FAST_RETRY,
    Item,
    Runner,
    TopicFactory,
    committed,
    config,
    ends,
    produce,
    wait_for,
    with_dlq,
)

from kresilient.cli import main as cli_main
from kresilient.consumer import ResilientConsumer
from kresilient.deadletter import parse_dead_letter_headers
from kresilient.deadletter_cli import (
    REPLAY_COUNT,
    RefusedRecord,
    ReplayResult,
    _print_replay_summary,
    counted_headers,
    replay_count,
    replay_dead_letters,
)
from kresilient.errors import ConfigError
from kresilient.testing import KafkaCluster

# --------------------------------------------------------------------------- the header


def test_replay_count_reads_the_last_header_and_refuses_what_is_not_a_number() -> None:
    assert replay_count([]) == 0
    assert replay_count([("id", b"1")]) == 0
    assert replay_count([(REPLAY_COUNT, b"2")]) == 2
    assert replay_count([(REPLAY_COUNT, b"1"), ("x", None), (REPLAY_COUNT, b"7")]) == 7
    for bad in (b"", b"-1", b" 2", b"two", b"\xff", None, "٣".encode()):
        assert replay_count([(REPLAY_COUNT, bad)]) is None, bad


def test_counted_headers_change_the_count_and_nothing_else() -> None:
    original: list[tuple[str, bytes | None]] = [
        ("id", b"\x00\xff binary"),
        ("empty", None),
        ("id", b"second id"),
    ]
    assert counted_headers(original, 0, 3) == [*original, (REPLAY_COUNT, b"1")]
    with_count = [original[0], (REPLAY_COUNT, b"2"), original[1], original[2]]
    assert counted_headers(with_count, 2, 3) == [
        original[0],
        (REPLAY_COUNT, b"3"),
        original[1],
        original[2],
    ]
    # duplicates: the last one (the one read) is replaced in place, the first kept as is
    twice = [(REPLAY_COUNT, b"9"), ("a", b"b"), (REPLAY_COUNT, b"1")]
    assert counted_headers(twice, 1, 3) == [(REPLAY_COUNT, b"9"), ("a", b"b"), (REPLAY_COUNT, b"2")]
    # unreadable, replayed with force: at least past the limit now
    assert counted_headers([(REPLAY_COUNT, b"x")], None, 3) == [(REPLAY_COUNT, b"4")]
    assert original == [("id", b"\x00\xff binary"), ("empty", None), ("id", b"second id")]


def test_max_replays_must_be_a_whole_number() -> None:
    for bad in (-1, True, 2.5):
        with pytest.raises(ConfigError, match="max_replays"):
            replay_dead_letters("t.dlq", bootstrap_servers="127.0.0.1:9", max_replays=bad)  # type: ignore[arg-type]


def test_cli_rejects_a_negative_max_replays(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dlq", "replay", "--from", "t.dlq", "-b", "127.0.0.1:9", "--max-replays", "-1"]
    assert cli_main(argv) == 2
    assert "expected 0 or more" in capsys.readouterr().err
    assert cli_main(["dlq", "replay", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--max-replays N" in text and "--force" in text


def test_summary_lists_refused_records_with_coordinates_and_the_way_out() -> None:
    refused = tuple(
        RefusedRecord(
            partition=0,
            offset=40 + i,
            original_topic="orders",
            original_partition=2,
            original_offset=1000 + i,
            replay_count=3,
        )
        for i in range(25)
    )
    result = ReplayResult(
        source="orders.dlq",
        dry_run=False,
        read=26,
        replayed=1,
        by_target={"orders": 1},
        filtered_out=0,
        limited=0,
        no_topic=0,
        held_back=0,
        failed=0,
        failures={},
        read_errors={},
        refused=25,
        refused_records=refused,
    )
    assert not result.ok
    out = io.StringIO()
    _print_replay_summary(out, result)
    text = out.getvalue()
    assert "25  REFUSED: replayed 3 times already (--max-replays 3; --force" in text
    assert "refused orders.dlq[0]@40 (from orders[2]@1000), replayed 3 times" in text
    assert "refused orders.dlq[0]@59 (from orders[2]@1019)" in text
    assert "@60 " not in text and "... and 5 more refused" in text
    summary = result.summary()
    assert summary["refused"] == 25 and len(summary["refused_records"]) == 25
    assert summary["refused_records"][0] == {
        "partition": 0,
        "offset": 40,
        "original_topic": "orders",
        "original_partition": 2,
        "original_offset": 1000,
        "replay_count": 3,
    }


# --------------------------------------------------------------------------- the loop

N = 5


def _replay(
    capsys: pytest.CaptureFixture[str], dlq: str, bootstrap: str, group: str, *extra: str
) -> tuple[int, dict[str, object]]:
    code = cli_main(
        ["dlq", "replay", "--from", dlq, "-b", bootstrap, "--group", group, "--json", *extra]
    )
    out, _ = capsys.readouterr()
    # The consumer running beside it logs to stdout too (structlog's default); the
    # command's own output is the one JSON line.
    (line,) = [x for x in out.splitlines() if x.startswith('{"summary"')]
    summary: dict[str, object] = json.loads(line)["summary"]
    return code, summary


@pytest.mark.integration
def test_replay_loop_ends_at_max_replays_and_force_goes_once_more(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A consumer dead-letters every record, replayed or not; ``dlq replay --group`` runs
    until it refuses. Each record goes round exactly 3 times, then every run refuses it
    (exit 1, coordinates listed, the group held before it) and nothing more is written;
    ``--force`` sends it once more (the negative control: the refusal was the limit)."""
    bootstrap = kafka_cluster.bootstrap_servers
    topic, dlq = with_dlq(topic_factory)
    items: list[Item] = [
        (b"k%d" % i, b"v%d" % i, [("id", b"%d" % i), ("bin", b"\x00\xff%d" % i), ("n", None)], None)
        for i in range(N)
    ]
    produce(bootstrap, topic, items)

    def always_poison(msg: Message) -> None:
        raise ValueError(f"still cannot parse {msg.value()!r}")

    consumer = ResilientConsumer(
        config(kafka_cluster),
        [topic],
        always_poison,
        retry=FAST_RETRY,
        install_signal_handlers=False,
    )
    runner = Runner(consumer)
    try:
        wait_for(lambda: ends(bootstrap, dlq) == {0: N}, 60, "the first dead letters")
        group = f"replayer-{uuid.uuid4().hex[:10]}"
        runs: list[tuple[int, dict[str, object]]] = []
        for run in range(1, 10):  # bounded: a loop that never ends fails here, not hangs
            code, summary = _replay(capsys, dlq, bootstrap, group)
            runs.append((code, summary))
            if summary["refused"]:
                break
            wait_for(
                lambda run=run: ends(bootstrap, dlq) == {0: N * (run + 1)},  # type: ignore[misc]
                60,
                f"the dead letters of replay {run}",
            )
        assert [(c, s["read"], s["replayed"], s["refused"]) for c, s in runs] == [
            (0, N, N, 0),
            (0, N, N, 0),
            (0, N, N, 0),
            (1, N, 0, N),
        ]
        refused = runs[-1][1]["refused_records"]
        assert isinstance(refused, list)
        assert [(r["offset"], r["original_offset"], r["replay_count"]) for r in refused] == [
            (3 * N + i, 3 * N + i, 3) for i in range(N)
        ]
        assert committed(bootstrap, group, dlq, [0]) == {0: 3 * N}

        # The loop has ended: another run refuses the same records and writes nothing.
        code, again = _replay(capsys, dlq, bootstrap, group)
        assert (code, again["read"], again["replayed"], again["refused"]) == (1, N, 0, N)
        assert ends(bootstrap, topic) == {0: 4 * N}
        assert ends(bootstrap, dlq) == {0: 4 * N}

        # The text summary says what was refused and where.
        code = cli_main(["dlq", "replay", "--from", dlq, "-b", bootstrap, "--group", group])
        text = capsys.readouterr().out
        assert code == 1
        assert f"{N}  REFUSED: replayed 3 times already (--max-replays 3;" in text
        assert f"refused {dlq}[0]@{3 * N} (from {topic}[0]@{3 * N}), replayed 3 times" in text

        # Negative control: --force replays them once more, counting on; then refused again.
        code, forced = _replay(capsys, dlq, bootstrap, group, "--force")
        assert (code, forced["replayed"], forced["refused"]) == (0, N, 0)
        assert committed(bootstrap, group, dlq, [0]) == {0: 4 * N}
        wait_for(lambda: ends(bootstrap, dlq) == {0: 5 * N}, 60, "the forced replay's letters")
        code, after = _replay(capsys, dlq, bootstrap, group)
        assert (code, after["replayed"], after["refused"]) == (1, 0, N)
        refused = after["refused_records"]
        assert isinstance(refused, list) and {r["replay_count"] for r in refused} == {4}
    finally:
        runner.stop()
    assert runner.error is None

    # Every record in the source topic: the original key, value and headers byte for byte,
    # plus the count of the replay that wrote it (none on the first write).
    seen = read_back(bootstrap, topic)
    assert len(seen) == 5 * N
    for offset, msg in enumerate(seen):
        round_, i = divmod(offset, N)
        key, value, headers, _ = items[i]
        assert (msg.key(), msg.value()) == (key, value)
        counted = [(REPLAY_COUNT, b"%d" % round_)] if round_ else []
        assert msg.headers() == [*(headers or []), *counted]
    letters = read_back(bootstrap, dlq)
    assert [parse_dead_letter_headers(m.headers()).original_offset for m in letters] == list(
        range(5 * N)
    )
    assert [
        replay_count(parse_dead_letter_headers(m.headers()).original_headers) for m in letters
    ] == [offset // N for offset in range(5 * N)]


@pytest.mark.integration
def test_max_replays_zero_refuses_everything_and_dry_run_counts_refusals(
    kafka_cluster: KafkaCluster, topic_factory: TopicFactory
) -> None:
    """Python API: the same parameters; a dry run reports refusals without sending."""
    bootstrap = kafka_cluster.bootstrap_servers
    source, dlq = topic_factory(), topic_factory()
    produce(
        bootstrap,
        dlq,
        [
            (
                b"k",
                b"v",
                [
                    (REPLAY_COUNT, b"1"),
                    ("kresilient.original.topic", source.encode()),
                    ("kresilient.original.partition", b"0"),
                    ("kresilient.original.offset", b"7"),
                ],
                None,
            )
        ],
    )
    dry = replay_dead_letters(dlq, bootstrap_servers=bootstrap, max_replays=1, dry_run=True)
    assert (dry.read, dry.replayed, dry.refused, dry.ok) == (1, 0, 1, False)
    assert dry.refused_records[0].original_offset == 7
    assert dry.refused_records[0].replay_count == 1
    allowed = replay_dead_letters(dlq, bootstrap_servers=bootstrap, max_replays=2)
    assert (allowed.replayed, allowed.refused, allowed.ok) == (1, 0, True)
    none = replay_dead_letters(dlq, bootstrap_servers=bootstrap, max_replays=0)
    assert (none.replayed, none.refused) == (0, 1)
    forced = replay_dead_letters(dlq, bootstrap_servers=bootstrap, max_replays=0, force=True)
    assert (forced.replayed, forced.refused, forced.force) == (1, 0, True)
    assert [m.headers() for m in read_back(bootstrap, source)] == [
        [(REPLAY_COUNT, b"2")],
        [(REPLAY_COUNT, b"2")],
    ]
