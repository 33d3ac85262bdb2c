"""Drift of the inputs and scores: the population stability index of recent traffic against training.

Each served version carries `assets.extra/drift_reference.json` (export/publish/drift_reference.py): per model-input
feature the bin edges and shares of its training distribution, the same for the validation scores, and per
raw Criteo field the bins of the raw validation rows. The server keeps the last `--drift_window` rows it scored
and, at every scrape, bins them with the reference of the newest loaded version and exports

    ctr_serving_feature_drift_psi{model_name, feature}    per model-input feature: I1..I13, I1_missing.., C1_rate..,
                                                          hash_0..; and per raw field of raw requests: raw:I1..raw:C26
    ctr_serving_score_drift_psi{model_name}
    ctr_serving_drift_window_rows{model_name}             rows the figures are computed over

PSI = sum over bins of (live - ref) * ln(live / ref), with both shares floored at PSI_FLOOR so that an empty
bin costs a bounded amount. Nothing is exported for a group with fewer than MIN_ROWS rows in the window.
A version without a readable reference (hand-made, or exported before every export wrote one) is named in
one warning within REFERENCE_CHECK_S of becoming the newest loaded version; while it is, none of the three
gauges has a sample and its rows are not kept: an absent series, not a window that counts rows no PSI covers.
Requests of engineered features feed the feature series; raw requests (whose features only exist inside the
model graph) feed the raw:* series. Both feed the score.

The hot path (`observe_batch`, once a model call) only keeps a reference to the batch; every FLUSH_ROWS rows
(and at each scrape) the pending batches are copied into ring buffers at once
(serving/observability/drift_window.py). Binning happens at scrape time, off the predict path, its cost growing
with the window. Under `--num_workers N` each worker keeps window/N rows in a shared file, and the worker
answering a scrape reads all of them: the figure covers every worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.repository import DRIFT_REFERENCE_PATH
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.value_table import ValueTable
from serving.observability.drift_window import RingBuffer, joined, rows_of, shared_windows
from serving.observability.metrics import escape_label_value as esc
from serving.signatures import RAW_SIGNATURE

log = logging.getLogger(__name__)

PSI_FLOOR = 1e-4
MIN_ROWS = 200
FLUSH_ROWS = 256  # pending rows copied into the ring buffer at once
# ... or fewer, once this many requests are pending: a flush pauses the event loop for a time that grows with
# the requests it joins, and joining 256 single-row requests paused it as long as a single-row request takes.
FLUSH_REQUESTS = 64
N_NUMERIC, N_CATEGORICAL = len(NUMERIC_FIELDS), len(CATEGORICAL_FIELDS)
FLUSH_S = 0.25  # with --num_workers: the longest a row waits before other workers' scrapes see it
REFERENCE_CHECK_S = 1.0  # how often the newest version's reference file is checked for a change
RAW_PREFIX = "raw:"  # feature label of a raw field's series


def psi(live_counts: np.ndarray, reference: np.ndarray) -> float:
    """Population stability index of bin counts against reference shares (same bins)."""
    total = live_counts.sum()
    live = np.maximum(live_counts / max(total, 1), PSI_FLOOR)
    ref = np.maximum(np.asarray(reference, dtype=np.float64), PSI_FLOOR)
    return float(np.sum((live - ref) * np.log(live / ref)))


def _edges_and_shares(doc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    edges, shares = np.asarray(doc["edges"], np.float64), np.asarray(doc["fractions"], np.float64)
    if len(shares) != len(edges) + 1:
        raise ValueError(f"{doc.get('name', 'score')}: {len(edges)} edges need {len(edges) + 1} shares")
    return edges, shares


class Reference:
    """A parsed drift_reference.json."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.names = [f["name"] for f in doc["features"]]
        self.features = [_edges_and_shares(f) for f in doc["features"]]
        self.score = _edges_and_shares(doc["score"])
        # Raw fields: a count has edges (after sign(x) * log1p(|x|), missing = -inf); a categorical field
        # has its frequent values, whose bins are followed by "other" and "missing".
        self.raw_numeric: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.raw_categorical: list[tuple[str, dict[str, int], np.ndarray]] = []
        for f in doc.get("raw", []):
            if "edges" in f:
                self.raw_numeric.append((f["name"], *_edges_and_shares(f)))
            else:
                codes = {v: i for i, v in enumerate(f["values"])} | {"": len(f["values"]) + 1}
                self.raw_categorical.append((f["name"], codes, np.asarray(f["fractions"], np.float64)))
        # Where each raw series' field sits in a RawBatch (ValueError, an ignored reference, for another name).
        self._numeric_rows = [NUMERIC_FIELDS.index(name) for name, _, _ in self.raw_numeric]
        self._categorical_rows = [CATEGORICAL_FIELDS.index(name) for name, _, _ in self.raw_categorical]
        self._every_categorical = self._categorical_rows == list(range(len(CATEGORICAL_FIELDS)))
        # The categorical bins, looked up batch-wide with the batch's keys (shared with the transform);
        # a value no bin names is "other", the bin before "missing".
        bins = dict(zip(self._categorical_rows, self.raw_categorical, strict=True))
        self._codes = ValueTable(
            [bins[j][1] if j in bins else {} for j in range(len(CATEGORICAL_FIELDS))], -1
        )
        self._other = np.array([len(s) - 2 for _, _, s in self.raw_categorical], np.float32)[:, None]
        # transform -> its entries' codes; weak: a version may unload before this does. One per served version,
        # so a traffic split's versions, taking turns, do not rebuild each other's table.
        self._by_entry: weakref.WeakKeyDictionary[Any, np.ndarray | None] = weakref.WeakKeyDictionary()

    @property
    def width(self) -> int:
        return len(self.names)

    def raw_codes(self, batch: RawBatch) -> np.ndarray:
        """A raw batch as float32 (N, 39): transformed counts, then categorical bin codes."""
        codes = self._codes.lookup(batch.categorical, batch.keys)[self._categorical_rows].astype(np.float32)
        return np.concatenate([self._numeric_codes(batch.numeric), np.where(codes < 0, self._other, codes)]).T

    def entry_codes(self, transform: Any, numeric: np.ndarray, entries: np.ndarray) -> np.ndarray | None:
        """`raw_codes` of a batch from its counts (13, N) and the entries (26, N) `transform` gave its values
        (RawBatch.remember_entries): one gather instead of a lookup of every value. None when some bin's
        value has no entry of `transform` (the batch is then binned by `raw_codes`)."""
        return self.entry_rows(transform, numeric, entries, np.zeros((numeric.shape[1], 0), np.float32))

    def entry_rows(
        self, transform: Any, numeric: np.ndarray, entries: np.ndarray, scores: np.ndarray
    ) -> np.ndarray | None:
        """The window's rows (N, 39 + K) float32 of a batch's counts (13, N), entries (26, N) and scores (N, K):
        `entry_codes` and the scores, written in place (no concatenation of the parts); None as there."""
        by_entry = self.codes_by_entry(transform)
        if by_entry is None:
            return None
        k, c = len(self._numeric_rows), len(self._categorical_rows)
        out = np.empty((k + c + scores.shape[1], numeric.shape[1]), np.float32)  # (40, N)
        out[:k] = self._numeric_codes(numeric, np.float64)  # cast as `astype` casts
        codes = out[k : k + c]
        codes[:] = by_entry[entries if self._every_categorical else entries[self._categorical_rows]]
        np.copyto(codes, self._other, where=codes < 0)
        out[k + c :] = scores.T
        return out.T

    def _numeric_codes(self, numeric: np.ndarray, dtype: type = np.float32) -> np.ndarray:
        # No np.errstate (a cost at every flush) is needed: log1p of |x| >= 0, inf or NaN warns of nothing.
        x = numeric if self._numeric_rows == list(range(len(NUMERIC_FIELDS))) else numeric[self._numeric_rows]
        codes = np.where(np.isfinite(x), np.copysign(np.log1p(np.abs(x)), x), -np.inf)
        return codes if dtype is np.float64 else codes.astype(dtype)

    def codes_by_entry(self, transform: Any) -> np.ndarray | None:
        """float32 entry -> bin code of the entry's field (-1: "other") for `transform`'s entries (its
        `lookups`: per field value -> entry; entry 0 is a value no table holds), built once per transform."""
        if transform in self._by_entry:
            return self._by_entry[transform]
        by_entry: np.ndarray | None = np.full(transform.entry_count, -1, np.float32)
        for j, (_, bins, _) in zip(self._categorical_rows, self.raw_categorical, strict=True):
            lookup = transform.lookups[j]
            if any(value not in lookup for value in bins):
                by_entry = None  # a bin of a value the spec never saw: only a lookup of the value finds it
                break
            by_entry[[lookup[value] for value in bins]] = list(bins.values())  # type: ignore[index]
        self._by_entry[transform] = by_entry
        return by_entry


