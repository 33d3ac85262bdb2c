"""Encoded records (`training.data.feature_cache.RECORD`) made with Arrow hash lookups, once per distinct value.

Bit for bit the records `training.data.feature_cache.encode` makes: the same numeric columns (`FeatureSpec.numeric_columns`),
the same float64 lifts cast to float32, and the same bucket columns. A value's lookup is exact byte
equality in both: here a hash set of the field's vocabulary (`pc.index_in`), there a binary search.
Records are written at their split index, so ranks fill disjoint ranges of one file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL
from ctr_features.layout import HASH_START, N_NUM
from ctr_features.spec import FeatureSpec
from training.data.category_counts import dictionary_parts
from training.data.feature_cache import RECORD
from training.data.parquet import numeric_matrix


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
    dense[:, :N_NUM], dense[:, N_NUM : 2 * N_NUM] = spec.numeric_columns(numeric_matrix(table))
    cols = np.empty((len(table), len(fields)), np.int16)
    for j, (name, f) in enumerate(zip(CATEGORICAL_FIELDS, fields, strict=True)):
        at = 0
        for values, codes in dictionary_parts(table.column(name)):  # look up each distinct value once
            rows = slice(at, at + codes.size)
            at += codes.size
            dense[rows, 2 * N_NUM + j] = _find(values, f.rate_values, f.lift, 0.0)[codes]
            cols[rows, j] = _find(values, f.vocab, f.column, spec.oov_column)[codes]
    rec["dense"], rec["cols"] = dense, cols
    rec["y"] = table.column(LABEL).to_numpy()
    rec["index"] = index
    return rec


def write_at(fd: int, rec: np.ndarray, first: int) -> None:
    """Write records at record position `first` of the open file `fd` (ranks write disjoint ranges)."""
    data = np.ascontiguousarray(rec).data.cast("B")
    offset = first * RECORD.itemsize
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
