"""Sampled request logs: `--request_log_dir DIR --request_log_sample_rate R` (R = 0, the default, is off).

One JSON line per sampled predict request:

    {"request_id": "...", "time": "2026-11-30T08:00:00.123Z",
     "model": {"name": "ctr", "version": 3, "label": "stable"}, "canary": false, "shadow": false,
     "fallback": null, "inputs": {"inputs": {"I1": [3.0], ..., "C26": [""]}}, "outputs": [[0.21], ...]}

`model.label` is the label that routed the request (serving/routing/router.py): "stable" or "canary" for an
unlabelled request the split sent there, the label's name for a `/labels/L` request, null for the latest version
or a `/versions/N` request; `canary` is true for canary traffic; `fallback` names why a fallback version
answered (null: none did). A shadow line (`record_shadow`) has the primary line's request id and time,
`"shadow": true`, `model.label` "shadow", the shadow version and its scores, and `inputs` null; it is written
only for a request whose primary line is.

`inputs` is the batch as decoded (serving/requests.py), not the client's bytes: a raw request, in row or
columnar form, as columns of all 39 fields (counts as floats, missing counts null, missing categories "");
feature vectors, REST or gRPC, as `instances` (float32 rows). The request id is the client's `x-request-id`
header (gRPC metadata) when it sends one, else one the server makes; it is returned in the `x-request-id`
response header either way, so clicks can be joined with the log later (`python -m pipelines.clicks`).

Sampling is a hash of the request id (crc32 below R * 2^32): a retried request and every replica make the
same choice, and a test can count the lines it expects. A REST connection draws it where it makes an id
(`http_request_id`): a made id the log does not sample is answered and handed no further. Each worker writes its own files,
DIR/requests-<pid>-<n>.jsonl, and starts the next file once one holds `--request_log_max_bytes`.

A predict never waits for the disk and never fails because of it: lines go into a bounded queue that one
writer thread drains every WRITE_EVERY_S, making all its lines and writing them in one write (a predict wakes no
thread). A full queue (slow disk), or a write that fails (full disk, unwritable directory),
drops the line and counts it in `ctr_serving_request_log_dropped_total` (alert: CtrServingRequestLogDropping);
every other line is counted in `ctr_serving_request_log_lines_total`.

Shipping the files (docs/daily-loop.md): before each write, the writer compares the path it opened with the file
it holds (device and inode), and does the same once a second when idle. A file that was removed or renamed
(`mv`, logrotate's default style) is closed and the line goes to a new file, DIR/requests-<pid>-<n+1>.jsonl: no
line goes into a file that is no longer in the folder, and a renamed file is let go within a second. A file
that shrank under the writer (logrotate's `copytruncate`) is written on at its new end. Lines written between
a shipper's copy and its truncate or removal cannot be known to it and are lost: move the file out first, then
ship it (logrotate: the default rename style, no `copytruncate`).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import logging
import os
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson

log = logging.getLogger(__name__)

QUEUE_LINES = 10_000  # lines waiting for the writer; beyond this a slow disk costs lines, not latency
# How often the writer takes the queued lines, all at once: a predict only appends to the queue (no lock, no
# thread woken a line), and the writer makes one write a file for all of them.
WRITE_EVERY_S = 0.05
RETRY_OPEN_S = 1.0  # after a failed open, lines are dropped for this long before the next try
IDLE_CHECK_S = 1.0  # with no line to write, how often the writer checks that its file is still in the folder


_SERVER_PREFIX = f"{os.urandom(6).hex()}-"  # per process: ids of different workers and restarts never collide
_SERVER_PREFIX_BYTES = _SERVER_PREFIX.encode()
_ID_COUNTER = itertools.count(1)


def _new_id_prefix() -> None:
    """A forked process (a `--num_workers` worker, a restarted one) draws its own prefix: the parent imported
    this module before forking, and its prefix and counter would otherwise be every worker's."""
    global _SERVER_PREFIX, _SERVER_PREFIX_BYTES, _ID_COUNTER
    _SERVER_PREFIX = f"{os.urandom(6).hex()}-"
    _SERVER_PREFIX_BYTES, _ID_COUNTER = _SERVER_PREFIX.encode(), itertools.count(1)


