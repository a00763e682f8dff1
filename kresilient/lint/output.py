"""Render findings as text, JSON, SARIF 2.1.0 or GitHub workflow annotations."""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any, Protocol

from kresilient import _catalog as catalog
from kresilient.lint.model import Finding, LintStats, Severity
from kresilient.lint.registry import CLIENTS, RULES, Rule, iter_rules

__all__ = ["FORMATS", "render"]

_SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def _where(f: Finding) -> str:
    return f"{f.path}:{f.line}:{f.col}" if f.line > 0 else f.path


def _files(stats: LintStats) -> str:
    read = f"{stats.files_read} file(s) read: {stats.with_config} with Kafka settings"
    return (
        f"{read}, {len(stats.skipped)} skipped (no Kafka settings), "
        f"{stats.failed} not readable (KR000), "
        f"{len(stats.not_understood)} config(s) not understood (KR055)"
    )


def render_text(
    findings: Sequence[Finding], tool: str = "lint", *, stats: LintStats | None = None
) -> str:
    """``path:line:col: KR006 [error] message`` per finding, then a summary line (with the
    files read and skipped when ``stats`` is given)."""
    lines = [f"{_where(f)}: {f.rule} [{f.severity.label}] {f.message}" for f in findings]
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    summary = ", ".join(f"{counts[s]} {s.label}" for s in reversed(Severity))
    files = f"; {_files(stats)}" if stats is not None else ""
    lines.append(f"kresilient {tool}: {len(findings)} finding(s) ({summary}){files}")
    return "\n".join(lines) + "\n"


def render_json(
    findings: Sequence[Finding], tool: str = "lint", *, stats: LintStats | None = None
) -> str:
    """A JSON list of findings: rule, name, severity, path, line, column, message, key."""
    return (
        json.dumps(
            [
                {
                    "rule": f.rule,
                    "name": RULES[f.rule].name,
                    "severity": f.severity.label,
                    "path": f.path,
                    "line": f.line,
                    "column": f.col,
                    "message": f.message,
                    "key": f.key,
                }
                for f in findings
            ],
            indent=2,
        )
        + "\n"
    )


def _github_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def render_github(
    findings: Sequence[Finding], tool: str = "lint", *, stats: LintStats | None = None
) -> str:
    """GitHub Actions workflow commands (``::error file=...,line=...::message``)."""
    out = []
    for f in findings:
        props = []
        if f.line > 0:
            props += [f"file={_github_escape(f.path, True)}", f"line={f.line}", f"col={f.col}"]
        props.append(f"title={_github_escape(f'{f.rule} {RULES[f.rule].name}', True)}")
        out.append(f"::{_GITHUB_LEVEL[f.severity]} {','.join(props)}::{_github_escape(f.message)}")
    return "\n".join(out) + ("\n" if out else "")


def _sarif_rule(rule: Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": f"{rule.summary} {rule.why}"},
        "help": {
            "text": rule.help_text,
            "markdown": f"**{rule.summary}**\n\n**Why:** {rule.why}\n\n**Fix:** {rule.fix}",
        },
        "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity]},
        "properties": {"tags": [rule.family], "precision": "high"},
    }


def _artifact(path: str) -> dict[str, str]:
    if "://" in path:
        return {"uri": path}
    if os.path.isabs(path):
        return {"uri": pathlib.Path(path).as_uri()}
    return {"uri": pathlib.PurePath(path).as_posix(), "uriBaseId": "%SRCROOT%"}


