"""Every metric the server exports, in Prometheus text format (0.0.4).

TF Serving's own names (`:tensorflow:serving:*`, latencies in microseconds) are kept byte-for-byte so
that existing dashboards work. prometheus_client cannot produce them: it renames counters to `*_total`
and adds `*_created` samples. So the exposition is written here; it is plain text and cheap: an update
is a dict lookup and an integer add, with no lock, because only the event-loop thread updates metrics.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from serving.observability.model_stats import ModelStatistics, Samples, v2_names
from serving.observability.process import rss_bytes
from serving.observability.store_metrics import store_counters

# TF Serving's request/runtime latency buckets, in microseconds: ExponentialBuckets(10, 1.8, 33).
LATENCY_BUCKETS_US = tuple(float(f"{10.0 * 1.8**i:.6g}") for i in range(33))
BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(11))  # 1 .. 1024 rows
# Labels of ctr_serving_versions_rejected_total (serving/repository/states.py).
REJECT_REASONS = ("hash_mismatch", "not_ready", "load_timeout", "os_error", "bad_manifest", "load_error")
# Labels of ctr_serving_shadow_dropped_total (serving/dataplane/shadow.py).
SHADOW_DROP_REASONS = ("queue_full", "busy", "unavailable", "error", "non_finite")
# Labels of ctr_serving_fallbacks_total (serving/routing/fallback.py).
FALLBACK_REASONS = ("errors", "non_finite", "deadline", "unavailable")
CTR_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


def _fmt(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def escape_label_value(value: str) -> str:
    """`value` as the text format's label value needs it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """`text` as a HELP line needs it: backslash and newline escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    """`{name="value",...}`, every value escaped (model names and statuses come from configs and clients)."""
    pairs = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


class Metric:
    """One metric family: name, help, label names; subclasses hold the samples."""

    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name, self.help, self.labelnames = name, help_text, tuple(labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]

    def render(self) -> list[str]:
        raise NotImplementedError


class Counter(Metric):
    """A monotonically increasing value per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> list[str]:
        return self.format(self.values)

    def format(self, values: Mapping[tuple[str, ...], float]) -> list[str]:
        """Sample lines of `values` (label values -> value): this process's own, or all workers' merged."""
        return [f"{self.name}{_labels(self.labelnames, k)} {_fmt(v)}" for k, v in values.items()]


class Gauge(Counter):
    """A value that goes up and down per label set."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self._callbacks: dict[tuple[str, ...], Callable[[], float]] = {}

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = value

    def track(self, read: Callable[[], float], *labels: str) -> None:
        """Take the value from `read()` at every scrape (e.g. a live counter the owner keeps anyway)."""
        self._callbacks[labels] = read

    def refresh(self) -> None:
        """Read the tracked values into `values`."""
        for labels, read in self._callbacks.items():
            self.values[labels] = read()

    def render(self) -> list[str]:
        self.refresh()
        return super().render()


class Histogram(Metric):
    """Cumulative-bucket histogram; buckets are upper bounds (`le`), +Inf is implicit."""

    kind = "histogram"

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, help_text, labelnames)
        self.bounds = list(buckets)
        self._bounds_array = np.asarray(self.bounds)
        # label values -> [per-bucket counts (len(bounds)+1, last is +Inf), sum]
        self.series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def _series(self, labels: tuple[str, ...]) -> tuple[list[int], list[float]]:
        if labels not in self.series:
            self.series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        return self.series[labels]

    def observe(self, value: float, *labels: str) -> None:
        counts, total = self.series.get(labels) or self._series(labels)
        counts[bisect_left(self.bounds, value)] += 1
        total[0] += value

    def labels(self, *labels: str) -> Callable[[float], None]:
        """`observe(value, *labels)` bound to one label set; its series appears at its first observation."""
        bounds, bound = self.bounds, cast(list[Any], [])

        def observe(value: float) -> None:
            if not bound:
                bound.extend(self._series(labels))
            bound[0][bisect_left(bounds, value)] += 1
            bound[1][0] += value

        return observe

    def observe_many(self, values: np.ndarray, *labels: str) -> None:
        """Observe every element of `values` (e.g. the (N, 1) scores of one batch) in one vectorised pass."""
        self._add_many(self._series(labels), values)

    def _add_many(self, series: tuple[list[int], list[float]], values: np.ndarray) -> list[int]:
        """Add every element of `values` to `series`; returns the indices of the buckets that changed."""
        counts, total = series
        flat = values.reshape(-1)
        hits = np.bincount(np.searchsorted(self._bounds_array, flat), minlength=len(counts))
        changed: list[int] = np.flatnonzero(hits).tolist()
        for i in changed:
            counts[i] += int(hits[i])
        total[0] += float(flat.sum())
        return changed

    def render(self) -> list[str]:
        return self.format(self.series)

    def format(self, series: Mapping[tuple[str, ...], tuple[list[int], list[float]]]) -> list[str]:
        """Sample lines of `series` (label values -> (per-bucket counts, [sum])), buckets made cumulative."""
        lines = []
        for labels, (counts, total) in series.items():
            cumulative = 0
            for bound, n in zip([*self.bounds, float("inf")], counts, strict=True):
                cumulative += n
                le = _labels(self.labelnames, labels, f'le="{_fmt(bound)}"')
                lines.append(f"{self.name}_bucket{le} {cumulative}")
            base = _labels(self.labelnames, labels)
            lines.append(f"{self.name}_sum{base} {_fmt(total[0])}")
            lines.append(f"{self.name}_count{base} {cumulative}")
        return lines


