"""Streaming, vectorised reader for Criteo-format files (Kaggle TSV without header, or CSV with header).

Every batch it yields is columnar (Arrow): `row_id` int64, `label` int8, I1..I13 float64 (null = missing),
C1..C26 string ("" = missing). No Python object is built per row.

Two paths: a typed pyarrow.csv parse (fast) for clean files, and a line-exact validating parse (split each
line, regex-check every field) that runs when the fast path meets a malformed row or `skip_bad_rows` is on.
The validating path is what names the file, line and field of a bad row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from ctr_contract.schema import CATEGORICAL_FIELDS, FIELDS, LABEL, N_FIELDS, NUMERIC_FIELDS
from ctr_features.data.compressed import ObjectFile, codec, open_text, truncated_message
from ctr_features.errors import DataError, MalformedRowError

# Bytes of text per batch. Arrow's streaming reader reads and parses a number of blocks ahead, so this
# bounds memory: the peak Arrow allocation grows with the block, whatever the file's size.
BLOCK_SIZE = 4 << 20
_COUNT_RE = r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$"  # an integer count, also written as 260.0 or 1e3
_LABEL_RE = r"^[01]$"
_EXAMPLES_KEPT = 5

SCHEMA = pa.schema(
    [("row_id", pa.int64()), (LABEL, pa.int8())]
    + [(f, pa.float64()) for f in NUMERIC_FIELDS]
    + [(f, pa.string()) for f in CATEGORICAL_FIELDS]
)


@dataclass
class ReadReport:
    """What a read kept and what it skipped (only non-zero with `skip_bad_rows`)."""

    rows: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        if not self.skipped_total:
            return f"read {self.rows} rows, no bad rows"
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        return f"read {self.rows} rows, skipped {self.skipped_total} bad rows ({kinds}); first: {self.examples[0]}"


@dataclass(frozen=True)
class FileFormat:
    delimiter: str
    has_header: bool


def detect_format(path: Path | ObjectFile) -> FileFormat:
    """Tab without header (Kaggle train.txt) or comma with a `label,I1,...,C26` header."""
    with open_text(path) as f:
        head = f.read(1 << 16)  # a header or a Criteo record is far shorter
    first = head.split(b"\n", 1)[0].decode("utf-8", errors="replace").rstrip("\r")
    if not first:
        raise MalformedRowError(f"{path}:1: empty first line; expected a Criteo record or a header")
    delimiter = "\t" if "\t" in first else ","
    names = [c.strip() for c in first.split(delimiter)]
    if names[0] != LABEL:
        return FileFormat(delimiter, has_header=False)
    if names != list(FIELDS):
        bad = next(
            (i for i, (a, b) in enumerate(zip(names, FIELDS, strict=False)) if a != b),
            min(len(names), N_FIELDS),
        )
        got = names[bad] if bad < len(names) else "<nothing>"
        raise MalformedRowError(
            f"{path}:1: header column {bad + 1} is {got!r}, expected {FIELDS[bad]!r} (header must be label,I1..I13,C1..C26)"
        )
    return FileFormat(delimiter, has_header=True)


def read_batches(
    path: str | Path | ObjectFile, skip_bad_rows: bool = False, report: ReadReport | None = None
) -> Iterator[pa.RecordBatch]:
    """Yield validated columnar batches of a Criteo file (see module docstring for the schema).

    Args:
        path: a local file, or an `ObjectFile` (an object in a bucket), read in one or two streamed passes.
    Raises:
        MalformedRowError: on the first bad row, unless `skip_bad_rows`, which counts them into `report`.
    """
    p = path if isinstance(path, ObjectFile) else Path(path)
    if isinstance(p, Path) and not p.is_file():
        raise DataError(f"data file not found: {p}")
    report = report if report is not None else ReadReport()
    try:
        yield from _read(p, detect_format(p), skip_bad_rows, report)
    except OSError as e:
        if isinstance(e, FileNotFoundError) or codec(p) is None:
            raise
        raise DataError(truncated_message(p, e)) from e


def _read(
    p: Path | ObjectFile, fmt: FileFormat, skip_bad_rows: bool, report: ReadReport
) -> Iterator[pa.RecordBatch]:
    done = 0  # rows already yielded by the fast path; row ids are the same on both paths
    if not skip_bad_rows:
        try:
            for batch in _typed_batches(p, fmt):
                done += batch.num_rows
                report.rows += batch.num_rows
                yield batch
            return
        except (pa.ArrowInvalid, _NeedsValidation):
            pass  # re-read with the validating parser, which names the bad line (or accepts the file)
    for batch in _validated_batches(p, fmt, skip_bad_rows, report):
        if done:
            batch = batch.filter(pc.greater_equal(batch.column("row_id"), done))
        if batch.num_rows:
            report.rows += batch.num_rows
            yield batch


class _NeedsValidation(Exception):
    """The fast parse accepted a value the contract rejects (label not 0/1, non-finite count)."""


def _typed_batches(path: Path | ObjectFile, fmt: FileFormat) -> Iterator[pa.RecordBatch]:
    types = {
        LABEL: pa.int8(),
        **{f: pa.float64() for f in NUMERIC_FIELDS},
        **{f: pa.string() for f in CATEGORICAL_FIELDS},
    }
    reader = pacsv.open_csv(
        open_text(path),
        read_options=pacsv.ReadOptions(
            column_names=list(FIELDS),
            skip_rows=int(fmt.has_header),
            block_size=BLOCK_SIZE,
        ),
        parse_options=pacsv.ParseOptions(delimiter=fmt.delimiter, quote_char=False, ignore_empty_lines=True),
        convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""], strings_can_be_null=False),
    )
    next_id = 0
    for batch in reader:
        label = batch.column(LABEL)
        if label.null_count or not pc.all(pc.is_in(label, pa.array([0, 1], pa.int8()))).as_py():
            raise _NeedsValidation
        for f in NUMERIC_FIELDS:
            if pc.all(pc.is_finite(batch.column(f))).as_py() is False:
                raise _NeedsValidation
        ids = pa.array(np.arange(next_id, next_id + batch.num_rows, dtype=np.int64))
        next_id += batch.num_rows
        yield pa.RecordBatch.from_arrays([ids, *batch.columns], schema=SCHEMA)


def _validated_batches(
    path: Path | ObjectFile, fmt: FileFormat, skip: bool, report: ReadReport
) -> Iterator[pa.RecordBatch]:
    # One string per physical line (the delimiter never occurs), so row index -> exact line number.
    reader = pacsv.open_csv(
        open_text(path),
        read_options=pacsv.ReadOptions(
            column_names=["line"], skip_rows=int(fmt.has_header), block_size=BLOCK_SIZE
        ),
        parse_options=pacsv.ParseOptions(delimiter="\x01", quote_char=False, ignore_empty_lines=False),
        convert_options=pacsv.ConvertOptions(column_types={"line": pa.string()}, strings_can_be_null=False),
    )
    first_line = 1 + int(fmt.has_header)
    next_id = 0
    for batch in reader:
        lines = batch.column(0)
        line_no = np.arange(first_line, first_line + len(lines), dtype=np.int64)
        first_line += len(lines)
        keep = pc.greater(pc.binary_length(lines), 0)  # blank lines are skipped, like any CSV reader
        lines, line_no = lines.filter(keep), line_no[keep.to_numpy(zero_copy_only=False)]
        out = _validate(path, fmt, lines, line_no, next_id, skip, report)
        next_id += len(lines)
        if out.num_rows:
            yield out


def _validate(
    path: Path | ObjectFile,
    fmt: FileFormat,
    lines: pa.Array,
    line_no: np.ndarray,
    first_id: int,
    skip: bool,
    report: ReadReport,
) -> pa.RecordBatch:
    """Check one batch of lines; return its good rows as a SCHEMA batch (raise on a bad one unless `skip`)."""
    n = len(lines)
    parts = pc.split_pattern(lines, fmt.delimiter)
    counts = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    ok = np.flatnonzero(counts == N_FIELDS)  # rows whose fields can be checked one by one
    starts = parts.offsets.to_numpy()[:-1][ok]
    # Per row, the first problem: kind 0 = field count, 1 = label, 2 = count; and the offending field.
    problem = np.where(counts != N_FIELDS, 0, -1)
    bad_field = np.full(n, -1)
    columns: list[pa.Array] = []  # each over the `ok` rows only
    for j, name in enumerate(FIELDS):
        col = parts.values.take(pa.array(starts + j)) if ok.size else pa.array([], pa.string())
        if name == LABEL or name in NUMERIC_FIELDS:
            valid = pc.match_substring_regex(col, _LABEL_RE if name == LABEL else _COUNT_RE)
            if name != LABEL:
                valid = pc.or_(valid, pc.equal(col, ""))
            rows = ok[~valid.to_numpy(zero_copy_only=False)]
            rows = rows[problem[rows] < 0]
            problem[rows], bad_field[rows] = (1 if name == LABEL else 2), j
        columns.append(col)
    bad = problem >= 0
    if bad.any():
        ok_pos = np.full(n, -1)
        ok_pos[ok] = np.arange(ok.size)
        messages = [
            _message(path, fmt, int(counts[i]), problem[i], bad_field[i], columns, ok_pos[i], line_no[i])
            for i in np.flatnonzero(bad)[:_EXAMPLES_KEPT]
        ]
        if not skip:
            raise MalformedRowError(messages[0] + " (pass --skip-bad-rows to count and skip such rows)")
        for kind, k in zip(*np.unique(problem[bad], return_counts=True), strict=True):
            key = ("wrong field count", "bad label", "non-numeric count")[kind]
            report.skipped[key] = report.skipped.get(key, 0) + int(k)
        report.examples.extend(messages[: max(0, _EXAMPLES_KEPT - len(report.examples))])
    good = pa.array(~bad[ok])
    ids = pa.array(first_id + ok).filter(good)
    arrays: list[pa.Array] = [ids, pc.cast(columns[0].filter(good), pa.int8())]
    for col in columns[1 : 1 + len(NUMERIC_FIELDS)]:
        col = col.filter(good)
        arrays.append(pc.cast(pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.string()), col), pa.float64()))
    arrays.extend(col.filter(good) for col in columns[1 + len(NUMERIC_FIELDS) :])
    return pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)


def _message(
    path: Path | ObjectFile,
    fmt: FileFormat,
    count: int,
    kind: int,
    field_idx: int,
    columns: list[pa.Array],
    pos: int,
    line: int,
) -> str:
    """The error text for one bad row: file:line, then the field count or the field, its value and what was expected."""
    where = f"{path}:{line}"
    if kind == 0:
        sep = "tab" if fmt.delimiter == "\t" else "comma"
        detail = (
            f"missing fields from {FIELDS[count]} on"
            if count < N_FIELDS
            else f"{count - N_FIELDS} extra field(s) after C26"
        )
        return f"{where}: expected {N_FIELDS} {sep}-separated fields (label, I1-I13, C1-C26), got {count}: {detail}"
    value = columns[field_idx][pos].as_py()
    expected = "0 or 1" if kind == 1 else "an integer count or an empty cell"
    return f"{where}: field {FIELDS[field_idx]} is {value!r}, expected {expected}"
