"""``AsyncResilientConsumer(transactions=)``: exactly once with an ``async def`` handler.

The transactional engine is not written twice: a :class:`~kresilient.ResilientConsumer`
built with ``transactions=`` (:class:`~kresilient.consumer.TransactionalBatches`) runs its
loop in ONE worker thread; its handler is a bridge that submits the user's coroutine to the
caller's event loop (``asyncio.run_coroutine_threadsafe``) and waits for it. The handler's
result (its :class:`~kresilient.Output` records) or its exception reaches the sync engine as
if a plain function had returned or raised, so retries, dead letters in the transaction,
outage holds, redo, bisection and fencing behave exactly as in the sync consumer.

A handler whose record must NOT be committed (cut by the shutdown after ``shutdown_timeout``,
cancelled, interrupted by a second signal, its event loop closed or not running for longer
than ``shutdown_timeout``) reaches the engine as :class:`_HandlerCut`, a ``BaseException``:
never a record failure (an ``Exception`` would be retried and, once the policy gave up,
dead-lettered and committed), but the end of the loop: the open transaction is aborted with
everything in it, and its records are redone by the next owner of their partitions. Every
exception the handler raises itself (``TimeoutError`` and ``concurrent.futures.CancelledError``
included) is its record's failure; only its task ending cancelled is a cut.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final

import structlog
from confluent_kafka import Message

from kresilient.aio._signals import install_loop_signals, restore_loop_signals
from kresilient.consumer import ConsumerHealth, ResilientConsumer, TransactionPolicy
from kresilient.errors import ConfigError

__all__ = ["TransactionalRunner"]

AsyncHandler = Callable[[Message], Awaitable[object]]
#: How often the bridge's wait looks at the loop (closed? stopped?) and at a shutdown.
_WAIT_SLICE_S: Final = 0.1
#: consume() timeout of the sync loop when idle: the stop latency between records.
_POLL_TIMEOUT_S: Final = 0.25


class _HandlerCut(BaseException):
    """The handler in hand was cut short: its record is not committed (see the module)."""


class _Failed:
    """The exception the handler raised, carried to the bridge as a value (unconverted)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class TransactionalRunner:
    """The sync transactional engine driven for :class:`AsyncResilientConsumer`.

    ``consumer`` is the :class:`~kresilient.ResilientConsumer` (its ``health()``, probes and
    ``health().transactions`` are the async consumer's). Arguments are the async consumer's;
    those the transactional mode cannot honour are refused with a
    :class:`~kresilient.ConfigError` naming them.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Iterable[str],
        handler: AsyncHandler,
        *,
        transactions: TransactionPolicy,
        handler_name: str,
        max_concurrency: int,
        ordering: str,
        dead_letter_producer: object,
        dead_letter_producer_config: Mapping[str, Any] | None,
        blocking_warning_s: float | None,
        shutdown_timeout: float,
        handle_signals: bool,
        logger: Any,
        max_process_deaths: int | None,
        crash_probe_records: int,
        **passed: Any,
    ) -> None:
        _refuse(
            transactions,
            max_concurrency=max_concurrency,
            ordering=ordering,
            dead_letter_producer=dead_letter_producer,
            dead_letter_producer_config=dead_letter_producer_config,
        )
        if max_process_deaths is not None and max_process_deaths < 1:
            raise ConfigError(
                f"max_process_deaths must be None (off) or >= 1, not {max_process_deaths!r}",
                key="max_process_deaths",
            )
        if crash_probe_records < 1:
            raise ConfigError(
                f"crash_probe_records must be >= 1, not {crash_probe_records!r}",
                key="crash_probe_records",
            )
        self._handler = handler
        self._handler_name = handler_name
        self._shutdown_timeout = float(shutdown_timeout)
        self._handle_signals = handle_signals
        self._threshold = blocking_warning_s
        self.consumer = ResilientConsumer(
            config,
            topics,
            self._bridge,
            transactions=transactions,
            ordering="partition",
            install_signal_handlers=False,  # a worker thread: the loop's handlers are ours
            shutdown_timeout=shutdown_timeout,
            poll_timeout=_POLL_TIMEOUT_S,
            logger=logger,
            # crash-loop protection: the sync engine's, in transactions mode too
            max_process_deaths=max_process_deaths,
            crash_probe_records=crash_probe_records,
            **passed,
        )
        base_log = logger if logger is not None else structlog.get_logger("kresilient.aio")
        self._log = base_log.bind(
            client_id=self.consumer.client_id,
            group=self.consumer.group_id,
            kafka_role="consumer",
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._cut = threading.Event()  # set: the handler in hand is cut now
        self._cut_why = ""
        self._inhand: concurrent.futures.Future[object] | None = None
        self._inhand_msg: Message | None = None
        self._ran = False
        self._signals_received = 0
        self._interrupted = False  # a 2nd signal cut the handler in hand
        self._previous_signals: dict[signal.Signals, Any] = {}
        self.blocked_warnings = 0
        self._beat: asyncio.TimerHandle | None = None
        self._beat_due = 0.0
        self._beat_at = 0.0  # loop.time() of the last heartbeat
        self._handler_started = 0.0  # loop.time() at the start of the handler in hand
        #: monotonic start of the last pause of the loop the bridge saw (a handler in hand)
        self._loop_idle_since: float | None = None

    # ------------------------------------------------------------------ the worker thread

    def _bridge(self, msg: Message) -> object:
        """The sync engine's handler: the coroutine on the loop, its outcome here."""
        loop = self._loop
        if loop is None or self._cut.is_set():
            raise _HandlerCut(self._cut_why or "the consumer is stopping")
        call = self._call(msg)
        try:
            future = asyncio.run_coroutine_threadsafe(call, loop)
        except RuntimeError as exc:  # the loop is closed
            call.close()  # never started: no "never awaited" warning
            raise _HandlerCut(f"the event loop is closed: {exc}") from None
        self._inhand, self._inhand_msg = future, msg
        deadline: float | None = None
        idle_since: float | None = None  # monotonic time the loop was first seen not running
        try:
            while True:
                # wait for doneness, then read the outcome: the handler's own TimeoutError
                # (asyncio.wait_for, asyncio.timeout: the built-in TimeoutError on 3.11, as
                # concurrent.futures.TimeoutError is) is its record's failure, never this
                # wait's "not done yet" (taken for it, the bridge spun forever)
                if concurrent.futures.wait((future,), timeout=_WAIT_SLICE_S)[0]:
                    if future.cancelled():
                        # its task cancelled (a cut, asyncio.run() ending, or the handler
                        # letting an asyncio.CancelledError out): as a record failure it
                        # would be retried, then dead-lettered and committed
                        raise _HandlerCut(self._cut_why or "the handler was cancelled")
                    outcome = future.result()
                    if isinstance(outcome, _Failed):
                        raise outcome.error  # the handler's own, unchanged
                    return outcome
                now = time.monotonic()
                if loop.is_running():
                    idle_since = None
                elif idle_since is None:
                    idle_since = self._loop_idle_since = now
                if loop.is_closed():
                    why = "the event loop is closed with the handler in hand"
                    if inspect.getcoroutinestate(call) == inspect.CORO_CREATED:
                        call.close()  # submitted, never started: no "never awaited" warning
                elif idle_since is not None and now - idle_since > self._shutdown_timeout:
                    # a loop driven in phases (run_until_complete twice) pauses for a while:
                    # only a loop not running for longer than shutdown_timeout has ended
                    why = (
                        f"the event loop has not run for longer than shutdown_timeout="
                        f"{self._shutdown_timeout:g} s with the handler in hand"
                    )
                elif self._cut.is_set():
                    why = self._cut_why
                elif self._stopping.is_set():
                    if deadline is None:
                        deadline = now + self._shutdown_timeout
                    if now < deadline:
                        continue
                    why = (
                        f"the handler did not finish within shutdown_timeout="
                        f"{self._shutdown_timeout:g} s of the stop"
                    )
                else:
                    continue
                future.cancel()
                self._log.warning(
                    "handler_cut",
                    handler=self._handler_name,
                    topic=msg.topic(),
                    partition=msg.partition(),
                    offset=msg.offset(),
                    reason=why,
                    note="the open transaction is aborted: its records are not committed and "
                    "are handled again by the next owner of their partitions",
                )
                raise _HandlerCut(why)
        finally:
            self._inhand = self._inhand_msg = None

    async def _call(self, msg: Message) -> object:
        loop = asyncio.get_running_loop()
        start = self._handler_started = loop.time()
        cut = False
        try:
            return await self._handler(msg)
        except (asyncio.CancelledError, GeneratorExit):
            cut = True  # cancelled, or closed with its loop: it held nothing
            raise
        except Exception as exc:
            # boxed: the future chained to the bridge would convert a handler's own
            # concurrent.futures.CancelledError (an Exception: the record's failure) into
            # asyncio.CancelledError, a BaseException that ends the consumer
            return _Failed(exc)
        finally:
            self._handler_started = 0.0
            if self._threshold is not None and not cut:
                # the loop was held since the last heartbeat (or the handler's start): by
                # the handler's last step, which returned without awaiting
                held = loop.time() - max(self._beat_at, start)
                if held > self._threshold:
                    self._blocked(msg, held)

    # ------------------------------------------------------------------ the event loop

    def stop(self) -> None:
        """Stop after the handler in hand (cut past ``shutdown_timeout``): what was handled
        commits in the open transaction. Safe from any thread, from a handler too."""
        self._stopping.set()
        self.consumer.stop()

    def _cut_now(self, why: str) -> None:
        self._cut_why = why
        self._cut.set()
        self.stop()

    async def run(self) -> None:
        """As :meth:`AsyncResilientConsumer.run`; the sync loop runs in a worker thread."""
        if self._ran:
            raise RuntimeError("run() can be called once per AsyncResilientConsumer")
        self._ran = True
        loop = self._loop = asyncio.get_running_loop()
        done: asyncio.Future[BaseException | None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if not done.done():
                done.set_result(error)

        def target() -> None:
            error: BaseException | None = None
            try:
                self.consumer.run()
            except BaseException as exc:  # handed to run() on the loop
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody awaits
                loop.call_soon_threadsafe(settle, error)

        signals = self._install_signals(loop)
        if self._threshold is not None:
            self._beat_due = loop.time()
            self._heartbeat()
        threading.Thread(target=target, name="kresilient-aio-transactions", daemon=True).start()
        cancelled: asyncio.CancelledError | None = None
        try:
            while True:
                try:
                    error = await asyncio.shield(done)
                    break
                except asyncio.CancelledError as exc:
                    # the shutdown runs on (the handler in hand gets shutdown_timeout); a
                    # second cancellation cuts it at once
                    if cancelled is not None:
                        self._cut_now("run() was cancelled again during the shutdown")
                    cancelled = exc
                    self.stop()
        finally:
            self._restore_signals(loop, signals)
            if self._beat is not None:
                self._beat.cancel()
        if cancelled is not None:
            raise cancelled
        if self._interrupted:
            raise KeyboardInterrupt
        if isinstance(error, _HandlerCut):
            if self._stopping.is_set():
                return  # stop(): the record cut is read again, as documented
            # the handler's task was cancelled by something else than this consumer
            raise asyncio.CancelledError(str(error))
        if error is not None:
            raise error

    def health(self) -> ConsumerHealth:
        return self.consumer.health()

    # ------------------------------------------------------------------ blocking warning

    def _heartbeat(self) -> None:
        """A handler that holds the event loop (never awaits) longer than the threshold is
        named, as without transactions (``handler_blocked_event_loop``)."""
        loop = self._loop
        if loop is None or self._threshold is None:
            return
        now = self._beat_at = loop.time()
        late = now - self._beat_due
        msg = self._inhand_msg
        if late > self._threshold and self._handler_started and msg is not None:
            # a step of the handler in hand held the loop, then awaited
            self._blocked(msg, late)
        self._beat_due = now + max(self._threshold / 4, 0.005)
        self._beat = loop.call_at(self._beat_due, self._heartbeat)

    def _blocked(self, msg: Message, seconds: float) -> None:
        self.blocked_warnings += 1
        self._log.warning(
            "handler_blocked_event_loop",
            handler=self._handler_name,
            blocked_s=round(seconds, 3),
            threshold_s=self._threshold,
            topic=msg.topic(),
            partition=msg.partition(),
            offset=msg.offset(),
            remedy=(
                "the handler ran without awaiting for that long, so nothing else on the "
                "event loop ran: move blocking calls to `await asyncio.to_thread(...)` or "
                "use an async client"
            ),
        )

    # ------------------------------------------------------------------ signals

    def _on_signal(self, sig: signal.Signals) -> None:
        """SIGTERM/SIGINT on the loop: the 1st stops (the handler in hand finishes, what was
        handled commits); a 2nd while a handler is in hand cuts it (the open transaction
        aborted, ``run()`` raises ``KeyboardInterrupt``); later ones are logged."""
        self._signals_received += 1
        if self._signals_received == 1:
            self.stop()
            return
        if self._inhand is not None and not self._interrupted:
            self._interrupted = True
            self._cut_now(f"second signal ({sig.name})")
            return
        self._log.warning(
            "shutdown_signal_received",
            signal=sig.name,
            note="the open transaction is committed or aborted, then the consumer closes "
            "(bounded by shutdown_timeout)",
        )

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[signal.Signals]:
        if not self._handle_signals:
            return []
        return install_loop_signals(loop, self._on_signal, self._previous_signals)

    def _restore_signals(
        self, loop: asyncio.AbstractEventLoop, signals: list[signal.Signals]
    ) -> None:
        restore_loop_signals(loop, signals, self._previous_signals)


def _refuse(
    policy: TransactionPolicy,
    *,
    max_concurrency: int,
    ordering: str,
    dead_letter_producer: object,
    dead_letter_producer_config: Mapping[str, Any] | None,
) -> None:
    """What the asyncio consumer has and consume-transform-produce in transactions cannot
    honour, refused naming the argument (the sync consumer refuses the rest itself)."""
    if not isinstance(policy, TransactionPolicy):
        raise ConfigError(
            f"transactions must be a kresilient.TransactionPolicy, got {type(policy).__name__}",
            key="transactions",
        )
    if ordering != "partition":
        raise ConfigError(
            f"transactions= does not combine with ordering={ordering!r}: a transaction holds "
            "the records of a batch in offset order (docs/transactions.md)",
            key="ordering",
        )
    if max_concurrency != 1:
        raise ConfigError(
            f"transactions= does not combine with max_concurrency={max_concurrency}: one "
            "handler at a time, in offset order, writes into the open transaction",
            key="max_concurrency",
        )
    if dead_letter_producer is not None:
        raise ConfigError(
            "transactions= does not combine with dead_letter_producer: dead letters are "
            "written by the transaction's own producer, inside the transaction",
            key="dead_letter_producer",
        )
    if dead_letter_producer_config is not None:
        raise ConfigError(
            "transactions= does not combine with dead_letter_producer_config: dead letters "
            "are written by the transactional producer; pass its overrides as "
            "TransactionPolicy(producer_config=...)",
            key="dead_letter_producer_config",
        )
