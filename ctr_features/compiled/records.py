"""Training's compiled form of the FeatureSpec: Arrow tables of Criteo rows -> fixed-size records.

The vocabulary transform costs about as much CPU per row as a training step, so training runs it once per
row, after the fit, and keeps each row as a record: the first HASH_START columns of its feature vector
(z-scores, missing flags, rate lifts; float32 exactly as `FeatureSpec.transform` makes them), the column each
categorical value adds 1.0 to (int16: a bucket or the out-of-vocabulary column), the label and the row's index
in its split. `expand` rebuilds the float32 [N, width] vectors bit for bit (1.0 counts add exactly).

Two encoders make the same records: `encode` runs `FeatureSpec.transform` (sorted-array searches), and
`encode_records` looks every distinct value of a chunk up once in Arrow hash sets (`pc.index_in`), with the
same numeric columns (`FeatureSpec.numeric_columns`), the same float64 lifts cast to float32 and the same
bucket columns: a value's lookup is exact byte equality in both. ctr_features/parity.py checks both against
the reference. Training's file I/O of records is in training/data/feature_cache.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.hashing import StringColumn
from ctr_features.layout import HASH_START, LIFT_START, N_CAT, N_NUM, categorical_values
from ctr_features.spec import FeatureSpec

if TYPE_CHECKING:  # torch is imported where records are expanded: `python -m training.prepare` never loads it
    import torch

RECORD = np.dtype(
    [("dense", "<f4", (HASH_START,)), ("cols", "<i2", (N_CAT,)), ("y", "<f4"), ("index", "<i8")]
)


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
    """I1..I13 as float64 [N, N_NUM], NaN where missing."""
    cols = [table.column(f).to_numpy(zero_copy_only=False) for f in NUMERIC_FIELDS]
    return np.stack(cols, axis=1).astype(np.float64) if cols and len(table) else np.zeros((len(table), N_NUM))


def dictionary_parts(column: pa.ChunkedArray | pa.Array) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """(distinct values as binary, index int64 [n] per row) of each chunk; a missing value is ''."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        values = chunk.dictionary.cast(pa.binary())
        index = chunk.indices
        if (
            index.null_count
        ):  # missing -> an extra '' entry (a duplicate value is fine: counts merge by value)
            index = index.fill_null(len(values))
            values = pa.concat_arrays([values, pa.array([b""], pa.binary())])
        yield values, index.to_numpy().astype(np.int64, copy=False)


def transform_chunk(spec: FeatureSpec, table: pa.Table) -> np.ndarray:
    """FeatureSpec over one Arrow table of Criteo columns; float32 [N, width]."""
    return spec.transform(numeric_matrix(table), [string_column(table.column(f)) for f in CATEGORICAL_FIELDS])


def encode(spec: FeatureSpec, table: pa.Table, index: np.ndarray) -> np.ndarray:
    """Records (see the module docstring) of the rows of `table`; index int64 [N] is their split index."""
    strings = [string_column(table.column(f)) for f in CATEGORICAL_FIELDS]  # converted once, used twice
    x = spec.transform(numeric_matrix(table), strings)
    rec = np.empty(len(table), RECORD)
    rec["dense"] = x[:, :HASH_START]
    values = categorical_values(strings, len(table))
    for j, (field_table, col) in enumerate(zip(spec.tables, values, strict=True)):
        bucket, _ = field_table.lookup(col)
        rec["cols"][:, j] = np.where(bucket >= 0, HASH_START + bucket, spec.oov_column)
    rec["y"] = table.column(LABEL).to_numpy()
    rec["index"] = index
    return rec


def expand(rec: np.ndarray, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Records -> (x float32 [N, width], y float32 [N, 1], index int64 [N])."""
    import torch

    n = rec.shape[0]
    x = torch.empty(n, width)
    # Record fields are strided views of the records, which torch reads as they are: no numpy copy first.
    x[:, :HASH_START] = torch.from_numpy(rec["dense"])
    x[:, HASH_START:].zero_()
    cols = torch.from_numpy(rec["cols"]).long()  # torch's conversion runs on its threads, numpy's on one
    # Each categorical field adds 1.0 to its column; the source is one broadcast 1.0, not an [N, 26] tensor.
    x.scatter_add_(1, cols, torch.ones(()).expand(n, N_CAT))
    y = torch.from_numpy(rec["y"]).reshape(-1, 1).clone()
    return x, y, torch.from_numpy(rec["index"]).clone()


@dataclass(frozen=True)
class FieldLookup:
    """One field's tables as Arrow value sets: vocabulary -> record column, rate values -> lift."""

    vocab: pa.Array
    column: np.ndarray  # int16: HASH_START + bucket of each vocabulary entry
    rate_values: pa.Array
    lift: np.ndarray  # float64, one per rate value


def lookups(spec: FeatureSpec) -> list[FieldLookup]:
    """Each field's `FieldLookup`, built once per spec."""
    return [
        FieldLookup(
            pa.array(list(t.vocab), pa.binary()),
            (HASH_START + t.bucket).astype(np.int16),
            pa.array(list(t.rate_values), pa.binary()),
            np.asarray(t.lift, np.float64),
        )
        for t in spec.tables
    ]


def _find(values: pa.Array, keys: pa.Array, out: np.ndarray, default: float) -> np.ndarray:
    """out[position of each value in keys], `default` where a value is not a key."""
    pos = pc.index_in(values, value_set=keys)
    hit = pos.is_valid().to_numpy(zero_copy_only=False)
    idx = pos.fill_null(0).to_numpy()
    return np.where(hit, out[idx] if out.size else default, default)


def encode_records(
    spec: FeatureSpec, fields: list[FieldLookup], table: pa.Table, index: np.ndarray
) -> np.ndarray:
    """Records of the rows of `table` (Criteo columns), `index` int64 [N] their split index."""
    rec = np.empty(len(table), RECORD)
    dense = np.empty((len(table), HASH_START), np.float32)
    dense[:, :N_NUM], dense[:, N_NUM:LIFT_START] = spec.numeric_columns(numeric_matrix(table))
    cols = np.empty((len(table), len(fields)), np.int16)
    for j, (name, f) in enumerate(zip(CATEGORICAL_FIELDS, fields, strict=True)):
        at = 0
        for values, codes in dictionary_parts(table.column(name)):  # look up each distinct value once
            rows = slice(at, at + codes.size)
            at += codes.size
            dense[rows, LIFT_START + j] = _find(values, f.rate_values, f.lift, 0.0)[codes]
            cols[rows, j] = _find(values, f.vocab, f.column, spec.oov_column)[codes]
    rec["dense"], rec["cols"] = dense, cols
    rec["y"] = table.column(LABEL).to_numpy()
    rec["index"] = index
    return rec
