"""Ranking and calibration metrics in numpy: exact AUC (ties averaged) and log loss."""

from __future__ import annotations

import numpy as np

_EPS = 1e-7


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


def log_loss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities, clipped away from 0 and 1."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), _EPS, 1.0 - _EPS)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
