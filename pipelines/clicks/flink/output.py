"""The Flink join's output: an interval's partitions and report, written as the embedded join writes them.

The rows are put in the embedded join's order (request log file path, line number, then instance; shadow rows by their shadow line's place) and go
through pipelines/clicks/join.py's own table, hash holdout and atomic write, so both engines' partitions hold
the same columns and rows. REPORTS/interval-N.json (the JoinReport) is written last: once it exists, the
interval's partitions are complete.
"""

from __future__ import annotations

import gc
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from pipelines.clicks.events import Request, request_line, served
from pipelines.clicks.flink import sql
from pipelines.clicks.flink.config import JobConfig
from pipelines.clicks.join import JoinReport, Row, _table, _write, held_out, partition_name


def report_path(reports: Path, interval: int) -> Path:
    return reports / f"interval-{interval:09d}.json"


def write_interval(
    cfg: JobConfig, interval: int, start: float, end: float, rows: list[Any], counts: dict[str, int]
) -> str:
    """Write one closed interval from its "row" payloads ((order, request), labels, (order, shadow line) or
    None) and counts; returns its report as JSON."""
    rows.sort(key=lambda r: r[0][0])
    joined: list[Row] = [(req, i, y, req) for (_, req), labels, _ in rows for i, y in enumerate(labels)]
    shadow: list[Row] = [
        (req, i, y, s)
        for (_, req), labels, (_, s) in sorted((r for r in rows if r[2] is not None), key=lambda r: r[2][0])
        for i, y in enumerate(labels)
    ]
    report = JoinReport(interval, start, end)
    report.requests, report.rows = len(rows), len(joined)
    report.positives = sum(y for _, _, y, _ in joined)
    report.shadow_rows = len(shadow)
    report.newest_row_time = max((r[0][1].time for r in rows), default=None)
    report.counts = dict(sorted((k, v) for k, v in counts.items() if v))
    train = [r for r in joined if not held_out(r[0].request_id, cfg.holdout)]
    test = [r for r in joined if held_out(r[0].request_id, cfg.holdout)]
    report.holdout_rows = len(test)
    out = Path(cfg.out)
    for part, name in ((train, "train"), (test, "holdout"), (shadow, "shadow")):
        if part:
            _write(_table(part), out / name / partition_name(interval))
    text = report.to_json()
    path = report_path(Path(cfg.reports), interval)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    with tmp.open("rb") as f:
        os.fsync(f.fileno())
    tmp.replace(path)
    return text


def write_result(folder: str, config: dict[str, Any]) -> tuple[list[str], dict[str, float]]:
    """Write every interval of the bounded SQL job from its result files (CSV in `folder`, sql.RESULT's
    columns), one interval at a time: its accepted requests' lines are read again from their files and parsed by
    the embedded join's own functions, written, and let go before the next interval's (the memory of one
    interval's rows, and the dicts a partition's columns are read from close together: the same table from all
    intervals' requests at once took 2.4x as long, py-spy, 200k rows). Returns the reports (JSON, in interval
    order) and the time of the two phases (reread, write)."""
    cfg = JobConfig.from_dict(config)
    result = _read_result(Path(folder))
    found: dict[int, list[tuple[str, str | None, str | None]]] = defaultdict(list)
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    for tag, n, okey, sokey, clicked, kind, cnt in zip(*(result[c] for c in sql.RESULT), strict=True):
        if tag == "counts":
            counts[n][kind] = counts[n].get(kind, 0) + cnt
        else:
            found[n].append((okey, sokey, clicked))
    del result
    phases = {"reread": 0.0, "write": 0.0}
    reports = []
    # Millions of acyclic objects are made below: the cyclic collector would only rescan them, again and again.
    gc.disable()
    try:
        for n, start, end in cfg.explicit:
            t0 = time.monotonic()
            accepted = found.pop(int(n), [])
            orders = [o for okey, sokey, _ in accepted for o in (okey, sokey) if o is not None]
            requests = _requests(cfg.requests["path"], orders)
            t1 = time.monotonic()
            rows = []
            for okey, sokey, clicked in accepted:
                request = requests[okey]
                shadow = (sokey, requests[sokey]) if sokey is not None else None
                on = {int(i) for i in clicked.split(",")} if clicked else set()
                rows.append(((okey, request), [int(i in on) for i in range(len(request.rows or []))], shadow))
            reports.append(write_interval(cfg, int(n), start, end, rows, counts.get(int(n), {})))
            del rows, requests
            phases["reread"] += t1 - t0
            phases["write"] += time.monotonic() - t1
    finally:
        gc.enable()
    return reports, phases


def _read_result(folder: Path) -> dict[str, list[Any]]:
    """The query's result files (CSV, no header; an empty field is NULL) as sql.RESULT's columns (lists)."""
    types = {name: pa.int64() if name in ("n", "cnt") else pa.string() for name in sql.RESULT}
    read = pacsv.ReadOptions(column_names=list(sql.RESULT))
    convert = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))
    tables = [
        pacsv.read_csv(f, read_options=read, convert_options=convert) for f in files if f.stat().st_size
    ]
    schema = pa.schema([(name, types[name]) for name in sql.RESULT])
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    return {name: table.column(name).to_pylist() for name in sql.RESULT}


def _requests(root: str, orders: list[str]) -> dict[str, Request]:
    """The requests the orders name, read again from their files (a log file is only appended to, so line k is
    the line the job parsed) and parsed by the embedded join's own functions."""
    wanted: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for order in sorted(
        orders
    ):  # file by file, line by line: the parsed requests lie in memory in that order
        rel, number = sql.line_of(order)
        wanted[rel].append((number, order))
    out = {}
    for rel, numbers in wanted.items():
        lines = (Path(root.removeprefix("file:")) / rel).read_bytes().split(b"\n")
        for number, order in numbers:
            request_id, t, entry = request_line(lines[number - 1])
            out[order] = served(request_id, t, entry)
    return out
