"""The one-process reference preparation: the tests' statement of what training's own preparation must make.

`prepare_streaming` opens the files as one data set, fits the spec by streaming the training rows
(`FeatureSpec.fit_streaming`) and encodes each split (training/data/feature_cache.py) in one process; it writes
the data set and the spec to a small JSON beside the data. A run uses `training.data.preparation.prepare_data`,
which makes the same files (tested bit for bit: tests/training/data/test_training_prepare.py) in the cache folder and
shares the work among ranks, so this stays as the plain statement of what it must make. `transformed_in_memory`
transforms both splits straight from Parquet, and `prepare` fits and transforms one file, all in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.compiled.records import numeric_matrix, string_column, transform_chunk
from ctr_features.fit import FitChunk
from ctr_features.spec import FeatureSpec
from training.data.feature_cache import write_split
from training.data.once import build_once
from training.data.parquet import ParquetData, Split
from training.data.preparation import PREPARED_VERSION
from training.errors import DataError
from training.loader.memory import PreparedData


def fit_chunks(data: ParquetData) -> Callable[[bool], Iterator[FitChunk]]:
    """The training rows of `data` in file order, one row group at a time, for `FeatureSpec.fit_streaming`."""

    def chunks(numeric_only: bool) -> Iterator[FitChunk]:
        columns = (LABEL, *NUMERIC_FIELDS) if numeric_only else None
        for chunk in data.chunks("train", columns):
            t = chunk.table
            cats = None if numeric_only else [string_column(t.column(f)) for f in CATEGORICAL_FIELDS]
            yield numeric_matrix(t), cats, t.column(LABEL).to_numpy().astype(np.float32)

    return chunks


def split_arrays(
    data: ParquetData, spec: FeatureSpec, split: Split
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All rows of one split, transformed, in file order: (x float32 [N, width], y float32 [N], ids int64 [N])."""
    n = data.rows(split)
    x, y, ids = np.empty((n, spec.width), np.float32), np.empty(n, np.float32), np.empty(n, np.int64)
    at = 0
    for chunk in data.chunks(split):
        k = len(chunk.ids)
        x[at : at + k] = transform_chunk(spec, chunk.table)
        y[at : at + k] = chunk.table.column(LABEL).to_numpy()
        ids[at : at + k] = chunk.ids
        at += k
    return x, y, ids


def transformed_in_memory(data: ParquetData, spec: FeatureSpec) -> PreparedData:
    """Both splits transformed from Parquet into preallocated arrays (no Arrow table of all rows is built)."""
    return PreparedData(spec, *split_arrays(data, spec, "train"), *split_arrays(data, spec, "val"))


def _check_splits(data: ParquetData, where: object) -> None:
    train, val = data.rows("train"), data.rows("val")
    if train == 0 or val == 0:
        raise DataError(
            f"{where}: {train + val} rows give {train} training and {val} validation rows; need both"
        )


def prepare(
    cache: Path, val_fraction: float, width: int, max_rows: int | None = None, spec: FeatureSpec | None = None
) -> PreparedData:
    """One Parquet file split, fitted on its training rows and transformed, all in memory (benchmarks, tests).

    Args:
        cache: Parquet file written by `training.data.cache.ensure_cache`.
        val_fraction: validation share (see `ctr_features.data.split`).
        width: feature vector width.
        max_rows: use only the first rows of the file (quick experiments); None for all.
        spec: a frozen spec to transform with (warm start) instead of fitting one.
    """
    data = ParquetData.open([Path(cache)], val_fraction, max_rows)
    _check_splits(data, cache)
    return transformed_in_memory(
        data, spec if spec is not None else FeatureSpec.fit_streaming(fit_chunks(data), width)
    )


def prepare_streaming(
    files: list[Path],
    val_fraction: float,
    width: int,
    max_rows: int | None,
    say: Callable[[str], None],
    frozen: FeatureSpec | None = None,
) -> tuple[ParquetData, FeatureSpec, dict[Split, Path]]:
    """Open `files` as one data set, fit the spec and encode both splits (`training.data.feature_cache`), once.

    Done by one process while the others wait; later runs reuse the result, which is keyed by every file's
    path, size and mtime and by the split and width settings. With a `frozen` spec (warm start) nothing is
    fitted: the rows are encoded with that spec.

    Returns:
        The data set, the spec, and the encoded file of each split.
    """
    key_src = json.dumps(
        [
            PREPARED_VERSION,
            val_fraction,
            width,
            max_rows,
            frozen.to_dict() if frozen else None,
            [(str(f.resolve()), *_stat(f)) for f in files],
        ]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    target = files[0].with_name(f"{files[0].name}.prepared-{key}.json")
    encoded: dict[Split, Path] = {
        s: target.with_name(f"{files[0].name}.prepared-{key}.{s}.bin") for s in ("train", "val")
    }

    def build() -> None:
        data = ParquetData.open(files, val_fraction, max_rows)
        _check_splits(data, files[0] if len(files) == 1 else f"{len(files)} files")
        spec = FeatureSpec.fit_streaming(fit_chunks(data), width) if frozen is None else frozen
        for split, path in encoded.items():
            write_split(data, spec, split, path)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")  # written last: it marks the result ready
        tmp.write_text(json.dumps({"data": data.to_json(), "spec": spec.to_dict()}, separators=(",", ":")))
        os.replace(tmp, target)

    lock = target.with_name(f"{files[0].name}.prepared-{key}.lock")
    build_once(lock, lambda: target.is_file() and all(p.is_file() for p in encoded.values()), build, say)
    d = json.loads(target.read_text())
    data = ParquetData.from_json(d["data"])
    if [tuple(s) for s in data.stamps] != [_stat(f) for f in files]:
        raise DataError(
            f"the data changed while it was being prepared ({files[0]} ...); re-run once it is complete"
        )
    return data, frozen if frozen is not None else FeatureSpec.from_dict(d["spec"]), encoded


def _stat(f: Path) -> tuple[int, int]:
    st = f.stat()
    return st.st_size, st.st_mtime_ns
