"""Reading the two event streams the join needs: sampled request logs, and clicks.

The request log (`serving/observability/request_log.py`) is a folder of append-only JSON-lines files,
`requests-<pid>-<n>.jsonl` (in subfolders too: one per pod on Kubernetes), one line per request with its
`time`; only requests that carry the raw Criteo fields (the `raw` signature: I1..I13, C1..C26 by name, in
row or columnar form) can become rows. A line also says what served it: `model` {`name`, `version`, `label`
(the version label that routed it, or null)}, `canary` (true for canary traffic), `shadow` (true for a shadow
line: the same request scored by the `shadow` label's version, no `inputs`) and `outputs` (per instance, its
scores; the first is the `ctr`). Lines of servers that log no label, canary or shadow read as label null,
canary false, shadow false. Clicks come in one of two forms:

- by interval (`read_requests`, `read_clicks`): a folder of click events (`*.jsonl`, one line
  `{"request_id": "...", "instance": 0, "time": 1764489600.25}` per click, `time` in Unix seconds). A file
  whose mtime is before a range's start holds nothing of it (lines are appended in time order), so a reader
  skips it unopened, and stops reading a file at its first line stamped `ORDER_SLACK_S` past the range's end:
  what a join reads is bounded by the range, not by history or by the files after it. A line that cannot be
  read counts as bad in the range of the last good line before it in its file (the file's mtime when there
  is none), so every bad line is counted exactly once over consecutive ranges; a last line without its
  newline is being written and is left for later.
- whole logs (`log_files`, `read_logged`, `read_click_list`): a day's closed logs and a click list, one
  click per line, `REQUEST_ID` (the first instance) or `REQUEST_ID<TAB>INSTANCE` (0-based), e.g. from the
  click tracker that received the `x-request-id` the server returned. A last line without its newline was
  cut (a disk that filled up) and counts as unreadable.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ctr_contract.schema import RAW_FIELDS

MTIME_SLACK_S = 2.0  # a line stamped just before its file's mtime was set is still found
# Lines are appended in time order, give or take this much (a shadow line is written after its request is scored
# off the client's path, with the request's time): a reader stops reading a file at the first line stamped this
# far past its range's end, so a catching-up reader's cost is bounded by its range, not by the files after it.
ORDER_SLACK_S = 60.0
# `**/`: also one folder per pod, as the k8s serving pods write them. Click files: `*.jsonl` in the folder itself.
REQUEST_LOG_PREFIX, LOG_SUFFIX = "requests-", ".jsonl"
REQUEST_LOGS = f"**/{REQUEST_LOG_PREFIX}*{LOG_SUFFIX}"
CLICK_FILES = f"*{LOG_SUFFIX}"
# What a line that cannot be read raises (`request_line`, `click_line`).
BAD_LINE = (ValueError, KeyError, TypeError)


@dataclass
class Counts:
    """What a read skipped, by kind: bad request lines, bad click lines, requests without raw fields..."""

    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + n


@dataclass(frozen=True)
class Request:
    """One logged request: its id, time (Unix seconds), raw rows (None when it carried no raw fields), and what
    served it: model name, version, version label, canary and shadow flags, each instance's `ctr` score."""

    request_id: str
    time: float
    rows: list[dict[str, Any]] | None
    model: str | None = None
    version: int | None = None
    label: str | None = None
    canary: bool = False
    shadow: bool = False
    scores: list[float | None] | None = None

    def score(self, instance: int) -> float | None:
        """The logged `ctr` of one instance (None when the line logged none for it)."""
        return self.scores[instance] if self.scores is not None and instance < len(self.scores) else None


@dataclass(frozen=True)
class Click:
    """One click event: (request id, instance) clicked at `time` (Unix seconds); `order` breaks time ties."""

    request_id: str
    instance: int
    time: float
    order: tuple[str, int]


def _recent_files(folder: Path, pattern: str, start: float) -> list[Path]:
    """Files of `folder` matching `pattern` that may hold lines at or after `start`, in name order."""
    if not folder.is_dir():
        return []
    out = []
    for f in sorted(folder.glob(pattern)):
        try:
            if f.stat().st_mtime >= start - MTIME_SLACK_S:
                out.append(f)
        except FileNotFoundError:  # rotated away between glob and stat
            continue
    return out


def _lines(path: Path, closed: bool = False) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a file; a last line without its newline is left for later (being written)
    unless the file is `closed` (then it was cut short, and is read to be counted)."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if closed or line.endswith(b"\n"):
                yield number, line


def raw_rows(inputs: Any) -> list[dict[str, Any]] | None:
    """A logged request's inputs as one dict per instance, or None when they are not raw Criteo fields."""
    if isinstance(inputs, dict) and isinstance(inputs.get("instances"), list):
        rows = inputs["instances"]
        return rows if rows and all(isinstance(r, dict) and set(r) <= set(RAW_FIELDS) for r in rows) else None
    columns = inputs.get("inputs") if isinstance(inputs, dict) else None
    if isinstance(columns, dict) and columns and set(columns) <= set(RAW_FIELDS):
        lengths = {len(v) for v in columns.values() if isinstance(v, list)}
        if len(lengths) == 1 and len(columns) == sum(isinstance(v, list) for v in columns.values()):
            return [{k: v[i] for k, v in columns.items()} for i in range(lengths.pop())]
    return None


