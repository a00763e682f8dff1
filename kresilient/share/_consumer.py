"""ResilientShareConsumer: a share group (KIP-932) worker queue with kresilient's guarantees.

A share group hands the records of a partition to many members; each record is *acquired* by
one member for the group's lock duration (``share.record.lock.duration.ms``) and acknowledged
on its own: ACCEPT (done), RELEASE (deliver again, the broker counts the delivery) or REJECT
(never again). A record whose lock expires is released by the broker. A record whose delivery
count reaches ``share.delivery.count.limit`` is *archived* when it is released again: dropped,
with no trace. The loop here keeps the guarantees of :class:`~kresilient.ResilientConsumer`
on top of that:

* the handler returned -> ACCEPT;
* a failure its :class:`~kresilient.RetryPolicy` retries -> RELEASE after the policy's wait
  (held locked meanwhile, never past the lock), the broker's delivery count being the attempt
  number, so the next attempt may run on any member;
* poison (not retried), or retries exhausted (the policy's ``stop`` at the delivery count, or
  the count at the group's limit, where a RELEASE would archive it) -> the dead letter is
  written with the one :class:`~kresilient.deadletter.DeadLetterWriter` (original bytes,
  kresilient's headers, ``kresilient.attempts`` = the delivery count) and the record is
  ACCEPTed only once the dead letter is acknowledged (an acknowledgement after the lock's
  end: no ACCEPT, reported as ``lock_expired``); a failed dead-letter write RELEASEs it below
  the limit; one still in flight at the lock's end is waited for once the batch's other
  records are acknowledged, until past the lock, and the record left
  to the broker's lock expiry (never RELEASEd while its dead letter may still land), and the
  record's next delivery to this member waits for that dead letter instead of writing a
  second one. Before any dead letter, the dead-letter reader is asked whether one is already
  written (:mod:`kresilient.share._deadletters`). Without a dead-letter policy it is REJECTed;
* a record at its last delivery is never RELEASEd (nor is it safe unacknowledged: the lock's
  expiry archives it too): the outage hold and ``stop()`` dead-letter it instead, its
  dead-letter write is retried until the lock's end, and if that fails it is reported
  (``share_record_lost_at_limit`` ERROR) and :meth:`ResilientShareConsumer.poll_once` raises a
  :class:`~kresilient.DeadLetterError` naming it once the batch is settled;
* a dependency outage (:class:`~kresilient.consumer.OutageDetector`: distinct records failing
  with no success between) holds the failing record and retries it in place under the outage
  policy, fetching nothing meanwhile (every fetch is a delivery), and dead-letters nothing for
  it; a hold that would outlive the lock RELEASEs the held records (one delivery each; one at
  its limit is dead-lettered) and waits before fetching again;
* the lock is counted from before the poll call (records prefetched earlier were acquired
  earlier still: a margin is kept, no guarantee); the records of a poll share one lock: once
  a batch has run 50 ms, acknowledgements are sent (``commit_async``) after a handler returns
  whenever 50 ms passed since the last send, so one slow handler does not take the batch's
  earlier ACCEPTs past the lock (only those of the last 50 ms); no record is run once the lock
  ended;
* a handler that returns after its record's lock expired is reported (``lock_expired``, a
  WARNING; an ERROR at the last delivery, where the broker archives it) and its result is not
  acknowledged as ACCEPT: below the limit the broker redelivers the record, and the member
  holding it then acknowledges it once.

``health_port=`` serves ``GET /live`` and ``GET /ready`` with the consumer's probe server
(:class:`~kresilient.consumer.ConsumerProbes`): live while :meth:`run` or a
:meth:`poll_once` loop polls, ready once it has polled and while no handler has run longer
than ``stall_after_s`` (named with its record's partition) and no dependency outage is held;
a handler stalled that long is logged once (``consumer_stalled``) by its watcher thread.
A share group has no offsets and tells a member no assignment, so there are no lag figures.

The client's share consumer is not thread-safe and has no asyncio form; see
docs/share-groups.md.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Final

import structlog
import tenacity
from confluent_kafka import (
    AcknowledgeType,
    KafkaError,
    KafkaException,
    Message,
    ShareConsumer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kresilient.config import SHARE_CONSUMER_REFUSED, consumer_config
from kresilient.consumer import (
    OUTAGE_RETRY,
    ConsumerProbes,
    OutageDecision,
    OutageDetector,
    RetryPolicy,
    poison,
)
from kresilient.deadletter import (
    DeadLetterHandle,
    DeadLetterPolicy,
    DeadLetterRecord,
    DeadLetterWriter,
    build_dead_letter_record,
)
from kresilient.errors import (
    Classification,
    ConfigError,
    DeadLetterError,
    DeliveryError,
    UnsafeConfigError,
    classify,
    exception_type_name,
    translate,
)
from kresilient.reachability import LogBridge, Reachability
from kresilient.redaction import Redactor, redact_config
from kresilient.share._deadletters import (
    DEFAULT_LOOKBACK_S,
    DeadLetterIndex,
    Key,
    check_lookback,
    record_key,
)
from kresilient.telemetry import Telemetry

__all__ = [
    "ResilientShareConsumer",
    "ShareConsumerStats",
    "configure_share_group",
    "share_consumer_config",
]

_ACCEPT: Final = AcknowledgeType.ACCEPT
#: Errors a record of a batch may carry and still be handled (as poison).
_DESERIALIZATION: Final = (KafkaError._KEY_DESERIALIZATION, KafkaError._VALUE_DESERIALIZATION)
#: Acknowledgements are sent (``commit_async``) when a handler returns this long after the
#: last send (the batch's start counts as one), not only with the batch's ``commit_sync``:
#: a quick batch costs no extra request.
_SEND_ACKS_EVERY: Final = 0.05

#: Defaults of the broker/group when they cannot be read (Kafka 4.x).
DEFAULT_LOCK_DURATION_S: Final = 30.0
DEFAULT_DELIVERY_COUNT_LIMIT: Final = 5
#: Share-consumer keys that would weaken "acknowledged only after processing".
_IMPLICIT = "share.acknowledgement.mode"
#: Seconds the start waits for the cluster's metadata (the dead-letter topics' check).
_METADATA_TIMEOUT: Final = 10.0
#: Dead letters still in flight kept at most (by record); settled ones go first.
_IN_FLIGHT_MAX: Final = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class _Topic:
    topic: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Landed:
    """A dead letter of this member's, in flight at its record's lock end, that was
    acknowledged since: what is kept of it (not the record's bytes, nor the delivery report's
    message). The record's next delivery to this member is ACCEPTed at once; forgotten once
    no delivery of the record can still be pending (``at`` + the delivery-count limit times
    the lock). Answers as a settled :class:`DeadLetterHandle` does."""

    record: _Topic
    at: float

    def done(self) -> bool:
        return True

    def exception(self, timeout: float | None = None) -> None:
        return None


_Flight = DeadLetterHandle | _Landed


def share_consumer_config(
    user: Mapping[str, Any], *, allow_unsafe: Iterable[str] = (), logger: Any = None
) -> dict[str, Any]:
    """The share consumer's librdkafka config: ``user`` checked by kresilient's consumer
    refusals (security, conflicts), explicit acknowledgement forced, consumer-only keys refused.

    ``share.acknowledgement.mode=implicit`` (ACCEPT on the next poll, before the handler's
    outcome is known) is refused with :class:`~kresilient.UnsafeConfigError`; so are the
    consumer's offset keys, which a share consumer does not read (the broker keeps the
    share-partition state): the group's own settings (``share.auto.offset.reset``,
    ``share.record.lock.duration.ms``, ``share.delivery.count.limit``) are group configs.
    """
    mode = str(user.get(_IMPLICIT, "explicit")).lower()
    if mode != "explicit":
        raise UnsafeConfigError(
            f"{_IMPLICIT}={mode} acknowledges records before the handler's outcome is known; "
            "ResilientShareConsumer acknowledges each record itself (remove the key)",
            key=_IMPLICIT,
            value=user.get(_IMPLICIT),
        )
    for key in user:
        who = SHARE_CONSUMER_REFUSED.get(key)
        if who is not None:
            raise ConfigError(
                f"{key} is a consumer-group setting a share consumer does not take"
                f"{' (librdkafka refuses it)' if who == 'librdkafka' else ''}; share groups "
                "keep their state on the broker (set share.* group configs instead)",
                key=key,
            )
    checked = {k: v for k, v in user.items() if k != _IMPLICIT}
    # kresilient's consumer refusals apply to the keys both clients read (security, sizes).
    consumer_config(checked, allow_unsafe=allow_unsafe, logger=logger)
    out = dict(checked)
    out.setdefault("client.id", "kresilient-share-consumer")
    out[_IMPLICIT] = "explicit"
    return out


def configure_share_group(
    config: Mapping[str, Any], group: str, settings: Mapping[str, str | int], *, timeout: float = 30
) -> None:
    """Set share-group configs (IncrementalAlterConfigs on the GROUP resource, Kafka 4.2+).

    ``settings`` e.g. ``{"share.auto.offset.reset": "earliest"}`` (a new share group starts
    at the *latest* offset otherwise), ``"share.record.lock.duration.ms"`` (bounded by the
    brokers' ``group.share.min/max.record.lock.duration.ms``), ``"share.delivery.count.limit"``.
    ``config`` gives the connection (``bootstrap.servers``, security); errors are redacted.

    Returns once every broker of the cluster's metadata that answers DescribeConfigs answers
    the new values (within ``timeout``; a value the broker renders its own way, ``" 5000"``
    as ``5000``, counts): each broker applies a group config from the metadata log at its
    own pace, so one asked right after the change may still answer the old value, and a
    :class:`ResilientShareConsumer` reading it then would take the broker's default lock
    duration (30 s) instead of the one just set. Raises :class:`~kresilient.ConfigError`
    when the change is refused, when a broker still answers another value at ``timeout``,
    or when no broker answered at all.
    """
    admin_keys = {k: v for k, v in config.items() if not k.startswith("share.") and k != "group.id"}
    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()
    ]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    deadline = time.monotonic() + timeout
    admin = AdminClient(admin_keys)  # kept alive until the result: a dropped client fails it
    redact = Redactor.for_config(config)
    try:
        admin.incremental_alter_configs([res], request_timeout=timeout)[res].result(timeout)
        brokers = sorted(admin.list_topics(timeout=timeout).brokers)
    except (KafkaException, TimeoutError) as exc:
        # Both ways of running out of time read the same: our wait (a TimeoutError, which says
        # nothing) and librdkafka's own request timeout (_TIMED_OUT), whichever comes first.
        detail = f"no answer within {timeout:g} s"
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(err, KafkaError) and err.code() != KafkaError._TIMED_OUT:
            detail = str(exc)
        elif str(exc):
            detail = f"{detail} ({exc})"
        raise ConfigError(
            redact(f"share group {group}: setting {sorted(settings)} failed: {detail}")
        ) from None
    answers: dict[int, dict[str, str | None]] = {}  # the last answer of each broker
    while True:
        left = max(deadline - time.monotonic(), 1.0)
        asked = {}
        for broker in brokers:
            if broker in answers and _applied(settings, answers[broker]):
                continue
            # librdkafka sends a DescribeConfigs holding a BROKER resource to that broker, the
            # group's beside it too (alone, a group's goes to any broker): its own answer
            pin = ConfigResource(ResourceType.BROKER, str(broker))
            described = ConfigResource(ResourceType.GROUP, group)
            futures = admin.describe_configs([pin, described], request_timeout=left)
            asked[broker] = futures[described]
        for broker, future in asked.items():
            try:
                current = future.result(left)
            except (KafkaException, TimeoutError):
                continue  # asked again until the deadline
            answers[broker] = {n: current[n].value if n in current else None for n in settings}
        behind = {a: answers.get(a) for a in brokers if not _applied(settings, answers.get(a))}
        if not behind:
            return
        if time.monotonic() + 0.1 >= deadline:
            # a broker that never answered (stopping, fenced) is no evidence either way
            lagging = {a: v for a, v in behind.items() if v is not None}
            if lagging or len(answers) == 0:
                raise ConfigError(
                    redact(
                        f"share group {group}: set {settings!r}, but after {timeout:g} s "
                        + (
                            f"these brokers (by node id) still answer {lagging}"
                            if lagging
                            else f"no broker of {brokers} answered DescribeConfigs"
                        )
                    )
                )
            return
        time.sleep(0.1)


def _applied(settings: Mapping[str, str | int], answer: Mapping[str, str | None] | None) -> bool:
    """Whether a broker's DescribeConfigs ``answer`` holds ``settings``, as the broker renders
    a value it parsed (surrounding space stripped, ``05000`` as ``5000``, ``TRUE`` as ``true``)."""
    if answer is None:
        return False
    return all(_same(str(value), answer.get(name)) for name, value in settings.items())


def _same(wanted: str, got: str | None) -> bool:
    if got is None:
        return False
    wanted, got = wanted.strip(), got.strip()
    if wanted == got or wanted.lower() == got.lower() in ("true", "false"):
        return True
    try:
        return int(wanted) == int(got)
    except ValueError:
        return False


@dataclasses.dataclass
class ShareConsumerStats:
    """Counters of one :class:`ResilientShareConsumer` (read from any thread)."""

    accepted: int = 0  #: records ACCEPTed after the handler returned
    released: int = 0  #: RELEASEs for a retry (one per failed retriable attempt)
    dead_lettered: int = 0  #: dead letters acknowledged, their records then ACCEPTed
    rejected: int = 0  #: records REJECTed (no dead-letter policy)
    lock_expired: int = 0  #: handler results not acknowledged: the lock had expired
    outage_holds: int = 0  #: retries of a held record during a dependency outage
    outage_releases: int = 0  #: records released because an outage outlived their lock
    ack_errors: int = 0  #: partitions whose acknowledgement the broker refused
    #: records at ``share.delivery.count.limit`` whose dead letter was not acknowledged
    #: before their lock's end: the broker archives them (each logged as an ERROR)
    lost_at_limit: int = 0
    #: redelivered poison records whose dead letter was already written (a member died
    #: between its acknowledgement and the ACCEPT): ACCEPTed without a second one
    dead_letters_found: int = 0
    #: poison records dead-lettered without knowing whether one was already written (the
    #: dead-letter reader behind, down, or refused its topic): a duplicate is possible
    dead_letters_unconfirmed: int = 0
    #: poison records whose dead letter was still in flight (written, neither acknowledged
    #: nor failed) at their lock's end: left to the broker's lock expiry, never RELEASEd
    #: early; the dead letter may still land, so a member that gets the record next and
    #: cannot see it yet may write a second one (this member never does)
    dead_letters_in_flight: int = 0


class _Stop(Exception):
    """The consumer was stopped while holding a record at its last delivery (the reason
    its dead letter gives: a RELEASE there would have the broker archive it)."""


class ResilientShareConsumer:
    """A share-group member: a handler per record, acknowledgement after the outcome.

    Args:
        config: librdkafka settings (``bootstrap.servers``, ``group.id`` = the share group,
            security); see :func:`share_consumer_config`.
        topics: topics to subscribe to (names: a share group has no regex subscription, a
            ``^`` pattern is refused with a :class:`~kresilient.ConfigError`).
        handler: called with each ``confluent_kafka.Message``; returning is success.
        retry: which failures are retried and how long to wait before the RELEASE; the
            broker's delivery count is the attempt number (default :class:`RetryPolicy`:
            5 attempts, capped by the group's ``share.delivery.count.limit``).
        dead_letter: where poison and exhausted records go (default ``<topic>.dlq``);
            ``None``: they are REJECTed (the broker archives them). Its ``require_topic``
            (default True): the constructor raises a :class:`~kresilient.ConfigError` naming
            the dead-letter topics that do not exist. The member's principal needs WRITE,
            READ and DESCRIBE on them (READ for the dead-letter reader below).
        outage: the outage hold's policy (its ``wait`` paces the retries of the held
            record); ``None`` turns outage detection off.
        lock_duration: seconds a record stays acquired (default: the group's
            ``share.record.lock.duration.ms``, read from the cluster at start).
        delivery_count_limit: the group's ``share.delivery.count.limit`` (default: read).
        telemetry: a :class:`~kresilient.telemetry.Telemetry` (default: one for the config).
        logger: structlog logger.
        health_port: serve ``GET /live`` and ``GET /ready`` on this port from the first
            poll (:meth:`run` or :meth:`poll_once`) until :meth:`close` (0: any free port,
            see :attr:`health_port`); ``None``: no server.
        health_host: the address the probe server binds (127.0.0.1 by default).
        stall_after_s: ``/ready`` turns 503 (and one ``consumer_stalled`` WARNING is logged)
            when a handler has been running this long (an outage hold's waits between the
            held record's calls are not: no handler runs). ``/live`` turns 503 after
            :meth:`stop` or :meth:`close`, or when nothing has polled for twice the lock
            duration plus 10 s (a batch, its releases and an outage pause all fit in that),
            whether :meth:`run` or the application's own :meth:`poll_once` loop polls.
        dead_letter_lookback_s: one dead letter per record even when a member dies between
            a dead letter's acknowledgement and its record's ACCEPT: a background reader
            tails the dead-letter topics from this many seconds before the start, and a
            poison record whose dead letter it has read is ACCEPTed without a second one
            (``stats.dead_letters_found``). ``None``: no reader (a duplicate is then possible);
            not a finite number >= 0: :class:`~kresilient.ConfigError`. See
            :mod:`kresilient.share._deadletters` for its limits.

    Example::

        def handle(msg):
            charge(json.loads(msg.value()))

        with ResilientShareConsumer(
            {"bootstrap.servers": "localhost:9092", "group.id": "payments"},
            ["payments"], handle,
        ) as consumer:
            consumer.run()          # until consumer.stop() or SIGTERM handling of the app
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        handler: Callable[[Message], object],
        *,
        retry: RetryPolicy | None = None,
        dead_letter: DeadLetterPolicy | None = DeadLetterPolicy(),  # noqa: B008 (frozen)
        outage: RetryPolicy | None = OUTAGE_RETRY,
        lock_duration: float | None = None,
        delivery_count_limit: int | None = None,
        allow_unsafe: Iterable[str] = (),
        telemetry: Telemetry | None = None,
        logger: Any = None,
        health_port: int | None = None,
        health_host: str = "127.0.0.1",
        stall_after_s: float = 60.0,
        dead_letter_lookback_s: float | None = DEFAULT_LOOKBACK_S,
    ) -> None:
        base = logger if logger is not None else structlog.get_logger("kresilient.share")
        self._cfg = share_consumer_config(config, allow_unsafe=allow_unsafe, logger=base)
        self._redact = Redactor.for_config(self._cfg)
        self.group: str = str(self._cfg["group.id"])
        self._log = base.bind(client_id=self._cfg["client.id"], group=self.group)
        # every librdkafka line of this member's clients (the share consumer, the admin
        # clients reading the group's settings and the dead-letter topics) through structlog
        # and the Redactor, connection failures summarised: never raw %3|...|FAIL| lines on
        # stderr (review14 F7: ~400 of them in 20 s against an unreachable cluster)
        self._bridge = LogBridge(
            self._log,
            lambda _line: None,
            self._redact,
            user_logger=self._cfg.get("logger"),
            reachability=Reachability(self._log),
        )
        self.topics = list(topics)
        regex = [t for t in self.topics if t.startswith("^")]
        if regex:
            raise ConfigError(
                f"ResilientShareConsumer subscribes to topic names, not patterns: {regex}; a "
                "share group (KIP-932) has no regex subscription (nothing is delivered); list "
                "the topics",
                key="topics",
            )
        if dead_letter is not None and dead_letter_lookback_s is not None:
            dead_letter_lookback_s = check_lookback(dead_letter_lookback_s)
        self._handler = handler
        self._retry = retry if retry is not None else RetryPolicy()
        self._retrying = self._retry.retrying()
        self._outage_policy = outage
        self._dlq = dead_letter
        self._detector = OutageDetector()
        self._marks: dict[tuple[str, int, int], int] = {}
        self.stats = ShareConsumerStats()
        self._stopping = threading.Event()
        self._tel = telemetry if telemetry is not None else Telemetry.for_client(self._cfg)
        admin_conf: dict[str, Any] = {
            k: v
            for k, v in self._cfg.items()
            if not k.startswith("share.") and k not in ("group.id", "client.id")
        }
        admin_conf["logger"] = self._bridge
        admin = AdminClient(admin_conf)
        try:
            group_lock, group_limit = self._group_settings(admin)
            if dead_letter is not None and dead_letter.require_topic:
                self._check_dead_letter_topics(admin, dead_letter)
        finally:
            admin.poll(0)  # its queued log lines, through the bridge
        self.lock_duration: float = lock_duration if lock_duration is not None else group_lock
        self.delivery_count_limit: int = (
            delivery_count_limit if delivery_count_limit is not None else group_limit
        )
        self._writer: DeadLetterWriter | None = None
        if dead_letter is not None:
            self._writer = DeadLetterWriter(
                self._cfg,
                client_id=str(self._cfg["client.id"]),
                logger=self._log,
            )
        self._index: DeadLetterIndex | None = None
        self._index_gave_up = -1.0  # the batch (its poll's return) whose question timed out
        #: dead letters written by this member whose acknowledgement outlived their record's
        #: lock, by record: checked before any dead letter is written (a second one is never
        #: written while the first may still land)
        self._in_flight: dict[Key, _Flight] = {}
        #: when the batch in hand was returned by poll (the broker acquired it by then): the
        #: dead-letter index's question is asked with the high watermarks read after it
        self._returned = 0.0
        #: the batch's poison records whose dead letter is still in flight: settled once the
        #: rest of the batch is handled and acknowledged (a wait inline would take the later
        #: records past the batch's lock)
        self._deferred: list[
            tuple[Message, _Flight, Key, BaseException, Classification, int, float]
        ] = []
        if dead_letter is not None and dead_letter_lookback_s is not None:
            self._index = DeadLetterIndex(
                self._cfg,
                [dead_letter.topic_for(t) for t in self.topics],
                self.group,
                client_id=str(self._cfg["client.id"]),
                log=self._log,
                redact=self._redact,
                lookback_s=dead_letter_lookback_s,
                keep_s=self.delivery_count_limit * self.lock_duration,
            )
        rdk: dict[str, Any] = {**self._cfg, "logger": self._bridge}
        try:
            self._consumer = ShareConsumer(rdk)
        except KafkaException as exc:
            if self._writer is not None:
                self._writer.close(0)
            self._index = None
            text = self._redact(f"the share consumer refused its config: {exc}")
            raise ConfigError(text) from None
        self._consumer.set_acknowledgement_commit_callback(self._on_acknowledged)
        self._consumer.subscribe(self.topics)
        self._closed = False
        self._acquired: tuple[Message, ...] = ()
        #: when the handler call in hand began (0: none: between calls, e.g. an outage hold's
        #: wait or a dead-letter write, no handler runs), for the probes' stall check
        self._record_started = 0.0
        #: the record of that call (set before ``_record_started``: the probes read it after)
        self._in_hand: Message | None = None
        self._next_tick = 0.0
        self._probes = ConsumerProbes(
            None,  # no watermarks nor positions in a share group: no lag figures
            _ShareProbeSource(self),
            stall_after_s=stall_after_s,
            max_poll_s=2 * self.lock_duration + 10.0,
            group=self.group,
            outage=self._detector,
            log=self._log,
            redact=self._redact,
        )
        self._health_addr = (health_host, health_port)
        self._health_port: int | None = None
        #: raised by poll_once once the batch is settled: a record at its limit was lost
        self._fatal: DeadLetterError | None = None
        self._log.info(
            "share_consumer_started",
            topics=self.topics,
            lock_duration_s=self.lock_duration,
            delivery_count_limit=self.delivery_count_limit,
            dead_letter=dead_letter is not None,
        )

    # ------------------------------------------------------------------ cluster settings

    def _group_settings(self, admin: AdminClient) -> tuple[float, int]:
        """The group's lock duration (s) and delivery-count limit, read with DescribeConfigs
        (Kafka 4.2+ has them as group configs); the broker defaults when that fails."""
        lock, limit = DEFAULT_LOCK_DURATION_S, DEFAULT_DELIVERY_COUNT_LIMIT
        try:
            res = ConfigResource(ResourceType.GROUP, self.group)
            entries = admin.describe_configs([res], request_timeout=10)[res].result(15)
            if "share.record.lock.duration.ms" in entries:
                lock = float(entries["share.record.lock.duration.ms"].value) / 1000.0
            if "share.delivery.count.limit" in entries:
                limit = int(entries["share.delivery.count.limit"].value)
        except Exception as exc:  # an older broker, no DescribeConfigs right: the defaults
            self._log.warning(
                "share_group_config_unread",
                error=self._redact(str(exc)),
                lock_duration_s=lock,
                delivery_count_limit=limit,
            )
        return lock, limit

    def _check_dead_letter_topics(self, admin: AdminClient, policy: DeadLetterPolicy) -> None:
        """Fail fast when a dead-letter topic is missing (``require_topic``), as
        :class:`~kresilient.ResilientConsumer` does, not at the first poison record."""
        wanted = sorted({policy.topic_for(t) for t in self.topics})
        if not wanted:
            return
        try:
            metadata = admin.list_topics(timeout=_METADATA_TIMEOUT)
        except KafkaException as exc:
            error = translate(exc, operation="consume", redactor=self._redact)
            raise type(error)(
                f"no broker reachable within {_METADATA_TIMEOUT:g} s to check the dead-letter "
                f"topics {wanted}: {error.message} (or pass DeadLetterPolicy(require_topic="
                "False))",
                classification=error.classification,
            ) from None
        missing = [
            t for t in wanted if t not in metadata.topics or metadata.topics[t].error is not None
        ]
        if missing:
            raise ConfigError(
                f"dead-letter topic(s) {missing} do not exist (or this principal may not "
                "DESCRIBE them): create them (replicated like "
                "the source topics, e.g. `kresilient topic create NAME --dlq`) or pass "
                "DeadLetterPolicy(require_topic=False)",
                key=None,
            )

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return after the current record (any thread); ``/live`` and
        ``/ready`` answer 503 from now on."""
        self._stopping.set()
        self._probes.running = False

    def health(self) -> dict[str, Any]:
        """The counters, the current outage (``None`` when there is none), what ``/live`` and
        ``/ready`` would answer (``live``, ``ready``, ``reasons``) and the stall fields
        (``stalled``, ``stalled_since``, ``stalls``) of the probes, and ``dead_letter_index``:
        the dead-letter reader's state (``None`` without one: ``state``, each topic's, the
        last client error) and ``dead_letters_in_flight``: this member's dead letters written
        and not yet acknowledged past their record's lock."""
        live, _ = self._probes.live()
        ready, reasons = self._probes.ready()
        return {
            "stats": dataclasses.asdict(self.stats),
            "outage": self._detector.snapshot(),
            "lock_duration_s": self.lock_duration,
            "delivery_count_limit": self.delivery_count_limit,
            "live": live,
            "ready": ready,
            "reasons": reasons,
            **self._probes.stall_fields(),
            "dead_letter_index": self._index.state() if self._index is not None else None,
            "dead_letters_in_flight": sum(not h.done() for h in list(self._in_flight.values())),
        }

    @property
    def health_port(self) -> int | None:
        """The port ``/live`` and ``/ready`` are served on (``None``: not serving)."""
        return self._health_port

    @property
    def acquired(self) -> tuple[Message, ...]:
        """The records of the batch being handled: acquired by this member from the last poll
        until the batch's acknowledgements are committed. If the process dies, these are the
        records the broker delivers again once their lock expires."""
        return self._acquired

    @property
    def config(self) -> dict[str, Any]:
        """The share consumer's configuration, secrets redacted."""
        return redact_config(self._cfg)

    def close(self) -> None:
        """Leave the group (records not acknowledged go back to it) and flush dead letters."""
        if self._closed:
            return
        self._closed = True
        self._probes.running = False
        self._probes.close()
        try:
            self._consumer.close()
        finally:
            if self._index is not None:
                self._index.close()
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> ResilientShareConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop

    def run(self, *, timeout: float | None = None, poll_timeout: float = 0.5) -> None:
        """Poll and handle until :meth:`stop` (or ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                return
            self.poll_once(poll_timeout)

    def _start_probes(self) -> None:
        """The first poll: the member is live from now on (until :meth:`stop`, :meth:`close`
        or ``max_poll_s`` without a poll), and the probe server starts."""
        if self._index is not None and not self._index.started:
            self._index.start()  # at the first poll: a member that never polls reads nothing
        probes = self._probes
        probes.running = True
        if self._stopping.is_set():  # stop() raced this call: it wins
            probes.running = False
        host, port = self._health_addr
        if port is not None and self._health_port is None:
            self._health_port = probes.serve(host, port)
            self._log.info("health_probes_serving", host=host, port=self._health_port)

    def poll_once(self, timeout: float = 0.5) -> int:
        """Fetch one batch, handle and acknowledge every record of it; return its size.

        ``timeout`` is capped at a tenth of the lock duration: the lock is counted from before
        the poll, so a long wait would shorten the time left to handle the batch.

        Raises the :class:`~kresilient.DeadLetterError` naming a record at its last delivery
        whose dead letter could not be written in time (the broker archives it), once the
        batch is settled, and again on every later call: close the consumer."""
        if self._fatal is not None:
            raise self._fatal
        # the lock is counted from *before* the poll: the broker acquired the records at some
        # point during it (or earlier, see docs/share-groups.md), never after it returned
        # (the wait is capped at a tenth of the lock so that it cannot eat a batch's lock)
        acquired = time.monotonic()
        # a fetch in flight when the previous poll returned may have acquired records then,
        # which this poll hands out with their lock running since: such a record may be stale
        # (its lock expired, another member holding it). Its handler runs (a refused ACCEPT
        # only means one more delivery); a poison one asks the dead-letter index, whose high
        # watermarks are read after this poll returned (_already_dead_lettered), before its
        # dead letter is written
        probes = self._probes
        probes.last_poll = acquired
        if not probes.running and not self._stopping.is_set() and not self._closed:
            self._start_probes()
        if acquired >= self._next_tick:  # about once a second; the first starts the watcher
            self._next_tick = acquired + 1.0
            probes.tick(acquired)
            if self._in_flight:
                self._tidy_in_flight(acquired)
        batch = list(self._consumer.poll(min(timeout, self.lock_duration / 10)))
        self._returned = time.monotonic()
        probes.joined = True  # a share group tells a member no assignment: it has polled
        if not batch:
            return 0
        self._acquired = tuple(batch)
        self._deferred = []
        lock_end = acquired + self.lock_duration
        releases: list[tuple[float, Message]] = []
        sent = acquired  # acknowledgements of a quick batch go with its final commit
        traced = self._tel.enabled  # untraced: the per-record path below skips the span scope
        handler = self._handler
        # the untraced per-record path, bound once per batch (issue 43's throughput bar: with
        # a handler that does nothing, each attribute lookup and call here shows)
        monotonic = time.monotonic
        stopping = self._stopping.is_set
        acknowledge = self._consumer.acknowledge
        stats = self.stats
        # successes not yet told to the outage detector: told once, before anything else
        # reaches it (a failure, the traced path) and at the batch's end, so it sees the same
        # order of events, for one call instead of one a record
        pending = False
        now = monotonic()  # a poll that took the whole lock runs nothing
        for msg in batch:
            err = msg.error()
            if err is not None and err.code() not in _DESERIALIZATION:
                self._log.warning("share_fetch_error", error=self._redact(str(err)))
                continue
            if now >= lock_end:
                # the batch's lock is gone: the broker released it; run nothing more of it
                self._late(msg, ran=False)
                continue
            if now - sent >= _SEND_ACKS_EVERY:
                # send the acknowledgements so far: all of a batch share its lock, and one slow
                # handler would otherwise take the batch's earlier ACCEPTs past it (refused)
                self._consumer.commit_async()
                sent = now
            if stopping():
                self._release(msg, lock_end, _stopped(msg, self.delivery_count_limit))
                continue
            if traced or err is not None:
                if pending:
                    pending = False
                    self._succeeded()
                self._one(msg, lock_end, releases)
                now = monotonic()
                continue
            self._in_hand = msg
            self._record_started = now
            try:
                handler(msg)
            except Exception as exc:
                self._record_started = 0.0  # what follows (a hold, a dead letter) is no handler
                if pending:
                    pending = False
                    self._succeeded()
                if monotonic() >= lock_end:
                    self._late(msg, ran=True, exc=exc)
                else:
                    self._failed(msg, exc, msg.delivery_count() or 1, lock_end, releases)
                now = monotonic()
                continue
            # _record_started is left to the next record (or the batch's end): only an ACCEPT
            # runs meanwhile, and a store per record shows in a no-op handler's rate
            now = monotonic()  # the lock check's clock read serves the next record too
            if now >= lock_end:
                self._late(msg, ran=True)
                continue
            # _success's body, inlined: the per-record path
            try:
                acknowledge(msg, _ACCEPT)
            except KafkaException:
                self._ack(msg, _ACCEPT)  # again, to count and log the refusal
            stats.accepted += 1
            if self._marks:
                self._marks.pop(self._key(msg), None)
            pending = True
        if pending:
            self._succeeded()
        self._record_started = 0.0
        if releases:
            self._due_releases(releases, lock_end)
        self._commit()
        if self._deferred:
            # the rest of the batch is acknowledged and committed within its lock: now wait
            # for the dead letters still in flight
            self._settle_deferred()
            self._commit()
        self._acquired = ()
        if self._fatal is not None:
            raise self._fatal
        return len(batch)

    def _release(self, msg: Message, lock_end: float, exc: BaseException) -> None:
        """RELEASE ``msg`` (the broker delivers it again), unless it is at its last delivery:
        a RELEASE there has the broker archive it, so it is dead-lettered instead."""
        count = msg.delivery_count() or 1
        if count < self.delivery_count_limit:
            self._ack(msg, AcknowledgeType.RELEASE)
            return
        self._give_up(msg, exc, classify(exc), count, lock_end)

    def _key(self, msg: Message) -> tuple[str, int, int]:
        return (msg.topic() or "", msg.partition() or 0, msg.offset() or 0)

    def _one(self, msg: Message, lock_end: float, releases: list[tuple[float, Message]]) -> None:
        with self._tel.process_span(msg, group=self.group):
            exc = self._call(msg)
            if time.monotonic() >= lock_end:
                self._late(msg, ran=True, exc=exc)
                return
            if exc is None:
                self._success(msg)
                return
            self._tel.set_error(exc)
            self._failed(msg, exc, msg.delivery_count() or 1, lock_end, releases)

    def _call(self, msg: Message) -> BaseException | None:
        err = msg.error()
        if err is not None:  # a deserialization failure left in the batch: poison
            self._record_started = 0.0  # no handler runs: the previous record's time is done
            return ValueError(f"deserialization failed: {err.str()}")
        self._in_hand = msg
        self._record_started = time.monotonic()
        try:
            self._handler(msg)
        except Exception as exc:
            return exc
        finally:
            self._record_started = 0.0
        return None

    def _success(self, msg: Message) -> None:
        """ACCEPT a handled record (poll_once's untraced path has this body inlined)."""
        try:  # _ack's body inlined
            self._consumer.acknowledge(msg, _ACCEPT)
        except KafkaException:
            self._ack(msg, _ACCEPT)  # again, to count and log the refusal
        self.stats.accepted += 1
        if self._marks:
            self._marks.pop(self._key(msg), None)
        self._succeeded()

    def _succeeded(self) -> None:
        """Tell the outage detector records were handled; log the end of an outage."""
        if not self._detector.success():
            return
        self._log.warning(
            "share_dependency_outage_ended",
            duration_s=round(self._detector.last_duration or 0.0, 3),
            failures=self._detector.last_failures,
        )

    def _state(self, exc: BaseException, attempt: int) -> tenacity.RetryCallState:
        state = tenacity.RetryCallState(self._retrying, None, (), {})
        state.attempt_number = attempt
        state.outcome = _failed_future(exc, attempt)
        return state

    def _failed(
        self,
        msg: Message,
        exc: BaseException,
        count: int,
        lock_end: float,
        releases: list[tuple[float, Message]],
    ) -> None:
        key = self._key(msg)
        state = self._state(exc, count)
        if not self._retry.retry(state):
            self._give_up(msg, exc, poison(classify(exc)), count, lock_end)
            return
        classification = classify(exc)
        mark = self._marks.setdefault(key, self._detector.mark())
        if self._outage_policy is not None:
            text = self._redact(str(exc))
            if self._detector.failure(key, error_type=exception_type_name(exc), error=text):
                self._log.warning(
                    "share_dependency_outage_started",
                    topic=key[0],
                    partition=key[1],
                    offset=key[2],
                    error_type=exception_type_name(exc),
                    error=text,
                )
        exhausted = bool(self._retry.stop(state)) or count >= self.delivery_count_limit
        if self._outage_policy is not None and self._detector.active:
            self._hold(msg, exc, lock_end, releases)
            return
        if exhausted:
            decision = (
                self._detector.exhausted(mark)
                if self._outage_policy is not None
                else OutageDecision.DEAD_LETTER
            )
            # PROBE: nothing else was handled since its first failure. A share group cannot
            # keep it back behind the next record as a partition does; when the broker would
            # still deliver it again, RELEASE it (more evidence then), else dead-letter it:
            # a RELEASE at the limit archives it, with no trace.
            if decision is OutageDecision.DEAD_LETTER or count >= self.delivery_count_limit:
                self._give_up(msg, exc, classification, count, lock_end)
                return
        delay = float(self._retry.wait(state))
        self._tel.retry_event(None, count, exc, classification=classification, delay_s=delay)
        due = min(time.monotonic() + delay, lock_end - _margin(self.lock_duration))
        releases.append((due, msg))

    def _hold(
        self,
        msg: Message,
        exc: BaseException,
        lock_end: float,
        releases: list[tuple[float, Message]],
    ) -> None:
        """An outage: retry ``msg`` in place (fetch nothing) until it succeeds or its lock
        is about to end; then RELEASE it (one delivery) and pause before the next fetch. A
        record at its last delivery is dead-lettered instead (a RELEASE would archive it)."""
        assert self._outage_policy is not None
        state = tenacity.RetryCallState(self._outage_policy.retrying(), None, (), {})
        margin = _margin(self.lock_duration)
        while not self._stopping.is_set():
            state.attempt_number += 1
            wait = float(self._outage_policy.wait(state))
            if time.monotonic() + wait >= lock_end - margin:
                break
            self._stopping.wait(wait)
            self.stats.outage_holds += 1
            again = self._call(msg)
            if again is None:
                self._success(msg)
                return
            exc = again
            self._detector.failure(self._key(msg))
            held = self._detector.reminder()
            if held is not None:
                self._log.warning(
                    "share_dependency_outage_continues",
                    duration_s=round(self._detector.duration(), 1),
                    failures_since_last=held,
                )
        count = msg.delivery_count() or 1
        if count >= self.delivery_count_limit:
            self._give_up(msg, exc, classify(exc), count, lock_end)
            return
        self.stats.outage_releases += 1
        releases.append((time.monotonic(), msg))

    def _give_up(
        self,
        msg: Message,
        exc: BaseException,
        classification: Classification,
        count: int,
        lock_end: float,
    ) -> None:
        self._marks.pop(self._key(msg), None)
        if self._dlq is None or self._writer is None:
            self._ack(msg, AcknowledgeType.REJECT)
            self.stats.rejected += 1
            self._log.warning(
                "share_record_rejected",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                delivery_count=count,
                error_type=exception_type_name(exc),
                error=self._redact(str(exc)),
            )
            return
        last = count >= self.delivery_count_limit
        deadline = lock_end - _margin(self.lock_duration)
        key = record_key(msg)
        dlq_topic = self._dlq.topic_for(msg.topic() or "")
        earlier = self._in_flight.get(key)
        if earlier is not None:
            # this member's own dead letter of an earlier delivery: never a second one
            if not earlier.done():
                self._deferred.append((msg, earlier, key, exc, classification, count, lock_end))
                return  # waited for at the batch's end
            if self._settle_in_flight(msg, earlier, key, exc, count, lock_end):
                return
        if not last and time.monotonic() >= deadline:
            # no time left to write and ACCEPT: the broker delivers it again after the lock
            self._late(msg, ran=True, exc=exc)
            return
        # every poison record is looked up, not only a redelivered one: a record fetched in
        # the background may come with delivery count 1 after its lock expired and another
        # member dead-lettered it (and one whose own earlier dead letter failed: another
        # member may have written one since)
        if self._already_dead_lettered(msg, key, dlq_topic, deadline, lock_end):
            return
        with self._tel.dead_letter_span(
            dlq_topic,
            source=msg,
            reason=exc,
            classification=classification,
            attempts=count,
            kind="producer",
        ):
            record = build_dead_letter_record(
                msg,
                policy=self._dlq,
                group=self.group,
                exc=exc,
                attempts=count,
                classification=classification,
                trace_context=self._tel.trace_carrier(),
                redact=self._redact,
            )
            failure, handle = self._write_dead_letter(record, deadline, retry=last)
        if failure is not None:
            if handle is not None and not handle.done() and not last:
                # still in flight: no RELEASE (the next delivery would not see it and write
                # a second one); the lock runs to its end, the write with it
                self._remember(key, handle)
                self._deferred.append((msg, handle, key, exc, classification, count, lock_end))
                return  # waited for at the batch's end, after the batch's other records
            self._dead_letter_failed(msg, failure, dlq_topic, count, last, lock_end)
            return
        if time.monotonic() >= lock_end:
            # acknowledged after the lock: an ACCEPT would be refused and, below the limit,
            # the broker delivers the record again (a second dead letter may follow)
            self._late(msg, ran=True, exc=exc, dead_lettered=True)
            return
        self._ack(msg, AcknowledgeType.ACCEPT)
        self.stats.dead_lettered += 1
        # commit this ACCEPT now, not with the batch: a member dying between the dead letter's
        # acknowledgement and the batch's commit would have its broker deliver every dead
        # letter of the batch again (one duplicate dead letter per member at most, not many)
        self._commit()

    def _already_dead_lettered(
        self, msg: Message, key: Key, dlq_topic: str, deadline: float, lock_end: float
    ) -> bool:
        """A record whose dead letter is known to be written (a member died between the
        dead letter's acknowledgement and the ACCEPT, or a stale prefetched record another
        member dead-lettered): ACCEPTed, True. Unknown within half the time left (at most
        2 s): False, the dead letter is written (a duplicate is possible, counted and logged;
        never a loss). After one unknown answer the batch's other records do not wait (the
        lock is the whole batch's)."""
        if self._index is None:
            return False
        # the high watermarks must be read after this batch was returned (the broker had
        # acquired all of it by then; a dead letter of an earlier delivery, another member's
        # included, was acknowledged before that): ends read for an earlier batch's question
        # would miss one acknowledged since, and answer a confident False (review14 F3)
        since = max(self._returned, lock_end - self.lock_duration)
        wait = 0.0 if self._index_gave_up == since else 2.0
        wait = min(wait, max((deadline - time.monotonic()) / 2, 0.0))
        found = self._index.contains(key, wait, since=since, topic=dlq_topic)
        fields = {
            "topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "delivery_count": msg.delivery_count(),
        }
        if found is None:
            self._index_gave_up = since
            self.stats.dead_letters_unconfirmed += 1
            self._log.warning("share_dead_letter_unconfirmed", **fields)
            return False
        if not found:
            return False
        self._marks.pop(self._key(msg), None)
        self._ack(msg, AcknowledgeType.ACCEPT)
        self.stats.dead_letters_found += 1
        self._log.info("share_dead_letter_already_written", **fields)
        self._commit()
        return True

    def _write_dead_letter(
        self, record: DeadLetterRecord, deadline: float, *, retry: bool
    ) -> tuple[DeadLetterError | DeliveryError | None, DeadLetterHandle | None]:
        """Write and flush ``record`` until ``deadline``: (the last failure or None once it
        is acknowledged, the handle of the write in flight or settled). ``retry`` (a record at
        its last delivery): a failed write is written again while time is left, and at least
        one flush of 1 s is made even past the lock (the dead letter is then the record's
        only trace). The outcome is the handle's: a flush's error may list another dead
        letter's failure."""
        assert self._writer is not None
        handle: DeadLetterHandle | None = None
        while True:
            try:
                if handle is None:
                    handle = self._writer.write(record)
                left = deadline - time.monotonic()
                self._writer.flush(max(left, 1.0) if retry else max(left, 0.01))
                return None, handle
            except (DeadLetterError, DeliveryError) as err:
                if handle is not None and handle.done():
                    if handle.exception(0) is None:
                        return None, handle  # acknowledged: the failure was another's
                    handle = None  # failed for good: write it again
                left = deadline - time.monotonic()
                if not retry or left <= 0 or self._closed:
                    return err, handle
                time.sleep(min(0.25, left))

    def _tidy_in_flight(self, now: float) -> None:
        """Serve the dead-letter writer's reports (a dead letter in flight that lands settles
        its handle: health()'s ``dead_letters_in_flight`` goes down), keep only what is needed
        of a landed one (:class:`_Landed`), drop a failed one (the record's next delivery asks
        the index and writes it again) and forget landed ones no delivery can still need."""
        assert self._writer is not None
        self._writer.poll(0)
        horizon = now - self.delivery_count_limit * self.lock_duration
        flights = self._in_flight
        for key, flight in list(flights.items()):
            if isinstance(flight, _Landed):
                if flight.at < horizon:
                    del flights[key]
            elif flight.done():
                if flight.exception(0) is None:
                    flights[key] = _Landed(_Topic(flight.record.topic), now)
                else:
                    del flights[key]

    def _remember(self, key: Key, handle: _Flight) -> None:
        """Keep ``handle`` as the record's dead letter in flight (bounded: settled ones go
        first, then the oldest)."""
        flights = self._in_flight
        if len(flights) >= _IN_FLIGHT_MAX:
            for old in [k for k, h in flights.items() if h.done()]:
                del flights[old]
            while len(flights) >= _IN_FLIGHT_MAX:
                del flights[next(iter(flights))]
        flights[key] = handle

    def _settle_deferred(self) -> None:
        """Settle the batch's poison records whose dead letter was still in flight (see
        ``_settle_in_flight``), once the batch's other records are acknowledged. One whose
        dead letter failed for good meanwhile goes through ``_give_up`` again (written again
        while its lock leaves time or at its last delivery, else left to its lock)."""
        while self._deferred:
            msg, handle, key, exc, classification, count, lock_end = self._deferred.pop(0)
            if not self._settle_in_flight(msg, handle, key, exc, count, lock_end):
                self._give_up(msg, exc, classification, count, lock_end)

    def _settle_in_flight(
        self,
        msg: Message,
        handle: _Flight,
        key: Key,
        exc: BaseException,
        count: int,
        lock_end: float,
    ) -> bool:
        """The record's dead letter written by this member and not acknowledged within the
        lock of the delivery that wrote it (this one, or an earlier one): no second dead
        letter while it may still land. Waits for it (serving the writer) until the broker's
        lock surely ended (the poll's return plus the lock). Acknowledged before the lock's
        end: ACCEPT (counted once, in ``dead_lettered``); after it: reported as a lock
        expiry, kept for the next delivery to this member (ACCEPTed at once). Failed for
        good: False, the caller writes it again. Still in flight at the end: left to the
        broker's lock expiry, never RELEASEd early, counted in ``dead_letters_in_flight``."""
        assert self._writer is not None
        release_at = max(lock_end, self._returned + self.lock_duration)
        while not handle.done():
            left = release_at - time.monotonic()
            if left <= 0 or self._closed:
                break
            self._writer.poll(min(left, 0.1))
        fields = {
            "topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "delivery_count": count,
            "dlq_topic": handle.record.topic,
        }
        if handle.done():
            if handle.exception(0) is not None:
                self._in_flight.pop(key, None)
                return False
            if time.monotonic() >= lock_end:
                # acknowledged after the lock: this member ACCEPTs its next delivery at once
                # (another member's reader finds it); an ACCEPT now could be refused
                self._remember(key, _Landed(_Topic(handle.record.topic), time.monotonic()))
                self._late(msg, ran=True, exc=exc, dead_lettered=True)
                return True
            self._in_flight.pop(key, None)
            self._marks.pop(self._key(msg), None)
            self._ack(msg, AcknowledgeType.ACCEPT)
            self.stats.dead_lettered += 1
            self._log.info("share_dead_letter_acknowledged_late", **fields)
            self._commit()
            return True
        self.stats.dead_letters_in_flight += 1
        if count >= self.delivery_count_limit:
            # the broker archives it at this lock's end whatever is sent: the pending dead
            # letter, if it lands, is its only trace
            err = DeadLetterError(
                f"its dead letter to {handle.record.topic} is still in flight (neither "
                "acknowledged nor failed)",
                topic=handle.record.topic,
            )
            self._dead_letter_failed(msg, err, handle.record.topic, count, True, lock_end)
            return True
        self._log.warning(
            "share_dead_letter_in_flight",
            **fields,
            detail=(
                "the dead letter is neither acknowledged nor failed at the lock's end: the "
                "record was left to the broker's lock expiry (not RELEASEd); this member writes "
                "no second one, another member that gets it before the dead letter lands may"
            ),
        )
        # the broker's lock has ended: refused or a no-op; the client wants every record of
        # the batch acknowledged before the next poll
        self._ack(msg, AcknowledgeType.RELEASE, counted=False)
        return True

    def _dead_letter_failed(
        self,
        msg: Message,
        err: DeadLetterError | DeliveryError,
        dlq_topic: str,
        count: int,
        last: bool,
        lock_end: float,
    ) -> None:
        fields = {
            "topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "delivery_count": count,
            "dlq_topic": dlq_topic,
            "error": self._redact(str(err)),
        }
        if not last:
            # not acknowledged, and below the limit: the record goes back to the group
            self._log.error("share_dead_letter_failed", **fields)
            if time.monotonic() < lock_end:
                self._ack(msg, AcknowledgeType.RELEASE)
            else:
                self._ack(msg, AcknowledgeType.RELEASE, counted=False)
            return
        # at its last delivery no acknowledgement keeps it: RELEASE, REJECT and the lock's
        # expiry all have the broker archive it. Left unacknowledged (the lock's end archives
        # it, unless a dead letter still pending is delivered later), reported, and the member
        # stops once the batch is settled rather than lose more records the same way.
        self.stats.lost_at_limit += 1
        self._probes.running = False  # the member stops: /live 503
        self._log.error("share_record_lost_at_limit", **fields)
        if self._fatal is None:
            where = f"{msg.topic()}[{msg.partition()}]@{msg.offset()}"
            self._fatal = DeadLetterError(
                self._redact(
                    f"share group {self.group}: record {where} is at its last delivery "
                    f"(delivery count {count}, share.delivery.count.limit "
                    f"{self.delivery_count_limit}) and its dead letter to {dlq_topic} was not "
                    f"acknowledged before its lock's end; the broker archives it: {err}"
                ),
                topic=dlq_topic,
                classification=err.classification,
            )
        self._stopping.set()

    def _late(
        self,
        msg: Message,
        *,
        ran: bool,
        exc: BaseException | None = None,
        dead_lettered: bool = False,
    ) -> None:
        """The record's lock expired: the broker released it (archived it, at its last
        delivery), and any ACCEPT now would be refused (INVALID_RECORD_STATE) or, worse,
        taken after another member's; report it (an ERROR when archived, not dead-lettered)."""
        self.stats.lock_expired += 1
        archived = (msg.delivery_count() or 1) >= self.delivery_count_limit
        log = self._log.error if archived and not dead_lettered else self._log.warning
        log(
            "share_lock_expired",
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            delivery_count=msg.delivery_count(),
            handler_ran=ran,
            handler_failed=exc is not None,
            dead_lettered=dead_lettered,
            archived=archived,
            lock_duration_s=self.lock_duration,
        )
        # the client wants every record of the batch acknowledged before the next poll; a
        # RELEASE of an expired record is refused by the broker and changes nothing
        self._ack(msg, AcknowledgeType.RELEASE, counted=False)

    def _due_releases(self, releases: list[tuple[float, Message]], lock_end: float) -> None:
        for due, msg in sorted(releases, key=lambda r: r[0]):
            now = time.monotonic()
            if due > now:
                self._stopping.wait(due - now)
            if time.monotonic() >= lock_end:
                self._late(msg, ran=True)
                continue
            self._ack(msg, AcknowledgeType.RELEASE)
            self.stats.released += 1
        if self._detector.active and self._outage_policy is not None:
            # stop fetching for a while: every fetch during an outage spends a delivery
            self._stopping.wait(min(float(self._outage_policy.wait(self._outage_wait())), 10.0))

    def _outage_wait(self) -> tenacity.RetryCallState:
        assert self._outage_policy is not None
        state = tenacity.RetryCallState(self._outage_policy.retrying(), None, (), {})
        state.attempt_number = max(self._detector.failures, 1)
        return state

    def _ack(self, msg: Message, kind: AcknowledgeType, *, counted: bool = True) -> None:
        try:
            self._consumer.acknowledge(msg, kind)
        except KafkaException as exc:
            if counted:
                self.stats.ack_errors += 1
            self._log.warning(
                "share_acknowledge_failed",
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                ack=kind.name,
                error=self._redact(str(exc)),
            )

    def _on_acknowledged(
        self, offsets: dict[TopicPartition, set[int]], error: KafkaException | None
    ) -> None:
        """Acknowledgement commits' results (``commit_async``), on the polling thread."""
        if error is None:
            return
        self.stats.ack_errors += 1
        # INVALID_RECORD_STATE: the lock had expired; the records are delivered again
        self._log.warning(
            "share_acknowledgement_refused",
            partitions=sorted(f"{tp.topic}[{tp.partition}]" for tp in offsets),
            records=sum(len(v) for v in offsets.values()),
            error=self._redact(str(error)),
        )

    def _commit(self) -> None:
        try:
            results = self._consumer.commit_sync(30)
        except KafkaException as exc:
            self.stats.ack_errors += 1
            self._log.warning("share_commit_failed", error=self._redact(str(exc)))
            return
        for tp, err in results.items():
            if err is None:
                continue
            self.stats.ack_errors += 1
            # INVALID_RECORD_STATE: the lock had expired; the records are delivered again
            self._log.warning(
                "share_acknowledgement_refused",
                topic=tp.topic,
                partition=tp.partition,
                error=self._redact(str(err)),
            )


def _stopped(msg: Message, limit: int) -> _Stop:
    return _Stop(
        f"the share consumer stopped holding the record at its last delivery (delivery count "
        f"{msg.delivery_count()}, share.delivery.count.limit {limit}): a RELEASE would have "
        "the broker archive it"
    )


def _margin(lock_duration: float) -> float:
    """Time kept before a lock ends for the RELEASE to reach the broker."""
    return min(max(lock_duration * 0.1, 0.2), 2.0)


def _failed_future(exc: BaseException, attempt: int) -> tenacity.Future:
    fut = tenacity.Future(attempt)
    fut.set_exception(exc)
    return fut


class _ShareProbeSource:
    """A :class:`ResilientShareConsumer`'s state as the probes' ``ProbeSource``: the handler
    in hand and, during an outage, the partitions of the batch held. A share group has no
    stored offsets and no retry waits beyond the batch's lock."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: ResilientShareConsumer) -> None:
        self._consumer = consumer

    def stored_offsets(self) -> Mapping[tuple[str, int], int]:
        return {}

    def handlers(self) -> list[tuple[float, Collection[str]]]:
        """The handler call in hand, on its record's partition (not the batch's: the other
        records wait, and an outage hold between calls is reported as an outage)."""
        consumer = self._consumer
        started = consumer._record_started
        msg = consumer._in_hand  # written before started: the record of that call, or later
        if not started or msg is None:
            return []
        return [(started, (f"{msg.topic()}[{msg.partition()}]",))]

    def retry_waits(self) -> list[tuple[tuple[str, int], int, float]]:
        return []

    def held(self) -> Collection[tuple[str, int]]:
        consumer = self._consumer
        if not consumer._detector.active:
            return ()
        return {(m.topic() or "", m.partition() or 0) for m in consumer._acquired}

    def duplicates(self) -> int:
        return 0
