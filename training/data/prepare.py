"""Parquet files to prepared splits: open them as one data set, fit the FeatureSpec, encode both splits, once.

`prepare_streaming` is the one-process reference preparation (the benchmarks use it): one process opens the
files, fits the spec by streaming the training rows (`FeatureSpec.fit_streaming`) and encodes each split
(`training.data.feature_cache`); it writes the data set and the spec to a small JSON beside the data.
A run uses `training.data.preparation.prepare_data`, which makes the same files (tested bit for bit) faster,
in the cache folder, and shares the work among ranks. `load_in_memory` expands the encoded splits into
arrays for the `memory` loader; `prepare` does all of it in memory (benchmarks, tests).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.fit import FitChunk
from ctr_features.spec import FeatureSpec
from training.data.feature_cache import expand, iter_records, transform_chunk, write_split
from training.data.once import build_once
from training.data.parquet import ParquetData, Split, numeric_matrix, string_column
from training.errors import DataError

PREPARED_VERSION = 1


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


def load_in_memory(
    data: ParquetData, spec: FeatureSpec, encoded: dict[Split, Path] | None = None
) -> PreparedData:
    """Both splits as preallocated arrays (no Arrow table of all rows is ever built).

    With `encoded` (see `prepare_streaming`) the rows are expanded from the encoded files, not transformed again.
    """
    if encoded is None:
        return PreparedData(spec, *split_arrays(data, spec, "train"), *split_arrays(data, spec, "val"))
    parts = []
    for split in ("train", "val"):
        n = data.rows(split)  # type: ignore[arg-type]
        x, y = np.empty((n, spec.width), np.float32), np.empty(n, np.float32)
        at = 0
        for rec in iter_records(encoded[split], n):  # type: ignore[index]
            bx, by, _ = expand(rec, spec.width)
            x[at : at + len(rec)], y[at : at + len(rec)] = bx.numpy(), by.reshape(-1).numpy()
            at += len(rec)
        ids = np.concatenate([c.ids for c in data.chunks(split, (LABEL,))])  # type: ignore[arg-type]
        parts += [x, y, ids]
    return PreparedData(spec, *parts)


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
        val_fraction: validation share (see `ctr_features.split`).
        width: feature vector width.
        max_rows: use only the first rows of the file (quick experiments); None for all.
        spec: a frozen spec to transform with (warm start) instead of fitting one.
    """
    data = ParquetData.open([Path(cache)], val_fraction, max_rows)
    _check_splits(data, cache)
    return load_in_memory(
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
