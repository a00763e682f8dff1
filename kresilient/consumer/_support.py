"""Helpers of :mod:`kresilient.consumer` that are not on the per-message path.

Configuration of the consumer, the retry policy, the
deserializing call wrapper, the poll-interval watchdog and signal handling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final

import tenacity
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.error import KeyDeserializationError, ValueDeserializationError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from kresilient import _catalog as catalog
from kresilient._watchdog import bounded_call
from kresilient.config import consumer_config
from kresilient.errors import BatchItemError, UnsafeConfigError

__all__ = [
    "HEAL_TIMEOUT",
    "NOT_RETRIED",
    "BatchItemError",
    "RetryPolicy",
    "retire_client",
]

#: Exceptions the default :class:`RetryPolicy` sends to the dead-letter topic at once:
#: deserialization and validation errors (retrying cannot fix the record). ``ValueError``
#: covers ``json.JSONDecodeError``, ``UnicodeDecodeError`` and pydantic's ``ValidationError``.
NOT_RETRIED: Final[tuple[type[BaseException], ...]] = (SerializationError, ValueError, TypeError)


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a failing message is retried before it is dead-lettered (tenacity objects).

    While a message waits for its next attempt its partition is paused and the consumer keeps
    polling, so waits longer than ``max.poll.interval.ms`` cause no rebalance. The defaults
    try 5 times, 0.2 s, 0.4 s, 0.8 s, 1.6 s apart, and do not retry :data:`NOT_RETRIED`.

    Args:
        stop: a tenacity stop (``stop_after_attempt(5)``, ``stop_after_delay(600)``,
            ``stop_never`` ...).
        wait: a tenacity wait (``wait_exponential(multiplier=0.2, max=30)`` ...).
        retry: a tenacity retry predicate deciding which exceptions are retried at all
            (compose with ``|``/``&``; :mod:`kresilient.retry` has classification-based ones).

    Example::

        RetryPolicy(stop=stop_after_delay(300), wait=wait_exponential_jitter(max=10),
                    retry=retry_if_exception_type(TimeoutError))
    """

    stop: stop_base = dataclasses.field(default_factory=lambda: tenacity.stop_after_attempt(5))
    wait: wait_base = dataclasses.field(
        default_factory=lambda: tenacity.wait_exponential(multiplier=0.2, max=30)
    )
    retry: retry_base = dataclasses.field(
        default_factory=lambda: tenacity.retry_if_not_exception_type(NOT_RETRIED)
    )

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def retrying(self) -> tenacity.Retrying:
        """A tenacity ``Retrying`` carrying this policy (its retry-state owner)."""
        return tenacity.Retrying(stop=self.stop, wait=self.wait, retry=self.retry)


# --------------------------------------------------------------------------- config


def build_consumer_config(
    user: Mapping[str, Any], allow_unsafe: Iterable[str], logger: Any
) -> dict[str, Any]:
    """Validated librdkafka config; refuses what ResilientConsumer cannot keep safe."""
    allow = tuple([allow_unsafe] if isinstance(allow_unsafe, str) else allow_unsafe)
    cfg = consumer_config(user, allow_unsafe=allow, logger=logger)
    for key, value in cfg.items():
        prop = catalog.lookup(key)
        if (
            prop is not None
            and prop.canonical == "enable.auto.offset.store"
            and (str(value).lower() in ("true", "1"))
        ):
            raise UnsafeConfigError(
                "enable.auto.offset.store=true stores each offset when the message is handed "
                "to the application, before it is processed; ResilientConsumer stores offsets "
                "itself after processing and cannot run with it (remove the key)",
                key=key,
                value=value,
            )
    return cfg


def auto_commit(cfg: Mapping[str, Any]) -> tuple[bool, float]:
    """(background auto-commit on?, commit interval in seconds)."""
    on = str(cfg.get("enable.auto.commit", "true")).lower() in ("true", "1")
    interval = float(cfg.get("auto.commit.interval.ms", 5000)) / 1000.0
    return on, interval


def max_poll_interval(cfg: Mapping[str, Any]) -> float:
    """``max.poll.interval.ms`` in seconds."""
    return float(cfg.get("max.poll.interval.ms", 300000)) / 1000.0


def literal_topics(topics: Iterable[str]) -> list[str]:
    """Subscribed topic names that are not regular expressions."""
    return [t for t in topics if not t.startswith("^")]


# --------------------------------------------------------------------------- deserializers

Deserializer = Callable[[bytes | None, SerializationContext], Any]


