"""Parquet files read as one data set, a row group at a time: the unit streaming training shards and shuffles.

`ParquetData.open` checks each file's schema and counts, per row group, the training and validation rows
(the split is a hash of the global row id, see `ctr_features.data.split`), reading only the `row_id` column. Global
row ids are the file's own `row_id` (or row position) plus the ids spanned by the files before it, so a
single file keeps its ids and the synthetic oracle still lines up. `read` returns one row group's rows of
one split, with their global ids and their index within the split (file order), typed like the cache.
A file whose size or mtime changed since `open` is an error, never a silent mix of two versions. A file may
be an object in a bucket (`training/data/objects.py`): its row groups are then read by ranged GETs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.data.split import validation_mask
from training.data.objects import DataPath, as_data_path, is_object, random_access, stamp
from training.errors import DataError

Split = Literal["train", "val"]
_EXPECTED = "label 0/1, I1..I13 numbers, C1..C26 strings, optional row_id"


@dataclass(frozen=True)
class Piece:
    """One row group of one file, with the split's row counts and where its rows start in each split."""

    file: int
    row_group: int
    first_row: int  # position of the group's first row in its file
    rows: int  # rows used (fewer than the group holds when --max-rows cuts it)
    id_offset: int
    train_start: int
    train_rows: int
    val_start: int
    val_rows: int

    def count(self, split: Split) -> int:
        return self.train_rows if split == "train" else self.val_rows

    def start(self, split: Split) -> int:
        return self.train_start if split == "train" else self.val_start


@dataclass
class Chunk:
    """Rows of one split from one piece: the Arrow table (Criteo columns), global row ids, split index."""

    table: pa.Table
    ids: np.ndarray
    index: np.ndarray


def _check_schema(path: DataPath, schema: pa.Schema) -> bool:
    """Raise DataError unless `schema` holds the Criteo columns; returns whether it has `row_id`."""
    kinds: dict[str, tuple[Callable[[pa.DataType], bool], ...]] = {
        LABEL: (pa.types.is_integer, pa.types.is_boolean)
    }
    kinds |= {f: (pa.types.is_integer, pa.types.is_floating) for f in NUMERIC_FIELDS}
    kinds |= {
        f: (pa.types.is_string, pa.types.is_large_string, pa.types.is_dictionary) for f in CATEGORICAL_FIELDS
    }
    for name, checks in kinds.items():
        if name not in schema.names:
            raise DataError(f"{path}: no column {name!r}; a Criteo Parquet file has {_EXPECTED}")
        t = schema.field(name).type
        if not any(check(t) for check in checks):
            raise DataError(f"{path}: column {name!r} is {t}; a Criteo Parquet file has {_EXPECTED}")
    if "row_id" in schema.names and not pa.types.is_integer(schema.field("row_id").type):
        raise DataError(f"{path}: column 'row_id' is {schema.field('row_id').type}, expected integers")
    return "row_id" in schema.names


def _parquet_file(path: DataPath, read_dictionary: list[str] | None = None) -> pq.ParquetFile:
    # An object's column chunks are fetched together for each row group (fewer, larger GETs).
    return pq.ParquetFile(random_access(path), read_dictionary=read_dictionary, pre_buffer=is_object(path))


