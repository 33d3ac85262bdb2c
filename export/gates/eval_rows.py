"""Held-out rows for the quality gate and the calibrator: a run's validation rows, or a file of Criteo rows.

A file (`--eval-data`, `--calibration-data`, or the run's own data file) is Criteo text, the form training
reads (Kaggle TSV, or CSV with a header; plain or compressed), or a Parquet file with the Criteo columns:
`label` 0/1, `I1..I13` numbers, `C1..C26` strings (null = missing), any other columns ignored, such as the
partitions the click join writes (pipelines/clicks/join.py). Parquet is told by its name (.parquet, .pq) or
its first bytes; both forms become the Criteo reader's batches (ctr_features/data/criteo.py), so a row scores
the same whichever form it came in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_features.data.criteo import SCHEMA, read_batches
from ctr_features.data.split import validation_mask
from ctr_features.spec import FeatureSpec
from export.errors import InputError
from export.gates.raw_parity import load_val_raw

MAX_EVAL_ROWS = 100_000
ALIGN_ROWS = 64  # val_raw.npz rows transformed to check that they are val_features.npy's rows
PARQUET_SUFFIXES = (".parquet", ".pq")
EVAL_FILES = (
    "Criteo rows: a Kaggle TSV or CSV-with-header file (plain, .gz, .zst or .bz2), or a Parquet file with "
    "label 0/1, I1..I13 numbers and C1..C26 strings"
)
_PARQUET_BATCH = 65_536


@dataclass(frozen=True)
class EvalRows:
    """Held-out rows: labels float [N], and the features a given feature spec makes of them."""

    source: str
    labels: np.ndarray
    features_for: Callable[[Path], np.ndarray]  # feature_spec.json -> float32 (N, width)
    categorical: np.ndarray | None = None  # the rows' raw categorical values (N, 26), for the field error
    no_categorical: str = ""  # why `categorical` is None


def spec_doc(path: Path) -> Any:
    """A feature_spec.json's document, to tell two specs apart."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read feature spec {path}: {e}") from e


def _aligned_categorical(
    x: np.ndarray, val_raw: Path | None, candidate_spec: Path
) -> tuple[np.ndarray | None, str]:
    """val_raw.npz's categorical values when its rows are those of `x` (same count, same first features);
    else None and why. Training writes both from the first validation rows, so they align row for row."""
    if val_raw is None or not val_raw.is_file():
        return None, "no raw validation rows (val_raw.npz) to group by field"
    numeric, categorical = load_val_raw(val_raw) or (np.zeros((0, 13)), np.zeros((0, 26)))
    if len(numeric) != len(x):
        return None, f"{val_raw} holds {len(numeric)} rows, the validation features {len(x)}"
    k = min(ALIGN_ROWS, len(x))
    features = FeatureSpec.load(candidate_spec).transform(numeric[:k], categorical[:k])
    if not np.allclose(features, x[:k], atol=1e-5):
        return None, f"{val_raw} holds other rows than the validation features (their first {k} differ)"
    return categorical, ""


def rows_from_run(
    val_features: Path, val_labels: Path, candidate_spec: Path, val_raw: Path | None = None
) -> EvalRows:
    """The run's validation rows, already transformed with the candidate's spec (and their raw categorical
    values from `val_raw` when it holds the same rows)."""
    try:
        x = np.load(val_features, allow_pickle=False).astype(np.float32)
        y = np.load(val_labels, allow_pickle=False).astype(np.float64)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the gate's validation rows: {e}") from e
    if len(x) != len(y):
        raise InputError(f"{val_features} has {len(x)} rows but {val_labels} has {len(y)} labels")
    spec_text = spec_doc(candidate_spec)

    def features_for(spec: Path) -> np.ndarray:
        if spec_doc(spec) != spec_text:
            raise InputError(
                f"the served version's feature spec {spec} differs from the candidate's, so {val_features} "
                "cannot score it; give --eval-data FILE (raw Criteo rows) or train with a data file"
            )
        return x

    categorical, why = _aligned_categorical(x, val_raw, candidate_spec)
    return EvalRows(f"{val_features} ({len(y)} validation rows)", y, features_for, categorical, why)


