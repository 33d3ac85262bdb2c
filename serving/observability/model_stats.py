"""Triton's statistics extension: per (v2 model, version) counts and durations, from every predict.

Each model call (a batch of requests, or one request with batching off) is one update of its (v2 model,
version)'s row by the runner (`executed`: rows, executions, queue and compute time, serving/runtime/
batcher.py), and each predict one more by the predictor (`record`: success or failure, the request's
time, its decode and its answer's), from its RequestTiming. The rows are read at a statistics request, through the counter
and gauge serving/observability/metrics.py builds for them (`sync`); the workers of `--num_workers` also
write them through to their files (serving/observability/metrics_shared.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from serving.requests import DecodedRequest
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE

# The statistics extension's counters per (v2 model, version) (Triton's InferStatistics, durations in ns).
STAT_FIELDS = (
    "inference_count",
    "execution_count",
    "success",
    "success_ns",
    "fail",
    "fail_ns",
    "queue_ns",
    "compute_input_ns",
    "compute_infer_ns",
    "compute_output_ns",
)


def v2_names(model: str) -> tuple[str, str]:
    """The statistics' (v2) names of a model: its own for `serving_default`, `<model>_raw` for `raw`."""
    return model, f"{model}_{RAW_SIGNATURE}"


class Samples(Protocol):
    """What the rows are read through: a counter's or gauge's values by label values."""

    name: str
    values: dict[tuple[str, ...], float]


class RequestTiming:
    """One predict's phases (perf_counter_ns marks): its start, its batch decoded, its scores back."""

    __slots__ = ("decoded", "ran", "start")

    def __init__(self) -> None:
        self.start = time.perf_counter_ns()
        self.decoded = self.ran = 0


class StatisticsRow:
    """One (v2 model, version)'s statistics extension fields (STAT_FIELDS) and its last inference (ms since
    the epoch), added to in place: a predict is one update of one row, not a counter call per field."""

    __slots__ = (*STAT_FIELDS, "key", "last_inference")
    inference_count: float
    execution_count: float
    success: float
    success_ns: float
    fail: float
    fail_ns: float
    queue_ns: float
    compute_input_ns: float
    compute_infer_ns: float
    compute_output_ns: float

    def __init__(self, key: tuple[str, str]) -> None:
        self.key = key  # (v2 model name, version)
        for field in STAT_FIELDS:
            setattr(self, field, 0.0)
        self.last_inference = 0.0


_NONE: dict = {}  # what a missing level of the rows' dicts reads as (never written to)
FAIL_FIELDS = ("fail", "fail_ns")  # what a failed predict adds to; a successful one adds to the rest
SUCCESS_FIELDS = tuple(f for f in STAT_FIELDS if f not in FAIL_FIELDS)


class ModelStatistics:
    """Triton's statistics extension: per (v2 model, version) counts and durations, from every predict.

    Kept out of the Prometheus page (they are not metrics families of ours). The rows are read through
    `counts` (label values model, version, stat) and `last_inference` (model, version), filled from the
    rows by `sync()`; the workers of `--num_workers` write each row through to the same files as the
    counters (serving/observability/metrics_shared.py, `_publish`).
    """

    writes_through = False  # whether `_publish` writes each updated row out (the workers' statistics)

    def __init__(self, counts: Samples, last_inference: Samples) -> None:
        self.counts, self.last_inference = counts, last_inference
        self._rows: dict[
            str, dict[int, dict[str, StatisticsRow]]
        ] = {}  # model -> version -> signature -> row

    def record(
        self,
        model: str,
        version: int,
        request: DecodedRequest | None,
        timing: RequestTiming,
        status: str,
        end: int = 0,
    ) -> None:
        """Count one finished predict of `model` (status "OK": it answered scores) under its v2 model name:
        its time, and its decode's and answer's (its queue and compute time, its rows and its execution are
        its runner's `executed`); `end`: when it finished (perf_counter_ns; 0: now)."""
        end = end or time.perf_counter_ns()
        start = timing.start
        if status == "OK" and request is not None:
            # Per model, per version: a dict lookup on values the caller has, no key tuple made a predict.
            row = self._rows.get(model, _NONE).get(version, _NONE).get(request.signature)
            if row is None:
                row = self._row(model, version, request.signature)
            row.success += 1
            row.success_ns += end - start
            row.compute_input_ns += (timing.decoded or end) - start
            row.compute_output_ns += end - (timing.ran or end)
            if self.writes_through:
                self._publish(row, False)
            return
        signature = request.signature if request is not None else DEFAULT_SIGNATURE
        row = self._rows.get(model, _NONE).get(version, _NONE).get(signature)
        if row is None:
            row = self._row(model, version, signature)
        row.fail += 1
        row.fail_ns += end - start
        row.last_inference = time.time() * 1e3
        if self.writes_through:
            self._publish(row, True)

    def executed(self, row: StatisticsRow, rows: int, requests: int, queued_ns: int, ran_ns: int) -> None:
        """One model call of `row`'s version: `rows` rows of `requests` requests, which waited `queued_ns` in
        all in the batcher's queue, run (transform and model) in `ran_ns`, which each request counts."""
        row.inference_count += rows
        row.execution_count += 1
        row.queue_ns += queued_ns
        row.compute_infer_ns += requests * ran_ns
        row.last_inference = time.time() * 1e3
        if self.writes_through:
            self._publish(row, False)

    def row(self, model: str, version: int, signature: str) -> StatisticsRow:
        """The row of (`model`, `version`, `signature`), made when missing."""
        found = self._rows.get(model, _NONE).get(version, _NONE).get(signature)
        return found if found is not None else self._row(model, version, signature)

    def _row(self, model: str, version: int, signature: str) -> StatisticsRow:
        v2_name = v2_names(model)[1] if signature == RAW_SIGNATURE else model
        row = StatisticsRow((v2_name, str(version)))
        self._rows.setdefault(model, {}).setdefault(version, {})[signature] = row
        return row

    def rows(self) -> list[StatisticsRow]:
        """Every (v2 model, version)'s row."""
        return [
            row for by_version in self._rows.values() for rows in by_version.values() for row in rows.values()
        ]

    def forget(self, model: str, version: int) -> None:
        """Drop the rows of an unloaded version (serving/observability/metrics.py, `forget_version`)."""
        self._rows.get(model, {}).pop(version, None)

    def _publish(self, row: StatisticsRow, failed: bool) -> None:
        """After each update of `row` when `writes_through` (in one process the rows are read at `sync()`)."""

    def sync(self) -> None:
        """Copy the rows into `counts` and `last_inference` (a predict touched a field: it is there)."""
        for row in self.rows():
            fields = (FAIL_FIELDS if row.fail else ()) + (SUCCESS_FIELDS if row.success else ())
            for field in fields:
                self.counts.values[(*row.key, field)] = getattr(row, field)
            self.last_inference.values[row.key] = row.last_inference

    def table(
        self, merged: Callable[[Samples], dict[tuple[str, ...], float]]
    ) -> dict[tuple[str, str], dict[str, float]]:
        """(v2 model, version) -> the statistics extension's fields, and `last_inference` (ms since the epoch);
        `merged(samples)`: the values of `counts` or `last_inference` (all workers' with --num_workers)."""
        table: dict[tuple[str, str], dict[str, float]] = {}
        self.sync()
        for (model, version, stat), value in merged(self.counts).items():
            table.setdefault((model, version), {})[stat] = value
        for (model, version), value in merged(self.last_inference).items():
            table.setdefault((model, version), {})["last_inference"] = value
        return table
