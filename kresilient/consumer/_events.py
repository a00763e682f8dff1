"""Client callbacks of :class:`~kresilient.ResilientConsumer`: commits, errors, rebalances, logs.

librdkafka calls these from inside ``consume()`` (so from the consumer's own thread, between
batches). A user's ``error_cb``/``stats_cb``/``on_commit``/``logger`` and rebalance listeners
are called after kresilient's own handling. Every text taken from librdkafka goes through the
consumer's :class:`~kresilient.redaction.Redactor` before it is logged or raised; librdkafka's
own log lines go through the log bridge (never raw to stderr), connection failures are
summarised by host (``kafka_unreachable``), other errors rate-limited.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from confluent_kafka import KafkaError, Message, TopicPartition

from kresilient._ratelimit import RateLimiter
from kresilient.errors import ConsumeError, KResilientError, classify, translate

if TYPE_CHECKING:
    from kresilient.consumer._crashloop import CrashGuard
    from kresilient.consumer._failures import DeadLetterSink
    from kresilient.consumer._holds import Holds, LoopState
    from kresilient.consumer._offsets import OffsetKeeper
    from kresilient.consumer._probes import Probes
    from kresilient.leadership import LeadershipMonitor
    from kresilient.reachability import Reachability
    from kresilient.telemetry import Telemetry

__all__ = ["ClientEvents"]

_PARTITION_EOF: Final = KafkaError._PARTITION_EOF
#: error_cb codes that are connection failures: summarised per host by Reachability.
_CONNECT_CODES: Final = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
#: error_cb codes that say the cluster refused the credentials or the certificate.
_REFUSAL_CODES: Final = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})
#: Consume errors that end this client whatever ``err.fatal()`` says: a static member whose
#: ``group.instance.id`` another member took is fenced for good, and librdkafka (2.16) says
#: so with a consume error ``_FATAL`` ("Static consumer fenced by other consumer with same
#: group.instance.id") that is not flagged fatal; polling on would hold no partition, forever.
FATAL_CONSUME_CODES: Final = frozenset({KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID})

Listener = Callable[[list[TopicPartition]], object]


class ClientEvents:
    """librdkafka callbacks of one consumer (explicit collaborators, no shared host class).

    Reads/writes of the shared :class:`LoopState`: ``interrupt`` (a fatal error stops the
    loop), ``rebalances`` and ``revocations`` (counted). ``fatal`` holds the translated fatal
    error the loop raises.
    """

    def __init__(
        self,
        *,
        state: LoopState,
        holds: Holds,
        offsets: OffsetKeeper,
        monitor: LeadershipMonitor,
        tel: Telemetry,
        log: Any,
        redact: Callable[[str], str],
        reachability: Reachability,
        limiter: RateLimiter,
        user_callbacks: dict[str, Callable[..., Any] | None],
        listeners: dict[str, Listener | None],
        shutdown_timeout: float,
    ) -> None:
        self.state = state
        self.holds = holds
        self.offsets = offsets
        self.monitor = monitor
        self.tel = tel
        self.log = log
        self.redact = redact
        self.reach = reachability
        self.limiter = limiter
        self.user_cb = user_callbacks
        self.listeners = listeners
        self.shutdown_timeout = shutdown_timeout
        self.fatal: KResilientError | None = None
        #: set once the consumer made its dead-letter client (revoke waits for its writes)
        self.sink: DeadLetterSink | None = None
        #: the last connection failure librdkafka reported (redacted), for error messages
        self.last_connect_error: str | None = None
        #: crash-loop protection (reads the committed markers of assigned partitions)
        self.crash: CrashGuard | None = None
        #: the probes' per-partition figures (set by the consumer)
        self.probes: Probes | None = None

    # ------------------------------------------------------------------ callbacks

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self.offsets.on_commit(err, partitions)
        user = self.user_cb["on_commit"]
        if user is not None:
            user(err, partitions)

    def on_error(self, err: KafkaError) -> None:
        self.monitor.on_error(err)
        c = classify(err)
        code = err.code()
        refused: ConsumeError | None = None
        if err.fatal():
            self.fatal = translate(err, operation="consume", redactor=self.redact)
            self.state.interrupt = True
            self.tel.fatal_error(self.fatal, c)
        else:
            text = self.redact(err.str())
            if code in _REFUSAL_CODES:
                self.reach.refusal(text, code)
            if code == KafkaError._ALL_BROKERS_DOWN:
                self.reach.all_down(text)
            elif code in _CONNECT_CODES and self.reach.broker_failed(text):
                self.last_connect_error = text  # summarised: one line per host, slowly
            else:
                allowed, suppressed = self.limiter.check(("error", code))
                if allowed:
                    self.log.warning(
                        "kafka_error",
                        error=c.name,
                        category=c.category.value,
                        detail=text,
                        suppressed=suppressed or None,
                    )
            refused = self._refused()  # after Reachability saw the text (a TLS _TRANSPORT)
        user = self.user_cb["error_cb"]
        if user is not None:
            user(err)
        if refused is not None:
            # Raised out of poll()/consume(): the start-up metadata wait and the loop both end
            # here, naming the cause, instead of "no broker reachable" (or silence) later.
            raise refused

    def _refused(self) -> ConsumeError | None:
        """A ConsumeError naming the refusal, once, if no broker ever accepted this client.

        librdkafka keeps reconnecting after a refused SASL login or TLS handshake, and the
        consumer would wait in vain (its start-up check ends with "no broker reachable", its
        loop sees nothing at all). Like the Java client, a refusal is not retried: the first
        one a broker gives while no connection ever worked stops the consumer. A consumer that
        worked before (its password rotated under it) keeps reconnecting and logs the refusal
        instead.
        """
        # The one rule (Reachability.final_refusal): a broker refused, no connection ever
        # worked; a refusal without a broker (an OAUTHBEARER token not acquired: the identity
        # provider may be down) is left to librdkafka's retries.
        failure = self.reach.final_refusal()
        if failure is None or self.fatal is not None:
            return None
        if self.state.stop_requested:  # stopping anyway: not raised out of the shutdown
            return None
        error = ConsumeError(
            "no broker accepted this consumer's credentials or certificate",
            code=failure.code,
            classification=failure.classification(),
        )
        self.fatal = error
        self.state.interrupt = True
        self.log.error(
            "kafka_authentication_failed",
            **failure.log_fields(),
        )
        return error

    def on_stats(self, stats_json: str) -> None:
        # Parsed once, by the monitor, which hands back the document for the broker states.
        doc = self.monitor.on_stats(stats_json)
        if doc is not None:
            self.reach.on_stats(doc)
        user = self.user_cb["stats_cb"]
        if user is not None:
            user(stats_json)

    def consume_error(self, msg: Message) -> None:
        """An error event among the consumed messages (raises if it is fatal)."""
        err = msg.error()
        assert err is not None
        if err.code() == _PARTITION_EOF:
            return
        self.monitor.on_error(err, msg.topic(), msg.partition())
        if err.fatal() or err.code() in FATAL_CONSUME_CODES:
            raise translate(
                err,
                topic=msg.topic(),
                partition=msg.partition(),
                operation="consume",
                redactor=self.redact,
            )
        c = classify(err)
        allowed, suppressed = self.limiter.check(("consume", err.code()))
        if allowed:
            self.log.warning(
                "consume_error",
                topic=msg.topic(),
                partition=msg.partition(),
                error=c.name,
                category=c.category.value,
                detail=self.redact(err.str()),
                remedy=c.remedy,
                suppressed=suppressed or None,
            )

    def on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.reach.connected()  # the group coordinator answered: the login works
        self.state.rebalances["assigned"] += 1
        # librdkafka keeps an application pause across unassign/assign: make sure a newly
        # assigned partition is not left paused by a resume that was missed (issue 11, 2)
        self.holds.resume_unheld(partitions)
        if self.crash is not None:
            self.crash.on_assign(partitions)
        if self.probes is not None:
            self.probes.on_assign(partitions)
        self.log.debug("partitions_assigned", partitions=_names(partitions))
        listener = self.listeners["assign"]
        if listener is not None:
            listener(partitions)

    def on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.state.rebalances["revoked"] += 1
        self.state.revocations += 1
        revoked = {(p.topic, p.partition) for p in partitions}
        sink = self.sink
        if sink is not None and self.offsets.pending:
            try:  # their offsets must not be committed past an unacknowledged dead letter
                self.offsets.wait(sink, revoked, self.shutdown_timeout)
            except Exception as exc:  # never let a callback break consume()
                self.log.warning("dead_letter_wait_failed", error=self.redact(repr(exc)))
        self.holds.release([tp for tp in self.holds.by_tp if tp in revoked])
        self.offsets.commit_sync("revoke")
        if self.crash is not None:  # those never committed here: back to clean
            stored = self.offsets.stored
            self.crash.clean_end(revoked, lambda tp: tp in stored)
        self.offsets.forget_stored(revoked)
        if self.crash is not None:
            self.crash.forget(list(revoked))
        if self.probes is not None:
            self.probes.forget(revoked)
        self.log.debug("partitions_revoked", partitions=_names(partitions))
        listener = self.listeners["revoke"]
        if listener is not None:
            listener(partitions)

    def on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        self.state.rebalances["lost"] += 1
        self.state.revocations += 1
        lost = [(p.topic, p.partition) for p in partitions]
        self.holds.release(lost)  # resumed: the pause would outlive the loss (issue 11, 2)
        self.offsets.drop(lost)
        if self.crash is not None:
            self.crash.forget(lost)
        if self.probes is not None:
            self.probes.on_lost(lost)
        self.log.warning(
            "partitions_lost",
            partitions=_names(partitions),
            note="not committed: their new owner starts from the last commit",
        )
        listener = self.listeners["lost"]
        if listener is not None:
            listener(partitions)


def _names(partitions: list[TopicPartition]) -> list[str]:
    return [f"{p.topic}[{p.partition}]" for p in partitions]
