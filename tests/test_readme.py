"""Issue 22, acceptance 3: every README snippet runs as written, in the order a reader meets it.

The README (the PyPI page) is continued by the docs site's home page, docs/index.md (asyncio,
OpenTelemetry, Spark, lint, doctor, the local cluster from Python): its snippets run after the
README's, against the same cluster and topic. Each ```python block is written to a file in a
temporary directory outside the checkout and run there in its own interpreter, as a pip user
would run ``python producer.py``; the ``kresilient ...`` lines of the ```bash blocks run as
shell commands in the same directory. The interpreter is ``$KRESILIENT_README_PYTHON`` when set
(a fresh venv made with ``pip install ".[otel,spark]"``), else the project's own; its ``bin``
comes first on ``PATH``, as in an activated venv.
The ``pip install`` lines are not run (no network in tests); instead the test checks that every
extra they name exists and every package they name is installed.

The one liberty: the README's ``127.0.0.1:9092`` (``kresilient cluster --port 9092``) becomes
the test cluster's bootstrap servers. ``kresilient cluster --port`` itself is tested in
tests/test_cli.py. The long-running consumer snippet is stopped with SIGTERM once it has
handled every message, as its comment says it can be.

Issue 36: the snippets log to stderr, so stdout holds only what they print themselves
(acceptance 3: the README's producer and consumer print at most 2 lines on stderr at the
default level); the README's ```text block of a failed delivery is what the code prints;
every README link is absolute (the wheel has no docs/ or examples/), and its two contributor
commands are kept.
"""

from __future__ import annotations

import ast
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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INDEX = ROOT / "docs" / "index.md"
SOURCES = (README, INDEX)  # run in this order: the index page continues the README
README_PORT = "127.0.0.1:9092"
PYTHON = os.environ.get("KRESILIENT_README_PYTHON", sys.executable)
ORDERS = 100  # the producer snippet's range(100); it also sends one poison message

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence, for failure messages
    source: Path = README

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        if self.lang == "bash":
            return "shell"
        if self.lang == "text":
            return "output"  # what a snippet prints: checked by the test that makes it print
        if "KafkaCluster(" in self.code:
            return "cluster"
        if "consumer.run()" in self.code:
            return "consumer"
        if "OTLPSpanExporter" in self.code:
            return "otel"
        if "SparkSession" in self.code:
            return "spark"
        return "python"


def _blocks(sources: tuple[Path, ...] = SOURCES) -> list[Block]:
    blocks = []
    for source in sources:
        text = source.read_text(encoding="utf-8")
        blocks.extend(
            Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1, source)
            for m in _FENCE.finditer(text)
        )
    return blocks


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


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_readme_is_a_pypi_page_install_cluster_produce_consume_failure_links() -> None:
    text = README.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == [
        "Install",
        "A local cluster",
        "Produce",
        "Consume",
        "What happens on failure",
        "Learn more",
        "Working on kresilient",
    ], headings
    assert len(text.splitlines()) <= 130, "the README is the PyPI page: about 120 lines at most"
    # Contributor commands are in CONTRIBUTING.md except the two that set up a fresh machine.
    working = text[text.index("## Working on kresilient") :]
    commands = [line.split("#")[0].strip() for line in working.splitlines() if "bash .ci/" in line]
    assert commands == ["bash .ci/demo", "bash .ci/test"], commands
    assert "CONTRIBUTING.md" in working
    before = text[: text.index("## Working on kresilient")]
    assert ".ci/" not in before, "contributor scripts belong to CONTRIBUTING.md"
    assert "| Guarantee |" not in text, "the guarantees table is docs/guarantees.md"
    start = text[: text.index("## Produce")]
    for needed in ("pip install", "kresilient cluster --port 9092", "kresilient topic create"):
        assert needed in start, needed


def test_every_readme_link_is_absolute() -> None:
    # PyPI renders the README from the wheel's metadata, which has no docs/, examples/ or .ci/:
    # a relative link there is a 404. (tests/test_docs_site.py checks where each one lands.)
    links = _LINK.findall(README.read_text(encoding="utf-8"))
    assert links
    relative = [link for link in links if not link.startswith("https://")]
    assert not relative, relative


def test_every_python_block_is_run_by_this_file() -> None:
    readme = [b.kind for b in _blocks((README,)) if b.lang == "python"]
    assert readme == ["python", "consumer"], readme  # the producer, then the consumer
    kinds = [b.kind for b in _blocks() if b.lang == "python"]
    assert kinds.count("consumer") == 1, kinds
    assert {"python", "consumer", "otel", "spark", "cluster"} <= set(kinds), kinds
    langs = [b.lang for b in _blocks()]
    assert set(langs) <= {"python", "bash", "text"}, langs
    assert [b.kind for b in _blocks()].count("output") == 1, "one ```text block: checked below"


