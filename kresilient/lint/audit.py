"""``kresilient audit``: check a live cluster through the Admin API.

Two steps, so the checks are testable without a cluster: :func:`take_snapshot` reads
metadata, configs, racks and group offsets into a :class:`ClusterSnapshot`;
:func:`check_snapshot` turns a snapshot into findings (the same :class:`Finding` as lint,
the same output formats and exit codes). Topic and broker durability reuse the lint rules
(KR042-KR047); partition health, leader balance, racks and lag have their own (KR060-KR066);
the troubleshooting guides' cluster-side symptoms have KR067-KR070: log-dir usage per broker,
records timestamped in the future, groups whose offsets may expire, and topics that accept
far-future timestamps. The cluster facts the Admin API does not hand out directly (log dirs,
max timestamps, a group's last committed record) are read by :mod:`kresilient.clusterinfo`,
which ``kresilient doctor`` shares.

Followers lagging behind the high watermark are NOT observable through confluent-kafka's
Admin API: it exposes each partition's ISR, not a follower's log end offset. A follower that
falls behind for longer than ``replica.lag.time.max.ms`` leaves the ISR and is reported as an
under-replicated partition (KR060) naming the broker; a lag shorter than that is visible only
in the broker's JMX metrics (``kafka.server:type=ReplicaFetcherManager,name=MaxLag``).

A failure reading one part of the cluster never hides the rest: one offline partition leaves
the lag of every other partition reported (its own lag is reported as unknown, KR066), a
group whose offsets cannot be read is named, and only a cluster that cannot be reached at
all is KR065 (exit code 2). The lag is computed in time linear in the committed partitions.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)

from kresilient.clusterinfo import (
    DISK_USAGE_THRESHOLD,
    FUTURE_TOLERANCE_MS,
    LOG_DIR_ERRORS,
    LogDir,
    committed_offsets,
    committed_record_timestamps,
    describe_log_dirs,
    max_timestamps,
    permissive_future_bound,
)
from kresilient.errors import KafkaClientError
from kresilient.lint.connect import ConnectionErrors, fetch_metadata, quiet_client_config
from kresilient.lint.engine import unit_findings
from kresilient.lint.model import ConfigUnit, Entry, Finding
from kresilient.lint.model import Severity as _Sev
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
_TOPIC_KEYS = (
    "min.insync.replicas",
    "unclean.leader.election.enable",
    "max.message.bytes",
    "message.timestamp.type",
    "message.timestamp.after.max.ms",
)
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
    "offsets.retention.minutes",
    "offsets.retention.check.interval.ms",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class AuditOptions:
    """What to audit: topic and group filters (empty = all), lag threshold, timeout (s),
    log-dir usage threshold (KR067) and future-timestamp tolerance (KR068)."""

    topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    lag_threshold: int = 1000
    include_internal: bool = False
    timeout: float = 10.0
    #: log-dir usage (0-1) at or above which KR067 reports a broker's log dir; None: log
    #: dirs are not read at all
    disk_threshold: float | None = DISK_USAGE_THRESHOLD
    #: how far (ms) a record's timestamp may be ahead of this machine's clock before KR068
    future_tolerance_ms: int = FUTURE_TOLERANCE_MS


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
    ``log_dirs``: broker -> its log dirs (KR067); ``max_timestamps``: (topic, partition) ->
    largest record timestamp, compared with ``now_ms`` (KR068); ``idle_ms``: empty group ->
    age of the newest record it committed past, the estimate of its idle time (KR069);
    ``no_offsets``: groups asked for by name that have no committed offset (KR069);
    ``notes``: (rule, where, what) a check could not look at and why, reported at info level;
    ``committed``: group -> (topic, partition, committed offset) of the audited topics.
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
    log_dirs: dict[int, list[LogDir]] = field(default_factory=dict)
    max_timestamps: dict[tuple[str, int], int] = field(default_factory=dict)
    now_ms: int = 0
    idle_ms: dict[str, int] = field(default_factory=dict)
    no_offsets: list[str] = field(default_factory=list)
    notes: list[tuple[str, tuple[str, ...], str]] = field(default_factory=list)
    committed: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)

    def offsets_retention_ms(self) -> int | None:
        """The smallest ``offsets.retention.minutes`` of the brokers read, in ms."""
        values = [
            int(v)
            for conf in self.broker_configs.values()
            if (v := conf.get("offsets.retention.minutes")) is not None and v.isdigit()
        ]
        return min(values) * 60_000 if values else None


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


def _log_dir_usage(
    snap: ClusterSnapshot, settings: Settings, threshold: float
) -> Iterator[Finding | None]:
    for broker in sorted(snap.log_dirs):
        for d in snap.log_dirs[broker]:
            used = d.used
            if used is None or used < threshold:
                continue
            yield _finding(
                settings,
                "KR067",
                _uri(snap, "broker", broker, "logdir") + d.path,
                f"broker {broker}: log dir {d.path} is {used:.0%} full "
                f"({d.usable_bytes / 2**30:.1f} GiB free of {d.total_bytes / 2**30:.1f} GiB; "
                f"threshold {threshold:.0%}). Symptom: disk exhaustion (the broker stops "
                "appending, then its partitions go offline). Likely: retention longer than "
                "the disk allows, or segments that never delete (future timestamps, KR068). "
                "Fix: add disk or shorten retention.ms/retention.bytes",
            )


def _future_timestamps(
    snap: ClusterSnapshot, settings: Settings, tolerance_ms: int
) -> Iterator[Finding | None]:
    ahead: dict[str, list[tuple[int, int]]] = {}
    for (topic, partition), ts in sorted(snap.max_timestamps.items()):
        if ts > snap.now_ms + tolerance_ms:
            ahead.setdefault(topic, []).append((partition, ts - snap.now_ms))
    for topic, parts in sorted(ahead.items()):
        worst = max(ms for _, ms in parts)
        kind = snap.topic_configs.get(topic, {}).get("message.timestamp.type") or "?"
        yield _finding(
            settings,
            "KR068",
            _uri(snap, "topic", topic),
            f"{topic}: {len(parts)} partition(s) {[p for p, _ in parts][:_LISTED]} hold a "
            f"record timestamped up to {worst / 3_600_000:.1f} h in the future "
            f"(message.timestamp.type={kind}, tolerance {tolerance_ms / 3_600_000:g} h). "
            "Symptom: segments never deleted, disk exhaustion. Likely: a producer clock "
            "ahead (advanced during testing) or an application setting timestamps. Fix: "
            "correct the producer's clock, bound message.timestamp.after.max.ms or use "
            "LogAppendTime, delete the records once consumed",
        )


def _offset_expiry(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    retention = snap.offsets_retention_ms()
    minutes = f"{retention // 60_000}" if retention is not None else "?"
    for group in sorted(snap.no_offsets):
        yield _finding(
            settings,
            "KR069",
            _uri(snap, "group", group),
            f"group {group} has no committed offset: its offsets expired "
            f"(offsets.retention.minutes={minutes} without members) or it never committed. "
            "Symptom: offset expiration, the next consumer re-reads everything or skips to "
            "latest (auto.offset.reset). Fix: check auto.offset.reset, raise "
            "offsets.retention.minutes, or reset the group's offsets explicitly",
        )
    if retention is None:
        return
    interval = min(
        (
            int(v)
            for conf in snap.broker_configs.values()
            if (v := conf.get("offsets.retention.check.interval.ms")) is not None and v.isdigit()
        ),
        default=600_000,
    )
    for group, idle in sorted(snap.idle_ms.items()):
        # Idle longer than the retention (plus one expiry sweep) yet still holding offsets:
        # the estimate is refuted (records with old producer timestamps), the group committed
        # later than it says. Nothing is claimed rather than a false alarm.
        if idle <= retention / 2 or idle > retention + interval:
            continue
        yield _finding(
            settings,
            "KR069",
            _uri(snap, "group", group),
            f"group {group} has no members and its newest committed record is "
            f"{idle / 60_000:.0f} min old, offsets.retention.minutes={minutes}: its offsets "
            "are at risk of expiry. Symptom: offset expiration (re-read everything or skip "
            "to latest on restart). Likely: a stopped or renamed consumer service. Fix: "
            "restart a consumer of the group before the retention passes, or raise "
            "offsets.retention.minutes",
        )


def _timestamp_settings(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    for topic in sorted(snap.topic_configs):
        after = permissive_future_bound(snap.topic_configs[topic])
        if after is None:
            continue
        yield _finding(
            settings,
            "KR070",
            _uri(snap, "topic", topic),
            f"{topic}: message.timestamp.type=CreateTime with "
            f"message.timestamp.after.max.ms={after} ({after / 86_400_000:.1f} days): records "
            "stamped far in the future are accepted. Symptom: future timestamps stall "
            "retention (disk exhaustion, KR068). Fix: message.timestamp.after.max.ms=3600000 "
            "or message.timestamp.type=LogAppendTime",
        )


def _incomplete(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    for where, message in snap.incomplete:
        yield _finding(settings, "KR066", _uri(snap, *where), message)


def _notes(snap: ClusterSnapshot, settings: Settings) -> Iterator[Finding | None]:
    # A check that cannot run here is said at info level: it must not fail the audit, and
    # must not pass unnoticed either.
    for rule, where, message in snap.notes:
        if settings.enabled(rule):
            yield Finding(
                rule=rule,
                severity=_Sev.INFO,
                path=_uri(snap, *where),
                line=0,
                col=0,
                message=message,
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
    if options.disk_threshold is not None:
        findings.extend(_log_dir_usage(snap, settings, options.disk_threshold))
    findings.extend(_future_timestamps(snap, settings, options.future_tolerance_ms))
    findings.extend(_offset_expiry(snap, settings))
    findings.extend(_timestamp_settings(snap, settings))
    findings.extend(_incomplete(snap, settings))
    findings.extend(_notes(snap, settings))
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
    snap = ClusterSnapshot(
        bootstrap=str(config.get("bootstrap.servers", "")), now_ms=int(time.time() * 1000)
    )
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
    client_config = quiet_client_config(
        {"socket.timeout.ms": max(1000, int(t * 1000)), **config},
        ConnectionErrors(snap.bootstrap),
        t,
    )
    _group_lag(admin, client_config, snap, options, set(metadata.topics), offline)
    _max_timestamps(admin, snap, t)
    if options.disk_threshold is not None:
        _log_dirs(config, snap, metadata, t)
    _idle_groups(admin, config, snap, options)
    return snap


def _max_timestamps(admin: Any, snap: ClusterSnapshot, timeout: float) -> None:
    """Fill ``snap.max_timestamps`` for the audited partitions that have a leader."""
    online = [(p.topic, p.partition) for p in snap.partitions if p.leader >= 0]
    found, failed = max_timestamps(admin, online, timeout)
    snap.max_timestamps = found
    for (topic, partition), why in sorted(failed.items()):
        snap.incomplete.append(
            (
                ("topic", topic, "partition", str(partition)),
                f"{topic}/{partition}: max timestamp not read ({why}); KR068 skipped it",
            )
        )


def _log_dirs(config: Mapping[str, str], snap: ClusterSnapshot, metadata: Any, t: float) -> None:
    """Fill ``snap.log_dirs`` per broker (DescribeLogDirs, PLAINTEXT only)."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    if protocol != "plaintext":
        snap.notes.append(
            (
                "KR067",
                ("broker",),
                f"log-dir usage not checked over {protocol}: confluent-kafka has no "
                "DescribeLogDirs and kresilient sends it over PLAINTEXT only "
                "(use kafka-log-dirs.sh --describe)",
            )
        )
        return
    for broker_id, broker in sorted(metadata.brokers.items()):
        try:
            snap.log_dirs[broker_id] = describe_log_dirs(broker.host, broker.port, min(t, 5.0))
        except LOG_DIR_ERRORS as exc:
            snap.incomplete.append(
                (
                    ("broker", str(broker_id)),
                    f"broker {broker_id}: log dirs not read (DescribeLogDirs: "
                    f"{type(exc).__name__}: {exc}); KR067 skipped it",
                )
            )


