"""Durable files for the pipelines' state: a whole-file replace and a folder fsync that survive a kill or a
power cut (the online trainer's and live evaluation's state, the rollout controller's state, journal and the
model config file it writes)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def fsync_folder(folder: Path) -> None:
    """Make the folder's entries (a rename, a new file) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, text: str, mode: int | None = None) -> None:
    """Replace `path` by `text`: a temporary file, fsync, rename, fsync of the folder. A kill or an OSError (full
    disk) at any point leaves the previous file intact; `mode` (default: the file's own, else 0o644) is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if mode is None:
        try:
            mode = path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_folder(path.parent)


def read_state(path: Path, make: Callable[..., T], what: str) -> T | None:
    """`make(**fields)` of the JSON state file at `path`; None when there is none yet. ValueError naming `what`
    (e.g. "a trainer state") when the file does not hold one."""
    if not path.exists():
        return None
    try:
        return make(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} is not {what} ({e}); move it away to start afresh") from e
