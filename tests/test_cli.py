"""The ``kresilient`` command line: ``cluster``, ``demo``, ``topic create`` and the top-level
parser (issue 22). ``lint``, ``audit`` and ``dlq`` have their own test files.

Conventions checked: results on stdout, progress and errors on stderr; help in whole
sentences; SIGTERM cleans up like Ctrl-C; an unreachable cluster is one line naming the host
and the reason, exit 2, no raw librdkafka line.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

import kresilient.admin
from kresilient.admin import (
    DEAD_LETTER_MIN_MAX_BYTES,
    TopicResult,
    create_topic,
    dead_letter_topic_config,
    describe_unreachable,
    parse_config_items,
)
from kresilient.cli import build_parser, main
from kresilient.errors import ConfigError, KafkaClientError
from kresilient.testing import BOOTSTRAP_ENV, KafkaCluster

KRESILIENT = [sys.executable, "-m", "kresilient.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != BOOTSTRAP_ENV}
    env.update(extra)
    return env


def _cli(*argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KRESILIENT, *argv],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=timeout,
        check=False,
    )


# --------------------------------------------------------------------------- help


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    yield "kresilient", top
    todo = [("kresilient", top)]
    while todo:
        name, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    full = f"{name} {sub_name}"
                    todo.append((full, sub))
                    yield full, sub


_MINE = (
    "kresilient",
    "kresilient cluster",
    "kresilient demo",
    "kresilient topic",
    "kresilient topic create",
)


def _sentence(text: str | None) -> bool:
    return bool(text) and "``" not in text and text.rstrip().endswith((".", ")"))  # type: ignore[union-attr]


def test_help_of_cluster_demo_topic_and_top_level_is_whole_sentences() -> None:
    checked = 0
    for name, parser in _parsers():
        if name not in _MINE:
            continue
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    if choice.dest not in ("cluster", "demo", "topic", "create"):
                        continue  # lint, audit, dlq, ...: tested with their own commands
                    assert _sentence(choice.help), f"{name} {choice.dest}: {choice.help!r}"
                    checked += 1
                continue
            assert _sentence(action.help), f"{name} {action.option_strings}: {action.help!r}"
            checked += 1
    assert checked >= 15, checked  # cluster, demo, topic and topic create options were seen


def test_every_help_screen_renders() -> None:
    for argv in (["--help"], ["cluster", "--help"], ["demo", "--help"], ["topic", "--help"]):
        out = _cli(*argv)
        assert out.returncode == 0, out.stderr
        assert "``" not in out.stdout
    create = _cli("topic", "create", "--help")
    for option in ("--partitions", "--replication-factor", "--dlq", "--config", "--timeout"):
        assert option in create.stdout
    assert "Exit codes" in create.stdout


def test_topic_without_an_action_is_a_usage_error() -> None:
    out = _cli("topic")
    assert out.returncode == 2
    assert out.stdout == "" and "create" in out.stderr


# --------------------------------------------------------------------------- topic create


def _describe(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's settings. A broker learns of a new topic from the metadata log a moment
    after the controller created it: one that has not yet answers UNKNOWN_TOPIC_OR_PART, so
    that answer is asked again until a 60 s deadline."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + 60
    while True:
        try:
            entries = admin.describe_configs([resource])[resource].result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
            continue
        return {k: v.value for k, v in entries.items()}


def _replicas(bootstrap: str, topic: str) -> list[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return [len(p.replicas) for p in md.partitions.values()]


@pytest.fixture(name="bootstrap")
def _bootstrap(kafka_cluster: KafkaCluster) -> str:
    return kafka_cluster.bootstrap_servers


def _name() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


@pytest.mark.integration
def test_topic_create_with_dlq_gives_the_dead_letter_topic_room_for_any_record(
    bootstrap: str,
) -> None:
    name = _name()
    out = _cli(
        "topic",
        "create",
        name,
        "--partitions",
        "3",
        "--replication-factor",
        "3",
        "--dlq",
        "--config",
        "max.message.bytes=2000000",
        "--bootstrap-servers",
        bootstrap,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"created {name}", f"created {name}.dlq"]
    source, dlq = _describe(bootstrap, name), _describe(bootstrap, f"{name}.dlq")
    assert source["min.insync.replicas"] == "2"
    assert source["max.message.bytes"] == "2000000"
    assert dlq["min.insync.replicas"] == source["min.insync.replicas"]
    assert int(dlq["max.message.bytes"]) > int(source["max.message.bytes"])
    assert int(dlq["max.message.bytes"]) > DEAD_LETTER_MIN_MAX_BYTES
    assert dlq["cleanup.policy"] == "delete"
    assert _replicas(bootstrap, f"{name}.dlq") == [3, 3, 3]

    # A record as large as the source allows, plus dead-letter headers, is acknowledged by
    # the DLQ: byte for byte fits.
    outcome: list[object] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 4_000_000})
    producer.produce(
        f"{name}.dlq",
        b"v" * 1_999_000,
        headers=[("kresilient.error.type", b"x" * 4000)],
        on_delivery=lambda err, _msg: outcome.append(err),
    )
    assert producer.flush(60) == 0
    assert outcome == [None]


@pytest.mark.integration
def test_topic_create_existing_topic_fails_unless_if_not_exists(bootstrap: str) -> None:
    name = _name()
    assert _cli("topic", "create", name, "-b", bootstrap).returncode == 0
    again = _cli("topic", "create", name, "-b", bootstrap)
    assert again.returncode == 1
    assert again.stdout == ""
    assert f"topic '{name}' already exists" in again.stderr
    assert "--if-not-exists" in again.stderr
    accepted = _cli("topic", "create", name, "--if-not-exists", "-b", bootstrap)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.startswith(f"exists (unchanged) {name}: 1 partition(s)")


@pytest.mark.integration
def test_topic_create_bootstrap_from_the_environment(bootstrap: str) -> None:
    name = _name()
    out = _cli("topic", "create", name, **{BOOTSTRAP_ENV: bootstrap})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"created {name}:")


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--replication-factor", "9"], "replication factor 9 needs 9 brokers"),
        (["--config", "retention.ms"], "--config expects key=value"),
        (["--config", "min.insync.replicas=3", "--replication-factor", "2"], "min.insync"),
        (["--partitions", "0"], "partitions must be at least 1"),
    ],
)
def test_topic_create_bad_input_is_one_line_and_exit_2(
    bootstrap: str, argv: list[str], needle: str
) -> None:
    name = _name()
    out = _cli("topic", "create", name, *argv, "-b", bootstrap)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert needle in out.stderr
    assert name not in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics


def test_topic_create_without_bootstrap_servers_is_a_usage_error() -> None:
    out = _cli("topic", "create", "orders")
    assert out.returncode == 2
    assert "--bootstrap-servers" in out.stderr and BOOTSTRAP_ENV in out.stderr


@pytest.mark.parametrize(
    ("servers", "reason"),
    [
        ("127.0.0.1:1", "connection refused"),
        ("no-such-host.invalid:9092", "DNS cannot resolve the name"),
    ],
    ids=["closed-port", "unresolvable-name"],
)
def test_topic_create_unreachable_cluster_is_one_line_naming_host_and_reason(
    servers: str, reason: str
) -> None:
    out = _cli("topic", "create", "orders", "-b", servers, "--timeout", "3", timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert servers in lines[0] and reason in lines[0], lines[0]
    assert "%3|" not in out.stderr and "KafkaError{" not in out.stderr


def test_create_topic_unreachable_raises_kafka_client_error_naming_each_host() -> None:
    with pytest.raises(KafkaClientError) as info:
        create_topic("127.0.0.1:1,127.0.0.1:2", "orders", timeout=2)
    assert "127.0.0.1:1 (connection refused" in info.value.message
    assert "127.0.0.1:2 (connection refused" in info.value.message


def test_create_topic_refuses_bad_input_before_connecting() -> None:
    # Port 1 is closed: reaching the network would be a KafkaClientError, not a ConfigError.
    for kwargs in (
        {"name": "bad name"},
        {"name": "x" * 250},
        {"name": "ok", "replication_factor": 0},
        {"name": "ok", "config": {"min.insync.replicas": 4}},
    ):
        with pytest.raises(ConfigError):
            create_topic("127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


class _LaggingAdmin:
    """A fake of ``kresilient.admin._Admin`` for a cluster where ``topic`` exists on the
    controller, but the broker answering the first (cluster-wide) metadata request has not yet
    learnt of it; asked about the topic by name afterwards, a broker knows it. A real cluster
    shows this only now and then, right after the topic was created (the race CI met)."""

    def __init__(self, bootstrap_servers: str, client_config: object) -> None:
        self.servers = bootstrap_servers
        self.created: list[str] = []
        self.described: list[str] = []  # metadata asked for by topic name
        self.client = self
        _LaggingAdmin.last = self

    last: _LaggingAdmin

    def metadata(self, deadline: float, topic: str | None = None) -> object:
        brokers = {1: object(), 2: object(), 3: object()}
        if topic is None:
            return SimpleNamespace(brokers=brokers, topics={})
        self.described.append(topic)
        partitions = {
            p: SimpleNamespace(id=p, leader=1, replicas=[1, 2, 3], isrs=[1, 2, 3]) for p in range(6)
        }
        return SimpleNamespace(
            brokers=brokers, topics={topic: SimpleNamespace(error=None, partitions=partitions)}
        )

    def create_topics(self, new: list[Any], **_: object) -> dict[str, Future[None]]:
        futures: dict[str, Future[None]] = {}
        for topic in new:
            self.created.append(topic.topic)
            future: Future[None] = Future()
            future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            futures[topic.topic] = future
        return futures


def test_create_topic_if_not_exists_accepts_a_topic_the_first_metadata_answer_lacked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kresilient.admin, "_Admin", _LaggingAdmin)
    [result] = create_topic("fake:9092", "orders", partitions=3, if_not_exists=True, timeout=5)
    assert _LaggingAdmin.last.created == ["orders"]  # the creation was tried, then refused
    # what is there is reported, not what was asked for
    assert result == TopicResult(name="orders", partitions=6, replication_factor=3, existed=True)


def test_create_topic_without_if_not_exists_names_the_flag_when_the_metadata_lagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kresilient.admin, "_Admin", _LaggingAdmin)
    with pytest.raises(KafkaClientError) as info:
        create_topic("fake:9092", "orders", timeout=5)
    assert info.value.code == KafkaError.TOPIC_ALREADY_EXISTS
    assert "topic 'orders' already exists (pass --if-not-exists" in info.value.message
    assert _LaggingAdmin.last.described == []  # refused at once, without waiting to describe it


class _DroppingAdmin(_LaggingAdmin):
    """The topic does not exist; the first CreateTopics is lost with its broker handle
    (_DESTROY_BROKER) after it reached the controller, so the resend finds the topic."""

    def metadata(self, deadline: float, topic: str | None = None) -> object:
        answer = super().metadata(deadline, topic)
        return SimpleNamespace(brokers=answer.brokers, topics={})  # type: ignore[attr-defined]

    def create_topics(self, new: list[Any], **_: object) -> dict[str, Future[None]]:
        self.created.append(new[0].topic)
        code = (
            KafkaError._DESTROY_BROKER
            if len(self.created) == 1
            else KafkaError.TOPIC_ALREADY_EXISTS
        )
        future: Future[None] = Future()
        future.set_exception(KafkaException(KafkaError(code)))
        return {new[0].topic: future}


def test_create_topic_sent_again_after_a_destroyed_broker_handle_counts_as_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kresilient.admin, "_Admin", _DroppingAdmin)
    monkeypatch.setattr(kresilient.admin, "_wait_for_leaders", lambda *args: None)
    [result] = create_topic("fake:9092", "orders", partitions=3, timeout=5)
    assert _DroppingAdmin.last.created == ["orders", "orders"]
    assert result.name == "orders" and not result.existed and result.partitions == 3


def test_dead_letter_topic_config_follows_the_source() -> None:
    cfg = dead_letter_topic_config(
        {"max.message.bytes": "52428800", "min.insync.replicas": "3", "retention.ms": "5"},
        replication_factor=4,
    )
    assert int(cfg["max.message.bytes"]) > 52428800
    assert cfg["min.insync.replicas"] == "3"
    assert cfg["retention.ms"] == "5"
    assert cfg["cleanup.policy"] == "delete"
    small = dead_letter_topic_config({}, replication_factor=1)
    assert small["min.insync.replicas"] == "1"
    assert int(small["max.message.bytes"]) > DEAD_LETTER_MIN_MAX_BYTES


def test_describe_unreachable_names_each_host_once() -> None:
    line = describe_unreachable(
        "a:1,b:2,c:3,ssl://d:4",
        [
            "a:1/bootstrap: Connect to ipv4#10.0.0.1:1 failed: Connection refused (after 0ms)",
            "b:2/bootstrap: Failed to resolve 'b:2': Name or service not known (after 1ms)",
            "ssl://d:4/bootstrap: SSL handshake failed: error:0A000086 (after 5ms)",
            "1/1 brokers are down",
        ],
    )
    assert "a:1 (connection refused" in line
    assert "b:2 (DNS cannot resolve the name)" in line
    assert "c:3 (no answer)" in line
    assert "d:4 (TLS handshake failed" in line
    assert "\n" not in line


def test_parse_config_items() -> None:
    assert parse_config_items(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="key=value"):
        parse_config_items(["novalue"])


def test_main_restores_the_callers_structlog_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = structlog.get_config()
    assert main(["topic", "create", "x", "-b", "127.0.0.1:1", "--timeout", "1"]) == 2
    assert structlog.get_config() == before
    captured = capsys.readouterr()
    assert captured.out == "" and "127.0.0.1:1" in captured.err


# --------------------------------------------------------------------------- cluster


class _Streams:
    """Reads a process's stdout and stderr lines as they come, keeping their arrival order."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.events: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("out", proc.stdout), ("err", proc.stderr))
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._lock:
                self.events.append((name, line))

    def wait_for(
        self,
        check: Callable[[list[tuple[str, str]]], bool],
        timeout: float,
        proc: subprocess.Popen[str],
    ) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if check(list(self.events)):
                    return
            assert proc.poll() is None, f"exited {proc.returncode}:\n{self.text()}"
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.1)

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=30)

    def text(self) -> str:
        return "".join(f"[{name}] {line}" for name, line in self.events)


