"""The sliding window of joined intervals and the figures of each (model, version, label) over it.

The window keeps, per interval, three arrays of its joined rows: the row's key (an index into the window's key
table), its logged score and its click label; nothing else of a row is held, so memory grows with the window's
rows (13 bytes a row), never with history. Rows without a logged score are not kept (they cannot be scored).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from ctr_contract.schema import LABEL
from ctr_model.metrics import delong_auc, log_loss
from pipelines.clicks.join import partition_name

PARTS = ("train", "holdout", "shadow")  # the join's partitions; a row is in exactly one
COLUMNS = [LABEL, "model", "version", "version_label", "score"]
NO_LABEL = "none"  # the key's label for rows routed to the latest or an explicit version

Key = tuple[str, int | None, str]  # (model, version, label)


@dataclass(frozen=True)
class Part:
    """One interval's joined rows, as the window keeps them."""

    keys: np.ndarray  # int32 indices into the window's key table
    scores: np.ndarray  # float64
    labels: np.ndarray  # int8

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.scores.nbytes + self.labels.nbytes)


class Window:
    """The joined rows of the last `size` intervals, by interval."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the window must hold at least one interval, got {size}")
        self.size = size
        self.parts: OrderedDict[int, Part] = OrderedDict()
        self.key_table: list[Key] = []
        self._index: dict[Key, int] = {}

    def key(self, k: Key) -> int:
        if k not in self._index:
            self._index[k] = len(self.key_table)
            self.key_table.append(k)
        return self._index[k]

    def load(self, joined: Path, interval: int) -> Part:
        """Read interval `interval`'s partitions under `joined` (none: no rows) into the window."""
        keys: list[np.ndarray] = []
        scores: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for name in PARTS:
            path = joined / name / partition_name(interval)
            if not path.is_file():
                continue
            t = pq.read_table(path, columns=COLUMNS).to_pydict()
            score = np.array([np.nan if v is None else v for v in t["score"]], dtype=np.float64)
            keep = np.isfinite(score)
            rows = zip(t["model"], t["version"], t["version_label"], strict=True)
            ids = [self.key((m or "unknown", v, lab or NO_LABEL)) for m, v, lab in rows]
            keys.append(np.asarray(ids, dtype=np.int32)[keep])
            scores.append(score[keep])
            labels.append(np.asarray(t[LABEL], dtype=np.int8)[keep])
        part = Part(
            np.concatenate(keys) if keys else np.zeros(0, np.int32),
            np.concatenate(scores) if scores else np.zeros(0, np.float64),
            np.concatenate(labels) if labels else np.zeros(0, np.int8),
        )
        self.add(interval, part)
        return part

    def add(self, interval: int, part: Part) -> None:
        """Add an interval; intervals that fall out of the last `size` are dropped."""
        self.parts[interval] = part
        while self.parts and next(iter(self.parts)) <= interval - self.size:
            self.parts.popitem(last=False)

    @property
    def rows(self) -> int:
        return sum(len(p.keys) for p in self.parts.values())

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts.values())

    def figures(self, min_rows: int, pending: dict[Key, int] | None = None) -> list[dict[str, Any]]:
        """The figures of every key with rows in the window or pending rows, sorted by key."""
        pending = pending or {}
        parts = list(self.parts.values())
        keys = np.concatenate([p.keys for p in parts]) if parts else np.zeros(0, np.int32)
        scores = np.concatenate([p.scores for p in parts]) if parts else np.zeros(0)
        labels = np.concatenate([p.labels for p in parts]) if parts else np.zeros(0, np.int8)
        order = np.argsort(keys, kind="stable")
        bounds = np.searchsorted(keys[order], np.arange(len(self.key_table) + 1))
        out: dict[Key, dict[str, Any]] = {}
        for i, k in enumerate(self.key_table):
            rows = order[bounds[i] : bounds[i + 1]]
            if len(rows):
                out[k] = figures(k, labels[rows], scores[rows], min_rows, pending.get(k, 0))
        for k, n in pending.items():
            if k not in out:
                out[k] = figures(k, np.zeros(0, np.int8), np.zeros(0), min_rows, n)
        return [out[k] for k in sorted(out, key=_sort_key)]


def _sort_key(k: Key) -> tuple[str, int, str]:
    return (k[0], -1 if k[1] is None else k[1], k[2])


def entropy(rate: float) -> float:
    """The binary entropy (nats) of a click rate: the log loss of always predicting the base rate."""
    if not 0.0 < rate < 1.0:
        return 0.0
    return -(rate * math.log(rate) + (1.0 - rate) * math.log1p(-rate))


def figures(k: Key, labels: np.ndarray, scores: np.ndarray, min_rows: int, pending: int) -> dict[str, Any]:
    """One key's figures; AUC, its variance, log loss, NE and the calibration ratio are None below `min_rows`
    rows, and where they are undefined (one class only: no AUC, no NE; no clicks: no ratio)."""
    rows, positives = len(labels), int(labels.sum())
    predicted = float(scores.sum())
    out: dict[str, Any] = {
        "model": k[0],
        "version": k[1],
        "label": k[2],
        "rows": rows,
        "positives": positives,
        "pending": pending,
        "auc": None,
        "auc_var": None,
        "logloss": None,
        "ne": None,
        "calibration_ratio": None,
        "predicted": predicted,
        "observed": positives,
    }
    if rows < max(min_rows, 1):
        return out
    if 2 <= positives <= rows - 2:
        out["auc"], out["auc_var"] = delong_auc(labels, scores)
    out["logloss"] = loss = log_loss(labels, scores)
    base = entropy(positives / rows)
    out["ne"] = loss / base if base > 0 else None
    out["calibration_ratio"] = predicted / positives if positives else None
    return out
