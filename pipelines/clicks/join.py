"""The click join: logged requests labelled by their clicks, in one of two modes.

- By interval (`join_interval`, the online loop's and `python -m pipelines.clicks`'s default): one
  interval's requests, labelled by the clicks within the attribution window, as Parquet partitions.
- Whole logs (`join_logs`, `python -m pipelines.clicks --format criteo`, the daily loop's data): every
  request of a day's closed logs, labelled by a click list (no times, no window), as one Kaggle train.txt
  file.

By interval: a request's instance logged at time t is a positive when a click on (request id, instance)
arrives in [t, t + window], else a negative: the join runs once the window of the interval's last request
has closed. Each click is counted once, by the interval its own time falls in ("owned" clicks):

- `clicks`: attributed to a request's instance, the first in its window;
- `duplicate clicks`: a second click on an instance already clicked (it changes no label);
- `late clicks`: after the window closed (the row stays a negative);
- `clicks before their request`: stamped before the request they name (clock skew; dropped);
- `unknown clicks`: no request with that id and instance was logged from one window before the interval to
  one window after it.

A request id logged twice (a retry) counts once (`duplicate requests`). Memory holds the requests and clicks
of the interval widened by one window on each side, never more. The output is two Parquet files, the
interval's training rows and its held-out rows (a hash of the request id picks ~`holdout` of the requests),
which `python -m training --data DIR/train` and `python -m export --eval-data` read. Each row also says what
served it: `model`, `version`, `version_label` (the label that routed it, null for the latest or an explicit
version), `canary` and `score` (the logged `ctr`), so a version's live figures can be computed from its rows.

Shadow lines (the same request scored by the `shadow` label's version) are joined to their request's rows and
clicks and written to a third file, OUT/shadow/: never to train/ or holdout/ (training never sees a request
twice), and they count no clicks and no duplicate requests. A shadow line whose request id has no primary line
with raw rows in the interval counts as `shadow lines without their request`; a repeated shadow line (a
retried request) is skipped, its primary counting as the duplicate request.

Whole logs: every instance of every logged request becomes one row, label 1 when the click list names it,
else 0; a request id logged twice (a retry) counts once, requests logged as engineered feature vectors are
counted and skipped. The output is the input of `python -m training --data FILE` (docs/daily-loop.md).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctr_contract.schema import CATEGORICAL_FIELDS, LABEL, NUMERIC_FIELDS
from ctr_contract.traffic import salted_share
from pipelines.clicks.events import (
    Click,
    Counts,
    Request,
    log_files,
    read_click_list,
    read_clicks,
    read_logged,
    read_requests,
)

CLICK_KINDS = ("clicks", "duplicate clicks", "late clicks", "clicks before their request", "unknown clicks")


@dataclass
class JoinReport:
    """What one interval's join read, wrote and counted."""

    interval: int
    start: float
    end: float
    requests: int = 0
    rows: int = 0
    positives: int = 0
    holdout_rows: int = 0
    shadow_rows: int = 0
    newest_row_time: float | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def partition_name(interval: int) -> str:
    """The file name of an interval's partition: natural order is time order."""
    return f"interval-{interval:09d}.parquet"


def _number(v: Any) -> float | None:
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


# One joined row: (the request with its raw rows, instance, click label, the line that scored it). The scoring
# line is the request itself, or its shadow line.
Row = tuple[Request, int, int, Request]


def _table(rows: list[Row]) -> pa.Table:
    """Joined rows -> a Criteo Parquet table (+ request_id, instance, time, model, version, version_label,
    canary and score columns)."""
    cols: dict[str, pa.Array] = {LABEL: pa.array([y for _, _, y, _ in rows], pa.int8())}
    for f in NUMERIC_FIELDS:
        cols[f] = pa.array([_number(r.rows[i].get(f)) for r, i, _, _ in rows], pa.float64())  # type: ignore[index]
    for f in CATEGORICAL_FIELDS:
        values = [r.rows[i].get(f) for r, i, _, _ in rows]  # type: ignore[index]
        cols[f] = pa.array([None if v in (None, "") else str(v) for v in values], pa.string())
    cols["request_id"] = pa.array([r.request_id for r, _, _, _ in rows], pa.string())
    cols["instance"] = pa.array([i for _, i, _, _ in rows], pa.int32())
    cols["time"] = pa.array([r.time for r, _, _, _ in rows], pa.float64())
    cols["model"] = pa.array([s.model for _, _, _, s in rows], pa.string())
    cols["version"] = pa.array([s.version for _, _, _, s in rows], pa.int64())
    cols["version_label"] = pa.array([s.label for _, _, _, s in rows], pa.string())
    cols["canary"] = pa.array([s.canary for _, _, _, s in rows], pa.bool_())
    cols["score"] = pa.array([s.score(i) for _, i, _, s in rows], pa.float64())
    return pa.table(cols)


