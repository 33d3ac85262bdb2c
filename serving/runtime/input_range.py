"""Who is at fault for a non-finite output: an input far outside what the model saw in training, or the model.

Each version may carry `assets.extra/feature_ranges.json` (export/publish/feature_ranges.py): the (min, max) of
every model-input feature over the training rows. It is read with the version and consulted only when a
model's output is not finite (serving/dataplane/output_check.py), so the normal path pays nothing for it.

A value is *far outside* its feature's range when it lies beyond the range by more than `RANGE_FACTOR` times
the range's magnitude, max(|min|, |max|, 1): for a z-score seen in [-3, 5] that is beyond +-5,005. Then the
non-finite output is the client's doing (400, naming the instance, the feature, its value and the range). A
non-finite output from inputs within that margin stays the server's failure (500, counted and alerted).
A version without the file (exported before it existed), or with one that does not read, has the check off;
its load says so once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from ctr_contract.repository import FEATURE_RANGES_PATH
from serving.errors import InvalidArgument

log = logging.getLogger(__name__)
RANGE_FACTOR = 1000.0


class FeatureRanges:
    """The training range of each feature column, and the margin beyond which a value is far outside."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, names: list[str]) -> None:
        self.lo, self.hi, self.names = lo, hi, names
        magnitude = np.maximum(np.maximum(np.abs(lo), np.abs(hi)), 1.0)
        self.below, self.above = lo - RANGE_FACTOR * magnitude, hi + RANGE_FACTOR * magnitude

    @classmethod
    def load(cls, version_dir: Path, width: int) -> FeatureRanges | None:
        """The ranges of a version for its `width` features; None (logged) when the version has none."""
        path = version_dir / FEATURE_RANGES_PATH
        if not path.is_file():
            log.warning(
                "%s has no %s (exported before ranges were recorded): a non-finite output is a 500 whatever "
                "the input for this version",
                version_dir,
                FEATURE_RANGES_PATH,
            )
            return None
        try:
            features = json.loads(path.read_text())["features"]
            lo = np.array([float(f["min"]) for f in features], np.float64)
            hi = np.array([float(f["max"]) for f in features], np.float64)
            names = [str(f.get("name", "")) for f in features]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s: %r; the input range check is off for this version", path, exc)
            return None
        if len(lo) != width or not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo <= hi).all()):
            log.warning(
                "ignoring %s: %d features, expected %d with finite min <= max; the input range check is off "
                "for this version",
                path,
                len(lo),
                width,
            )
            return None
        return cls(lo, hi, names)

    def explain(
        self, features: np.ndarray, bad_rows: np.ndarray, scores: np.ndarray, unit: str
    ) -> InvalidArgument | None:
        """The 400 for a batch whose non-finite rows (`bad_rows`, a mask) all hold a far-outside value, else None.

        Args:
            features: the request's (N, F) float32 features.
            bad_rows: (N,) bool, the rows whose output is not finite.
            scores: the (N, K) outputs, for the message.
            unit: "instance" (REST) or "row" (gRPC).
        """
        rows = features[bad_rows].astype(np.float64)
        far = (rows < self.below) | (rows > self.above)
        if not far.any(axis=1).all():  # some non-finite output came from inputs the model should handle
            return None
        row = int(np.flatnonzero(bad_rows)[0])
        col = int(np.argmax(far[0]))
        value = float(features[row, col])
        name = f" ('{self.names[col]}')" if self.names[col] else ""
        score = scores.reshape(len(scores), -1)[row]
        shown = score[~np.isfinite(score)][0]
        return InvalidArgument(
            f"{unit} {row} feature {col}{name} is {value:g}, far outside the range seen in training "
            f"[{self.lo[col]:g}, {self.hi[col]:g}] (beyond it by more than {RANGE_FACTOR:g} times its magnitude), "
            f"and the model's output for it is {shown} (not finite; {int(bad_rows.sum())} of {len(features)} "
            f"{unit}s); no prediction is returned: send features transformed as in training (the version's "
            "feature_spec.json), or raw fields to the raw signature"
        )
