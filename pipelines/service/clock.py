"""The interval clock: which requests an interval holds, and when it closes.

Interval j covers request times [j*S, (j+1)*S) (S = --interval-s, aligned to the Unix epoch). It closes once the
attribution window of its last request has closed too, at (j+1)*S + window + GRACE_S: from then on a join of it
sees every click it will ever count.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

GRACE_S = 2.0  # the request log writer and the click tracker may lag this much behind the clock


@dataclass(frozen=True)
class IntervalClock:
    """Intervals of `interval_s` seconds of request time, each closing `window_s` + GRACE_S after its end."""

    interval_s: float
    window_s: float  # the attribution window: a click counts this long after its request

    def start(self, j: int) -> float:
        return j * self.interval_s

    def end(self, j: int) -> float:
        return (j + 1) * self.interval_s

    @property
    def lag_s(self) -> float:
        """How long after its end an interval closes."""
        return self.window_s + GRACE_S

    def closes_at(self, j: int) -> float:
        """When interval `j` can be joined: its last request's attribution window has closed."""
        return self.end(j) + self.lag_s

    def current(self, now: float | None = None) -> int:
        """The interval holding `now` (default: the time now)."""
        return int((time.time() if now is None else now) // self.interval_s)

    def first(self, start: float | None) -> int | None:
        """The first interval of a fresh state: the first starting at or after `start` (None: not given)."""
        return None if start is None else int(-(-start // self.interval_s))