class Deserializing:
    """Wrap a handler: deserialize key/value in place, remember the raw bytes.

    ``raw`` holds ``(message, raw_key, raw_value)`` of the last message handed to the handler,
    so a failure can dead-letter the original bytes.
    """

    __slots__ = ("handler", "key", "raw", "raws", "value")

    def __init__(
        self,
        handler: Callable[[Any], object],
        key: Deserializer | None,
        value: Deserializer | None,
    ) -> None:
        self.handler = handler
        self.key = key
        self.value = value
        self.raw: tuple[Any, bytes | None, bytes | None] | None = None
        self.raws: list[tuple[Any, bytes | None, bytes | None]] = []

    def deserialize(self, msg: Any) -> None:
        """Replace the message's key/value by their deserialized forms (raises on failure)."""
        raw_key, raw_value = msg.key(), msg.value()
        self.raw = (msg, raw_key, raw_value)
        topic, headers = msg.topic(), msg.headers()
        if self.key is not None:
            try:
                ctx = SerializationContext(topic, MessageField.KEY, headers)
                msg.set_key(self.key(raw_key, ctx))
            except SerializationError:
                raise
            except Exception as exc:
                raise KeyDeserializationError(exception=exc) from exc
        if self.value is not None:
            try:
                msg.set_value(
                    self.value(raw_value, SerializationContext(topic, MessageField.VALUE, headers))
                )
            except SerializationError:
                raise
            except Exception as exc:
                raise ValueDeserializationError(exception=exc) from exc

    def __call__(self, msg: Any) -> None:
        self.deserialize(msg)
        self.handler(msg)

    def call_batch(self, msgs: list[Any]) -> None:
        """Batch variant: deserialize all, then call the batch handler."""
        raws: list[tuple[Any, bytes | None, bytes | None]] = []
        self.raws = raws
        for i, msg in enumerate(msgs):
            try:
                self.deserialize(msg)
            except Exception as exc:
                if i:  # the items before the bad one are handled first
                    self.handler(msgs[:i])
                raise BatchItemError(index=i, cause=exc) from exc
            assert self.raw is not None
            raws.append(self.raw)
        self.handler(msgs)

    def raw_bytes(self, msg: Any) -> tuple[bytes | None, bytes | None] | None:
        """The original key/value of ``msg`` if it was deserialized, else ``None``."""
        raw = self.raw
        if raw is not None and raw[0] is msg:
            return raw[1], raw[2]
        for item in self.raws:
            if item[0] is msg:
                return item[1], item[2]
        return None


# --------------------------------------------------------------------------- watchdog, signals


class Watchdog:
    """Flags a batch that runs for longer than ``budget`` seconds (checked every ``tick``).

    The consumer then stops handing out the rest of the batch, seeks the unprocessed messages
    back and polls again, so a slow handler over a large internal batch does not exceed
    ``max.poll.interval.ms``.
    """

    def __init__(self, budget: float, on_overrun: Callable[[], None]) -> None:
        self.budget = budget
        self.started = 0.0  # monotonic start of the batch in progress (0: none)
        self._on_overrun = on_overrun
        self._tick = max(0.05, min(1.0, budget / 4))
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kresilient-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self._tick):
            started = self.started
            if started and time.monotonic() - started > self.budget:
                self.started = 0.0
                self._on_overrun()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


