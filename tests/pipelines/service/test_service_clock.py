"""The interval clock: what an interval holds, when it closes, where a fresh state starts."""

from __future__ import annotations

import pytest

from pipelines.service.clock import GRACE_S, IntervalClock


def test_interval_j_covers_j_times_s_to_the_next_and_closes_after_window_and_grace():
    clock = IntervalClock(interval_s=10.0, window_s=5.0)
    assert (clock.start(3), clock.end(3)) == (30.0, 40.0)
    assert clock.lag_s == 5.0 + GRACE_S
    assert clock.closes_at(3) == 40.0 + 5.0 + GRACE_S


def test_current_is_the_interval_holding_now():
    clock = IntervalClock(10.0, 0.0)
    assert [clock.current(t) for t in (99.9, 100.0, 109.99)] == [9, 10, 10]


@pytest.mark.parametrize(("start", "first"), [(100.0, 10), (100.5, 11), (109.0, 11), (None, None)])
def test_first_is_the_first_interval_starting_at_or_after_start(start: float | None, first: int | None):
    assert IntervalClock(10.0, 0.0).first(start) == first
