"""Lint = runtime (issue 36 #4): what kresilient's clients refuse is a lint error.

:data:`kresilient.config.REFUSALS` is the one table: ``producer_config``/``consumer_config``
raise its first refusal, and here every refusal of a config a kresilient client would read
(a librdkafka-dialect file, or a dict passed to ``ResilientProducer``/``ResilientConsumer``)
becomes an error: the finding of the rule that reports it is raised to error, or, when no
rule does, a KR054 finding carries the client's own message. The opt-out is the runtime's:
``allow_unsafe=("acks",)`` in Python, ``# kresilient: allow acks`` in a file; an allowed
value stays a warning (the client logs one warning for it), a conflict cannot be allowed.

A file with keys of both roles is judged per role: its producer keys as a producer reads
them, its consumer keys as a consumer does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Literal

from kresilient import _catalog as catalog
from kresilient import config as runtime
from kresilient.lint.model import ConfigUnit, Finding, Severity
from kresilient.lint.registry import client_of
from kresilient.lint.settings import Settings

__all__ = ["ALLOW_CONTEXT", "apply", "roles_of", "unit_refusals"]

Role = Literal["producer", "consumer"]
#: ``unit.context`` key holding the keys the file or call allows as unsafe.
ALLOW_CONTEXT = "allow_unsafe"


def roles_of(unit: ConfigUnit) -> tuple[Role, ...]:
    """The kresilient clients that would read ``unit`` (none for a Java or keyword-client
    config, an admin, broker or topic config)."""
    if unit.kind not in ("producer", "consumer", "client") or client_of(unit) != "librdkafka":
        return ()
    if "rules" in unit.context or unit.context.get("framework"):
        return ()  # aiokafka/kafka-python keywords, Connect: other clients read them
    if unit.source == "python" and not unit.context.get("resilient"):
        return ()  # plain confluent-kafka code does not go through kresilient
    if unit.kind != "client":
        return (unit.kind,)
    scopes = {p.scope for p in (catalog.lookup(k) for k in unit.entries) if p is not None}
    roles: list[Role] = []
    if "P" in scopes or "C" not in scopes:
        roles.append("producer")
    if "C" in scopes or "P" not in scopes:
        roles.append("consumer")
    return tuple(roles)


def unit_refusals(
    unit: ConfigUnit,
) -> tuple[list[runtime.Refusal], list[runtime.Refusal]]:
    """(refused, accepted) of ``unit`` by every kresilient client that would read it."""
    roles = roles_of(unit)
    if not roles:
        return [], []
    user = {k: e.value for k, e in unit.entries.items() if not e.dynamic}
    dynamic = {_canonical(k) for k, e in unit.entries.items() if e.dynamic}
    allowed = unit.context.get(ALLOW_CONTEXT, ())
    fragment = not (unit.source == "python" and unit.context.get("config_known"))
    refused: dict[tuple[str, str | None, str], runtime.Refusal] = {}
    accepted: dict[tuple[str, str | None, str], runtime.Refusal] = {}
    for role in roles:
        got, ok = runtime.refusals(
            user,
            role,
            allow_unsafe=allowed if isinstance(allowed, Iterable) else (),
            fragment=fragment or unit.kind == "client",
        )
        for r in got:
            if _canonical(r.key) in dynamic:
                continue  # set from a variable: its value is unknown here, not missing
            refused.setdefault((r.row, r.key, r.message), r)
        for r in ok:
            accepted.setdefault((r.row, r.key, r.message), r)
    return list(refused.values()), list(accepted.values())


def _canonical(key: str | None) -> str | None:
    if key is None:
        return None
    prop = catalog.lookup(key)
    return prop.canonical if prop is not None else key


def _matches(finding: Finding, refusal: runtime.Refusal) -> bool:
    return finding.rule in refusal.lint_rules and (
        finding.key == refusal.key or _canonical(finding.key) == _canonical(refusal.key)
    )


def _refuses(unit: ConfigUnit) -> str:
    constructor = unit.context.get("constructor")
    if isinstance(constructor, str) and constructor[:1].isupper() and unit.context.get("resilient"):
        return f"{constructor} refuses"  # the class the code calls (AsyncResilientConsumer ...)
    roles = roles_of(unit)
    if len(roles) > 1:
        return "ResilientProducer and ResilientConsumer refuse"
    return f"{'ResilientProducer' if roles == ('producer',) else 'ResilientConsumer'} refuses"


def apply(unit: ConfigUnit, findings: list[Finding], settings: Settings) -> list[Finding]:
    """``findings`` of ``unit`` with its refusals made errors (and allowed ones warnings)."""
    refused, accepted = unit_refusals(unit)
    if not refused and not accepted:
        return findings
    out = list(findings)
    who = _refuses(unit)
    for r in refused:
        hits = [i for i, f in enumerate(out) if _matches(f, r)]
        opt_out = f"; `# kresilient: allow {r.key}` accepts it" if r.unsafe else ""
        for i in hits:
            f = out[i]
            if f.severity >= Severity.ERROR or f.rule in settings.severity:
                continue  # already an error, or the user set this rule's severity
            out[i] = replace(
                f,
                severity=Severity.ERROR,
                message=f"{f.message} ({who} it{opt_out})",
            )
        if hits or not settings.enabled("KR054"):
            continue
        if any(not settings.enabled(rid) for rid in r.lint_rules if rid != "KR054"):
            continue  # the user turned the reporting rule off
        entry = unit.get(r.key) if r.key else None
        if entry is None and r.key is not None:
            entry = unit.entries.get(r.key)
        out.append(
            Finding(
                rule="KR054",
                severity=settings.severity_of("KR054"),
                path=unit.path,
                line=entry.line if entry else unit.line,
                col=entry.col if entry else unit.col,
                message=f"{who} this config: {r.message}"
                + (f" (in a file: `# kresilient: allow {r.key}`)" if r.unsafe else ""),
                key=entry.key if entry else r.key,
            )
        )
    for r in accepted:
        hits = [i for i, f in enumerate(out) if _matches(f, r)]
        for i in hits:
            f = out[i]
            if f.severity >= Severity.ERROR and f.rule not in settings.severity:
                out[i] = replace(
                    f,
                    severity=Severity.WARNING,
                    message=f"{f.message} (allowed as unsafe: the client accepts it, "
                    "with a warning)",
                )
        if (
            not hits
            and settings.enabled("KR054")
            and all(settings.enabled(rid) for rid in r.lint_rules if rid != "KR054")
        ):
            # the client logs one warning for it: so does lint (an allowed value stays visible)
            entry = unit.get(r.key) if r.key else None
            out.append(
                Finding(
                    rule="KR054",
                    severity=Severity.WARNING,
                    path=unit.path,
                    line=entry.line if entry else unit.line,
                    col=entry.col if entry else unit.col,
                    message=f"{r.key}={r.value} allowed as unsafe: {r.message.split(': ', 1)[-1]}",
                    key=entry.key if entry else r.key,
                )
            )
    return out
