"""At-least-once outputs and stored offsets, driven through ``ResilientConsumer._process``
with a fake client and a fake output producer (no broker: the orders below, a flush found by
one partition's failure while another's output fails, cannot be provoked on demand on a
cluster). Review 9 D1, D2, D6; the real-cluster counterpart is
``tests/test_consume_transform_produce.py::test_at_least_once_outputs_stopping_on_an_error_store_no_offset_of_undelivered_outputs``.
"""

from __future__ import annotations

import time
from typing import Any

from kresilient import Output, ResilientConsumer
from kresilient.errors import KResilientError


class _Msg:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.t, self.p, self.o = topic, partition, offset

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o

    def leader_epoch(self) -> None:
        return None

    def value(self) -> bytes:
        return b"x"

    def key(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000)

    def __repr__(self) -> str:
        return f"{self.t}[{self.p}]@{self.o}"


class _Handle:
    #: the delivery error of an output to "bad" (a KResilientError: retried by the policy)
    error: type[BaseException] = KResilientError

    def __init__(self, bad: bool) -> None:
        self.bad, self.finished = bad, False

    def done(self) -> bool:
        return self.finished

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return type(self).error("MSG_SIZE_TOO_LARGE (broker)") if self.bad else None


class _Producer:
    """Outputs to the topic "bad" fail their delivery; a flush delivers everything."""

    def __init__(self) -> None:
        self.queued: list[_Handle] = []

    def produce(self, topic: str, value: Any, key: Any, **_: Any) -> _Handle:
        handle = _Handle(topic == "bad")
        self.queued.append(handle)
        return handle

    def flush(self, timeout: float | None = None) -> int:
        for handle in self.queued:
            handle.finished = True
        self.queued = []
        return 0

    def close(self, timeout: float) -> None:
        return None


class _Client:
    def __init__(self) -> None:
        self.stored: list[tuple[str, int, int]] = []

    def store_offsets(self, offsets: Any = None, message: Any = None) -> None:
        if message is not None:
            self.stored.append((message.topic(), message.partition(), message.offset() + 1))
        else:
            self.stored += [(p.topic, p.partition, p.offset) for p in offsets]


def _consumer(handler: Any, **kwargs: Any) -> tuple[ResilientConsumer, _Client]:
    consumer = ResilientConsumer(
        {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
        ["t"],
        handler=handler,
        install_signal_handlers=False,
        **kwargs,
    )
    client = _Client()
    consumer._offsets._consumer = client  # type: ignore[assignment]
    assert consumer._outputs is not None
    consumer._outputs.producer = _Producer()  # type: ignore[assignment]
    return consumer, client


def test_an_output_failure_found_while_storing_another_partitions_failure_is_not_passed() -> None:
    """t[1]@5's output is refused; t[0]@0's handler fails in the same batch, whose store of
    t[0] flushes the outputs (never storing past an undelivered one). Before: the failure so
    found was set aside, the batch's end did not confirm and stored t[1] at 6, past the
    undelivered record (review 9 D1). Now t[1] is stored at 5 and t[1]@5 is held."""

    def handler(msg: Any) -> Output | None:
        if msg.partition() == 1:
            return Output("bad", value=b"v")
        raise TimeoutError("transient")  # retriable: t[0] held

    consumer, client = _consumer(handler)
    consumer._process([_Msg("t", 1, 5), _Msg("t", 0, 0)])  # type: ignore[list-item]
    assert not [s for s in client.stored if s[:2] == ("t", 1) and s[2] > 5], client.stored
    assert consumer._holds.by_tp[("t", 1)].offset == 5
    assert not consumer._outputs._carried  # type: ignore[union-attr]
    consumer.close()


def test_a_retried_record_that_succeeds_is_released_when_another_partitions_output_failed() -> None:
    """t[0]@0 fails once, is held, and its retry succeeds with its output delivered, in the
    flush that finds t[1]@5's output refused. Before: any partition's failure kept t[0]@0
    held, so it was handled again and its output written twice (review 9 D6)."""
    calls: list[str] = []
    first = [True]

    def handler(msg: Any) -> Output:
        calls.append(repr(msg))
        if msg.partition() == 0:
            if first[0]:
                first[0] = False
                raise TimeoutError("transient")
            return Output("good", value=b"from t0")
        return Output("bad", value=b"from t1")

    consumer, _client = _consumer(handler)
    consumer._process([_Msg("t", 0, 0)])  # type: ignore[list-item]
    hold = consumer._holds.by_tp[("t", 0)]
    deadline = time.monotonic() + 5
    while time.monotonic() < hold.due and time.monotonic() < deadline:
        time.sleep(0.05)  # the retry's own wait (a condition with a deadline)
    hold.resumed = True  # what the loop does once it is due
    consumer._process([_Msg("t", 1, 5), _Msg("t", 0, 0)])  # type: ignore[list-item]
    assert calls == ["t[0]@0", "t[1]@5", "t[0]@0"]
    assert ("t", 0) not in consumer._holds.by_tp  # released: not handled a third time
    assert consumer._holds.by_tp[("t", 1)].offset == 5
    consumer.close()


def test_stopping_on_one_refused_output_stores_nothing_past_another_partitions(
    monkeypatch: Any,
) -> None:
    """Both records' outputs refused with a poison error and no dead-letter topic: handling
    the first failure stops the consumer. Before: the second partition's failure was never
    handled and the stop stored the whole batch, t[2] past its undelivered record (review 9
    D7). Now nothing of t[2] is stored; t[1] stops at its record."""
    monkeypatch.setattr(_Handle, "error", TypeError)  # poison: the consumer stops on it

    def handler(msg: Any) -> Output:
        return Output("bad", value=b"v")

    consumer, client = _consumer(handler, dead_letter=None)
    try:
        consumer._process([_Msg("t", 1, 5), _Msg("t", 2, 7)])  # type: ignore[list-item]
    except TypeError:
        pass
    else:
        raise AssertionError("the consumer did not stop on the poison output failure")
    assert not [s for s in client.stored if s[:2] == ("t", 2)], client.stored
    assert not [s for s in client.stored if s[:2] == ("t", 1) and s[2] > 5], client.stored
    consumer.close()
