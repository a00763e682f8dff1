"""Security, topic and broker durability, message size, cross-config, meta and audit rules."""

from __future__ import annotations

import re
from collections.abc import Iterator

from kresilient.lint.model import ConfigUnit, Entry, Severity, is_secret
from kresilient.lint.registry import (
    Hit,
    Rule,
    client_of,
    effective,
    explicit,
    fmt,
    is_client,
    number,
    project_rule,
    register,
    rule,
    truthy,
)

E, W, N = Severity.ERROR, Severity.WARNING, Severity.INFO
CLIENTS = ("producer", "consumer", "admin", "client")
ALL = (*CLIENTS, "broker", "topic")
# The secret-bearing options of a JAAS string (PLAIN/SCRAM password, OAuth clientSecret, ...)
# or of librdkafka's sasl.oauthbearer.config ("clientSecret=... scope=...").
_JAAS_SECRET = re.compile(
    r"(?<![\w.])(password|client[_.]?secret|secret|api[_.]?secret|access[_.]?token|token)"
    r"\s*=\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*'|[^\s;]+)",
    re.IGNORECASE,
)
# Values that stand for a secret instead of being one: templates and references
# (${VAR}, $VAR, {{ .Values.x }}, <your secret>, %(x)s, @token@, ENC(...)), masks (****).
_STAND_IN = re.compile(
    r"^(?:\$\{.*\}|\$[A-Za-z_]\w*|\$\(.*\)|\{\{.*\}\}|\{%.*%\}|<[^<>]*>|\[[^\[\]]*\]"
    r"|%\([^)]*\)s|@\w+@|ENC\(.*\)|[*x#.\-_ ]+)$",
    re.IGNORECASE | re.DOTALL,
)
_STAND_IN_WORDS = frozenset(
    {
        "dummy",
        "changeme",
        "change-me",
        "change_me",
        "replaceme",
        "replace-me",
        "replace_me",
        "placeholder",
        "redacted",
        "todo",
        "tbd",
        "none",
        "null",
        "nil",
        "undefined",
    }
)
# "your-api-secret", "REPLACE_WITH_KEY", "CLUSTER_API_SECRET": a name for what goes there.
_NAMES_A_SECRET = re.compile(
    r"^(?:(?:your|my|replace|insert|enter)[-_ ].*"
    r"|[A-Z0-9_]*(?:SECRET|PASSWORD|KEY|TOKEN)[A-Z0-9_]*)$"
)
# Keys whose value is where the secret is, not the secret: paths, and the Confluent images'
# KAFKA_SSL_{KEYSTORE,KEY,TRUSTSTORE}_CREDENTIALS (the name of a file holding the password).
_SECRET_ELSEWHERE = re.compile(
    r"(?:\.location|\.file|\.filename|\.path|^ssl\.(?:keystore|key|truststore)\.credentials)$"
)
# Certificates are typed secret by the catalogs (librdkafka's ssl.ca.pem, Java's PASSWORD-typed
# ssl.truststore.certificates) and so never printed, but a certificate is public material, not
# a credential: a literal one in a file is no leak for KR041.
_PUBLIC_MATERIAL = re.compile(r"(?:\.ca\.pem|\.certificates|\.certificate\.chain)$")


def is_stand_in(value: str) -> bool:
    """True when ``value`` is a placeholder, template, reference or mask, not a secret."""
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return (
        not text
        or text.lower() in _STAND_IN_WORDS
        or bool(_STAND_IN.match(text))
        or bool(_NAMES_A_SECRET.match(text))
    )


def _literal_in_options(text: str) -> str | None:
    """The name of the first option of a JAAS / OAuth config string holding a literal
    secret (``password``, ``clientSecret`` ...), else None."""
    for match in _JAAS_SECRET.finditer(text):
        if not is_stand_in(match.group(2)):
            return match.group(1)
    return None


