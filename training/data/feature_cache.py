"""Transform once: each split's rows encoded with the fitted spec, on disk, so epochs only read and expand.

The vocabulary transform costs about as much CPU per row as a training step, so streaming it every epoch
would cost a third of the throughput. After the fit, one pass writes every row of a split, in file order,
as a fixed-size record: the first 52 columns of its feature vector (z-scores, missing flags, rate lifts;
float32 exactly as `FeatureSpec.transform` makes them), the column each categorical value adds 1.0 to
(int16: a bucket or the out-of-vocabulary column), the label and the row's index in its split.
`expand` rebuilds the float32 [N, width] vectors bit for bit (1.0 counts add exactly). 272 bytes a row on
disk (52 * 4 + 26 * 2 + 4 + 8). The training stream maps a split (training/data/stream_batches.py); the
other readers use plain reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL
from ctr_features.layout import HASH_START, categorical_values
from ctr_features.spec import FeatureSpec
from training.data.parquet import ParquetData, Split, numeric_matrix, string_column
from training.errors import DataError

if TYPE_CHECKING:  # torch is imported where records are expanded: `python -m training.prepare` never loads it
    import torch

N_CAT = len(CATEGORICAL_FIELDS)
RECORD = np.dtype(
    [("dense", "<f4", (HASH_START,)), ("cols", "<i2", (N_CAT,)), ("y", "<f4"), ("index", "<i8")]
)
_ENCODE_ROWS = 1 << 15


def transform_chunk(spec: FeatureSpec, table) -> np.ndarray:  # type: ignore[no-untyped-def]
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
    # Record fields are strided views (272-byte rows), which torch reads as they are: no numpy copy first.
    x[:, :HASH_START] = torch.from_numpy(rec["dense"])
    x[:, HASH_START:].zero_()
    cols = torch.from_numpy(rec["cols"]).long()  # torch's conversion runs on its threads, numpy's on one
    # Each categorical field adds 1.0 to its column; the source is one broadcast 1.0, not an [N, 26] tensor.
    x.scatter_add_(1, cols, torch.ones(()).expand(n, N_CAT))
    y = torch.from_numpy(rec["y"]).reshape(-1, 1).clone()
    return x, y, torch.from_numpy(rec["index"]).clone()


def write_split(data: ParquetData, spec: FeatureSpec, split: Split, path: Path) -> None:
    """Encode every row of `split` in file order into `path` (written to a temporary name, then renamed)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            for chunk in data.chunks(split):
                for a in range(0, len(chunk.ids), _ENCODE_ROWS):
                    part = chunk.table.slice(a, _ENCODE_ROWS)
                    encode(spec, part, chunk.index[a : a + len(part)]).tofile(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_records(path: Path, start: int, count: int) -> np.ndarray:
    """Records [start, start + count) of an encoded split."""
    rec = np.fromfile(path, dtype=RECORD, count=count, offset=start * RECORD.itemsize)
    if rec.shape[0] != count:
        raise DataError(f"{path} holds fewer records than expected (truncated?); delete it to rebuild")
    return rec


def iter_records(path: Path, rows: int, block: int = 1 << 16) -> Iterator[np.ndarray]:
    """All `rows` records of an encoded split, `block` at a time."""
    for a in range(0, rows, block):
        yield read_records(path, a, min(block, rows - a))
