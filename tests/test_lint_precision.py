"""Precision fixes found on the real-world corpus (tests/data/lint/realworld/).

Each test is a defect the corpus showed: a finding that is wrong for the file's reader
(node role, dialect, deployment size the file states). Every test has a control showing the
finding still comes where it is right.
"""

from __future__ import annotations

from pathlib import Path

from kresilient.lint import lint_paths
from kresilient.lint.model import Finding, Severity
from kresilient.lint.settings import Settings


def _lint(tmp_path: Path, name: str, text: str) -> list[Finding]:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return lint_paths([str(path)])


def _errors(findings: list[Finding]) -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in findings if f.severity == Severity.ERROR]


def _rules(findings: list[Finding]) -> list[str]:
    return sorted(f.rule for f in findings)


KRAFT_QUICKSTART = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters={voters}
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
log.dirs=/tmp/kraft
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
"""


def test_one_voter_quorum_folds_replication_findings_into_one_info_line(tmp_path: Path) -> None:
    findings = _lint(
        tmp_path, "server.properties", KRAFT_QUICKSTART.format(voters="1@localhost:9093")
    )
    assert _errors(findings) == []
    dev = [f for f in findings if f.rule == "KR053"]
    assert len(dev) == 1 and dev[0].severity == Severity.INFO and dev[0].line == 1
    assert "a KRaft quorum of one voter" in dev[0].message
    assert "KR042 x3" in dev[0].message and "KR043 x2" in dev[0].message


def test_three_voter_quorum_keeps_replication_errors(tmp_path: Path) -> None:
    voters = "1@k1:9093,2@k2:9093,3@k3:9093"
    findings = _lint(tmp_path, "server.properties", KRAFT_QUICKSTART.format(voters=voters))
    assert "KR053" not in _rules(findings)
    assert (6, "KR042") in _errors(findings) and (8, "KR043") in _errors(findings)


def test_a_comment_saying_single_broker_folds_a_connect_worker(tmp_path: Path) -> None:
    worker = (
        "bootstrap.servers=localhost:9092\ngroup.id=connect-cluster\n"
        "key.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "value.converter=org.apache.kafka.connect.json.JsonConverter\n"
        "# to run this example on a single-broker cluster we set the replication factor to 1\n"
        "offset.storage.topic=connect-offsets\noffset.storage.replication.factor=1\n"
        "config.storage.topic=connect-configs\nconfig.storage.replication.factor=1\n"
        "status.storage.topic=connect-status\nstatus.storage.replication.factor=1\n"
    )
    findings = _lint(tmp_path, "connect-distributed.properties", worker)
    assert _errors(findings) == []
    dev = [f for f in findings if f.rule == "KR053"]
    assert len(dev) == 1 and "'single-broker'" in dev[0].message and "KR042 x3" in dev[0].message
    # control: the same worker without the comment
    plain = "\n".join(line for line in worker.splitlines() if not line.startswith("#")) + "\n"
    assert [r for _, r in _errors(_lint(tmp_path, "w2/connect-distributed.properties", plain))] == [
        "KR042"
    ] * 3


COMPOSE = """\
services:
{brokers}
  connect:
    image: confluentinc/cp-kafka-connect
    environment:
      CONNECT_BOOTSTRAP_SERVERS: broker-1:29092
"""
BROKER = """\
  broker-{n}:
    image: confluentinc/cp-kafka
    environment:
      KAFKA_BROKER_ID: {n}
      KAFKA_ZOOKEEPER_CONNECT: zookeeper:2181
      KAFKA_ADVERTISED_LISTENERS: PLAINTEXT://broker-{n}:29092
      KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR: 1
