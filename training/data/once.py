"""Build a shared file once across processes: the first takes a lock file, the others wait for the result.

The holder refreshes the lock's mtime every few seconds. A waiter takes the lock over when the holder is
gone: its pid no longer exists (same host) or its heartbeat is older than `STALE_S` (any host). So a crashed
or killed builder can never make the others wait forever. Builders write to a temporary name and rename,
so even two builders after a takeover race only duplicate work, never corrupt the result. When a build
fails, the lock is released and each waiter retries, meeting (and reporting) the same error itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

STALE_S = 30.0
_HEARTBEAT_S = 5.0
_POLL_S = 0.1


def _holder_gone(lock: Path) -> bool:
    """True when the lock's holder is dead (same host) or silent for STALE_S (any host)."""
    try:
        age = time.time() - lock.stat().st_mtime
        host, pid = lock.read_text().split()
    except (FileNotFoundError, ValueError):
        return False  # just released, or just created and not yet written: look again
    if age > STALE_S:
        return True
    if host == socket.gethostname():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
    return False


def _heartbeat(lock: Path, stop: threading.Event) -> None:
    while not stop.wait(_HEARTBEAT_S):
        with contextlib.suppress(OSError):
            os.utime(lock)


def build_once(
    lock: Path, ready: Callable[[], bool], build: Callable[[], None], say: Callable[[str], None]
) -> bool:
    """Make `ready()` true by running `build()` in one process only.

    Args:
        lock: the lock file (created beside the result).
        ready: whether the result exists and is usable; checked before and after taking the lock.
        build: writes the result (atomically).
        say: prints progress (used once, when this process starts waiting).
    Returns:
        True when this process ran `build()`.
    """
    told = False
    while not ready():
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _holder_gone(lock):
                say(f"warning: taking over {lock} from a builder that stopped")
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()
                continue
            if not told:
                say(f"waiting for another process to build what {lock} guards")
                told = True
            time.sleep(_POLL_S)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{socket.gethostname()} {os.getpid()}\n")
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(lock, stop), daemon=True)
        beat.start()
        try:
            if not ready():
                build()
                return True
            return False
        finally:
            stop.set()
            beat.join()
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()
    return False