def _data_dirs(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("kresilient-kafka-*"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_cluster_until_signal(
    tmp_path: Path, *extra: str, ready: bool = True, env: dict[str, str] | None = None
) -> tuple[_Streams, int, list[int]]:
    """Start ``kresilient cluster``, SIGTERM it (after ready, or while starting), return
    the streams, the exit code and the broker pids it reported."""
    data_root = tmp_path / "tmp"
    data_root.mkdir()
    with subprocess.Popen(
        [*KRESILIENT, "cluster", "--nodes", "1", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**_env(TMPDIR=str(data_root)), **(env or {})},
    ) as proc:
        streams = _Streams(proc)
        try:
            if ready:
                streams.wait_for(lambda ev: any(n == "out" for n, _ in ev), 240, proc)
            else:
                streams.wait_for(lambda ev: bool(_data_dirs(data_root)), 120, proc)
            # The negative control: the data directory really exists before the signal.
            assert _data_dirs(data_root), streams.text()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            streams.join()
    pids = [int(p) for p in re.findall(r"\d+: (\d+)", streams.text())]
    assert not _data_dirs(data_root), f"data left behind: {_data_dirs(data_root)}"
    return streams, code, pids


@pytest.mark.integration
def test_cluster_reports_progress_first_then_bootstrap_on_stdout_and_sigterm_cleans_up(
    tmp_path: Path,
) -> None:
    streams, code, pids = _run_cluster_until_signal(tmp_path)
    assert code == 0, streams.text()
    first_name, first_line = streams.events[0]
    # Progress comes on stderr before the cluster is ready, not silence until then.
    assert first_name == "err" and first_line.startswith("Starting 1 Kafka node"), streams.text()
    out = [line for name, line in streams.events if name == "out"]
    assert len(out) == 1 and re.fullmatch(r"bootstrap\.servers=127\.0\.0\.1:\d+\n", out[0]), out
    assert pids, streams.text()
    deadline = time.monotonic() + 60
    while any(_pid_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"broker processes {pids} outlived the CLI"
        time.sleep(0.2)


@pytest.mark.integration
def test_cluster_sigterm_while_starting_still_removes_the_data(tmp_path: Path) -> None:
    streams, code, _ = _run_cluster_until_signal(tmp_path, ready=False)
    assert code == 0, streams.text()
    assert not any(name == "out" for name, _ in streams.events), streams.text()
    assert "Stopping the cluster" in streams.text()


def test_cluster_rejects_bad_numbers() -> None:
    assert _cli("cluster", "--nodes", "0").returncode == 2
    bad_port = _cli("cluster", "--port", "70000")
    assert bad_port.returncode == 2 and "--port 70000" in bad_port.stderr
    assert bad_port.stdout == ""


def _free_port_run(count: int) -> int:
    """A port P with P..P+count-1 free right now (the CLI reserves them itself)."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no run of free ports found")


@pytest.mark.integration
def test_cluster_port_gives_fixed_client_ports(tmp_path: Path) -> None:
    port = _free_port_run(1)
    streams, code, _ = _run_cluster_until_signal(tmp_path, "--port", str(port))
    assert code == 0, streams.text()
    out = [line for name, line in streams.events if name == "out"]
    assert out == [f"bootstrap.servers=127.0.0.1:{port}\n"], streams.text()


@pytest.mark.integration
def test_cluster_starts_a_cluster_even_with_the_bootstrap_variable_set(
    tmp_path: Path, kafka_cluster: KafkaCluster
) -> None:
    """Issue 36: `kresilient cluster` built KafkaCluster(nodes=, first_port=), which wraps the
    cluster named by $KRESILIENT_BOOTSTRAP_SERVERS when it is set (as in this test suite):
    it printed that cluster's address instead of starting one, and warned that --nodes and
    --port were ignored. The command exists to start a cluster: it always does."""
    port = _free_port_run(1)
    streams, code, pids = _run_cluster_until_signal(
        tmp_path, "--port", str(port), env={BOOTSTRAP_ENV: kafka_cluster.bootstrap_servers}
    )
    assert code == 0, streams.text()
    out = [line for name, line in streams.events if name == "out"]
    # Its own node on the asked port (the helper also saw its data directory before SIGTERM),
    # not the running cluster the variable names.
    assert out == [f"bootstrap.servers=127.0.0.1:{port}\n"], streams.text()
    assert kafka_cluster.bootstrap_servers not in streams.text()
    assert "ExternalClusterWarning" not in streams.text() and "ignores" not in streams.text()
    assert len(pids) == 1, streams.text()


def test_cluster_port_in_use_fails_naming_the_port(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = int(taken.getsockname()[1])
        out = _cli("cluster", "--nodes", "1", "--port", str(port), TMPDIR=str(tmp_path))
    assert out.returncode != 0
    assert out.stdout == ""
    assert str(port) in out.stderr
    assert not _data_dirs(tmp_path), "a failed start left its data directory behind"


# --------------------------------------------------------------------------- demo


def test_demo_rejects_an_unknown_fault_and_bad_counts() -> None:
    bogus = _cli("demo", "--fault", "meteor")
    assert bogus.returncode == 2 and "kill" in bogus.stderr and "ack-loss" in bogus.stderr
    assert _cli("demo", "--messages", "0").returncode == 2


# --------------------------------------------------------------------------- example


@pytest.mark.integration
def test_create_topics_example_is_idempotent(bootstrap: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "create_topics.py"
    prefix = f"{_name()}-"
    argv = [sys.executable, str(example), "--bootstrap-servers", bootstrap, "--prefix", prefix]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        f"created {prefix}orders (3 partitions)",
        f"created {prefix}orders.dlq (3 partitions)",
        f"created {prefix}payments (3 partitions)",
        f"created {prefix}payments.dlq (3 partitions)",
    ]
    payments_dlq = _describe(bootstrap, f"{prefix}payments.dlq")
    assert int(payments_dlq["max.message.bytes"]) > 2 * 1024 * 1024
    second = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert [line.split()[0] for line in second.stdout.splitlines()] == ["exists"] * 4


@pytest.mark.integration
def test_dlq_replay_example_replays_only_the_fixed_cause_once(bootstrap: str) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "dlq_replay.py"
    out = subprocess.run(
        [sys.executable, str(example), "--bootstrap-servers", bootstrap],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "1 x poison json.decoder.JSONDecodeError" in out.stdout
    assert "1 x unknown ConnectionError" in out.stdout
    assert '"replayed": 1' in out.stdout and '"filtered_out": 1' in out.stdout
    assert "second replay: read 0, replayed 0" in out.stdout
    assert out.stdout.rstrip().endswith("handled [0, 2, 4, 3]"), out.stdout[-2000:]