class SignalHandlers:
    """Route SIGTERM/SIGINT to ``stop()`` while ``run()`` runs (main thread only).

    1st signal: graceful stop (the message in hand is finished). 2nd, while the loop still
    runs: ``KeyboardInterrupt`` (the handler in hand is abandoned, not committed). During the
    shutdown (await dead-letter acknowledgements, final commit, close) a 2nd signal is only
    logged, so what was processed is still committed; a 3rd aborts the shutdown with
    ``KeyboardInterrupt`` and says so in the log (issue 11, 6).
    """

    def __init__(self, stop: Callable[[], None], stopping: Callable[[], bool], log: Any) -> None:
        self._stop = stop
        self._stopping = stopping
        self._log = log
        self._previous: dict[int, Any] = {}
        self._count = 0
        #: set by the consumer when its shutdown steps begin
        self.shutting_down = False
        #: a 2nd signal interrupted the handler in hand / a 3rd aborted the shutdown. The
        #: handler runs between two bytecodes wherever the main thread is, and the code its
        #: ``KeyboardInterrupt`` lands in can turn it into another exception (inside a lock's
        #: release: ``RuntimeError('release unlocked lock')``, seen in CI) or swallow it: the
        #: consumer reads these flags so an interruption is never taken for a failure.
        self.interrupted = False
        self.aborted = False

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self._count += 1
        if not self._stopping():
            self._stop()
        elif not self.shutting_down:
            self.interrupted = True
            raise KeyboardInterrupt
        elif self._count < 3:
            self._log_later(
                "warning",
                "shutdown_signal_received",
                signal=signal.Signals(signum).name,
                note="committing what was processed, then closing; one more signal aborts "
                "without the final commit",
            )
        else:
            self._log_later(
                "error",
                "shutdown_aborted",
                signal=signal.Signals(signum).name,
                note="third signal: the final commit and close are skipped; messages processed "
                "since the last commit will be consumed again",
            )
            self.aborted = True
            raise KeyboardInterrupt

    def _log_later(self, method: str, event: str, **fields: Any) -> None:
        """Log from a short-lived thread, never from the handler itself.

        A handler runs on the main thread between two bytecodes, possibly inside a log call
        that holds the logger's (non-reentrant) write lock, e.g. structlog's PrintLogger: a
        handler logging there waited for itself forever. The thread writes the line as soon
        as the interrupted call has let go of the lock (non-daemon: it is written before exit).
        """
        threading.Thread(
            target=getattr(self._log, method),
            args=(event,),
            kwargs=fields,
            name="kresilient-signal-log",
        ).start()

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):  # no longer the main thread
                signal.signal(sig, previous)
        self._previous.clear()


#: How long a heal (``on_stall="heal"``) waits for the replaced librdkafka consumer to commit
#: and close (seconds): past it the close goes on in a daemon thread and the new member starts.
HEAL_TIMEOUT: Final = 5.0


def retire_client(
    old: Any,
    offsets: Mapping[tuple[str, int], int],
    *,
    marker: str | None,
    redact: Callable[[str], str],
    log: Any,
    metadata: Mapping[tuple[str, int], str | None] | None = None,
    cause: str,
    reason: str,
    partitions: Iterable[tuple[str, int]],
    timeout: float = HEAL_TIMEOUT,
) -> dict[str, Any]:
    """A heal's end of the replaced librdkafka consumer (both consumers): commit
    ``offsets`` (the next record to handle per partition, with the crash-loop clean
    ``marker`` if any; ``metadata`` per partition instead, where given) through it, then
    close it, in a daemon thread waited for at most
    ``timeout`` (a hung connection can hold both forever: ``bounded_call``); then the one
    ``consumer_recreated`` WARNING of the heal (``cause``, the stall's ``reason``, the old
    member's ``partitions``, the outcome).

    Returns ``committed`` (the commit returned without a partition error; ``True`` when there
    was nothing to commit), ``closed``, and ``commit_error``/``close_error`` (redacted). What
    was not committed is handled again by the new member (at least once); a commit that
    lands after the new member joined is refused (its generation is over).
    """
    parts = []
    for (t, p), offset in offsets.items():
        meta = metadata.get((t, p), marker) if metadata is not None else marker
        parts.append(
            TopicPartition(t, p, offset)
            if meta is None
            else TopicPartition(t, p, offset, metadata=meta)
        )
    outcome: dict[str, Any] = {"committed": not parts, "closed": False}

    def retire() -> None:
        if parts:
            # stored with their metadata first: librdkafka's own commit at close would
            # otherwise commit its stored offsets again with their (empty) metadata, erasing
            # the clean-end marker (the new member then probed every partition)
            with contextlib.suppress(KafkaException, RuntimeError):
                old.store_offsets(offsets=parts)
            try:
                result = old.commit(offsets=parts, asynchronous=False)
                outcome["committed"] = not [p for p in result or [] if p.error is not None]
            except (KafkaException, RuntimeError) as exc:
                outcome["commit_error"] = redact(str(exc))
        try:
            old.close()
            outcome["closed"] = True
        except (KafkaException, RuntimeError) as exc:
            outcome["close_error"] = redact(str(exc))

    bounded_call(retire, timeout, name="kresilient-consumer-heal")
    outcome = dict(outcome)  # a late end of the thread no longer changes what is said
    log.warning(
        "consumer_recreated",
        cause=cause,
        reason=reason,
        partitions=sorted(f"{t}[{p}]" for t, p in partitions),
        committed=outcome["committed"],
        commit_error=outcome.get("commit_error"),
        old_closed=outcome["closed"],
        heal_timeout_s=timeout,
        note=(
            "a new member of the group, resuming from the committed offsets: records handled "
            "and not committed are handled again (at least once)"
            + ("" if outcome["closed"] else "; the old client closes in the background")
        ),
    )
    return outcome