class ParquetData:
    """A list of Parquet files as one data set of `Piece`s; see the module docstring."""

    def __init__(
        self,
        files: list[DataPath],
        stamps: list[tuple[int, int]],
        row_ids: list[bool],
        pieces: list[Piece],
        val_fraction: float,
    ) -> None:
        self.files, self.stamps, self.row_ids = files, stamps, row_ids
        self.pieces, self.val_fraction = pieces, val_fraction
        self._open: dict[tuple[int, bool], pq.ParquetFile] = {}

    @classmethod
    def open(cls, files: list[DataPath], val_fraction: float, max_rows: int | None = None) -> ParquetData:
        """Check every file and count each row group's training and validation rows."""
        stamps, row_ids, pieces = [], [], []
        offset = train_start = val_start = used = 0
        for i, path in enumerate(files):
            stamps.append(stamp(path))
            try:
                pf = _parquet_file(path)
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{path}: not a readable Parquet file ({e})") from e
            has_ids = _check_schema(path, pf.schema_arrow)
            row_ids.append(has_ids)
            first, span = 0, 0
            for g in range(pf.metadata.num_row_groups):
                rows = pf.metadata.row_group(g).num_rows
                if max_rows is not None:
                    rows = min(rows, max_rows - used)
                if rows <= 0:
                    break
                ids = _read_ids(pf, path, g, has_ids, first, rows)
                is_val = validation_mask(offset + ids, val_fraction)
                n_val = int(is_val.sum())
                pieces.append(Piece(i, g, first, rows, offset, train_start, rows - n_val, val_start, n_val))
                train_start, val_start, used = train_start + rows - n_val, val_start + n_val, used + rows
                first += rows
                span = max(span, int(ids.max()) + 1 if ids.size else 0)
            offset += span
        return cls(list(files), stamps, row_ids, pieces, val_fraction)

    def rows(self, split: Split) -> int:
        return sum(p.count(split) for p in self.pieces)

    def chunks(self, split: Split, columns: tuple[str, ...] | None = None) -> Iterator[Chunk]:
        """The rows of `split`, one row group at a time, in file order (see `read`)."""
        for piece in self.pieces:
            if piece.count(split):
                yield self.read(piece, split, columns)

    def read(self, piece: Piece, split: Split, columns: tuple[str, ...] | None = None) -> Chunk:
        """The rows of `split` in `piece`, typed like the cache (label int8, I* float64, C* string)."""
        return self.read_splits(piece, (split,), columns)[split]

    def read_splits(
        self,
        piece: Piece,
        splits: tuple[Split, ...],
        columns: tuple[str, ...] | None = None,
        dictionary: bool = False,
    ) -> dict[Split, Chunk]:
        """`read` for several splits of one piece, decoding its row group once.

        With `dictionary`, C1..C26 come as Arrow dictionary arrays (Parquet's own dictionary pages, not
        decoded into one string per row): what hash-based counting and lookups want.
        """
        path = self.files[piece.file]
        if stamp(path) != self.stamps[piece.file]:
            raise DataError(f"{path} changed while training was reading it; re-run once the file is complete")
        names = list(columns or (LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS))
        if LABEL not in names:
            names.insert(0, LABEL)
        pf = self._open.get((piece.file, dictionary))
        if pf is None:
            pf = self._open[(piece.file, dictionary)] = _parquet_file(
                path, list(CATEGORICAL_FIELDS) if dictionary else None
            )
        try:
            table = pf.read_row_group(
                piece.row_group, columns=[*names, "row_id"] if self.row_ids[piece.file] else names
            )
        except (pa.ArrowException, OSError) as e:
            raise DataError(
                f"{path}: row group {piece.row_group} cannot be read ({e}); was the file replaced?"
            ) from e
        table = table.slice(0, piece.rows)
        if self.row_ids[piece.file]:
            local = table.column("row_id").to_numpy().astype(np.int64)
            table = table.drop_columns(["row_id"])
        else:
            local = np.arange(piece.first_row, piece.first_row + piece.rows, dtype=np.int64)
        ids = piece.id_offset + local
        is_val = validation_mask(ids, self.val_fraction)
        chunks: dict[Split, Chunk] = {}
        for split in splits:
            keep = is_val if split == "val" else ~is_val
            if int(keep.sum()) != piece.count(split):
                raise DataError(
                    f"{path} changed while training was reading it; re-run once the file is complete"
                )
            part = _normalise(path, table.filter(pa.array(keep)), dictionary)
            start = piece.start(split)
            chunks[split] = Chunk(
                part, ids[keep], np.arange(start, start + piece.count(split), dtype=np.int64)
            )
        return chunks

    def to_json(self) -> dict[str, Any]:
        return {
            "files": [str(f) for f in self.files],
            "stamps": self.stamps,
            "row_ids": self.row_ids,
            "val_fraction": self.val_fraction,
            "pieces": [asdict(p) for p in self.pieces],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ParquetData:
        return cls(
            [as_data_path(f) for f in d["files"]],
            [tuple(s) for s in d["stamps"]],
            d["row_ids"],  # type: ignore[misc]
            [Piece(**p) for p in d["pieces"]],
            d["val_fraction"],
        )


def _read_ids(
    pf: pq.ParquetFile, path: DataPath, group: int, has_ids: bool, first: int, rows: int
) -> np.ndarray:
    if not has_ids:
        return np.arange(first, first + rows, dtype=np.int64)
    try:
        col = pf.read_row_group(group, columns=["row_id"]).column(0).slice(0, rows)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path}: row group {group} cannot be read ({e})") from e
    if col.null_count:
        raise DataError(f"{path}: column 'row_id' has missing values in row group {group}")
    return col.to_numpy().astype(np.int64)


def _normalise(path: DataPath, table: pa.Table, dictionary: bool = False) -> pa.Table:
    """Cast a Parquet file's Criteo columns to the cache's types (C* may stay dictionaries); check labels are 0/1."""
    label = table.column(LABEL)
    if label.type != pa.int8():
        label = pc.cast(label, pa.int8(), safe=False)
    if len(label) and (label.null_count or pc.max(label).as_py() > 1 or pc.min(label).as_py() < 0):
        raise DataError(f"{path}: column 'label' must hold only 0 and 1 (no missing values)")
    cols = {LABEL: label}

    def kept(col: pa.ChunkedArray) -> bool:
        return dictionary and pa.types.is_dictionary(col.type)

    for f in table.column_names:
        if f in NUMERIC_FIELDS and table.column(f).type != pa.float64():
            cols[f] = pc.cast(table.column(f), pa.float64())
        elif f in CATEGORICAL_FIELDS and table.column(f).type != pa.string() and not kept(table.column(f)):
            cols[f] = pc.cast(table.column(f), pa.string())
    for name, col in cols.items():
        table = table.set_column(table.column_names.index(name), name, col)
    return table
