"""From the Parquet cache to model-ready arrays: split by row id, fit the FeatureSpec on train, transform."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from training.features import FeatureSpec
from training.hashing import StringColumn
from training.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from training.split import validation_mask

_TRANSFORM_ROWS = 1 << 18  # rows transformed at a time: bounds the temporary float64 arrays


@dataclass
class PreparedData:
    """Features float32 [N, width], labels float32 [N], and source row ids int64 [N] for each split."""

    spec: FeatureSpec
    train_x: np.ndarray
    train_y: np.ndarray
    train_ids: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    val_ids: np.ndarray


def string_column(arr: pa.Array | pa.ChunkedArray) -> StringColumn:
    """Arrow strings -> (bytes, offsets) without a Python object per value; nulls become ''."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], pa.string())
    arr = pc.fill_null(arr, "").cast(pa.large_string())
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, offsets


def numeric_matrix(table: pa.Table) -> np.ndarray:
    """I1..I13 as float64 [N, 13], NaN where missing."""
    cols = [table.column(f).to_numpy(zero_copy_only=False) for f in NUMERIC_FIELDS]
    return np.stack(cols, axis=1).astype(np.float64) if cols and len(table) else np.zeros((len(table), 13))


def transform_table(spec: FeatureSpec, table: pa.Table) -> np.ndarray:
    """Apply the spec to a cache table in slices; float32 [N, width]."""
    out = np.empty((len(table), spec.width), dtype=np.float32)
    for start in range(0, len(table), _TRANSFORM_ROWS):
        part = table.slice(start, _TRANSFORM_ROWS)
        cats = [string_column(part.column(f)) for f in CATEGORICAL_FIELDS]
        out[start : start + len(part)] = spec.transform(numeric_matrix(part), cats)
    return out


def prepare(cache: Path, val_fraction: float, width: int, max_rows: int | None = None) -> PreparedData:
    """Read the cache, split it, fit the spec on the training rows only, and transform both splits.

    Args:
        cache: Parquet file written by `training.cache.ensure_cache`.
        val_fraction: validation share (see `training.split`).
        width: feature vector width.
        max_rows: use only the first rows of the file (quick experiments); None for all.
    """
    table = pq.read_table(cache)
    if max_rows is not None:
        table = table.slice(0, max_rows)
    ids = table.column("row_id").to_numpy()
    is_val = validation_mask(ids, val_fraction)
    train, val = table.filter(pa.array(~is_val)), table.filter(pa.array(is_val))
    if len(train) == 0 or len(val) == 0:
        raise ValueError(
            f"{cache}: {len(table)} rows give {len(train)} training and {len(val)} validation rows; need both"
        )

    def labels(t: pa.Table) -> np.ndarray:
        return t.column(LABEL).to_numpy().astype(np.float32)

    train_y = labels(train)
    train_cats = [string_column(train.column(f)) for f in CATEGORICAL_FIELDS]
    spec = FeatureSpec.fit(numeric_matrix(train), train_cats, train_y, width=width)
    del train_cats

    return PreparedData(
        spec=spec,
        train_x=transform_table(spec, train),
        train_y=train_y,
        train_ids=train.column("row_id").to_numpy(),
        val_x=transform_table(spec, val),
        val_y=labels(val),
        val_ids=val.column("row_id").to_numpy(),
    )
