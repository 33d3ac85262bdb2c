"""The FeatureSpec's fit: its defaults, and mergeable per-chunk statistics, identical on one chunk or many.

`FeatureSpec.fit` needs, per numeric field, the count, the sum and (given the mean) the sum of squared
deviations of signed_log1p(x); per categorical field, the views and clicks of each value (from which
`ctr_features.vocabulary.fit_field_table` builds the vocabulary and the rate table); and the click rate.
Counts and 0/1 click sums are exact integers, so they merge in any order. numpy sums a [N, 13] array along
axis 0 one row after another, so carrying the running sum in as row 0 of the next chunk reproduces the
in-memory sum bit for bit. The squared deviations need the final mean: a second pass over the numeric
columns only. Memory is the value counts of the distinct values seen (~24 bytes each), never the rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS
from ctr_features.hashing import StringColumn
from ctr_features.layout import HASH_START, N_CAT, N_NUM, categorical_values, signed_log1p
from ctr_features.vocabulary import fit_field_table, value_counts

# The fit's defaults, one home: FeatureSpec's fields, `FeatureSpec.fit` and `fit_parameters` all read these.
CLIP = 10.0  # z-scores are clipped to +-CLIP
MIN_COUNT = 1000  # views before a value gets a click-rate lift (a high count keeps a row's label out of it)
SMOOTHING = 100.0  # pseudo-views of the prior in each click rate
MAX_ENTRIES = 10_000  # rate-table entries per field
VOCAB_SIZE = 10_000  # per field; bounds feature_spec.json and the serving graphs' lookup tables
VOCAB_MIN_COUNT = 5  # views before a value enters its field's vocabulary

Counts = tuple[np.ndarray, np.ndarray, np.ndarray]  # sorted distinct values, views int64, clicks float64

# (numeric float [n, 13] with NaN where missing, 26 StringColumns or None on the numeric-only pass, labels [n])
FitChunk = tuple[np.ndarray, Sequence[StringColumn] | None, np.ndarray]
_MERGE_EVERY = 8  # chunks' value counts held per field before they are merged into the running counts


def merge_value_counts(parts: list[Counts]) -> Counts:
    """The `value_counts` of the union of several chunks (exact: views and clicks are integers)."""
    if len(parts) == 1:
        return parts[0]
    values, inverse = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    views = np.bincount(inverse, weights=np.concatenate([p[1] for p in parts]), minlength=values.size)
    clicks = np.bincount(inverse, weights=np.concatenate([p[2] for p in parts]), minlength=values.size)
    return values, views.astype(np.int64), clicks


def carry_sum(total: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """total + rows summed down axis 0, in the same order as one `sum(axis=0)` over all rows would."""
    return np.concatenate([total[None, :], rows]).sum(axis=0)


class SpecStats:
    """First-pass statistics: rows, clicks, per numeric field count and sum, per categorical field value counts."""

    def __init__(self) -> None:
        self.rows = 0
        self.clicks = 0.0
        self.count = np.zeros(N_NUM, dtype=np.int64)
        self.sum = np.zeros(N_NUM)
        self._pending: list[list[Counts]] = [[] for _ in range(N_CAT)]

    def add(self, numeric: np.ndarray, categorical: Sequence[StringColumn], labels: np.ndarray) -> None:
        y = np.asarray(labels, dtype=np.float64).reshape(-1)
        v = signed_log1p(np.asarray(numeric, dtype=np.float64))
        present = np.isfinite(v)
        self.rows += y.size
        self.clicks += float(y.sum())  # 0/1 labels: an exact integer
        self.count += present.sum(axis=0)
        self.sum = carry_sum(self.sum, np.where(present, v, 0.0))
        for j, values in enumerate(categorical_values(categorical, y.size)):
            counts = value_counts(values, y)
            self._pending[j].append(counts)
            if len(self._pending[j]) >= _MERGE_EVERY:
                self._pending[j] = [merge_value_counts(self._pending[j])]

    def value_counts(self, field: int) -> Counts:
        """Sorted distinct values, views and clicks of one categorical field over every row added."""
        parts = self._pending[field]
        if not parts:
            return np.zeros(0, "S1"), np.zeros(0, np.int64), np.zeros(0)
        return merge_value_counts(parts)

    @property
    def mean(self) -> np.ndarray:
        return np.divide(self.sum, self.count, out=np.zeros(N_NUM), where=self.count > 0)


def fit_parameters(
    chunks: Callable[[bool], Iterable[FitChunk]],
    width: int,
    min_count: int = MIN_COUNT,
    smoothing: float = SMOOTHING,
    max_entries: int = MAX_ENTRIES,
    vocab_size: int = VOCAB_SIZE,
    vocab_min_count: int = VOCAB_MIN_COUNT,
) -> dict[str, Any]:
    """The FeatureSpec's fields fitted on training rows that arrive in chunks (`FeatureSpec.fit_streaming`).

    Args:
        chunks: called twice, with numeric_only False then True; each call yields the training rows in the
            same order (the second pass may pass None for the categorical columns).
        width: output width; columns from HASH_START on are vocabulary buckets and the out-of-vocabulary count.
        min_count / smoothing / max_entries: rate table settings (see `ctr_features.vocabulary`).
        vocab_size / vocab_min_count: per-field vocabulary bounds.
    Returns:
        The keyword arguments of `FeatureSpec` (mean, std, tables, prior, width, clip and the settings kept).
    """
    stats = SpecStats()
    for numeric, categorical, labels in chunks(False):
        assert categorical is not None, "the first pass needs the categorical columns"
        stats.add(numeric, categorical, labels)
    mean = stats.mean
    sq = np.zeros(N_NUM)
    for numeric, _, _ in chunks(True):
        v = signed_log1p(np.asarray(numeric, dtype=np.float64))
        sq = carry_sum(sq, np.where(np.isfinite(v), (v - mean) ** 2, 0.0))
    return assemble_spec(
        stats.rows,
        stats.clicks,
        stats.count,
        mean,
        sq,
        stats.value_counts,
        width,
        min_count,
        smoothing,
        max_entries,
        vocab_size,
        vocab_min_count,
    )


def assemble_spec(
    rows: int,
    clicks: float,
    count: np.ndarray,
    mean: np.ndarray,
    sq: np.ndarray,
    field_counts: Callable[[int], Counts],
    width: int,
    min_count: int,
    smoothing: float,
    max_entries: int,
    vocab_size: int,
    vocab_min_count: int,
) -> dict[str, Any]:
    """`FeatureSpec`'s keyword arguments from the fit's statistics: rows, clicks, per numeric field count, mean
    and summed squared deviations, and `field_counts(j)`, field j's value counts (values sorted)."""
    std = np.sqrt(np.divide(sq, count, out=np.ones(N_NUM), where=count > 0))
    std = np.where(std > 1e-6, std, 1.0)  # constant or absent column: centre only
    prior = float(np.clip(np.float64(clicks) / rows, 1e-4, 1 - 1e-4)) if rows else 0.5
    n_buckets = width - HASH_START - 1
    tables = tuple(
        fit_field_table(
            field,
            *field_counts(j),
            prior,
            n_buckets,
            vocab_size,
            vocab_min_count,
            min_count,
            smoothing,
            max_entries,
        )
        for j, field in enumerate(CATEGORICAL_FIELDS)
    )
    return {
        "mean": tuple(map(float, mean)),
        "std": tuple(map(float, std)),
        "tables": tables,
        "prior": prior,
        "width": width,
        "clip": CLIP,
        "min_count": min_count,
        "smoothing": smoothing,
        "vocab_size": vocab_size,
        "vocab_min_count": vocab_min_count,
    }
