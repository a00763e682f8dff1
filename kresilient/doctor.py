"""``kresilient doctor``: from a symptom to an answer, between one service and one cluster.

The doctor connects the way the application would (its client config, linted first) and
checks, in order, everything the troubleshooting guides this project grew from name as a
cause of an incident:

1. **config**: the client config itself (unknown keys, typos, unsafe settings) through
   ``kresilient lint``;
2. **connectivity**: every bootstrap address and every broker the metadata advertises —
   name resolution, TCP connect latency, then authentication and TLS through a metadata
   request (errors classified by :func:`kresilient.classify`);
3. **metadata**: the controller, and whether the brokers agree on partition leaders;
4. **topics**: offline partitions, under-replicated partitions, leaders not on their preferred
   replica, replication factor against ``min.insync.replicas``, replicas sharing a rack,
   unclean leader election, timestamps in the future, and log-dir usage per broker;
5. **groups**: state, members, lag per partition, and offsets that expired or may expire
   (``offsets.retention.minutes``);
6. **probe**: an ``acks=all`` produce and consume round trip on a temporary topic (latency
   percentiles) whose ``LogAppendTime`` timestamps also measure the clock skew between this
   machine and the brokers.

Every finding names the symptom (as the guides name it), the likely causes and the fix.
Exit codes are those of ``lint`` and ``audit``: 0 healthy, 1 a finding at ``error`` level
(or ``warning`` with ``--fail-on warning``), 2 the cluster cannot be reached or the input is
unusable.

Python use::

    from kresilient.doctor import diagnose

    report = diagnose({"bootstrap.servers": "127.0.0.1:9092"}, topics=["orders"])
    for finding in report.findings:
        print(finding.severity, finding.symptom, finding.message)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import enum
import json
import re
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TextIO, TypeVar

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported untyped
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from kresilient.clusterinfo import (
    DISK_USAGE_THRESHOLD,
    FUTURE_TOLERANCE_MS,
    LOG_DIR_ERRORS,
    committed_offsets,
    describe_log_dirs,
    max_timestamps,
    newest_committed_record_ms,
    permissive_future_bound,
)
from kresilient.errors import ConfigError, KafkaClientError, classify
from kresilient.lint.commandconfig import read_command_config
from kresilient.lint.connect import ConnectionErrors, fetch_metadata, quiet_client_config
from kresilient.redaction import Redactor

__all__ = [
    "DoctorFinding",
    "DoctorReport",
    "Severity",
    "diagnose",
    "main",
    "render_json",
    "render_text",
]

#: |broker clock - local clock| above this is reported.
CLOCK_SKEW_WARN_MS: Final = 1_000
_PROBE_MESSAGES: Final = 20
_TOPIC_KEYS: Final = (
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "message.timestamp.type",
    "message.timestamp.after.max.ms",
    "retention.ms",
    "segment.ms",
)
_BROKER_KEYS: Final = (
    "offsets.retention.minutes",
    "offsets.retention.check.interval.ms",
    "auto.leader.rebalance.enable",
)
_LATEST: Final[Any] = OffsetSpec.latest
_T = TypeVar("_T")
_ANY_PARTITION: Final = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses


class Severity(enum.IntEnum):
    """How much a finding matters; ``OK`` lines show what was checked and passed."""

    OK = 0
    INFO = 1
    WARNING = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, kw_only=True, slots=True)
class DoctorFinding:
    """One answer: what was seen, the guides' name for it, why it happens and what to do."""

    section: str
    severity: Severity
    subject: str
    message: str
    symptom: str = ""
    causes: tuple[str, ...] = ()
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["severity"] = str(self.severity)
        out["causes"] = list(self.causes)
        return out


@dataclass(kw_only=True, slots=True)
class DoctorReport:
    """Everything :func:`diagnose` found, in check order, with the measured figures."""

    bootstrap_servers: str
    findings: list[DoctorFinding] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    reachable: bool = True
    seconds: float = 0.0
    topics: tuple[str, ...] = ()
    """The topics asked for (``topics=``, ``--topic``): the text report always shows them."""
    groups: tuple[str, ...] = ()
    """The groups asked for (``groups=``, ``--group``): the text report always shows them."""

    def exit_code(self, fail_on: Severity = Severity.ERROR) -> int:
        """0 healthy, 1 a finding at ``fail_on`` or above, 2 unreachable or unusable input."""
        if not self.reachable:
            return 2
        return 1 if any(f.severity >= fail_on for f in self.findings) else 0

    def by_section(self, section: str) -> list[DoctorFinding]:
        return [f for f in self.findings if f.section == section]


# --------------------------------------------------------------------------- helpers


class _QuietLogger:
    """librdkafka's own log lines are summarised as findings instead of flooding stderr."""

    def log(self, *args: object, **kwargs: object) -> None:
        return None


def _hosts(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit():
            raise ConfigError(
                f"bootstrap.servers entry {item!r} is not HOST:PORT", key="bootstrap.servers"
            )
        out.append((host.strip("[]"), int(port)))
    if not out:
        raise ConfigError("bootstrap.servers is empty", key="bootstrap.servers")
    return out


def _tcp_probe(host: str, port: int, timeout: float) -> tuple[str | None, float]:
    """(None, seconds) when a TCP connection opened, else (reason, seconds)."""
    start = time.monotonic()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"the name {host!r} does not resolve ({exc.strerror})", time.monotonic() - start
    last = "no address"
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
            return None, time.monotonic() - start
        except ConnectionRefusedError:
            last = "connection refused: nothing listens on that port"
        except TimeoutError:
            last = f"no answer within {timeout:g}s (a firewall, or the host is down)"
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        finally:
            sock.close()
    return last, time.monotonic() - start


def _result(future: Any, timeout: float) -> Any:
    """``future.result(timeout)``, a wait that ran out (or a cancelled request) translated
    to the ``KafkaException(_TIMED_OUT)`` every check already handles: Python 3.11's
    ``concurrent.futures.TimeoutError`` is the built-in ``TimeoutError``, an ``OSError``
    with an empty message, which escaped the checks and ended the run without a report."""
    try:
        return future.result(timeout=timeout)
    except (TimeoutError, concurrent.futures.CancelledError):
        raise KafkaException(
            KafkaError(KafkaError._TIMED_OUT, f"no answer within {timeout:g} s (--timeout)")
        ) from None


def _kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


# --------------------------------------------------------------------------- the checks


@dataclass(slots=True)
class _Run:
    config: dict[str, Any]
    timeout: float
    topics: tuple[str, ...]
    groups: tuple[str, ...]
    probe: bool
    probe_topic: str | None
    disk_threshold: float
    future_tolerance_ms: int
    report: DoctorReport
    redact: Redactor
    admin: AdminClient | None = None
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)
    metadata: Any = None
    topic_configs: dict[str, dict[str, str | None]] = field(default_factory=dict)
    broker_configs: dict[str, str | None] = field(default_factory=dict)

    def add(self, section: str, severity: Severity, subject: str, message: str, **kw: Any) -> None:
        self.report.findings.append(
            DoctorFinding(
                section=section,
                severity=severity,
                subject=subject,
                message=self.redact(message),
                **kw,
            )
        )


