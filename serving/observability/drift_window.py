"""The recent-rows window behind the drift gauges (serving/observability/drift.py): a ring buffer of float32 rows,
and the joins of the pending rows that go into it.

In one process the ring is a plain array. Under `--num_workers N` it is a memory-mapped .npy file in the run's
shared metrics directory, `<prefix>_<pid>.npy`, with the count of rows ever written in `<prefix>_<pid>.rows.npy`,
so that the worker answering a scrape reads every live worker's rows (`shared_windows`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class RingBuffer:
    """The last `capacity` rows of width `width` (columns as the caller lays them out)."""

    def __init__(self, capacity: int, directory: Path | None, prefix: str) -> None:
        self.capacity, self.directory, self.prefix = capacity, directory, prefix
        self.rows: np.ndarray | None = None  # (capacity, width) float32
        self.count: np.ndarray = np.zeros(1, dtype=np.int64)  # rows ever written; in a file for other workers
        self._written = 0
        self._next = 0  # the ring position

    def _open(self, width: int) -> np.ndarray:
        self._written = self._next = 0
        if self.directory is None:
            self.rows = np.zeros((self.capacity, width), dtype=np.float32)
            self.count = np.zeros(1, dtype=np.int64)
            return self.rows
        pid = os.getpid()
        self.count = np.lib.format.open_memmap(
            self.directory / f"{self.prefix}_{pid}.rows.npy", mode="w+", dtype=np.int64, shape=(1,)
        )
        self.rows = np.lib.format.open_memmap(
            self.directory / f"{self.prefix}_{pid}.npy",
            mode="w+",
            dtype=np.float32,
            shape=(self.capacity, width),
        )
        return self.rows

    def append(self, block: np.ndarray) -> None:
        """Copy rows (N, width) into the ring, overwriting the oldest; another width starts the ring afresh."""
        n = len(block)
        rows = self.rows
        if rows is None or rows.shape[1] != block.shape[1]:
            rows = self._open(block.shape[1])
        if n > self.capacity:
            block, n = block[-self.capacity :], self.capacity
        start, end = self._next, self._next + n
        first = min(end, self.capacity) - start
        rows[start : start + first] = block[:first]
        if first < n:  # wrap around
            rows[: n - first] = block[first:]
        self._next = end % self.capacity
        self._written += n
        self.count[0] = self._written

    def filled(self) -> np.ndarray:
        """The rows written so far (all of them once the ring is full), (M, width)."""
        if self.rows is None:
            return np.zeros((0, 0), np.float32)
        return self.rows[: min(self._written, self.capacity)]


def shared_windows(directory: Path, prefix: str) -> list[np.ndarray]:
    """Every live worker's filled rows of the ring buffers named `prefix` in `directory`."""
    windows = []
    for count_path in directory.glob(f"{prefix}_*.rows.npy"):
        pid_text = count_path.name[len(prefix) + 1 : -len(".rows.npy")]
        if not pid_text.isdigit() or not _alive(int(pid_text)):
            continue  # a worker that exited: its traffic is no longer "recent"
        try:
            count = int(np.load(count_path, mmap_mode="r")[0])
            rows = np.load(directory / f"{prefix}_{pid_text}.npy", mmap_mode="r")
        except (OSError, ValueError):  # the worker is (re)creating its files right now
            continue
        windows.append(np.asarray(rows[: min(count, len(rows))]))
    return windows


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def rows_of(columns: Sequence[np.ndarray], dtype: type, height: int) -> np.ndarray:
    """(height, 1) columns (or lists of `height`) side by side, (height, N) of `dtype`: their bytes joined when every column is
    contiguous and of `dtype` (the usual case, faster than np.concatenate of many small arrays), else
    concatenated."""
    try:
        data = b"".join(columns)  # type: ignore[arg-type]  # numpy arrays are bytes-like
    except (TypeError, BufferError):  # a merged batch's column is a strided view, or a list: not bytes-like
        data = b""
    if len(data) != len(columns) * height * np.dtype(dtype).itemsize:  # another dtype among them
        return np.concatenate([np.asarray(c, dtype).reshape(height, -1) for c in columns], 1)
    return np.frombuffer(data, dtype).reshape(-1, height).T


def joined(parts: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """The parts concatenated along `axis`, without a copy when there is one part (the singles' join)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis)
