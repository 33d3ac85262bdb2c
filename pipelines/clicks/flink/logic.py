"""The click join's rules, per request id: what the Flink job's keyed functions compute (no pyflink here).

The embedded join (pipelines/clicks/join.py) reads one interval at a time; the Flink job sees every event once,
keyed by request id, and applies the same rules to each key's events when the interval's window has closed:

- `Intervals`: which interval a time falls in, its bounds, and the event-time timer (ms) at which it closes
  (its end plus the attribution window: every event it needs is then behind the watermark);
- `line_event`: one log or click line as an event (the same parsing as pipelines/clicks/events.py), or a bad
  line counted in the interval of the last good line before it in its file (the file's mtime when none);
- `attribute`: one key's requests and clicks -> the interval's accepted request (its labels) and its counts.

An event keeps its order of reading as the embedded join reads it (request logs: file path parts, then line
number; clicks: time, file name, line number) and its file's mtime (a file older than a range's start minus
`MTIME_SLACK_S` is not read for that range), so both engines decide every tie alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from pipelines.clicks.events import (
    BAD_LINE,
    LOG_SUFFIX,
    MTIME_SLACK_S,
    REQUEST_LOG_PREFIX,
    Request,
    click_line,
    request_line,
    served,
)

REQUEST, CLICK, BAD = "R", "C", "B"


@dataclass(frozen=True)
class Intervals:
    """Interval n covers [n*S, (n+1)*S) (aligned to the Unix epoch), or, when `explicit` names them, only
    those intervals, with the bounds given (what `join_interval`'s caller passed)."""

    interval_s: float
    window_s: float
    explicit: tuple[tuple[int, float, float], ...] = ()

    def bounds(self, n: int) -> tuple[float, float]:
        for m, start, end in self.explicit:
            if m == n:
                return start, end
        start = n * self.interval_s
        return start, start + self.interval_s

    def of(self, t: float) -> int | None:
        """The interval `t` falls in (None: outside every explicit one)."""
        if self.explicit:
            return next((n for n, start, end in self.explicit if start <= t < end), None)
        n = math.floor(t / self.interval_s)
        while t < self.bounds(n)[0]:
            n -= 1
        while t >= self.bounds(n)[1]:
            n += 1
        return n

    def reading(self, t: float) -> list[int]:
        """The intervals whose join reads time `t` (their range widened by the window on each side)."""
        if self.explicit:
            return [n for n, start, end in self.explicit if start - self.window_s <= t < end + self.window_s]
        lo, hi = self.of(t - self.window_s), self.of(t + self.window_s)
        return [n for n in range(lo or 0, (hi or 0) + 1) if self._reads(n, t)]

    def _reads(self, n: int, t: float) -> bool:
        start, end = self.bounds(n)
        return start - self.window_s <= t < end + self.window_s

    def timer(self, n: int) -> int:
        """The event time (ms) at which interval n closes: every event before end + window has arrived."""
        return math.floor((self.bounds(n)[1] + self.window_s) * 1000) + 1

    def at_timer(self, ms: int) -> list[int]:
        """The intervals closing at timer `ms`."""
        if self.explicit:
            return [n for n, _, _ in self.explicit if self.timer(n) == ms]
        guess = math.floor((ms / 1000 - self.window_s) / self.interval_s)
        return [n for n in range(guess - 2, guess + 2) if self.timer(n) == ms]


@dataclass
class FileCursor:
    """Per file: the lines read so far, the bytes read, and the stamp of the last good line."""

    lines: int = 0
    offset: int = 0
    last: float | None = None


def line_event(
    stream: str, root: str, path: str, mtime: float, size: int, line: bytes, cursor: FileCursor
) -> tuple[Any, ...] | None:
    """One line of a request log (`stream` "requests") or a click file ("clicks") as an event:
    (REQUEST, request_id, time, Request, order, mtime), (CLICK, request_id, time, instance, order, mtime) or
    (BAD, kind, stamp, mtime); None for a line the embedded join never reads (not its file, or a last line
    still without its newline)."""
    rel = PurePosixPath(path.removeprefix("file:")).relative_to(root.removeprefix("file:"))
    if stream == "requests":
        if not (rel.name.startswith(REQUEST_LOG_PREFIX) and rel.name.endswith(LOG_SUFFIX)):
            return None
    elif len(rel.parts) != 1 or not rel.name.endswith(LOG_SUFFIX):
        return None
    cursor.lines += 1
    cursor.offset += len(line) + 1
    if cursor.offset > size:  # no newline after it: being written, read once it is complete
        return None
    last = mtime if cursor.last is None else cursor.last
    try:
        if stream == "requests":
            request_id, stamp, entry = request_line(line)
            cursor.last = stamp
            return (
                REQUEST,
                request_id,
                stamp,
                served(request_id, stamp, entry),
                (rel.parts, cursor.lines),
                mtime,
            )
        request_id, instance, stamp = click_line(line)
    except BAD_LINE:
        return (BAD, "bad request lines" if stream == "requests" else "bad click lines", last, mtime)
    cursor.last = stamp
    return (CLICK, request_id, stamp, instance, (rel.name, cursor.lines), mtime)


@dataclass
class Outcome:
    """One key's part of an interval: its accepted request and labels, its shadow line, and the counts."""

    request: tuple[Any, Request] | None = None  # (order, request) of the interval's request with raw rows
    labels: list[int] = field(default_factory=list)
    shadow: tuple[Any, Request] | None = None  # (order, shadow line) joined to that request
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1


def _readable(mtime: float, start: float) -> bool:
    """Whether the embedded join opens a file of this mtime for a range starting at `start`."""
    return mtime >= start - MTIME_SLACK_S


def bad_line_counts(iv: Intervals, event: tuple[Any, ...]) -> list[tuple[str, int, dict[str, int]]]:
    """A (BAD, kind, stamp, mtime) event as ("counts", n, {kind: 1}) for the interval whose join counts it: the
    one its stamp falls in, when that join opens its file (as the embedded join counts it, once)."""
    _, kind, stamp, mtime = event
    n = iv.of(stamp)
    if n is None or not _readable(mtime, iv.bounds(n)[0] - iv.window_s):
        return []
    return [("counts", n, {kind: 1})]


def attribute(
    requests: list[tuple[Any, ...]], clicks: list[tuple[Any, ...]], start: float, end: float, window_s: float
) -> Outcome:
    """One request id's interval [start, end): `requests` are (time, Request, order, mtime), `clicks` are
    (time, instance, order, mtime), any times (only those the embedded join reads for the interval count)."""
    lo, hi = start - window_s, end + window_s
    out = Outcome()
    accepted = nearby = shadow = None
    for r in sorted((r for r in requests if lo <= r[0] < hi and _readable(r[3], lo)), key=lambda r: r[2]):
        t, req, order, _ = r
        if req.shadow:
            if start <= t < end and shadow is None:
                shadow = (order, req)
        elif not start <= t < end:
            nearby = nearby or req
        elif accepted is not None:
            out.add("duplicate requests")
        elif req.rows is None:
            out.add("requests without raw fields")
        else:
            accepted = (order, req)
    target = accepted[1] if accepted is not None else nearby
    clicked: set[int] = set()
    for t, instance, _, _ in sorted(
        (c for c in clicks if lo <= c[0] < hi and _readable(c[3], lo)), key=lambda c: (c[0], c[2])
    ):
        if target is None or target.rows is None or instance >= len(target.rows):
            kind = "unknown clicks"
        elif t < target.time:
            kind = "clicks before their request"
        elif t > target.time + window_s:
            kind = "late clicks"
        else:
            kind = "duplicate clicks" if instance in clicked else "clicks"
        if kind == "clicks":
            clicked.add(instance)
        if start <= t < end:
            out.add(kind)
    if accepted is not None:
        out.request = accepted
        out.labels = [int(i in clicked) for i in range(len(accepted[1].rows or []))]
        out.shadow = shadow
    elif shadow is not None:
        out.add("shadow lines without their request")
    return out
