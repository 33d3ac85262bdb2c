"""One log line per kind per minute: a flood of bad lines or late clicks must not flood the log."""

from __future__ import annotations

import logging
import time

PERIOD_S = 60.0


class RateLimitedLog:
    """Counts events by kind and logs each kind at most once per `period_s`, with the count since its last line."""

    def __init__(self, logger: logging.Logger, period_s: float = PERIOD_S) -> None:
        self.logger, self.period_s = logger, period_s
        self._last: dict[str, float] = {}
        self._pending: dict[str, int] = {}

    def count(self, kind: str, n: int, what: str) -> bool:
        """Add `n` events of `kind`; log '<n> <kind> <what>' when the kind's minute is up. Returns whether it logged."""
        if n <= 0:
            return False
        self._pending[kind] = self._pending.get(kind, 0) + n
        now = time.monotonic()
        if now - self._last.get(kind, -self.period_s) < self.period_s:
            return False
        self._last[kind] = now
        self.logger.warning(
            "%d %s %s (at most one line per kind per minute)", self._pending.pop(kind), kind, what
        )
        return True