def render_sarif(
    findings: Sequence[Finding], tool: str = "lint", *, stats: LintStats | None = None
) -> str:
    """A SARIF 2.1.0 log with every rule's metadata and help, one result per finding (the
    files read and skipped in the invocation's properties when ``stats`` is given)."""
    from kresilient._version import __version__

    rules = list(iter_rules())
    index = {r.id: i for i, r in enumerate(rules)}
    results = []
    for f in findings:
        location: dict[str, Any] = {"artifactLocation": _artifact(f.path)}
        if f.line > 0:
            location["region"] = {"startLine": f.line, "startColumn": max(f.col, 1)}
        result: dict[str, Any] = {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [{"physicalLocation": location}],
        }
        if f.key:
            result["properties"] = {"key": f.key}
        results.append(result)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "kresilient",
                "semanticVersion": __version__,
                "rules": [_sarif_rule(r) for r in rules],
            }
        },
        "invocations": [_invocation(findings, stats)],
        "columnKind": "unicodeCodePoints",
        "results": results,
    }
    if any("uriBaseId" in _artifact(f.path) for f in findings):
        run["originalUriBaseIds"] = {"%SRCROOT%": {"uri": pathlib.Path.cwd().as_uri() + "/"}}
    log = {"$schema": _SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(log, indent=2) + "\n"


def _invocation(findings: Sequence[Finding], stats: LintStats | None) -> dict[str, Any]:
    ok = not any(RULES[f.rule].input_error for f in findings)
    invocation: dict[str, Any] = {"executionSuccessful": ok}
    if stats is not None:
        invocation["properties"] = {
            "filesRead": stats.files_read,
            "filesWithKafkaSettings": stats.with_config,
            "filesSkipped": len(stats.skipped),
            "filesNotReadable": stats.failed,
            "configsNotUnderstood": len(stats.not_understood),
        }
        notes = [
            {
                "level": "note",
                "descriptor": {"id": "KR055"},
                "message": {"text": reason},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": _artifact(path),
                            **({"region": {"startLine": line}} if line > 0 else {}),
                        }
                    }
                ],
            }
            for path, line, reason in stats.not_understood
        ]
        if notes:
            invocation["toolExecutionNotifications"] = notes
        if not stats.with_config and ok:
            invocation["executionSuccessful"] = False
            invocation["toolExecutionNotifications"] = [
                {"level": "error", "message": {"text": "no Kafka configuration found"}},
                *invocation.get("toolExecutionNotifications", []),
            ]
    return invocation


class Renderer(Protocol):
    """A report renderer: ``(findings, tool, *, stats=None) -> str``."""

    def __call__(
        self, findings: Sequence[Finding], tool: str = ..., *, stats: LintStats | None = ...
    ) -> str: ...


FORMATS: dict[str, Renderer] = {
    "text": render_text,
    "json": render_json,
    "sarif": render_sarif,
    "github": render_github,
}


def render(
    findings: Sequence[Finding], fmt: str, tool: str = "lint", *, stats: LintStats | None = None
) -> str:
    """Render ``findings`` in one of :data:`FORMATS` (``stats``: what a lint run read)."""
    return FORMATS[fmt](findings, tool, stats=stats)