def _check_config(run: _Run, config_text: str | None, config_path: str | None) -> None:
    if config_text is None:
        return
    from kresilient.lint import lint_text

    # The file plus the bootstrap servers given on the command line is the config the
    # application runs with; the linter recognises a client config by those keys.
    effective = (
        config_text.rstrip("\n") + f"\nbootstrap.servers={run.config['bootstrap.servers']}\n"
    )
    findings = lint_text(effective, config_path or "client.properties")
    for f in findings:
        severity = {"ERROR": Severity.ERROR, "WARNING": Severity.WARNING}.get(
            f.severity.name, Severity.INFO
        )
        run.add(
            "config",
            severity,
            f"{f.path}:{f.line}",
            f"{f.rule} {f.message}",
            symptom="client misconfiguration",
            fix=f"kresilient lint --explain {f.rule}",
        )
    if not any(f.section == "config" for f in run.report.findings):
        run.add("config", Severity.OK, config_path or "client config", "lint found nothing")


def _admin_conf(run: _Run) -> dict[str, Any]:
    conf = {k: v for k, v in run.config.items() if k not in _CLIENT_ONLY}
    conf.setdefault("socket.timeout.ms", int(run.timeout * 1000))
    conf.setdefault("logger", _QuietLogger())
    return conf


_CLIENT_ONLY: Final = frozenset(
    {
        "acks",
        "enable.idempotence",
        "group.id",
        "enable.auto.commit",
        "auto.offset.reset",
        "linger.ms",
        "compression.type",
        "isolation.level",
        "max.poll.interval.ms",
        "session.timeout.ms",
        "partition.assignment.strategy",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "batch.size",
        "batch.num.messages",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "max.in.flight.requests.per.connection",
        "retries",
        "partitioner",
        "transactional.id",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "enable.auto.offset.store",
        "group.instance.id",
        "group.protocol",
        "statistics.interval.ms",
    }
)


_PROPERTY: Final = re.compile(r'property:? "(?P<key>[^"]+)"')


_AUTH_TEXT: Final = re.compile(r"SASL|authenticat|credentials|SSL handshake|certificate", re.I)


def _admin_client(run: _Run, errors: ConnectionErrors | None = None) -> AdminClient:
    """An AdminClient on the application's config, minus the keys librdkafka refuses.

    A refused key (a typo) is reported once as a config finding and dropped, so the rest of
    the diagnosis still runs with what the application would have meant.
    """
    for _ in range(len(run.config) + 1):
        try:
            conf = _admin_conf(run)
            if errors is not None:
                conf = quiet_client_config(conf, errors, run.timeout)
            return AdminClient(conf)
        except KafkaException as exc:
            err = _kafka_error(exc)
            match = _PROPERTY.search(err.str() if err is not None else str(exc))
            if err is None or match is None or match.group("key") not in run.config:
                raise
            key = match.group("key")
            del run.config[key]
            linted = any(key in f.message for f in run.report.by_section("config"))
            run.add(
                "config",
                Severity.INFO if linted else Severity.ERROR,
                key,
                f"librdkafka refuses {key!r}: {err.str()}; the doctor continues without it",
                symptom="client misconfiguration",
                fix="fix or remove the key (kresilient lint names the likely intended key)",
            )
    raise ConfigError("the client config is refused by librdkafka", key=None)


def _check_connectivity(run: _Run) -> bool:
    hosts = _hosts(str(run.config.get("bootstrap.servers", "")))
    probes = [(host, port, *_tcp_probe(host, port, min(run.timeout, 5.0))) for host, port in hosts]
    reached = sum(1 for *_, reason, _ in probes if reason is None)
    for host, port, reason, seconds in probes:
        if reason is None:
            run.add(
                "connectivity",
                Severity.OK,
                f"{host}:{port}",
                f"TCP connect in {seconds * 1000:.1f} ms",
            )
        else:
            # One bootstrap address down while others answer is a warning (the client fails
            # over); every address down is the error that ends the diagnosis.
            run.add(
                "connectivity",
                Severity.WARNING if reached else Severity.ERROR,
                f"{host}:{port}",
                reason,
                symptom="broker unreachable",
                causes=("the broker is down", "wrong host or port", "a firewall", "DNS"),
                fix="check bootstrap.servers, that the broker runs and listens on that "
                "address, and that this machine may reach it",
            )
    if not reached:
        run.report.reachable = False
        return False
    # The first metadata request through the CLIs' one connection path: librdkafka's errors
    # are collected per host, so a refused TLS handshake or a failed SASL login is named as
    # such at once instead of surfacing as a transient _TRANSPORT after the timeout.
    errors = ConnectionErrors(str(run.config["bootstrap.servers"]))
    run.admin = _admin_client(run, errors)
    try:
        run.metadata = fetch_metadata(run.admin, errors, run.timeout)
    except KafkaClientError as exc:
        auth = [t for t in errors.texts if _AUTH_TEXT.search(t)]
        c = classify(KafkaError(KafkaError._AUTHENTICATION)) if auth else exc.classification
        run.add(
            "connectivity",
            Severity.ERROR,
            str(run.config.get("bootstrap.servers")),
            f"cannot complete a metadata request: {exc.message}"
            + (f"; the broker said: {auth[-1]}" if auth else ""),
            symptom="authentication or TLS failure" if auth else "cannot talk Kafka to the cluster",
            causes=(
                ("wrong sasl.username/sasl.password, or a mechanism the broker does not enable",)
                if auth
                else (f"classified {c.category.name}" if c is not None else "unknown",)
            ),
            fix=c.remedy if c is not None else "check the connectivity findings above",
        )
        run.report.reachable = False
        return False
    for broker_id, broker in sorted(run.metadata.brokers.items()):
        run.brokers[broker_id] = (broker.host, broker.port)
        reason, seconds = _tcp_probe(broker.host, broker.port, min(run.timeout, 5.0))
        run.report.figures.setdefault("broker_connect_ms", {})[broker_id] = (
            None if reason else round(seconds * 1000, 2)
        )
        if reason is None:
            run.add(
                "connectivity",
                Severity.OK,
                f"broker {broker_id} {broker.host}:{broker.port}",
                f"advertised address reachable, TCP connect in {seconds * 1000:.1f} ms",
            )
        else:
            run.add(
                "connectivity",
                Severity.ERROR,
                f"broker {broker_id} {broker.host}:{broker.port}",
                f"advertised address not reachable from here: {reason}",
                symptom="LEADER_NOT_AVAILABLE / timeouts on some partitions only",
                causes=(
                    "advertised.listeners names an address clients cannot reach",
                    "the broker is down but still registered",
                ),
                fix="set advertised.listeners to an address clients can reach",
            )
    return True