@rule(
    "KR034",
    "tls-verification-off",
    E,
    (*CLIENTS, "broker"),
    "security",
    summary="TLS certificate or hostname verification disabled.",
    why="enable.ssl.certificate.verification=false or ssl.endpoint.identification.algorithm="
    "none (empty on brokers) lets anyone in the network path impersonate a broker: "
    "credentials and data can be intercepted (man in the middle).",
    fix="Keep verification on and fix the trust store (ssl.ca.location) or the "
    "certificate's subject alternative names instead.",
)
def _tls_off(unit: ConfigUnit) -> Iterator[Hit]:
    verify = explicit(unit, "enable.ssl.certificate.verification")
    if verify and truthy(unit, "enable.ssl.certificate.verification") is False:
        yield (
            "enable.ssl.certificate.verification=false: broker certificates are not checked",
            verify,
        )
    ident = unit.entries.get("ssl.endpoint.identification.algorithm")
    if ident is not None and not ident.dynamic:
        # An empty value turns verification off for brokers and the Java client;
        # librdkafka reads only "none" as off. A YAML null (`key:` alone) is empty, not
        # the word "None" (issue 38 #8).
        text = "" if ident.value is None else ident.text
        empty_is_off = unit.kind == "broker" or client_of(unit) == "java"
        off = text.strip().lower() in (("none", "") if empty_is_off else ("none",))
        if off:
            yield (
                f"ssl.endpoint.identification.algorithm={text or '(empty)'}: "
                "broker hostnames are not verified",
                ident,
            )


@rule(
    "KR035",
    "sasl-without-sasl-protocol",
    E,
    CLIENTS,
    "security",
    summary="sasl.* settings without a SASL security.protocol.",
    why="With security.protocol plaintext or ssl the SASL settings are ignored "
    "(rd_kafka_conf_warn): authentication you configured never happens.",
    fix="Set security.protocol=sasl_ssl.",
)
def _sasl_unused(unit: ConfigUnit) -> Iterator[Hit]:
    protocol = effective(unit, "security.protocol")
    if protocol is None or protocol.startswith("sasl"):
        return
    for key, entry in unit.entries.items():
        if key.startswith("sasl."):
            yield f"{key} is set but security.protocol={protocol} does not use SASL", entry
            return


@rule(
    "KR040",
    "sasl-over-plaintext",
    E,
    (*CLIENTS, "broker"),
    "security",
    summary="SASL over an unencrypted connection (SASL_PLAINTEXT).",
    why="Credentials (PLAIN sends the password as is) and all data cross the network unencrypted.",
    fix="Use SASL_SSL.",
)
def _sasl_plaintext(unit: ConfigUnit) -> Iterator[Hit]:
    if is_client(unit):
        entry = explicit(unit, "security.protocol")
        if entry and entry.text.lower() == "sasl_plaintext":
            yield "security.protocol=sasl_plaintext: credentials and data are not encrypted", entry
        return
    # A listener's protocol is its map entry, else its name (PLAINTEXT://, SASL_PLAINTEXT://).
    # Report the listeners that use SASL_PLAINTEXT once; a map entry no listener uses, and
    # advertised.listeners repeating the same listeners, are not separate problems.
    mapping: dict[str, str] = {}
    proto_map = unit.entries.get("listener.security.protocol.map")
    if proto_map is not None and not proto_map.dynamic:
        for pair in proto_map.text.split(","):
            name, _, protocol = pair.partition(":")
            mapping[name.strip().upper()] = protocol.strip().upper()
    for key in ("listeners", "advertised.listeners"):
        entry = explicit(unit, key)
        if entry is None or entry.dynamic:
            continue
        names = [item.split("://", 1)[0].strip().upper() for item in entry.text.split(",")]
        plain = sorted({n for n in names if mapping.get(n, n) == "SASL_PLAINTEXT" and n})
        if plain:
            yield (
                f"{key}: {', '.join(plain)} use{'s' if len(plain) == 1 else ''} "
                "SASL_PLAINTEXT: credentials and data are not encrypted",
                entry,
            )
            break  # advertised.listeners names the same listeners
    inter = explicit(unit, "security.inter.broker.protocol")
    if inter and inter.text.strip().lower() == "sasl_plaintext":
        yield (
            "security.inter.broker.protocol=SASL_PLAINTEXT: credentials and data are not encrypted",
            inter,
        )