"""


def test_compose_file_with_one_broker_is_a_dev_stack(tmp_path: Path) -> None:
    one = COMPOSE.format(brokers=BROKER.format(n=1))
    findings = _lint(tmp_path, "one/docker-compose.yml", one)
    assert _errors(findings) == [] and _rules(findings).count("KR053") == 1
    three = COMPOSE.format(brokers="".join(BROKER.format(n=n) for n in (1, 2, 3)))
    errors = _errors(_lint(tmp_path, "three/docker-compose.yml", three))
    assert [line for line, rule in errors if rule == "KR042" and line in (8, 15, 22)] == [
        8,
        15,
        22,
    ]


STRIMZI = """\
apiVersion: kafka.strimzi.io/v1
kind: KafkaNodePool
metadata:
  name: dual-role
  labels:
    strimzi.io/cluster: my-cluster
spec:
  replicas: {replicas}
  roles:
    - controller
    - broker
---
apiVersion: kafka.strimzi.io/v1
kind: Kafka
metadata:
  name: my-cluster
spec:
  kafka:
    config:
      offsets.topic.replication.factor: 1
      default.replication.factor: 1
"""


def test_strimzi_cluster_whose_node_pools_hold_one_broker_is_a_dev_stack(
    tmp_path: Path,
) -> None:
    findings = _lint(tmp_path, "single.yaml", STRIMZI.format(replicas=1))
    assert _errors(findings) == []
    assert next(f.message for f in findings if f.rule == "KR053").startswith(
        "dev stack (its cluster has one broker)"
    )
    errors = _errors(_lint(tmp_path, "three.yaml", STRIMZI.format(replicas=3)))
    assert (20, "KR042") in errors and (21, "KR042") in errors


TERRAFORM = """\
provider "kafka" {{
  bootstrap_servers = [{servers}]
}}

