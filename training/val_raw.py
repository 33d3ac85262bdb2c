"""The first validation rows as raw Criteo fields (`val_raw.npz`): export's raw-signature parity rows.

`val_features.npy` holds the same rows after `FeatureSpec.transform`; export replays the raw ones through the
Python path, the ONNX raw graph and the SavedModel's `raw` signature (see export/raw_parity.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from ctr_contract.schema import CATEGORICAL_FIELDS
from training.stream import ParquetData, numeric_matrix


def first_val_rows(
    files: list[Path], val_fraction: float, max_rows: int | None, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """The first `n` validation rows in file order: numeric float64 [n, 13] (NaN = missing), categorical str [n, 26] ("" = missing)."""
    data = ParquetData.open(files, val_fraction, max_rows)
    numeric, categorical, left = [], [], n
    for piece in data.pieces:
        if left <= 0:
            break
        if piece.val_rows:
            table = data.read(piece, "val").table.slice(0, left)
            numeric.append(numeric_matrix(table))
            cols = [
                pc.fill_null(table.column(f), "").to_numpy(zero_copy_only=False) for f in CATEGORICAL_FIELDS
            ]
            categorical.append(np.stack(cols, axis=1).astype(str) if len(table) else np.zeros((0, 26), str))
            left -= len(table)
    if not numeric:
        return np.zeros((0, 13)), np.zeros((0, 26), str)
    return np.concatenate(numeric), np.concatenate(categorical)


def save_val_raw(path: Path, numeric: np.ndarray, categorical: np.ndarray) -> None:
    """Write `numeric` float64 [V, 13] and `categorical` unicode [V, 26] as an .npz (no pickled objects)."""
    np.savez(path, numeric=numeric.astype(np.float64), categorical=categorical.astype(str))