def _check_metadata(run: _Run) -> None:
    assert run.admin is not None
    try:
        cluster = _result(run.admin.describe_cluster(request_timeout=run.timeout), run.timeout)
    except KafkaException as exc:
        run.add("metadata", Severity.WARNING, "cluster", f"describe_cluster failed: {exc}")
        return
    controller = cluster.controller.id if cluster.controller is not None else None
    run.report.figures["controller"] = controller
    run.report.figures["brokers"] = sorted(run.brokers)
    if controller is None:
        run.add(
            "metadata",
            Severity.ERROR,
            "controller",
            "no active controller",
            symptom="LEADER_NOT_AVAILABLE",
            causes=("the KRaft controller quorum lost its majority",),
            fix="bring the controller nodes back until a majority of voters runs",
        )
    else:
        run.add(
            "metadata",
            Severity.OK,
            "controller",
            f"controller is node {controller}; {len(run.brokers)} broker(s) registered",
        )
    # Propagation: ask each broker alone for the leaders of the checked topics.
    names = _checked_topics(run)
    if not names or len(run.brokers) < 2:
        return
    views: dict[int, dict[tuple[str, int], int]] = {}
    for broker_id, (host, port) in run.brokers.items():
        conf = dict(_admin_conf(run), **{"bootstrap.servers": f"{host}:{port}"})
        try:
            md = AdminClient(conf).list_topics(timeout=min(run.timeout, 5.0))
        except KafkaException as exc:
            _unchecked(run, "metadata", f"broker {broker_id}", "a metadata request", exc)
            continue
        views[broker_id] = {
            (t, p): part.leader
            for t in names
            if t in md.topics
            for p, part in md.topics[t].partitions.items()
        }
    keys = set().union(*views.values()) if views else set()
    disagreements = sorted(k for k in keys if len({v.get(k) for v in views.values()}) > 1)
    if disagreements:
        sample = ", ".join(f"{t}-{p}" for t, p in disagreements[:5])
        run.add(
            "metadata",
            Severity.WARNING,
            "propagation",
            f"brokers disagree on the leader of {len(disagreements)} partition(s) ({sample})",
            symptom="NotLeaderOrFollower / stale metadata",
            causes=(
                "a leader election in progress",
                "a controller that cannot propagate metadata (seed: controller instability)",
            ),
            fix="run the doctor again; if it persists, check the controller's log and the "
            "brokers' connectivity to the controller quorum",
        )
    else:
        run.add("metadata", Severity.OK, "propagation", f"{len(views)} brokers agree on leaders")


def _checked_topics(run: _Run) -> list[str]:
    if run.metadata is None:
        return []
    if run.topics:
        return [t for t in run.topics]
    return sorted(
        t for t in run.metadata.topics if not t.startswith("__") and not t.startswith("_confluent")
    )


def _load_configs(run: _Run, topics: Sequence[str]) -> None:
    assert run.admin is not None
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    if resources:
        for resource, future in run.admin.describe_configs(
            resources, request_timeout=run.timeout
        ).items():
            try:
                entries = _result(future, run.timeout)
            except KafkaException as exc:
                _unchecked(run, "topics", resource.name, "DescribeConfigs (topic settings)", exc)
                continue
            run.topic_configs[resource.name] = {
                k: e.value for k, e in entries.items() if k in _TOPIC_KEYS
            }
    broker = min(run.brokers) if run.brokers else None
    if broker is not None:
        resource = ConfigResource(ResourceType.BROKER, str(broker))
        try:
            entries = _result(
                run.admin.describe_configs([resource], request_timeout=run.timeout)[resource],
                run.timeout,
            )
            run.broker_configs = {k: e.value for k, e in entries.items() if k in _BROKER_KEYS}
        except KafkaException as exc:
            _unchecked(run, "topics", f"broker {broker}", "DescribeConfigs (broker settings)", exc)


def _unchecked(run: _Run, section: str, subject: str, request: str, exc: KafkaException) -> None:
    """A request a check needed failed: a finding naming the request and the reason (what
    depends on it is not checked). No answer in time (a hung or overloaded broker) is a
    warning, and says so in the same words whoever noticed first: the wait for the future,
    or librdkafka's own request timer ("Failed while waiting for broker: Local: Timed out").
    A connection lost during the request, to a broker whose address accepted a TCP connect,
    is a warning too. A refusal (no DESCRIBE_CONFIGS ACL, an old broker) is information."""
    err = _kafka_error(exc)
    code = err.code() if err is not None else None
    reason = err.str() if err is not None else str(exc)
    timed_out = code in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)
    lost = code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN)
    if timed_out:
        said = "" if reason.startswith("no answer within") else f" ({reason})"
        message = f"{request} got no answer within {run.timeout:g} s{said}"
    elif lost:
        message = f"{request} lost its connection before an answer ({reason})"
    else:
        message = f"{request} failed: {reason}"
    run.add(
        section,
        Severity.WARNING if timed_out or lost else Severity.INFO,
        subject,
        f"{message}; what depends on it is not checked",
        symptom="request timeouts" if timed_out else "",
        causes=("a hung, overloaded or partitioned broker",) if timed_out or lost else (),
        fix="run again with a larger --timeout; check the broker's health (GC, disk, CPU)"
        if timed_out or lost
        else "",
    )