def test_every_client_snippet_sends_its_logs_to_stderr() -> None:
    # kresilient.logging.configure() writes to stderr unless given a stream: none is given.
    setup = _logging_setup()
    assert setup.endswith("kresilient.logging.configure()"), setup


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


def _run_split(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    what: str,
    timeout: float,
    codes: tuple[int, ...] = (0,),
) -> tuple[str, str]:
    out = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert out.returncode in codes, (
        f"{what} exited {out.returncode}\n--- stdout\n{out.stdout[-3000:]}"
        f"\n--- stderr\n{out.stderr[-3000:]}"
    )
    return out.stdout, out.stderr


def _run(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    what: str,
    timeout: float,
    codes: tuple[int, ...] = (0,),
) -> str:
    stdout, stderr = _run_split(argv, cwd, env, what, timeout, codes)
    return stdout + stderr


def _run_consumer(
    path: Path, cwd: Path, env: dict[str, str], bootstrap: str, dlq: str = "orders.dlq"
) -> tuple[str, str]:
    lines: list[str] = []
    errors: list[str] = []
    with subprocess.Popen(
        [PYTHON, str(path)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        readers = [
            threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True),
            threading.Thread(target=lambda: errors.extend(proc.stderr or ()), daemon=True),
        ]
        for reader in readers:
            reader.start()

        def seen() -> str:
            return "".join(lines)[-3000:] + "\n--- stderr\n" + "".join(errors)[-3000:]

        try:
            deadline = time.monotonic() + 180
            while sum("charged" in line for line in lines) < ORDERS or (
                _end_offset(bootstrap, dlq) < 1
            ):
                assert proc.poll() is None, seen()
                assert time.monotonic() < deadline, (
                    "the consumer snippet did not handle every order and dead-letter the "
                    "poison message within 180 s:\n" + seen()
                )
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)  # "until SIGTERM, SIGINT or consumer.stop()"
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for reader in readers:
                reader.join(timeout=10)
    assert code == 0, f"consumer exited {code} on SIGTERM:\n{seen()}"
    return "".join(lines), "".join(errors)


# A structlog console line (`05:53:02 [info     ] event ...`): belongs on stderr, never stdout.
_LOG_LINE = re.compile(r"\[(debug|info|warning|error|critical)\s*\]")
# What each snippet prints itself (its stdout, line by line).
_OWN_OUTPUT = {
    "consumer": re.compile(r"charged c\d \d+"),
    "otel": re.compile(r"(?!)"),  # prints nothing
}


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
        what = f"{block.where} ({block.kind})"
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
        if block.kind == "output":
            continue  # test_readme_failed_delivery_text_is_what_flush_raises
        path = tmp_path / f"snippet_{number}_{block.kind}.py"
        path.write_text(code, encoding="utf-8")
        if block.kind == "consumer":
            stdout, stderr = _run_consumer(path, tmp_path, env, bootstrap)
        else:
            stdout, stderr = _run_split([PYTHON, str(path)], tmp_path, env, what, timeout=300)
        output = stdout + stderr
        ran.append(block.kind)
        shown = f"{what}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
        # The logging line keeps kresilient's per-message DEBUG events out of the output,
        assert "[debug" not in output, f"printed DEBUG lines: {shown}"
        # and sends the rest to stderr: stdout is the snippet's own.
        logged = [line for line in stdout.splitlines() if _LOG_LINE.search(line)]
        assert not logged, f"log lines on stdout: {logged}\n{shown}"
        own = _OWN_OUTPUT.get(block.kind)
        if own is not None:
            strays = [line for line in stdout.splitlines() if not own.fullmatch(line)]
            assert not strays, f"stdout has more than the snippet's prints: {strays}\n{shown}"
        if block.source == README and block.kind == "python":  # the producer: its one print
            assert stdout.startswith("ProducerHealth(") and stdout.count("\n") == 1, shown
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
    output = _run([PYTHON, str(path)], tmp_path, _env(), block.where, 600)
    assert re.search(r"^\d+$", output.strip().splitlines()[-1]), output  # the new leader's id


# --------------------------------------------------------------------------- quiet by default


_README_STDERR_LINES = 2  # issue 36, acceptance 3: at most 2 lines at the default level


