"""Durable files for the pipelines' state: a whole-file replace, an appended JSON line and a folder fsync that
survive a kill or a power cut (the services' state files, pipelines/service/state_file.py; live evaluation's
history, the rollout controller's journal and the model config file it writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path


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


def append_line(path: Path, record: object) -> int:
    """Append `record` as one JSON line and fsync it (the folder too, when the file is new); returns the file's
    new length. A kill mid-append can leave a torn last line: `cut` it off before reading on."""
    new = not path.exists()
    with path.open("ab") as f:
        f.write((json.dumps(record, sort_keys=True) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
        length = f.tell()
    if new:
        fsync_folder(path.parent)  # the file itself survives a power cut
    return length


def cut(path: Path, length: int) -> None:
    """Cut `path` back to `length` bytes (fsynced), when it is longer: what was appended after that goes."""
    if path.exists() and path.stat().st_size > length:
        with path.open("r+b") as f:
            f.truncate(length)
            os.fsync(f.fileno())