resource "kafka_topic" "orders" {{
  name               = "orders"
  replication_factor = 1
  partitions         = 3
}}
"""


def test_terraform_provider_on_localhost_is_a_dev_stack(tmp_path: Path) -> None:
    local = _lint(tmp_path, "local/main.tf", TERRAFORM.format(servers='"localhost:9092"'))
    assert _errors(local) == [] and _rules(local) == ["KR053"]
    remote = _lint(tmp_path, "prod/main.tf", TERRAFORM.format(servers='"kafka-0.prod:9092"'))
    assert _errors(remote) == [(7, "KR042")]


def test_topicctl_topic_of_a_local_environment_is_a_dev_stack(tmp_path: Path) -> None:
    topic = (
        "meta:\n  name: events\n  cluster: {cluster}\n  environment: {env}\n"
        "spec:\n  partitions: 3\n  replicationFactor: 1\n"
    )
    local = _lint(tmp_path, "a/t.yaml", topic.format(cluster="local-cluster", env="local-env"))
    assert _errors(local) == [] and _rules(local) == ["KR053"]
    prod = _lint(tmp_path, "b/t.yaml", topic.format(cluster="prod-eu", env="production"))
    assert _errors(prod) == [(7, "KR042")]


def test_broker_listening_on_localhost_only_is_a_dev_stack(tmp_path: Path) -> None:
    broker = "broker.id=0\nlisteners=PLAINTEXT://{host}:9092\nlog.dirs=/tmp/kafka-logs\n"
    local = _lint(tmp_path, "a/server.properties", broker.format(host="localhost"))
    assert _errors(local) == [] and "KR053" in _rules(local)
    shared = _lint(tmp_path, "b/server.properties", broker.format(host="kafka-0.internal"))
    assert sorted(r for _, r in _errors(shared)) == ["KR042", "KR043"]


ISOLATED = """\
process.roles={roles}
node.id=1
controller.quorum.voters=1@c1:9093,2@c2:9093,3@c3:9093
listeners=CONTROLLER://:9093
controller.listener.names=CONTROLLER
log.dirs=/data
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
"""


def test_controller_only_node_gets_no_broker_side_findings(tmp_path: Path) -> None:
    controller = _lint(tmp_path, "c/server.properties", ISOLATED.format(roles="controller"))
    assert _errors(controller) == []
    assert "KR047" not in _rules(controller)  # broker.rack means nothing on a controller
    # control: the same settings on a broker are hazards
    broker = _lint(tmp_path, "b/server.properties", ISOLATED.format(roles="broker"))
    assert _errors(broker) == [(9, "KR042"), (10, "KR042"), (11, "KR043")]
    assert "KR047" in _rules(broker)


def test_controller_only_node_keeps_its_topic_creation_defaults(tmp_path: Path) -> None:
    text = ISOLATED.format(roles="controller").replace("default.replication.factor=3\n", "")
    assert (1, "KR042") in _errors(_lint(tmp_path, "server.properties", text))


def test_a_java_only_key_makes_the_file_a_java_client_config(tmp_path: Path) -> None:
    producer = (
        "bootstrap.servers=k1:9092,k2:9092\nsecurity.protocol=SASL_SSL\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="app" password="${file:/etc/kafka/secrets.properties:password}";\n'
        "compression.type=lz4\n"
    )
    findings = _lint(tmp_path, "producer.properties", producer)
    # librdkafka has no sasl.jaas.config: the file is for the Java client, whose defaults
    # are idempotent with the murmur2 partitioner
    assert {"KR005", "KR008", "KR038"}.isdisjoint(_rules(findings))
    forced = lint_paths([str(tmp_path / "producer.properties")], Settings(client="librdkafka"))
    assert "KR005" in _rules(forced)  # control: read as librdkafka, the key is refused


def test_zookeeper_keys_are_known_on_a_zookeeper_mode_broker(tmp_path: Path) -> None:
    zk = "broker.id=0\nzookeeper.connect=zk:2181\nzookeeper.connection.timeout.ms=6000\n"
    assert "KR005" not in _rules(_lint(tmp_path, "zk/server.properties", zk))
    kraft = (
        "process.roles=broker\nnode.id=4\ncontroller.quorum.voters=1@c1:9093,2@c2:9093\n"
        "zookeeper.connection.timeout.ms=6000\n"
    )
    unknown = [f for f in _lint(tmp_path, "kraft/server.properties", kraft) if f.rule == "KR005"]
    assert [(f.line, "KRaft node ignores it" in f.message) for f in unknown] == [(4, True)]


def test_sasl_plaintext_listeners_are_one_finding_and_unused_map_entries_none(
    tmp_path: Path,
) -> None:
    broker = (
        "node.id=1\nprocess.roles=broker\ncontroller.quorum.voters=1@c1:9093,2@c2:9093\n"
        "listeners=SASL_PLAINTEXT://:9092\nadvertised.listeners=SASL_PLAINTEXT://kafka-0:9092\n"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT\n"
    )
    hits = [f for f in _lint(tmp_path, "a/server.properties", broker) if f.rule == "KR040"]
    assert [f.line for f in hits] == [4]
    unused = (
        "node.id=1\nprocess.roles=broker\ncontroller.quorum.voters=1@c1:9093,2@c2:9093\n"
        "listeners=SSL://:9093\n"
        "listener.security.protocol.map=SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT\n"
    )
    assert "KR040" not in _rules(_lint(tmp_path, "b/server.properties", unused))
    mapped = unused.replace("SSL://:9093", "INTERNAL://:9093").replace(
        "SSL:SSL", "INTERNAL:SASL_PLAINTEXT"
    )
    hits = [f for f in _lint(tmp_path, "c/server.properties", mapped) if f.rule == "KR040"]
    assert [(f.line, "INTERNAL" in f.message) for f in hits] == [(4, True)]


def test_a_client_tls_file_is_read_as_a_java_client_not_a_broker(tmp_path: Path) -> None:
    client = (
        "# Licensed to the Apache Software Foundation (ASF)\n"
        "security.protocol=SSL\n"
        "ssl.truststore.location=/etc/kafka/truststore.jks\n"
        "ssl.truststore.password=${file:/etc/kafka/creds:truststore}\n"
        "ssl.keystore.location=/etc/kafka/client.keystore.jks\n"
        "ssl.client.auth=required\n"
        "ssl.endpoint.identification.algorithm=\n"
    )
    findings = _lint(tmp_path, "client-ssl.properties", client)
    assert {"KR042", "KR043", "KR047"}.isdisjoint(_rules(findings))
    # an empty algorithm turns hostname verification off in the Java client
    assert (7, "KR034") in _errors(findings)


def test_a_connect_rest_json_connector_is_read_with_its_credentials(tmp_path: Path) -> None:
    """Recall fix: the REST form of a connector ({"name", "config"}) was not read at all."""
    doc = (
        '{\n  "name": "inventory",\n  "config": {\n'
        '    "connector.class": "io.debezium.connector.mysql.MySqlConnector",\n'
        '    "database.user": "debezium",\n'
        '    "database.password": "{password}",\n'
        '    "topics": "orders",\n'
        '    "errors.tolerance": "all"\n  }\n}\n'
    )
    literal = _lint(tmp_path, "a/register.json", doc.replace("{password}", "dbz"))
    assert _errors(literal) == [(6, "KR041"), (8, "KR050")]
    reference = doc.replace("{password}", "${file:/secrets/db.properties:password}")
    assert _errors(_lint(tmp_path, "b/register.json", reference)) == [(8, "KR050")]


def test_aiokafka_ssl_context_password_is_a_credential(tmp_path: Path) -> None:
    source = (
        "import os\nfrom aiokafka.helpers import create_ssl_context\n\n"
        'context = create_ssl_context(cafile="ca.pem", password={value})\n'
    )
    literal = _lint(tmp_path, "a/app.py", source.format(value='"123123"'))
    assert _errors(literal) == [(4, "KR041")]
    from_env = _lint(tmp_path, "b/app.py", source.format(value='os.environ["KEY_PASSWORD"]'))
    assert _errors(from_env) == []


def test_compose_list_environment_and_bitnami_variables_are_read(tmp_path: Path) -> None:
    """Recall fix: `environment:` as a list of NAME=value, and bitnami's KAFKA_CFG_*."""
    compose = "services:\n" + "".join(
        f"  kafka-{n}:\n    image: bitnami/kafka\n    environment:\n"
        f"      - KAFKA_CFG_NODE_ID={n}\n"
        "      - KAFKA_CFG_PROCESS_ROLES=controller,broker\n"
        "      - KAFKA_CFG_CONTROLLER_QUORUM_VOTERS=0@kafka-0:9093,1@kafka-1:9093,2@kafka-2:9093\n"
        "      - KAFKA_CFG_DEFAULT_REPLICATION_FACTOR=3\n"
        "      - KAFKA_CFG_MIN_INSYNC_REPLICAS=2\n"
        "      - KAFKA_CFG_BROKER_RACK=az1\n"
        "      - KAFKA_CFG_OFFSETS_TOPIC_REPLICATION_FACTOR=1\n"
        for n in range(3)
    )
    errors = _errors(_lint(tmp_path, "docker-compose.yml", compose))
    assert errors == [(11, "KR042"), (21, "KR042"), (31, "KR042")]


