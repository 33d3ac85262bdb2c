"""Negative downsampling (`--negative-sample-rate w`): every positive and a fraction w of the training negatives.

A negative training row is kept when a 64-bit hash of (its global row id, the run's seed) falls below w; a
positive always is. The decision is the row's own: it depends on nothing else (no global sort, no random
stream), so every DDP rank, every loader and a resumed run keep the same rows, and a row's fate does not
change with `--val-fraction`, `--max-rows` or the files after it. The hash is splitmix64, not the split's fmix32
(`ctr_features.data.split`), so the kept negatives are independent of which rows went to validation.

Only the training split is sampled: validation and everything export reads (val_features.npy, val_labels.npy,
the drift sample of training rows) keep all rows, so a run's validation figures and export's calibration see
the data as it is served. The preparation (Parquet caches, spec, encoded records) is the same at every w: the
sampling happens after it, in the loaders, which is why no cache is keyed by w.

The loaders need each row group's kept count before an epoch starts (DDP needs every rank's exact batch count),
so `kept_rows` reads the label and row id of every training row once, at the start of a run; what it keeps is
one bit a training row and one count a row group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctr_contract.schema import LABEL
from training.data.parquet import ParquetData, Piece

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): a well-mixed bijection."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def check_rate(rate: float) -> None:
    """Raise ValueError unless 0 < rate <= 1."""
    if not (isinstance(rate, int | float) and math.isfinite(rate) and 0 < rate <= 1):
        raise ValueError(f"negative sample rate must be in (0, 1], got {rate!r}")


def keep_mask(row_ids: np.ndarray, labels: np.ndarray, rate: float, seed: int) -> np.ndarray:
    """True for the rows kept: every positive, and a negative when hash(row id, seed) < rate.

    Args:
        row_ids: int64 global row ids (N,).
        labels: 0/1 labels (N,).
        rate: w in (0, 1].
        seed: the run's `--seed`.
    Returns:
        bool (N,).
    """
    check_rate(rate)
    ids = np.asarray(row_ids, dtype=np.int64).astype(np.uint64)
    salt = _splitmix64(np.array([seed], dtype=np.int64).astype(np.uint64))[0]
    u = _splitmix64(ids ^ salt) >> np.uint64(11)  # 53 uniform bits
    return (np.asarray(labels) > 0) | (u < np.uint64(round(rate * 2**53)))


@dataclass(frozen=True)
class KeptRows:
    """The training rows a run at rate w < 1 trains on, in training-split order (the records' `index`)."""

    rate: float
    seed: int
    total: int  # rows in the training split
    bits: np.ndarray  # uint8: np.packbits of the keep mask over the split's rows
    piece_counts: np.ndarray  # int64: kept rows of each piece, in `ParquetData.pieces` order
    positives: int
    negatives: int
    negatives_kept: int

    @property
    def rows(self) -> int:
        return self.positives + self.negatives_kept

    def _mask(self, start: int, stop: int) -> np.ndarray:
        lo = start // 8
        unpacked = np.unpackbits(self.bits[lo : -(-stop // 8)])
        return unpacked[start - lo * 8 : stop - lo * 8].astype(bool)

    def records(self, start: int, stop: int) -> np.ndarray:
        """Split indices of the kept rows in [start, stop), ascending (int64)."""
        return start + np.flatnonzero(self._mask(start, stop)).astype(np.int64)

    def offsets(self, piece: Piece) -> np.ndarray:
        """Positions, within `piece`'s training rows, of those kept (int64, ascending)."""
        return np.flatnonzero(self._mask(piece.train_start, piece.train_start + piece.train_rows)).astype(
            np.int64
        )

    def indices(self) -> np.ndarray:
        """Split indices of every kept row (the memory loader's rows)."""
        return self.records(0, self.total)

    def summary(self) -> dict[str, Any]:
        """The figures metrics.json records."""
        return {
            "rate": self.rate,
            "seed": self.seed,
            "train_rows": self.total,
            "rows_kept": self.rows,
            "positives": self.positives,
            "negatives": self.negatives,
            "negatives_kept": self.negatives_kept,
        }

    def line(self) -> str:
        """One line for the run's output."""
        return (
            f"negative sampling: rate {self.rate:g} (seed {self.seed}): training on {self.rows:,} of "
            f"{self.total:,} training rows: all {self.positives:,} positives, {self.negatives_kept:,} of "
            f"{self.negatives:,} negatives ({self.negatives_kept / max(self.negatives, 1):.3f}); "
            "validation keeps all its rows"
        )


def kept_rows(data: ParquetData, rate: float, seed: int) -> KeptRows | None:
    """The rows kept at `rate`, or None at rate 1 (every row; the loaders then take their unsampled path)."""
    check_rate(rate)
    if rate == 1:
        return None
    masks, counts, positives, negatives = [], [], 0, 0
    for piece in data.pieces:
        if not piece.train_rows:
            counts.append(0)
            continue
        chunk = data.read(piece, "train", (LABEL,))
        y = chunk.table.column(LABEL).to_numpy()
        mask = keep_mask(chunk.ids, y, rate, seed)
        masks.append(mask)
        counts.append(int(mask.sum()))
        p = int(np.count_nonzero(y))
        positives, negatives = positives + p, negatives + len(y) - p
    mask = np.concatenate(masks) if masks else np.zeros(0, bool)
    kept = int(mask.sum())
    return KeptRows(
        rate,
        seed,
        len(mask),
        np.packbits(mask),
        np.array(counts, dtype=np.int64),
        positives,
        negatives,
        kept - positives,
    )