def _idle_groups(
    admin: Any, config: Mapping[str, str], snap: ClusterSnapshot, options: AuditOptions
) -> None:
    """Fill ``snap.idle_ms`` for groups without members, when the retention is known."""
    groups = sorted(g for g, parts in snap.committed.items() if parts)
    if snap.offsets_retention_ms() is None or not groups:
        return
    t = options.timeout
    try:
        described = admin.describe_consumer_groups(groups, request_timeout=t)
    except _ERRORS as exc:
        snap.incomplete.append((("group",), f"groups not described: {_describe(exc)}"))
        return
    conf = quiet_client_config(
        {"socket.timeout.ms": max(1000, int(t * 1000)), **config},
        ConnectionErrors(snap.bootstrap),
        t,
    )
    empty = []
    for group, future in sorted(described.items()):
        try:
            state = _result(future, t).state
        except _ERRORS as exc:
            snap.incomplete.append(
                (("group", group), f"group {group}: not described: {_describe(exc)}")
            )
            continue
        if state is not None and state.name == "EMPTY":
            empty.append(group)
    if not empty:
        return
    # One consumer reads the record before every committed offset of every empty group.
    positions = [pos for group in empty for pos in snap.committed[group]]
    try:
        stamps = committed_record_timestamps(conf, positions, min(t, 10.0))
    except _ERRORS as exc:
        snap.incomplete.append((("group",), f"idle time of groups not read: {_describe(exc)}"))
        return
    for group in empty:
        newest = [stamps[pos] for pos in snap.committed[group] if pos in stamps]
        if newest:
            snap.idle_ms[group] = max(snap.now_ms - max(newest), 0)