def _check_topics(run: _Run) -> None:
    assert run.admin is not None and run.metadata is not None
    names = _checked_topics(run)
    missing = [t for t in names if t not in run.metadata.topics]
    for t in missing:
        if _not_authorized(run, t):
            continue
        run.add(
            "topics",
            Severity.ERROR,
            t,
            "topic does not exist",
            symptom="UNKNOWN_TOPIC_OR_PART",
            causes=("the topic was never created, or was deleted", "a typo in the name"),
            fix=f"create it: kresilient topic create {t} --partitions N --replication-factor 3",
        )
    names = [t for t in names if t in run.metadata.topics]
    _load_configs(run, names)
    racks = _racks(run)
    now_ms = int(time.time() * 1000)
    future_parts: list[tuple[str, int]] = []
    for t in names:
        topic = run.metadata.topics[t]
        if topic.error is not None:
            run.add("topics", Severity.ERROR, t, f"metadata error: {topic.error.str()}")
            continue
        conf = run.topic_configs.get(t, {})
        offline, urp, not_preferred, shared_rack = [], [], [], []
        rf = 0
        for pid, part in sorted(topic.partitions.items()):
            rf = max(rf, len(part.replicas))
            if part.leader < 0:
                offline.append(pid)
            elif len(part.isrs) < len(part.replicas):
                urp.append(pid)
            if part.leader >= 0 and part.replicas and part.leader != part.replicas[0]:
                not_preferred.append(pid)
            rack_of = [racks.get(r) for r in part.replicas]
            if all(rack_of) and len(set(rack_of)) < len(rack_of):
                shared_rack.append(pid)
            future_parts.append((t, pid))
        if offline:
            run.add(
                "topics",
                Severity.ERROR,
                t,
                f"{len(offline)} offline partition(s) (no leader): {offline[:10]}",
                symptom="OfflinePartitionsCount > 0 / LEADER_NOT_AVAILABLE",
                causes=(
                    "every replica of the partition is down",
                    "no in-sync replica left and unclean leader election is off",
                ),
                fix="bring a replica of these partitions back; do not enable unclean election "
                "unless losing committed records is acceptable",
            )
        if urp:
            run.add(
                "topics",
                Severity.WARNING,
                t,
                f"{len(urp)} under-replicated partition(s): {urp[:10]}",
                symptom="UnderReplicatedPartitions > 0 (ISR shrink)",
                causes=("a broker down", "a slow disk, network or GC pause on a follower"),
                fix="find the broker missing from the ISR; check its disk I/O, network and GC",
            )
        if not_preferred:
            run.add(
                "topics",
                Severity.WARNING,
                t,
                f"{len(not_preferred)} partition(s) not led by their preferred replica: "
                f"{not_preferred[:10]}",
                symptom="leader imbalance after a restart",
                causes=(
                    "a broker restarted and leadership was not moved back",
                    "auto.leader.rebalance.enable=false",
                ),
                fix="run a preferred leader election (kafka-leader-election.sh --election-type "
                "PREFERRED) or enable auto.leader.rebalance.enable",
            )
        if shared_rack:
            run.add(
                "topics",
                Severity.WARNING,
                t,
                f"{len(shared_rack)} partition(s) with replicas sharing a rack",
                symptom="one rack failure takes several replicas",
                fix="reassign replicas across racks (broker.rack)",
            )
        _check_replication(run, t, rf, conf)
        if not (offline or urp or not_preferred or shared_rack):
            run.add(
                "topics",
                Severity.OK,
                t,
                f"{len(topic.partitions)} partition(s), RF {rf}: every leader preferred, ISR full",
            )
    _check_future_timestamps(run, future_parts, now_ms)
    _check_disks(run)


def _not_authorized(run: _Run, topic: str) -> bool:
    """True (and reported) when the broker refuses to DESCRIBE ``topic``.

    A listing of every topic silently leaves out the topics this client may not describe,
    so a topic absent from it may exist: asked for by name, the broker says
    TOPIC_AUTHORIZATION_FAILED instead (whether it exists or not, so as not to leak names).
    """
    assert run.admin is not None
    try:
        meta = run.admin.list_topics(topic=topic, timeout=run.timeout).topics.get(topic)
    except KafkaException:
        return False
    if meta is None or meta.error is None:
        return False
    if meta.error.code() != KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return False
    principal = run.config.get("sasl.username")
    who = f"User:{principal}" if principal else "this client's principal"
    run.add(
        "topics",
        Severity.ERROR,
        topic,
        f"not authorized to DESCRIBE topic {topic} (TOPIC_AUTHORIZATION_FAILED): the broker "
        "does not say whether it exists",
        symptom="TOPIC_AUTHORIZATION_FAILED / the topic looks missing",
        causes=("no ACL allows DESCRIBE (or READ/WRITE, which imply it) on the topic",),
        fix=f"grant it: kafka-acls.sh --add --allow-principal {who} --operation Describe "
        f"--topic {topic} (plus Read or Write for what the application does)",
    )
    return True


def _check_replication(run: _Run, topic: str, rf: int, conf: Mapping[str, str | None]) -> None:
    min_isr = int(conf.get("min.insync.replicas") or 1)
    if rf and rf <= min_isr and rf > 1:
        run.add(
            "topics",
            Severity.ERROR,
            topic,
            f"replication factor {rf} <= min.insync.replicas {min_isr}: losing one broker "
            "stops every acks=all write",
            symptom="NOT_ENOUGH_REPLICAS during a broker restart",
            fix=f"raise the replication factor to {min_isr + 1} or more, or lower "
            "min.insync.replicas",
        )
    elif rf and rf < 3 and len(run.brokers) >= 3:
        run.add(
            "topics",
            Severity.WARNING,
            topic,
            f"replication factor {rf} < 3 on a {len(run.brokers)}-broker cluster",
            symptom="data loss or unavailability when a broker fails",
            fix="use RF 3 with min.insync.replicas=2",
        )
    if str(conf.get("unclean.leader.election.enable", "false")).lower() == "true":
        run.add(
            "topics",
            Severity.ERROR,
            topic,
            "unclean.leader.election.enable=true: an out-of-sync replica may become leader",
            symptom="silent loss of committed records, offsets truncated",
            fix="set unclean.leader.election.enable=false unless availability strictly "
            "outranks correctness for this topic",
        )


def _racks(run: _Run) -> dict[int, str | None]:
    assert run.admin is not None
    try:
        cluster = _result(run.admin.describe_cluster(request_timeout=run.timeout), run.timeout)
    except KafkaException as exc:
        _unchecked(run, "topics", "racks", "DescribeCluster (broker racks)", exc)
        return {}
    return {node.id: node.rack for node in cluster.nodes}


