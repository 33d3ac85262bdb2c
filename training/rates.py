"""Click-rate encoding of categorical values, keyed by their stable hash (numpy only).

A 128-float input cannot one-hot 26 fields with up to millions of values each, and a hashing trick alone
lets frequent uninformative values drown the informative ones in shared buckets. So each field also gets
one column: the smoothed click log-odds of its value, relative to the overall rate, learnt on the
training split from values seen at least `min_count` times. Rare and unseen values get 0 (the prior).
A high `min_count` (default 1000) matters: a row's own label inside a small count leaks into its feature
and the model learns to trust noise fields (measured: min_count 20 cost 0.02 AUC on the synthetic data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RateTable:
    """One field's table: sorted uint32 value hashes and their log-odds lift, float64."""

    keys: np.ndarray
    lift: np.ndarray

    def lookup(self, hashes: np.ndarray) -> np.ndarray:
        """Lift per value hash, float64 [N]; 0.0 where the hash is not in the table."""
        if self.keys.size == 0:
            return np.zeros(hashes.shape[0])
        pos = np.minimum(np.searchsorted(self.keys, hashes), self.keys.size - 1)
        return np.where(self.keys[pos] == hashes, self.lift[pos], 0.0)

    def to_dict(self) -> dict[str, list[float] | list[int]]:
        return {"keys": self.keys.tolist(), "lift": self.lift.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, list]) -> RateTable:  # type: ignore[type-arg]
        keys = np.asarray(d["keys"], dtype=np.uint32)
        lift = np.asarray(d["lift"], dtype=np.float64)
        if keys.shape != lift.shape or np.any(np.diff(keys.astype(np.int64)) <= 0):
            raise ValueError(
                f"rate table needs strictly increasing keys and one lift per key, got {keys.size} keys, {lift.size} lifts"
            )
        if not np.all(np.isfinite(lift)):
            raise ValueError("rate table lifts must be finite")
        return cls(keys, lift)


def fit_rate_table(
    hashes: np.ndarray, labels: np.ndarray, prior: float, min_count: int, smoothing: float, max_entries: int
) -> RateTable:
    """Smoothed log-odds lift per frequent value.

    lift = log((clicks + a*p) / (views - clicks + a*(1-p))) - log(p / (1-p)), with a = `smoothing`, p = `prior`,
    kept for the `max_entries` most frequent values with at least `min_count` views.
    """
    keys, inverse, views = np.unique(hashes, return_inverse=True, return_counts=True)
    clicks = np.bincount(inverse, weights=labels, minlength=keys.size)
    keep = np.flatnonzero(views >= min_count)
    if keep.size > max_entries:
        keep = np.sort(keep[np.argsort(-views[keep], kind="stable")[:max_entries]])
    a = smoothing
    odds = (clicks[keep] + a * prior) / (views[keep] - clicks[keep] + a * (1.0 - prior))
    return RateTable(keys[keep].astype(np.uint32), np.log(odds) - np.log(prior / (1.0 - prior)))
