"""Child processes of the bench: each in its own process group, bounded in time, all stopped on exit.

A Ctrl-C in a terminal reaches only the foreground process group. Our children run in their own
sessions (so one `killpg` stops a child and everything it spawned), which means we must stop them
ourselves: on normal exit, on an exception, on SIGINT and on SIGTERM.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

# The children still running, by process-group id (= the child's pid); stop_all() terminates them.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}
GRACE_S = 5.0


class StepError(RuntimeError):
    """A bounded child command failed, timed out or could not start."""


@dataclass(frozen=True)
class StepResult:
    """How one bounded command ended."""

    returncode: int
    seconds: float


def start(
    cmd: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start `cmd` in a new session, stdout+stderr appended to `log`, and remember its group."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        fh.write(f"$ {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _LIVE[proc.pid] = proc
    return proc


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # The pgid was recycled by someone else's process: not ours to stop.
        return False
    return True


def stop(proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> None:
    """SIGTERM the child's whole process group, SIGKILL it after `grace_s`, and reap the child."""
    pgid = proc.pid
    if _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        # Grandchildren may outlive the leader; kill whatever is left of the group.
        _signal_group(pgid, signal.SIGKILL)
    proc.wait()
    _LIVE.pop(pgid, None)


def run_bounded(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> StepResult:
    """Run `cmd` to completion within `timeout_s`; raise StepError (with the log tail) otherwise."""
    t0 = time.monotonic()
    try:
        proc = start(cmd, log=log, env=env, cwd=cwd)
    except OSError as e:
        raise StepError(f"could not start {cmd[0]!r}: {e}") from e
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise StepError(f"timed out after {timeout_s:.0f} s: {' '.join(cmd)}\n{log_tail(log)}") from None
    finally:
        stop(proc)
    seconds = time.monotonic() - t0
    if rc != 0:
        raise StepError(f"exit code {rc}: {' '.join(cmd)}\n{log_tail(log)}")
    return StepResult(returncode=rc, seconds=seconds)


def group_rss_mib(pgid: int) -> float:
    """Resident memory (MiB) summed over the live processes of a process group (a server and its workers)."""
    total_kib = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the command: state, ppid, pgrp, ...
                continue
            status = (stat.parent / "status").read_text()
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        rss = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), "0")
        total_kib += int(rss)
    return round(total_kib / 1024, 1)


def log_tail(log: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"(no log at {log})"
    return "\n".join(text.splitlines()[-lines:])


def stop_all() -> None:
    """Terminate every child group still running: SIGTERM, a grace period, then SIGKILL."""
    live = list(_LIVE.items())
    for pgid, _ in live:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    for pgid, proc in live:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        _signal_group(pgid, signal.SIGKILL)
        proc.wait()
        _LIVE.pop(pgid, None)


def raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """Signal handler: raise KeyboardInterrupt, so `finally` blocks run."""
    # SIGTERM becomes the same exception as Ctrl-C, so one `except KeyboardInterrupt` path and the
    # `finally` blocks stop the children either way.
    raise KeyboardInterrupt(f"signal {signum}")


def install_cleanup() -> None:
    """Stop all children at interpreter exit, and turn SIGTERM into KeyboardInterrupt."""
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, raise_interrupt)