class ServingMetrics:
    """The server's metrics: TF Serving's names first, then ours (`ctr_serving_*`). `_counter`, `_gauge` and
    `_histogram` build each metric; serving/observability/metrics_shared.py overrides them so that the workers
    of `--num_workers N` write through to shared files."""

    def __init__(self) -> None:
        self.request_count = self._counter(
            ":tensorflow:serving:request_count", "The total number of requests.", ("model_name", "status")
        )
        self.request_latency = self._histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ("model_name", "API", "entrypoint"),
            LATENCY_BUCKETS_US,
        )
        self.runtime_latency = self._histogram(
            ":tensorflow:serving:runtime_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving runtime.",
            ("model_name", "API", "runtime"),
            LATENCY_BUCKETS_US,
        )
        self.queuing_latency = self._histogram(
            ":tensorflow:serving:batching_session:queuing_latency",
            "Distribution of wall time spent (in microseconds) in queues",
            ("thread_pool_name",),
            LATENCY_BUCKETS_US,
        )
        self.batch_size = self._histogram(
            "ctr_serving_batch_size", "Rows per executed model batch.", ("model_name",), BATCH_SIZE_BUCKETS
        )
        # Across workers the in-flight requests add up; the loaded version is the newest any worker has.
        self.inflight = self._gauge(
            "ctr_serving_inflight_requests", "Predict requests being served now.", ("model_name",), "livesum"
        )
        self.model_version = self._gauge(
            "ctr_serving_model_version", "Newest loaded model version (0 when none).", ("model_name",), "max"
        )
        self.load_failures = self._counter(
            "ctr_serving_model_load_failures_total",
            "Model versions that failed to load or warm up.",
            ("model_name",),
        )
        self.repository_polls = self._counter(
            "ctr_serving_repository_polls_total",
            "Scans of the model base path finished (--file_system_poll_wait_seconds); flat: the poller is stuck.",
            ("model_name",),
        )
        self.model_config_polls = self._counter(
            "ctr_serving_model_config_polls_total",
            "Reads of --model_config_file finished (--model_config_file_poll_wait_seconds); flat: the poller is stuck.",
            (),
        )
        # A base path in a bucket: its store's faults and requests (serving/observability/store_metrics.py).
        self.repository_errors, self.repository_store_requests = store_counters(self._counter)
        self.versions_rejected = self._counter(
            "ctr_serving_versions_rejected_total",
            f"Model versions not loaded, by reason: {', '.join(REJECT_REASONS)}.",
            ("model_name", "reason"),
        )
        self.predicted_ctr = self._histogram(
            "ctr_serving_predicted_ctr",
            "Predicted click probability per instance.",
            ("model_name",),
            CTR_BUCKETS,
        )
        self.nonfinite_outputs = self._counter(
            "ctr_serving_nonfinite_outputs_total",
            "Model outputs that were NaN or infinite, withheld from the client (serving/dataplane/output_check.py).",
            ("model_name",),
        )
        self.fallbacks = self._counter(
            "ctr_serving_fallbacks_total",
            "Requests for a version with an open circuit, or that failed on it, answered by the last good "
            f"version (serving/routing/fallback.py); version: the broken one; reason: {', '.join(FALLBACK_REASONS)}.",
            ("model_name", "version", "reason"),
        )
        # Sampled request logs (serving/observability/request_log.py); the drift gauges are rendered by serving/observability/drift.py.
        self.request_log_lines = self._counter(
            "ctr_serving_request_log_lines_total", "Request log lines written.", ("model_name",)
        )
        self.request_log_dropped = self._counter(
            "ctr_serving_request_log_dropped_total",
            "Sampled request log lines dropped: the queue was full (slow disk) or the write failed (full disk).",
            ("model_name",),
        )
        # Shadow scoring (serving/dataplane/shadow.py): jobs scored by the `shadow` label's version, and dropped.
        self.shadow_scored = self._counter(
            "ctr_serving_shadow_scored_total",
            "Requests scored again, off the client's path, by the model's shadow version.",
            ("model_name", "version"),
        )
        self.shadow_dropped = self._counter(
            "ctr_serving_shadow_dropped_total",
            f"Sampled shadow scoring not done, by reason: {', '.join(SHADOW_DROP_REASONS)}.",
            ("model_name", "reason"),
        )
        # Spans the trace exporter dropped (serving/observability/tracing.py); merged over workers like the rest.
        self.trace_spans_dropped = self._counter(
            "ctr_serving_trace_spans_dropped_total",
            "Spans dropped because the trace exporter's queue was full or an export failed.",
            (),
        )
        # The REST connections (serving/http/server.py): what slow or hostile clients cost, and what stopped them.
        self.open_connections = self._gauge(
            "ctr_serving_open_connections", "Open REST connections.", (), "livesum"
        )
        # The process's resident memory, named as prometheus_client's process collector names it; with
        # --num_workers the workers' sum. An alert watches it grow across reloads (docker/prometheus/alerts.yml).
        self.resident_memory = self._gauge(
            "process_resident_memory_bytes", "Resident memory size in bytes.", (), "livesum"
        )
        self.resident_memory.track(lambda: float(rss_bytes()))
        self.connection_timeouts = self._counter(
            "ctr_serving_connection_timeouts_total",
            "REST connections closed for a timeout, by kind (header, body, keepalive, write).",
            ("kind",),
        )
        self.requests_refused = self._counter(
            "ctr_serving_requests_refused_total",
            "REST requests or connections refused for a limit, by kind (connections, header_bytes, "
            "header_count, url_bytes, body_bytes, buffered_bytes, instances).",
            ("kind",),
        )
        self.model_stats = self._model_statistics(
            self._counter("ctr_serving_model_stats", "Triton statistics.", ("model_name", "version", "stat")),
            self._stats_gauge("ctr_serving_model_last_inference_ms", ("model_name", "version")),
        )

    def start_at_zero(self, model_name: str) -> None:
        """Show the counters alerts take increase() of at 0 from start-up: a first sample of 1 gives no increase."""
        self.load_failures.inc(model_name, amount=0)
        self.nonfinite_outputs.inc(model_name, amount=0)
        for reason in REJECT_REASONS:
            self.versions_rejected.inc(model_name, reason, amount=0)
        for reason in SHADOW_DROP_REASONS:
            self.shadow_dropped.inc(model_name, reason, amount=0)

    def version_at_zero(self, model_name: str, version: int) -> None:
        """Show a newly loaded version's alerted counters at 0 (ctr_serving_fallbacks_total per reason)."""
        for reason in FALLBACK_REASONS:
            self.fallbacks.inc(model_name, str(version), reason, amount=0)

    def per_version(self) -> list[Counter]:
        """The metrics with a series per loaded version (a `version` label), the statistics' among them."""
        found = [m for m in self.metrics() if isinstance(m, Counter) and "version" in m.labelnames]
        return [
            *found,
            cast(Counter, self.model_stats.counts),
            cast(Counter, self.model_stats.last_inference),
        ]

    def version_series(self, model_name: str, version: int) -> Callable[[str, tuple[str, ...]], bool]:
        """Whether a series (metric name, label values) is one of `version` of `model_name`."""
        at = {
            m.name: (m.labelnames.index("model_name"), m.labelnames.index("version"))
            for m in self.per_version()
        }
        names, label = set(v2_names(model_name)), str(version)

        def belongs(name: str, labels: tuple[str, ...]) -> bool:
            where = at.get(name)
            return where is not None and labels[where[1]] == label and labels[where[0]] in names

        return belongs

    def forget_version(self, model_name: str, version: int) -> Callable[[str, tuple[str, ...]], bool]:
        """Drop every series of an unloaded version (its fallbacks, shadow scores and statistics), so a server
        that reloads all day shows the versions it serves, not every version it ever served. Returns the
        test of its series (`version_series`)."""
        belongs = self.version_series(model_name, version)
        for metric in self.per_version():
            for labels in [k for k in metric.values if belongs(metric.name, k)]:
                del metric.values[labels]
        self.model_stats.forget(model_name, version)
        return belongs

    def _counter(self, name: str, help_text: str, labelnames: Sequence[str]) -> Counter:
        return Counter(name, help_text, labelnames)

    def _gauge(self, name: str, help_text: str, labelnames: Sequence[str], multiprocess_mode: str) -> Gauge:
        """`multiprocess_mode` ("livesum" or "max") says how workers' values combine; unused in one process."""
        return Gauge(name, help_text, labelnames)

    def _histogram(
        self, name: str, help_text: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, help_text, labelnames, buckets)

    def _stats_gauge(self, name: str, labelnames: Sequence[str]) -> Gauge:
        """A gauge kept with the counters (it outlives a worker) whose workers' values combine by max."""
        return Gauge(name, "", labelnames)

    def _model_statistics(self, counts: Counter, last_inference: Gauge) -> ModelStatistics:
        return ModelStatistics(counts, last_inference)

    def merged(self, metric: Counter) -> dict[tuple[str, ...], float]:
        """`metric`'s values by label values: this process's own (all workers' with --num_workers)."""
        return dict(metric.values)

    def statistics(self) -> dict[tuple[str, str], dict[str, float]]:
        """(v2 model, version) -> the statistics extension's fields, and `last_inference` (ms since the epoch)."""
        return self.model_stats.table(cast(Callable[[Samples], dict[tuple[str, ...], float]], self.merged))

    def metrics(self) -> list[Metric]:
        """Every metric, in exposition order."""
        return [m for m in vars(self).values() if isinstance(m, Metric)]

    def render(self) -> str:
        """The whole exposition, text format 0.0.4."""
        lines: list[str] = []
        for metric in self.metrics():
            lines += metric.header() + metric.render()
        return "\n".join(lines) + "\n"
