"""Deployment facts a file states about itself: a single-broker or local dev stack.

Replication findings (RF below 3, min.insync.replicas 1, no rack) are true in general but
not what a one-broker development stack can or should fix. When the file itself says it is
such a stack, those findings become one info line (KR053) instead of errors, so a team can
keep the linter on over its dev compose files and quickstart configs.

The evidence is always something the file states, never a guess from the values alone (an
``offsets.topic.replication.factor=1`` on its own is exactly the hazard KR042 reports):

* a KRaft quorum of one voter (``controller.quorum.voters`` or
  ``controller.quorum.bootstrap.servers`` naming a single node);
* a broker whose every listener binds to localhost (no other host can join it);
* a docker-compose file whose services hold exactly one Kafka broker;
* a Strimzi ``Kafka`` whose broker node pools (or ``spec.kafka.replicas``) total one;
* a Terraform ``kafka`` provider that bootstraps from localhost only;
* a topicctl topic whose ``meta.environment``/``meta.cluster`` names a local or dev one;
* a comment saying so (``single-broker``, ``single node``, ``development testing``,
  ``dev only``, ``not for production`` ...).
"""

from __future__ import annotations

import re

from kresilient.lint.model import ConfigUnit

__all__ = ["FOLDED_RULES", "evidence"]

#: Rules whose findings a dev stack folds into one KR053 info line.
FOLDED_RULES = frozenset({"KR042", "KR043", "KR044", "KR047"})

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "0:0:0:0:0:0:0:1"})
# A comment (#, //, !) on a line that says the file is for a one-broker or dev setup.
_SAYS = re.compile(
    r"(?:^|\s)(?:#|//|!)[^\n]*?\b(single[- ]broker|single[- ]node|one[- ]broker"
    r"|development testing|dev(?:elopment)?[- ]only|local development|not for production"
    r"|increase (?:it )?for production)\b",
    re.IGNORECASE,
)
_COMPOSE = re.compile(r"^services\s*:", re.MULTILINE)
_TF_PROVIDER = re.compile(r"provider\s+\"kafka\"\s*\{(?P<body>[^{}]*)\}")
_TF_BOOTSTRAP = re.compile(r"\b(?:bootstrap_servers|brokers)\s*=\s*\[(?P<list>[^\]]*)\]")
_LOCAL_NAME = re.compile(r"(?:^|[-_.])(?:local|dev|development|sandbox)(?:[-_.]|$)", re.I)


def _host(address: str) -> str:
    """The host of ``NAME://host:port``, ``host:port`` or ``id@host:port``."""
    text = address.strip().strip("\"'")
    text = text.split("://", 1)[-1].split("@", 1)[-1]
    if text.startswith("["):
        return text[: text.find("]") + 1].lower()
    return text.rsplit(":", 1)[0].lower() if ":" in text else text.lower()


def _values(unit: ConfigUnit, key: str) -> list[str] | None:
    entry = unit.entries.get(key)
    if entry is None or entry.dynamic or entry.value is None:
        return None
    items = [v for v in entry.text.split(",") if v.strip()]
    return items or None


def _roles(unit: ConfigUnit) -> set[str]:
    return {r.strip().lower() for r in (_values(unit, "process.roles") or [])}


def _broker_evidence(unit: ConfigUnit) -> str | None:
    if unit.context.get("brokers") == 1:
        return "its cluster has one broker"
    voters = _values(unit, "controller.quorum.voters")
    if voters is None and "controller.quorum.voters" not in unit.entries:
        voters = _values(unit, "controller.quorum.bootstrap.servers")
    if voters is not None and len(voters) == 1:
        return "a KRaft quorum of one voter"
    listeners = _values(unit, "listeners") or _values(unit, "advertised.listeners")
    if listeners and all(_host(item) in _LOOPBACK for item in listeners):
        return "listeners on localhost only"
    return None


def _cluster_of(unit: ConfigUnit) -> str:
    """What ties a compose broker to its cluster: its ZooKeeper ensemble or KRaft voters."""
    for key in ("zookeeper.connect", "controller.quorum.voters"):
        entry = unit.entries.get(key)
        if entry is not None and not entry.dynamic:
            return f"{key}={entry.text.strip()}"
    return "?"


def _terraform_local(text: str) -> bool:
    for provider in _TF_PROVIDER.finditer(text):
        found = _TF_BOOTSTRAP.search(provider.group("body"))
        if found is None:
            continue
        hosts = [_host(h) for h in found.group("list").split(",") if h.strip()]
        if hosts and all(h in _LOOPBACK for h in hosts):
            return True
    return False


def evidence(units: list[ConfigUnit], text: str, fmt: str) -> None:
    """Record in ``unit.context["dev_stack"]`` why each broker or topic unit of one file
    belongs to a single-broker or local dev stack (nothing when the file does not say so)."""
    targets = [u for u in units if u.kind in ("broker", "topic")]
    if not targets:
        return
    said = _SAYS.search(text)
    file_reason = f"the file says so ({said.group(1)!r})" if said else None
    if file_reason is None and fmt == "terraform" and _terraform_local(text):
        file_reason = "its provider bootstraps from localhost"
    brokers = [u for u in targets if u.kind == "broker" and "broker" in (_roles(u) or {"broker"})]
    compose = fmt == "yaml" and bool(_COMPOSE.search(text))
    compose_single = compose and len(brokers) == 1
    clusters: dict[str, int] = {}
    if compose:
        for unit in brokers:
            clusters[_cluster_of(unit)] = clusters.get(_cluster_of(unit), 0) + 1
    for unit in targets:
        if compose and unit.kind == "broker":
            broker_id = unit.entries.get("broker.id")
            if broker_id is not None and not broker_id.text.strip().lstrip("-").isdigit():
                # the image run for its client tools (KAFKA_BROKER_ID: ignored): no broker
                unit.context["dev_stack"] = f"broker.id={broker_id.text}: no broker runs here"
                continue
            if len(brokers) > 1 and clusters.get(_cluster_of(unit)) == 1:
                # several single-broker clusters in one file (a source and a target ...)
                unit.context["dev_stack"] = "its cluster has one broker in this compose file"
            # every broker of a compose file runs on one docker host: rack advice (KR047)
            # cannot apply there (issue 38 #6); replication advice still does
            unit.context["single_host"] = "a docker-compose file (one host)"
        reason = file_reason
        if reason is None and unit.kind == "broker":
            reason = _broker_evidence(unit)
        if reason is None and unit.kind == "broker" and compose_single:
            reason = "the compose file runs one broker"
        if reason is None and unit.context.get("tool") == "topicctl":
            for field in ("environment", "cluster"):
                name = unit.context.get(field)
                if isinstance(name, str) and _LOCAL_NAME.search(name):
                    reason = f"its {field} is {name!r}"
                    break
        if reason is not None:
            unit.context["dev_stack"] = reason