def _first_score(output: Any) -> float | None:
    """One instance's logged outputs -> its `ctr` (the first output), or None when it is not a finite number."""
    if isinstance(output, list):
        output = output[0] if output else None
    if isinstance(output, int | float) and not isinstance(output, bool) and math.isfinite(output):
        return float(output)
    return None


def served(request_id: str, stamp: float, entry: dict[str, Any]) -> Request:
    """A request log entry as a Request; the serving fields a line lacks (older servers) take their defaults."""
    model = entry.get("model")
    model = model if isinstance(model, dict) else {}
    name, version, label = model.get("name"), model.get("version"), model.get("label")
    outputs = entry.get("outputs")
    return Request(
        request_id,
        stamp,
        raw_rows(entry.get("inputs")),
        model=name if isinstance(name, str) else None,
        version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        label=label if isinstance(label, str) else None,
        canary=entry.get("canary") is True,
        shadow=entry.get("shadow") is True,
        scores=[_first_score(o) for o in outputs] if isinstance(outputs, list) else None,
    )


def _request_entry(line: bytes) -> tuple[str, dict[str, Any]]:
    """A request log line's request id and entry; raises ValueError, KeyError or TypeError when unreadable."""
    entry = json.loads(line)
    request_id = entry["request_id"]
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("no request id")
    return request_id, entry


def request_line(line: bytes) -> tuple[str, float, dict[str, Any]]:
    """A request log line's request id, time (Unix seconds) and entry; raises one of BAD_LINE when unreadable."""
    request_id, entry = _request_entry(line)
    return request_id, _stamp(entry["time"]), entry


def click_line(line: bytes) -> tuple[str, int, float]:
    """A click line's request id, instance and time (Unix seconds); raises one of BAD_LINE when unreadable."""
    entry = json.loads(line)
    request_id, instance, stamp = entry["request_id"], entry["instance"], _stamp(entry["time"])
    if not isinstance(request_id, str) or not isinstance(instance, int) or instance < 0:
        raise ValueError("bad id or instance")
    return request_id, instance, stamp


def _stamp(value: Any) -> float:
    """A request log `time` (ISO 8601, 'Z') or a click `time` (Unix seconds) as Unix seconds."""
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"bad time {value!r}")


def read_requests(
    folder: Path, start: float, end: float, counts: Counts, count: tuple[float, float] | None = None
) -> Iterator[Request]:
    """Requests logged in [start, end); bad lines in `count` (default: the same range) are counted as 'bad
    request lines' (a join reads a widened range but counts only its own interval's lines)."""
    lo, hi = count or (start, end)
    for path in _recent_files(folder, REQUEST_LOGS, start):
        last = path.stat().st_mtime
        for _, line in _lines(path):
            try:
                request_id, stamp, entry = request_line(line)
            except BAD_LINE:
                if lo <= last < hi:
                    counts.add("bad request lines")
                continue
            last = stamp
            if start <= stamp < end:
                yield served(request_id, stamp, entry)
            elif stamp >= end + ORDER_SLACK_S:
                break


def read_clicks(
    folder: Path, start: float, end: float, counts: Counts, count: tuple[float, float] | None = None
) -> Iterator[Click]:
    """Clicks stamped in [start, end); bad lines in `count` (default: the same range) are counted as 'bad
    click lines'."""
    lo, hi = count or (start, end)
    for path in _recent_files(folder, CLICK_FILES, start):
        last = path.stat().st_mtime
        for number, line in _lines(path):
            try:
                request_id, instance, stamp = click_line(line)
            except BAD_LINE:
                if lo <= last < hi:
                    counts.add("bad click lines")
                continue
            last = stamp
            if start <= stamp < end:
                yield Click(request_id, instance, stamp, (path.name, number))
            elif stamp >= end + ORDER_SLACK_S:
                break


def log_files(paths: list[Path]) -> list[Path]:
    """The request log files of each path: a folder's (its subfolders' too), or the file itself."""
    out: list[Path] = []
    for p in paths:
        out += _recent_files(p, REQUEST_LOGS, -math.inf) if p.is_dir() else [p]
    return out


def read_logged(path: Path, counts: Counts) -> Iterator[tuple[str, list[dict[str, Any]] | None]]:
    """(request id, raw rows or None) of every request of a closed log file; an unreadable line (a cut last
    line too) counts as 'unreadable line'."""
    for _, line in _lines(path, closed=True):
        try:
            request_id, entry = _request_entry(line)
        except (ValueError, KeyError, TypeError):
            counts.add("unreadable line")
            continue
        yield request_id, raw_rows(entry.get("inputs"))


def read_click_list(path: Path) -> set[tuple[str, int]]:
    """(request id, instance) of every click of a click list; raises ValueError on a line of another form."""
    clicks = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.strip().split("\t")
        if not parts[0]:
            continue
        if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
            raise ValueError(f"{path}:{number}: expected REQUEST_ID or REQUEST_ID<TAB>INSTANCE, got {line!r}")
        clicks.add((parts[0], int(parts[1]) if len(parts) == 2 else 0))
    return clicks


def parse_time(value: str) -> float:
    """A command-line time: Unix seconds, or an ISO 8601 time ('2026-11-30T08:00:00Z')."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected Unix seconds or an ISO 8601 time, got {value!r}"
        ) from None
