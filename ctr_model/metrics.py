"""Ranking and calibration metrics in numpy: exact AUC (ties averaged) and its DeLong variance, log loss, ECE,
the calibration ratio and the field-level calibration error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

_EPS = 1e-7
ECE_BINS = 10


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve via the Mann–Whitney U statistic, with tied scores sharing their rank.

    Args:
        labels: 0/1 array, shape (N,).
        scores: any monotone score (probability or logit), shape (N,).
    """
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes, got {n_pos} positives and {n_neg} negatives")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Average rank (1-based) for each run of tied scores.
    boundaries = np.flatnonzero(np.diff(sorted_s)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [s.size]))
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    boundaries = np.flatnonzero(np.diff(sorted_x)) + 1
    starts = np.concatenate(([0], boundaries))
    ends = np.concatenate((boundaries, [x.size]))
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def delong_auc(labels: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """(AUC, its variance) by DeLong, DeLong & Clarke-Pearson (1988), in O(N log N) from midranks.

    With m positives X and n negatives Y, each positive's structural component is the share of negatives it
    outscores (ties count half), V10_i = (rank of X_i among all - rank among positives) / n, and each
    negative's V01_j = 1 - (rank of Y_j among all - rank among negatives) / m; AUC = mean(V10) and
    var(AUC) = var(V10) / m + var(V01) / n (sample variances). The AUCs of two versions scored on different
    requests are independent: the variance of their difference is the sum of the two variances.

    Raises ValueError on a length mismatch or a class with fewer than two rows.
    """
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    m = int(y.sum())
    n = y.size - m
    if m < 2 or n < 2:
        raise ValueError(
            f"the DeLong variance needs two rows of each class, got {m} positives and {n} negatives"
        )
    every = _midranks(s)
    v10 = (every[y] - _midranks(s[y])) / n
    v01 = 1.0 - (every[~y] - _midranks(s[~y])) / m
    return float(v10.mean()), float(v10.var(ddof=1) / m + v01.var(ddof=1) / n)


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities, clipped away from 0 and 1."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), _EPS, 1.0 - _EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


def expected_calibration_error(labels: np.ndarray, probs: np.ndarray, bins: int = ECE_BINS) -> float:
    """Row-weighted mean |mean(prob) - mean(label)| over `bins` equal-size bins of rows sorted by prob."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    _same_rows(y, p, "ECE")
    order = np.argsort(p, kind="mergesort")
    gaps = [
        abs(float(p[part].mean()) - float(y[part].mean())) * len(part)
        for part in np.array_split(order, bins)
        if len(part)
    ]
    return float(sum(gaps) / len(p))


def calibration_ratio(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean predicted ÷ observed click rate (1 = calibrated; Facebook's expected/observed clicks).

    With no clicks observed it is inf when something was predicted and NaN when nothing was (0/0).
    Raises ValueError on no rows or a length mismatch.
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    _same_rows(y, p, "the calibration ratio")
    predicted, observed = float(p.mean()), float(y.mean())
    if observed == 0.0:
        return float("nan") if predicted == 0.0 else float("inf")
    return predicted / observed


def field_calibration_error(
    labels: np.ndarray,
    probs: np.ndarray,
    categorical: np.ndarray,
    fields: Sequence[str],
    top: int = 10,
    min_rows: int = 50,
) -> dict[str, Any]:
    """The worst field's calibration error over its most frequent values.

    For each field (a column of `categorical`), its `top` values by row count that have at least `min_rows`
    rows; per value the gap |mean prob - mean label|; the field's error is the row-weighted mean gap.

    Args:
        labels, probs: (N,) clicks and predicted probabilities.
        categorical: (N, len(fields)) raw values of any dtype (None counts as the empty string).
        fields: the column names, e.g. ctr_contract.schema.CATEGORICAL_FIELDS.
    Returns:
        {"field", "value_error", "worst_value" (the field's value with the largest gap), "rows" (the rows of
        the values measured)} of the field with the largest error.
    Raises:
        ValueError: on mismatched shapes, or when no field has a value with `min_rows` rows.
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(probs, dtype=np.float64).reshape(-1)
    _same_rows(y, p, "the field calibration error")
    cat = np.asarray(categorical)
    if cat.ndim != 2 or cat.shape != (len(y), len(fields)):
        raise ValueError(f"categorical must be (rows, fields) = ({len(y)}, {len(fields)}), got {cat.shape}")
    if top < 1 or min_rows < 1:
        raise ValueError(f"top and min_rows must be >= 1, got top={top}, min_rows={min_rows}")
    worst: dict[str, Any] | None = None
    largest = 0
    for j, field in enumerate(fields):
        col = cat[:, j]
        if col.dtype == object:
            col = np.asarray(["" if v is None else str(v) for v in col.tolist()])
        values, inverse, counts = np.unique(col, return_inverse=True, return_counts=True)
        largest = max(largest, int(counts.max()))
        chosen = [k for k in np.argsort(-counts, kind="stable")[:top] if counts[k] >= min_rows]
        if not chosen:
            continue
        n = counts[chosen].astype(np.float64)
        gaps = np.abs(
            np.bincount(inverse, weights=p)[chosen] / n - np.bincount(inverse, weights=y)[chosen] / n
        )
        error = float((gaps * n).sum() / n.sum())
        if worst is None or error > worst["value_error"]:
            value = values[chosen[int(np.argmax(gaps))]]
            worst = {"field": field, "value_error": error, "worst_value": str(value), "rows": int(n.sum())}
    if worst is None:
        raise ValueError(
            f"no categorical field has a value with {min_rows} rows among {len(y)} rows "
            f"(the most frequent value has {largest}); the field calibration error needs more rows"
        )
    return worst


def _same_rows(y: np.ndarray, p: np.ndarray, what: str) -> None:
    if y.shape != p.shape:
        raise ValueError(f"labels and probabilities differ in length: {y.shape[0]} vs {p.shape[0]}")
    if y.size == 0:
        raise ValueError(f"{what} needs at least one row, got none")