def _check_future_timestamps(run: _Run, parts: Sequence[tuple[str, int]], now_ms: int) -> None:
    if not parts or run.admin is None:
        return
    stamps, _ = max_timestamps(run.admin, parts, run.timeout)
    ahead: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), ts in sorted(stamps.items()):
        if ts > now_ms + run.future_tolerance_ms:
            ahead.setdefault(topic, []).append((partition, ts - now_ms))
    for topic, found in sorted(ahead.items()):
        worst = max(ms for _, ms in found)
        conf = run.topic_configs.get(topic, {})
        run.add(
            "topics",
            Severity.WARNING,
            topic,
            f"{len(found)} partition(s) hold a record timestamped up to "
            f"{worst / 3_600_000:.1f} h in the future "
            f"(message.timestamp.type={conf.get('message.timestamp.type', '?')})",
            symptom="disk exhaustion: segments with future timestamps are never deleted",
            causes=(
                "a producer clock ahead (a clock advanced during testing)",
                "an application setting record timestamps itself",
            ),
            fix="fix the producer's clock or timestamps; bound message.timestamp.after.max.ms "
            "so brokers refuse them; use message.timestamp.type=LogAppendTime if producer "
            "time is not needed; delete the affected records or segments",
        )
    for topic in sorted(run.topic_configs):
        after = permissive_future_bound(run.topic_configs[topic])
        if after is not None:
            run.add(
                "topics",
                Severity.INFO,
                topic,
                f"message.timestamp.after.max.ms={after}: records far in the future are accepted",
                symptom="future timestamps (disk exhaustion risk)",
                fix="set message.timestamp.after.max.ms to 3600000 (Kafka 4's default)",
            )


def _check_disks(run: _Run) -> None:
    protocol = str(run.config.get("security.protocol", "plaintext")).lower()
    if protocol != "plaintext":
        run.add(
            "topics",
            Severity.INFO,
            "log dirs",
            f"log-dir usage not checked over {protocol} (use kafka-log-dirs.sh)",
        )
        return
    usage = {}
    for broker_id, (host, port) in sorted(run.brokers.items()):
        try:
            dirs = describe_log_dirs(host, port, min(run.timeout, 5.0))
        except LOG_DIR_ERRORS as exc:
            run.add(
                "topics",
                Severity.INFO,
                f"broker {broker_id} log dirs",
                f"DescribeLogDirs not answered ({exc})",
            )
            continue
        for path, total, usable in dirs:
            if total <= 0:
                continue
            used = 1 - usable / total
            usage[f"{broker_id}:{path}"] = round(used, 4)
            if used >= run.disk_threshold:
                run.add(
                    "topics",
                    Severity.ERROR if used >= 0.95 else Severity.WARNING,
                    f"broker {broker_id} {path}",
                    f"log dir {used:.0%} full ({usable / 2**30:.1f} GiB free of "
                    f"{total / 2**30:.1f} GiB; threshold {run.disk_threshold:.0%})",
                    symptom="disk exhaustion: the broker cannot write, then crashes",
                    causes=(
                        "retention longer than the disk allows",
                        "segments that never roll or delete (future timestamps, segment.ms)",
                    ),
                    fix="add disk or shorten retention.ms/retention.bytes; tune "
                    "log.segment.bytes and log.roll.hours so segments close and can be deleted",
                )
    run.report.figures["log_dir_usage"] = usage
    if usage and max(usage.values()) < run.disk_threshold:
        run.add(
            "topics",
            Severity.OK,
            "log dirs",
            f"{len(usage)} log dir(s), fullest {max(usage.values()):.0%}",
        )


def _check_groups(run: _Run) -> None:
    assert run.admin is not None
    groups = list(run.groups)
    if not groups:
        try:
            listed = _result(
                run.admin.list_consumer_groups(request_timeout=run.timeout), run.timeout
            )
            groups = sorted(g.group_id for g in listed.valid)
        except KafkaException as exc:
            run.add("groups", Severity.WARNING, "groups", f"cannot list groups: {exc}")
            return
    retention_min = run.broker_configs.get("offsets.retention.minutes")
    retention_ms = int(retention_min) * 60_000 if retention_min else None
    descriptions = {}
    if groups:
        for group, future in run.admin.describe_consumer_groups(
            groups, request_timeout=run.timeout
        ).items():
            try:
                descriptions[group] = _result(future, run.timeout)
            except KafkaException as exc:
                _unchecked(run, "groups", group, "DescribeConsumerGroups", exc)
                descriptions[group] = None
    committed = _committed_of_groups(run, groups)
    for group in groups:
        _check_group(
            run, group, descriptions.get(group), retention_ms, retention_min, committed[group]
        )