os.register_at_fork(after_in_child=_new_id_prefix)
_ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-"
_ID_CHAR_SET, _ID_BYTE_SET = frozenset(_ID_CHARS), frozenset(_ID_CHARS.encode())
MAX_ID_CHARS = 128
_CRC_RANGE = 2.0**32  # crc32 values are below this


def new_request_id() -> str:
    """A fresh request id, unique across processes (random prefix + counter): no clock or random read per id."""
    return "%s%x" % (_SERVER_PREFIX, next(_ID_COUNTER))  # noqa: UP031  # the fastest of the formats


def server_made(request_id: str) -> bool:
    """Whether this process made the id (`new_request_id`): the client sent none."""
    return request_id.startswith(_SERVER_PREFIX)


def request_id_from(client_value: str | bytes | None) -> str:
    """The client's `x-request-id` when it is a sane token (<= 128 of [A-Za-z0-9._:-]), else a fresh id."""
    if client_value:
        value = client_value.decode("latin-1") if isinstance(client_value, bytes) else client_value
        if len(value) <= MAX_ID_CHARS and _ID_CHAR_SET.issuperset(value):
            return value
    return new_request_id()


def http_request_id(client_value: bytes, rate: float) -> tuple[bytes, str | None]:
    """An HTTP request's id as (what its answer's `x-request-id` carries, what its predict is handed).

    The client's sane `x-request-id` (as `request_id_from`) is both. Else the server makes one (as
    `new_request_id`, made as bytes: the answer writes it as it is) and hands it on only when the request log
    samples it at `rate`: past the HTTP layer a made id is read by the log alone (the traffic split draws at
    random for it, `server_made`), so the sampling is decided here, once, and an unsampled request carries
    nothing further (None).
    """
    if client_value and len(client_value) <= MAX_ID_CHARS and _ID_BYTE_SET.issuperset(client_value):
        return client_value, client_value.decode("ascii")
    made = b"%s%x" % (_SERVER_PREFIX_BYTES, next(_ID_COUNTER))
    return made, made.decode() if zlib.crc32(made) < rate * _CRC_RANGE else None  # `sampled(made, rate)`


def sampled(request_id: str, rate: float) -> bool:
    """Whether `request_id` is in the sample of rate `rate` (deterministic in the id)."""
    return rate > 0 and zlib.crc32(request_id.encode()) < rate * _CRC_RANGE


