"""The online trainer: the interval-service core (pipelines/service/) with one step, an interval trained.

The core's clock says when interval j (request times [j*S, (j+1)*S), S = --interval-s) closes; its run loop
runs each closed interval in turn. Each interval ends in exactly one outcome, written to the state:
`published` (a new version), `refused` (the quality gate kept the served version), `empty` (no rows: nothing
trained), `failed` (training or export could not finish) or `dropped` (a write failed, e.g. a full disk:
counted, the state untouched until the interval is recorded).
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Any

from ctr_contract.ratelog import RateLimitedLog
from ctr_store.errors import StoreError
from pipelines.online import state as st
from pipelines.online.metrics import TrainerMetrics
from pipelines.online.published import is_published, newest_version, next_version
from pipelines.online.step import Settings, join, train_and_publish
from pipelines.service.clock import IntervalClock
from pipelines.service.loop import Intervals, Sleep, Stop, run

log = logging.getLogger("pipelines.online")


class Trainer:
    """One trainer over one state folder (`--work`)."""

    def __init__(self, s: Settings, metrics: TrainerMetrics, first: int | None = None) -> None:
        self.s, self.metrics = s, metrics
        self.clock = IntervalClock(s.interval_s, s.window_s)
        self.ratelog = RateLimitedLog(log)
        self.file = st.state_file(s.work)
        start = first if first is not None else self.clock.current()
        fresh = st.State(interval_s=s.interval_s, window_s=s.window_s, next=start)
        fixed = {"interval_s": "--interval-s", "window_s": "--window-s"}
        self.state = self.file.open(fresh, fixed, "trained", "a new --work folder")
        self._resume_pending()
        self.metrics.next_interval.set(self.state.next)
        self._update_freshness()

    @property
    def next(self) -> int:
        return self.state.next

    def run(self, until: float | None = None, stop: Stop | None = None, sleep: Sleep = time.sleep) -> None:
        """Train each interval as it closes; return once every interval starting before `until` is finished,
        or once `stop` is asked (after the interval under way)."""
        run(Intervals(self, until), stop, sleep)

    def idle(self) -> None:
        pass

    def run_interval(self, j: int) -> dict[str, Any]:
        """Join, train and publish interval `j`; record its outcome durably."""
        t0 = time.perf_counter()
        try:
            outcome = self._interval(j)
        except (
            StoreError
        ) as e:  # the bucket's listing or a download: the export's own faults are `failed` too
            outcome = {"interval": j, "outcome": "failed", "why": f"{e}"}
            log.error("interval %d failed: %s", j, e)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
                raise
            outcome = {"interval": j, "outcome": "dropped", "why": f"{e}"}
            self.metrics.dropped.inc()
            log.error("interval %d dropped: cannot write: %s", j, e)
        outcome["seconds"] = round(time.perf_counter() - t0, 2)
        self.metrics.duration.observe(outcome["seconds"])
        self.metrics.intervals.labels(outcome["outcome"]).inc()
        self.state.finish(outcome)
        self._save()
        self._update_freshness()
        log.info("interval %d: %s", j, _describe(outcome))
        return outcome

    def _interval(self, j: int) -> dict[str, Any]:
        report = join(self.s, j)
        self._count(report.counts, report.rows)
        base = {"interval": j, "rows": report.rows, "positives": report.positives, "counts": report.counts}
        if report.rows - report.holdout_rows <= 0:
            return {**base, "outcome": "empty", "why": "no rows to train on: nothing trained"}
        version = next_version(self.s.repo)
        self.state.pending = {"interval": j, "version": version}
        self._save()  # before the export: a restart then knows what may have been published
        result = train_and_publish(self.s, j, version)
        if result["outcome"] == "published":
            self.state.newest_row_time[str(result["version"])] = report.newest_row_time or 0.0
        elif result["outcome"] == "refused":
            self.metrics.gate_refusals.inc()
        return {**base, "newest_row_time": report.newest_row_time, **result}

    def _resume_pending(self) -> None:
        """A kill between publishing and recording: finish the interval from what the repository holds."""
        p = self.state.pending
        if p is None:
            return
        if is_published(self.s.repo, p["version"]):
            log.info(
                "interval %d was published as version %d before a restart: finished",
                p["interval"],
                p["version"],
            )
            report = join(self.s, p["interval"])  # re-read (idempotent) for the row time of the version
            self.state.newest_row_time[str(p["version"])] = report.newest_row_time or 0.0
            self.state.finish(
                {
                    "interval": p["interval"],
                    "outcome": "published",
                    "version": p["version"],
                    "rows": report.rows,
                    "newest_row_time": report.newest_row_time,
                    "resumed": True,
                }
            )
        else:
            self.state.pending = None  # nothing was published: the interval is trained again
        self._save()

    def _save(self) -> None:
        self.file.save(self.state)
        self.metrics.next_interval.set(self.state.next)

    def _count(self, counts: dict[str, int], rows: int) -> None:
        self.metrics.rows_joined.inc(rows)
        for kind, n in counts.items():
            if kind.endswith("clicks") or kind == "clicks before their request":
                self.metrics.clicks.labels(kind).inc(n)
            if kind == "late clicks":
                self.metrics.late_clicks.inc(n)
            if kind.startswith("bad "):
                self.metrics.bad_lines.labels(kind).inc(n)
            if kind != "clicks":
                self.ratelog.count(kind, n, "counted and dropped by the join")

    def _update_freshness(self) -> None:
        try:
            v = newest_version(self.s.repo)
        except StoreError as e:
            self.ratelog.count("store faults", 1, f"left the freshness gauge as it was (the last: {e})")
            return
        self.metrics.served_row_time(None if v is None else self.state.newest_row_time.get(str(v)))


def _describe(o: dict[str, Any]) -> str:
    what = {
        "published": lambda: f"published version {o.get('version')} from {o.get('rows')} rows",
        "refused": lambda: f"quality gate refused the candidate: {o.get('why')}",
        "empty": lambda: "no rows joined: nothing trained",
        "failed": lambda: f"failed: {o.get('why')}",
        "dropped": lambda: f"dropped: {o.get('why')}",
    }[o["outcome"]]()
    return f"{what} in {o['seconds']:.1f} s"