def _check_group(
    run: _Run,
    group: str,
    desc: Any,
    retention_ms: int | None,
    retention_min: str | None,
    committed: list[TopicPartition] | Exception | None = None,
) -> None:
    """``committed``: the group's offsets (or what reading them raised) read beforehand by
    :func:`_committed_of_groups`; ``None`` reads them now."""
    assert run.admin is not None
    state = desc.state.name if desc is not None and desc.state is not None else "UNKNOWN"
    members = len(desc.members) if desc is not None else 0
    try:
        if committed is None:
            committed = _committed(run, group)
        if isinstance(committed, Exception):
            raise committed
        parts = committed
    except KafkaException as exc:
        run.add("groups", Severity.WARNING, group, f"cannot read committed offsets: {exc}")
        return
    if not parts:
        run.add(
            "groups",
            Severity.WARNING if run.groups else Severity.INFO,
            group,
            f"no committed offsets (state {state}, {members} member(s)): a new group, or its "
            f"offsets expired after offsets.retention.minutes={retention_min or '?'} without "
            "members; the next consumer starts from auto.offset.reset",
            symptom="offset expiration: the group re-reads everything or skips to latest",
            causes=(
                "the group was idle longer than offsets.retention.minutes",
                "a new group id (a typo, or a renamed service)",
            ),
            fix="check auto.offset.reset is what you want on a restart; raise "
            "offsets.retention.minutes beyond your longest planned downtime, or reset the "
            "group's offsets explicitly (kafka-consumer-groups.sh --reset-offsets)",
        )
        return
    ends = run.admin.list_offsets(
        {TopicPartition(tp.topic, tp.partition): _LATEST() for tp in parts},
        request_timeout=run.timeout,
    )
    end_of = {}
    for tp, future in ends.items():
        try:
            end_of[(tp.topic, tp.partition)] = _result(future, run.timeout).offset
        except KafkaException:
            end_of[(tp.topic, tp.partition)] = None
    lag = {
        f"{tp.topic}-{tp.partition}": (
            max(end_of[(tp.topic, tp.partition)] - tp.offset, 0)
            if end_of.get((tp.topic, tp.partition)) is not None
            else None
        )
        for tp in parts
    }
    run.report.figures.setdefault("group_lag", {})[group] = lag
    total = sum(v for v in lag.values() if v is not None)
    unknown = [k for k, v in lag.items() if v is None]
    severity = Severity.OK
    message = f"state {state}, {members} member(s), lag {total} over {len(parts)} partition(s)"
    if unknown:
        severity = Severity.WARNING
        message += f"; lag unknown for {len(unknown)} partition(s) (offline?): {unknown[:5]}"
    run.add("groups", severity, group, message)
    if state == "EMPTY" and retention_ms:
        age = _last_commit_age_ms(run, parts)
        interval = run.broker_configs.get("offsets.retention.check.interval.ms")
        sweep = int(interval) if interval and interval.isdigit() else 600_000
        # Idle past the retention plus one expiry sweep, yet its offsets are still there: the
        # estimate is refuted (records with old producer timestamps); no false alarm.
        if age is not None and retention_ms / 2 < age <= retention_ms + sweep:
            run.add(
                "groups",
                Severity.WARNING,
                group,
                f"no members and last committed record is {age / 60_000:.0f} min old, "
                f"offsets.retention.minutes={retention_min}: offsets at risk of expiry",
                symptom="offset expiration",
                fix="restart a consumer of the group before the retention passes, or raise "
                "offsets.retention.minutes",
            )


def _committed(run: _Run, group: str) -> list[TopicPartition]:
    """The offsets ``group`` committed on the partitions of the cluster's topics.

    Read by :func:`~kresilient.clusterinfo.committed_offsets` (a consumer of the group that
    never joins it), never by ``AdminClient.list_consumer_group_offsets()``: that request
    kills the process with SIGSEGV, and no output at all, when the group's coordinator is
    not ready yet or moves (librdkafka issue 5040): the first doctor run after a cluster
    start, asked about 20 groups, died so on 3 of 3 fresh 3-node clusters
    (tests/test_doctor_crash.py). One consumer per group; offsets committed on a topic that
    no longer exists are not read (they have no lag to report)."""
    assert run.metadata is not None
    partitions = [(t, p) for t, meta in run.metadata.topics.items() for p in meta.partitions]
    try:
        return committed_offsets(_admin_conf(run), group, partitions, run.timeout)
    except KafkaException as exc:
        err = _kafka_error(exc)
        if err is not None and err.code() == KafkaError._TIMED_OUT:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, f"no answer within {run.timeout:g} s (--timeout)")
            ) from None
        raise


#: Groups whose committed offsets are read at once (one consumer each, mostly waiting).
_OFFSET_READERS: Final = 8


def _committed_of_groups(
    run: _Run, groups: Sequence[str]
) -> dict[str, list[TopicPartition] | Exception]:
    """:func:`_committed` of every group, up to ``_OFFSET_READERS`` at a time: one consumer
    per group costs connections and a coordinator lookup, about 40 ms on a local 3-node
    cluster: 100 groups took 4.0 s one after another, 0.9 s this way (the Admin API's
    single client took 0.5 s)."""
    if not groups:
        return {}

    def read(group: str) -> list[TopicPartition] | Exception:
        try:
            return _committed(run, group)
        except Exception as exc:  # raised again by _check_group, in the group's order
            return exc

    workers = min(_OFFSET_READERS, len(groups))
    with concurrent.futures.ThreadPoolExecutor(workers, "kresilient-doctor-offsets") as pool:
        return dict(zip(groups, pool.map(read, groups), strict=True))


def _last_commit_age_ms(run: _Run, parts: Sequence[TopicPartition]) -> int | None:
    """The group's idle time as estimated by :func:`newest_committed_record_ms` (an upper
    bound: old producer timestamps overstate it)."""
    newest = newest_committed_record_ms(_admin_conf(run), parts, run.timeout)
    return None if newest is None else int(time.time() * 1000) - newest


def _check_probe(run: _Run) -> None:
    assert run.admin is not None
    topic = run.probe_topic or f"__kresilient_doctor_{uuid.uuid4().hex[:12]}"
    created = False
    if run.probe_topic is None:
        rf = min(3, max(len(run.brokers), 1))
        future = run.admin.create_topics(
            [
                NewTopic(
                    topic,
                    1,
                    rf,
                    config={
                        "message.timestamp.type": "LogAppendTime",
                        "min.insync.replicas": str(max(1, min(2, rf - 1))),
                    },
                )
            ],
            request_timeout=run.timeout,
        )[topic]
        try:
            _result(future, run.timeout)
            created = True
        except KafkaException as exc:
            err = _kafka_error(exc)
            c = classify(err if err is not None else exc)
            run.add(
                "probe",
                Severity.WARNING,
                topic,
                f"could not create the probe topic: {exc}",
                fix=c.remedy + " (or pass --probe-topic with a topic this client may write)",
            )
            return
    try:
        _probe_round_trip(run, topic)
    finally:
        if created:
            try:
                _result(run.admin.delete_topics([topic], request_timeout=run.timeout)[topic], 10)
            except KafkaException:
                run.add("probe", Severity.INFO, topic, "could not delete the probe topic")


def _probe_partitions(run: _Run, topic: str) -> list[int]:
    """The partitions of ``topic`` (each gets probe messages), [] when it cannot be told
    (the produce then fails with the broker's reason, reported as such)."""
    assert run.admin is not None
    try:
        meta = run.admin.list_topics(topic=topic, timeout=run.timeout).topics.get(topic)
    except KafkaException:
        return []
    if meta is None or meta.error is not None:
        return []
    return sorted(meta.partitions)


