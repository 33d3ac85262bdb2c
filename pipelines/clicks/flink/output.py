"""The Flink join's output: an interval's partitions and report, written as the embedded join writes them.

The rows are put in the embedded join's order (request log file path, line number, then instance; shadow rows by their shadow line's place) and go
through pipelines/clicks/join.py's own table, hash holdout and atomic write, so both engines' partitions hold
the same columns and rows. REPORTS/interval-N.json (the JoinReport) is written last: once it exists, the
interval's partitions are complete.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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