@pytest.mark.integration
def test_readme_producer_and_consumer_log_at_most_two_lines_on_stderr(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """Issue 36, acceptance 3: on their own topic and group, the README's producer and consumer
    print on stdout only what they print themselves, and at most 2 lines on stderr."""
    bootstrap = kafka_cluster.bootstrap_servers
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"orders-{suffix}", f"billing-{suffix}"

    def own(text: str) -> str:
        text = re.sub(r"\borders\b(?![.-])", topic, text.replace(README_PORT, bootstrap))
        return text.replace('"orders.dlq"', f'"{topic}.dlq"').replace('"billing"', f'"{group}"')

    env = _env()
    (create,) = [c for b in _blocks((README,)) for c in _shell_commands(b) if "topic create" in c]
    _run(shlex.split(own(create)), tmp_path, env, create, 180)
    producer, consumer = [b for b in _blocks((README,)) if b.lang == "python"]
    (tmp_path / "producer.py").write_text(own(producer.code), encoding="utf-8")
    (tmp_path / "consumer.py").write_text(own(consumer.code), encoding="utf-8")
    assert topic in own(producer.code) and group in own(consumer.code)
    p_out, p_err = _run_split(
        [PYTHON, str(tmp_path / "producer.py")], tmp_path, env, producer.where, 300
    )
    c_out, c_err = _run_consumer(tmp_path / "consumer.py", tmp_path, env, bootstrap, f"{topic}.dlq")
    assert p_out.startswith("ProducerHealth(") and p_out.count("\n") == 1, p_out
    assert all(re.fullmatch(r"charged c\d \d+", line) for line in c_out.splitlines()), c_out
    for what, err in ((producer.where, p_err), (consumer.where, c_err)):
        lines = err.splitlines()
        assert len(lines) <= _README_STDERR_LINES, f"{what}: {len(lines)} lines on stderr:\n{err}"


# --------------------------------------------------------------------------- logging line


def _logging_setup() -> str:
    """The logging set-up every client snippet carries: ``kresilient.logging.configure(...)``
    (one text), with its import."""
    calls = {}
    for block in _blocks():
        if block.kind not in ("python", "consumer", "otel"):
            continue  # the Spark and local-cluster snippets make no kresilient client
        found = {
            ast.unparse(node)
            for node in ast.walk(ast.parse(block.code))
            if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "kresilient.logging.configure"
        }
        assert len(found) == 1, f"{block.where}: no logging set-up ({found})"
        calls[block.where] = found.pop()
    assert len(set(calls.values())) == 1, calls
    return "import kresilient.logging\n" + next(iter(calls.values()))


_NOISY_PRODUCER = """
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
def test_readme_logging_line_silences_debug_events_and_moves_logs_to_stderr(
    kafka_cluster: KafkaCluster, tmp_path: Path, configured: bool
) -> None:
    script = tmp_path / "noisy.py"
    script.write_text(
        _NOISY_PRODUCER.format(
            configure=_logging_setup() if configured else "",
            bootstrap=kafka_cluster.bootstrap_servers,
            topic=f"no-such-topic-{uuid.uuid4().hex[:8]}",  # every message fails to deliver
        ),
        encoding="utf-8",
    )
    stdout, stderr = _run_split([PYTHON, str(script)], tmp_path, _env(), "producer", timeout=120)
    assert "failed 3" in stdout, stdout + stderr
    if configured:
        assert "delivery_failed" not in stdout + stderr, stdout + stderr
        assert stdout == "failed 3\n", f"logs on stdout:\n{stdout}"  # they go to stderr
    else:  # the control: without the line, structlog's default prints DEBUG events to stdout
        assert "delivery_failed" in stdout, stdout + stderr


# --------------------------------------------------------------------------- failure example


_FAILED_DELIVERY = """
from kresilient import DeliveryError, ResilientProducer
{configure}

# librdkafka gives up on a missing topic after topic.metadata.propagation.max.ms (30 s by
# default; 1 s here to keep the test short: the same error, UNKNOWN_TOPIC_OR_PART).
config = {{"bootstrap.servers": "{bootstrap}", "topic.metadata.propagation.max.ms": 1000}}
with ResilientProducer(config) as producer:
    producer.produce("{topic}", b'{{"id": 1}}')
    try:
        producer.flush()
    except DeliveryError as exc:
        print(exc)
"""


@pytest.mark.integration
def test_readme_failed_delivery_text_is_what_flush_raises(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    (block,) = [b for b in _blocks((README,)) if b.kind == "output"]
    (shown,) = block.code.splitlines()
    named = re.match(r"1 message\(s\) failed delivery: ([\w.-]+): ", shown)
    assert named, shown
    topic = f"{named.group(1)}-{uuid.uuid4().hex[:8]}"  # a topic that surely does not exist
    script = tmp_path / "failed_delivery.py"
    script.write_text(
        _FAILED_DELIVERY.format(
            configure=_logging_setup(), bootstrap=kafka_cluster.bootstrap_servers, topic=topic
        ),
        encoding="utf-8",
    )
    stdout, stderr = _run_split([PYTHON, str(script)], tmp_path, _env(), block.where, 180)
    assert stdout.strip() == shown.replace(named.group(1), topic, 1), stdout + stderr