@rule(
    "KR041",
    "credential-in-file",
    E,
    ALL,
    "security",
    summary="A password, secret or private key written literally in a config file or source.",
    why="Files in a repository are copied, logged and read widely; a committed secret "
    "must be considered leaked. (The value is never printed by kresilient.)",
    fix="Load it at run time (environment variable, secret manager, ${file:...} config "
    "provider) and rotate the exposed credential.",
)
def _credential(unit: ConfigUnit) -> Iterator[Hit]:
    for key, entry in unit.entries.items():
        if entry.dynamic or entry.value is None or not is_secret(key):
            continue
        if _SECRET_ELSEWHERE.search(key.lower()) or _PUBLIC_MATERIAL.search(key.lower()):
            continue
        text = entry.text.strip()
        if key.endswith(("jaas.config", "oauthbearer.config")):
            option = _literal_in_options(text)
            if option is not None:
                yield f"{entry.key} holds a literal {option} (value not shown)", entry
            continue
        if not is_stand_in(text):
            yield f"{entry.key} holds a literal credential (value not shown)", entry


@rule(
    "KR050",
    "errors-tolerance-without-dead-letter-topic",
    E,
    ("client",),
    "connect",
    summary="A sink connector (it names topics) with errors.tolerance=all and no "
    "dead-letter topic.",
    why="With errors.tolerance=all a record that fails conversion or transformation is "
    "skipped; without errors.deadletterqueue.topic.name it is dropped silently (only "
    "logged when errors.log.enable=true), and the connector's offsets move past it.",
    fix="Set errors.deadletterqueue.topic.name (with a replication factor of 3) or keep "
    "errors.tolerance=none.",
)
def _tolerance_without_dlq(unit: ConfigUnit) -> Iterator[Hit]:
    if not unit.context.get("connector"):
        return
    tolerance = explicit(unit, "errors.tolerance")
    if tolerance is None or tolerance.text.strip().lower() != "all":
        return
    dlq = unit.entries.get("errors.deadletterqueue.topic.name")
    if dlq is not None and (dlq.dynamic or dlq.text.strip()):
        return
    if "topics" not in unit.entries and "topics.regex" not in unit.entries:
        return  # a source connector (sinks must name topics): no dead-letter queue exists
    yield (
        "errors.tolerance=all without errors.deadletterqueue.topic.name: failed records "
        "are dropped",
        tolerance,
    )


def controller_only(unit: ConfigUnit) -> bool:
    """True for a KRaft controller-only node (``process.roles=controller``): it hosts no
    partitions and runs no group or transaction coordinator, so broker-side settings
    (internal-topic replication, broker.rack) do nothing there."""
    entry = unit.entries.get("process.roles")
    if unit.kind != "broker" or entry is None or entry.dynamic:
        return False
    return {r.strip().lower() for r in entry.text.split(",") if r.strip()} == {"controller"}


# Read by the group and transaction coordinators, which run on brokers only.
_COORDINATOR_KEYS = ("offsets.topic.replication.factor", "transaction.state.log.replication.factor")


@rule(
    "KR042",
    "replication-factor-low",
    E,
    ("topic", "broker"),
    "topic durability",
    summary="Replication factor below 3.",
    why="With 2 replicas one broker down leaves no redundancy (and with "
    "min.insync.replicas=2, no writes); with 1 a broker loss loses data.",
    fix="Use replication factor 3 (default.replication.factor=3 on brokers).",
)
def _rf(unit: ConfigUnit) -> Iterator[Hit]:
    keys: tuple[str, ...] = (
        ("replication.factor",)
        if unit.kind == "topic"
        else ("default.replication.factor", *_COORDINATOR_KEYS)
    )
    if controller_only(unit):  # the controller creates topics with default.replication.factor
        keys = ("default.replication.factor",)
    for key in keys:
        value = number(unit, key)
        if (
            key == "default.replication.factor"
            and explicit(unit, key) is None
            and unit.get("confluent.log.placement.constraints") is not None
        ):
            continue  # Confluent Server places replicas by these constraints, not the default
        if value is not None and 0 < value < 3:
            entry = explicit(unit, key)
            # The key as the file spells it (spec.replicas, replication_factor ...).
            shown = f"{entry.key if entry else key}={fmt(value)}" + (
                "" if entry else " (the default)"
            )
            yield f"{shown}: below 3 replicas", entry


