"""asyncio clients with the guarantees of ResilientProducer and ResilientConsumer.

* :class:`AsyncResilientProducer`: ``await produce()`` returns once the message is queued and
  gives an :class:`AsyncDeliveryHandle` (``await handle`` -> :class:`~kresilient.DeliveryResult`
  or the classified error); ``await flush()`` raises :class:`~kresilient.DeliveryError` listing
  every failure; a full queue is awaited, not spun on; cancellation never loses a message
  already queued.
* :class:`AsyncResilientConsumer`: an ``async def`` handler per record; offsets committed only
  after the handler returned or the dead letter was acknowledged; retries pause the partition
  while polling continues; dead letters, circuit breaker, per-partition order, graceful
  shutdown on cancellation and SIGTERM. With ``transactions=``: consume-transform-produce
  exactly once, the sync consumer's transactional engine awaiting the handler on the loop.

See docs/asyncio.md.
"""

from __future__ import annotations

from kresilient.aio._consumer import AsyncResilientConsumer
from kresilient.aio._producer import AsyncDeliveryHandle, AsyncResilientProducer

__all__ = ["AsyncDeliveryHandle", "AsyncResilientConsumer", "AsyncResilientProducer"]
