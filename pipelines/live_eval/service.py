"""Live evaluation: the interval-service core (pipelines/service/) with one step, an interval evaluated.

The core's clock says when interval j (request times [j*S, (j+1)*S), S = --interval-s) closes, as the online
trainer's do; its run loop runs each closed interval in turn. Each interval is joined into STATE/joined/
(train/, holdout/ and shadow/ partitions), read back into the window as (key, score, label) arrays, and
recorded: snapshot.json, one history.jsonl line, then state.json (see pipelines/live_eval/state.py for why a
kill at any moment neither loses nor repeats an interval).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctr_contract.ratelog import RateLimitedLog
from pipelines.clicks.events import Counts, read_requests
from pipelines.clicks.join import JoinReport, join_interval, partition_name
from pipelines.live_eval import state as st
from pipelines.live_eval.figures import NO_LABEL, PARTS, Key, Window
from pipelines.live_eval.metrics import LiveMetrics
from pipelines.service.clock import IntervalClock
from pipelines.service.loop import Intervals, Sleep, Stop, run

log = logging.getLogger("pipelines.live_eval")
JoinFunction = Callable[[Path, Path, Path, int, float, float, float, float], JoinReport]


@dataclass(frozen=True)
class Settings:
    """What the evaluator reads and writes, and over which window."""

    logs: Path
    clicks: Path
    state_dir: Path
    interval_s: float = 10.0
    window_s: float = 300.0
    attribution_window_s: float = 60.0
    min_rows: int = 500
    keep_joined_s: float = 86_400.0  # joined partitions older than this (and out of the window) are deleted
    join: JoinFunction = join_interval

    @property
    def joined(self) -> Path:
        return self.state_dir / "joined"

    @property
    def window_intervals(self) -> int:
        return max(1, math.ceil(self.window_s / self.interval_s - 1e-9))


class LiveEval:
    """One evaluator over one state folder."""

    def __init__(self, s: Settings, metrics: LiveMetrics | None = None, first: int | None = None) -> None:
        self.s, self.metrics = s, metrics or LiveMetrics()
        self.clock = IntervalClock(s.interval_s, s.attribution_window_s)
        self.ratelog = RateLimitedLog(log)
        self.file = st.state_file(s.state_dir)
        start = first if first is not None else self.clock.current()
        fresh = st.State(s.interval_s, s.attribution_window_s, next=start)
        fixed = {"interval_s": "--interval-s", "attribution_window_s": "--attribution-window-s"}
        self.state = loaded = self.file.open(fresh, fixed, "evaluated", "a new --state-dir")
        st.cut_history(s.state_dir, loaded.history_bytes)  # lines of an interval not recorded before a kill
        self.metrics.count(loaded.counts)
        self.window = Window(s.window_intervals)
        for j in range(loaded.next - self.window.size, loaded.next):
            self.window.load(s.joined, j)
        self._pending_at = -math.inf

    @property
    def next(self) -> int:
        return self.state.next

    def run(
        self,
        until: float | None = None,
        intervals: int | None = None,
        stop: Stop | None = None,
        sleep: Sleep = time.sleep,
    ) -> None:
        """Evaluate each interval as it closes; return once every interval starting before `until` is done, or
        after `intervals` intervals (None: never), or once `stop` is asked (after the interval under way)."""
        run(Intervals(self, until, intervals), stop, sleep)

    def run_interval(self, j: int) -> dict[str, Any]:
        """Join interval `j`, slide the window, record the snapshot durably and export it; returns it."""
        t0 = time.perf_counter()
        s = self.s
        start, end = self.clock.start(j), self.clock.end(j)
        report = s.join(s.logs, s.clicks, s.joined, j, start, end, s.attribution_window_s, 0.0)
        t1 = time.perf_counter()
        self.window.load(s.joined, j)
        pending = self.pending(end)
        t2 = time.perf_counter()
        figures = self.window.figures(s.min_rows, pending)
        t3 = time.perf_counter()
        snapshot: dict[str, Any] = {
            "interval": j,
            "window_start": self.clock.end(j - self.window.size),
            "window_end": end,
            "min_rows": s.min_rows,
            "window_rows": self.window.rows,
            "joined": {"rows": report.rows, "shadow_rows": report.shadow_rows, "requests": report.requests},
            "counts": report.counts,
            "figures": figures,
        }
        st.write_snapshot(s.state_dir, snapshot)
        self.state.history_bytes = st.append_history(s.state_dir, snapshot)
        for kind, n in report.counts.items():
            self.state.counts[kind] = self.state.counts.get(kind, 0) + n
        self.state.next = j + 1
        self.file.save(self.state)  # the interval is done from here on
        self.metrics.count(report.counts)
        self.metrics.show(figures, end)
        for kind, n in report.counts.items():
            if kind != "clicks":
                self.ratelog.count(kind, n, "counted and dropped by the live evaluation's join")
        self._prune(j)
        log.info(
            "interval %d: %d rows joined (%d shadow), %d in the window (%.1f MB), %d keys; join %.2f s, "
            "window and pending %.2f s, figures %.2f s, %.2f s in all",
            j,
            report.rows,
            report.shadow_rows,
            self.window.rows,
            self.window.nbytes / 1e6,
            len(figures),
            t1 - t0,
            t2 - t1,
            t3 - t2,
            time.perf_counter() - t0,
        )
        return snapshot

    def pending(self, since: float) -> dict[Key, int]:
        """Rows logged at or after `since` (the window's end: their interval is not joined yet), by key, over at
        most one interval, one attribution window and the grace of request time: all a live evaluator has open,
        and a bounded read for one that is catching up."""
        s, counts = self.s, Counts()
        span = s.interval_s + self.clock.lag_s
        out: dict[Key, int] = {}
        for r in read_requests(s.logs, since, min(since + span, time.time()), counts):
            n = len(r.scores or []) if r.shadow else len(r.rows or [])
            if n:
                k = (r.model or "unknown", r.version, r.label or NO_LABEL)
                out[k] = out.get(k, 0) + n
        return out

    def idle(self) -> None:
        """While waiting, refresh the pending gauges once per interval."""
        now = time.monotonic()
        if now - self._pending_at < self.s.interval_s:
            return
        self._pending_at = now
        end = self.clock.start(self.state.next)
        self.metrics.show(self.window.figures(self.s.min_rows, self.pending(end)), None)

    def _prune(self, j: int) -> None:
        """Delete the joined partitions of the interval that just left both the window and --keep-joined-s."""
        keep = max(self.window.size, math.ceil(self.s.keep_joined_s / self.s.interval_s))
        for name in PARTS:
            (self.s.joined / name / partition_name(j - keep)).unlink(missing_ok=True)
