"""Load one version off the event loop, under a timeout: stamp its files, verify the manifest, load, warm up.

Each model's loads run one at a time on one long-lived daemon thread of its own (`Loader`): a load that hangs
(a stuck network mount, a FIFO where a file should be) is abandoned when its timeout passes, with its thread,
and the next load gets a new thread. One thread, not a fresh one per load: glibc gives each thread a malloc
arena, and versions built in arenas that rotate from load to load left their heaps fragmented, resident memory
climbing for tens of reloads (docs/perf/serving-memory.md); built in the same arena, a version reuses the
space of the one it replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from serving.repository.manifest_check import Stamp, VersionNotReady, content_digest, stamp, verify
from serving.repository.scan import os_error_text
from serving.runtime.backends import Backend
from serving.runtime.input_range import FeatureRanges


@dataclass
class LoadAttempt:
    """What one load produced; written by the load thread, read on the event loop once it ended or timed out."""

    stamp: Stamp | str | None = None  # set first, so a timed-out load still says which files it saw
    backend: Backend | None = None
    n_warmup: int = 0
    error: Exception | None = None
    digest: str | None = None  # content_digest of a failed version: it is retried when its bytes change
    timed_out: bool = False
    ranges: FeatureRanges | None = None  # the training ranges of its features, read with it


def verify_and_load(path: Path, load: Callable[[Path], tuple[Backend, int]], attempt: LoadAttempt) -> None:
    """Fill `attempt`: the stamp, then the manifest check, then `load(path)` and the ranges; never raises."""
    try:
        attempt.stamp = stamp(path)
    except OSError as exc:
        attempt.stamp, attempt.error = os_error_text(exc), exc
        return
    try:
        verify(path, attempt.stamp)
        attempt.backend, attempt.n_warmup = load(path)
        attempt.ranges = FeatureRanges.load(path, attempt.backend.signature.width)
    except Exception as exc:  # every failure belongs to this version; the caller sorts them by reason
        attempt.error = exc
    if attempt.error is not None and not isinstance(attempt.error, VersionNotReady):
        with contextlib.suppress(OSError):  # unreadable now: the next scan's stamp tells
            attempt.digest = content_digest(path, attempt.stamp)


class _LoadThread:
    """A daemon thread that runs the jobs put in its queue until it gets None, or is abandoned."""

    def __init__(self, name: str) -> None:
        self.jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.abandoned = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()
            # The finished job holds its attempt, and so the version it loaded: while this frame waits for the
            # next job, nothing of a version unloaded since may stay referenced from here.
            del job
            if self.abandoned:  # a load that outlived its timeout: the next one has another thread
                return

    def abandon(self) -> None:
        self.abandoned = True
        self.jobs.put(None)  # ends it too if its job returned just before


class Loader:
    """The loads of one model, one at a time, on one long-lived thread (a new one after a load hangs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._worker: _LoadThread | None = None

    async def load(
        self, path: Path, load: Callable[[Path], tuple[Backend, int]], timeout_s: float
    ) -> tuple[LoadAttempt, threading.Thread]:
        """Run `verify_and_load` on the load thread; wait at most `timeout_s` (0: no limit).

        Returns:
            the attempt (`timed_out` set when the thread was abandoned) and its thread, still alive if it hung.
        """
        if self._worker is None or self._worker.abandoned:
            self._worker = _LoadThread(f"load-{self.name}")
        worker = self._worker
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        attempt = LoadAttempt()

        def finish() -> None:
            if not done.done():  # already cancelled by the timeout
                done.set_result(None)

        def work() -> None:
            verify_and_load(path, load, attempt)
            # RuntimeError: the loop closed while this load hung, and nobody waits for it any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(finish)

        worker.jobs.put(work)
        try:
            await asyncio.wait_for(done, timeout_s or None)
        except TimeoutError:
            attempt.timed_out = True
            worker.abandon()
        return attempt, worker.thread

    def close(self) -> None:
        """End the load thread once its current load, if any, returns (the model left the config)."""
        if self._worker is not None:
            self._worker.abandon()
            self._worker = None
