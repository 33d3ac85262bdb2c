"""Bounded child commands: a timeout kills the whole process group, failures carry the log tail."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench.harness.procs import StepError, run_bounded, start, stop_all
from bench.harness.servers import process_cpu_s


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (containers may not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_timeout_kills_the_command_and_its_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    cmd = ["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"]

    # 3 s, not 1: on a loaded machine `sh` must have started the grandchild and written its pid by then.
    with pytest.raises(StepError, match=r"^timed out after 3 s: sh -c"):
        run_bounded(cmd, timeout_s=3, log=tmp_path / "step.log")

    assert wait_dead(int(pidfile.read_text()))


def test_failure_names_exit_code_and_shows_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "step.log"

    with pytest.raises(StepError) as e:
        run_bounded(["sh", "-c", "echo 'no such data file: x.txt' >&2; exit 3"], timeout_s=10, log=log)

    assert str(e.value).splitlines()[0] == "exit code 3: sh -c echo 'no such data file: x.txt' >&2; exit 3"
    assert str(e.value).splitlines()[-1] == "no such data file: x.txt"


def test_missing_program_is_a_step_error(tmp_path: Path) -> None:
    with pytest.raises(StepError, match="could not start 'no-such-program-xyz'"):
        run_bounded(["no-such-program-xyz"], timeout_s=5, log=tmp_path / "step.log")


def test_stop_all_stops_every_running_group(tmp_path: Path) -> None:
    procs = [start(["sleep", "60"], log=tmp_path / f"s{i}.log") for i in range(2)]

    stop_all()

    for p in procs:
        assert p.returncode == -signal.SIGTERM  # stopped and reaped by stop_all itself
        assert not pid_alive(p.pid)


def test_process_cpu_counts_this_process_busy_time() -> None:
    begun = process_cpu_s(os.getpid())
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # 0.2 s of CPU
        pass
    used = process_cpu_s(os.getpid())
    assert begun is not None and used is not None and 0.15 <= used - begun <= 1.0
    assert process_cpu_s(2**22 + 12345) is None  # no such process