class RequestLog:
    """The sampler, the bounded queue and the writer thread of one server process."""

    def __init__(
        self,
        directory: Path,
        sample_rate: float,
        max_bytes: int,
        on_drop: Callable[[int], None],
        on_write: Callable[[int], None] | None = None,
        queue_lines: int = QUEUE_LINES,
    ) -> None:
        """`on_drop(n)` / `on_write(n)` count lines; they run on the event loop's thread (metrics have no lock)."""
        self.directory, self.rate, self.max_bytes = directory, sample_rate, max_bytes
        self._below = sample_rate * _CRC_RANGE if sample_rate > 0 else -1.0  # `sampled`: crc32 below this
        self._on_drop, self._on_write = on_drop, on_write
        # What makes each line (`_line`'s arguments, `inputs` not yet called), appended by the event loop, taken
        # by the writer: a line is made on the writer's thread, with the others taken at once.
        self._queue: deque[tuple[Any, ...]] = deque()
        self._queue_lines = queue_lines
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._file: io.FileIO | None = None
        self._path: Path | None = None  # the path self._file was opened at
        self._file_id = (0, 0)  # its (st_dev, st_ino)
        self._size = 0
        self._seq = itertools.count(1)
        self._retry_at = 0.0

    def start(self) -> None:
        """Start the writer thread; call from the event loop that serves the requests."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._drain, name="request-log", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (within `timeout_s`) and close the file."""
        if self._thread is None:
            return
        self._stopping.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("request log: the writer is stuck; %d queued lines are lost", len(self._queue))

    def record(
        self,
        request_id: str,
        model_name: str,
        version: int,
        inputs: Callable[[], Any],
        outputs: np.ndarray,
        label: str | None = None,
        canary: bool = False,
        fallback: str | None = None,
    ) -> float | None:
        """Queue one request if it is sampled; never blocks. `inputs()` is called only for sampled requests, on
        the writer's thread (it must read only what stays as it is once the request is answered).

        Returns the line's time stamp (for `record_shadow`); None when the request is not sampled or the line
        was dropped.
        """
        if not zlib.crc32(request_id.encode()) < self._below:  # `sampled(request_id, self.rate)`
            return None
        stamp = time.time()
        entry = (request_id, stamp, model_name, version, label, canary, False, fallback, inputs, outputs)
        return stamp if self._put(entry) else None

    def record_shadow(
        self, request_id: str, stamp: float, model_name: str, version: int, outputs: np.ndarray
    ) -> None:
        """Queue the shadow line of a request whose primary line `record` queued at `stamp`; never blocks."""
        self._put((request_id, stamp, model_name, version, "shadow", False, True, None, None, outputs))

    def _put(self, entry: tuple[Any, ...]) -> bool:
        if len(self._queue) >= self._queue_lines:
            self._on_drop(1)
            return False
        self._queue.append(entry)  # atomic: the writer takes lines from the other end
        return True

    # --- the writer thread ---------------------------------------------------------------------
    def _drain(self) -> None:
        checked = time.monotonic()
        while True:
            stopping = self._stopping.wait(WRITE_EVERY_S)
            if self._queue:
                self._write([self._queue.popleft() for _ in range(len(self._queue))])
                checked = time.monotonic()
            elif time.monotonic() - checked >= IDLE_CHECK_S:
                self._check_file()  # a quiet server lets go of a shipped (renamed) file too
                checked = time.monotonic()
            if stopping and not self._queue:
                break
        self._close()

    def _write(self, entries: list[tuple[Any, ...]]) -> None:
        """Make the lines of `entries` and write them. Made here, together: a line made alone, one in a hundred
        requests, found every cache cold and cost several times as much CPU; and until then the queue holds the
        request's few objects, not its inputs as lists, for the garbage collector to walk."""
        lines = []
        for entry in entries:
            try:
                lines.append(self._line(*entry))
            except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
                log.warning("request log: dropping a line that cannot be written as JSON: %s", exc)
                self._count(self._on_drop, 1)
        start = 0
        while start < len(lines):
            start = self._append(lines, start)

    def _line(
        self,
        request_id: str,
        stamp: float,
        name: str,
        version: int,
        label: str | None,
        canary: bool,
        shadow: bool,
        fallback: str | None,
        inputs: Callable[[], Any] | None,
        outputs: np.ndarray,
    ) -> bytes:
        """One JSON line; `inputs()` makes its `inputs` (None: null, a shadow line)."""
        return orjson.dumps(
            {
                "request_id": request_id,
                "time": datetime.fromtimestamp(stamp, UTC)
                .isoformat(timespec="milliseconds")
                .replace("+00:00", "Z"),
                "model": {"name": name, "version": version, "label": label},
                "canary": canary,
                "shadow": shadow,
                "fallback": fallback,
                "inputs": None if inputs is None else inputs(),
                "outputs": outputs,
            },
            option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE,
            default=_plain,
        )

    def _append(self, lines: list[bytes], start: int) -> int:
        """Write `lines[start:]` up to the one that fills the file (`max_bytes`) in one write; returns where the
        next write starts. A line goes to the file it would go to written alone: a file is closed once it
        holds max_bytes, and its path is checked before each write."""
        f = self._current_file_or_none()
        if f is None:
            self._count(self._on_drop, len(lines) - start)
            return len(lines)
        end, size = start, self._size
        while end < len(lines) and (end == start or size < self.max_bytes):
            size += len(lines[end])
            end += 1
        data = b"".join(lines[start:end])
        written = 0
        try:
            view = memoryview(data)
            while written < len(data):  # unbuffered: a line is on disk (or failed) when write returns
                written += f.write(view[written:]) or 0
        except OSError as exc:  # ENOSPC, EFBIG, EIO: drop the lines, start a fresh file later
            done, at = 0, 0
            for line in lines[start:end]:  # the lines written whole before the failure
                at += len(line)
                if at > written:
                    break
                done += 1
            self._size += written
            if done:
                self._count(self._on_write, done)
            log.warning(
                "request log: dropping lines, cannot write %s: %s", getattr(self._file, "name", "?"), exc
            )
            self._count(self._on_drop, end - start - done)
            self._close(quiet=True)
            self._retry_at = time.monotonic() + RETRY_OPEN_S
            return end
        self._size += len(data)
        self._count(self._on_write, end - start)
        if self._size >= self.max_bytes:
            self._close()
        return end

    def _current_file_or_none(self) -> io.FileIO | None:
        """The file to write to (`_current_file`); None, the lines dropped, when it cannot be had."""
        try:
            return self._current_file()
        except OSError as exc:
            log.warning(
                "request log: dropping lines, cannot write %s: %s", getattr(self._file, "name", "?"), exc
            )
            self._close(quiet=True)
            self._retry_at = time.monotonic() + RETRY_OPEN_S
            return None

    def _check_file(self) -> None:
        """Close the file when its path no longer names it (removed, renamed); follow a truncation."""
        if self._file is None or self._path is None:
            return
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            st = None
        except OSError as exc:  # EACCES, EIO: keep writing where we are rather than lose lines
            log.warning("request log: cannot stat %s: %s", self._path, exc)
            return
        if st is None or (st.st_dev, st.st_ino) != self._file_id:
            if st is not None:
                how = "replaced"
            else:
                how = "removed" if os.fstat(self._file.fileno()).st_nlink == 0 else "renamed"
            log.info("request log: %s was %s; starting a new file", self._path, how)
            self._close()
        elif st.st_size < self._size:  # copytruncate: O_APPEND writes go to the new end
            log.info("request log: %s was truncated to %d bytes; writing on", self._path, st.st_size)
            self._size = st.st_size

    def _current_file(self) -> io.FileIO | None:
        self._check_file()
        if self._file is not None:
            return self._file
        if time.monotonic() < self._retry_at:
            return None
        path = self.directory / f"requests-{os.getpid()}-{next(self._seq)}.jsonl"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            f = path.open("ab", buffering=0)
        except OSError as exc:
            log.warning("request log: dropping lines for %.0f s, cannot open %s: %s", RETRY_OPEN_S, path, exc)
            self._retry_at = time.monotonic() + RETRY_OPEN_S
            return None
        self._file, self._path = f, path
        st = os.fstat(f.fileno())  # an OSError here is the caller's: the line is dropped, the file closed
        self._file_id, self._size = (st.st_dev, st.st_ino), st.st_size
        return f

    def _close(self, quiet: bool = False) -> None:
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.close()
        except OSError as exc:
            if not quiet:
                log.warning("request log: closing %s failed: %s", f.name, exc)

    def _count(self, counter: Callable[[int], None] | None, n: int) -> None:
        if counter is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(counter, n)


def _plain(value: Any) -> Any:
    """orjson's fallback: numpy arrays it cannot take directly (e.g. strings) as lists, scalars as Python."""
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"cannot log a {type(value).__name__}")