def _group_lag(
    admin: Any,
    client_config: Mapping[str, Any],
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
    # Each group's committed offsets read by a consumer of the group that never joins it
    # (clusterinfo.committed_offsets), never by AdminClient.list_consumer_group_offsets():
    # that request kills the process with SIGSEGV while a group's coordinator is not ready
    # (librdkafka issue 5040; see kresilient.doctor). Up to 8 groups at once.
    partitions = [
        (p.topic, p.partition)
        for p in snap.partitions
        if not options.topics or p.topic in options.topics
    ]

    def read(group: str) -> list[TopicPartition] | BaseException:
        try:
            return committed_offsets(client_config, group, partitions, t)
        except _ERRORS as exc:
            return exc

    committed: dict[str, list[tuple[str, int, int]]] = {}
    workers = max(1, min(8, len(groups)))
    with concurrent.futures.ThreadPoolExecutor(workers, "kresilient-audit-offsets") as pool:
        results = list(pool.map(read, groups))
    for group, result in zip(groups, results, strict=True):
        if isinstance(result, BaseException):
            snap.incomplete.append(
                (
                    ("group", group),
                    f"group {group}: committed offsets not read: {_describe(result)}",
                )
            )
            continue
        committed[group] = [(tp.topic, tp.partition, tp.offset) for tp in result]
        if options.groups and not result:
            snap.no_offsets.append(group)
    snap.committed = committed
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