def test_strimzi_mirror_maker_2_and_kafka_connect_topics_are_read(tmp_path: Path) -> None:
    """Recall fix: KafkaMirrorMaker2 and KafkaConnect resources were not read."""
    mm2 = (
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaMirrorMaker2\n"
        "metadata:\n  name: mm2\nspec:\n  connectCluster: target\n  clusters:\n"
        "  - alias: target\n    bootstrapServers: target:9092\n    config:\n"
        "      config.storage.replication.factor: -1\n"
        "      offset.storage.replication.factor: 2\n"
        "  mirrors:\n  - sourceCluster: source\n    targetCluster: target\n"
        "    sourceConnector:\n      config:\n        replication.factor: 3\n"
        "        offset-syncs.topic.replication.factor: 1\n"
    )
    assert _errors(_lint(tmp_path, "mm2.yaml", mm2)) == [(12, "KR042"), (19, "KR042")]
    connect = (
        "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaConnect\nmetadata:\n  name: c\n"
        "spec:\n  config:\n    group.id: c\n    offset.storage.topic: offsets\n"
        "    offset.storage.replication.factor: 1\n"
        "    config.storage.replication.factor: -1\n"
    )
    assert _errors(_lint(tmp_path, "connect.yaml", connect)) == [(9, "KR042")]