@rule(
    "KR043",
    "min-isr-low",
    E,
    ("topic", "broker"),
    "topic durability",
    summary="min.insync.replicas below 2.",
    why="acks=all then succeeds with only the leader holding the write: a leader crash "
    "loses acknowledged data.",
    fix="Set min.insync.replicas=2 (with replication factor 3).",
)
def _min_isr(unit: ConfigUnit) -> Iterator[Hit]:
    keys = (
        ("min.insync.replicas",)
        if unit.kind == "topic" or controller_only(unit)
        else ("min.insync.replicas", "transaction.state.log.min.isr")
    )
    for key in keys:
        value = number(unit, key)
        if value is not None and value < 2:
            entry = explicit(unit, key)
            shown = f"{key}={fmt(value)}" + ("" if entry else " (the default)")
            yield f"{shown}: acknowledged writes may live on one broker only", entry


@rule(
    "KR044",
    "min-isr-not-below-rf",
    E,
    ("topic", "broker"),
    "topic durability",
    summary="min.insync.replicas not below the replication factor.",
    why="Any single broker restart then blocks every acks=all write with "
    "NOT_ENOUGH_REPLICAS until it is back.",
    fix="Keep min.insync.replicas = replication factor - 1 (2 of 3).",
)
def _min_isr_rf(unit: ConfigUnit) -> Iterator[Hit]:
    rf_key = "replication.factor" if unit.kind == "topic" else "default.replication.factor"
    rf, isr = number(unit, rf_key), number(unit, "min.insync.replicas")
    entry = explicit(unit, "min.insync.replicas", rf_key)
    if entry and rf is not None and isr is not None and isr >= 2 and isr >= rf:
        yield (
            f"min.insync.replicas={fmt(isr)} is not below {rf_key}={fmt(rf)}: one broker "
            "down stops writes",
            entry,
        )


@rule(
    "KR045",
    "unclean-leader-election",
    E,
    ("topic", "broker"),
    "topic durability",
    summary="unclean.leader.election.enable=true.",
    why="An out-of-sync replica may become leader and truncate acknowledged messages.",
    fix="Set unclean.leader.election.enable=false (the default) and restore availability "
    "by bringing in-sync replicas back.",
)
def _unclean(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "unclean.leader.election.enable")
    if entry and truthy(unit, "unclean.leader.election.enable"):
        yield "unclean.leader.election.enable=true: acknowledged data can be lost", entry


@rule(
    "KR046",
    "auto-leader-rebalance-off",
    W,
    ("broker",),
    "topic durability",
    summary="auto.leader.rebalance.enable=false.",
    why="After a broker restart leadership stays on the survivors: load concentrates on "
    "a few brokers until someone runs a preferred election.",
    fix="Leave auto.leader.rebalance.enable=true, or schedule preferred leader elections.",
)
def _rebalance_off(unit: ConfigUnit) -> Iterator[Hit]:
    entry = explicit(unit, "auto.leader.rebalance.enable")
    if entry and truthy(unit, "auto.leader.rebalance.enable") is False:
        yield "auto.leader.rebalance.enable=false: leaders are not moved back", entry


@rule(
    "KR047",
    "no-broker-rack",
    W,
    ("broker",),
    "topic durability",
    summary="Broker without broker.rack.",
    why="Without racks Kafka may place all replicas of a partition in one zone: a zone "
    "outage then takes the partition (and its data) down.",
    fix="Set broker.rack to the broker's zone.",
)
def _no_rack(unit: ConfigUnit) -> Iterator[Hit]:
    if unit.context.get("single_host"):
        return  # all brokers on one host: there are no zones to spread across
    if unit.get("broker.rack") is None and not controller_only(unit):
        # Strimzi sets broker.rack from spec.kafka.rack: name the key the file would hold
        key = "spec.kafka.rack" if unit.source == "strimzi" else "broker.rack"
        yield f"{key} is unset: replicas are not spread across zones", None