_DOC_HEADER = """\
# kresilient lint and audit rules

<!-- Generated from the rule registry: do not edit by hand. Regenerate with
     python -c "from kresilient.lint.output import rules_markdown as m; print(m(), end='')" \\
       > docs/lint-rules.md
     (tests/test_lint_docs.py fails when this page and the registry differ.) -->

`kresilient lint PATH...` checks Java `.properties` (and `.conf`, `.cfg`, `.ini`: `key = value`
lines, `[section]` headers and `;` comments as librdkafka programs and Python's configparser
write them), YAML, JSON, TOML, `.env` (`KAFKA_*`) files, Terraform (`.tf`) and Python sources
(configs passed to confluent-kafka and kresilient clients).
`kresilient audit --bootstrap-servers HOSTS` checks a live cluster through the Admin API:
durability settings, partition health, leader balance, racks, lag, and the guides' cluster-side
symptoms: log-dir usage (`--disk-threshold FRACTION`, default 0.8; 0 skips it), records
timestamped in the future (`--future-tolerance-ms MS`, default one hour), groups whose offsets
are at risk of expiry, permissive timestamp bounds. A lagging follower is not visible through
the Admin API (no follower log end offset): KR060 names it once it leaves the ISR; before
that, only the broker's JMX `MaxLag` shows it.
`kresilient lint --explain ID` prints one rule; `--list-rules` lists them all.

- Output: `--format text` (`path:line:col: ID [severity] message`), `json`, `sarif`
  (SARIF 2.1.0 for code scanning), `github` (workflow annotations); `-o FILE`.
- `--fix` makes the safe, mechanical fixes in `.properties` (`.conf`, `.cfg`, `.ini`), YAML,
  `.env` and Python files, keeping
  comments, layout, quoting and line endings, then reports what is left: `acks` to `all`
  (KR006, KR007), `enable.idempotence=true` (KR008, unless an explicit setting librdkafka
  refuses beside it is there: then a note), `partitioner=murmur2_random` (KR012), Spring
  `enable-auto-commit: false` (KR018; elsewhere turning auto-commit off needs code that
  commits, so it is not touched) and `auto.offset.reset=earliest` (KR021). A value is changed
  in place; an unset key is added only to a plain `.properties` file. In Python only a literal
  written at the key is replaced (`'acks': 1` becomes `'acks': 'all'`, `False` becomes
  `True`; located with `ast`, the file parsed again); a name, an expression or a value read
  from another file is left with a note. Only a finding that is an error for the file's
  reader is fixed (a Java client's `acks=1` is a warning: not edited; make the rule an error
  in `[tool.kresilient.lint.severity]` to have it fixed). Suppressed and ignored
  findings are not fixed; a fix that would add any finding is not made; a file with nothing
  to fix is not written. `--diff` prints the change as a unified diff and writes nothing
  (exit 1 when there is something to fix).
- Exit code: 0 clean, 1 a finding at or above `--fail-on` (default `error`), 2 a usage error
  (an unknown option, rule id or prefix), a file that cannot be parsed (KR000), no Kafka
  configuration found in the paths (`--allow-no-config` makes that 0, for a pre-commit hook
  that passes every changed file) or a cluster that cannot be reached (KR065).
- A Python client whose config is read from a file (`json.load(open("client.json"))`,
  `yaml.safe_load`, `tomllib.load`, a configparser section after `parser.read("kafka.ini")`,
  `Path(__file__).parent / "client.json"`) is followed when the path is a literal naming a
  file in the linted tree, beside the source or in one of its three parent directories: the
  file's keys are checked as that client's config (configparser's `[DEFAULT]` included) and
  reported at the line that reads them. A config lint cannot resolve statically (a path
  known only at run time such as `args.config_file`, a file that is not there, a function's
  result, `**kwargs`) is "not understood": a KR055 info finding at the constructor naming
  the file and why it was not followed (in text, JSON, SARIF and GitHub output), counted in
  the text summary, and a SARIF `toolExecutionNotifications` note; "0 findings" never
  stands for "nothing understood".
- The text summary counts the files read, those with Kafka settings, those skipped (no Kafka
  settings; `--verbose` lists them) and those not readable, so "0 findings" never hides
  "0 files understood". An audit
  that could read only part of the cluster reports the rest and names what is missing (KR066,
  exit 1): one offline partition never hides the lag of the others.
- Settings in `pyproject.toml` (found by walking up from the current directory or the linted
  paths):

  ```toml
  [tool.kresilient.lint]
  select = ["KR0"]            # id prefixes to run (default: all)
  ignore = ["KR026", "KR030"] # id prefixes to skip
  fail-on = "warning"
  exclude = ["tests/fixtures/*"]
  lag-threshold = 1000        # audit: KR064
  max-file-size = 1048576     # bytes; a larger file is KR000, not read
  client = "java"             # judge client configs by Java defaults (default: detect)
  [tool.kresilient.lint.severity]
  KR021 = "error"
  ```
- A key and its librdkafka aliases (`acks` / `request.required.acks`, `linger.ms` /
  `queue.buffering.max.ms` ...) are one setting whose value is the LAST one set, as
  librdkafka applies properties in order; rules judge that one and `--fix` edits its line.
- Inline suppressions need a reason, or they are not applied and reported as KR099:
  `acks: 1  # kresilient: ignore[KR007] reason: metrics, loss acceptable` on the line (or
  alone on the line above; `.properties` files have no end-of-line comments), or
  `# kresilient: ignore-file[KR030] reason: ...` for the whole file.
- Lint = runtime: `kresilient.config.REFUSALS` is the one table of what `ResilientProducer`
  and `ResilientConsumer` refuse (`ConfigError`, `UnsafeConfigError`). In a file a
  kresilient client would read (a librdkafka-dialect file, or a dict passed to
  `ResilientProducer`/`ResilientConsumer`/`producer_config`/`consumer_config`) every
  refusal is an error (exit 1): the finding of the rule that reports it (`acks=1` is
  KR007, auto-commit before processing KR018, `auto.offset.reset=latest` KR021 ...) is
  raised to error, and KR054 carries the client's message where no rule does. The opt-out
  is the runtime's: `allow_unsafe=("acks",)` in code, and in a file
  `# kresilient: allow acks` (several keys: `allow acks, retries`; a reason may follow as
  `reason: ...`) on the setting's line or alone above it; the finding then stays a warning,
  as the client logs one warning. Conflicts (`ConfigError`) have no opt-out. A file
  `bootstrap.servers` or `group.id` is missing from is not refused (the application may add
  them), a Python dict passed to a kresilient client is. Java-client files (Spring,
  `sasl.jaas.config` ...) and aiokafka/kafka-python calls keep their own severities.
- A file with producer and consumer keys is a generic client file, judged per role: its
  producer keys as a producer reads them, its consumer keys as a consumer does (never "acks
  is ignored by a consumer"), and without advice about keys it leaves unset.
- Secrets (passwords, private keys, tokens, JAAS configs) are never printed: not in a
  message, a `--fix` note, the JSON/SARIF/GitHub reports, nor the context lines of `--diff`
  (a secret's line is shown with its value as `<redacted>`). A key is secret when the
  catalogs' types say so (every property librdkafka flags sensitive, every Java `PASSWORD`
  key such as `ssl.keystore.key`; see docs/security.md). KR041 reports
  literal secrets only: placeholders (`<your secret>`, `dummy`), templates (`{{ ... }}`),
  references (`${VAR}`, `${file:...}`), masks and file names (`*.location`,
  `KAFKA_SSL_*_CREDENTIALS`) are not secrets, and certificates (`ssl.ca.pem`,
  `ssl.truststore.certificates`, `*.certificate.chain`: public material, though never
  printed) are not credentials; options inside JAAS strings (`password`,
  `clientSecret`) are looked at one by one.
- Readers (each finding points at the file, line and column of the setting):
  - Spring Boot `application.yml`/`application.properties` (and profiles, one YAML
    document each): `spring.kafka.*` with Spring's relaxed names (`enable-auto-commit`,
    `enableAutoCommit`, `ENABLE_AUTO_COMMIT`), the `producer`, `consumer`, `admin` and
    `streams` sections, their `properties.*` maps and `ssl.*`; Spring durations (`30s`,
    `PT5M`) and sizes (`16KB`) become ms and bytes. One config per role, holding the shared
    settings; findings quote the key as written (`spring.kafka.producer.acks`). `streams`
    is checked for security rules only (Kafka Streams has its own defaults).
  - Strimzi custom resources (`apiVersion: kafka.strimzi.io/...`, any document of a
    multi-document YAML): `KafkaTopic` (`spec.replicas` as the replication factor,
    `spec.partitions`, `spec.config`, the name from `spec.topicName` or `metadata.name`)
    and `Kafka` (`spec.kafka.config` as a broker config; `spec.kafka.rack` counts as
    `broker.rack`, which Strimzi sets). Other Strimzi resources hold no Kafka config.
  - Jikkou `KafkaTopic`/`KafkaTopicList` (`apiVersion: kafka.jikkou.io/...`,
    `spec.replicas`, `spec.configs`) and topicctl topic specs (`meta.name` with
    `spec.replicationFactor`, `spec.retentionMinutes` as `retention.ms`, `spec.settings`).
  - Terraform (`.tf`, parsed with python-hcl2): `kafka_topic` of the Mongey/kafka provider
    (`replication_factor`, `partitions`, `config = {...}`) and `confluent_kafka_topic`
    (`partitions_count`, `config`). An expression (`var.rf`, `each.value.x`,
    `"${local.x}"`) is not guessed: no rule judges it. A `.tf` file without such resources
    counts as skipped, not clean.
  - Kafka Connect worker `.properties` (recognised by `offset.storage.topic`,
    `key.converter` ...): the `producer.*`, `consumer.*` and `admin.*` clients (read by
    the Java client with Connect's defaults: `acks=all`, one request in flight,
    idempotence off since 3.2, KAFKA-13759) and the internal topics' replication factors
    (`offset.storage.replication.factor` ...; `-1` is the broker's default); connector
    `.properties` (`connector.class`): `producer.override.*`/`consumer.override.*` and
    `errors.tolerance=all` without a dead-letter topic (KR050). The REST form of a
    connector (`{"name": ..., "config": {...}}` JSON) is read the same way, and a
    connector's own credentials (`database.password` ...) are judged by KR041. Strimzi
    `KafkaConnect` (`spec.config`) and `KafkaMirrorMaker2` (the replication factors of the
    mirrored, offset-syncs, checkpoints and heartbeats topics) too.
  - docker-compose `environment:` as a mapping or as a `- NAME=value` list, with the Kafka
    image's `KAFKA_*` and bitnami's `KAFKA_CFG_*` variables.
  - Python calls: dicts passed to confluent-kafka and kresilient clients (as before), and
    the keyword arguments of aiokafka's `AIOKafkaProducer`/`AIOKafkaConsumer` and
    kafka-python's `KafkaProducer`/`KafkaConsumer` (`acks=1`, `enable_idempotence=False`,
    `enable_auto_commit=True`; positional arguments are topics). These two are judged by
    their own defaults: aiokafka 0.14 `acks=1`, no idempotence, auto-commit of fetched
    positions from a background task; kafka-python 2.1+ the Java client's. Only the rules
    those options decide run on them (KR001, KR006-KR008, KR010, KR018, KR021, KR036,
    KR040, KR041).
- Clients: a client config is judged by the defaults of the library that reads it:
  librdkafka (confluent-kafka, the default) or the Java client. Java is assumed for Spring
  Boot files and for configs naming Java serializer classes or Java-only keys
  (`key.serializer`, `partitioner.class`, `max.poll.records` ...); `--client java` or
  `--client librdkafka` (or `client = "java"` in `[tool.kresilient.lint]`) overrides that.
  Java defaults come from Kafka's own ConfigDef (4.1): `acks=all`, `enable.idempotence=true`
  (effective since 3.0.1/3.1.1/3.2.0, KAFKA-13598; turned off silently when it is unset and
  `acks`, `retries` or `max.in.flight.requests.per.connection` conflict, KAFKA-13673, which
  KR008 reports), the murmur2 partitioner, `[range, cooperative-sticky]` assignors; Spring
  Kafka's listener container commits after processing (`enable.auto.commit=false` unless
  set). Rules about librdkafka's own constraints or names are marked "librdkafka only"
  below and skipped for Java configs; a finding about an unset key names the defaults it
  assumed, e.g. `(Spring Kafka / Java client defaults)`.
- Kinds: producer, consumer, admin, client (role unknown), broker, topic; detected from the
  keys or a section name (`producer:`, `topics:` ...), or forced with `--kind`. Keys that
  brokers and Java clients share (`ssl.*`, `sasl.*`) do not make a file a broker config: a
  client TLS file stays a client file. A Java-only key (`sasl.jaas.config`,
  `ssl.truststore.location`) makes a file a Java client config.
- Node roles: a KRaft controller-only node (`process.roles=controller`) gets no broker-side
  findings (internal-topic replication, `transaction.state.log.min.isr`, `broker.rack`);
  it keeps `default.replication.factor` and `min.insync.replicas`, which the controller
  applies to topics created without them. ZooKeeper-mode keys are known on a ZooKeeper
  broker and reported as ignored on a KRaft node.
- Dev stacks: when a file says it is a single-broker or local dev stack (a one-voter KRaft
  quorum, listeners on localhost only, a compose file or Strimzi cluster with one broker, a
  Terraform provider on localhost, a topicctl local environment, or a comment such as
  `single-broker` or `development testing`), its replication findings (KR042, KR043,
  KR044, KR047) become one KR053 info line naming the evidence. Values alone never count
  as evidence: `offsets.topic.replication.factor=1` by itself is the hazard KR042 reports.
"""


