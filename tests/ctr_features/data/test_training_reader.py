"""The Criteo reader: both file forms, missing cells, each malformed-row kind, skip mode, the cache."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from ctr_contract.schema import CATEGORICAL_FIELDS, FIELDS, NUMERIC_FIELDS
from ctr_features.data.criteo import SCHEMA, MalformedRowError, ReadReport, read_batches
from training.data.cache import cache_path, ensure_cache

GOOD = [
    ["1", "5", "-1", "", "260.0", *[str(i) for i in range(9)], *[f"{i:08x}" for i in range(26)]],
    ["0", "", "3", "7", "", *[""] * 9, "68fd1e64", "", *["a73ee510"] * 24],
]


def write(path: Path, rows: list[list[str]], sep: str = "\t", header: bool = False) -> Path:
    lines = ([sep.join(FIELDS)] if header else []) + [sep.join(r) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def read_all(path: Path, skip: bool = False, report: ReadReport | None = None) -> pa.Table:
    return pa.Table.from_batches(list(read_batches(path, skip_bad_rows=skip, report=report)), schema=SCHEMA)


def test_reads_kaggle_tsv_without_header(tmp_path: Path) -> None:
    table = read_all(write(tmp_path / "train.txt", GOOD))
    assert table.column("row_id").to_pylist() == [0, 1]
    assert table.column("label").to_pylist() == [1, 0]
    assert table.column("I1").to_pylist() == [5.0, None]
    assert table.column("I2").to_pylist() == [-1.0, 3.0]
    assert table.column("I4").to_pylist() == [260.0, None]
    assert table.column("C1").to_pylist() == ["00000000", "68fd1e64"]
    assert table.column("C26").to_pylist() == ["00000019", "a73ee510"]


def test_csv_with_header_reads_the_same_as_tsv(tmp_path: Path) -> None:
    tsv = read_all(write(tmp_path / "a.txt", GOOD))
    csv = read_all(write(tmp_path / "b.csv", GOOD, sep=",", header=True))
    assert csv.equals(tsv)


def test_missing_cells_are_null_counts_and_empty_categoricals(tmp_path: Path) -> None:
    table = read_all(write(tmp_path / "train.txt", GOOD))
    assert [table.column(f)[1].as_py() for f in NUMERIC_FIELDS] == [None, 3.0, 7.0] + [None] * 10
    assert table.column("C2").to_pylist() == ["00000001", ""]


def test_blank_lines_are_skipped_and_line_numbers_stay_exact(tmp_path: Path) -> None:
    bad = GOOD[0].copy()
    bad[3] = "x"
    path = tmp_path / "train.txt"
    path.write_text("\t".join(GOOD[0]) + "\n\n" + "\t".join(bad) + "\n")
    with pytest.raises(MalformedRowError, match=r"train\.txt:3: field I3 is 'x'"):
        read_all(path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda r: r[:-1],
            r"train\.txt:3: expected 40 tab-separated fields .* got 39: missing fields from C26 on",
        ),
        (lambda r: [*r, "extra"], r"train\.txt:3: expected 40 tab-separated fields .* got 41: 1 extra field"),
        (lambda r: ["2", *r[1:]], r"train\.txt:3: field label is '2', expected 0 or 1"),
        (lambda r: ["", *r[1:]], r"train\.txt:3: field label is '', expected 0 or 1"),
        (
            lambda r: [*r[:5], "12abc", *r[6:]],
            r"train\.txt:3: field I5 is '12abc', expected an integer count",
        ),
        (lambda r: [*r[:13], "nan", *r[14:]], r"train\.txt:3: field I13 is 'nan', expected an integer count"),
    ],
    ids=["too-few-fields", "too-many-fields", "label-2", "label-missing", "count-not-numeric", "count-nan"],
)
def test_malformed_row_names_file_line_and_field(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path / "train.txt", [GOOD[0], GOOD[1], edit(GOOD[0]), GOOD[1]])
    with pytest.raises(MalformedRowError, match=message):
        read_all(path)


def test_malformed_row_in_csv_form_counts_the_header_line(tmp_path: Path) -> None:
    bad = [*GOOD[0][:2], "?", *GOOD[0][3:]]
    path = write(tmp_path / "train.csv", [GOOD[0], bad], sep=",", header=True)
    with pytest.raises(MalformedRowError, match=r"train\.csv:3: field I2 is '\?'"):
        read_all(path)


def test_wrong_header_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text(",".join(["label", "I1", "I3", *FIELDS[3:]]) + "\n")
    with pytest.raises(MalformedRowError, match=r"header column 3 is 'I3', expected 'I2'"):
        read_all(path)


def test_skip_bad_rows_counts_each_kind_and_keeps_good_rows(tmp_path: Path) -> None:
    rows = [
        GOOD[0],
        GOOD[0][:-2],
        GOOD[1],
        ["x", *GOOD[1][1:]],
        [*GOOD[0][:8], "1.2.3", *GOOD[0][9:]],
        GOOD[1],
    ]
    report = ReadReport()
    table = read_all(write(tmp_path / "train.txt", rows), skip=True, report=report)
    assert table.column("row_id").to_pylist() == [0, 2, 5]
    assert report.rows == 3
    assert report.skipped == {"wrong field count": 1, "bad label": 1, "non-numeric count": 1}
    assert report.examples[0].endswith("got 38: missing fields from C25 on")
    assert "train.txt:2:" in report.examples[0]
    assert "skipped 3 bad rows" in report.summary()


def test_cache_is_reused_until_the_source_changes(tmp_path: Path) -> None:
    src = write(tmp_path / "train.txt", GOOD)
    cache, report = ensure_cache(src)
    assert report.rows == 2
    built = cache.stat().st_mtime_ns
    assert ensure_cache(src)[0].stat().st_mtime_ns == built
    write(src, GOOD + GOOD)
    os.utime(src, ns=(built + 10**9, built + 10**9))
    assert ensure_cache(src)[1].rows == 4


def test_cache_built_by_skipping_does_not_satisfy_a_strict_read(tmp_path: Path) -> None:
    src = write(tmp_path / "train.txt", [GOOD[0], GOOD[0][:5]])
    assert ensure_cache(src, skip_bad_rows=True)[1].skipped == {"wrong field count": 1}
    with pytest.raises(MalformedRowError, match=r"train\.txt:2: expected 40"):
        ensure_cache(src)
    assert cache_path(src).is_file()


def test_categorical_fields_keep_their_order(tmp_path: Path) -> None:
    table = read_all(write(tmp_path / "train.txt", GOOD))
    assert [table.column(f)[0].as_py() for f in CATEGORICAL_FIELDS] == [f"{i:08x}" for i in range(26)]


def test_a_file_of_only_short_rows_is_reported_not_crashed_on(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text("1\t2\t3\n0\t1\n")
    report = ReadReport()
    assert read_all(path, skip=True, report=report).num_rows == 0
    assert report.skipped == {"wrong field count": 2}
    with pytest.raises(
        MalformedRowError, match=r"train\.txt:1: expected 40 .* got 3: missing fields from I3 on"
    ):
        read_all(path)