@rule(
    "KR048",
    "message-size-above-request-size",
    W,
    ("broker",),
    "message size",
    summary="Broker message.max.bytes above socket.request.max.bytes.",
    why="A produce request carrying a batch as large as message.max.bytes allows is "
    "rejected by the broker's socket layer (socket.request.max.bytes), so producers see "
    "disconnects instead of a clear MSG_SIZE_TOO_LARGE. (replica.fetch.max.bytes is not a "
    "hard limit since KIP-74 and is not checked.)",
    fix="Keep socket.request.max.bytes well above message.max.bytes.",
)
def _sizes_broker(unit: ConfigUnit) -> Iterator[Hit]:
    msg = number(unit, "message.max.bytes")
    request = number(unit, "socket.request.max.bytes")
    entry = explicit(unit, "message.max.bytes", "socket.request.max.bytes")
    if entry and msg is not None and request is not None and msg > request:
        yield (
            f"message.max.bytes={fmt(msg)} exceeds socket.request.max.bytes={fmt(request)}",
            entry,
        )


def _size_limit(units: list[ConfigUnit]) -> tuple[float, ConfigUnit] | None:
    best: tuple[float, ConfigUnit] | None = None
    for unit in units:
        key = {"topic": "max.message.bytes", "broker": "message.max.bytes"}.get(unit.kind)
        if key and explicit(unit, key):
            value = number(unit, key)
            if value is not None and (best is None or value < best[0]):
                best = (value, unit)
    return best


def _cross_sizes(units: list[ConfigUnit]) -> Iterator[tuple[ConfigUnit, str, Entry | None]]:
    limit = _size_limit(units)
    if limit is None:
        return
    value, where = limit
    origin = f"{where.path}" + (f" ({where.name})" if where.name else "")
    for unit in units:
        if unit.kind == "producer":
            entry = explicit(unit, "message.max.bytes")
            own = number(unit, "message.max.bytes")
            if entry and own is not None and own > value:
                yield (
                    unit,
                    (
                        f"message.max.bytes={entry.shown} exceeds the {fmt(value)} "
                        f"limit in {origin}: larger messages fail MSG_SIZE_TOO_LARGE"
                    ),
                    entry,
                )
        elif unit.kind == "consumer":
            entry = explicit(unit, "fetch.max.bytes")
            own = number(unit, "fetch.max.bytes")
            if entry and own is not None and own < value:
                yield (
                    unit,
                    (
                        f"fetch.max.bytes={entry.shown} is below the {fmt(value)} "
                        f"message limit in {origin}"
                    ),
                    entry,
                )


def _duplicate_instance_ids(
    units: list[ConfigUnit],
) -> Iterator[tuple[ConfigUnit, str, Entry | None]]:
    seen: dict[tuple[str | None, str], tuple[ConfigUnit, Entry]] = {}
    for unit in units:
        entry = explicit(unit, "group.instance.id")
        if unit.kind != "consumer" or entry is None or unit.context.get("share"):
            continue  # a share consumer does not take the key at all (KR071)
        group = explicit(unit, "group.id")
        first, first_entry = seen.setdefault(
            (group.text if group else None, entry.text), (unit, entry)
        )
        if first is not unit:
            yield (
                unit,
                f"group.instance.id={entry.shown} is also used at {first.path}:"
                f"{first_entry.line}: the members fence each other",
                entry,
            )


project_rule(
    "KR031",
    "duplicate-group-instance-id",
    E,
    ("consumer",),
    "rebalance safety",
    summary="The same group.instance.id in two consumer configs.",
    why="Static members with the same id fence each other (FENCED_INSTANCE_ID is "
    "fatal for the consumer).",
    fix="Give every consumer instance its own group.instance.id (e.g. from the pod name).",
)(_duplicate_instance_ids)
project_rule(
    "KR049",
    "message-size-cross-config",
    W,
    ("producer", "consumer"),
    "message size",
    summary="Client message size limit that does not fit a topic or broker limit linted alongside.",
    why="A producer's message.max.bytes above the topic's max.message.bytes fails "
    "with MSG_SIZE_TOO_LARGE; a consumer's fetch.max.bytes below it needs several "
    "round trips per message batch.",
    fix="Align message.max.bytes (producer), max.message.bytes (topic), "
    "message.max.bytes (broker) and fetch.max.bytes (consumer).",
)(_cross_sizes)


