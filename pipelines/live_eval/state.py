"""The evaluator's durable files: STATE/state.json, STATE/snapshot.json and STATE/history.jsonl.

`state.json` says which interval is next, how long history.jsonl was once the last interval was recorded, and the
click-event counts so far. It is replaced atomically (pipelines/service/state_file.py) and is the last write of
an interval, so a kill at any moment leaves either the state before the interval (the interval is evaluated
again after a restart, and history.jsonl is first cut back to the recorded length, so its line is written once)
or the state after it (the interval is done).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.durable import append_line, cut, replace_file
from pipelines.service.state_file import StateFile

STATE_FILE, SNAPSHOT_FILE, HISTORY_FILE = "state.json", "snapshot.json", "history.jsonl"


@dataclass
class State:
    """Where the evaluator is; every field survives a restart."""

    interval_s: float
    attribution_window_s: float
    next: int
    history_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # the join's counts by kind, all intervals so far


def state_file(folder: Path) -> StateFile[State]:
    """The evaluator's state file in its --state-dir."""
    return StateFile(folder / STATE_FILE, State, "a live evaluation state")


def cut_history(folder: Path, length: int) -> None:
    """Cut history.jsonl back to `length` bytes: lines of an interval that was not recorded go."""
    cut(folder / HISTORY_FILE, length)


def append_history(folder: Path, snapshot: dict[str, Any]) -> int:
    """Append one snapshot line to history.jsonl (fsynced); returns the file's new length."""
    return append_line(folder / HISTORY_FILE, snapshot)


def write_snapshot(folder: Path, snapshot: dict[str, Any]) -> None:
    """Replace snapshot.json atomically; on an OSError the previous one stays intact."""
    replace_file(folder / SNAPSHOT_FILE, json.dumps(snapshot, indent=1, sort_keys=True) + "\n")


def read_history(folder: Path) -> list[dict[str, Any]]:
    """Every snapshot line of history.jsonl, oldest first."""
    path = folder / HISTORY_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
