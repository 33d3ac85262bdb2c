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

import json
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pyflink.table import DataTypes, StreamTableEnvironment
from pyflink.table.udf import udf

from pipelines.clicks.flink import sql
from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.flink.logic import BAD, REQUEST, FileCursor, line_event
from pipelines.clicks.flink.output import write_result

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
        t2 = time.monotonic()
        # The writing runs in a fresh process: this one holds pyflink's gRPC and Beam threads, whose turns at
        # the GIL made the same writing 2.4x slower here than in a process of its own (py-spy, 200k rows).
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            reports, phases = pool.submit(write_result, tmp, cfg.to_dict()).result()
    times = {k: round(v, 2) for k, v in {"plan": t1 - t0, "query": t2 - t1, **phases}.items()}
    print(json.dumps({"phases_s": times}), file=sys.stderr, flush=True)
    return reports
