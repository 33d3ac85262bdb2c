"""Metrics of `--num_workers N`: each worker writes through to its own files in a directory of the run,
and a scrape on any worker reads all of them, so every scrape shows the totals of all workers.

The directory is created and removed by the parent (serving/app/workers.py) and holds, per worker pid:
    totals_<pid>.db  counters and histogram buckets. When the worker exits the parent folds them into
                     totals_dead.db (`fold_totals`), so the totals never go back when a worker is restarted
                     and restarts do not add files.
    live_<pid>.db    gauges. The parent deletes it when the worker exits; over the live workers the
                     in-flight gauge is summed ("livesum") and the loaded version is the maximum ("max").
    drift-*_<pid>.*  the recent rows of serving/observability/drift_window.py, deleted with the gauges.
The files are prometheus_client's MmapedDict, the storage of its own multiprocess mode: append-only keys
and 8-byte aligned doubles, written by one process and readable by others at any time. Its collector is
not used because it would rename TF Serving's counters (`*_total`, `*_created`); serving/observability/metrics.py
formats the text. A write-through is a dict lookup and a 16-byte store into the mmap (no lock: only the
event-loop thread of a worker writes). A fold and a scrape exclude each other with flock(2) on the directory
(the fold exclusive, the scrape shared), so no scrape sees an exited worker's totals twice or not at all.

Series per version (`ServingMetrics.per_version`: fallbacks, shadow scores, statistics) live as long as their
version: a worker that unloads one rewrites its totals file without them (`forget_version`; keys cannot be
deleted from an append-only file), and the exited workers' totals keep only the versions a live worker still
holds (`prune_dead_totals`, at every such rewrite), so reloading all day grows no file.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from prometheus_client.mmap_dict import MmapedDict

from serving.observability.metrics import Counter, Gauge, Histogram, ServingMetrics
from serving.observability.model_stats import FAIL_FIELDS, SUCCESS_FIELDS, ModelStatistics, StatisticsRow

log = logging.getLogger(__name__)
SUM_SLOT = "sum"  # slot of a histogram's sum; its buckets are slots 0..len(bounds) (+Inf last)
VALUE_SLOT = ""  # slot of a counter's or gauge's value
GAUGE_MODES: dict[str, Callable[[Iterable[float]], float]] = {"livesum": sum, "max": max}
DEAD_TOTALS = "totals_dead.db"  # the exited workers' totals, folded; matches the totals_*.db of a scrape
FOLD_WAIT_S = 2.0  # the parent waits this long at most for the scrapes to let it fold (it has workers to run)

Sample = tuple[str, tuple[str, ...], int | str]  # (metric name, label values, slot)


class _WriteThrough:
    """Mixin: mirrors each sample this worker changes into its file, under a JSON key (name, labels, slot)."""

    name: str

    def _attach(self, store: MmapedDict) -> None:
        self._store = store
        self._keys: dict[tuple[tuple[str, ...], int | str], str] = {}

    def _write(self, labels: tuple[str, ...], slot: int | str, value: float) -> None:
        key = self._keys.get((labels, slot))
        if key is None:
            key = self._keys[(labels, slot)] = json.dumps([self.name, list(labels), slot])
        self._store.write_value(key, value, 0.0)


class SharedCounter(_WriteThrough, Counter):
    def __init__(self, name: str, help_text: str, labelnames: Sequence[str], store: MmapedDict) -> None:
        super().__init__(name, help_text, labelnames)
        self._attach(store)

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        value = self.values[labels] = self.values.get(labels, 0.0) + amount
        self._write(labels, VALUE_SLOT, value)


class SharedGauge(_WriteThrough, Gauge):
    """A gauge whose workers' values combine by `mode`: "livesum" or "max" (see GAUGE_MODES)."""

    def __init__(
        self, name: str, help_text: str, labelnames: Sequence[str], store: MmapedDict, mode: str
    ) -> None:
        if mode not in GAUGE_MODES:
            raise ValueError(
                f"gauge {name}: multiprocess mode must be one of {sorted(GAUGE_MODES)}, got {mode!r}"
            )
        super().__init__(name, help_text, labelnames)
        self._attach(store)
        self.mode = mode

    def set(self, value: float, *labels: str) -> None:
        self.values[labels] = value
        self._write(labels, VALUE_SLOT, value)

    def publish(self) -> None:
        """Write the tracked values, which one process reads only at its own scrape, for the other workers."""
        self.refresh()
        for labels in self._callbacks:
            self._write(labels, VALUE_SLOT, self.values[labels])