def _write(table: pa.Table, path: Path) -> None:
    """Write atomically: a partial file (full disk, kill) never takes the partition's name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table, tmp)
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def held_out(request_id: str, fraction: float) -> bool:
    """Whether a request's rows are held out (deterministic in its id, so every run agrees). Drawn independently of
    the request log's sample: with plain crc32 both ways, every sampled request of an id length fell on the same
    side (an interval of the simulator's ids: 6,200 rows held out, none to train on)."""
    return salted_share(b"holdout:", request_id, fraction)


def join_interval(
    logs: Path,
    clicks: Path,
    out: Path,
    interval: int,
    start: float,
    end: float,
    window_s: float,
    holdout: float,
) -> JoinReport:
    """Join requests logged in [start, end) with their clicks; write OUT/train, OUT/holdout and OUT/shadow
    partitions."""
    report, counts = JoinReport(interval, start, end), Counts()
    requests: dict[str, Request] = {}  # the interval's own requests
    shadows: dict[str, Request] = {}  # the interval's shadow lines, by request id
    nearby: dict[str, Request] = {}  # one window either side: ids only matter, for counting clicks
    for r in read_requests(logs, start - window_s, end + window_s, counts, count=(start, end)):
        if r.shadow:
            if start <= r.time < end:
                shadows.setdefault(r.request_id, r)
            continue
        if not start <= r.time < end:
            nearby.setdefault(r.request_id, r)
            continue
        if r.request_id in requests:
            counts.add("duplicate requests")
            continue
        if r.rows is None:
            counts.add("requests without raw fields")
            continue
        requests[r.request_id] = r
    nearby.update(requests)
    # Every click that could label one of the interval's rows, or that the interval owns, in time order.
    events = sorted(
        read_clicks(clicks, start - window_s, end + window_s, counts, count=(start, end)),
        key=lambda c: (c.time, c.order),
    )
    clicked: set[tuple[str, int]] = set()
    for c in events:
        req = nearby.get(c.request_id)
        kind = _kind(c, req, window_s, clicked)
        if kind == "clicks":
            clicked.add((c.request_id, c.instance))
        if start <= c.time < end:
            counts.add(kind)
    rows: list[Row] = [
        (r, i, int((r.request_id, i) in clicked), r)
        for r in requests.values()
        for i in range(len(r.rows or []))
    ]
    shadow_rows: list[Row] = []
    for request_id, s in shadows.items():
        primary = requests.get(request_id)
        if primary is None:
            counts.add("shadow lines without their request")
            continue
        n = len(primary.rows or [])
        shadow_rows += [(primary, i, int((request_id, i) in clicked), s) for i in range(n)]
    report.requests, report.rows = len(requests), len(rows)
    report.positives = sum(y for _, _, y, _ in rows)
    report.shadow_rows = len(shadow_rows)
    report.newest_row_time = max((r.time for r in requests.values()), default=None)
    report.counts = dict(sorted(counts.kinds.items()))
    train = [row for row in rows if not held_out(row[0].request_id, holdout)]
    test = [row for row in rows if held_out(row[0].request_id, holdout)]
    report.holdout_rows = len(test)
    for part, name in ((train, "train"), (test, "holdout"), (shadow_rows, "shadow")):
        if part:
            _write(_table(part), out / name / partition_name(interval))
    return report


def _kind(c: Click, req: Request | None, window_s: float, clicked: set[tuple[str, int]]) -> str:
    """How one click counts (see the module docstring)."""
    if req is None or req.rows is None or c.instance >= len(req.rows):
        return "unknown clicks"
    if c.time < req.time:
        return "clicks before their request"
    if c.time > req.time + window_s:
        return "late clicks"
    return "duplicate clicks" if (c.request_id, c.instance) in clicked else "clicks"


def partition_rows(path: Path) -> int:
    """Rows in a written partition (0 when there is none)."""
    return pq.ParquetFile(path).metadata.num_rows if path.is_file() else 0


@dataclass
class LogsReport:
    """What a whole-log join read, wrote and skipped."""

    files: int = 0
    requests: int = 0
    rows: int = 0
    clicks: int = 0
    skipped: Counts = field(default_factory=Counts)


def criteo_line(label: int, row: dict[str, Any]) -> str:
    """One Kaggle train.txt line; missing cells (absent, null, NaN, "") are empty."""
    cells = [str(label)]
    for f in NUMERIC_FIELDS:
        v = row.get(f)
        cells.append("" if v is None or v == "" or (isinstance(v, float) and math.isnan(v)) else str(int(v)))
    cells += ["" if row.get(f) is None else str(row[f]) for f in CATEGORICAL_FIELDS]
    return "\t".join(cells)


def join_logs(logs: list[Path], click_list: Path, out: Path) -> LogsReport:
    """Join whole request logs (folders or files) with a click list; write the Criteo file `out`."""
    clicks = read_click_list(click_list)
    report, seen = LogsReport(), set()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tmp.open("w") as sink:
        for path in log_files(logs):
            report.files += 1
            for request_id, rows in read_logged(path, report.skipped):
                if request_id in seen:
                    report.skipped.add("repeated request id")
                    continue
                seen.add(request_id)
                if rows is None:
                    report.skipped.add("request without raw fields")
                    continue
                report.requests += 1
                for i, row in enumerate(rows):
                    label = int((request_id, i) in clicks)
                    sink.write(criteo_line(label, row) + "\n")
                    report.rows += 1
                    report.clicks += label
    tmp.replace(out)
    return report
