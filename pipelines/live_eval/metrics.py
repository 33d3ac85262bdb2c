"""The evaluator's Prometheus metrics, on their own registry and port (`--metrics-port`).

Per (model, version, label): `ctr_live_joined_rows` and `ctr_live_pending_rows` always; `ctr_live_auc`,
`ctr_live_auc_variance`, `ctr_live_logloss`, `ctr_live_normalized_entropy` and `ctr_live_calibration_ratio`
only from --min-rows joined rows on (a label set below it, or whose figure is undefined, is not exported). A
key that leaves the window (no rows, nothing pending) leaves every gauge. `ctr_live_click_events_total{kind}`
counts the join's events by kind (clicks, duplicate/late/unknown clicks, clicks before their request, bad
lines, duplicate requests...), carried over restarts by the state; `ctr_live_last_interval_end_seconds` is the
end of the newest evaluated interval.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

LABELS = ("model", "version", "label")
FIGURES = {
    "auc": ("ctr_live_auc", "Live AUC over the window"),
    "auc_var": ("ctr_live_auc_variance", "DeLong variance of the live AUC"),
    "logloss": ("ctr_live_logloss", "Live log loss over the window"),
    "ne": ("ctr_live_normalized_entropy", "Live log loss / entropy of the window's click rate"),
    "calibration_ratio": ("ctr_live_calibration_ratio", "Predicted clicks / observed clicks over the window"),
}


class LiveMetrics:
    """The gauges and counters of one evaluator."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.figures = {k: Gauge(name, doc, LABELS, registry=r) for k, (name, doc) in FIGURES.items()}
        self.rows = Gauge("ctr_live_joined_rows", "Joined rows in the window", LABELS, registry=r)
        self.pending = Gauge(
            "ctr_live_pending_rows", "Logged rows whose attribution window is still open", LABELS, registry=r
        )
        self.events = Counter(
            "ctr_live_click_events", "The join's events by kind (clicks and anomalies)", ["kind"], registry=r
        )
        self.last_end = Gauge(
            "ctr_live_last_interval_end_seconds", "End of the newest evaluated interval", registry=r
        )
        self._shown: set[tuple[str, str, str]] = set()

    def count(self, counts: dict[str, int]) -> None:
        for kind, n in counts.items():
            self.events.labels(kind).inc(n)

    def show(self, figures: list[dict[str, Any]], interval_end: float | None) -> None:
        """Set every gauge from a snapshot's figures; label sets no longer in it are removed."""
        shown = set()
        for f in figures:
            labels = (f["model"], "unknown" if f["version"] is None else str(f["version"]), f["label"])
            shown.add(labels)
            self.rows.labels(*labels).set(f["rows"])
            self.pending.labels(*labels).set(f["pending"])
            for k, gauge in self.figures.items():
                if f[k] is None:
                    _remove(gauge, labels)
                else:
                    gauge.labels(*labels).set(f[k])
        for labels in self._shown - shown:
            for gauge in (self.rows, self.pending, *self.figures.values()):
                _remove(gauge, labels)
        self._shown = shown
        if interval_end is not None:
            self.last_end.set(interval_end)


def _remove(gauge: Gauge, labels: tuple[str, str, str]) -> None:
    with contextlib.suppress(KeyError):  # not shown
        gauge.remove(*labels)