def _probe_round_trip(run: _Run, topic: str) -> None:
    conf = dict(_admin_conf(run))
    conf.update({"acks": "all", "enable.idempotence": True, "linger.ms": 0})
    producer = Producer(conf)
    latencies: list[float] = []
    stamps: list[tuple[float, float, int]] = []  # (sent, acknowledged, LogAppendTime ms)
    failures: list[str] = []
    # Each message goes to an explicit partition, round robin, and is read back at the
    # offset its acknowledgement gave: every partition's leader is probed, and a
    # multi-partition --probe-topic is not read where nothing was written (issue 35 #12).
    partitions = _probe_partitions(run, topic)
    written: dict[int, int] = {}  # partition -> first offset acknowledged there
    marker = uuid.uuid4().hex
    deadline = time.monotonic() + max(run.timeout, 10.0)
    for i in range(_PROBE_MESSAGES):
        sent = time.time()
        box: dict[str, Any] = {}

        def report(err: KafkaError | None, msg: Any, box: dict[str, Any] = box) -> None:
            box["err"], box["msg"], box["at"] = err, msg, time.time()

        producer.produce(
            topic,
            value=f"{marker}:{i}".encode(),
            partition=partitions[i % len(partitions)] if partitions else _ANY_PARTITION,
            on_delivery=report,
        )
        while "at" not in box and time.monotonic() < deadline:
            producer.poll(0.1)
        if "at" not in box:
            failures.append(f"message {i}: no acknowledgement before the deadline")
            break
        if box["err"] is not None:
            failures.append(f"message {i}: {box['err'].name()}")
            continue
        latencies.append((box["at"] - sent) * 1000)
        acked = box["msg"]
        written.setdefault(acked.partition(), acked.offset())
        kind, ts = acked.timestamp()
        if kind == TIMESTAMP_LOG_APPEND_TIME:
            stamps.append((sent, box["at"], ts))
    producer.flush(5)
    if failures:
        err_name = failures[0].split(": ", 1)[-1]
        c = classify(getattr(KafkaError, err_name, -1)) if err_name.isupper() else None
        run.add(
            "probe",
            Severity.ERROR,
            topic,
            f"acks=all produce failed: {'; '.join(failures[:3])}",
            symptom="produce errors",
            fix=c.remedy if c is not None else "see the topics and connectivity findings",
        )
        return
    consumed = _probe_consume(run, topic, marker, written, len(latencies))
    figures = {
        "produce_ack_ms_p50": round(_pct(latencies, 0.5), 2),
        "produce_ack_ms_p95": round(_pct(latencies, 0.95), 2),
        "produce_ack_ms_max": round(max(latencies), 2),
        "consumed": consumed,
    }
    run.report.figures["probe"] = figures
    if consumed < len(latencies):
        run.add(
            "probe",
            Severity.ERROR,
            topic,
            f"read back {consumed} of {len(latencies)} acknowledged probe messages",
            symptom="consumer cannot fetch",
            fix="check fetch permissions (ACL Read) and the consumer-side connectivity",
        )
    else:
        run.add(
            "probe",
            Severity.OK,
            topic,
            f"acks=all round trip: p50 {figures['produce_ack_ms_p50']} ms, p95 "
            f"{figures['produce_ack_ms_p95']} ms; {consumed} read back",
        )
    if stamps:
        skew, bounds = clock_skew(stamps)
        run.report.figures["clock_skew_ms"] = round(skew, 1)
        if bounds is not None:
            run.report.figures["clock_skew_bounds_ms"] = [round(b, 1) for b in bounds]
        if abs(skew) > CLOCK_SKEW_WARN_MS:
            run.add(
                "clock",
                Severity.WARNING,
                "clock skew",
                f"broker clock is at least {skew / 1000:+.1f} s from this machine's",
                symptom="clock drift between clients and brokers",
                causes=("NTP not running on the client or the brokers",),
                fix="run NTP (chrony) everywhere; CreateTime timestamps from a skewed client "
                "land in the future or past and disturb retention",
            )
        else:
            seen = (
                f"between {bounds[0]:+.0f} and {bounds[1]:+.0f} ms"
                if bounds is not None
                else f"{skew:+.0f} ms (a clock stepped during the probe)"
            )
            run.add("clock", Severity.OK, "clock skew", f"broker clock {seen} from this machine's")


def clock_skew(
    stamps: Sequence[tuple[float, float, int]],
) -> tuple[float, tuple[float, float] | None]:
    """The broker's clock minus this machine's, in ms, from ``(sent, acknowledged,
    LogAppendTime)`` triples (local seconds, local seconds, broker ms).

    The broker appended each record between its send and its acknowledgement, so each triple
    bounds the skew to ``[LogAppendTime - ack, LogAppendTime - send]``; the probe's messages
    together bound it to the intersection. The skew returned is the point of that interval
    nearest zero: what the measurement proves, which a slow round trip (replication under
    load, a connection set up by the first message) widens but never inflates. The midpoint
    ``(send + ack) / 2`` would read a 3 s acknowledgement as 1.5 s of skew. Returns the bounds
    too; if the intervals do not meet (a clock stepped during the probe), the median of the
    midpoints and no bounds.
    """
    if not stamps:
        raise ValueError("clock_skew needs at least one (sent, acknowledged, timestamp) triple")
    lo = max(ts - at * 1000 for _, at, ts in stamps) - 1  # -1/+1: LogAppendTime is whole ms
    hi = min(ts - sent * 1000 for sent, _, ts in stamps) + 1
    if lo > hi:
        return statistics.median(ts - (sent + at) / 2 * 1000 for sent, at, ts in stamps), None
    return min(max(0.0, lo), hi), (lo, hi)


def _probe_consume(
    run: _Run, topic: str, marker: str, written: Mapping[int, int], expected: int
) -> int:
    """How many of the ``expected`` probe messages come back, reading each partition from
    the first offset acknowledged there."""
    conf = dict(_admin_conf(run))
    conf.update(
        {
            "group.id": f"kresilient-doctor-{marker[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer = Consumer(conf)
    got = 0
    deadline = time.monotonic() + max(run.timeout, 10.0)
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in sorted(written.items())])
        while got < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            if (msg.value() or b"").startswith(marker.encode()):
                got += 1
    finally:
        consumer.close()
    return got


def _guarded(run: _Run, section: str, check: Callable[[], _T]) -> _T | None:
    """``check()``; whatever it raises becomes an ERROR finding of its section naming the
    check and the reason, so one failed request never costs the rest of the report.

    Only :class:`ConfigError` (unusable input: a malformed bootstrap list, a config
    librdkafka refuses as a whole) ends the diagnosis. A connectivity check that failed
    this way leaves the cluster unreachable (exit 2): nothing after it can run.
    """
    try:
        return check()
    except ConfigError:
        raise
    except Exception as exc:  # every failure is a finding; never a traceback or a bare exit
        err = _kafka_error(exc)
        reason = err.str() if err is not None else (str(exc) or "no reason given")
        run.add(
            section,
            Severity.ERROR,
            f"{section} check",
            f"the {section} check failed: {type(exc).__name__}: {reason}",
            symptom="the doctor could not complete this check",
            causes=("a request timed out (a hung or overloaded broker)", "a client error"),
            fix="run again with a larger --timeout; if it persists, check the brokers' health "
            "and this client's permissions",
        )
        if section == "connectivity":
            run.report.reachable = False
        return None


