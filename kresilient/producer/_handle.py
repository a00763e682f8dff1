"""DeliveryHandle and DeliveryResult: what :meth:`ResilientProducer.produce` returns.

The handle is also the per-message delivery callback handed to librdkafka (it is callable),
so producing a message creates exactly one Python object besides what confluent-kafka makes.
"""

from __future__ import annotations

import sys
import sysconfig
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from kresilient.errors import ProduceError

__all__ = ["DeliveryHandle", "DeliveryResult", "HandleOwner", "delivered_result", "handle_extras"]


class _Owner(Protocol):
    """What a handle needs from the producer that created it."""

    _reported: deque[tuple[DeliveryHandle, Any, Any]]
    _pool: deque[DeliveryHandle]

    def poll(self, timeout: float = 0) -> int: ...

    def _process_reported(self) -> None: ...

    def _delivered_traced(self, handle: _FullHandle, msg: Any) -> None: ...

    def _callback_raised(self, exc: Exception) -> None: ...


class HandleOwner:
    """What every handle of one producer points to: the two queues its delivery report feeds,
    held directly, and the producer behind a weak proxy for the slow paths.

    A delivery report touches only ``_pool`` or ``_reported``; reading them through a
    ``weakref.proxy`` of the producer cost about 0.1 µs per message (7% of a 100-byte
    produce's CPU), so they live here, on an object that holds no reference back to the
    producer: a dropped producer is still finalised at once.
    """

    __slots__ = ("_pool", "_producer", "_reported")

    def __init__(
        self,
        producer: _Owner,
        pool: deque[DeliveryHandle],
        reported: deque[tuple[DeliveryHandle, Any, Any]],
    ) -> None:
        self._producer = producer  # a weakref.proxy
        self._pool = pool
        self._reported = reported

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def _process_reported(self) -> None:
        self._producer._process_reported()

    def _delivered_traced(self, handle: _FullHandle, msg: Any) -> None:
        self._producer._delivered_traced(handle, msg)

    def _callback_raised(self, exc: Exception) -> None:
        self._producer._callback_raised(exc)


class _Probe:
    __slots__ = ()

    def __call__(self, _err: object, _msg: object) -> int:
        return sys.getrefcount(self)


def _unreferenced_refcount() -> int:
    """``sys.getrefcount(self)`` inside ``__call__`` when only a C caller holds the object.

    Measured with ``map`` (a C caller owning one reference, as confluent-kafka's per-message
    state does) so it follows this interpreter's frame semantics. 0 disables recycling where
    reference counts do not mean that (free-threaded builds).
    """
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return 0
    measured = next(map(_Probe(), [None], [None]))
    return measured if measured >= 2 else 0


_refcount = sys.getrefcount
_UNREFERENCED: Final = _unreferenced_refcount()


@dataclass(frozen=True, kw_only=True, slots=True)
class DeliveryResult:
    """Where a message was written: the topic (a dead-letter topic if it was diverted there),
    partition and offset."""

    topic: str
    partition: int
    offset: int


# DeliveryResult's own (frozen) __init__ stores each field through object.__setattr__ after a
# keyword call: 0.79 µs; the slot descriptors' setters directly: 0.30 µs. Every awaited asyncio
# handle and every result() builds one.
_new_result = object.__new__
_set_topic = vars(DeliveryResult)["topic"].__set__
_set_partition = vars(DeliveryResult)["partition"].__set__
_set_offset = vars(DeliveryResult)["offset"].__set__


def delivered_result(msg: Any) -> DeliveryResult:
    """The :class:`DeliveryResult` of a delivered message (equal to the dataclass's own)."""
    result: DeliveryResult = _new_result(DeliveryResult)
    _set_topic(result, msg.topic())
    _set_partition(result, msg.partition())
    _set_offset(result, msg.offset())
    return result


