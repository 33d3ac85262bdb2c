"""Load one version in its own thread, under a timeout: stamp its files, verify the manifest, load, warm up.

A fresh daemon thread per load (not a shared executor): a load that hangs (a stuck network mount, a FIFO where
a file should be) is abandoned when its timeout passes, and the next version loads on a new thread.
"""

from __future__ import annotations

import asyncio
import contextlib
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


async def load_in_thread(
    name: str, path: Path, load: Callable[[Path], tuple[Backend, int]], timeout_s: float
) -> tuple[LoadAttempt, threading.Thread]:
    """Run `verify_and_load` on a new daemon thread; wait at most `timeout_s` (0: no limit).

    Returns:
        the attempt (`timed_out` set when the thread was abandoned) and the thread, still alive if it hung.
    """
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

    thread = threading.Thread(target=work, name=f"load-{name}", daemon=True)
    thread.start()
    try:
        await asyncio.wait_for(done, timeout_s or None)
    except TimeoutError:
        attempt.timed_out = True
    return attempt, thread