class SharedHistogram(_WriteThrough, Histogram):
    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        store: MmapedDict,
    ) -> None:
        super().__init__(name, help_text, labelnames, buckets)
        self._attach(store)

    def observe(self, value: float, *labels: str) -> None:
        counts, total = self._series(labels)
        i = bisect.bisect_left(self.bounds, value)
        counts[i] += 1
        total[0] += value
        self._write(labels, i, counts[i])
        self._write(labels, SUM_SLOT, total[0])

    def labels(self, *labels: str) -> Callable[[float], None]:
        return lambda value: self.observe(value, *labels)  # written through too

    def observe_many(self, values: np.ndarray, *labels: str) -> None:
        series = counts, total = self._series(labels)
        for i in self._add_many(series, values):
            self._write(labels, i, counts[i])
        self._write(labels, SUM_SLOT, total[0])


class SharedModelStatistics(ModelStatistics):
    """The statistics of one worker: each predict's row written through to its totals file, under the
    keys its counter and gauge would write (so folds and scrapes treat them as they treat counters)."""

    counts: SharedCounter
    last_inference: SharedGauge
    writes_through = True

    def _publish(self, row: StatisticsRow, failed: bool) -> None:
        for field in FAIL_FIELDS if failed else SUCCESS_FIELDS:
            self.counts._write((*row.key, field), VALUE_SLOT, getattr(row, field))
        self.last_inference._write(row.key, VALUE_SLOT, row.last_inference)


@functools.lru_cache(maxsize=8192)
def _parse_key(key: str) -> Sample:
    name, labels, slot = json.loads(key)
    return name, tuple(labels), slot


def read_samples(paths: Iterable[Path]) -> dict[Sample, list[float]]:
    """Every sample in the files at `paths`, with one value per file that has it."""
    samples: dict[Sample, list[float]] = {}
    for path in paths:
        try:
            entries = MmapedDict.read_all_values_from_file(str(path))
        except FileNotFoundError:  # the parent removed the gauges of a worker that just exited
            continue
        for key, value, _, _ in entries:
            samples.setdefault(_parse_key(key), []).append(value)
    return samples


