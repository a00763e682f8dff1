"""``kresilient audit``: check a live cluster through the Admin API.

Two steps, so the checks are testable without a cluster: :func:`take_snapshot` reads
metadata, configs, racks and group offsets into a :class:`ClusterSnapshot`;
:func:`check_snapshot` turns a snapshot into findings (the same :class:`Finding` as lint,
the same output formats and exit codes). Topic and broker durability reuse the lint rules
(KR042-KR047); partition health, leader balance, racks and lag have their own (KR060-KR065).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kresilient.lint.engine import unit_findings
from kresilient.lint.model import ConfigUnit, Entry, Finding
from kresilient.lint.settings import Settings

__all__ = [
    "AuditOptions",
    "ClusterSnapshot",
    "PartitionState",
    "audit",
    "check_snapshot",
    "take_snapshot",
]

_TOPIC_RULES = frozenset({"KR042", "KR043", "KR044", "KR045"})
_BROKER_RULES = frozenset({"KR042", "KR043", "KR044", "KR045", "KR046", "KR047", "KR048"})
_TOPIC_KEYS = ("min.insync.replicas", "unclean.leader.election.enable", "max.message.bytes")
_BROKER_KEYS = (
    "default.replication.factor",
    "offsets.topic.replication.factor",
    "transaction.state.log.replication.factor",
    "min.insync.replicas",
    "transaction.state.log.min.isr",
    "unclean.leader.election.enable",
    "auto.leader.rebalance.enable",
    "broker.rack",
    "message.max.bytes",
    "socket.request.max.bytes",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditOptions:
    """What to audit: topic and group filters (empty = all), lag threshold, timeout (s)."""

    topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    lag_threshold: int = 1000
    include_internal: bool = False
    timeout: float = 15.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PartitionState:
    """One partition's leader (-1 = none), replicas (preferred first) and ISR."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(kw_only=True, slots=True)
