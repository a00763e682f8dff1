"""The one redaction mechanism: secrets never reach a log line, an exception, a span or ``repr``.

Three tools, from the cheapest to the most thorough:

* :func:`redact_config` replaces the value of every secret key of a configuration mapping by
  :data:`REDACTED` (what ``producer_created``-style log lines print).
* :func:`redact_text` removes secrets from free text by pattern, without knowing the
  configuration: ``key=value``, ``key: value`` and ``"key": "value"`` pairs whose key looks
  secret (``password``, ``clientSecret``, ``sasl.jaas.config`` ...), librdkafka's
  ``Invalid value "..." for configuration property "<secret key>"``, the tail librdkafka echoes
  after ``Unrecognized sasl.oauthbearer.config beginning at:``, ``Bearer``/``Basic``
  credentials and the password of a ``scheme://user:password@host`` URL.
* :class:`Redactor` knows the configuration (``Redactor.for_config(config)``) and also removes
  the secret VALUES wherever they appear: each whole secret value, the distinctive fragments of
  composite secrets (the values inside ``sasl.oauthbearer.config`` / ``sasl.jaas.config``,
  the password of ``basic.auth.user.info``), and any slice of at least
  :data:`MIN_SLICE` characters of them (librdkafka echoes malformed values partially). It
  applies :func:`redact_text` too, so one call covers both.

Short strings are not hunted for in free text: a fragment of fewer than :data:`MIN_FRAGMENT`
characters would turn ordinary words into ``[REDACTED]`` (whole secret values of at least
:data:`MIN_WHOLE` characters still are). Pattern-based rules cover short values next to their key.

Example::

    >>> r = Redactor.for_config({"sasl.password": "hunter2-long-pw"})
    >>> r("auth failed for password hunter2-long-pw")
    'auth failed for password [REDACTED]'
    >>> redact_text('Invalid value "abc" for configuration property "sasl.password"')
    'Invalid value "[REDACTED]" for configuration property "sasl.password"'

This module is a leaf: it imports only the standard library and :mod:`kresilient._catalog`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kresilient import _catalog as catalog

__all__ = [
    "MIN_FRAGMENT",
    "MIN_SLICE",
    "MIN_WHOLE",
    "NO_SECRETS",
    "REDACTED",
    "SECRET_KEYS",
    "Redactor",
    "is_secret_key",
    "redact_config",
    "redact_text",
]

#: What a secret is replaced with in logs, ``repr``, span statuses and error messages.
REDACTED: Final = "[REDACTED]"

#: A whole secret value shorter than this is only removed next to its key (by pattern).
MIN_WHOLE: Final = 4
#: A fragment of a composite secret shorter than this is not hunted for in free text.
MIN_FRAGMENT: Final = 6
#: Any slice of a secret (or of a fragment) this long is removed wherever it appears.
MIN_SLICE: Final = 8

# Schema Registry client keys: in neither catalog (it is not a Kafka client), yet secret.
_SCHEMA_REGISTRY_SECRETS: Final = ("basic.auth.user.info", "schema.registry.basic.auth.user.info")

#: Every configuration key whose value must never be printed: what the catalogs' TYPES call
#: secret (:func:`kresilient._catalog.secret_keys`: every property librdkafka flags sensitive
#: and every ``PASSWORD``-typed key of the Java producer, consumer, admin and broker configs,
#: ``ssl.keystore.key`` included; ``sasl.username`` excepted), plus Schema Registry's
#: credentials. Generated from the shipped catalogs, never a hand list. :func:`is_secret_key`
#: also accepts keys no catalog knows whose names look secret (``database.password``).
SECRET_KEYS: Final[frozenset[str]] = catalog.secret_keys() | frozenset(_SCHEMA_REGISTRY_SECRETS)


def is_secret_key(key: str) -> bool:
    """True when the value under configuration key ``key`` must never be logged or shown.

    The one definition every exit uses (``repr``/``str`` of configs, logs, exceptions, lint
    output, dead-letter headers, the Spark plan regex): a key in :data:`SECRET_KEYS`, or a key
    no catalog knows whose name looks like a credential's.
    """
    return key in SECRET_KEYS or catalog.is_secret_key(key)


def redact_config(config: Mapping[Any, Any]) -> dict[Any, Any]:
    """A copy of ``config`` with every secret value replaced by :data:`REDACTED`.

    >>> redact_config({"sasl.username": "u", "sasl.password": "hunter2"})
    {'sasl.username': 'u', 'sasl.password': '[REDACTED]'}
    """
    return {k: (REDACTED if is_secret_key(str(k)) else v) for k, v in config.items()}


# --------------------------------------------------------------------------- patterns

# A key "looks secret" when one of these occurs in it. "token" only as a suffix part
# (access_token, sasl.oauthbearer.token), so the English word "token" is left alone.
_HINT: Final = (
    r"(?:password|passwd|passphrase|secret|credential|jaas\.config|oauthbearer\.config"
    r"|private[._-]?key|api[._-]?key|user\.info|key\.pem|[._-]token)"
)
_KEY_CHARS: Final = r"[A-Za-z0-9_.\-]"
# key = value / key: value / "key": "value" (JSON) / key="quoted value"
_PAIR: Final = re.compile(
    r"(?P<k>(?P<q>[\"']?)" + _KEY_CHARS + r"*" + _HINT + _KEY_CHARS + r"*(?P=q))"
    r"(?P<sep>[ \t]*[=:][ \t]*)"
    r"(?!\[REDACTED\])(?P<v>\"(?:[^\"\\]|\\.)*\"?|'(?:[^'\\]|\\.)*'?|[^\s,;&}\])\"']+)",
    re.IGNORECASE,
)
_INVALID_VALUE: Final = re.compile(
    r'Invalid value "(?P<v>[^"]*)" for configuration property "(?P<k>[^"]*)"'
)
# librdkafka: "Unrecognized sasl.oauthbearer.config beginning at: <the rest of the value>"
_BEGINNING_AT: Final = re.compile(r"(?P<p>(?:oauthbearer|jaas)\.config beginning at: ?)[^\n]*")
_AUTH_SCHEME: Final = re.compile(r"(?P<p>\b(?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}")
_URL_PASSWORD: Final = re.compile(r"(?P<p>\b[a-z][a-z0-9+.-]*://[^\s:/@]+:)[^\s@/]+(?=@)", re.I)
# Cheap pre-filter: most texts contain none of these, and are returned as they are. Matched
# against the lower-cased text: an IGNORECASE alternation costs ~6x more per call.
_ANY_HINT: Final = re.compile(
    r"pass|secret|credential|jaas|oauthbearer|private|api.?key"
    r"|user\.info|key\.pem|token|invalid value|bearer|basic|://"
)


def _pair(m: re.Match[str]) -> str:
    value = m.group("v")
    quote = value[0] if value[:1] in ("'", '"') else ""
    closing = quote if quote and len(value) > 1 and value.endswith(quote) else ""
    return f"{m.group('k')}{m.group('sep')}{quote}{REDACTED}{closing}"


def _invalid_value(m: re.Match[str]) -> str:
    if is_secret_key(m.group("k")):
        return f'Invalid value "{REDACTED}" for configuration property "{m.group("k")}"'
    return m.group(0)


def redact_text(text: str) -> str:
    """Remove secrets from ``text`` by pattern (no configuration needed).

    >>> redact_text("login failed: clientSecret=abc123 scope=x")
    'login failed: clientSecret=[REDACTED] scope=x'
    """
    if not text or _ANY_HINT.search(text.lower()) is None:
        return text
    text = _INVALID_VALUE.sub(_invalid_value, text)
    text = _BEGINNING_AT.sub(lambda m: m.group("p") + REDACTED, text)
    text = _PAIR.sub(_pair, text)
    text = _AUTH_SCHEME.sub(lambda m: m.group("p") + REDACTED, text)
    return _URL_PASSWORD.sub(lambda m: m.group("p") + REDACTED, text)


# --------------------------------------------------------------------------- values

# A pair inside a composite secret: key=value, key="value", key='value'.
_INNER_PAIR: Final = re.compile(
    r"(?P<k>[A-Za-z0-9_.\-]+)\s*=\s*(?P<v>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s;,\"']+)"
)


# Keys whose value is several settings in one (its keys, the JAAS module name and the user
# name are not secret; slices of the whole would blank them wherever they appear).
_COMPOSITE_KEY: Final = re.compile(r"(?:jaas\.config|oauthbearer\.config|user\.info)$", re.I)


def _fragments(key: str, value: str) -> list[str]:
    """The parts of a secret value worth hunting for in free text, besides the whole value.

    A composite value (``k=v`` pairs, as in ``sasl.oauthbearer.config`` and
    ``sasl.jaas.config``) yields each pair's value: librdkafka echoes the tail of a malformed
    one. Its keys and the JAAS module name are not secret and would be false positives.
    """
    out: list[str] = []
    pairs = list(_INNER_PAIR.finditer(value))
    for m in pairs:
        v = m.group("v")
        if v[:1] in ("'", '"'):
            v = v[1:-1]
        out.append(v)
    if not pairs and key.endswith("user.info") and ":" in value:
        out.append(value.split(":", 1)[1])  # "user:password"
    return [f for f in out if len(f) >= MIN_FRAGMENT]


class Redactor:
    """Removes known secret values (and pattern-recognised ones) from text: ``redactor(text)``.

    Each of ``secrets`` is replaced whole (when at least :data:`MIN_WHOLE` characters) and so
    is any slice of :data:`MIN_SLICE` characters of it. ``whole_only`` values are replaced only
    whole: a composite value (a JAAS line) whose slices would hit its non-secret parts. Build
    one per client with :meth:`for_config`; calling it is cheap when the text holds no secret.
    """

    __slots__ = ("_grams", "_whole")

    def __init__(self, secrets: Iterable[str] = (), *, whole_only: Iterable[str] = ()) -> None:
        sliced = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_WHOLE}
        whole = sliced | {s for s in whole_only if isinstance(s, str) and len(s) >= MIN_WHOLE}
        # longest first, so a secret containing another one is replaced as a whole
        self._whole: tuple[str, ...] = tuple(sorted(whole, key=len, reverse=True))
        grams = {s[i : i + MIN_SLICE] for s in sliced for i in range(len(s) - MIN_SLICE + 1)}
        # A lookahead finds every (overlapping) start of a known slice in one C-speed scan.
        self._grams: re.Pattern[str] | None = (
            re.compile("(?=(" + "|".join(re.escape(g) for g in sorted(grams)) + "))")
            if grams
            else None
        )

    @classmethod
    def for_config(cls, config: Mapping[Any, Any]) -> Redactor:
        """The redactor of a client configuration: every secret key's value and fragments."""
        return cls.for_items(config.items())

    @classmethod
    def for_items(cls, items: Iterable[tuple[Any, Any]]) -> Redactor:
        """:meth:`for_config` for ``(key, value)`` pairs (a key may come more than once, as
        in the files ``kresilient lint`` reads). A multi-line value (a PEM key) is also
        hunted line by line."""
        secrets: list[str] = []
        whole_only: list[str] = []
        for key, value in items:
            if not isinstance(value, str) or not is_secret_key(str(key)):
                continue
            if _COMPOSITE_KEY.search(str(key)):
                whole_only.append(value)
                secrets.extend(_fragments(str(key), value))
            else:
                secrets.append(value)
                if "\n" in value:
                    secrets.extend(line.strip() for line in value.splitlines())
        return cls(secrets, whole_only=whole_only)

    def __call__(self, text: str) -> str:
        """``text`` without any known secret, fragment or long slice of one."""
        return redact_text(self.remove_values(text))

    def remove_values(self, text: str, marker: str = REDACTED) -> str:
        """``text`` without the known secret values (whole, fragments and slices), replaced
        by ``marker``, and without :func:`redact_text`'s patterns: for text whose ``key=value``
        pairs are not secrets by their looks (a lint report quoting non-secret settings)."""
        if not text:
            return text
        for secret in self._whole:
            if secret in text:
                text = text.replace(secret, marker)
        if self._grams is not None:
            text = self._cut_slices(text, self._grams, marker)
        return text

    @staticmethod
    def _cut_slices(text: str, grams: re.Pattern[str], marker: str = REDACTED) -> str:
        spans: list[list[int]] = []
        for m in grams.finditer(text):
            start, end = m.start(), m.start() + MIN_SLICE
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        if not spans:
            return text
        out: list[str] = []
        pos = 0
        for start, end in spans:
            out.append(text[pos:start])
            out.append(marker)
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def __repr__(self) -> str:
        return f"Redactor({len(self._whole)} secret value(s))"


#: A redactor that knows no configuration (pattern-based redaction only).
NO_SECRETS: Final = Redactor()