@contextlib.contextmanager
def directory_lock(directory: Path, exclusive: bool, wait_s: float | None = None) -> Iterator[None]:
    """flock(2) on the directory itself: exclusive for a fold, shared for a scrape's reads.

    `wait_s`: give up with TimeoutError after that long (None: wait as long as it takes).
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        if wait_s is None:
            fcntl.flock(fd, mode)
        else:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{directory} stayed locked for {wait_s:g} s") from None
                    time.sleep(0.005)
        yield
    finally:
        os.close(fd)  # releases the lock


@functools.cache
def _max_in_totals() -> frozenset[str]:
    """Names of the gauges kept in the totals files, whose values combine by max, not by sum."""
    return frozenset({ServingMetrics().model_stats.last_inference.name})


@functools.cache
def _version_at() -> dict[str, int]:
    """Metric name -> where its `version` label sits, for the metrics with a series per version."""
    return {m.name: m.labelnames.index("version") for m in ServingMetrics().per_version()}


def _version_of(sample: Sample) -> str | None:
    """The version a sample belongs to; None for a metric without a series per version."""
    at = _version_at().get(sample[0])
    return None if at is None else sample[1][at]


def rewrite_store(path: Path, keep: Callable[[Sample], bool]) -> MmapedDict | None:
    """Rewrite the store at `path` without the samples `keep` refuses (a MmapedDict only ever appends): a copy
    beside it, renamed over it. Run under the directory's exclusive lock. Returns the new store, open, or None
    when it kept everything (or there is no file)."""
    try:
        entries = list(MmapedDict.read_all_values_from_file(str(path)))
    except FileNotFoundError:
        return None
    kept = [(key, value, stamp) for key, value, stamp, _ in entries if keep(_parse_key(key))]
    if len(kept) == len(entries):
        return None
    copy = path.with_name(path.name + ".rewrite")  # not totals_*.db: no scrape reads it
    copy.unlink(missing_ok=True)
    store = MmapedDict(str(copy))
    for key, value, stamp in kept:
        store.write_value(key, value, stamp)
    os.replace(copy, path)  # the mmap follows the file: `store` now writes to `path`
    return store


def prune_dead_totals(directory: Path) -> None:
    """Drop from totals_dead.db the series of versions that no live worker's totals hold (every worker that
    has a version loaded holds its fallback counters, at 0 from the load): the exited workers' totals keep the
    versions served now, not every version ever served. Run under the directory's exclusive lock."""
    live = [p for p in directory.glob("totals_*.db") if p.name != DEAD_TOTALS]
    versions = {_version_of(sample) for sample in read_samples(live)} | {None}  # None: no version label
    store = rewrite_store(directory / DEAD_TOTALS, lambda sample: _version_of(sample) in versions)
    if store is not None:
        store.close()


def fold_totals(directory: Path, pid: int, wait_s: float = FOLD_WAIT_S) -> bool:
    """Fold the totals of the exited worker `pid` into totals_dead.db and remove its file.

    Run by the parent once the worker is reaped (nothing writes the file any more). Counters and buckets
    add up, the totals' gauges keep their maximum (a version's series stay until a live worker unloads it:
    `prune_dead_totals`). Returns False when the worker left no totals.
    TimeoutError when a scrape holds the directory for `wait_s` (a stopped worker): the file is kept, and
    every scrape still counts it.
    """
    source = directory / f"totals_{pid}.db"
    with directory_lock(directory, exclusive=True, wait_s=wait_s):
        try:
            entries = MmapedDict.read_all_values_from_file(str(source))
        except FileNotFoundError:
            return False
        dead = MmapedDict(str(directory / DEAD_TOTALS))
        try:
            for key, value, _, _ in entries:
                before = dead.read_value(key)[0]
                combined = max(before, value) if _parse_key(key)[0] in _max_in_totals() else before + value
                dead.write_value(key, combined, 0.0)
        finally:
            dead.close()
        source.unlink()
    return True


def retire_worker(directory: Path, pid: int) -> None:
    """Clear up after the exited worker `pid`: its gauges (live_<pid>.db) and recent-rows windows
    (serving/observability/drift_window.py) are deleted, its totals folded into totals_dead.db."""
    for path in directory.glob(f"*_{pid}.*"):
        if path.name != f"totals_{pid}.db":
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    fold_totals(directory, pid)


