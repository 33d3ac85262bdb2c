"""The one rate-limited log (ctr_contract/ratelog.py): serving's fault lines and the click join's counts."""

from __future__ import annotations

import logging

import pytest

from ctr_contract import ratelog
from ctr_contract.ratelog import RateLimitedLog


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(ratelog.time, "monotonic", lambda: now[0])
    return now


def test_a_count_held_back_is_carried_by_the_kinds_next_line(clock: list[float], caplog) -> None:
    limited = RateLimitedLog(logging.getLogger("test.ratelog"))
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        assert limited.count("late clicks", 3, "dropped")
        assert not limited.count("late clicks", 4, "dropped")
        assert limited.count("unknown clicks", 2, "dropped")  # each kind its own line
        assert not limited.count("late clicks", 0, "dropped")
        clock[0] += 59.9
        assert not limited.count("late clicks", 1, "dropped")
        clock[0] += 0.1
        assert limited.count("late clicks", 2, "dropped")
    assert caplog.messages == [
        "3 late clicks dropped (at most one line per kind per minute)",
        "2 unknown clicks dropped (at most one line per kind per minute)",
        "7 late clicks dropped (at most one line per kind per minute)",
    ]


def test_counts_and_lines_of_one_key_do_not_share_a_budget(clock: list[float], caplog) -> None:
    limited = RateLimitedLog(logging.getLogger("test.ratelog"), burst=2)
    with caplog.at_level(logging.WARNING, logger="test.ratelog"):
        assert [limited.log(logging.WARNING, "poll", "poll failed") for _ in range(3)] == [True, True, False]
        assert limited.count("poll", 5, "polls failed")
        clock[0] += 60
        assert limited.log(logging.WARNING, "poll", "poll failed")
    assert caplog.messages == [
        "poll failed",
        "poll failed",
        "5 poll polls failed (at most one line per kind per minute)",
        "poll failed (1 similar lines suppressed)",
    ]
