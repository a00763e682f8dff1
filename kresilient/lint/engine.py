"""Run the rules: discover files, read them, tell kinds apart, check, suppress, sort."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator, Sequence

from kresilient import _catalog as catalog
from kresilient.config import SHARE_CONSUMER_REFUSED
from kresilient.lint import devstack, parity, rules_client, rules_cluster  # noqa: F401  (register the rules)
from kresilient.lint.model import (
    TOPIC_SPEC_KEYS,
    ConfigUnit,
    Entry,
    Finding,
    Kind,
    LintStats,
    has_lone_surrogate,
    redact_findings,
    value_redactor,
)
from kresilient.lint.readers import detect_format, read_text
from kresilient.lint.registry import RULES, Rule, client_of, is_client, iter_rules
from kresilient.lint.settings import Settings, Suppressions, parse_suppressions

__all__ = [
    "detect_client",
    "detect_kind",
    "discover",
    "exit_code",
    "lint_paths",
    "lint_text",
    "unit_findings",
]

#: The rules about share consumers (the others skip the keys a share consumer does not take).
_SHARE_RULES = frozenset({"KR071", "KR072"})
_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".venv",
        "venv",
        "node_modules",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".tox",
        "build",
        "dist",
    }
)
#: Broker-only keys that settle "broker" even beside many shared keys.
_BROKER_MARKERS = frozenset(
    {
        "node.id",
        "broker.id",
        "process.roles",
        "log.dirs",
        "log.dir",
        "listeners",
        "controller.quorum.voters",
        "zookeeper.connect",
    }
)


def detect_kind(unit: ConfigUnit) -> Kind:
    """Tell producer, consumer, admin/client, broker and topic configs apart by their keys."""
    keys = list(unit.entries)
    if any(k in _BROKER_MARKERS for k in keys):
        return "broker"
    broker = topic = shared_bt = producer = consumer = client = 0
    for key in keys:
        prop = catalog.lookup(key)
        is_broker = catalog.broker_config(key) is not None
        is_topic = catalog.topic_config(key) is not None or key in TOPIC_SPEC_KEYS
        if prop is not None:
            if prop.scope == "P":
                producer += 1
            elif prop.scope == "C":
                consumer += 1
            elif not (is_broker or is_topic) or key.startswith("bootstrap"):
                client += 1
        elif is_broker and catalog.java_client_kinds(key):
            continue  # ssl.*/sasl.* keys brokers and Java clients share: neither side's sign
        elif is_broker and is_topic:
            shared_bt += 1
        elif is_broker:
            broker += 1
        elif is_topic:
            topic += 1
    cluster = broker + topic + shared_bt
    if cluster > producer + consumer + client:
        return "broker" if broker > topic else "topic"
    if producer and consumer:
        return "client"  # a generic client file: judged per role (_role_views)
    if consumer > producer or (consumer == producer and "group.id" in unit.entries):
        return "consumer" if consumer else "client"
    if producer > 0:
        return "producer"
    return "client"


def discover(paths: Sequence[str], exclude: Iterable[str] = ()) -> Iterator[str]:
    """Files to lint: explicit files as given, directories walked for known formats."""
    patterns = tuple(exclude)

    def excluded(path: str) -> bool:
        if not patterns:
            return False  # no relpath per file when nothing is excluded
        rel = os.path.relpath(path)
        return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path, p) for p in patterns)

    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(
                    d for d in dirs if d not in _SKIP_DIRS and not excluded(os.path.join(root, d))
                )
                for name in sorted(files):
                    full = os.path.join(root, name)
                    if detect_format(full) is not None and not excluded(full):
                        yield full
        elif not excluded(path):
            yield path


def _decode(data: bytes) -> tuple[str | None, Finding | None, int, int]:
    try:
        return data.decode("utf-8-sig"), None, 0, 0
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        return None, None, line, col


def _read_file(path: str, limit: int) -> tuple[bytes, str | None]:
    """At most ``limit + 1`` bytes of a regular file, or why it cannot be read (a FIFO or a
    device named on the command line would block or never end)."""
    try:
        if not os.path.isfile(path):
            return b"", ("no such file" if not os.path.exists(path) else "not a regular file")
        with open(path, "rb") as fh:
            return fh.read(limit + 1), None
    except OSError as exc:
        return b"", f"cannot read file: {exc.strerror or exc}"


#: Keys only the Java client (or a Java framework) reads: a config holding one is read by the
#: Java client, whose defaults differ from librdkafka's.
_JAVA_MARKERS = frozenset(
    {
        "key.serializer",
        "value.serializer",
        "key.deserializer",
        "value.deserializer",
        "partitioner.class",
        "interceptor.classes",
        "max.poll.records",
        "buffer.memory",
    }
)


#: Readers whose files say what each config is (a Spring ``consumer`` block, a Strimzi
#: ``KafkaTopic``, a Python constructor): ``--kind`` does not override them.
SELF_DESCRIBING = frozenset({"python", "spring", "strimzi", "terraform", "topicspec", "connect"})


#: Text naming the Java client's classes (``see org.apache.kafka.clients.producer.ProducerConfig``
#: in Kafka's own config/producer.properties): evidence that the Java client reads the file.
_JAVA_TEXT = re.compile(
    r"\b(?:org\.apache\.kafka\.clients|kafka\.producer\.ProducerConfig|ProducerConfig|"
    r"ConsumerConfig|AdminClientConfig|KafkaProducer|KafkaConsumer)\b"
)


def _role_in_name(path: str) -> str | None:
    """``producer`` / ``consumer`` when the file's name says so (``producer.properties``,
    ``consumer-ssl.yaml``) and not both."""
    name = os.path.basename(path).lower()
    roles = [r for r in ("producer", "consumer") if r in name]
    return roles[0] if len(roles) == 1 else None


def _keys_fit_role(unit: ConfigUnit, role: str) -> bool:
    """No key of ``unit`` belongs only to the other role."""
    other = "C" if role == "producer" else "P"
    return not any((p := catalog.lookup(k)) is not None and p.scope == other for k in unit.entries)


def detect_client(unit: ConfigUnit) -> str:
    """``java`` when ``unit`` names Java classes or holds a key only the Java client knows
    (``sasl.jaas.config``, ``ssl.truststore.location`` ...), else ``librdkafka``."""
    for key, entry in unit.entries.items():
        if key in _JAVA_MARKERS:
            return "java"
        if "." in key and catalog.lookup(key) is None and catalog.java_client_kinds(key):
            return "java"  # a Java-only key (sasl.jaas.config ...): librdkafka would refuse it
        if key.endswith(("serializer", "deserializer")) and entry.text.startswith(
            ("org.", "io.", "com.")
        ):
            return "java"
    return "librdkafka"


def _assumed(unit: ConfigUnit) -> str:
    library = unit.context.get("assumed")  # a Python client library with its own defaults
    if isinstance(library, str):
        return library
    framework = unit.context.get("framework")
    client = "Java client" if client_of(unit) == "java" else "librdkafka"
    return f"{framework} / {client}" if isinstance(framework, str) else client


def unit_findings(
    unit: ConfigUnit, settings: Settings, fold: dict[str, int] | None = None
) -> Iterator[Finding]:
    """The findings of every enabled unit-scope rule for ``unit`` (no suppressions applied);
    the audit runs the topic and broker rules over live configs through this too.

    A finding about an unset key names whose defaults it assumed (``librdkafka``,
    ``Java client``, ``Spring Kafka / Java client``).

    On a unit of a dev stack (``unit.context["dev_stack"]``, see
    :mod:`~kresilient.lint.devstack`) the replication findings are counted by rule instead:
    into ``fold`` when given (the caller reports one KR053 line for the file), else as a
    KR053 line of this unit.
    """
    dev_stack = unit.context.get("dev_stack")
    folded: dict[str, int] = {}
    found_here = list(_rule_findings(unit, settings, folded))
    views = _role_views(unit)
    if views:
        seen = set(found_here)
        for view in views:
            for finding in _rule_findings(view, settings, folded, generic=True):
                if finding not in seen:
                    seen.add(finding)
                    found_here.append(finding)
    for finding in parity.apply(unit, found_here, settings):
        share_key = finding.key in SHARE_CONSUMER_REFUSED
        if unit.context.get("share") and finding.rule == "KR054" and share_key:
            continue  # refused before the consumer checks run: KR071 says so
        yield finding
    if fold is not None:
        for rid, n in folded.items():
            fold[rid] = fold.get(rid, 0) + n
    elif folded and settings.enabled("KR053"):
        yield _dev_stack_finding(unit, str(dev_stack), folded, settings)


def _overlay_spring_profiles(units: list[ConfigUnit]) -> None:
    """Spring Boot layers the documents of an application.yml: a later document (a profile)
    changes the settings of the ones before it, it does not replace them. A profile's
    consumer block without ``auto-offset-reset`` keeps the ``earliest`` of the default
    document (issue 38: a warning about an unset key the base document sets was false)."""
    seen: dict[tuple[str, str | None], ConfigUnit] = {}
    for unit in units:
        if unit.source != "spring":
            continue
        key = (unit.kind, unit.name)
        base = seen.get(key)
        if base is not None:
            own = {e.setting or k for k, e in unit.entries.items()}
            inherited = {k: e for k, e in base.entries.items() if (e.setting or k) not in own}
            unit.entries = {**inherited, **unit.entries}
        seen[key] = unit


def not_understood(unit: ConfigUnit) -> str | None:
    """Why ``unit``'s config could not be resolved statically, or None when it was (issue
    38: a Python client whose config is built at run time is "not understood", never a
    silent "0 findings")."""
    if unit.source != "python" or unit.context.get("config_known", True):
        return None
    constructor = unit.context.get("constructor", "the client")
    known = sorted(k for k, e in unit.entries.items() if not e.dynamic)
    unresolved = unit.context.get("unresolved")
    # A file the config is read from that lint could not follow is named (issue 38).
    why = (
        f"is read from a file at run time ({'; '.join(map(str, unresolved))})"
        if isinstance(unresolved, tuple) and unresolved
        else "is built at run time"
    )
    if not known:
        detail = "" if unresolved else " (a variable, a function's result, **kwargs)"
        return (
            f"not understood: the config passed to {constructor}() {why}{detail}; "
            "nothing in it was checked"
        )
    return (
        f"partly understood: the config passed to {constructor}() {why}; "
        f"only its literal keys were checked ({', '.join(known[:6])}"
        f"{' ...' if len(known) > 6 else ''})"
    )


def _share_skips(entry: Entry | None, message: str) -> bool:
    """A consumer rule's finding about a key a share consumer does not take: the key set
    (KR071 reports it), or unset-key advice whose message starts with such a key (librdkafka's
    default of ``auto.offset.reset`` ... means nothing to a share consumer)."""
    if entry is not None:
        return entry.key in SHARE_CONSUMER_REFUSED
    first = re.split(r"[=\s:]", message, maxsplit=1)[0]
    return first in SHARE_CONSUMER_REFUSED


def _rule_findings(
    unit: ConfigUnit, settings: Settings, folded: dict[str, int], *, generic: bool = False
) -> Iterator[Finding]:
    """The findings of the unit-scope rules for ``unit``. ``generic``: ``unit`` is the view
    of a generic client file in one role (see :func:`_role_views`): only rules of that role
    run, and only on settings the file makes (unset-key advice is for the file that
    configures the whole client, not a shared snippet)."""
    rules: Iterable[Rule] = iter_rules(scope="unit")
    only = unit.context.get("rules")  # a unit read in a dialect only some rules know
    if isinstance(only, frozenset):
        rules = [r for r in rules if r.id in only]
    client = client_of(unit)
    dev_stack = unit.context.get("dev_stack")
    for found in rules:
        if found.check is None or unit.kind not in found.kinds or not settings.enabled(found.id):
            continue
        if generic and "client" in found.kinds:
            continue  # already run on the file itself
        if is_client(unit) and client not in found.clients:
            continue
        share = unit.context.get("share") and found.id not in _SHARE_RULES
        for message, entry in found.check(unit):
            if generic and entry is None:
                continue
            if share and _share_skips(entry, message):
                continue  # a share consumer does not take the key at all: KR071 says so
            if dev_stack is not None and found.id in devstack.FOLDED_RULES:
                folded[found.id] = folded.get(found.id, 0) + 1
                continue
            if (
                entry is None
                and is_client(unit)
                and (unit.source != "python" or "assumed" in unit.context)
            ):
                message = f"{message} ({_assumed(unit)} defaults)"
            yield Finding(
                rule=found.id,
                severity=settings.severity_of(found.id),
                path=unit.path,
                line=entry.line if entry else unit.line,
                col=entry.col if entry else unit.col,
                message=message,
                key=entry.key if entry else None,
            )


def _role_of_key(key: str, java: bool) -> str | None:
    if java:
        owners = catalog.java_client_kinds(key)
        if owners and len(owners) == 1 and owners[0] in ("producer", "consumer"):
            return owners[0]
        return None
    prop = catalog.lookup(key)
    return {"P": "producer", "C": "consumer"}.get(prop.scope) if prop is not None else None


def _role_views(unit: ConfigUnit) -> list[ConfigUnit]:
    """A generic client file (kind ``client``: keys of several roles, or only connection
    keys) judged per role (issue 36 #4, issue 38 #4): one view per role whose keys it holds,
    with the other role's keys left out, so ``acks`` is judged as a producer reads it and
    never reported as "ignored by a consumer"."""
    if unit.kind != "client" or unit.source == "python":
        return []
    java = client_of(unit) == "java"
    roles: dict[str, set[str]] = {}
    for key in unit.entries:
        role = _role_of_key(key, java)
        if role is not None:
            roles.setdefault(role, set()).add(key)
    views: list[ConfigUnit] = []
    for role in sorted(roles):
        other = {k for r, ks in roles.items() if r != role for k in ks}
        views.append(
            ConfigUnit(
                path=unit.path,
                line=unit.line,
                col=unit.col,
                entries={k: e for k, e in unit.entries.items() if k not in other},
                kind=role,  # type: ignore[arg-type]
                kind_forced=True,
                name=unit.name,
                source=unit.source,
                context={**unit.context, "generic": True},
            )
        )
    return views


def _dev_stack_finding(
    unit: ConfigUnit, reason: str, folded: dict[str, int], settings: Settings
) -> Finding:
    counts = ", ".join(f"{rid} x{n}" for rid, n in sorted(folded.items()))
    return Finding(
        rule="KR053",
        severity=settings.severity_of("KR053"),
        path=unit.path,
        line=unit.line,
        col=unit.col,
        message=f"dev stack ({reason}): replication findings not raised as errors "
        f"({counts}); they apply before this runs in production",
    )


def _parse_error(path: str, line: int, col: int, message: str) -> Finding:
    return Finding(
        rule="KR000",
        severity=RULES["KR000"].severity,
        path=path,
        line=line,
        col=col,
        message=message,
    )


def _size_error(path: str, size: int, settings: Settings) -> Finding:
    return _parse_error(
        path,
        1,
        1,
        f"file is larger than {settings.max_file_size} bytes ({size} or more); not read "
        "(raise max-file-size in [tool.kresilient.lint] or exclude the file)",
    )


def _invalid_text(unit: ConfigUnit) -> Finding | None:
    """A KR000 for the first key or value of ``unit`` that is not valid Unicode (a lone
    surrogate, e.g. from a ``\\uD800`` escape): no client could send it."""
    for entry in unit.entries.values():
        value = entry.value
        if entry.key.isascii() and (not isinstance(value, str) or value.isascii()):
            continue  # the common case, decided without a scan
        for what, text in (("key", entry.key), ("value", value)):
            if isinstance(text, str) and has_lone_surrogate(text):
                where = "a key" if what == "key" else f"the value of {entry.key!r}"
                return _parse_error(
                    unit.path,
                    entry.line,
                    entry.col,
                    f"{where} is not valid Unicode (a lone UTF-16 surrogate, e.g. from a "
                    "\\uD800 escape without its pair)",
                )
    return None


def lint_text(
    text: str,
    path: str,
    settings: Settings | None = None,
    *,
    fmt: str | None = None,
    units_out: list[ConfigUnit] | None = None,
) -> list[Finding]:
    """Lint one file's text (``fmt`` defaults to the format of ``path``'s name).

    Never raises on bad input: a file that cannot be read, is too large, nests too deeply,
    expands too far (YAML aliases) or holds text that is not valid Unicode gives a located
    ``KR000`` finding.
    """
    settings = settings or Settings()
    if len(text) > settings.max_file_size:
        return [_size_error(path, len(text), settings)]
    fmt = fmt or detect_format(path, text) or "properties"
    result = read_text(text, path, fmt, settings.kind)
    findings: list[Finding] = []
    if result.error is not None:
        err = result.error
        findings.append(_parse_error(path, err.line, err.col, err.message))
    valid: list[ConfigUnit] = []
    for unit in result.units:
        invalid = _invalid_text(unit)
        if invalid is not None:
            findings.append(invalid)
            continue
        if settings.kind is not None and unit.source not in SELF_DESCRIBING:
            unit.kind, unit.kind_forced = settings.kind, True
        elif not unit.kind_forced:
            unit.kind = detect_kind(unit)
        if settings.client is not None and unit.source != "python":
            unit.context["client"] = settings.client
        elif "client" not in unit.context and unit.source != "python":
            unit.context["client"] = detect_client(unit)  # Python readers know their library
        valid.append(unit)
    _overlay_spring_profiles(valid)
    sup = parse_suppressions(text, python=fmt == "python")
    if sup.allows:
        for unit in valid:
            keys = {k for e in unit.entries.values() for k in sup.allowed_at(e.line)}
            if keys:
                before = unit.context.get(parity.ALLOW_CONTEXT, ())
                unit.context[parity.ALLOW_CONTEXT] = (*before, *sorted(keys))  # type: ignore[misc]
    java_text = fmt != "python" and _JAVA_TEXT.search(text) is not None
    role_named = _role_in_name(path)
    for unit in valid:
        if (
            java_text
            and settings.client is None
            and unit.source not in SELF_DESCRIBING
            and unit.context.get("client") == "librdkafka"
        ):
            unit.context["client"] = "java"  # the file names Java client classes
        if (
            role_named
            and unit.kind == "client"
            and not unit.kind_forced
            and settings.kind is None
            and _keys_fit_role(unit, role_named)
        ):
            unit.kind = role_named  # type: ignore[assignment]
    devstack.evidence(valid, text, fmt)
    fold: dict[str, int] = {}  # one KR053 line for the whole file, at its first dev unit
    for unit in valid:
        findings.extend(unit_findings(unit, settings, fold))
        unknown = not_understood(unit)
        if unknown is not None and settings.enabled("KR055"):
            findings.append(
                Finding(
                    rule="KR055",
                    severity=settings.severity_of("KR055"),
                    path=unit.path,
                    line=unit.line,
                    col=unit.col,
                    message=unknown,
                )
            )
        if units_out is not None:
            units_out.append(unit)
    if fold and settings.enabled("KR053"):
        first = next(u for u in valid if "dev_stack" in u.context)
        findings.append(_dev_stack_finding(first, str(first.context["dev_stack"]), fold, settings))
    # Messages show a secret's key, never its value; this pass makes sure of it for every
    # rule and output format (text, JSON, SARIF, GitHub annotations).
    findings = redact_findings(findings, value_redactor(valid))
    return _apply_suppressions(findings, sup, path, settings)


def _apply_suppressions(
    findings: list[Finding], sup: Suppressions, path: str, settings: Settings
) -> list[Finding]:
    kept = [f for f in findings if not sup.covers(f)]
    if settings.enabled("KR099"):
        for line, col, message in sup.problems:
            kept.append(
                Finding(
                    rule="KR099",
                    severity=settings.severity_of("KR099"),
                    path=path,
                    line=line,
                    col=col,
                    message=message,
                )
            )
    return kept


def lint_paths(
    paths: Sequence[str], settings: Settings | None = None, *, stats: LintStats | None = None
) -> list[Finding]:
    """Lint files and directories; findings sorted by path, line, column and rule.

    ``stats``, when given, is filled with what was read (see :class:`LintStats`).
    """
    settings = settings or Settings()
    stats = stats if stats is not None else LintStats()
    findings: list[Finding] = []
    units: list[ConfigUnit] = []
    suppressions: dict[str, Suppressions] = {}
    for path in discover(paths, settings.exclude):
        display = os.path.relpath(path) if not os.path.isabs(path) else path
        stats.files_read += 1
        data, problem = _read_file(path, settings.max_file_size)
        failure: Finding | None = None
        if problem is not None:  # about the file, not a place in it: no line
            failure = _parse_error(display, 0, 0, problem)
        elif len(data) > settings.max_file_size:
            failure = _size_error(display, len(data), settings)
        text, _, line, col = _decode(data) if failure is None else (None, None, 0, 0)
        if failure is None and text is None:
            failure = _parse_error(display, line, col, "not valid UTF-8")
        if failure is not None or text is None:
            stats.failed += 1
            findings.extend([failure] if failure else [])
            continue
        before = len(units)
        file_findings = lint_text(text, display, settings, units_out=units)
        findings.extend(file_findings)
        for f in file_findings:
            if f.rule == "KR055":
                stats.not_understood.append((f.path, f.line, f.message))
        if any(f.rule == "KR000" for f in file_findings):
            stats.failed += 1
        elif len(units) > before:
            stats.with_config += 1
        else:
            stats.skipped.append(display)
        suppressions[display] = parse_suppressions(
            text, python=detect_format(display, text) == "python"
        )
    redact = value_redactor(units)
    for found in iter_rules(scope="project"):
        if found.project_check is None or not settings.enabled(found.id):
            continue
        for unit, message, entry in found.project_check(units):
            finding = Finding(
                rule=found.id,
                severity=settings.severity_of(found.id),
                path=unit.path,
                line=entry.line if entry else unit.line,
                col=entry.col if entry else unit.col,
                message=redact(message),
                key=entry.key if entry else None,
            )
            if not suppressions.get(unit.path, Suppressions()).covers(finding):
                findings.append(finding)
    return sorted(set(findings), key=Finding.sort_key)


def exit_code(findings: Iterable[Finding], settings: Settings) -> int:
    """0 clean, 1 a finding at or above ``fail_on``, 2 a parse/input error."""
    findings = list(findings)
    if any(RULES[f.rule].input_error for f in findings):
        return 2
    return 1 if any(f.severity >= settings.fail_on for f in findings) else 0
