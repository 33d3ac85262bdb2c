"""The bounded click join run as Flink SQL in the JVM (pipelines/clicks/flink/sql.py), then written here.

Python does two things: it parses lines, a batch at a time (vectorized functions over Arrow batches, through
logic.line_event: the embedded join's own `request_line`, `click_line` and `served`), and, once the query has
run, it writes
each interval's partitions and report from the query's result with pipelines/clicks/flink/output.py (join.py's
table, hash holdout and atomic write). The query keeps no line in its state: the accepted requests' lines
(and their shadow lines) are read again from their files by the orders the query returns, and parsed again
there, by `served`, for their rows and scores.
"""

from __future__ import annotations

import gc
import json
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import udf

from pipelines.clicks.events import Request, request_line, served
from pipelines.clicks.flink import sql
from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.flink.logic import BAD, REQUEST, FileCursor, line_event
from pipelines.clicks.flink.output import write_interval

TYPES = {"BOOLEAN": DataTypes.BOOLEAN(), "STRING": DataTypes.STRING(), "DOUBLE": DataTypes.DOUBLE(),
         "BIGINT": DataTypes.BIGINT()}  # fmt: skip
MAX_INSTANCE = 2**62  # an instance past every request's rows, within BIGINT


def _row_type(fields: tuple[tuple[str, str], ...]) -> Any:
    return DataTypes.ROW([DataTypes.FIELD(name, TYPES[t]) for name, t in fields])


class LineReader:
    """A vectorized parse function of one stream: its lines (ISO-8859-1 strings: their bytes, exactly) with
    their file's path, mtime and size -> sql.FIELDS[stream], by `logic.line_event` and a cursor a file.

    A file is one split, read in order by one source subtask, and this function runs in that subtask after it:
    each file's lines come in order, batch after batch, so the cursors (kept in this worker) number them."""

    def __init__(self, stream: str, root: str) -> None:
        self.stream, self.root = stream, root
        self.cursors: dict[str, FileCursor] = {}
        self.mtimes: dict[str, float] = {}

    def __call__(
        self, lines: pd.Series, paths: pd.Series, mtimes: pd.Series, sizes: pd.Series
    ) -> pd.DataFrame:
        out = [self._row(*x) for x in zip(lines, paths, mtimes, sizes, strict=True)]
        names = [name for name, _ in sql.FIELDS[self.stream]]
        columns = zip(*out, strict=True) if out else [[] for _ in names]
        # Python objects: None stays NULL, an int stays an int
        return pd.DataFrame(
            {name: pd.Series(c, dtype=object) for name, c in zip(names, columns, strict=True)}
        )

    def _row(self, line: str, path: str, mtime_text: str, size: int) -> tuple[Any, ...]:
        cursor = self.cursors.setdefault(path, FileCursor())
        mtime = self.mtimes.get(mtime_text)
        if mtime is None:  # Flink's CAST(mtime AS STRING): UTC, milliseconds
            mtime = self.mtimes[mtime_text] = (
                datetime.fromisoformat(mtime_text).replace(tzinfo=UTC).timestamp()
            )
        e = line_event(self.stream, self.root, path, mtime, int(size), line.encode("latin-1"), cursor)
        if e is None:
            return (False, False, None, None, None, None, None, None)[: len(sql.FIELDS[self.stream])]
        if e[0] == BAD:
            return _pad((True, False, None, e[2]), self.stream, mtime)
        if e[0] == REQUEST:
            request = e[3]
            nrows = None if request.rows is None else len(request.rows)
            return (True, True, e[1], e[2], nrows, request.shadow, sql.order_key(*e[4]), mtime)
        return (True, True, e[1], e[2], min(e[3], MAX_INSTANCE), mtime)


def _pad(head: tuple[Any, ...], stream: str, mtime: float) -> tuple[Any, ...]:
    """A row of sql.FIELDS[stream] from its first fields, NULLs, and the mtime (the last field)."""
    n = len(sql.FIELDS[stream])
    return head + (None,) * (n - len(head) - 1) + (mtime,)


