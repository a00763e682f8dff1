"""Value types shared by the lint readers, rules, outputs and the audit.

Every module of :mod:`kresilient.lint` may import this one; it imports none of them, so the
readers (:mod:`~kresilient.lint.readers`, :mod:`~kresilient.lint.pyreader`) share their
result types here instead of importing each other.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from kresilient import _catalog as catalog
from kresilient.redaction import Redactor, is_secret_key

Kind = Literal["producer", "consumer", "admin", "client", "broker", "topic"]
#: Client kinds (``client`` is a librdkafka config whose role the keys do not reveal).
CLIENT_KINDS: frozenset[str] = frozenset({"producer", "consumer", "admin", "client"})
KINDS: tuple[Kind, ...] = ("producer", "consumer", "admin", "client", "broker", "topic")
REDACTED = "<redacted>"
#: Keys of topic specs (topic-as-code files) that are not topic configs.
TOPIC_SPEC_KEYS = frozenset(
    {"name", "partitions", "replication.factor", "replicas", "num.partitions"}
)
#: Longest finding message (characters); longer ones (huge values) are cut, saying so.
MESSAGE_LIMIT = 1000

# Text a report cannot carry as is: lone surrogates (not encodable as UTF-8), control
# characters and line separators (a newline or an escape sequence in a value would forge
# report lines or recolour a terminal).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def safe_text(text: str) -> str:
    """``text`` with lone surrogates and control characters (but tab) written as escapes
    (``\\ud800``, ``\\x1b``), so every output format can encode and show it as one line."""
    return _UNSAFE.sub(_escape, text)


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` cannot be encoded as UTF-8 (it holds a lone surrogate)."""
    return not text.isascii() and any("\ud800" <= c <= "\udfff" for c in text)


