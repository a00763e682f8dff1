"""Benchmark: lint 1,000 generated config files (target: under 2 s on the project machine).

Usage: .venv/bin/python benchmarks/lint.py [--files 1000] [--repeat 3] [--profile]

The mix is twelve equal shares (about 83 files each, 1/12 of the set), so every reader
counts, Terraform included (its HCL parser is the slowest reader per file):

 1. plain ``.properties`` (producer, consumer, broker or topic settings)
 2. flat YAML
 3. JSON / TOML (alternate)
 4. ``.env`` (``KAFKA_*``)
 5. confluent-kafka Python
 6. aiokafka Python
 7. Spring Boot ``application.yml`` / ``application.properties`` (alternate)
 8. Kafka Connect worker / connector ``.properties`` (alternate)
 9. Strimzi ``KafkaTopic`` documents (two per file)
10. Jikkou ``KafkaTopicList`` (two topics)
11. topicctl topic specs
12. Terraform: a provider block and three ``kafka_topic`` resources per file

About 30% of the files carry a finding, as in real repositories. It times ``lint_paths`` over
the directory in-process (best and median of --repeat) and once through the ``kresilient
lint`` CLI (a new process, so interpreter start-up and imports are included); the in-process
CPU time is printed too (on a loaded, shared machine the wall time says little). ``--profile``
prints the top of a cProfile of one more in-process run. Not a test: numbers go in reports.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from kresilient.lint import lint_paths

PRODUCER = {
    "bootstrap.servers": "k1:9092,k2:9092",
    "acks": "all",
    "linger.ms": 20,
    "enable.idempotence": True,
    "compression.type": "zstd",
    "message.timeout.ms": 120000,
}
CONSUMER = {
    "bootstrap.servers": "k1:9092,k2:9092",
    "group.id": "orders",
    "auto.offset.reset": "earliest",
    "enable.auto.offset.store": False,
    "partition.assignment.strategy": "cooperative-sticky",
    "session.timeout.ms": 45000,
}
TOPIC = {
    "cleanup.policy": "delete",
    "retention.ms": 604800000,
    "min.insync.replicas": 2,
    "replication.factor": 3,
    "max.message.bytes": 1048588,
}
BROKER = {
    "node.id": 1,
    "process.roles": "broker,controller",
    "log.dirs": "/data",
    "default.replication.factor": 3,
    "min.insync.replicas": 2,
    "broker.rack": "a",
}


def _config(rng: random.Random, fmt: str) -> dict[str, object]:
    kinds = [PRODUCER, CONSUMER] if fmt == "py" else [PRODUCER, CONSUMER, TOPIC, BROKER]
    base = dict(rng.choice(kinds))
    if rng.random() < 0.3:  # some findings, as in real repositories
        base[
            rng.choice(["acks", "enable.idempotense", "retries", "unclean.leader.election.enable"])
        ] = rng.choice(["0", "1", "true", 0])
    return base


def _val(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _rf(rng: random.Random) -> int:
    return 3 if rng.random() >= 0.3 else rng.choice([1, 2])


def _plain(rng: random.Random, fmt: str, i: int) -> tuple[str, str]:
    conf = _config(rng, fmt)
    if fmt == "properties":
        return f"c{i:04d}.properties", "".join(f"{k}={_val(v)}\n" for k, v in conf.items())
    if fmt == "yaml":
        body = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in conf.items())
        return f"c{i:04d}.yaml", "kafka:\n" + body
    if fmt == "json":
        return f"c{i:04d}.json", json.dumps(conf, indent=2)
    if fmt == "toml":
        body = "".join(f'"{k}" = {json.dumps(v)}\n' for k, v in conf.items())
        return f"c{i:04d}.toml", "[kafka]\n" + body
    if fmt == "env":
        body = "".join(f"KAFKA_{k.upper().replace('.', '_')}={_val(v)}\n" for k, v in conf.items())
        return f"c{i:04d}.env", body
    return f"c{i:04d}.py", (
        f"from confluent_kafka import Producer\n\nCONF = {conf!r}\n\n"
        "p = Producer(CONF, error_cb=print)\n"
    )


def _aiokafka(rng: random.Random, i: int) -> tuple[str, str]:
    acks = rng.choice(['"all"', '"all"', "1"])
    commit = rng.choice(["False", "False", "True"])
    return f"svc{i:04d}.py", (
        "import asyncio\n\nfrom aiokafka import AIOKafkaConsumer, AIOKafkaProducer\n\n\n"
        "async def run() -> None:\n"
        "    consumer = AIOKafkaConsumer(\n"
        '        "orders",\n'
        '        bootstrap_servers="k1:9092,k2:9092",\n'
        '        group_id="billing",\n'
        f"        enable_auto_commit={commit},\n"
        '        auto_offset_reset="earliest",\n'
        "    )\n"
        "    producer = AIOKafkaProducer(\n"
        '        bootstrap_servers=["k1:9092", "k2:9092"],\n'
        f"        acks={acks},\n"
        "        enable_idempotence=True,\n"
        "    )\n"
        "    await consumer.start()\n    await producer.start()\n"
        "    async for msg in consumer:\n"
        '        await producer.send_and_wait("billed", msg.value)\n\n\n'
        "asyncio.run(run())\n"
    )


def _spring(rng: random.Random, i: int) -> tuple[str, str]:
    acks = rng.choice(["all", "all", "1"])
    commit = rng.choice(["false", "false", "true"])
    if i % 2:
        return f"app{i:04d}/application.properties", (
            f"spring.application.name=svc{i}\n"
            "spring.kafka.bootstrap-servers=k1:9092,k2:9092\n"
            f"spring.kafka.producer.acks={acks}\n"
            "spring.kafka.producer.key-serializer="
            "org.apache.kafka.common.serialization.StringSerializer\n"
            "spring.kafka.consumer.group-id=orders\n"
            f"spring.kafka.consumer.enable-auto-commit={commit}\n"
            "spring.kafka.consumer.auto-offset-reset=earliest\n"
            "spring.kafka.consumer.properties.client.rack=az1\n"
        )
    return f"app{i:04d}/application.yml", (
        f"server:\n  port: 8080\nspring:\n  application:\n    name: svc{i}\n  kafka:\n"
        "    bootstrap-servers: k1:9092,k2:9092\n"
        f"    producer:\n      acks: {acks}\n      retries: 10\n"
        "      key-serializer: org.apache.kafka.common.serialization.StringSerializer\n"
        f"    consumer:\n      group-id: orders\n      enable-auto-commit: {commit}\n"
        "      auto-offset-reset: earliest\n"
        "      properties:\n        client.rack: az1\n"
    )


def _connect(rng: random.Random, i: int) -> tuple[str, str]:
    if i % 2:
        rf = _rf(rng)
        return f"connect{i:04d}/connect-distributed.properties", (
            "bootstrap.servers=k1:9092,k2:9092,k3:9092\ngroup.id=connect-cluster\n"
            "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
            "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
            + "".join(
                f"{t}.storage.topic=connect-{t}\n{t}.storage.replication.factor={rf}\n"
                for t in ("offset", "config", "status")
            )
            + "plugin.path=/usr/share/java\n"
            + f"producer.acks={rng.choice(['all', 'all', '1'])}\n"
        )
    tolerance = rng.choice(["none", "none", "all"])
    return f"connect{i:04d}/jdbc-sink.properties", (
        f"name=sink-{i}\nconnector.class=io.confluent.connect.jdbc.JdbcSinkConnector\n"
        "tasks.max=3\ntopics=orders\n"
        "connection.url=jdbc:postgresql://db:5432/orders\n"
        "connection.password=${file:/opt/secrets/db.properties:password}\n"
        f"errors.tolerance={tolerance}\n"
        + ("errors.deadletterqueue.topic.name=orders-dlq\n" if tolerance == "none" else "")
        + "consumer.override.max.poll.records=200\n"
    )


def _strimzi(rng: random.Random, i: int) -> tuple[str, str]:
    docs = [
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\nmetadata:\n"
        f"  name: topic-{i}-{n}\n  labels:\n    strimzi.io/cluster: prod\n"
        f"spec:\n  partitions: 12\n  replicas: {_rf(rng)}\n  config:\n"
        "    retention.ms: 604800000\n    min.insync.replicas: 2\n"
        "    cleanup.policy: delete\n"
        for n in range(2)
    ]
    return f"strimzi{i:04d}.yaml", "---\n".join(docs)


def _jikkou(rng: random.Random, i: int) -> tuple[str, str]:
    items = "".join(
        f'  - metadata:\n      name: "topic-{i}-{n}"\n    spec:\n      partitions: 6\n'
        f"      replicas: {_rf(rng)}\n      configs:\n        min.insync.replicas: 2\n"
        '        cleanup.policy: "delete"\n'
        for n in range(2)
    )
    return f"jikkou{i:04d}.yaml", (
        'apiVersion: "kafka.jikkou.io/v1beta2"\nkind: "KafkaTopicList"\nitems:\n' + items
    )


def _topicctl(rng: random.Random, i: int) -> tuple[str, str]:
    return f"topicctl{i:04d}.yaml", (
        f"meta:\n  name: events-{i}\n  cluster: prod-us-east-1\n  environment: prod\n"
        "  region: us-east-1\n  description: |\n    User events.\n\n"
        f"spec:\n  partitions: 9\n  replicationFactor: {_rf(rng)}\n  retentionMinutes: 1440\n"
        "  placement:\n    strategy: in-rack\n  settings:\n"
        "    min.insync.replicas: 2\n    cleanup.policy: delete\n"
    )


def _terraform(rng: random.Random, i: int) -> tuple[str, str]:
    resources = "".join(
        f'resource "kafka_topic" "t{i}_{n}" {{\n'
        f'  name               = "svc{i}.events.{n}"\n'
        f"  replication_factor = {_rf(rng)}\n"
        "  partitions         = 12\n\n"
        "  config = {\n"
        '    "cleanup.policy"      = "delete"\n'
        '    "retention.ms"        = "604800000"\n'
        '    "min.insync.replicas" = "2"\n'
        "  }\n}\n\n"
        for n in range(3)
    )
    return f"tf{i:04d}/topics.tf", (
        'terraform {\n  required_providers {\n    kafka = {\n      source  = "Mongey/kafka"\n'
        '      version = "~> 0.7"\n    }\n  }\n}\n\n'
        'provider "kafka" {\n  bootstrap_servers = ["kafka-0:9092", "kafka-1:9092"]\n'
        "  tls_enabled       = true\n}\n\n" + resources
    )


#: The twelve shares of the mix, in the order of the module docstring.
MIX = (
    "properties",
    "yaml",
    "json/toml",
    "env",
    "py",
    "aiokafka",
    "spring",
    "connect",
    "strimzi",
    "jikkou",
    "topicctl",
    "terraform",
)


def _file(rng: random.Random, share: str, i: int) -> tuple[str, str]:
    if share == "json/toml":
        return _plain(rng, "json" if i % 2 else "toml", i)
    if share in ("properties", "yaml", "env", "py"):
        return _plain(rng, share, i)
    makers = {
        "aiokafka": _aiokafka,
        "spring": _spring,
        "connect": _connect,
        "strimzi": _strimzi,
        "jikkou": _jikkou,
        "topicctl": _topicctl,
        "terraform": _terraform,
    }
    return makers[share](rng, i)


def generate(directory: str, count: int, seed: int = 7) -> dict[str, int]:
    """Write ``count`` files of the mix into ``directory``; returns files per share."""
    rng = random.Random(seed)
    shares: dict[str, int] = dict.fromkeys(MIX, 0)
    for i in range(count):
        share = MIX[i % len(MIX)]
        name, text = _file(rng, share, i)
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        shares[share] += 1
    return shares


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shares = generate(tmp, args.files)
        print("mix: " + ", ".join(f"{k} {v}" for k, v in shares.items()))
        timings = []
        cpu = []  # this process's CPU time: on a loaded shared machine the wall time is not
        findings = []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            findings = lint_paths([tmp])
            timings.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(lint_paths, [tmp])
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "kresilient.lint", "--format", "json", tmp],
            capture_output=True,
            text=True,
            check=False,
        )
        cli = time.perf_counter() - start
        files = len({f.path for f in findings})
        print(f"files={args.files} findings={len(findings)} files_with_findings={files}")
        print(
            f"in-process lint_paths: best {min(timings):.3f} s, median "
            f"{statistics.median(timings):.3f} s, runs {', '.join(f'{t:.3f}' for t in timings)}"
        )
        print(f"in-process CPU time: best {min(cpu):.3f} s, median {statistics.median(cpu):.3f} s")
        print(f"CLI (new process, imports included): {cli:.3f} s, exit code {proc.returncode}")
        print(f"target < 2 s: {'met' if max(min(timings), cli) < 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