def diagnose(
    config: Mapping[str, Any],
    *,
    topics: Iterable[str] = (),
    groups: Iterable[str] = (),
    probe: bool = True,
    probe_topic: str | None = None,
    timeout: float = 10.0,
    disk_threshold: float = DISK_USAGE_THRESHOLD,
    future_tolerance_ms: int = FUTURE_TOLERANCE_MS,
    config_text: str | None = None,
    config_path: str | None = None,
) -> DoctorReport:
    """Check the path between a client with ``config`` and its cluster; never raises for
    what it finds (only :class:`~kresilient.errors.ConfigError` for unusable input)."""
    if not config.get("bootstrap.servers"):
        raise ConfigError("bootstrap.servers is required", key="bootstrap.servers")
    if not timeout > 0:  # also refuses NaN
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout}", key=None)
    start = time.monotonic()
    topics, groups = tuple(topics), tuple(groups)
    run = _Run(
        config=dict(config),
        timeout=timeout,
        topics=topics,
        groups=groups,
        probe=probe,
        probe_topic=probe_topic,
        disk_threshold=disk_threshold,
        future_tolerance_ms=future_tolerance_ms,
        report=DoctorReport(
            bootstrap_servers=str(config["bootstrap.servers"]), topics=topics, groups=groups
        ),
        redact=Redactor.for_config(config),
    )
    _guarded(run, "config", lambda: _check_config(run, config_text, config_path))
    if _guarded(run, "connectivity", lambda: _check_connectivity(run)):
        _guarded(run, "metadata", lambda: _check_metadata(run))
        _guarded(run, "topics", lambda: _check_topics(run))
        _guarded(run, "groups", lambda: _check_groups(run))
        if probe:
            _guarded(run, "probe", lambda: _check_probe(run))
    run.report.seconds = round(time.monotonic() - start, 2)
    return run.report


# --------------------------------------------------------------------------- output

_MARK: Final = {
    Severity.OK: "ok",
    Severity.INFO: "info",
    Severity.WARNING: "WARN",
    Severity.ERROR: "FAIL",
}


def _asked_for(report: DoctorReport, f: DoctorFinding) -> bool:
    """A finding about a topic or group named in ``--topic``/``--group``."""
    return (f.section == "topics" and f.subject in report.topics) or (
        f.section == "groups" and f.subject in report.groups
    )


def render_text(report: DoctorReport, out: TextIO, *, verbose: bool = False) -> None:
    """A report for people: one line per finding, then the symptom, causes and fix.

    Passed checks are left out (``verbose`` shows them) except the probe's and the clock's
    figures and the lines of the topics and groups asked for: a user who asked about
    ``orders`` and ``billing`` reads their state even when it is healthy (before issue 36,
    only ``--verbose`` showed it, so a healthy topic looked unchecked)."""
    out.write(f"kresilient doctor: {report.bootstrap_servers}\n")
    section = None
    for f in report.findings:
        shown = verbose or f.section in ("probe", "clock") or _asked_for(report, f)
        if f.severity == Severity.OK and not shown:
            continue
        if f.section != section:
            section = f.section
            out.write(f"\n[{section}]\n")
        out.write(f"  {_MARK[f.severity]:<4} {f.subject}: {f.message}\n")
        if f.symptom:
            out.write(f"       symptom: {f.symptom}\n")
        if f.causes:
            out.write(f"       likely causes: {'; '.join(f.causes)}\n")
        if f.fix:
            out.write(f"       fix: {f.fix}\n")
    counts = {s: sum(1 for f in report.findings if f.severity == s) for s in Severity}
    verdict = (
        "unreachable"
        if not report.reachable
        else ("unhealthy" if counts[Severity.ERROR] else "healthy")
    )
    out.write(
        f"\n{verdict}: {counts[Severity.ERROR]} error(s), {counts[Severity.WARNING]} "
        f"warning(s), {counts[Severity.OK]} check(s) passed in {report.seconds:.1f}s\n"
    )


def render_json(report: DoctorReport, out: TextIO) -> None:
    """The same report as one JSON document (stable keys, for scripts)."""
    json.dump(
        {
            "bootstrap_servers": report.bootstrap_servers,
            "reachable": report.reachable,
            "seconds": report.seconds,
            "exit_code": report.exit_code(),
            "figures": report.figures,
            "findings": [f.as_dict() for f in report.findings],
        },
        out,
        indent=2,
        sort_keys=True,
    )
    out.write("\n")


# --------------------------------------------------------------------------- CLI


def _properties(args: argparse.Namespace) -> tuple[dict[str, Any], str | None]:
    """The client config of ``--command-config`` then ``-X`` (``-X`` wins, as in the other
    commands), and the file's text for the config check."""
    config: dict[str, Any] = {}
    text = None
    if args.command_config:
        config, text = read_command_config(args.command_config)
    for item in getattr(args, "property", None) or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-X expects KEY=VALUE, got {item!r}", key=key.strip() or None)
        config[key.strip()] = value.strip()
    return config, text


def main(args: argparse.Namespace) -> int:
    """Run ``kresilient doctor``; 0 healthy, 1 findings, 2 unreachable or bad input."""
    try:
        config, text = _properties(args)
        config["bootstrap.servers"] = args.bootstrap_servers
        report = diagnose(
            config,
            topics=args.topic,
            groups=args.group,
            probe=not args.no_probe,
            probe_topic=args.probe_topic,
            timeout=args.timeout,
            disk_threshold=args.disk_threshold,
            config_text=text,
            config_path=args.command_config,
        )
    except ConfigError as exc:
        print(f"kresilient doctor: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the --command-config file: its name and why, not its content
        print(f"kresilient doctor: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    if args.format == "json":
        render_json(report, sys.stdout)
    else:
        render_text(report, sys.stdout, verbose=args.verbose)
    fail_on = Severity.WARNING if args.fail_on == "warning" else Severity.ERROR
    return report.exit_code(fail_on)
