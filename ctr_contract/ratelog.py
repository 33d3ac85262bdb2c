"""The rate-limited log: a flood of events (a client's bad requests, a broken folder polled every second, bad
lines or late clicks in the click join) must not flood the log.

Keys are call sites or event kinds chosen by the code (never client text), so the table stays small.
"""

from __future__ import annotations

import logging
import time
from typing import Any

Window = tuple[float, int, int]  # (its start, lines written in it, events held back since the last line)


class RateLimitedLog:
    """Per key, at most `burst` lines per `period_s`; what it holds back is said by the next line it writes.

    - `log`: one line per event; the next line allowed after a full burst says how many were suppressed;
    - `count`: events counted by kind; at most one line per kind per period, carrying the count since the
      kind's last line (its own table: a `count` kind never uses up a `log` key's burst).
    """

    def __init__(self, logger: logging.Logger, burst: int = 5, period_s: float = 60.0) -> None:
        self.logger, self.burst, self.period_s = logger, burst, period_s
        self._windows: dict[str, Window] = {}  # a `log` key's window
        self._counted: dict[str, Window] = {}  # a `count` kind's window

    def _admit(self, table: dict[str, Window], key: str, burst: int, n: int) -> int | None:
        """Add `n` events to `key`: None when its burst is used up in this period (they are held back), else
        the events since its last line, these included (the line is written)."""
        now = time.monotonic()
        start, lines, held = table.get(key, (now, 0, 0))
        if now - start >= self.period_s:
            start, lines = now, 0
        if lines >= burst:
            table[key] = (start, lines, held + n)
            return None
        table[key] = (start, lines + 1, 0)
        return held + n

    def log(self, level: int, key: str, msg: str, *args: Any, exc_info: bool = False) -> bool:
        """Log `msg % args` unless `key` used up its burst in this period; returns whether it was logged."""
        since = self._admit(self._windows, key, self.burst, 1)
        if since is None:
            return False
        if since > 1:
            msg = f"{msg} ({since - 1} similar lines suppressed)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def count(self, kind: str, n: int, what: str) -> bool:
        """Add `n` events of `kind`; log '<count> <kind> <what>' once the kind's period is up; returns whether
        it logged."""
        if n <= 0:
            return False
        since = self._admit(self._counted, kind, 1, n)
        if since is None:
            return False
        self.logger.warning("%d %s %s (at most one line per kind per minute)", since, kind, what)
        return True
