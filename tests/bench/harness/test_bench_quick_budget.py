"""`BENCH=quick make bench` stays a quick run: its sections' time bounds add up to under 15 minutes."""

from __future__ import annotations

from bench.harness.modes import MODES, SECTIONS

QUICK_LIMIT_S = 15 * 60


def test_the_quick_sections_bounds_sum_to_under_15_minutes() -> None:
    bounds = MODES["quick"].section_timeout_s
    assert set(bounds) == set(SECTIONS)  # every section bounded, so the sum is the whole measured run
    assert sum(bounds.values()) < QUICK_LIMIT_S, bounds