class DeliveryHandle:
    """The outcome of one :meth:`~kresilient.ResilientProducer.produce` call.

    ``done()`` tells whether the delivery report arrived; ``result()`` waits for it (serving
    the producer's callbacks meanwhile) and returns a :class:`DeliveryResult`, or raises the
    classified :class:`~kresilient.ProduceError`; ``exception()`` returns that error instead.

    Waiting on every handle one by one is slow (one round trip each); produce many messages,
    then ``flush()``, and look at handles only where the answer matters.
    """

    # The lean handle: produce() creates it without __init__ and sets _owner and _id only;
    # _msg and _error stay unset until the report (read them with getattr). A message with
    # headers, a callback or a span gets a _FullHandle.
    __slots__ = ("_error", "_id", "_msg", "_owner")

    _owner: _Owner
    _id: int
    _msg: Any
    _error: ProduceError | None

    # librdkafka's delivery report, called from poll()/flush() through confluent-kafka.
    # A failure is only queued here and classified after poll()/flush() returns: when a fatal
    # error is raised while reports are being served, the binding leaves the exception set
    # and the next C call inside any callback fails with SystemError, so work done here can
    # be cut short at any call. Attribute stores first; a C call's effect (deque.append)
    # happens before the interpreter notices the pending exception.
    #
    # A delivered handle that nobody else references (the application dropped it) goes back
    # to the producer's pool and serves a later message: handles alive while their message
    # is in flight are what makes Python's garbage collector run on a raw loop's workload.
    def __call__(self, err: Any, msg: Any) -> None:
        self._msg = msg
        if err is None:
            if _refcount(self) <= _UNREFERENCED:
                self._msg = None
                self._owner._pool.append(self)
            return
        self._owner._reported.append((self, err, msg))

    @property
    def message_id(self) -> int:
        """Sequence number of this message in its producer (also in ``DeliveryFailure``)."""
        return self._id

    def done(self) -> bool:
        """True once the delivery report (success or failure) has been received."""
        return getattr(self, "_msg", None) is not None or getattr(self, "_error", None) is not None

    def _settle(self) -> None:
        """Make sure a received failure report has been classified into ``_error``."""
        msg = getattr(self, "_msg", None)
        if getattr(self, "_error", None) is None and msg is not None and msg.error() is not None:
            self._owner._process_reported()

    def _wait(self, timeout: float | None) -> None:
        if self.done():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is None:
                step = 0.1
            else:
                step = min(0.1, deadline - time.monotonic())
                if step <= 0:
                    raise TimeoutError(
                        f"message {self._id} not delivered within {timeout} s (still in flight)"
                    )
            self._owner.poll(step)

    def result(self, timeout: float | None = None) -> DeliveryResult:
        """Wait for the delivery report; return where the message was written.

        Raises the classified :class:`~kresilient.ProduceError` if delivery failed, and
        :class:`TimeoutError` if no report arrived within ``timeout`` seconds.
        """
        self._wait(timeout)
        self._settle()
        error = getattr(self, "_error", None)
        if error is not None:
            raise error
        return delivered_result(self._msg)

    def exception(self, timeout: float | None = None) -> ProduceError | None:
        """Wait for the delivery report; return the error if delivery failed, else ``None``."""
        self._wait(timeout)
        self._settle()
        error: ProduceError | None = getattr(self, "_error", None)
        return error

    def __repr__(self) -> str:
        error = getattr(self, "_error", None)
        msg = getattr(self, "_msg", None)
        if error is not None:
            state = f"failed {error.classification.category.name}"
        elif msg is not None and msg.error() is None:
            state = f"delivered {msg.topic()}[{msg.partition()}]@{msg.offset()}"
        elif msg is not None:
            state = f"failed {msg.error().name()}"
        else:
            state = "pending"
        return f"<DeliveryHandle #{self._id} {state}>"


class _FullHandle(DeliveryHandle):
    """A handle that also carries headers, a user callback and/or a telemetry span token."""

    __slots__ = ("_headers", "_on_delivery", "_token")

    # ResilientProducer.produce() sets these five slots itself, without this __init__ (its hot
    # path): a slot added here must be set there too.
    def __init__(self, owner: _Owner, message_id: int, headers: Any, on_delivery: Any, token: Any):
        self._owner = owner
        self._id = message_id
        self._headers = headers
        self._on_delivery = on_delivery
        self._token = token

    def __call__(self, err: Any, msg: Any) -> None:
        self._msg = msg
        if err is not None:
            self._owner._reported.append((self, err, msg))
        elif self._token is not None:
            try:
                self._owner._delivered_traced(self, msg)
            except Exception as exc:
                self._owner._callback_raised(exc)
        on_delivery = self._on_delivery
        if on_delivery is not None:
            # Called once per message: drop it, since the callback often refers back to this
            # handle (an asyncio handle holds its sync handle), a cycle that only the garbage
            # collector would free, after scanning every message still alive.
            self._on_delivery = None
            try:
                on_delivery(err, msg)
            except Exception as exc:  # a user callback must not break delivery accounting
                self._owner._callback_raised(exc)


def handle_extras(handle: DeliveryHandle) -> tuple[Any, Any, Any]:
    """(headers, on_delivery, token) of a handle; all ``None`` for a lean one."""
    return (
        getattr(handle, "_headers", None),
        getattr(handle, "_on_delivery", None),
        getattr(handle, "_token", None),
    )
