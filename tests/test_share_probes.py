"""What the share consumer's probe source tells the probes about the handler in hand (review 5
D9), without a broker: a poll batch holding records of two partitions is what the test needs,
and a share consumer's poll returns one partition's records per call as a rule (measured on
Kafka 4.4.0: 40 records of each of 2 partitions on one leader came back as two batches), so
no real-cluster test can ask for one. The real-cluster side (an outage hold is no stall) is
``tests/test_share_consumer.py::test_outage_hold_is_not_a_handler_stall``.
"""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import Message

from kresilient.consumer import ConsumerProbes, OutageDetector
from kresilient.share._consumer import _ShareProbeSource


def _probes(state: SimpleNamespace) -> ConsumerProbes:
    probes = ConsumerProbes(
        None,
        _ShareProbeSource(state),  # type: ignore[arg-type]  # the consumer's fields it reads
        stall_after_s=1.0,
        max_poll_s=100.0,
        group="g",
        outage=state._detector,
        clock=lambda: 100.0,
    )
    state._probes = probes
    probes.running = probes.joined = True
    probes.last_poll = 100.0
    return probes


def test_a_hung_handler_is_named_with_its_record_partition_not_the_batch() -> None:
    batch = tuple(Message(topic="jobs", partition=p, offset=o) for p in (0, 1) for o in (0, 1))
    state = SimpleNamespace(
        _record_started=90.0,  # 10 s ago: past stall_after_s
        _in_hand=batch[2],  # jobs[1]@0
        _acquired=batch,
        _detector=OutageDetector(),
    )
    probes = _probes(state)
    ready, reasons = probes.ready()
    assert not ready
    assert reasons == ["a handler has been running for 10.0 s on jobs[1]"], reasons
    # the control: between handler calls (a hold's wait, a dead-letter write) nothing is named
    state._record_started = 0.0
    assert probes.ready() == (True, [])