def rules_markdown() -> str:
    """The docs/lint-rules.md page: a summary table, then every rule's why and fix."""
    # The audit registers its cluster rules on import; the page lists every rule whatever
    # was imported before (audit imports this package, so not at module level).
    from kresilient.lint import audit  # noqa: F401

    rules = list(iter_rules())
    lines = [
        _DOC_HEADER,
        f"Property catalog: librdkafka {catalog.librdkafka_version()}, Apache Kafka "
        f"{catalog.kafka_version()} broker/topic configs. {len(rules)} rules.\n",
        "| ID | Name | Severity | Family | Applies to |",
        "|----|------|----------|--------|------------|",
    ]
    for r in rules:
        kinds = ", ".join(sorted(r.kinds))
        if r.scope == "unit" and r.clients != frozenset(CLIENTS):
            kinds += f" ({', '.join(sorted(r.clients))} only)"
        lines.append(
            f"| [{r.id}](#{r.id.lower()}) | {r.name} | {r.severity.label} | {r.family} | {kinds} |"
        )
    for r in rules:
        lines += [
            "",
            f"## {r.id}",
            "",
            f"**{r.name}** ({r.severity.label}, {r.family}). {r.summary}",
            "",
            f"*Why:* {r.why}",
            "",
            f"*Fix:* {r.fix}",
        ]
    return "\n".join(lines) + "\n"