def rows_from_file(
    path: Path, val_fraction: float | None = None, max_rows: int = MAX_EVAL_ROWS, flag: str = "--eval-data"
) -> EvalRows:
    """The Criteo rows of `path`, text or Parquet (only its validation split when `val_fraction` is given),
    at most `max_rows`; `flag` names the option in errors."""
    numeric: list[np.ndarray] = []
    categorical: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    kept = 0
    try:
        for batch in parquet_batches(path, flag) if is_parquet(path) else read_batches(path):
            table = pa.Table.from_batches([batch])
            if val_fraction is not None:
                table = table.filter(
                    pa.array(validation_mask(table.column("row_id").to_numpy(), val_fraction))
                )
            table = table.slice(0, max_rows - kept)
            numeric.append(
                np.stack([table.column(f).to_numpy(zero_copy_only=False) for f in NUMERIC_FIELDS], 1).astype(
                    np.float64
                )
            )
            categorical.append(
                np.stack([np.asarray(table.column(f).to_pylist(), object) for f in CATEGORICAL_FIELDS], 1)
            )
            labels.append(table.column(LABEL).to_numpy().astype(np.float64))
            kept += len(table)
            if kept >= max_rows:
                break
    except (OSError, ValueError) as e:  # MalformedRowError and pyarrow's ArrowInvalid are ValueErrors
        raise InputError(f"cannot read {flag} {path}: {e}; expected {EVAL_FILES}") from e
    if kept == 0:
        raise InputError(f"{flag} {path} holds no rows to score")
    num, cat = np.concatenate(numeric), np.concatenate(categorical)
    what = "validation rows" if val_fraction is not None else "rows"

    def features_for(spec: Path) -> np.ndarray:
        return FeatureSpec.load(spec).transform(num, cat)

    return EvalRows(f"{path} ({kept} {what})", np.concatenate(labels), features_for, cat)


def is_parquet(path: Path) -> bool:
    """Whether `path` is a Parquet file: by its name (.parquet, .pq), else by its first bytes (`PAR1`)."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return True
    with path.open("rb") as f:
        return f.read(4) == b"PAR1"


def parquet_batches(path: Path, flag: str = "--eval-data") -> Iterator[pa.RecordBatch]:
    """A Criteo Parquet file's rows as the Criteo reader's batches (ctr_features.data.criteo.SCHEMA):
    label int8, counts float64 (null = missing), strings ("" = missing), and `row_id` (the file's own
    column, else the row's position: the validation split of a run's Parquet data file is then training's).

    Raises:
        InputError: a Criteo column missing or of another type, or a label that is not 0 or 1.
        ValueError: (pyarrow's ArrowInvalid) not a Parquet file, or a damaged one.
    """
    f = pq.ParquetFile(path)
    schema = f.schema_arrow
    for name in (LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS):
        if name not in schema.names:
            raise InputError(f"{flag} {path} has no column {name!r}; expected {EVAL_FILES}")
        if not _criteo_type(name, schema.field(name).type):
            raise InputError(
                f"{flag} {path}: column {name!r} is {schema.field(name).type}; expected {EVAL_FILES}"
            )
    has_ids = "row_id" in schema.names and pa.types.is_integer(schema.field("row_id").type)
    columns = [*(["row_id"] if has_ids else []), LABEL, *NUMERIC_FIELDS, *CATEGORICAL_FIELDS]
    first = 0
    for batch in f.iter_batches(batch_size=_PARQUET_BATCH, columns=columns):
        label = batch.column(LABEL).cast(pa.int64())
        if label.null_count or not pc.all(pc.is_in(label, pa.array([0, 1]))).as_py():
            bad = next(i for i, v in enumerate(label.to_pylist()) if v not in (0, 1))
            raise InputError(
                f"{flag} {path}: row {first + bad} has label {batch.column(LABEL)[bad].as_py()!r}; "
                "expected 0 or 1"
            )
        n = batch.num_rows
        ids = batch.column("row_id").cast(pa.int64()) if has_ids else pa.array(np.arange(first, first + n))
        numeric = [batch.column(c).cast(pa.float64()) for c in NUMERIC_FIELDS]
        strings = [pc.fill_null(batch.column(c).cast(pa.string()), "") for c in CATEGORICAL_FIELDS]
        first += n
        yield pa.RecordBatch.from_arrays([ids, label.cast(pa.int8()), *numeric, *strings], schema=SCHEMA)


def _criteo_type(name: str, t: pa.DataType) -> bool:
    """Whether a column of type `t` can hold Criteo field `name` (as training's Parquet reader accepts it)."""
    if name == LABEL:
        return pa.types.is_integer(t) or pa.types.is_boolean(t)
    if name in NUMERIC_FIELDS:
        return pa.types.is_integer(t) or pa.types.is_floating(t)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)