class ClusterSnapshot:
    """Everything the checks need, read once from the cluster."""

    bootstrap: str
    racks: dict[int, str | None] = field(default_factory=dict)
    partitions: list[PartitionState] = field(default_factory=list)
    topic_configs: dict[str, dict[str, str | None]] = field(default_factory=dict)
    broker_configs: dict[int, dict[str, str | None]] = field(default_factory=dict)
    group_lag: dict[str, dict[str, int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- checks


def _uri(snap: ClusterSnapshot, *parts: object) -> str:
    host = snap.bootstrap.split(",")[0].strip()
    return "/".join([f"kafka://{host}", *(str(p) for p in parts)])


def _finding(settings: Settings, rule: str, path: str, message: str) -> Finding | None:
    if not settings.enabled(rule):
        return None
    return Finding(
        rule=rule, severity=settings.severity_of(rule), path=path, line=0, col=0, message=message
    )


def _config_unit(path: str, kind: str, values: Mapping[str, str | None], name: str) -> ConfigUnit:
    entries = {k: Entry(key=k, value=v, line=0, col=0) for k, v in values.items() if v is not None}
    return ConfigUnit(
        path=path,
        line=0,
        col=0,
        entries=entries,
        kind=kind,  # type: ignore[arg-type]
        kind_forced=True,
        name=name,
        source="cluster",
        context={"config_known": True},
    )


def _durability(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding]:
    rf: dict[str, int] = {}
    for p in snap.partitions:
        rf[p.topic] = min(rf.get(p.topic, len(p.replicas)), len(p.replicas))
    for topic in sorted(rf):
        values = {"replication.factor": str(rf[topic]), **snap.topic_configs.get(topic, {})}
        unit = _config_unit(_uri(snap, "topic", topic), "topic", values, topic)
        yield from (f for f in unit_findings(unit, settings) if f.rule in _TOPIC_RULES)
    for broker in sorted(snap.broker_configs):
        values = dict(snap.broker_configs[broker])
        if snap.racks.get(broker):
            values["broker.rack"] = snap.racks[broker]
        unit = _config_unit(_uri(snap, "broker", broker), "broker", values, str(broker))
        yield from (f for f in unit_findings(unit, settings) if f.rule in _BROKER_RULES)


def _partition_health(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    for p in snap.partitions:
        path = _uri(snap, "topic", p.topic, "partition", p.partition)
        if p.leader < 0:
            yield _finding(
                settings,
                "KR061",
                path,
                f"{p.topic}/{p.partition} has no leader (replicas "
                f"{list(p.replicas)}, ISR {list(p.isr)})",
            )
        if len(p.isr) < len(p.replicas):
            missing = sorted(set(p.replicas) - set(p.isr))
            yield _finding(
                settings,
                "KR060",
                path,
                f"{p.topic}/{p.partition} is under-replicated: ISR {list(p.isr)} of "
                f"replicas {list(p.replicas)} (out of sync: {missing})",
            )


def _leader_balance(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    leads: Counter[int] = Counter()
    preferred: Counter[int] = Counter()
    away: dict[int, list[str]] = {}
    for p in snap.partitions:
        if not p.replicas:
            continue
        preferred[p.replicas[0]] += 1
        if p.leader >= 0:
            leads[p.leader] += 1
            if p.leader != p.replicas[0]:
                away.setdefault(p.replicas[0], []).append(f"{p.topic}/{p.partition}")
    for broker in sorted(set(leads) | set(preferred)):
        diff = leads[broker] - preferred[broker]
        if diff == 0 and broker not in away:
            continue
        moved = away.get(broker, [])
        detail = f"; led elsewhere: {', '.join(moved[:5])}" + (" ..." if len(moved) > 5 else "")
        yield _finding(
            settings,
            "KR062",
            _uri(snap, "broker", broker),
            f"broker {broker} leads {leads[broker]} partition(s) but is the preferred "
            f"leader of {preferred[broker]} ({diff:+d})" + (detail if moved else ""),
        )


def _rack_spread(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    if not any(snap.racks.values()):
        return
    for p in snap.partitions:
        racks = [snap.racks.get(r) for r in p.replicas]
        shared = sorted({r for r in racks if r and racks.count(r) > 1})
        if shared:
            yield _finding(
                settings,
                "KR063",
                _uri(snap, "topic", p.topic, "partition", p.partition),
                f"{p.topic}/{p.partition}: replicas {list(p.replicas)} share rack(s) "
                f"{', '.join(shared)}",
            )


def _lag(snap: ClusterSnapshot, settings: Settings, threshold: int) -> Iterator[Finding | None]:
    for group in sorted(snap.group_lag):
        for topic, lag in sorted(snap.group_lag[group].items()):
            if lag > threshold:
                yield _finding(
                    settings,
                    "KR064",
                    _uri(snap, "group", group),
                    f"group {group} lags {lag} message(s) on {topic} (threshold {threshold})",
                )


def check_snapshot(
    snap: ClusterSnapshot, *, options: AuditOptions | None = None, settings: Settings | None = None
) -> list[Finding]:
    """All audit findings for a snapshot (pure: no cluster access)."""
    options = options or AuditOptions()
    settings = settings or Settings()
    findings: list[Finding | None] = [
        _finding(settings, "KR065", _uri(snap), message) for message in snap.errors
    ]
    findings.extend(_durability(snap, settings))
    findings.extend(_partition_health(snap, settings))
    findings.extend(_leader_balance(snap, settings))
    findings.extend(_rack_spread(snap, settings))
    findings.extend(_lag(snap, settings, options.lag_threshold))
    kept = [f for f in findings if f is not None and settings.enabled(f.rule)]
    return sorted(set(kept), key=Finding.sort_key)


# ----------------------------------------------------------------------------- cluster access


def _result(future: Any, timeout: float) -> Any:
    return future.result(timeout=timeout)


def _configs(
    admin: Any, resources: Iterable[Any], keys: Iterable[str], timeout: float
) -> dict[str, dict[str, str | None]]:
    wanted = set(keys)
    out: dict[str, dict[str, str | None]] = {}
    for resource, future in admin.describe_configs(
        list(resources), request_timeout=timeout
    ).items():
        entries = _result(future, timeout)
        out[resource.name] = {k: e.value for k, e in entries.items() if k in wanted}
    return out


def take_snapshot(
    config: Mapping[str, str], options: AuditOptions | None = None
) -> ClusterSnapshot:
    """Read metadata, configs, racks and group lag (errors land in ``snapshot.errors``)."""
    from confluent_kafka import (
        ConsumerGroupTopicPartitions,
        KafkaException,
        TopicPartition,
    )
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._listoffsets import OffsetSpec
    from confluent_kafka.admin._resource import ResourceType

    options = options or AuditOptions()
    conf: dict[str, Any] = {"socket.timeout.ms": int(options.timeout * 1000), **config}
    conf.setdefault("logger", _QuietLogger())
    latest: Any = OffsetSpec.latest  # untyped in confluent-kafka
    snap = ClusterSnapshot(bootstrap=str(config.get("bootstrap.servers", "")))
    t = options.timeout
    try:
        admin = AdminClient(conf)
        metadata = admin.list_topics(timeout=t)
        cluster = _result(admin.describe_cluster(request_timeout=t), t)
        snap.racks = {node.id: node.rack for node in cluster.nodes}
        for name, topic in sorted(metadata.topics.items()):
            internal = name.startswith("__") or name.startswith("_confluent")
            if options.topics and name not in options.topics:
                continue
            if internal and not options.include_internal and not options.topics:
                continue
            if topic.error is not None:
                snap.errors.append(f"topic {name}: {topic.error.str()}")
                continue
            for pid, part in sorted(topic.partitions.items()):
                snap.partitions.append(
                    PartitionState(
                        topic=name,
                        partition=pid,
                        leader=part.leader,
                        replicas=tuple(part.replicas),
                        isr=tuple(part.isrs),
                    )
                )
        topics = sorted({p.topic for p in snap.partitions})
        if topics:
            snap.topic_configs = _configs(
                admin, [ConfigResource(ResourceType.TOPIC, n) for n in topics], _TOPIC_KEYS, t
            )
        for broker in sorted(metadata.brokers):
            got = _configs(
                admin, [ConfigResource(ResourceType.BROKER, str(broker))], _BROKER_KEYS, t
            )
            snap.broker_configs[broker] = got.get(str(broker), {})
        groups = list(options.groups) or sorted(
            g.group_id for g in _result(admin.list_consumer_groups(request_timeout=t), t).valid
        )
        for group in groups:
            request = [ConsumerGroupTopicPartitions(group)]
            committed = _result(
                admin.list_consumer_group_offsets(request, request_timeout=t)[group], t
            )
            parts = [
                tp
                for tp in committed.topic_partitions
                if tp.offset >= 0 and (not options.topics or tp.topic in options.topics)
            ]
            if not parts:
                continue
            ends = admin.list_offsets(
                {TopicPartition(tp.topic, tp.partition): latest() for tp in parts},
                request_timeout=t,
            )
            lag: dict[str, int] = {}
            for tp in parts:
                for key, future in ends.items():
                    if key.topic == tp.topic and key.partition == tp.partition:
                        end = _result(future, t).offset
                        lag[tp.topic] = lag.get(tp.topic, 0) + max(end - tp.offset, 0)
            snap.group_lag[group] = lag
    except (KafkaException, TimeoutError, OSError, ValueError) as exc:
        snap.errors.append(f"admin request failed: {_describe(exc)}")
    return snap


def _describe(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    if err is not None and hasattr(err, "name") and hasattr(err, "str"):
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class _QuietLogger:
    """Swallows librdkafka log lines (connection errors are reported as KR065 instead)."""

    def log(self, *args: object, **kwargs: object) -> None:
        return None


def audit(
    config: Mapping[str, str],
    *,
    options: AuditOptions | None = None,
    settings: Settings | None = None,
) -> list[Finding]:
    """Snapshot the cluster described by ``config`` (a client config) and check it."""
    options = options or AuditOptions()
    snap = take_snapshot(config, options)
    return check_snapshot(snap, options=options, settings=settings)
