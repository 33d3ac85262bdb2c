"""Transform once: each split's rows encoded with the fitted spec, on disk, so epochs only read and expand.

After the fit, one pass writes every row of a split, in file order, as a fixed-size record
(`ctr_features.compiled.records.RECORD`: the first HASH_START columns of its feature vector, the column each
categorical value adds 1.0 to, the label and the row's index in its split); `expand` there rebuilds the
vectors bit for bit. This module is training's file I/O of records: write a split, read records back, write
at a record position (ranks fill disjoint ranges of one file). The training stream maps a split
(training/loader/stream.py); the other readers use plain reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ctr_features.compiled.records import RECORD, encode
from ctr_features.spec import FeatureSpec
from training.data.parquet import ParquetData, Split
from training.errors import DataError

_ENCODE_ROWS = 1 << 15


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


def write_at(fd: int, rec: np.ndarray, first: int) -> None:
    """Write records at record position `first` of the open file `fd` (ranks write disjoint ranges)."""
    data = np.ascontiguousarray(rec).data.cast("B")
    offset = first * RECORD.itemsize
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n
