"""The evaluator's durable files: STATE/state.json, STATE/snapshot.json and STATE/history.jsonl.

`state.json` says which interval is next, how long history.jsonl was once the last interval was recorded, and the
click-event counts so far. It is replaced atomically (temporary file, fsync, rename, fsync of the folder) and is
the last write of an interval, so a kill at any moment leaves either the state before the interval (the
interval is evaluated again after a restart, and history.jsonl is first cut back to the recorded length, so its
line is written once) or the state after it (the interval is done).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.durable import read_state, replace_file

STATE_FILE, SNAPSHOT_FILE, HISTORY_FILE = "state.json", "snapshot.json", "history.jsonl"


@dataclass
class State:
    """Where the evaluator is; every field survives a restart."""

    interval_s: float
    attribution_window_s: float
    next: int
    history_bytes: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # the join's counts by kind, all intervals so far


def load(folder: Path) -> State | None:
    """The saved state, or None when the folder holds none yet."""
    return read_state(folder / STATE_FILE, State, "a live evaluation state")


def write_atomic(folder: Path, name: str, text: str) -> None:
    """Replace folder/name with `text` atomically; on an OSError the previous file stays intact."""
    replace_file(folder / name, text)


def save(folder: Path, state: State) -> None:
    write_atomic(folder, STATE_FILE, json.dumps(asdict(state), indent=1, sort_keys=True) + "\n")


def cut_history(folder: Path, length: int) -> None:
    """Cut history.jsonl back to `length` bytes: lines of an interval that was not recorded go."""
    path = folder / HISTORY_FILE
    if path.exists() and path.stat().st_size > length:
        with path.open("r+b") as f:
            f.truncate(length)
            os.fsync(f.fileno())


def append_history(folder: Path, snapshot: dict[str, Any]) -> int:
    """Append one snapshot line to history.jsonl (fsynced); returns the file's new length."""
    with (folder / HISTORY_FILE).open("ab") as f:
        f.write((json.dumps(snapshot, sort_keys=True) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def write_snapshot(folder: Path, snapshot: dict[str, Any]) -> None:
    write_atomic(folder, SNAPSHOT_FILE, json.dumps(snapshot, indent=1, sort_keys=True) + "\n")


def read_history(folder: Path) -> list[dict[str, Any]]:
    """Every snapshot line of history.jsonl, oldest first."""
    path = folder / HISTORY_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
