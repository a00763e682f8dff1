"""Client rules: producer durability, consumer commits, rebalances, metadata, partitioner.

Evidence for each rule is librdkafka's own ``rd_kafka_conf_finalize``/``rd_kafka_conf_warn``
(rdkafka_conf.c) or INTRODUCTION.md; see docs/lint-rules.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from kresilient import _catalog as catalog
from kresilient.config import SHARE_CONSUMER_REFUSED
from kresilient.lint.model import TOPIC_SPEC_KEYS, ConfigUnit, Entry, Severity
from kresilient.lint.pyreader import RETRY_TOPICS_ORDERED
from kresilient.lint.registry import (
    Hit,
    client_of,
    effective,
    explicit,
    fmt,
    idempotent,
    is_client,
    number,
    rule,
    truthy,
)

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO
P, C, ANY = ("producer",), ("consumer",), ("producer", "consumer", "admin", "client")
_EAGER = frozenset({"range", "roundrobin"})
#: Rules about librdkafka's own constraints, names or defaults: a config the Java client
#: reads is not judged by them (Java accepts, names or defaults these differently).
LIBRDKAFKA = ("librdkafka",)
_COOPERATIVE = frozenset({"cooperative-sticky"})


@rule(
    "KR001",
    "idempotence-constraints",
    E,
    P,
    "producer durability",
    summary="Idempotent producer with acks, max.in.flight, retries or queuing.strategy "
    "that librdkafka refuses.",
    why="With enable.idempotence=true librdkafka requires acks=all, max.in.flight <= 5, "
    "retries >= 1 and queuing.strategy=fifo; otherwise rd_kafka_new() fails with "
    "_INVALID_ARG (rd_kafka_conf_finalize) and the producer never starts.",
    fix="Remove the conflicting setting (librdkafka picks compatible values) or set "
    "acks=all, max.in.flight<=5, retries>=1.",
)
def _idempotence_constraints(unit: ConfigUnit) -> Iterator[Hit]:
    if not idempotent(unit):
        return
    if client_of(unit) == "java" and not (
        explicit(unit, "enable.idempotence") or explicit(unit, "transactional.id")
    ):
        return  # Java turns its default idempotence off instead of refusing (KAFKA-13673)
    acks = explicit(unit, "acks", "request.required.acks")
    if acks and number(unit, "acks") != -1:
        yield f"{acks.key}={acks.shown} with enable.idempotence=true: must be all", acks
    inflight = explicit(unit, "max.in.flight", "max.in.flight.requests.per.connection")
    if inflight and (number(unit, "max.in.flight") or 0) > 5:
        yield (
            f"{inflight.key}={inflight.shown} with enable.idempotence=true: must be <= 5",
            inflight,
        )
    retries = explicit(unit, "retries", "message.send.max.retries")
    tries = number(unit, "retries")
    if retries and tries is not None and tries < 1:  # (not "or 1": 0 is the case to catch)
        yield f"{retries.key}={retries.shown} with enable.idempotence=true: must be >= 1", retries
    strategy = explicit(unit, "queuing.strategy")
    if strategy and strategy.text.lower() != "fifo":
        yield (
            f"queuing.strategy={strategy.shown} with enable.idempotence=true: must be fifo",
            strategy,
        )


@rule(
    "KR002",
    "linger-exceeds-message-timeout",
    E,
    P,
    "producer durability",
    summary="linger.ms is not below message.timeout.ms.",
    why='librdkafka refuses the config ("message.timeout.ms must be greater than '
    'linger.ms"); even close values leave batches no time to be sent before they expire.',
    fix="Keep linger.ms small (5-100 ms) and message.timeout.ms well above it.",
)
def _linger_vs_timeout(unit: ConfigUnit) -> Iterator[Hit]:
    linger = explicit(unit, "linger.ms", "queue.buffering.max.ms")
    timeout = number(unit, "message.timeout.ms")
    value = number(unit, "linger.ms")
    if linger and timeout and value is not None and value >= timeout:
        yield (
            f"{linger.key}={linger.shown} is not below message.timeout.ms={fmt(timeout)}",
            linger,
        )


@rule(
    "KR003",
    "transactional-constraints",
    E,
    P,
    "producer durability",
    summary="transactional.id with idempotence disabled or timeouts above transaction.timeout.ms.",
    why="Transactions require idempotence; message.timeout.ms above transaction.timeout.ms "
    "or socket.timeout.ms above transaction.timeout.ms+100 is rejected by "
    "rd_kafka_conf_finalize.",
    fix="Drop enable.idempotence=false and keep message.timeout.ms <= transaction.timeout.ms.",
)
def _transactional(unit: ConfigUnit) -> Iterator[Hit]:
    if not explicit(unit, "transactional.id"):
        return
    idem = explicit(unit, "enable.idempotence")
    if idem and truthy(unit, "enable.idempotence") is False:
        yield "transactional.id set with enable.idempotence=false", idem
    txn = number(unit, "transaction.timeout.ms")
    timeout = explicit(unit, "message.timeout.ms", "delivery.timeout.ms")
    value = number(unit, "message.timeout.ms")
    if timeout and txn is not None and value is not None and value > txn:
        yield (f"{timeout.key}={timeout.shown} exceeds transaction.timeout.ms={fmt(txn)}", timeout)
    sock = explicit(unit, "socket.timeout.ms")
    svalue = number(unit, "socket.timeout.ms")
    if sock and txn is not None and svalue is not None and svalue > txn + 100:
        yield f"socket.timeout.ms={sock.shown} exceeds transaction.timeout.ms+100", sock


@rule(
    "KR004",
    "gapless-without-idempotence",
    E,
    P,
    "producer durability",
    summary="enable.gapless.guarantee without enable.idempotence.",
    why="rd_kafka_conf_finalize rejects enable.gapless.guarantee unless idempotence is on.",
    fix="Set enable.idempotence=true or remove enable.gapless.guarantee.",
)
def _gapless(unit: ConfigUnit) -> Iterator[Hit]:
    gapless = explicit(unit, "enable.gapless.guarantee")
    if gapless and truthy(unit, "enable.gapless.guarantee") and idempotent(unit) is not True:
        yield "enable.gapless.guarantee=true without enable.idempotence=true", gapless


#: Kafka Streams settings (StreamsConfig), found beside client keys in Spring Cloud Stream's
#: ``kafka.streams.binder.configuration``: not misspelled client keys.
_STREAMS_KEYS = frozenset(
    {
        "application.id",
        "commit.interval.ms",
        "processing.guarantee",
        "num.stream.threads",
        "num.standby.replicas",
        "state.dir",
        "cache.max.bytes.buffering",
        "statestore.cache.max.bytes",
        "topology.optimization",
        "default.key.serde",
        "default.value.serde",
        "default.deserialization.exception.handler",
        "default.production.exception.handler",
        "replication.factor",
    }
)


def _placement(name: str) -> str:
    if catalog.topic_config(name) is not None:
        return "a topic-level setting"
    if catalog.broker_config(name) is not None:
        return "a broker setting"
    return ""


@rule(
    "KR005",
    "unknown-property",
    E,
    (*ANY, "broker", "topic"),
    "unknown keys",
    summary="Unknown or misspelled configuration key.",
    why="librdkafka fails at construction with 'No such configuration property'; a "
    "misspelled topic config is refused by the broker; a misspelled broker key is ignored "
    "silently, so the setting you meant never applies.",
    fix="Use the suggested spelling, or remove the key (Java-only client keys have no "
    "librdkafka equivalent).",
)
def _unknown(unit: ConfigUnit) -> Iterator[Hit]:
    java = client_of(unit) == "java"
    for key, entry in unit.entries.items():
        if is_client(unit) and java:
            # The Java client passes unknown keys on to plugins (serializers, interceptors,
            # schema registry ...) and only logs them: report a likely misspelling only.
            if catalog.java_client_kinds(key) or "." not in key or key in _STREAMS_KEYS:
                continue  # a Kafka Streams app's file holds StreamsConfig keys too
            close = [
                k
                for kind in ("producer", "consumer", "admin")
                for k in catalog.suggest(key, kind=kind)
            ]
            if close and close[0] != key:
                yield f"unknown Java client property {key!r} (did you mean {close[0]!r}?)", entry
        elif is_client(unit):
            if catalog.lookup(key) is not None or key in _STREAMS_KEYS:
                continue
            hint = catalog.suggest(key)
            if hint:
                yield f"unknown property {key!r} (did you mean {hint[0]!r}?)", entry
            elif catalog.java_client_kinds(key):
                yield (f"{key!r} is a Java client property that librdkafka does not support", entry)
            elif _placement(key):
                yield f"{key!r} is {_placement(key)}, not a client property", entry
            else:
                yield f"unknown property {key!r}", entry
        elif unit.kind == "topic":
            if catalog.topic_config(key) is not None or key in TOPIC_SPEC_KEYS:
                continue
            hint = catalog.suggest(key, kind="topic")
            if hint:
                yield f"unknown topic config {key!r} (did you mean {hint[0]!r}?)", entry
            elif catalog.broker_config(key) is not None:
                yield f"{key!r} is a broker setting, not a topic config", entry
            else:
                yield f"unknown topic config {key!r}", entry
        elif unit.kind == "broker" and catalog.broker_config(key) is None:
            if key.startswith(("listener.name.", "log4j", "confluent.", "ssl.", "sasl.")):
                continue
            if key.startswith("zookeeper."):
                # ZooKeeper-mode keys (removed in Kafka 4.0) are right on a ZooKeeper-mode
                # broker; only a KRaft node (process.roles) ignores them.
                if "process.roles" in unit.entries:
                    yield f"{key!r} is a ZooKeeper-mode setting: a KRaft node ignores it", entry
                continue
            topic_key = catalog.topic_config(key)
            if topic_key is not None and topic_key.synonym:
                yield (
                    f"{key!r} is a topic config; the broker-wide default is {topic_key.synonym!r}",
                    entry,
                )
                continue
            hint = catalog.suggest(key, kind="broker")
            if hint and not key.endswith("." + hint[0]):
                # (a namespaced copy of a real key, strimzi.authorization.ssl.* ..., is a
                # plugin's own option, not a misspelling)
                yield f"unknown broker config {key!r} (did you mean {hint[0]!r}?)", entry


@rule(
    "KR006",
    "acks-zero",
    E,
    P,
    "producer durability",
    summary="acks=0, or an acks value brokers reject.",
    why="With acks=0 the producer never learns whether a write happened: every broker "
    "error, leader change or full disk loses data silently (INTRODUCTION.md recommends "
    "acks=all). Values above 1 are refused by brokers (INVALID_REQUIRED_ACKS).",
    fix="Set acks=all.",
)
def _acks_zero(unit: ConfigUnit) -> Iterator[Hit]:
    acks = explicit(unit, "acks", "request.required.acks")
    value = number(unit, "acks")
    if acks and value == 0:
        yield f"{acks.key}={acks.shown}: writes are never acknowledged", acks
    elif acks and value is not None and value > 1:
        yield f"{acks.key}={acks.shown}: brokers only accept 0, 1 or all", acks


@rule(
    "KR007",
    "acks-one",
    W,
    P,
    "producer durability",
    summary="acks=1 (leader-only durability).",
    why="An acknowledged write lives on the leader only; a leader crash before followers "
    "copy it loses the message although the producer saw success.",
    fix="Set acks=all (with min.insync.replicas=2 on the topic).",
)
def _acks_one(unit: ConfigUnit) -> Iterator[Hit]:
    acks = explicit(unit, "acks", "request.required.acks")
    if number(unit, "acks") == 1 and (acks or unit.get("acks") is None):
        shown = f"{acks.key}={acks.shown}" if acks else "acks is unset (default 1)"
        yield f"{shown}: only the leader has the write when it is acknowledged", acks


@rule(
    "KR008",
    "idempotence-disabled",
    W,
    P,
    "producer durability",
    summary="Producer without enable.idempotence=true.",
    why="librdkafka's default is false (Java's is true): a retried batch whose first "
    "attempt was persisted is written twice, and retries reorder messages.",
    fix="Set enable.idempotence=true.",
)
def _idempotence(unit: ConfigUnit) -> Iterator[Hit]:
    if unit.context.get("framework") == "Kafka Connect" and unit.get("enable.idempotence") is None:
        return  # Connect's own default (KAFKA-13759), with one request in flight: no reordering
    if (
        idempotent(unit) is False
        and client_of(unit) == "java"
        and unit.get("enable.idempotence") is None
    ):
        conflict = explicit(
            unit,
            "acks",
            "request.required.acks",
            "retries",
            "max.in.flight.requests.per.connection",
        )
        shown = f"{conflict.key}={conflict.shown}" if conflict else "a conflicting setting"
        yield (
            f"{shown} turns the default enable.idempotence=true off: retries can "
            "duplicate and reorder messages",
            conflict,
        )
        return
    if idempotent(unit) is False:
        entry = explicit(unit, "enable.idempotence")
        shown = f"enable.idempotence={entry.shown}" if entry else "enable.idempotence is unset"
        yield f"{shown}: retries can duplicate and reorder messages", entry


@rule(
    "KR009",
    "reordering-without-idempotence",
    W,
    P,
    "producer durability",
    summary="Retries with several in-flight requests and no idempotence.",
    why="When a batch fails and is retried while later batches succeed, messages land out "
    "of order (INTRODUCTION.md 'Reordering').",
    fix="Enable idempotence, or set max.in.flight=1 if you cannot.",
)
def _reordering(unit: ConfigUnit) -> Iterator[Hit]:
    inflight = explicit(unit, "max.in.flight", "max.in.flight.requests.per.connection")
    retries = explicit(unit, "retries", "message.send.max.retries")
    if idempotent(unit) or not (inflight or retries):
        return
    n_inflight, n_retries = number(unit, "max.in.flight"), number(unit, "retries")
    if n_inflight is not None and n_retries is not None and n_inflight > 1 and n_retries > 0:
        # A default is shown as one, not as if the file set it (issue 38 #8).
        in_flight = f"max.in.flight={fmt(n_inflight)}{'' if inflight else ' (default)'}"
        tries = f"retries={fmt(n_retries)}{'' if retries else ' (default)'}"
        yield (
            f"{in_flight} and {tries} without idempotence: retried batches can be reordered",
            inflight or retries,
        )


@rule(
    "KR010",
    "retries-zero",
    W,
    P,
    "producer durability",
    summary="retries=0.",
    why="NOT_ENOUGH_REPLICAS and REQUEST_TIMED_OUT then fail the message at once, while "
    "leader changes are still retried: the config does not do what it seems to.",
    fix="Leave retries at its default and bound delivery time with message.timeout.ms.",
)
def _retries_zero(unit: ConfigUnit) -> Iterator[Hit]:
    retries = explicit(unit, "retries", "message.send.max.retries")
    if retries and number(unit, "retries") == 0:
        yield f"{retries.key}={retries.shown}: transient broker errors fail messages", retries


@rule(
    "KR011",
    "message-timeout-short",
    W,
    P,
    "producer durability",
    summary="message.timeout.ms below 60 s.",
    why="Leader elections are bounded only by this timeout (they do not use the retries "
    "budget); a short one turns a routine broker restart into _MSG_TIMED_OUT failures.",
    fix="Use at least 60000 (Java's delivery.timeout.ms default is 120000).",
)
def _timeout_short(unit: ConfigUnit) -> Iterator[Hit]:
    timeout = explicit(unit, "message.timeout.ms", "delivery.timeout.ms")
    value = number(unit, "message.timeout.ms")
    if timeout and value is not None and 0 < value < 60000:
        yield (f"{timeout.key}={timeout.shown}: shorter than a leader election under load", timeout)


@rule(
    "KR012",
    "partitioner-not-java",
    W,
    P,
    "partitioner",
    summary="partitioner is not Java-compatible murmur2_random/murmur2.",
    why="Java producers hash keys with murmur2; librdkafka's crc32-based partitioners map "
    "the same key to a different partition, breaking per-key order and joins when both "
    "kinds of producers write to a topic (librdkafka#4510).",
    fix="Set partitioner=murmur2_random.",
    clients=LIBRDKAFKA,
)
def _partitioner(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "partitioner")
    if entry and entry.text.lower() not in ("murmur2_random", "murmur2"):
        yield f"partitioner={entry.shown}: keys land on other partitions than Java's", entry


@rule(
    "KR013",
    "no-delivery-callback",
    W,
    P,
    "producer durability",
    summary="confluent-kafka Producer without a delivery callback (Python source).",
    why="Delivery errors reach the application only through on_delivery; flush() "
    "returning 0 means the queue is empty, not that messages were delivered.",
    fix="Pass on_delivery in the config or to produce(), or use ResilientProducer.",
)
def _no_delivery_cb(unit: ConfigUnit) -> Iterator[Hit]:
    ctx = unit.context
    if unit.source != "python" or ctx.get("resilient") or not ctx.get("config_known"):
        return
    methods = _methods(unit)
    if "on_delivery" in unit.entries or "produce+on_delivery" in methods:
        return
    yield f"{ctx.get('constructor')} without on_delivery: failed deliveries go unnoticed", None


@rule(
    "KR014",
    "no-error-callback",
    W,
    ANY,
    "producer durability",
    summary="confluent-kafka client without error_cb (Python source).",
    why="Without error_cb the binding drops client-level errors such as _ALL_BROKERS_DOWN "
    "and authentication failures (confluent_kafka.c: 'No callback defined').",
    fix="Pass error_cb (log and alert), or use the kresilient clients.",
)
def _no_error_cb(unit: ConfigUnit) -> Iterator[Hit]:
    ctx = unit.context
    if unit.source != "python" or ctx.get("resilient") or not ctx.get("config_known"):
        return
    if "error_cb" not in unit.entries:
        yield f"{ctx.get('constructor')} without error_cb: broker-down errors are dropped", None


@rule(
    "KR015",
    "backoff-above-max",
    W,
    ANY,
    "metadata freshness",
    summary="retry.backoff.ms or the fast metadata refresh interval above retry.backoff.max.ms.",
    why="librdkafka warns and caps the value (rd_kafka_conf_warn); the intended backoff "
    "never happens and leader discovery after an election is slower than it looks.",
    fix="Keep retry.backoff.ms <= retry.backoff.max.ms and "
    "topic.metadata.refresh.fast.interval.ms <= retry.backoff.max.ms.",
)
def _backoff(unit: ConfigUnit) -> Iterator[Hit]:
    top = number(unit, "retry.backoff.max.ms")
    if top is None:
        return
    for key in ("retry.backoff.ms", "topic.metadata.refresh.fast.interval.ms"):
        entry = explicit(unit, key)
        value = number(unit, key)
        if entry and value is not None and value > top:
            yield f"{key}={entry.shown} exceeds retry.backoff.max.ms={fmt(top)}", entry
    entry = explicit(unit, "retry.backoff.max.ms")
    base = number(unit, "retry.backoff.ms")
    if entry and base is not None and not explicit(unit, "retry.backoff.ms") and base > top:
        yield f"retry.backoff.max.ms={entry.shown} is below retry.backoff.ms={fmt(base)}", entry


@rule(
    "KR016",
    "metadata-refresh-slow",
    W,
    ANY,
    "metadata freshness",
    summary="Periodic metadata refresh disabled or slower than 5 minutes.",
    why="topic.metadata.refresh.interval.ms=-1 ('not recommended' in CONFIGURATION.md) or "
    "a long interval delays discovery of new partitions, brokers and leaders.",
    fix="Keep topic.metadata.refresh.interval.ms at or below 300000.",
)
def _refresh(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "topic.metadata.refresh.interval.ms")
    value = number(unit, "topic.metadata.refresh.interval.ms")
    if entry and value is not None and (value < 0 or value > 300000):
        what = "disables periodic refresh" if value < 0 else "refreshes too rarely"
        yield f"topic.metadata.refresh.interval.ms={entry.shown} {what}", entry


@rule(
    "KR017",
    "no-rebootstrap",
    W,
    ANY,
    "metadata freshness",
    summary="metadata.recovery.strategy=none.",
    why="When every known broker is gone (replaced cluster, moved IPs) the client never "
    "goes back to bootstrap.servers (KIP-899) and stays disconnected.",
    fix="Leave metadata.recovery.strategy=rebootstrap.",
)
def _no_rebootstrap(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "metadata.recovery.strategy")
    if entry and entry.text.lower() == "none":
        yield "metadata.recovery.strategy=none: no re-bootstrap after losing all brokers", entry


@rule(
    "KR039",
    "metadata-max-age-high",
    W,
    ANY,
    "metadata freshness",
    summary="metadata.max.age.ms above 15 minutes.",
    why="Cached metadata (leaders, partitions) may be used for this long; Java uses "
    "300000 and librdkafka 900000.",
    fix="Keep metadata.max.age.ms <= 900000 (about 3x the refresh interval).",
)
def _max_age(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "metadata.max.age.ms")
    value = number(unit, "metadata.max.age.ms")
    if entry and value is not None and value > 900000:
        yield f"metadata.max.age.ms={entry.shown}: stale leaders are kept too long", entry


@rule(
    "KR018",
    "auto-commit-before-processing",
    W,
    C,
    "consumer commits",
    summary="enable.auto.commit with enable.auto.offset.store (both default true).",
    why="Offsets are stored when poll() returns a message and committed in the "
    "background, before your code has processed it: a crash loses those messages "
    "(INTRODUCTION.md 'At-least-once processing').",
    fix="Set enable.auto.offset.store=false and call store_offsets(msg) after processing "
    "(or use ResilientConsumer).",
)
def _auto_commit(unit: ConfigUnit) -> Iterator[Hit]:
    if client_of(unit) == "java":
        # The Java consumer commits, in poll(), the records the previous poll() returned:
        # at-least-once for a plain loop. Spring's container commits after the listener
        # unless enable-auto-commit is set, which hands commits back to the client's timer.
        entry = explicit(unit, "enable.auto.commit")
        if (
            unit.context.get("framework") == "Spring Kafka"
            and entry
            and truthy(unit, "enable.auto.commit")
        ):
            yield (
                f"{entry.key}=true: the listener container no longer commits after "
                "processing; offsets of records handed off or given up by the error handler "
                "can be committed unprocessed",
                entry,
            )
        return
    if unit.context.get("assumed") == "aiokafka" and truthy(unit, "enable.auto.commit"):
        entry = explicit(unit, "enable.auto.commit")
        shown = f"{entry.key}={entry.shown}" if entry else "enable_auto_commit is unset (True)"
        yield (
            f"{shown}: aiokafka commits the positions of fetched messages from a background "
            "task, before their processing ends",
            entry,
        )
        return
    if truthy(unit, "enable.auto.commit") and truthy(unit, "enable.auto.offset.store"):
        entry = explicit(unit, "enable.auto.offset.store", "enable.auto.commit")
        yield (
            "enable.auto.commit and enable.auto.offset.store are true: offsets are "
            "committed before processing",
            entry,
        )


@rule(
    "KR019",
    "store-offsets-with-auto-store",
    E,
    C,
    "consumer commits",
    summary="store_offsets() called while enable.auto.offset.store is not false.",
    why="librdkafka raises _INVALID_ARG from store_offsets() when automatic offset "
    "storing is on (rdkafka_offset.c).",
    fix="Set enable.auto.offset.store=false.",
)
def _store_offsets(unit: ConfigUnit) -> Iterator[Hit]:
    methods = _methods(unit)
    if unit.source != "python" or unit.context.get("resilient"):
        return
    if "store_offsets" in methods and truthy(unit, "enable.auto.offset.store"):
        yield (
            "store_offsets() is called but enable.auto.offset.store is true",
            explicit(unit, "enable.auto.offset.store"),
        )


@rule(
    "KR020",
    "nothing-commits",
    W,
    C,
    "consumer commits",
    summary="Manual offset store, auto-commit off, and no commit() call.",
    why="With both automatic paths disabled nothing commits offsets: every restart "
    "replays from the last commit or auto.offset.reset.",
    fix="Call commit() after processing, or keep enable.auto.commit=true with "
    "enable.auto.offset.store=false.",
)
def _nothing_commits(unit: ConfigUnit) -> Iterator[Hit]:
    methods = _methods(unit)
    if unit.source != "python" or unit.context.get("resilient"):
        return
    if (
        truthy(unit, "enable.auto.commit") is False
        and truthy(unit, "enable.auto.offset.store") is False
        and "commit" not in methods
    ):
        yield (
            "enable.auto.commit=false and no commit() call: offsets are never committed",
            (explicit(unit, "enable.auto.commit")),
        )


@rule(
    "KR021",
    "offset-reset-latest",
    W,
    C,
    "consumer commits",
    summary="auto.offset.reset unset or latest.",
    why="A new group, or an expired/out-of-range offset, starts at the end of the log: "
    "messages written before the consumer joined are skipped silently.",
    fix="Set auto.offset.reset=earliest (or error, and handle it).",
)
def _offset_reset(unit: ConfigUnit) -> Iterator[Hit]:
    value = effective(unit, "auto.offset.reset")
    if value in ("latest", "largest", "end"):
        entry = explicit(unit, "auto.offset.reset")
        shown = f"auto.offset.reset={entry.shown}" if entry else "auto.offset.reset is unset"
        yield f"{shown}: a new or reset group skips existing messages", entry


def _methods(unit: ConfigUnit) -> frozenset[str]:
    methods = unit.context.get("methods")
    return methods if isinstance(methods, frozenset) else frozenset()


def _classic(unit: ConfigUnit) -> bool:
    return effective(unit, "group.protocol") in ("classic", None)


@rule(
    "KR022",
    "poll-interval-below-session",
    E,
    C,
    "rebalance safety",
    summary="max.poll.interval.ms below session.timeout.ms (classic protocol).",
    why="rd_kafka_conf_finalize rejects it: the member would be evicted for slow "
    "processing before its session could even expire. The Java client accepts it, but "
    "its member then leaves the group whenever one poll loop outlasts max.poll.interval.ms, "
    "long before the session timeout it was given could matter (a Spring or Java consumer "
    "with this pair rebalances on every slow batch).",
    fix="Keep max.poll.interval.ms >= session.timeout.ms.",
)
def _poll_vs_session(unit: ConfigUnit) -> Iterator[Hit]:
    poll, session = number(unit, "max.poll.interval.ms"), number(unit, "session.timeout.ms")
    # the poll interval is the setting to blame; session.timeout.ms when only it is set
    entry = explicit(unit, "max.poll.interval.ms") or explicit(unit, "session.timeout.ms")
    if entry and _classic(unit) and poll is not None and session is not None and poll < session:
        yield (
            f"max.poll.interval.ms={fmt(poll)} is below session.timeout.ms={fmt(session)}",
            entry,
        )


@rule(
    "KR023",
    "heartbeat-session-ratio",
    W,
    C,
    "rebalance safety",
    summary="heartbeat.interval.ms above a third of session.timeout.ms.",
    why="Fewer than three heartbeats fit in a session: one delayed heartbeat evicts the "
    "member and triggers a rebalance.",
    fix="Keep heartbeat.interval.ms <= session.timeout.ms / 3.",
)
def _heartbeat(unit: ConfigUnit) -> Iterator[Hit]:
    beat, session = number(unit, "heartbeat.interval.ms"), number(unit, "session.timeout.ms")
    entry = explicit(unit, "heartbeat.interval.ms", "session.timeout.ms")
    if entry and _classic(unit) and beat is not None and session and beat > session / 3:
        # a default is named as one, not shown as if the file set it (issue 38 #8)
        beat_set = explicit(unit, "heartbeat.interval.ms") is not None
        session_set = explicit(unit, "session.timeout.ms") is not None
        yield (
            f"heartbeat.interval.ms={fmt(beat)}{'' if beat_set else ' (the default)'} exceeds "
            f"session.timeout.ms/3 ({fmt(session)}{'' if session_set else ' (the default)'}/3)",
            entry,
        )


@rule(
    "KR024",
    "consumer-protocol-client-settings",
    E,
    C,
    "rebalance safety",
    summary="group.protocol=consumer with session, heartbeat or assignor settings.",
    why="With the KIP-848 protocol these are broker-side; librdkafka refuses them at construction.",
    fix="Remove them (configure group.consumer.* on the broker) or use group.protocol=classic.",
)
def _kip848(unit: ConfigUnit) -> Iterator[Hit]:
    if effective(unit, "group.protocol") != "consumer":
        return
    for key in (
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "partition.assignment.strategy",
        "group.protocol.type",
    ):
        entry = explicit(unit, key)
        if entry:
            yield f"{key} is not allowed with group.protocol=consumer", entry


@rule(
    "KR025",
    "mixed-assignors",
    E,
    C,
    "rebalance safety",
    summary="Eager and cooperative assignors mixed in partition.assignment.strategy.",
    why="librdkafka refuses the mix (rdkafka_assignor.c): the rebalance protocols differ.",
    fix="Use cooperative-sticky alone (migrate with a two-step rolling restart).",
    clients=LIBRDKAFKA,
)
def _mixed(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "partition.assignment.strategy")
    if entry:
        names = {n.strip() for n in entry.text.lower().split(",")}
        if names & _EAGER and names & _COOPERATIVE:
            yield f"partition.assignment.strategy={entry.shown} mixes eager and cooperative", entry


@rule(
    "KR026",
    "eager-assignor",
    N,
    C,
    "rebalance safety",
    summary="Eager assignor (the default range,roundrobin).",
    why="Every rebalance revokes all partitions from all members (stop-the-world).",
    fix="Set partition.assignment.strategy=cooperative-sticky (or group.protocol=consumer).",
    clients=LIBRDKAFKA,
)
def _eager(unit: ConfigUnit) -> Iterator[Hit]:
    value = effective(unit, "partition.assignment.strategy")
    if value is None or not _classic(unit):
        return
    names = {n.strip() for n in value.split(",")}
    if names and names <= _EAGER:
        entry = explicit(unit, "partition.assignment.strategy")
        yield f"partition.assignment.strategy={value}: stop-the-world rebalances", entry


@rule(
    "KR027",
    "fetch-wait-vs-socket-timeout",
    W,
    C,
    "rebalance safety",
    summary="fetch.wait.max.ms + 1000 above socket.timeout.ms.",
    why="Fetch requests may time out on the client while the broker is still waiting "
    "(rd_kafka_conf_warn), causing reconnects.",
    fix="Keep socket.timeout.ms > fetch.wait.max.ms + 1000.",
    clients=LIBRDKAFKA,
)
def _fetch_wait(unit: ConfigUnit) -> Iterator[Hit]:
    wait, sock = number(unit, "fetch.wait.max.ms"), number(unit, "socket.timeout.ms")
    entry = explicit(unit, "fetch.wait.max.ms", "socket.timeout.ms")
    if entry and wait is not None and sock is not None and wait + 1000 > sock:
        yield f"fetch.wait.max.ms={fmt(wait)} + 1000 exceeds socket.timeout.ms={fmt(sock)}", entry


@rule(
    "KR028",
    "fetch-size-limits",
    E,
    C,
    "message size",
    summary="fetch.max.bytes below message.max.bytes, or receive.message.max.bytes below "
    "fetch.max.bytes + 512.",
    why="rd_kafka_conf_finalize rejects both: a response could not hold one message.",
    fix="Raise fetch.max.bytes / receive.message.max.bytes or leave them unset.",
    clients=LIBRDKAFKA,
)
def _fetch_sizes(unit: ConfigUnit) -> Iterator[Hit]:
    fetch, msg = number(unit, "fetch.max.bytes"), number(unit, "message.max.bytes")
    entry = explicit(unit, "fetch.max.bytes")
    if entry and fetch is not None and msg is not None and fetch < msg:
        yield f"fetch.max.bytes={entry.shown} is below message.max.bytes={fmt(msg)}", entry
    receive = explicit(unit, "receive.message.max.bytes")
    rvalue = number(unit, "receive.message.max.bytes")
    if receive and rvalue is not None and fetch is not None and rvalue < fetch + 512:
        yield (
            f"receive.message.max.bytes={receive.shown} is below fetch.max.bytes+512 "
            f"({fmt(fetch + 512)})",
            receive,
        )


@rule(
    "KR029",
    "read-uncommitted",
    N,
    C,
    "consumer commits",
    summary="isolation.level=read_uncommitted.",
    why="The consumer reads messages of aborted transactions.",
    fix="Use read_committed (librdkafka's default) when producers use transactions.",
)
def _isolation(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "isolation.level")
    if entry and entry.text.lower() == "read_uncommitted":
        yield "isolation.level=read_uncommitted: aborted transactions are visible", entry


@rule(
    "KR030",
    "no-client-rack",
    N,
    C,
    "rebalance safety",
    summary="Consumer without client.rack.",
    why="Without it the consumer cannot fetch from a replica in its own rack/zone "
    "(KIP-392), paying cross-zone traffic and latency.",
    fix="Set client.rack to the consumer's zone (matching broker.rack).",
)
def _client_rack(unit: ConfigUnit) -> Iterator[Hit]:
    if (
        not unit.context.get("resilient")
        and unit.get("client.rack") is None
        and unit.context.get("config_known", True)
    ):
        yield "client.rack is unset: no fetch-from-follower", None


@rule(
    "KR032",
    "wrong-client-kind",
    W,
    ("producer", "consumer", "admin"),
    "client kind",
    summary="A producer property on a consumer, or the reverse.",
    why="librdkafka ignores it with a warning ('... will be ignored by this consumer "
    "instance'): the setting you rely on has no effect.",
    fix="Move the key to the right client's config, or remove it.",
)
def _wrong_kind(unit: ConfigUnit) -> Iterator[Hit]:
    wrong = {"producer": ("C",), "consumer": ("P",), "admin": ("P", "C")}[unit.kind]
    if client_of(unit) == "java":
        for key, entry in unit.entries.items():
            owners = catalog.java_client_kinds(key)
            if owners and unit.kind not in owners and owners != ("admin",):
                yield (
                    f"{key} is a Java {'/'.join(owners)} property and is ignored by a {unit.kind}",
                    entry,
                )
        return
    for key, entry in unit.entries.items():
        prop = catalog.lookup(key)
        if prop is not None and prop.scope in wrong:
            owner = "consumer" if prop.scope == "C" else "producer"
            yield f"{key} is a {owner} property and is ignored by a {unit.kind}", entry


@rule(
    "KR033",
    "deprecated-property",
    W,
    ANY,
    "unknown keys",
    summary="Deprecated or experimental property.",
    why="librdkafka warns at construction; deprecated properties are no longer used or "
    "will be removed, experimental ones may change.",
    fix="Remove it or use its replacement (see librdkafka CONFIGURATION.md).",
    clients=LIBRDKAFKA,
)
def _deprecated(unit: ConfigUnit) -> Iterator[Hit]:
    for key, entry in unit.entries.items():
        prop = catalog.lookup(key)
        if prop is not None and (prop.deprecated or prop.experimental):
            what = "deprecated" if prop.deprecated else "experimental"
            yield f"{key} is {what} in librdkafka {catalog.librdkafka_version()}", entry


@rule(
    "KR036",
    "single-bootstrap-server",
    W,
    ANY,
    "metadata freshness",
    summary="bootstrap.servers names a single broker.",
    why="If that broker is down when the client starts (or re-bootstraps) it cannot "
    "reach the cluster at all.",
    fix="List at least two (ideally three) brokers.",
)
def _single_bootstrap(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "bootstrap.servers", "metadata.broker.list")
    if entry and "," not in entry.text.strip().strip(","):
        if _one_address_is_fine(entry.text):
            return
        yield f"{entry.key}={entry.shown} names a single broker", entry


#: A single bootstrap address that is right as it is (issue 38 #3): a template or
#: placeholder, a local broker, or one DNS name in front of many brokers (Confluent Cloud,
#: Event Hubs, a Strimzi or Kubernetes bootstrap service, a load balancer).
_ONE_ADDRESS_OK = re.compile(
    r"[<>{}$%]|^\s*(?:localhost|127\.0\.0\.1|\[?::1\]?|host\.docker\.internal)(?::|$)"
    r"|\.confluent\.cloud\b|servicebus\.windows\.net|-kafka-bootstrap\b|\bbootstrap\b"
    r"|\.svc(?:\.cluster\.local)?\b|\bkafka-broker-lb\b|\blb\b",
    re.IGNORECASE,
)


def _one_address_is_fine(text: str) -> bool:
    return bool(_ONE_ADDRESS_OK.search(text))


@rule(
    "KR037",
    "invalid-value",
    E,
    ANY,
    "unknown keys",
    summary="Value librdkafka rejects (wrong type, out of range, unknown enum value) or "
    "silently truncates ('1.5' read as 1).",
    why="rd_kafka_conf_set fails with 'Invalid value for configuration property' and the "
    "client cannot be created.",
    fix="Use a value of the documented type and range (see --explain and CONFIGURATION.md).",
    clients=LIBRDKAFKA,
)
def _invalid(unit: ConfigUnit) -> Iterator[Hit]:
    for key, entry in unit.entries.items():
        prop = catalog.lookup(key)
        if prop is None or entry.dynamic or prop.source != "librdkafka":
            continue
        problem = prop.check_value(entry.value)
        rest = "" if problem else prop.ignored_suffix(entry.value).strip()
        if rest:
            problem = f"librdkafka ignores the trailing {rest!r} and reads a different number"
        if problem:
            hint = " (.properties has no inline comments)" if "#" in entry.text else ""
            yield f"{key}={entry.shown}: {problem}{hint}", entry


@rule(
    "KR038",
    "partitioner-default",
    N,
    P,
    "partitioner",
    summary="partitioner unset: librdkafka's consistent_random, not Java's murmur2.",
    why="The default crc32-based partitioner maps keys differently from Java producers.",
    fix="Set partitioner=murmur2_random if any Java producer writes the same topics.",
    clients=LIBRDKAFKA,
)
def _partitioner_default(unit: ConfigUnit) -> Iterator[Hit]:
    if unit.get("partitioner") is None and effective(unit, "partitioner") == "consistent_random":
        yield "partitioner is unset (consistent_random): not Java-compatible", None


@rule(
    "KR051",
    "delivery-timeout-below-linger-plus-request",
    E,
    P,
    "producer durability",
    summary="Java producer: delivery.timeout.ms below linger.ms + request.timeout.ms.",
    why="KafkaProducer refuses an explicit delivery.timeout.ms smaller than linger.ms + "
    "request.timeout.ms (ConfigException at construction: a batch could expire before its "
    "first request can time out); an implicit one is raised silently.",
    fix="Keep delivery.timeout.ms >= linger.ms + request.timeout.ms (defaults 120000 >= 5 + "
    "30000).",
    clients=("java",),
)
def _delivery_timeout(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "delivery.timeout.ms", "message.timeout.ms")
    delivery = number(unit, "delivery.timeout.ms")
    linger, request = number(unit, "linger.ms"), number(unit, "request.timeout.ms")
    if entry is None or delivery is None or linger is None or request is None:
        return
    if delivery < linger + request:
        yield (
            f"{entry.key}={entry.shown} is below linger.ms + request.timeout.ms "
            f"({fmt(linger)} + {fmt(request)}): the Java producer refuses it",
            entry,
        )


def _unused(_: Entry | None) -> None:  # keeps the import list honest for type checkers
    return None


@rule(
    "KR071",
    "share-consumer-key",
    E,
    C,
    "share groups",
    summary="A share consumer given a consumer-group setting it does not take.",
    why="A share group (KIP-932) keeps its state on the broker: librdkafka's share consumer "
    "fails to start with isolation.level, auto.offset.reset, enable.auto.commit, "
    "session.timeout.ms, group.instance.id ... set (any value), and ResilientShareConsumer "
    "also refuses the offset and poll settings librdkafka would ignore.",
    fix="Remove the key; set the group's share.auto.offset.reset, "
    "share.record.lock.duration.ms or share.delivery.count.limit as group configs "
    "(kresilient.share.configure_share_group) instead.",
    clients=LIBRDKAFKA,
)
def _share_key(unit: ConfigUnit) -> Iterator[Hit]:
    if not unit.context.get("share"):
        return
    resilient = bool(unit.context.get("resilient"))
    for key, entry in unit.entries.items():
        who = SHARE_CONSUMER_REFUSED.get(key)
        if who == "librdkafka":
            yield f"{key}: a share consumer does not take it (librdkafka refuses to start)", entry
        elif who == "kresilient" and resilient:
            yield f"{key}: ResilientShareConsumer refuses it (a share consumer ignores it)", entry
    mode = explicit(unit, "share.acknowledgement.mode")
    if resilient and mode is not None and mode.text.lower() != "explicit":
        yield (
            f"share.acknowledgement.mode={mode.shown}: ResilientShareConsumer refuses it "
            "(records acknowledged before the handler's outcome is known)",
            mode,
        )


@rule(
    "KR072",
    "share-implicit-ack",
    W,
    C,
    "share groups",
    summary="A share consumer with share.acknowledgement.mode=implicit.",
    why="Implicit mode ACCEPTs every record of a poll at the next poll, whatever its "
    "handling did: a record whose handler failed is acknowledged and never delivered again.",
    fix="Use explicit mode and acknowledge each record after its outcome "
    "(kresilient.share.ResilientShareConsumer does).",
    clients=LIBRDKAFKA,
)
def _share_implicit(unit: ConfigUnit) -> Iterator[Hit]:
    if not unit.context.get("share") or unit.context.get("resilient"):
        return  # ResilientShareConsumer refuses it: KR071
    mode = explicit(unit, "share.acknowledgement.mode")
    if mode is not None and mode.text.lower() == "implicit":
        yield "share.acknowledgement.mode=implicit: records acknowledged before handling", mode


@rule(
    "KR073",
    "consumer-ordering-combination",
    E,
    C,
    "consumer",
    summary='A kresilient consumer given ordering="key"/"none", or transactions= (or not), with '
    "an option that mode refuses.",
    why="With many records of a partition in flight, a batch handler, ordered retry topics "
    "(RetryTopicPolicy(ordered=True): its blocked keys) and one span per handler call would "
    "each lose their per-record guarantee, so ResilientConsumer refuses the combination with "
    "a ConfigError at construction (crash-loop protection combines: a partition probed after "
    "an unclean end runs its probe one record at a time; unordered retry topics combine: a "
    "move is acknowledged before its record counts as finished); AsyncResilientConsumer "
    "has none of those options and "
    "refuses max_concurrency other than 1 instead (max_in_flight bounds its handlers); both "
    "refuse an unknown ordering and a window (max_in_flight, max_in_flight_bytes) under 1. "
    "ResilientConsumer(transactions=) refuses a batch handler and ordering other than "
    '"partition"; retry topics (ordered or not) are written inside the transaction. '
    "AsyncResilientConsumer(transactions=) refuses the same and max_concurrency other than 1; "
    "without transactions= it has no crash-loop protection and refuses max_process_deaths or "
    "crash_probe_records other than their defaults.",
    fix='With ordering="key"/"none" drop batch_handler and trace_spans="call", and use '
    "RetryTopicPolicy(ordered=False) (the default) "
    "(AsyncResilientConsumer: drop max_concurrency, "
    'size max_in_flight instead); or keep ordering="partition" (the default). With '
    'transactions=: drop batch_handler and keep ordering="partition". Set max_process_deaths '
    "and crash_probe_records on AsyncResilientConsumer only with transactions=.",
    clients=LIBRDKAFKA,
)
def _ordering_combination(unit: ConfigUnit) -> Iterator[Hit]:
    options = unit.context.get("options")
    if not isinstance(options, dict):
        return
    for name in ("max_in_flight", "max_in_flight_bytes"):
        size = options.get(name)
        if (
            size is not None
            and not size.dynamic
            and isinstance(size.value, int)
            and not isinstance(size.value, bool)
            and size.value < 1
        ):
            yield f"{name}={size.shown}: the window must be at least 1 (ConfigError)", size
            return

    def given(name: str) -> bool:
        """Known to be passed and not None."""
        entry = options.get(name)
        return entry is not None and not entry.dynamic and entry.value is not None

    ordering = options.get("ordering")
    txn = options.get("transactions")
    if (
        txn is not None
        and given("transactions")
        and unit.context.get("constructor") != "AsyncResilientConsumer"
    ):
        # checked first at construction: ResilientConsumer(transactions=) refuses these
        # before it looks at ordering's own combinations
        keyed = ordering is not None and not ordering.dynamic and ordering.value != "partition"
        with_txn = ["batch_handler"] if given("batch_handler") else []
        if keyed and ordering is not None:
            with_txn.insert(1 if given("batch_handler") else 0, f"ordering={ordering.shown}")
        if with_txn:
            yield (
                f"transactions= does not combine with {', '.join(with_txn)}: "
                "ResilientConsumer refuses it (ConfigError)",
                txn,
            )
            return
        if keyed:
            return
    if (
        txn is not None
        and given("transactions")
        and unit.context.get("constructor") == "AsyncResilientConsumer"
    ):
        # AsyncResilientConsumer(transactions=) drives the sync engine, one handler at a
        # time in offset order: kresilient/aio/_transactional.py refuses the rest (and
        # dead_letter_producer, which lint does not read)
        refused_txn = []
        if ordering is not None and not ordering.dynamic and ordering.value != "partition":
            refused_txn.append(f"ordering={ordering.shown}")
        concurrency = options.get("max_concurrency")
        if concurrency is not None and given("max_concurrency") and concurrency.value != 1:
            refused_txn.append(f"max_concurrency={concurrency.shown}")
        if refused_txn:
            yield (
                f"transactions= does not combine with {', '.join(refused_txn)}: "
                "AsyncResilientConsumer refuses it (ConfigError)",
                txn,
            )
        return
    if unit.context.get("constructor") == "AsyncResilientConsumer" and not given("transactions"):
        # crash-loop protection is the transactional engine's (transactions=): without it the
        # asyncio consumer refuses settings it would not apply (ConfigError)
        for name, default in (("max_process_deaths", 3), ("crash_probe_records", 20)):
            entry = options.get(name)
            if (
                entry is not None
                and not entry.dynamic
                and isinstance(entry.value, int)
                and not isinstance(entry.value, bool)
                and entry.value != default
                and txn is None
            ):
                yield (
                    f"{name}={entry.shown} without transactions=: AsyncResilientConsumer has "
                    "no crash-loop protection there and refuses it (ConfigError)",
                    entry,
                )
                return
    if ordering is None or ordering.dynamic or ordering.value == "partition":
        return
    if ordering.value not in ("key", "none"):
        yield f"ordering={ordering.shown}: one of 'partition', 'key', 'none'", ordering
        return

    if unit.context.get("constructor") == "AsyncResilientConsumer":
        concurrency = options.get("max_concurrency")
        if concurrency is not None and given("max_concurrency") and concurrency.value != 1:
            yield (
                f"ordering={ordering.shown} does not combine with max_concurrency="
                f"{concurrency.shown}: AsyncResilientConsumer refuses it (ConfigError); "
                "max_in_flight bounds the handlers in this mode",
                ordering,
            )
        return
    refused = ["batch_handler"] if given("batch_handler") else []
    ordered = options.get(RETRY_TOPICS_ORDERED)
    if given("retry_topics") and ordered is not None and ordered.value is True:
        # unordered retry topics combine; the ordered policy's blocked keys do not yet
        refused.append("retry_topics=RetryTopicPolicy(ordered=True)")
    spans = options.get("trace_spans")
    if spans is not None and not spans.dynamic and spans.value == "call":
        refused.append('trace_spans="call"')
    if refused:
        yield (
            f"ordering={ordering.shown} does not combine with {', '.join(refused)}: "
            "ResilientConsumer refuses it (ConfigError)",
            ordering,
        )
