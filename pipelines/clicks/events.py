"""Reading the two event streams the join needs: sampled request logs and click events, by time range.

Both are folders of append-only JSON-lines files: the request log (`serving/observability/request_log.py`,
`requests-<pid>-<n>.jsonl`, one line per request with its `time`) and the clicks (`*.jsonl`, one line
`{"request_id": "...", "instance": 0, "time": 1764489600.25}` per click, `time` in Unix seconds). A file
whose mtime is before a range's start holds nothing of it (lines are appended in time order), so a reader
skips it unopened: what a join reads is bounded by the recent files, not by history.

A line that cannot be read counts as bad in the range of the last good line before it in its file (the
file's mtime when there is none), so every bad line is counted exactly once over consecutive ranges.
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

from pipelines.clicks.request_log_rows import raw_rows

MTIME_SLACK_S = 2.0  # a line stamped just before its file's mtime was set is still found


@dataclass
class Counts:
    """What a read skipped, by kind: bad request lines, bad click lines, requests without raw fields..."""

    kinds: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1) -> None:
        self.kinds[kind] = self.kinds.get(kind, 0) + n


@dataclass(frozen=True)
class Request:
    """One logged request: its id, time (Unix seconds) and raw rows (None when it carried no raw fields)."""

    request_id: str
    time: float
    rows: list[dict[str, Any]] | None


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


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a file; a last line without its newline (being written) is left for later."""
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.endswith(b"\n"):
                yield number, line


def _stamp(value: Any) -> float:
    """A request log `time` (ISO 8601, 'Z') or a click `time` (Unix seconds) as Unix seconds."""
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise ValueError(f"bad time {value!r}")


def read_requests(folder: Path, start: float, end: float, counts: Counts) -> Iterator[Request]:
    """Requests logged in [start, end); bad lines in the range are counted as 'bad request lines'."""
    # `**/`: also one folder per pod, as the k8s serving pods write them.
    for path in _recent_files(folder, "**/requests-*.jsonl", start):
        last = path.stat().st_mtime
        for _, line in _lines(path):
            try:
                entry = json.loads(line)
                request_id, stamp = entry["request_id"], _stamp(entry["time"])
                if not isinstance(request_id, str) or not request_id:
                    raise ValueError("no request id")
            except (ValueError, KeyError, TypeError):
                if start <= last < end:
                    counts.add("bad request lines")
                continue
            last = stamp
            if start <= stamp < end:
                yield Request(request_id, stamp, raw_rows(entry.get("inputs")))


def read_clicks(folder: Path, start: float, end: float, counts: Counts) -> Iterator[Click]:
    """Clicks stamped in [start, end); bad lines in the range are counted as 'bad click lines'."""
    for path in _recent_files(folder, "*.jsonl", start):
        last = path.stat().st_mtime
        for number, line in _lines(path):
            try:
                entry = json.loads(line)
                request_id, instance, stamp = entry["request_id"], entry["instance"], _stamp(entry["time"])
                if not isinstance(request_id, str) or not isinstance(instance, int) or instance < 0:
                    raise ValueError("bad id or instance")
            except (ValueError, KeyError, TypeError):
                if start <= last < end:
                    counts.add("bad click lines")
                continue
            last = stamp
            if start <= stamp < end:
                yield Click(request_id, instance, stamp, (path.name, number))


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