# One transform's rows waiting for the flush, (counts, entries, scores) a request: batches', then single rows'.
_Pending = tuple[list[tuple[np.ndarray, Any, np.ndarray]], list[tuple[np.ndarray, Any, np.ndarray]]]


class DriftMonitor:
    """Keeps the window and renders the PSI gauges; `version_dir()` names the version whose reference counts."""

    def __init__(
        self,
        model_name: str,
        window: int,
        version_dir: Callable[[], Path | None],
        directory: Path | None = None,
        workers: int = 1,
    ) -> None:
        self.model_name, self.version_dir, self.directory = model_name, version_dir, directory
        capacity = max(1, math.ceil(window / workers))
        self.features = RingBuffer(capacity, directory, "drift-features")  # rows: features..., score
        self.raw = RingBuffer(capacity, directory, "drift-raw")  # rows: raw codes..., score
        # Batches not yet in a ring: feature batches (N, width) with their scores (N, 1); raw batches whose
        # transform left its entries (RawBatch.remember_entries): their counts (13, n) and entries (26, n),
        # binned by entry; and other raw batches, whose values are looked up at the flush.
        self._features: list[np.ndarray] = []
        self._feature_scores: list[np.ndarray] = []
        # Per transform whose entries they are (a traffic split serves two versions at once, taking turns): the
        # batches' (counts, entries, scores), then single rows' (the usual requests) counts (13, 1) float64,
        # entries (26, 1) int32 and score (1, 1) float32, contiguous: joined as bytes at the flush, faster than
        # concatenating many small arrays (the flush pauses the event loop).
        self._entries: dict[object, _Pending] = {}
        self._raw: list[tuple[Any, np.ndarray]] = []
        self._pending_rows = self._pending_requests = 0
        self._tick_scheduled = False
        self._reference: tuple[Path, int, Reference | None] | None = None
        self._reference_parts: tuple[str, ...] = ()  # the parts of the folder of `_reference`'s path
        self._recheck_at = 0.0  # when the reference file is looked at again (a new version's at once)
        self._warned: set[Path] = set()  # versions whose missing reference was logged
        # A version loaded without a reference is named at once, not at the first flush or scrape; with no
        # event loop (a unit test) the checks at flush and scrape remain.
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon(self._watch_reference)

    def _watch_reference(self) -> None:
        self.reference()
        if self._pending_requests:  # rows of a quiet moment: they hold their version's transform meanwhile
            self.flush()
        asyncio.get_running_loop().call_later(REFERENCE_CHECK_S, self._watch_reference)

    def observe_batch(self, signature: str, batch: Any, scores: np.ndarray) -> None:
        """Hot path, once a model call (serving/runtime/batcher.py): remember the batch the model ran
        (features (N, width), or raw rows) and its `ctr` scores (N, 1)."""
        if signature == RAW_SIGNATURE:
            # A raw batch whose transform left its entries (RawBatch.remember_entries) is kept as its counts
            # and entries, binned by entry at the flush (the batch itself, with its 26 strings a row, is freed
            # with its request, not all at once at the flush); another, as the batch, whose values are looked up.
            found = batch.entries()  # type: ignore[union-attr]
            pending = None if found is None else self._entries.get(found[0])
            if pending is None:
                pending = self._entries_of(found)
            if pending is None:
                self._raw.append((batch, scores))
            else:
                pending[len(scores) == 1].append((batch.numeric, found[1], scores))  # type: ignore[index,union-attr]
        else:
            self._features.append(batch)  # type: ignore[arg-type]
            self._feature_scores.append(scores)
        self._pending_rows += len(scores)  # the batch's rows: an array's len costs no Python call
        self._pending_requests += 1
        if self._pending_rows >= FLUSH_ROWS or self._pending_requests >= FLUSH_REQUESTS:
            self.flush()
        elif not self._tick_scheduled and self.directory is not None:
            # Other workers read the files at their scrapes: rows of a quiet moment must not wait for more.
            self._tick_scheduled = True
            asyncio.get_running_loop().call_later(FLUSH_S, self._tick)

    def _entries_of(self, found: tuple[object, Any] | None) -> _Pending | None:
        """The pending rows of the transform in `found` (RawBatch.entries), first seen since the flush; None
        when the batch is to be binned by its values (no entries, or the reference has a bin of a value the
        transform has no entry for)."""
        if found is None:
            return None
        ref = self.reference()
        if ref is None or not ref.raw_numeric or ref.codes_by_entry(found[0]) is None:
            return None
        pending: _Pending = ([], [])
        self._entries[found[0]] = pending
        return pending

    def flush(self) -> None:
        """Copy the pending batches into the ring buffers: a few array operations per FLUSH_ROWS rows."""
        features, scores, raw = self._features, self._feature_scores, self._raw
        self._features, self._feature_scores, self._raw, self._pending_rows = [], [], [], 0
        self._pending_requests = 0
        if features and self.reference() is None:
            features = []  # a version without a reference: its rows would count towards no PSI
        if features:
            try:
                block = np.concatenate(features)
            except ValueError:  # a swap to a version of another input width: only the new rows count
                width = features[-1].shape[1]
                kept = [i for i, f in enumerate(features) if f.shape[1] == width]
                features, scores = [features[i] for i in kept], [scores[i] for i in kept]
                block = np.concatenate(features)
            self.features.append(np.hstack([block, np.concatenate(scores)]))
        # A transform is kept only while its rows wait: its version may unload.
        by_owner, self._entries = self._entries, {}
        if not (raw or by_owner):
            return
        ref = self.reference()
        if ref is None or not ref.raw_numeric:
            return
        for owner, (batches, singles) in by_owner.items():
            numeric, entries, raw_scores = (
                ([*part] for part in zip(*batches, strict=True)) if batches else ([], [], [])
            )
            if singles:
                one_counts, one_entries, one_scores = zip(*singles, strict=True)
                numeric.append(rows_of(one_counts, np.float64, N_NUMERIC))
                entries.append(rows_of(one_entries, np.int32, N_CATEGORICAL))
                raw_scores.append(rows_of(one_scores, np.float32, 1).T)
            # One gather for every pending request of a transform: looking each one-row request's values up
            # apart paused the event loop for longer than the requests took. A version swapped in since these
            # rows were kept may have a bin of a value their transform lacks: they are then left out.
            rows = ref.entry_rows(owner, joined(numeric, 1), joined(entries, 1), joined(raw_scores, 0))
            if rows is not None:
                self.raw.append(rows)
        if raw:
            # One RawBatch of every pending request, binned at once: binning each request's 39 columns apart
            # paused the event loop at every flush, and raw requests' p99 with it.
            merged = RawBatch.concat([b for b, _ in raw])
            self.raw.append(np.hstack([ref.raw_codes(merged), np.concatenate([s for _, s in raw])]))

    def _tick(self) -> None:
        self._tick_scheduled = False
        self.flush()

    def reference(self) -> Reference | None:
        """The newest loaded version's reference, re-read only when the version or the file changes."""
        version_dir = self.version_dir()
        if version_dir is None:
            return None
        now = time.monotonic()
        held = self._reference
        # The same version as last time: its parts compared (no path joined, nor compared as a whole, per flush).
        if held is not None and self._reference_parts == version_dir.parts:
            if now < self._recheck_at:
                # A stat at every flush would cost the predict path: a flush comes every few requests.
                return held[2]
            path = held[0]
        else:
            path = version_dir / DRIFT_REFERENCE_PATH
            self._reference_parts = version_dir.parts
        self._recheck_at = now + REFERENCE_CHECK_S
        try:
            stamp = path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = -1
        if self._reference is not None and self._reference[:2] == (path, stamp):
            return self._reference[2]
        ref = None
        if stamp >= 0:
            try:
                ref = Reference(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring drift reference %s: %s; no drift metrics for this version", path, exc)
        elif version_dir not in self._warned:
            self._warned.add(version_dir)
            log.warning(
                "%s has no %s; no drift metrics for this version (re-export it to get them)",
                version_dir,
                DRIFT_REFERENCE_PATH,
            )
        self._reference = (path, stamp, ref)
        return ref

    def _window(self, ring: RingBuffer) -> np.ndarray:
        """All workers' recent rows of one ring, (M, width + 1) float32."""
        parts = shared_windows(self.directory, ring.prefix) if self.directory is not None else [ring.filled()]
        parts = [p for p in parts if len(p)]
        if len({p.shape[1] for p in parts}) != 1:  # nothing yet, or workers mid-way through a width change
            return np.zeros((0, 1), np.float32)
        return np.concatenate(parts)

    def render(self) -> str:
        """The drift gauges in Prometheus text format, computed now."""
        self.flush()
        ref = self.reference()
        dense, raw = self._window(self.features), self._window(self.raw)
        m = f'model_name="{esc(self.model_name)}"'
        series = []
        if ref is not None and len(dense) >= MIN_ROWS and dense.shape[1] == ref.width + 1:
            for j, (name, (edges, shares)) in enumerate(zip(ref.names, ref.features, strict=True)):
                series.append((name, _psi_of(dense[:, j], edges, shares)))
        if (
            ref is not None
            and len(raw) >= MIN_ROWS
            and raw.shape[1] == len(ref.raw_numeric) + len(ref.raw_categorical) + 1
        ):
            for j, (name, edges, shares) in enumerate(ref.raw_numeric):
                series.append((RAW_PREFIX + name, _psi_of(raw[:, j], edges, shares)))
            base = len(ref.raw_numeric)
            for j, (name, _, shares) in enumerate(ref.raw_categorical):
                counts = np.bincount(raw[:, base + j].astype(np.int64), minlength=len(shares))
                series.append((RAW_PREFIX + name, psi(counts, shares)))
        scores = np.concatenate(
            [w[:, -1] for w in (dense, raw) if len(w) and w.shape[1] > 1] or [np.zeros(0)]
        )
        lines = [
            "# HELP ctr_serving_drift_window_rows Recent scored rows the drift figures cover (all workers).",
            "# TYPE ctr_serving_drift_window_rows gauge",
            *([f"ctr_serving_drift_window_rows{{{m}}} {len(scores)}"] if ref is not None else []),
            "# HELP ctr_serving_feature_drift_psi Population stability index of a model-input feature (raw:* a raw "
            "field) over recent rows against the training reference of the newest loaded version.",
            "# TYPE ctr_serving_feature_drift_psi gauge",
            *(
                f'ctr_serving_feature_drift_psi{{{m},feature="{esc(name)}"}} {value:.6g}'
                for name, value in series
            ),
            "# HELP ctr_serving_score_drift_psi Population stability index of the predicted CTR: recent scores "
            "against the validation scores of the newest loaded version.",
            "# TYPE ctr_serving_score_drift_psi gauge",
        ]
        if ref is not None and len(scores) >= MIN_ROWS:
            lines.append(f"ctr_serving_score_drift_psi{{{m}}} {_psi_of(scores, *ref.score):.6g}")
        return "\n".join(lines) + "\n"


def _psi_of(values: np.ndarray, edges: np.ndarray, shares: np.ndarray) -> float:
    counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(shares))
    return psi(counts, shares)
