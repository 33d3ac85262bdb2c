"""Staging folders under PID 1: a crashed export's folder is removed by the next export, a live one's is kept.

In a container every export is PID 1, so the folder's PID names a live process (the next export itself).
`unshare --pid` runs each process as PID 1 of its own namespace, as a container runtime does.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export.publish.repository import ModelRepository
from tests.export.export_runs import make_run
from tests.helpers import REPO_ROOT

pytestmark = pytest.mark.slow  # make test-slow: exports killed as pid 1

# Holds a staging folder as version 1's export does, says where, and waits to be killed.
HOLD_STAGING = """
import os, sys, time
from pathlib import Path
from export.publish.repository import ModelRepository
repo = ModelRepository(Path(sys.argv[1]))
repo.prepare()
with repo.staging(1) as stage:
    (stage / "model.onnx").write_bytes(b"half a model")
    print(os.getpid(), stage, flush=True)
    time.sleep(600)
"""


def _as_pid_1(*argv: str) -> list[str]:
    """argv run as PID 1 of a new PID namespace (a user namespace too, so no root is needed)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs util-linux `unshare` to run a process as PID 1")
    probe = subprocess.run([unshare, "-Urpf", "--mount-proc", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this kernel or sandbox refuses new PID namespaces: {probe.stderr.strip()}")
    return [unshare, "-Urpf", "--mount-proc", "--kill-child", *argv]  # its PID 1 dies with it


def _hold_staging(repo: Path) -> tuple[subprocess.Popen[str], Path]:
    """Start a PID-1 process holding a staging folder in `repo`; returns it and the folder."""
    proc = subprocess.Popen(
        _as_pid_1(sys.executable, "-c", HOLD_STAGING, str(repo)),
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    pid, stage = proc.stdout.readline().split()
    assert pid == "1"
    return proc, Path(stage)


def test_staging_folder_of_an_export_killed_as_pid_1_is_removed_by_the_next_pid_1_export(tmp_path: Path):
    repo = tmp_path / "ctr"
    holder, stage = _hold_staging(repo)
    holder.send_signal(signal.SIGKILL)  # a crash (OOM kill): no cleanup code runs
    holder.wait(timeout=30)
    assert stage.name.startswith(".tmp-1-") and stage.name.endswith("-1")
    assert sorted(p.name for p in repo.iterdir()) == [stage.name, f"{stage.name}.lock"]

    run = make_run(tmp_path / "run")
    proc = subprocess.run(
        _as_pid_1(
            sys.executable, "-m", "export", "--run", str(run), "--repo", str(repo), "--no-torchscript", "-v"
        ),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"export: removing staging folder {stage} left by a crashed export" in proc.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["1", "config.pbtxt"]


def test_staging_folder_of_a_live_pid_1_export_is_kept(tmp_path: Path):
    repo = tmp_path / "ctr"
    holder, stage = _hold_staging(repo)
    try:
        cleaner = subprocess.run(
            _as_pid_1(
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; "
                "from export.publish.repository import ModelRepository; ModelRepository(Path(sys.argv[1])).prepare()",
                str(repo),
            ),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cleaner.returncode == 0, cleaner.stderr
        assert (
            stage / "model.onnx"
        ).read_bytes() == b"half a model"  # another pod's PID 1 export, still running
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    time.sleep(0.1)
    ModelRepository(repo).prepare()  # now its owner is dead: removed
    assert list(repo.iterdir()) == []