#: Broker default of transaction.max.timeout.ms (15 minutes).
_TXN_MAX_DEFAULT = 900000.0


def _txn_timeouts(units: list[ConfigUnit]) -> Iterator[tuple[ConfigUnit, str, Entry | None]]:
    limits = [
        (number(u, "transaction.max.timeout.ms"), u)
        for u in units
        if u.kind == "broker" and explicit(u, "transaction.max.timeout.ms")
    ]
    known = [(v, u) for v, u in limits if v is not None]
    limit, where = min(known, key=lambda x: x[0]) if known else (_TXN_MAX_DEFAULT, None)
    for unit in units:
        if unit.kind != "producer" or not explicit(unit, "transactional.id"):
            continue
        entry = explicit(unit, "transaction.timeout.ms")
        value = number(unit, "transaction.timeout.ms")
        if entry and value is not None and value > limit:
            source = (
                f"transaction.max.timeout.ms={fmt(limit)} in {where.path}"
                if where is not None
                else f"the broker default transaction.max.timeout.ms={fmt(limit)}"
            )
            yield (
                unit,
                f"transaction.timeout.ms={entry.shown} exceeds {source}: "
                "init_transactions() fails with INVALID_TRANSACTION_TIMEOUT",
                entry,
            )


project_rule(
    "KR052",
    "transaction-timeout-above-broker-max",
    E,
    ("producer",),
    "producer durability",
    summary="A transactional producer's transaction.timeout.ms above the brokers' "
    "transaction.max.timeout.ms (a broker config linted alongside, else its 900000 default).",
    why="The transaction coordinator refuses InitProducerId with INVALID_TRANSACTION_TIMEOUT, "
    "a fatal error for the producer: it never starts a transaction.",
    fix="Lower transaction.timeout.ms, or raise transaction.max.timeout.ms on every broker.",
)(_txn_timeouts)


# ----------------------------------------------------------------------------- meta and audit

