"""Which staging folders belong to a crashed export: each live export holds an flock on `<folder>.lock`.

A PID cannot tell: in a container every export is PID 1, so "is the PID in the folder's name alive" is
always yes, and a crashed export's folder would stay forever. The kernel drops an flock when its process
dies however it dies (SIGKILL, OOM kill), so a lock file that can be locked is abandoned. On NFS the client
maps flock to a POSIX lock, which the server releases when the dead client's lease ends (~90 s).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from pathlib import Path

LOCK_SUFFIX = ".lock"


def lock_path(staging: Path) -> Path:
    """The lock file that says `staging` is in use."""
    return staging.with_name(staging.name + LOCK_SUFFIX)


def hold(staging: Path) -> int:
    """Create and lock `<staging>.lock` for this process's life; returns its fd (close it to release).

    The file is locked under a private name and then renamed, so a visible lock file is always held by a live
    process or left by a dead one, never caught between its creation and its lock.
    """
    private = staging.with_name(f"{staging.name}.{secrets.token_hex(4)}{LOCK_SUFFIX}.new")
    fd = os.open(private, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(private, lock_path(staging))
    except OSError:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            private.unlink()
        raise
    return fd


def release(staging: Path, fd: int) -> None:
    """Remove `<staging>.lock` and drop the lock."""
    with contextlib.suppress(FileNotFoundError):
        lock_path(staging).unlink()
    os.close(fd)


def abandoned(lock: Path) -> bool:
    """True when no live process holds `lock` (its export crashed); False while one does."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False  # released (and its folder published or removed) a moment ago
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # also drops the lock, if we took it
    return True
