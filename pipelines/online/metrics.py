"""The online trainer's Prometheus metrics (served on --metrics-port; alert rules in k8s and deploy)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipelines.clicks.join import CLICK_KINDS


class TrainerMetrics:
    """Counters and gauges of one trainer process."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.freshness = Gauge(
            "ctr_online_freshness_seconds",
            "Age of the newest training row in the newest published (served) version",
            registry=r,
        )
        self.rows_joined = Counter("ctr_online_rows_joined_total", "Rows the click join produced", registry=r)
        self.clicks = Counter(
            "ctr_online_clicks_total", "Click events by how the join counted them", ["kind"], registry=r
        )
        self.late_clicks = Counter(
            "ctr_online_late_clicks_total", "Clicks that arrived after their attribution window", registry=r
        )
        self.bad_lines = Counter(
            "ctr_online_bad_lines_total", "Unreadable lines by stream", ["kind"], registry=r
        )
        self.gate_refusals = Counter(
            "ctr_online_gate_refusals_total", "Candidates the quality gate refused", registry=r
        )
        self.intervals = Counter(
            "ctr_online_intervals_total", "Finished intervals by outcome", ["outcome"], registry=r
        )
        self.dropped = Counter(
            "ctr_online_dropped_intervals_total",
            "Intervals dropped because a write failed (e.g. full disk)",
            registry=r,
        )
        self.duration = Histogram(
            "ctr_online_interval_duration_seconds",
            "Wall time of one interval: join, train, export",
            buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )
        self.next_interval = Gauge("ctr_online_next_interval", "The next interval to train", registry=r)
        self._newest_row_time: float | None = None
        self.freshness.set_function(self._age)
        for kind in CLICK_KINDS:
            self.clicks.labels(kind)
        for outcome in ("published", "refused", "empty", "failed", "dropped"):
            self.intervals.labels(outcome)

    def served_row_time(self, t: float | None) -> None:
        """The newest training row's time of the served version (None: unknown, e.g. a version trained offline)."""
        self._newest_row_time = t

    def _age(self) -> float:
        return (
            float("nan") if self._newest_row_time is None else max(0.0, time.time() - self._newest_row_time)
        )
