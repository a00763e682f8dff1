"""Topic administration from Python and from ``kresilient topic create``.

Auto-creation is off on a well-run cluster (and on :class:`kresilient.testing.KafkaCluster`),
so a service needs its topics, and its dead-letter topic, created first::

    from kresilient.admin import create_topic

    create_topic("127.0.0.1:9092", "orders", partitions=3, replication_factor=3,
                 dead_letter=True)          # also "orders.dlq", able to hold any dead letter

:func:`create_topic` works against any cluster (pass security settings in ``client_config``).
It gives up within ``timeout`` seconds. When no broker answers it raises
:class:`~kresilient.errors.KafkaClientError` with one line naming each host and the reason
(connection refused, name not resolved, timed out, TLS or authentication failure) instead
of letting librdkafka print a line per reconnect. When the brokers refuse the credentials or
the certificate (wrong password, wrong CA) it raises at the first refusal, classified AUTH
(``_AUTHENTICATION``/``_SSL``), naming librdkafka's reason and the setting to check.

Safe defaults: ``min.insync.replicas`` is ``min(2, replication_factor)`` unless given, so
``acks=all`` means "on two replicas" on a 3-node cluster. The dead-letter topic (``NAME.dlq``,
the default of :class:`~kresilient.DeadLetterPolicy`) gets the settings a byte-for-byte dead
letter needs; see :func:`dead_letter_topic_config`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

import structlog
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from kresilient.errors import ConfigError, KafkaClientError
from kresilient.reachability import Reachability, client_certificate, connect_failure
from kresilient.redaction import Redactor, redact_text

__all__ = [
    "DEAD_LETTER_HEADER_ALLOWANCE",
    "DEAD_LETTER_MIN_MAX_BYTES",
    "DEAD_LETTER_SUFFIX",
    "TopicResult",
    "create_topic",
    "dead_letter_topic_config",
    "describe_unreachable",
    "parse_config_items",
]

DEAD_LETTER_SUFFIX: Final = ".dlq"
"""Suffix of the dead-letter topic, as in :class:`~kresilient.DeadLetterPolicy`'s default."""

DEAD_LETTER_MIN_MAX_BYTES: Final = 16 * 1024 * 1024
"""Smallest ``max.message.bytes`` of a dead-letter topic: the producer dead-letters values up
to its ``dead_letter_max_bytes`` (16 MiB by default) that no ordinary topic accepts."""

DEAD_LETTER_HEADER_ALLOWANCE: Final = 64 * 1024
"""Room for the ``kresilient.*`` (and optional Spring / Kafka Streams) error headers that a
dead letter carries on top of the original record."""

_BROKER_DEFAULT_MAX_BYTES: Final = 1048588  # Kafka's message.max.bytes default
#: Metadata is asked for in slices this long, error_cb served in between: a refused login
#: is named within a slice instead of at the caller's timeout.
_METADATA_SLICE: Final = 1.0
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# The reason words of kresilient.producer.connect_failure, said for a person at a terminal.
_REASONS: Final = {
    "refused": "connection refused: nothing listens on that port",
    "DNS": "DNS cannot resolve the name",
    "timeout": "connection timed out: a firewall, a wrong port or a host that is down",
    "TLS": "TLS handshake failed: check security.protocol and the ssl.* settings",
    "auth": "authentication failed: check the sasl.* settings",
    "disconnected": "the broker closed the connection: check security.protocol",
    "other": "connection failed",
}
# librdkafka names a broker "sasl_ssl://host:port/id" when the protocol is not plaintext.
_PROTOCOL = re.compile(r"^[A-Za-z_]+://")

# librdkafka would otherwise print every failed reconnect to stderr; the one line that
# matters is built from error_cb instead.
_QUIET = logging.getLogger("kresilient.admin.librdkafka")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False
#: Reachability's logger where only its refusal parsing is used (it logs nothing there).
_QUIET_LOG: Final = structlog.get_logger("kresilient.admin")


