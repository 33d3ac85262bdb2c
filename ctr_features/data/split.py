"""The train/validation split, shared by training and the synthetic generator's oracle.

A row belongs to validation when a fixed integer hash of its row id (0-based index of the data row in the
source file) falls below `val_fraction`. The split depends on nothing but the row id, so it is stable
across runs, seeds, caches and skipped bad rows, and the generator can score its oracle on exactly the
rows training validates on.
"""

from __future__ import annotations

import numpy as np

DEFAULT_VAL_FRACTION = 0.1
_RESOLUTION = 1 << 20


def fmix32(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser: a cheap, well-mixed bijection on uint32."""
    h = np.asarray(x).astype(np.uint32, copy=True)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def validation_mask(row_ids: np.ndarray, val_fraction: float = DEFAULT_VAL_FRACTION) -> np.ndarray:
    """Boolean mask, True where the row with this id is a validation row.

    Args:
        row_ids: int array of 0-based data-row ids (any shape).
        val_fraction: share of rows held out, in (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    ids = np.asarray(row_ids, dtype=np.int64)
    # Mix both halves of the id so ids beyond 2**32 do not repeat the pattern.
    mixed = fmix32((ids & 0xFFFFFFFF).astype(np.uint32) ^ fmix32((ids >> 32).astype(np.uint32)))
    return (mixed % np.uint32(_RESOLUTION)) < np.uint32(round(val_fraction * _RESOLUTION))
