"""Issue 22, acceptance 3: every README snippet runs as written, in the order a reader meets it.

Each ```python block of README.md is written to a file in a temporary directory outside the
checkout and run there in its own interpreter, as a pip user would run ``python producer.py``;
the ``kresilient ...`` lines of the ```bash blocks run as shell commands in the same
directory. The interpreter is ``$KRESILIENT_README_PYTHON`` when set (a fresh venv made with
``pip install ".[otel,spark]" opentelemetry-exporter-otlp-proto-http``), else the project's
own; its ``bin`` comes first on ``PATH``, as in an activated venv. The ``pip install`` lines
are not run (no network in tests); instead the test checks that every extra they name exists
and every package they name is installed.

The one liberty: the README's ``127.0.0.1:9092`` (``kresilient cluster --port 9092``) becomes
the test cluster's bootstrap servers. ``kresilient cluster --port`` itself is tested in
tests/test_cli.py. The long-running consumer snippet is stopped with SIGTERM once it has
handled every message, as its comment says it can be.
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from kresilient.testing import BOOTSTRAP_ENV, KafkaCluster

README = Path(__file__).resolve().parents[1] / "README.md"
README_PORT = "127.0.0.1:9092"
PYTHON = os.environ.get("KRESILIENT_README_PYTHON", sys.executable)
ORDERS = 100  # the producer snippet's range(100); it also sends one poison message

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence, for failure messages

    @property
    def kind(self) -> str:
        if self.lang == "bash":
            return "shell"
        if "KafkaCluster(" in self.code:
            return "cluster"
        if "consumer.run()" in self.code:
            return "consumer"
        if "OTLPSpanExporter" in self.code:
            return "otel"
        if "SparkSession" in self.code:
            return "spark"
        return "python"


def _blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    return [
        Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        for m in _FENCE.finditer(text)
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != BOOTSTRAP_ENV}
    if "KRESILIENT_README_PYTHON" in os.environ:
        env.pop("PYTHONPATH", None)  # a fresh venv sees only what pip installed into it
    env["PATH"] = str(Path(PYTHON).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"  # the consumer's prints are read while it runs
    env["PYSPARK_PYTHON"] = PYTHON
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    env.update(extra)
    return env


def _shell_commands(block: Block) -> list[str]:
    """The ``kresilient`` lines of a bash block (contributor scripts and pip are not run)."""
    commands = []
    for raw in block.code.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith("kresilient ") and not line.startswith("kresilient cluster"):
            commands.append(line)
    return commands


def _pip_lines() -> list[list[str]]:
    lines = []
    for block in _blocks():
        if block.lang != "bash":
            continue
        for raw in block.code.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line.startswith("pip install "):
                lines.append(shlex.split(line)[2:])
    return lines


# --------------------------------------------------------------------------- static checks


def test_readme_starts_with_a_quickstart_and_keeps_the_two_contributor_commands() -> None:
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Quickstart", headings
    assert "bash .ci/demo" in text and "bash .ci/test" in text
    quick = text[: text.index("## Guarantees")]
    for needed in ("pip install", "kresilient cluster --port 9092", "kresilient topic create"):
        assert needed in quick, needed


def test_every_python_block_is_run_by_this_file() -> None:
    kinds = [b.kind for b in _blocks() if b.lang == "python"]
    assert kinds.count("consumer") == 1, kinds
    assert {"python", "consumer", "otel", "spark", "cluster"} <= set(kinds), kinds
    assert all(b.lang in ("python", "bash") for b in _blocks()), [b.lang for b in _blocks()]


def test_pip_lines_name_real_extras_and_installed_packages() -> None:
    extras = set(metadata.metadata("kresilient").get_all("Provides-Extra") or [])
    lines = _pip_lines()
    assert lines, "the README has no pip install line"
    for args in lines:
        for requirement in args:
            name, _, rest = requirement.partition("[")
            for extra in filter(None, rest.rstrip("]").split(",")):
                assert extra in extras, f"pip install {requirement}: no extra {extra!r}"
            if name != "kresilient":
                # Named in the README for a snippet: the snippet is run below, so the
                # package must be installed where the snippets run.
                assert metadata.version(name), name


# --------------------------------------------------------------------------- running them


def _delete_leftovers(bootstrap: str, topics: list[str], group: str) -> None:
    # A second run against the same (external) cluster starts from scratch like a first one.
    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=10).topics)
    doomed = [t for t in topics if t in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=30).values():
            future.result(timeout=60)
    deadline = time.monotonic() + 60
    while set(doomed) & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, f"topics {doomed} not deleted in 60 s"
        time.sleep(0.2)
    # Right after a cluster starts the group coordinator may not be loaded yet: retried.
    transient = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE")
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.delete_consumer_groups([group], request_timeout=30)[group].result(timeout=60)
            return
        except KafkaException as exc:
            if "GROUP_ID_NOT_FOUND" in str(exc):  # the group does not exist: nothing to delete
                return
            assert any(code in str(exc) for code in transient), exc
            assert time.monotonic() < deadline, f"group {group} not deleted in 60 s: {exc}"
            time.sleep(0.2)


def _end_offset(bootstrap: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"readme-{uuid.uuid4()}"})
    try:
        md = consumer.list_topics(topic, timeout=10).topics[topic]
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.partitions
        )
    finally:
        consumer.close()


class _OtlpReceiver(http.server.BaseHTTPRequestHandler):
    bodies: list[bytes]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.server.bodies.append(self.rfile.read(length))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(name="otlp")
def _otlp() -> Iterator[tuple[str, list[bytes]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtlpReceiver)
    server.bodies = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.bodies  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    what: str,
    timeout: float,
    codes: tuple[int, ...] = (0,),
) -> str:
    out = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode in codes, (
        f"{what} exited {out.returncode}\n--- stdout\n{out.stdout[-3000:]}"
        f"\n--- stderr\n{out.stderr[-3000:]}"
    )
    return out.stdout + out.stderr


def _run_consumer(path: Path, cwd: Path, env: dict[str, str], bootstrap: str) -> str:
    lines: list[str] = []
    with subprocess.Popen(
        [PYTHON, str(path)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 180
            while sum("charged" in line for line in lines) < ORDERS or (
                _end_offset(bootstrap, "orders.dlq") < 1
            ):
                assert proc.poll() is None, "".join(lines)[-3000:]
                assert time.monotonic() < deadline, (
                    "the consumer snippet did not handle every order and dead-letter the "
                    "poison message within 180 s:\n" + "".join(lines)[-3000:]
                )
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)  # "until SIGTERM, SIGINT or consumer.stop()"
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=10)
    text = "".join(lines)
    assert code == 0, f"consumer exited {code} on SIGTERM:\n{text[-3000:]}"
    return text


@pytest.mark.integration
def test_readme_snippets_run_as_written(
    kafka_cluster: KafkaCluster, tmp_path: Path, otlp: tuple[str, list[bytes]]
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    endpoint, otlp_bodies = otlp
    _delete_leftovers(bootstrap, ["orders", "orders.dlq"], "billing")
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    ran: list[str] = []
    for number, block in enumerate(_blocks()):
        code = block.code.replace(README_PORT, bootstrap)
        what = f"README.md:{block.line} ({block.kind})"
        if block.kind == "shell":
            for command in _shell_commands(block):
                argv = shlex.split(command.replace(README_PORT, bootstrap))
                # doctor exits 1 for an error-level finding about the cluster (a leader off its
                # preferred replica after another test's chaos, say): the command ran.
                codes = (0, 1) if argv[1] == "doctor" else (0,)
                output = _run(argv, tmp_path, env, f"{what}: {command}", 180, codes)
                ran.append(command.split()[1])
                if argv[1:3] == ["topic", "create"]:
                    assert "created orders.dlq" in output, output
                if argv[1:3] == ["dlq", "inspect"]:
                    assert "JSONDecodeError" in output, output
                if argv[1] == "doctor":
                    assert "acks=all round trip" in output, output
            continue
        if block.kind == "cluster":
            continue  # starts and kills its own nodes: test_readme_local_cluster_snippet
        path = tmp_path / f"snippet_{number}_{block.kind}.py"
        path.write_text(code, encoding="utf-8")
        if block.kind == "consumer":
            output = _run_consumer(path, tmp_path, env, bootstrap)
        else:
            output = _run([PYTHON, str(path)], tmp_path, env, what, timeout=300)
        ran.append(block.kind)
        # The structlog line keeps kresilient's per-message DEBUG events out of the output.
        assert "[debug" not in output, f"{what} printed DEBUG lines:\n{output[-3000:]}"
        if block.kind == "otel":
            deadline = time.monotonic() + 30
            while not any(b"send orders" in body for body in otlp_bodies):
                assert time.monotonic() < deadline, "no 'send orders' span reached the exporter"
                time.sleep(0.1)
        if block.kind == "spark":
            assert "written=2" in output.replace(" ", ""), output[-3000:]
    for step in ("consumer", "topic", "dlq", "lint", "doctor"):
        assert step in ran, (step, ran)
    # Every record the snippets produced is in the topic: the producer's orders and its poison
    # message, then one each from the asyncio and OTel snippets and two Spark rows. The
    # poison message is in the dead-letter topic as well, byte for byte.
    assert _end_offset(bootstrap, "orders") == ORDERS + 1 + 1 + 1 + 2
    assert _end_offset(bootstrap, "orders.dlq") == 1


@pytest.mark.integration
@pytest.mark.chaos
def test_readme_local_cluster_snippet(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks() if b.kind == "cluster"]
    path = tmp_path / "local_cluster.py"
    path.write_text(block.code, encoding="utf-8")
    output = _run([PYTHON, str(path)], tmp_path, _env(), f"README.md:{block.line}", 600)
    assert re.search(r"^\d+$", output.strip().splitlines()[-1]), output  # the new leader's id


# --------------------------------------------------------------------------- structlog line


_NOISY_PRODUCER = """
import logging
import structlog
from kresilient import DeliveryError, ResilientProducer
{configure}
producer = ResilientProducer({{"bootstrap.servers": "{bootstrap}", "message.timeout.ms": 3000}})
for n in range(3):
    producer.produce("{topic}", b"x")
try:
    producer.flush()
except DeliveryError as exc:
    print("failed", len(exc.failures))
"""


@pytest.mark.integration
@pytest.mark.parametrize("configured", [True, False], ids=["readme-line", "control-no-line"])
def test_readme_structlog_line_silences_per_message_debug_events(
    kafka_cluster: KafkaCluster, tmp_path: Path, configured: bool
) -> None:
    (line,) = {
        raw.strip()
        for raw in README.read_text(encoding="utf-8").splitlines()
        if raw.startswith("structlog.configure(")
    }
    script = tmp_path / "noisy.py"
    script.write_text(
        _NOISY_PRODUCER.format(
            configure=line if configured else "",
            bootstrap=kafka_cluster.bootstrap_servers,
            topic=f"no-such-topic-{uuid.uuid4().hex[:8]}",  # every message fails to deliver
        ),
        encoding="utf-8",
    )
    output = _run([PYTHON, str(script)], tmp_path, _env(), "producer", timeout=120)
    assert "failed 3" in output, output
    if configured:
        assert "delivery_failed" not in output, output
    else:  # the control: without the line, structlog's default prints the DEBUG events
        assert "delivery_failed" in output, output