@dataclass(frozen=True, kw_only=True)
class TopicResult:
    """What :func:`create_topic` did for one topic."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)
    existed: bool = False
    """True when the topic was already there (``if_not_exists=True``); nothing was changed."""


def parse_config_items(items: Iterable[str]) -> dict[str, str]:
    """``["k=v", ...]`` (as given to ``--config``) to a dict; a malformed item is a ConfigError."""
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--config expects key=value, got {item!r}", key=key or None)
        config[key] = value.strip()
    return config


def describe_unreachable(servers: str, errors: Iterable[str]) -> str:
    """One line naming each bootstrap host and why it could not be reached.

    ``errors`` are librdkafka error strings as ``error_cb`` receives them; a host without an
    error of its own is reported as "no answer". When a broker refused the client's
    credentials or certificate (wrong password, wrong CA, a client certificate the brokers
    refuse), the line says so instead, with librdkafka's reason, the error name
    (``[_AUTHENTICATION]``/``[_SSL]``) and the setting to check (``sasl.password``,
    ``ssl.ca.location``, ``ssl.certificate.location``).
    """
    reasons: dict[str, str] = {}
    # a broker's refusal of the login or certificate, recognised as every client does
    reach = Reachability(_QUIET_LOG)
    for text in errors:
        parsed = connect_failure(text)
        if parsed is not None:
            host, reason = parsed
            reasons[host] = _REASONS.get(reason, reason)
        if reach.refused is None or reach.refused.host is None:
            reach.refusal(text)
    hosts = [_PROTOCOL.sub("", h.strip()) for h in servers.split(",") if h.strip()]
    parts = [f"{host} ({reasons.get(host, 'no answer')})" for host in hosts]
    refused = reach.refused
    if refused is not None and refused.host is not None:
        # The cluster answered and refused: not a network fault. Name librdkafka's reason
        # (redacted by pattern: the caller's config is not known here) and the setting.
        return (
            f"the brokers at {', '.join(hosts)} refused this client's credentials or "
            f"certificate [{KafkaError(refused.code).name()}]: {redact_text(refused.detail)} "
            f"({refused.remedy})"
        )
    return (
        f"cannot reach Kafka at {', '.join(parts)}; "
        "check --bootstrap-servers and that the brokers are running"
    )


def dead_letter_topic_config(
    source_config: Mapping[str, str],
    *,
    replication_factor: int,
    broker_max_message_bytes: int = _BROKER_DEFAULT_MAX_BYTES,
) -> dict[str, str]:
    """Topic settings for the dead-letter topic of a topic with ``source_config``.

    - ``max.message.bytes``: at least the source's limit (or the broker default) and at least
      :data:`DEAD_LETTER_MIN_MAX_BYTES`, plus :data:`DEAD_LETTER_HEADER_ALLOWANCE` for the
      error headers, so any record of the source, byte for byte, fits.
    - ``min.insync.replicas``: the source's (else ``min(2, replication_factor)``): a dead
      letter is the only copy of a record the application gave up on.
    - ``cleanup.policy=delete``: compaction would drop dead letters that share a key.
    - ``retention.ms``: at least the source's, when the source sets one (``-1``, keep
      forever, included: the dead letters of a topic kept forever are kept forever too).

    Raises :class:`ConfigError` naming the key when a setting it reads is not a whole number.
    """
    _check_numbers(source_config)
    source_limit = int(source_config.get("max.message.bytes", broker_max_message_bytes))
    limit = max(source_limit, DEAD_LETTER_MIN_MAX_BYTES) + DEAD_LETTER_HEADER_ALLOWANCE
    config = {
        "max.message.bytes": str(limit),
        "min.insync.replicas": str(
            source_config.get("min.insync.replicas", min(2, replication_factor))
        ),
        "cleanup.policy": "delete",
    }
    retention = source_config.get("retention.ms")
    if retention is not None:
        # -1 is "forever", the longest retention there is: leaving the key out would give the
        # dead letters the broker's default (7 days) instead.
        config["retention.ms"] = str(int(retention))
    return config


#: Topic settings :func:`dead_letter_topic_config` computes with, and the least value each
#: may take (``retention.ms=-1``: kept forever).
_NUMBERS: Final = {"max.message.bytes": 0, "retention.ms": -1}
_WHOLE: Final = re.compile(r"-?[0-9]+")


def _check_numbers(config: Mapping[str, str]) -> None:
    """A ConfigError naming the key for a setting that must be a whole number and is not
    (``max.message.bytes=1MB``): the broker refuses it anyway, and saying so before
    connecting makes it a usage error, not a failure halfway through."""
    for key, least in _NUMBERS.items():
        value = config.get(key)
        if value is None:
            continue
        if not _WHOLE.fullmatch(str(value).strip()) or int(value) < least:
            raise ConfigError(
                f"{key}={value!r} must be a whole number of at least {least}"
                + (" (bytes)" if key.endswith("bytes") else "")
                + (" (milliseconds; -1 keeps records forever)" if key == "retention.ms" else ""),
                key=key,
            )


class _Admin:
    """An AdminClient that collects connection errors instead of printing them."""

    def __init__(self, bootstrap_servers: str, client_config: Mapping[str, Any] | None):
        self.servers = bootstrap_servers
        self.errors: list[str] = []
        conf: dict[str, Any] = dict(client_config or {})
        self._scrub = Redactor.for_config(conf)
        # keeps the refusal of the credentials or certificate, named in the error raised
        self.reach = Reachability(
            structlog.get_logger("kresilient.admin"), certificate=client_certificate(conf)
        )
        conf.update(
            {
                "bootstrap.servers": bootstrap_servers,
                "logger": _QUIET,
                "error_cb": self._on_error,
                "socket.connection.setup.timeout.ms": 5000,
                "reconnect.backoff.max.ms": 1000,
            }
        )
        self.client = AdminClient(conf)

    def _on_error(self, err: KafkaError) -> None:
        if len(self.errors) < 1000:
            self.errors.append(err.str())
        self.reach.refusal(self._scrub(err.str()), err.code())

    def metadata(self, deadline: float, topic: str | None = None) -> Any:
        while True:
            try:
                md = self.client.list_topics(
                    topic=topic, timeout=max(0.1, min(_METADATA_SLICE, _left(deadline)))
                )
            except KafkaException as exc:
                self.client.poll(0)  # serves error_cb: the per-host reasons, a refusal
                self._raise_refused()
                err: KafkaError = exc.args[0]
                if _left(deadline) > 0 and err.code() in _WAIT_CODES:
                    continue
                self._raise_unreachable(err)
            self.reach.connected()
            return md

    def _raise_refused(self) -> None:
        """A broker refused the credentials or certificate, and none accepted them: AUTH."""
        failure = self.reach.final_refusal()
        if failure is None:
            return
        raise KafkaClientError(
            f"the brokers at {self.servers} refused this client's credentials or certificate",
            code=failure.code,
            classification=failure.classification(),
        )

    def _raise_unreachable(self, err: KafkaError) -> NoReturn:
        if err.code() in _WAIT_CODES:
            raise KafkaClientError(
                describe_unreachable(self.servers, self.errors),
                code=err.code(),
                name=err.name(),
            ) from None
        raise KafkaClientError(err.str(), code=err.code(), name=err.name()) from None


#: list_topics errors that mean "no answer (yet)": waited out until the deadline.
_WAIT_CODES: Final = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT})


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _check_input(
    name: str, partitions: int, replication_factor: int, config: Mapping[str, str]
) -> None:
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ConfigError(
            f"invalid topic name {name!r}: use 1-249 of the characters A-Z a-z 0-9 . _ -"
        )
    if partitions < 1:
        raise ConfigError(f"partitions must be at least 1, got {partitions}")
    if replication_factor < 1:
        raise ConfigError(f"replication factor must be at least 1, got {replication_factor}")
    _check_numbers(config)
    min_isr = config.get("min.insync.replicas")
    if min_isr is not None and (not min_isr.isdigit() or int(min_isr) > replication_factor):
        raise ConfigError(
            f"min.insync.replicas={min_isr} must be a number no larger than the replication "
            f"factor {replication_factor}: acks=all writes would all fail",
            key="min.insync.replicas",
        )


def _broker_max_bytes(admin: _Admin, broker_id: int, deadline: float) -> int:
    resource = ConfigResource(ResourceType.BROKER, str(broker_id))
    try:
        futures = admin.client.describe_configs(
            [resource], request_timeout=max(0.1, _left(deadline))
        )
        entries = futures[resource].result(timeout=max(0.1, _left(deadline)))
        return int(entries["message.max.bytes"].value)
    except (KafkaException, KeyError, ValueError, TypeError):
        # Not allowed to describe the broker (ACLs): assume Kafka's default.
        return _BROKER_DEFAULT_MAX_BYTES


#: ListOffsets answers of a leader that has not applied the new topic's metadata yet.
_NOT_SERVING_YET: Final = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError._TIMED_OUT,
        KafkaError._NOENT,  # librdkafka's own metadata names no leader yet
    }
)


def _leaders_serve(admin: _Admin, name: str, partitions: Iterable[int], deadline: float) -> bool:
    """Whether each partition's leader answers a ListOffsets for it.

    Metadata from one broker names the leaders before every leader has applied the topic's
    record (KRaft brokers apply it on their own time): a client reading the end offsets right
    after (``kresilient dlq inspect``) got UNKNOWN_TOPIC_OR_PART. An error other than "not
    serving it yet" (an ACL without Describe, say) is not creation's to report: True.
    """
    latest: Any = OffsetSpec.latest  # untyped in confluent-kafka
    spec = {TopicPartition(name, p): latest() for p in partitions}
    left = max(0.1, min(_METADATA_SLICE, _left(deadline)))
    try:
        futures = admin.client.list_offsets(spec, request_timeout=left)
    except KafkaException:
        return True
    for future in futures.values():
        try:
            future.result(timeout=left + 1)
        except KafkaException as exc:
            if exc.args[0].code() in _NOT_SERVING_YET:
                return False
        except TimeoutError:
            return False
    return True


def _wait_for_leaders(admin: _Admin, name: str, partitions: int, deadline: float) -> None:
    # Creation returns before every broker knows the topic; a producer started right after
    # would otherwise see UNKNOWN_TOPIC_OR_PART for a moment.
    while True:
        md = admin.metadata(deadline, topic=name)
        topic = md.topics.get(name)
        if (
            topic is not None
            and topic.error is None
            and len(topic.partitions) >= partitions
            and all(p.leader >= 0 for p in topic.partitions.values())
            and _leaders_serve(admin, name, topic.partitions, deadline)
        ):
            return
        if _left(deadline) <= 0:
            raise KafkaClientError(
                f"topic {name!r} was created but not every partition has a leader serving it yet",
                code=KafkaError._TIMED_OUT,
                topic=name,
            )
        time.sleep(0.1)


def create_topic(
    bootstrap_servers: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 3,
    config: Mapping[str, str | int | bool] | None = None,
    dead_letter: bool = False,
    if_not_exists: bool = False,
    timeout: float = 8.0,
    client_config: Mapping[str, Any] | None = None,
) -> list[TopicResult]:
    """Create ``name`` (and with ``dead_letter=True`` also ``name + ".dlq"``) and wait until
    every partition has a leader that serves it (answers a ListOffsets for it).

    Args:
        bootstrap_servers: ``host:port[,host:port...]`` of the cluster.
        name: the topic.
        partitions: partition count (the dead-letter topic gets the same, so keys keep
            their order there too).
        replication_factor: copies of each partition; at most the number of brokers.
        config: topic settings (``retention.ms``, ``max.message.bytes``, ...);
            ``min.insync.replicas`` defaults to ``min(2, replication_factor)``.
        dead_letter: also create the dead-letter topic with :func:`dead_letter_topic_config`.
        if_not_exists: a topic that exists already is left as it is and reported with
            ``existed=True`` instead of raising.
        timeout: seconds for the whole operation, including reaching the cluster.
        client_config: extra client properties (security settings) for the admin client.

    Returns:
        One :class:`TopicResult` per topic, the source first.

    Raises:
        ConfigError: bad input (name, counts, settings), before anything is sent.
        KafkaClientError: the cluster cannot be reached (one line naming each host and the
            reason), refused the request (the broker's reason, e.g. ``TOPIC_ALREADY_EXISTS``
            or a replication factor above the broker count), or did not answer in time.
    """
    deadline = time.monotonic() + timeout
    source = {k: _setting(v) for k, v in (config or {}).items()}
    source.setdefault("min.insync.replicas", str(min(2, replication_factor)))
    _check_input(name, partitions, replication_factor, source)
    dlq_name = name + DEAD_LETTER_SUFFIX
    if dead_letter:
        _check_input(dlq_name, partitions, replication_factor, {})

    admin = _Admin(bootstrap_servers, client_config)
    md = admin.metadata(deadline)
    brokers = len(md.brokers)
    if replication_factor > brokers:
        raise ConfigError(
            f"replication factor {replication_factor} needs {replication_factor} brokers; "
            f"the cluster at {bootstrap_servers} has {brokers}"
        )
    wanted: list[tuple[str, dict[str, str]]] = [(name, source)]
    if dead_letter:
        limit = _broker_max_bytes(admin, min(md.brokers), deadline)
        dlq = dead_letter_topic_config(
            source, replication_factor=replication_factor, broker_max_message_bytes=limit
        )
        wanted.append((dlq_name, dlq))

    results: list[TopicResult] = []
    for topic, settings in wanted:
        current = md.topics.get(topic)
        if current is None:
            try:
                _create(admin, topic, partitions, replication_factor, settings, deadline)
            except KafkaClientError as exc:
                # TOPIC_ALREADY_EXISTS: the broker that answered the metadata request had not
                # yet learnt of a topic the controller already has (created a moment ago,
                # perhaps by this very command run twice); it is treated as if seen there.
                if exc.code != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
            else:
                results.append(
                    TopicResult(
                        name=topic,
                        partitions=partitions,
                        replication_factor=replication_factor,
                        config=settings,
                    )
                )
                continue
        if not if_not_exists:
            raise KafkaClientError(
                f"topic {topic!r} already exists (pass --if-not-exists to accept that)",
                code=KafkaError.TOPIC_ALREADY_EXISTS,
                topic=topic,
            )
        if current is None:
            current = _existing(admin, topic, deadline)
        # Report what is there, not what was asked for: it was left unchanged.
        parts = current.partitions
        replicas = len(parts[min(parts)].replicas) if parts else 0
        results.append(
            TopicResult(
                name=topic, partitions=len(parts), replication_factor=replicas, existed=True
            )
        )
    for result in results:
        if not result.existed:
            _wait_for_leaders(admin, result.name, partitions, deadline)
    return results


def _existing(admin: _Admin, topic: str, deadline: float) -> Any:
    """The metadata of ``topic``, which the controller says exists, once a broker knows it."""
    while True:
        current = admin.metadata(deadline, topic).topics.get(topic)
        if current is not None and current.error is None and current.partitions:
            return current
        if _left(deadline) <= 0:
            raise KafkaClientError(
                f"topic {topic!r} exists (the controller refused to create it again) but no "
                f"broker at {admin.servers} described it in time",
                code=KafkaError._TIMED_OUT,
                topic=topic,
            )
        time.sleep(0.1)


#: Local errors after which a CreateTopics may or may not have reached the controller, and
#: sending it again is the remedy: librdkafka (2.10+) fails the requests queued on a broker
#: that a metadata answer left out with _DESTROY_BROKER; a restarting broker drops the
#: connection (_TRANSPORT).
_RESEND_CODES: Final = frozenset({KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT})


def _create(
    admin: _Admin,
    topic: str,
    partitions: int,
    replication_factor: int,
    settings: Mapping[str, str],
    deadline: float,
) -> None:
    """Create ``topic``, sending again after a lost connection while time is left.

    TOPIC_ALREADY_EXISTS after such a resend means the earlier send took effect: created.
    """
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(settings),
    )
    resent = False
    while True:
        left = max(0.1, _left(deadline))
        futures = admin.client.create_topics([new], operation_timeout=left, request_timeout=left)
        try:
            futures[topic].result(timeout=left + 1)
            return
        except KafkaException as exc:
            err: KafkaError = exc.args[0]
            if resent and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            if err.code() in _RESEND_CODES and _left(deadline) > 0:
                resent = True
                time.sleep(0.2)
                continue
            raise KafkaClientError(
                f"creating topic {topic!r} failed: {err.str()}",
                code=err.code(),
                name=err.name(),
                topic=topic,
            ) from None
        except TimeoutError:
            raise KafkaClientError(
                f"creating topic {topic!r}: no answer from {admin.servers} in time",
                code=KafkaError._TIMED_OUT,
                topic=topic,
            ) from None


def _setting(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
