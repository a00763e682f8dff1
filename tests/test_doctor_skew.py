"""The doctor's clock-skew bound (pure logic; the probe itself is tested on the real cluster
in tests/test_doctor.py)."""

from __future__ import annotations

import statistics

import pytest

from kresilient.doctor import CLOCK_SKEW_WARN_MS, clock_skew


def _stamp(sent: float, appended: float, acked: float, skew_ms: float) -> tuple[float, float, int]:
    """A probe message sent, appended by a broker whose clock is ``skew_ms`` ahead, acked."""
    return sent, acked, int(appended * 1000 + skew_ms)


def test_slow_acknowledgements_on_one_clock_prove_no_skew() -> None:
    # Appended 10 ms after the send, acknowledged 3 s later (replication on a loaded host).
    stamps = [_stamp(100.0 + i, 100.01 + i, 103.0 + i, 0) for i in range(20)]
    skew, bounds = clock_skew(stamps)
    assert skew == 0
    assert bounds is not None and bounds[0] <= 0 <= bounds[1]
    # Negative control: the midpoint estimate the doctor used before read 1.5 s of skew here,
    # over the 1 s warning threshold, on a single clock.
    midpoint = statistics.median(ts - (s + a) / 2 * 1000 for s, a, ts in stamps)
    assert midpoint < -CLOCK_SKEW_WARN_MS


@pytest.mark.parametrize("true_skew", [2_000.0, -2_000.0, 3_600_000.0, -3_600_000.0])
def test_real_skew_is_proven_to_within_the_fastest_round_trip(true_skew: float) -> None:
    stamps = [
        _stamp(10.0, 10.4, 13.0, true_skew),  # slow: a wide interval
        _stamp(20.0, 20.01, 20.02, true_skew),  # fast: 20 ms wide
        _stamp(30.0, 30.5, 31.0, true_skew),
    ]
    skew, bounds = clock_skew(stamps)
    assert bounds is not None and bounds[0] <= true_skew <= bounds[1]
    assert bounds[1] - bounds[0] <= 20 + 2  # the intersection: the fastest message's width
    assert abs(skew - true_skew) <= 22
    assert abs(skew) > CLOCK_SKEW_WARN_MS  # so the doctor warns


def test_a_clock_stepped_during_the_probe_falls_back_to_the_midpoints() -> None:
    stamps = [_stamp(10.0, 10.01, 10.02, 0), _stamp(20.0, 20.01, 20.02, 5_000)]
    skew, bounds = clock_skew(stamps)
    assert bounds is None
    assert skew == statistics.median(ts - (s + a) / 2 * 1000 for s, a, ts in stamps)


def test_no_stamps_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        clock_skew([])