class SharedServingMetrics(ServingMetrics):
    """ServingMetrics of one worker: updates also go to `directory`; `render()` shows all workers' totals."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        pid = os.getpid()
        self._totals = MmapedDict(str(directory / f"totals_{pid}.db"))
        self._live = MmapedDict(str(directory / f"live_{pid}.db"))
        super().__init__()

    def _counter(self, name: str, help_text: str, labelnames: Sequence[str]) -> Counter:
        return SharedCounter(name, help_text, labelnames, self._totals)

    def _gauge(self, name: str, help_text: str, labelnames: Sequence[str], multiprocess_mode: str) -> Gauge:
        return SharedGauge(name, help_text, labelnames, self._live, multiprocess_mode)

    def _histogram(
        self, name: str, help_text: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return SharedHistogram(name, help_text, labelnames, buckets, self._totals)

    def _stats_gauge(self, name: str, labelnames: Sequence[str]) -> Gauge:
        return SharedGauge(name, "", labelnames, self._totals, "max")

    def _model_statistics(self, counts: Counter, last_inference: Gauge) -> ModelStatistics:
        assert isinstance(counts, SharedCounter) and isinstance(last_inference, SharedGauge)
        return SharedModelStatistics(counts, last_inference)

    def forget_version(self, model_name: str, version: int) -> Callable[[str, tuple[str, ...]], bool]:
        """Drop an unloaded version's series here, from this worker's totals file, and from the exited workers'
        totals once no live worker holds the version. A scrape holding the directory for FOLD_WAIT_S leaves
        the file as it is (its series stay until the next unload)."""
        belongs = super().forget_version(model_name, version)
        through = [
            m
            for m in [*self.metrics(), self.model_stats.counts, self.model_stats.last_inference]
            if isinstance(m, _WriteThrough)
        ]
        for metric in through:  # the file keys cached for its series
            metric._keys = {k: v for k, v in metric._keys.items() if not belongs(metric.name, k[0])}
        path = self.directory / f"totals_{os.getpid()}.db"
        try:
            with directory_lock(self.directory, exclusive=True, wait_s=FOLD_WAIT_S):
                store = rewrite_store(path, lambda sample: not belongs(sample[0], sample[1]))
                prune_dead_totals(self.directory)
        except TimeoutError as exc:
            log.warning("the series of %s version %d stay in the metrics files: %s", model_name, version, exc)
            return belongs
        if store is not None:
            old, self._totals = self._totals, store
            for metric in through:
                if metric._store is old:
                    metric._store = store
            old.close()
        return belongs

    def merged(self, metric: Counter) -> dict[tuple[str, ...], float]:
        """`metric`'s values over every worker's files: summed, or combined by a gauge's mode."""
        combine = GAUGE_MODES[metric.mode] if isinstance(metric, SharedGauge) else sum
        with directory_lock(self.directory, exclusive=False):
            paths = sorted([*self.directory.glob("totals_*.db"), *self.directory.glob("live_*.db")])
            found = read_samples(paths)
        return {labels: combine(values) for (name, labels, _), values in found.items() if name == metric.name}

    def publish(self) -> None:
        """Write this worker's tracked gauges (in-flight requests) for the other workers' scrapes."""
        for metric in self.metrics():
            if isinstance(metric, SharedGauge):
                metric.publish()

    def render(self) -> str:
        """The exposition of all workers: counters and histograms summed, gauges combined by their mode."""
        self.publish()
        by_name: dict[str, dict[tuple[tuple[str, ...], int | str], list[float]]] = {}
        with directory_lock(self.directory, exclusive=False):
            found = read_samples(
                sorted([*self.directory.glob("totals_*.db"), *self.directory.glob("live_*.db")])
            )
        for (name, labels, slot), values in found.items():
            by_name.setdefault(name, {})[(labels, slot)] = values
        lines: list[str] = []
        for metric in self.metrics():
            samples = by_name.get(metric.name, {})
            lines += metric.header()
            if isinstance(metric, SharedGauge):
                combine = GAUGE_MODES[metric.mode]
                lines += metric.format({labels: combine(values) for (labels, _), values in samples.items()})
            elif isinstance(metric, Histogram):
                series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}
                for (labels, slot), values in samples.items():
                    counts, total = series.setdefault(labels, ([0] * (len(metric.bounds) + 1), [0.0]))
                    if slot == SUM_SLOT:
                        total[0] = sum(values)
                    else:
                        counts[int(slot)] = int(sum(values))
                lines += metric.format(series)
            elif isinstance(metric, Counter):
                lines += metric.format({labels: sum(values) for (labels, _), values in samples.items()})
        return "\n".join(lines) + "\n"