for _meta in (
    Rule(
        id="KR000",
        name="parse-error",
        severity=E,
        family="input",
        kinds=frozenset(ALL),
        scope="meta",
        input_error=True,
        summary="The file could not be read or parsed.",
        why="A config the linter cannot parse is also one the application may not load; "
        "nothing in it was checked. Hostile input is refused the same way, quickly: a file "
        "larger than max-file-size (1 MiB by default), nested deeper than 100 levels, whose "
        "YAML aliases expand past about 100,000 nodes, that is not UTF-8, or whose keys or "
        "values are not valid Unicode (an unpaired \\uD800 escape).",
        fix="Fix the syntax at the reported line and column; for a file that is too large, "
        "raise max-file-size in [tool.kresilient.lint] or exclude the file.",
    ),
    Rule(
        id="KR053",
        name="dev-stack-replication",
        severity=N,
        family="topic durability",
        kinds=frozenset({"topic", "broker"}),
        scope="meta",
        summary="Replication findings (KR042, KR043, KR044, KR047) on a file that says it is "
        "a single-broker or local dev stack, folded into one info line.",
        why="A one-broker stack cannot hold 3 replicas, and the file says so itself (a "
        "one-voter KRaft quorum, listeners on localhost only, a compose file or Strimzi "
        "cluster with one broker, a Terraform provider on localhost, a topicctl local "
        "environment, or a comment such as 'single-broker' or 'development testing'). "
        "Reporting each replication setting as an error there would be noise; the line keeps "
        "them visible for the day the config is reused in production.",
        fix="Nothing for a dev stack. Before production: replication factor 3, "
        "min.insync.replicas=2, broker.rack on every broker (run the linter on the "
        "production config, where no dev-stack evidence folds these).",
    ),
    Rule(
        id="KR054",
        name="refused-by-kresilient",
        severity=E,
        family="lint = runtime",
        kinds=frozenset({"producer", "consumer", "client"}),
        scope="meta",
        summary="A setting ResilientProducer/ResilientConsumer refuse that no other rule "
        "reports (statistics.interval.ms=0, message.timeout.ms=0, "
        "delivery.report.only.error, two aliases with different values ...).",
        why="kresilient.config.REFUSALS is the one table of what the clients refuse: the "
        "client raises ConfigError or UnsafeConfigError at construction, so a file lint "
        "passed would not start. Every refusal of that table is a lint error in a file a "
        "kresilient client would read (librdkafka dialect, or a dict passed to "
        "ResilientProducer/ResilientConsumer); the finding of the rule that reports it "
        "becomes an error, and KR054 carries the client's own message where none does.",
        fix="Change the value as the message says. For a value that only weakens a "
        "guarantee (UnsafeConfigError), accept it as the runtime does: "
        "allow_unsafe=('acks',) in code, '# kresilient: allow acks' on (or above) the "
        "line in a file; the finding then stays a warning.",
    ),
    Rule(
        id="KR055",
        name="config-not-understood",
        severity=N,
        family="input",
        kinds=frozenset({"producer", "consumer", "admin", "client"}),
        scope="meta",
        summary="A client config lint could not resolve statically (built at run time, "
        "read from a file or the environment, passed as **kwargs): not checked, or only "
        "its literal keys.",
        why="'0 findings' must never stand for 'nothing understood': a Python client whose "
        "config comes from read_config(...) may use SASL_PLAINTEXT or acks=0 and lint "
        "cannot see it. It is listed in every output format and counted in the summary.",
        fix="Read the config file by a literal relative path lint can follow (it checks "
        "JSON, YAML, TOML and configparser files in the linted tree), lint that file itself "
        "(.properties/.ini/.yaml/.json), or build the config from literals where lint can "
        "see it; ignore KR055 for files you know are covered.",
    ),
    Rule(
        id="KR099",
        name="suppression-without-reason",
        severity=W,
        family="input",
        kinds=frozenset(ALL),
        scope="meta",
        summary="Inline suppression without a reason, or naming an unknown rule or property.",
        why="Every suppression must say why the finding does not apply, so reviewers can "
        "judge it; such a suppression is not applied.",
        fix="Write '# kresilient: ignore[KR006] reason: <why>', or "
        "'# kresilient: allow acks' for a value the clients accept with allow_unsafe.",
    ),
    Rule(
        id="KR060",
        name="under-replicated-partition",
        severity=E,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Partition with fewer in-sync replicas than replicas (live audit).",
        why="The partition has lost redundancy; with ISR below min.insync.replicas, acks=all "
        "writes fail.",
        fix="Find the lagging or stopped broker (disk, network, GC) and bring it back.",
    ),
    Rule(
        id="KR061",
        name="offline-partition",
        severity=E,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Partition without a leader (live audit).",
        why="Nobody can read or write it until an in-sync replica returns.",
        fix="Restart the brokers holding its replicas; avoid unclean election unless data "
        "loss is acceptable.",
    ),
    Rule(
        id="KR062",
        name="leader-imbalance",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Leaders away from their preferred replica (per broker imbalance).",
        why="Load concentrates on some brokers, typically after a restart with "
        "auto.leader.rebalance.enable=false.",
        fix="Run a preferred leader election (AdminClient.elect_leaders PREFERRED).",
    ),
    Rule(
        id="KR063",
        name="replicas-share-rack",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Replicas of one partition on brokers of the same rack (live audit).",
        why="A rack or zone outage takes several replicas down at once.",
        fix="Reassign the partition so its replicas span racks.",
    ),
    Rule(
        id="KR064",
        name="consumer-group-lag",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Consumer group lag above the threshold (live audit).",
        why="The group falls behind; with retention it will eventually skip messages.",
        fix="Scale the consumers, speed processing, or investigate stuck partitions.",
    ),
    Rule(
        id="KR065",
        name="audit-failed",
        severity=E,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        input_error=True,
        summary="The cluster could not be reached (the message names each host and why).",
        why="Nothing could be checked: no broker answered the first metadata request within "
        "--timeout (connection refused, a name that does not resolve, TLS or "
        "authentication failure, or no answer).",
        fix="Check --bootstrap-servers, network access, credentials (--command-config) and "
        "ACLs (Describe on Cluster, Topic, Group).",
    ),
    Rule(
        id="KR066",
        name="audit-incomplete",
        severity=E,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="Part of the cluster could not be checked: a partition's lag (offline "
        "partition), a group's offsets or a topic's configs could not be read (live audit).",
        why="The rest of the audit is reported, but a lag or a setting that could not be "
        "read may be the one in trouble; an offline partition's consumers are stalled.",
        fix="Bring the partition's replicas back (see KR061), or grant the missing ACL "
        "(Describe on Group / Topic, DescribeConfigs), then audit again.",
    ),
    # the troubleshooting guides' cluster-side symptoms (issue 21)
    Rule(
        id="KR067",
        name="log-dir-usage",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="A broker's log dir is fuller than the threshold (default 80%, "
        "--disk-threshold) (live audit, DescribeLogDirs).",
        why="Disk exhaustion is the guides' first cause of outages: a broker whose log dir "
        "fills cannot append, takes its partitions offline and may not restart. Usage grows "
        "with retention longer than the disk allows, or segments that never roll or delete "
        "(future timestamps, see KR068). Over SASL or TLS the usage is not read (the request "
        "is sent over PLAINTEXT only) and an info finding says so.",
        fix="Add disk or shorten retention.ms/retention.bytes; make segments close and "
        "become deletable (log.segment.bytes, log.roll.hours); find records with future "
        "timestamps (KR068).",
    ),
    Rule(
        id="KR068",
        name="future-timestamps",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="A partition holds a record timestamped in the future beyond the tolerance "
        "(default 1 h) (live audit, ListOffsets max-timestamp).",
        why="Time-based retention deletes a segment only once its largest timestamp is older "
        "than retention.ms: a record stamped days ahead (a producer clock advanced during "
        "testing, an application setting timestamps itself) keeps its segment, and every "
        "later one, on disk until that date: disk exhaustion.",
        fix="Fix the producer's clock or timestamps; bound message.timestamp.after.max.ms "
        "(KR070) or use message.timestamp.type=LogAppendTime; delete the affected records "
        "(kafka-delete-records.sh) once consumers are past them.",
    ),
    Rule(
        id="KR069",
        name="offset-expiry-risk",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="A consumer group without members has been idle for more than half of "
        "offsets.retention.minutes, or a group named with --group has no committed offset "
        "(live audit).",
        why="A group left empty longer than offsets.retention.minutes loses its committed "
        "offsets; the next consumer starts from auto.offset.reset and re-reads everything "
        "(earliest) or skips what arrived meanwhile (latest). The Admin API does not give the "
        "commit time: the idle time is estimated by the age of the newest record the group "
        "committed past, which overstates it when records carry old producer timestamps "
        "(replayed data). An estimate beyond the retention is refuted by the offsets still "
        "being there and not reported; one between half and all of it may be a false alarm "
        "for such a group.",
        fix="Restart a consumer of the group before the retention passes, raise "
        "offsets.retention.minutes beyond the longest planned downtime, and check what "
        "auto.offset.reset does on a restart; reset expired offsets explicitly "
        "(kafka-consumer-groups.sh --reset-offsets).",
    ),
    Rule(
        id="KR070",
        name="permissive-timestamp-bound",
        severity=W,
        family="audit",
        kinds=frozenset({"cluster"}),
        scope="audit",
        summary="A CreateTime topic accepts records more than a day in the future "
        "(message.timestamp.after.max.ms) (live audit).",
        why="With message.timestamp.type=CreateTime the broker keeps the producer's "
        "timestamp; a bound above a day lets a skewed or buggy producer write records that "
        "stall retention (KR068). Kafka 4 bounds it to one hour by default; Kafka 3 did not. "
        "message.timestamp.before.max.ms (records in the past) is not reported: old "
        "timestamps make segments deletable sooner, not never.",
        fix="Set message.timestamp.after.max.ms=3600000, or "
        "message.timestamp.type=LogAppendTime when producer time is not needed.",
    ),
):
    register(_meta)
