"""``kresilient audit``: check a live cluster through the Admin API.

Two steps, so the checks are testable without a cluster: :func:`take_snapshot` reads
metadata, configs, racks and group offsets into a :class:`ClusterSnapshot`;
:func:`check_snapshot` turns a snapshot into findings (the same :class:`Finding` as lint,
the same output formats and exit codes). Topic and broker durability reuse the lint rules
(KR042-KR047); partition health, leader balance, racks and lag have their own (KR060-KR066).

A failure reading one part of the cluster never hides the rest: one offline partition leaves
the lag of every other partition reported (its own lag is reported as unknown, KR066), a
group whose offsets cannot be read is named, and only a cluster that cannot be reached at
all is KR065 (exit code 2). The lag is computed in time linear in the committed partitions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from kresilient.errors import KafkaClientError
from kresilient.lint.connect import ConnectionErrors, fetch_metadata, quiet_client_config
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

_LISTED = 5  # partitions named in one KR066 finding; the count covers all
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
    timeout: float = 10.0


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
    """Everything the checks need, read once from the cluster.

    ``group_lag``: group -> topic -> summed lag of the partitions whose lag is known;
    ``lag_unknown``: group -> (topic, partition) -> why its lag could not be computed;
    ``incomplete``: (where, what could not be read) for a part of the audit that failed
    (a group's offsets, a topic's configs); ``errors``: the cluster could not be read at all.
    """

    bootstrap: str
    racks: dict[int, str | None] = field(default_factory=dict)
    partitions: list[PartitionState] = field(default_factory=list)
    topic_configs: dict[str, dict[str, str | None]] = field(default_factory=dict)
    broker_configs: dict[int, dict[str, str | None]] = field(default_factory=dict)
    group_lag: dict[str, dict[str, int]] = field(default_factory=dict)
    lag_unknown: dict[str, dict[tuple[str, int], str]] = field(default_factory=dict)
    incomplete: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
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
        unknown = snap.lag_unknown.get(group, {})
        for topic, lag in sorted(snap.group_lag[group].items()):
            if lag > threshold:
                partial = sum(1 for t, _ in unknown if t == topic)
                yield _finding(
                    settings,
                    "KR064",
                    _uri(snap, "group", group),
                    f"group {group} lags {lag} message(s) on {topic} (threshold {threshold})"
                    + (f"; at least: {partial} partition(s) unknown, see KR066" if partial else ""),
                )
    for group in sorted(snap.lag_unknown):
        parts = sorted(snap.lag_unknown[group].items())
        shown = "; ".join(f"{t}/{p}: {why}" for (t, p), why in parts[:_LISTED])
        more = f"; and {len(parts) - _LISTED} more" if len(parts) > _LISTED else ""
        yield _finding(
            settings,
            "KR066",
            _uri(snap, "group", group),
            f"group {group}: lag unknown on {len(parts)} partition(s): {shown}{more}",
        )


def _incomplete(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    for where, message in snap.incomplete:
        yield _finding(settings, "KR066", _uri(snap, *where), message)


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
    findings.extend(_incomplete(snap, settings))
    kept = [f for f in findings if f is not None and settings.enabled(f.rule)]
    return sorted(set(kept), key=Finding.sort_key)


# ----------------------------------------------------------------------------- cluster access


def _result(future: Any, timeout: float) -> Any:
    return future.result(timeout=timeout)


def _configs(
    admin: Any,
    resources: Iterable[Any],
    keys: Iterable[str],
    timeout: float,
    snap: ClusterSnapshot,
    kind: str,
) -> dict[str, dict[str, str | None]]:
    """The ``keys`` of each resource; a resource that fails is named in ``snap.incomplete``."""
    wanted = set(keys)
    out: dict[str, dict[str, str | None]] = {}
    resources = list(resources)
    try:
        requests = admin.describe_configs(resources, request_timeout=timeout)
    except _ERRORS as exc:
        names = ", ".join(r.name for r in resources)
        snap.incomplete.append(((kind,), f"{kind} configs of {names} not read: {_describe(exc)}"))
        return out
    for resource, future in requests.items():
        try:
            entries = _result(future, timeout)
        except _ERRORS as exc:
            snap.incomplete.append(
                (
                    (kind, resource.name),
                    f"{kind} {resource.name}: configs not read: "
                    f"{_describe(exc)}; its durability checks were skipped",
                )
            )
            continue
        out[resource.name] = {k: e.value for k, e in entries.items() if k in wanted}
    return out


def take_snapshot(
    config: Mapping[str, str], options: AuditOptions | None = None, *, admin: Any = None
) -> ClusterSnapshot:
    """Read metadata, configs, racks and group lag.

    Never raises for cluster trouble: a cluster that cannot be reached lands in
    ``snapshot.errors`` (one line naming each host and why), a part that cannot be read in
    ``snapshot.incomplete``, a partition whose lag cannot be computed in
    ``snapshot.lag_unknown``; everything else is still read. ``admin``: an
    ``AdminClient``-like object to use instead of building one from ``config``.
    """
    options = options or AuditOptions()
    snap = ClusterSnapshot(bootstrap=str(config.get("bootstrap.servers", "")))
    t = options.timeout
    errors = ConnectionErrors(snap.bootstrap)
    if admin is None:
        conf = {"socket.timeout.ms": max(1000, int(t * 1000)), **config}
        try:
            admin = AdminClient(quiet_client_config(conf, errors, t))
        except _ERRORS as exc:  # a bad client property
            snap.errors.append(f"admin client not created: {_describe(exc)}")
            return snap
    try:
        metadata = fetch_metadata(admin, errors, t)
    except KafkaClientError as exc:
        snap.errors.append(exc.message)
        return snap
    except _ERRORS as exc:
        snap.errors.append(f"admin request failed: {_describe(exc)}")
        return snap
    try:
        cluster = _result(admin.describe_cluster(request_timeout=t), t)
        snap.racks = {node.id: node.rack for node in cluster.nodes}
    except _ERRORS as exc:
        snap.incomplete.append(((), f"racks not read: {_describe(exc)}"))
    offline: dict[tuple[str, int], str] = {}
    for name, topic in sorted(metadata.topics.items()):
        for pid, part in topic.partitions.items():
            if part.leader < 0:
                offline[(name, pid)] = "partition offline (no leader)"
        internal = name.startswith("__") or name.startswith("_confluent")
        if options.topics and name not in options.topics:
            continue
        if internal and not options.include_internal and not options.topics:
            continue
        if topic.error is not None:
            snap.incomplete.append((("topic", name), f"topic {name}: {topic.error.str()}"))
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
            admin,
            [ConfigResource(ResourceType.TOPIC, n) for n in topics],
            _TOPIC_KEYS,
            t,
            snap,
            "topic",
        )
    for broker in sorted(metadata.brokers):
        got = _configs(
            admin,
            [ConfigResource(ResourceType.BROKER, str(broker))],
            _BROKER_KEYS,
            t,
            snap,
            "broker",
        )
        if str(broker) in got:
            snap.broker_configs[broker] = got[str(broker)]
    _group_lag(admin, snap, options, set(metadata.topics), offline)
    return snap


def _group_lag(
    admin: Any,
    snap: ClusterSnapshot,
    options: AuditOptions,
    existing: set[str],
    offline: Mapping[tuple[str, int], str],
) -> None:
    """Fill ``snap.group_lag``/``lag_unknown``, per group and per partition, in one pass."""
    t = options.timeout
    if options.groups:
        groups = list(options.groups)
    else:
        try:
            listed = _result(admin.list_consumer_groups(request_timeout=t), t)
        except _ERRORS as exc:
            snap.incomplete.append((("group",), f"consumer groups not listed: {_describe(exc)}"))
            return
        groups = sorted(g.group_id for g in listed.valid)
    # Ask for every group's offsets first, then wait: the requests run concurrently.
    requests: dict[str, Any] = {}
    for group in groups:
        try:
            requests[group] = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=t
            )[group]
        except _ERRORS as exc:
            requests[group] = exc
    committed: dict[str, list[tuple[str, int, int]]] = {}
    for group, future in requests.items():
        try:
            if isinstance(future, BaseException):
                raise future
            result = _result(future, t)
        except _ERRORS as exc:
            snap.incomplete.append(
                (("group", group), f"group {group}: committed offsets not read: {_describe(exc)}")
            )
            continue
        committed[group] = [
            (tp.topic, tp.partition, tp.offset)
            for tp in result.topic_partitions
            if tp.offset >= 0 and (not options.topics or tp.topic in options.topics)
        ]
    wanted: set[tuple[str, int]] = set()
    for parts in committed.values():
        for topic, partition, _ in parts:
            if topic in existing and (topic, partition) not in offline:
                wanted.add((topic, partition))
    latest: Any = OffsetSpec.latest  # untyped in confluent-kafka
    futures: dict[tuple[str, int], Any] = {}
    failed: dict[tuple[str, int], str] = {}
    if wanted:
        spec = {TopicPartition(tp, p): latest() for tp, p in sorted(wanted)}
        # Keyed by (topic, partition) once: each lookup below is O(1), not a scan of all.
        try:
            futures = {
                (k.topic, k.partition): f
                for k, f in admin.list_offsets(spec, request_timeout=t).items()
            }
        except _ERRORS as exc:
            failed = dict.fromkeys(wanted, f"end offset not read: {_describe(exc)}")
    ends: dict[tuple[str, int], int] = {}
    for key, future in futures.items():
        try:
            ends[key] = int(_result(future, t).offset)
        except _ERRORS as exc:
            failed[key] = f"end offset not read: {_describe(exc)}"
    for group, parts in committed.items():
        lag: dict[str, int] = {}
        unknown: dict[tuple[str, int], str] = {}
        for topic, partition, offset in parts:
            key = (topic, partition)
            end = ends.get(key)
            if end is None:
                if topic not in existing:
                    unknown[key] = "topic does not exist"
                else:
                    unknown[key] = offline.get(key) or failed.get(key, "end offset not read")
                continue
            lag[topic] = lag.get(topic, 0) + max(end - offset, 0)
        if lag:
            snap.group_lag[group] = lag
        if unknown:
            snap.lag_unknown[group] = unknown


def _describe(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    if err is not None and hasattr(err, "name") and hasattr(err, "str"):
        return f"{err.name()}: {err.str()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# What a failed admin request raises (a future's result: KafkaException or TimeoutError).
_ERRORS: tuple[type[BaseException], ...] = (
    KafkaException,
    TimeoutError,
    OSError,
    ValueError,
    TypeError,
)


def audit(
    config: Mapping[str, str],
    *,
    options: AuditOptions | None = None,
    settings: Settings | None = None,
    admin: Any = None,
) -> list[Finding]:
    """Snapshot the cluster described by ``config`` (a client config) and check it
    (``admin``: see :func:`take_snapshot`)."""
    options = options or AuditOptions()
    snap = take_snapshot(config, options, admin=admin)
    return check_snapshot(snap, options=options, settings=settings)
