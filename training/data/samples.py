"""What a finished run reads back from its data for export: scored validation rows and capped samples.

The passes stream on the `stream` loader, so no step of a streamed run holds all rows of a split in memory.
`val_raw.npz` holds the first validation rows as raw Criteo fields: `val_features.npy` holds the same rows
after `FeatureSpec.transform`, and export replays the raw ones through the Python path, the ONNX raw graph
and the SavedModel's `raw` signature (see export/gates/raw_parity.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import torch

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL
from ctr_features.compiled.records import expand, numeric_matrix
from ctr_model.net import CTRNet
from training.data.feature_cache import iter_records, read_records
from training.data.parquet import ParquetData
from training.loader.inputs import RunInputs

_SCORE_ROWS = 1 << 16  # rows per forward pass when scoring the validation split


def score_val(inputs: RunInputs, net: CTRNet) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(click probabilities float64, labels float32, global row ids) of every validation row, file order."""
    if inputs.memory is not None:
        m = inputs.memory
        parts: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(
            [
                (
                    torch.from_numpy(m.val_x[s : s + _SCORE_ROWS]),
                    torch.from_numpy(m.val_y[s : s + _SCORE_ROWS]),
                )
                for s in range(0, len(m.val_y), _SCORE_ROWS)
            ]
        )
    else:
        records = iter_records(inputs.encoded["val"], inputs.rows("val"))
        parts = (expand(r, inputs.spec.width)[:2] for r in records)
    probs, labels = [], []
    with torch.no_grad():
        for x, y in parts:
            probs.append(net.predict_proba(x).squeeze(1).numpy())
            labels.append(y.reshape(-1).numpy())
    return np.concatenate(probs).astype(np.float64), np.concatenate(labels), val_ids(inputs.data)


def val_ids(data: ParquetData) -> np.ndarray:
    """Global row ids of the validation rows in file order (for the synthetic oracle)."""
    return np.concatenate([c.ids for c in data.chunks("val", (LABEL,))])


def samples(
    inputs: RunInputs, n: int, train_n: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first n validation rows (x, y) and train_n (default n) training rows spread over the data (every
    k-th row of the whole training split, negative sampling or not: the drift reference is the served traffic)."""
    train_n = n if train_n is None else train_n
    stride = max(1, inputs.rows("train") // train_n)
    if inputs.memory is not None:
        m = inputs.memory
        return m.val_x[:n], m.val_y[:n], m.train_x[::stride][:train_n]
    width = inputs.spec.width
    val_x, val_y, _ = expand(read_records(inputs.encoded["val"], 0, min(n, inputs.rows("val"))), width)
    picked = [
        r[(r["index"] % stride == 0) & (r["index"] // stride < train_n)]
        for r in iter_records(inputs.encoded["train"], inputs.rows("train"))
    ]
    train_x = expand(np.concatenate(picked), width)[0]
    return val_x.numpy(), val_y.reshape(-1).numpy(), train_x.numpy()


def first_val_rows(data: ParquetData, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first `n` validation rows in file order: numeric float64 [n, 13] (NaN = missing), categorical str [n, 26] ("" = missing)."""
    numeric, categorical, left = [], [], n
    for chunk in data.chunks("val") if n > 0 else ():
        table = chunk.table.slice(0, left)
        numeric.append(numeric_matrix(table))
        cols = [pc.fill_null(table.column(f), "").to_numpy(zero_copy_only=False) for f in CATEGORICAL_FIELDS]
        categorical.append(np.stack(cols, axis=1).astype(str) if len(table) else np.zeros((0, 26), str))
        left -= len(table)
        if left <= 0:  # before the generator reads the next row group
            break
    if not numeric:
        return np.zeros((0, 13)), np.zeros((0, 26), str)
    return np.concatenate(numeric), np.concatenate(categorical)


def save_val_raw(path: Path, numeric: np.ndarray, categorical: np.ndarray) -> None:
    """Write `numeric` float64 [V, 13] and `categorical` unicode [V, 26] as an .npz (no pickled objects)."""
    np.savez(path, numeric=numeric.astype(np.float64), categorical=categorical.astype(str))