class Severity(enum.IntEnum):
    """Finding severity; ordered so ``finding.severity >= fail_on`` reads naturally."""

    INFO = 1
    WARNING = 2
    ERROR = 3

    @classmethod
    def parse(cls, text: str) -> Severity:
        """``"error"`` / ``"warning"`` / ``"info"`` (also ``warn``, ``note``) -> Severity."""
        key = text.strip().lower()
        aliases = {"warn": "warning", "note": "info", "notice": "info"}
        try:
            return cls[aliases.get(key, key).upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (error, warning, info)") from None

    @property
    def label(self) -> str:
        """Lower-case name used in every output format."""
        return self.name.lower()


def is_secret(name: str) -> bool:
    """True when the value of the client, broker or Java client key ``name`` must never be
    printed: :func:`kresilient.redaction.is_secret_key` (the one definition, derived from the
    catalogs' types: librdkafka's sensitive properties and Java's ``PASSWORD`` keys such as
    ``ssl.keystore.key``)."""
    return is_secret_key(name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Entry:
    """One ``key = value`` of a config, with the 1-based position of its key.

    ``dynamic`` marks a value the linter cannot know (a Python expression, ``${VAR}``).
    ``setting`` is the Kafka key the entry sets when the file spells it otherwise (Spring's
    ``spring.kafka.consumer.enable-auto-commit`` sets ``enable.auto.commit``); messages
    quote ``key``, the spelling of the file.
    """

    key: str
    value: object
    line: int
    col: int
    dynamic: bool = False
    setting: str | None = None

    @property
    def text(self) -> str:
        """The value as librdkafka would receive it ("true" for ``True``)."""
        return catalog.to_config_string(self.value)

    @property
    def shown(self) -> str:
        """The value safe to print: secrets are replaced by ``<redacted>``."""
        if is_secret(self.key) or (self.setting is not None and is_secret(self.setting)):
            return REDACTED
        if self.dynamic:
            return "<dynamic>"
        return self.text


@dataclass(kw_only=True, slots=True)
class ConfigUnit:
    """One configuration: a file, a YAML mapping, a dict passed to a client constructor.

    ``entries`` keep the original key spelling; ``kind`` is the detected or forced kind.
    ``context`` carries facts from Python source (constructor name, calls seen in the file).
    """

    path: str
    line: int
    col: int
    entries: dict[str, Entry]
    kind: Kind = "client"
    kind_forced: bool = False
    name: str | None = None
    source: str = "properties"
    context: dict[str, object] = field(default_factory=dict)

    def get(self, key: str) -> Entry | None:
        """The entry for ``key`` or any librdkafka alias of it (``acks`` for
        ``request.required.acks``); the last one set wins, as in librdkafka, which applies
        properties in order: ``acks=all`` then ``request.required.acks=1`` is acks 1."""
        prop = catalog.lookup(key)
        if prop is None or self.kind in ("broker", "topic"):
            return self.entries.get(key)
        names = {key, prop.canonical, *prop.aliases}
        canon = catalog.lookup(prop.canonical)
        if canon is not None:
            names.update(canon.aliases)
        found = [(i, e) for i, (k, e) in enumerate(self.entries.items()) if k in names]
        if not found:
            return None
        # by position in the source; entries without one (line 0) keep the reading order
        return max(
            found, key=lambda ie: (ie[1].line, ie[1].col, ie[0]) if ie[1].line else (0, 0, ie[0])
        )[1]


@dataclass(frozen=True, kw_only=True, slots=True)
class Finding:
    """One problem: rule id, severity, where (1-based line/col; 0 = no position) and why.

    ``message`` never contains a secret value. ``path``, ``message`` and ``key`` are made
    safe on construction (see :func:`safe_text`): a hostile file cannot break a report.
    """

    rule: str
    severity: Severity
    path: str
    line: int
    col: int
    message: str
    key: str | None = None

    def __post_init__(self) -> None:
        for name in ("path", "message", "key"):
            value = getattr(self, name)
            if value is not None and _UNSAFE.search(value):
                object.__setattr__(self, name, safe_text(value))
        if len(self.message) > MESSAGE_LIMIT:  # a value quoted from a hostile file
            cut = len(self.message) - MESSAGE_LIMIT
            object.__setattr__(
                self, "message", f"{self.message[:MESSAGE_LIMIT]}... ({cut} more characters)"
            )

    def sort_key(self) -> tuple[str, int, int, str]:
        """Stable report order: path, line, column, rule."""
        return (self.path, self.line, self.col, self.rule)


@dataclass(kw_only=True, slots=True)
class LintStats:
    """What a lint run read, so "0 findings" never hides "0 files understood".

    ``files_read``: files opened; of those, ``with_config`` held Kafka settings, ``failed``
    could not be read or parsed (a KR000), and ``skipped`` lists the rest: files of a known
    kind that hold no Kafka settings. ``not_understood`` lists the configs whose keys could
    not be resolved statically (also reported as KR055 info findings).
    """

    files_read: int = 0
    with_config: int = 0
    failed: int = 0
    skipped: list[str] = field(default_factory=list)
    #: (path, line, reason) of each config lint could not resolve statically (a Python
    #: client whose config is built at run time): read, but not (fully) checked.
    not_understood: list[tuple[str, int, str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class ParseError:
    """Where and why a file could not be parsed (no file content in ``message``)."""

    line: int
    col: int
    message: str


@dataclass(kw_only=True, slots=True)
class ReadResult:
    """What a reader found: config units, and a parse error if the file is malformed."""

    units: list[ConfigUnit] = field(default_factory=list)
    error: ParseError | None = None


def secret_items(units: Iterable[ConfigUnit]) -> list[tuple[str, str]]:
    """``(key, literal value)`` of every secret entry of ``units`` (the Kafka key it sets),
    a quoted value also without its quotes: what no line lint prints may contain."""
    out: list[tuple[str, str]] = []
    for unit in units:
        for entry in unit.entries.values():
            if entry.dynamic or entry.value is None or entry.shown != REDACTED:
                continue
            key = entry.setting if entry.setting and is_secret(entry.setting) else entry.key
            text = entry.text
            out.append((key, text))
            if len(text) > 1 and text[0] in "\"'" and text[-1] == text[0]:
                out.append((key, text[1:-1]))
    return out


def value_redactor(units: Iterable[ConfigUnit]) -> Callable[[str], str]:
    """A function removing every secret value of ``units`` from a text lint prints (the
    report's messages, ``--diff`` lines, notes), replaced by :data:`REDACTED`. Composite
    values (JAAS, OAUTHBEARER configs) are hunted as the client redactor does: whole and
    by their secret parts, never by slices that would hit their option names."""
    redactor = Redactor.for_items(secret_items(units))
    return lambda text: redactor.remove_values(text, REDACTED)


def redact_findings(findings: list[Finding], redact: Callable[[str], str]) -> list[Finding]:
    """``findings`` with every message passed through ``redact`` (same objects when clean)."""
    out: list[Finding] = []
    for f in findings:
        message = redact(f.message)
        out.append(f if message == f.message else replace(f, message=message))
    return out