def run(t_env: StreamTableEnvironment, cfg: JobConfig) -> list[str]:
    """Run the query over cfg's filesystem sources and explicit intervals; write every interval; returns the
    reports (JSON), in interval order. Logs the time of each phase (stderr, one JSON line)."""
    t0 = time.monotonic()
    for stream in sql.STREAMS:
        root = getattr(cfg, stream)["path"]
        t_env.execute_sql(sql.source_ddl(stream, root))
        reader = udf(LineReader(stream, root), result_type=_row_type(sql.FIELDS[stream]), func_type="pandas")
        t_env.create_temporary_function(f"parse_{stream}", reader)
    for name, query in sql.views(cfg.window_s, cfg.explicit):
        t_env.create_temporary_view(name, t_env.sql_query(query))
    t1 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ctr-join-result-") as tmp:
        # The MiniCluster starts and the query runs; its result goes to CSV files from the JVM and is read back
        # by pyarrow (collecting it through the client, `to_pandas`, took as long as the query itself).
        t_env.execute_sql(sql.result_ddl(tmp))
        t_env.from_path("joined").execute_insert("joined_files").wait()
        result = _read_result(Path(tmp))
    t2 = time.monotonic()
    # Millions of acyclic objects are made below: the cyclic collector would only rescan them, again and again.
    gc.disable()
    orders = [o for col in ("okey", "sokey") for o in result[col] if isinstance(o, str)]
    requests = _requests(cfg.requests["path"], orders)
    t3 = time.monotonic()
    rows: dict[int, list[Any]] = defaultdict(list)
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for tag, n, okey, sokey, clicked, kind, cnt in result[list(sql.RESULT)].itertuples(index=False):
        if tag == "counts":
            counts[int(n)][kind] = counts[int(n)].get(kind, 0) + int(cnt)
            continue
        request = requests[okey]
        shadow = (sokey, requests[sokey]) if isinstance(sokey, str) else None
        on = {int(i) for i in clicked.split(",")} if isinstance(clicked, str) and clicked else set()
        labels = [int(i in on) for i in range(len(request.rows or []))]
        rows[int(n)].append(((okey, request), labels, shadow))
    reports = [
        write_interval(cfg, int(n), s, e, rows.get(int(n), []), counts.get(int(n), {}))
        for n, s, e in cfg.explicit
    ]
    gc.enable()
    phases = {"plan": t1 - t0, "query": t2 - t1, "reread": t3 - t2, "write": time.monotonic() - t3}
    times = {k: round(v, 2) for k, v in phases.items()}
    print(json.dumps({"phases_s": times, "result_rows": len(result)}), file=sys.stderr, flush=True)
    return reports


def _read_result(folder: Path) -> pd.DataFrame:
    """The query's result files (CSV, no header; an empty field is NULL) as one frame of sql.RESULT's columns."""
    types = {name: pa.int64() if name in ("n", "cnt") else pa.string() for name in sql.RESULT}
    read = pacsv.ReadOptions(column_names=list(sql.RESULT))
    convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    tables = [
        pacsv.read_csv(f, read_options=read, convert_options=convert) for f in files if f.stat().st_size
    ]
    schema = pa.schema([(name, types[name]) for name in sql.RESULT])
    return pa.concat_tables(tables).to_pandas() if tables else schema.empty_table().to_pandas()


def _requests(root: str, orders: list[str]) -> dict[str, Request]:
    """The requests the orders name, read again from their files (a log file is only appended to, so line k is
    the line the job parsed) and parsed by the embedded join's own functions."""
    wanted: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for order in orders:
        rel, number = sql.line_of(order)
        wanted[rel].append((number, order))
    out = {}
    for rel, numbers in wanted.items():
        lines = (Path(root.removeprefix("file:")) / rel).read_bytes().split(b"\n")
        for number, order in numbers:
            request_id, t, entry = request_line(lines[number - 1])
            out[order] = served(request_id, t, entry)
    return out
