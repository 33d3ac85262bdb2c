"""Export's held-out rows from a file: a Parquet file with the Criteo columns (the click join's partitions) reads
as the same rows as the Criteo text file, and a bad one is refused in one line naming the file and the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from export.__main__ import main as export_main
from export.errors import InputError
from export.gates.eval_rows import EVAL_FILES, rows_from_file
from tests.export.export_runs import make_run, raw_rows

ROWS = 300


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Labels int [N], counts float64 [N, 13] (NaN = missing), strings [N, 26] ("" = missing)."""
    rng = np.random.default_rng(5)
    numeric, categorical = raw_rows(rng, ROWS)
    return (rng.random(ROWS) < 0.3).astype(int), numeric, categorical


def write_text(path: Path, labels: np.ndarray, numeric: np.ndarray, categorical: np.ndarray) -> Path:
    """The rows as a Kaggle train.txt file."""
    lines = []
    for label, counts, values in zip(labels, numeric, categorical, strict=True):
        ints = ["" if np.isnan(v) else str(int(v)) for v in counts]
        lines.append("\t".join([str(label), *ints, *values]))
    path.write_text("\n".join(lines) + "\n")
    return path


def partition(labels: np.ndarray, numeric: np.ndarray, categorical: np.ndarray) -> dict[str, pa.Array]:
    """The rows as the click join writes them (pipelines/clicks/join.py): nulls where missing, and its extra
    columns, which export ignores."""
    cols: dict[str, pa.Array] = {LABEL: pa.array(labels, pa.int8())}
    for j, f in enumerate(NUMERIC_FIELDS):
        cols[f] = pa.array(numeric[:, j], pa.float64(), mask=np.isnan(numeric[:, j]))
    for j, f in enumerate(CATEGORICAL_FIELDS):
        cols[f] = pa.array([v or None for v in categorical[:, j]], pa.string())
    cols["request_id"] = pa.array([f"r{i // 4}" for i in range(len(labels))])
    cols["score"] = pa.array(np.full(len(labels), 0.25))
    return cols


def write_parquet(path: Path, cols: dict[str, pa.Array]) -> Path:
    pq.write_table(pa.table(cols), path, row_group_size=128)  # several row groups, as a large partition has
    return path


def test_a_parquet_partition_reads_as_the_same_rows_as_the_criteo_text_file(rows, tmp_path: Path) -> None:
    spec = make_run(tmp_path / "run") / "feature_spec.json"
    text = rows_from_file(write_text(tmp_path / "holdout.txt", *rows))
    part = rows_from_file(write_parquet(tmp_path / "interval-000000007.parquet", partition(*rows)))
    assert part.source == f"{tmp_path / 'interval-000000007.parquet'} ({ROWS} rows)"
    np.testing.assert_array_equal(part.labels, text.labels)
    assert part.categorical is not None and text.categorical is not None
    assert part.categorical.tolist() == text.categorical.tolist()
    assert part.features_for(spec).tobytes() == text.features_for(spec).tobytes()


def test_a_parquet_data_file_splits_by_its_row_ids_as_the_text_file_by_line(rows, tmp_path: Path) -> None:
    text = rows_from_file(write_text(tmp_path / "train.txt", *rows), val_fraction=0.3)
    cols = partition(*rows)
    by_position = rows_from_file(write_parquet(tmp_path / "a.parquet", cols), val_fraction=0.3)
    np.testing.assert_array_equal(by_position.labels, text.labels)
    # A row_id column is the rows' id: reversed ids pick other rows for the split.
    ids = np.arange(ROWS)[::-1]
    by_id = rows_from_file(write_parquet(tmp_path / "b.parquet", {"row_id": pa.array(ids), **cols}), 0.3)
    reversed_text = rows_from_file(write_text(tmp_path / "r.txt", *(r[::-1] for r in rows)), val_fraction=0.3)
    assert by_id.categorical is not None and reversed_text.categorical is not None
    assert by_id.categorical.tolist() == reversed_text.categorical[::-1].tolist()
    assert by_id.categorical.tolist() != by_position.categorical.tolist()  # type: ignore[union-attr]


def test_rows_are_capped_across_row_groups(rows, tmp_path: Path) -> None:
    capped = rows_from_file(write_parquet(tmp_path / "p.parquet", partition(*rows)), max_rows=200)
    np.testing.assert_array_equal(capped.labels, rows[0][:200])


def _bad(tmp_path: Path, cols: dict[str, pa.Array]) -> str:
    with pytest.raises(InputError) as e:
        rows_from_file(write_parquet(tmp_path / "bad.parquet", cols), flag="--calibration-data")
    return str(e.value)


def test_a_bad_parquet_file_is_refused_naming_the_column_or_row(rows, tmp_path: Path) -> None:
    cols = partition(*rows)
    where = f"--calibration-data {tmp_path / 'bad.parquet'}"
    assert _bad(tmp_path, {k: v for k, v in cols.items() if k != "C26"}) == (
        f"{where} has no column 'C26'; expected {EVAL_FILES}"
    )
    assert _bad(tmp_path, {**cols, "I3": pa.array(["7"] * ROWS)}) == (
        f"{where}: column 'I3' is string; expected {EVAL_FILES}"
    )
    labels = rows[0].copy()
    labels[130] = 2
    assert (
        _bad(tmp_path, {**cols, LABEL: pa.array(labels)}) == f"{where}: row 130 has label 2; expected 0 or 1"
    )
    assert _bad(tmp_path, {**cols, LABEL: pa.array([None, *labels[1:]], pa.int64())}) == (
        f"{where}: row 0 has label None; expected 0 or 1"
    )
    with pytest.raises(InputError) as e:
        rows_from_file(write_parquet(tmp_path / "empty.parquet", {k: v[:0] for k, v in cols.items()}))
    assert str(e.value) == f"--eval-data {tmp_path / 'empty.parquet'} holds no rows to score"


def test_the_cli_refuses_a_file_named_parquet_that_is_not_one(
    rows, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    fake = write_text(tmp_path / "holdout.parquet", *rows)
    for flag in ("--eval-data", "--calibration-data"):
        assert export_main(["--run", str(run), "--repo", str(tmp_path / "repo"), flag, str(fake)]) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"export: error: cannot read {flag} {fake}: ")
        assert "Parquet magic bytes not found" in err and err.endswith(f"; expected {EVAL_FILES}")
        assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())
