"""Rate-limited log lines: a client (or a broken folder polled every second) must not be able to flood the log."""

from __future__ import annotations

import logging
import time
from typing import Any


class RateLimitedLog:
    """At most `burst` lines per `period_s` for each key; the next line allowed says how many were dropped.

    Keys are call sites or fault kinds chosen by the code (never client text), so the table stays small.
    """

    def __init__(self, logger: logging.Logger, burst: int = 5, period_s: float = 60.0) -> None:
        self.logger, self.burst, self.period_s = logger, burst, period_s
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, lines, dropped)

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log `msg % args` unless `key` used up its burst in this period; returns whether it was logged."""
        now = time.monotonic()
        start, lines, dropped = self._windows.get(key, (now, 0, 0))
        if now - start >= self.period_s:
            start, lines = now, 0
        if lines >= self.burst:
            self._windows[key] = (start, lines, dropped + 1)
            return False
        if dropped:
            msg = f"{msg} ({dropped} similar lines suppressed)"
        self._windows[key] = (start, lines + 1, 0)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True
