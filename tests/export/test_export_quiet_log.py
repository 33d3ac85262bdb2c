"""`python -m export` keeps TensorFlow's C++ start-up log quiet unless asked (ctr_contract/tf_log.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.export.export_runs import make_run
from tests.helpers import REPO_ROOT

pytestmark = (
    pytest.mark.slow
)  # make test-slow: each test starts a fresh export process (TensorFlow's start-up lines)

# glog-style lines (`I0000 00:00:...`, `E0000 ... failed call to cuInit`) and absl's pre-init banner.
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} |cuInit|absl::InitializeLog", re.M)


def export(
    run: Path, repo: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a fresh shell has it
    cmd = [sys.executable, "-m", "export", "--run", str(run), "--repo", str(repo), *flags]
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("quiet") / "run")


def test_export_prints_no_tensorflow_start_up_lines_by_default(run: Path, tmp_path: Path) -> None:
    proc = export(run, tmp_path / "ctr")

    assert TF_LOG_LINE.findall(proc.stderr) == [], proc.stderr
    assert proc.stdout.startswith(f"published version 1 at {tmp_path / 'ctr' / '1'} in ")


def test_export_shows_tensorflow_start_up_lines_when_asked(run: Path, tmp_path: Path) -> None:
    verbose = export(run, tmp_path / "ctr", "--verbose")
    users_level = export(run, tmp_path / "ctr", env={"TF_CPP_MIN_LOG_LEVEL": "0"})

    assert TF_LOG_LINE.search(verbose.stderr), verbose.stderr
    assert TF_LOG_LINE.search(users_level.stderr), users_level.stderr
    assert users_level.stdout.startswith(f"published version 2 at {tmp_path / 'ctr' / '2'} in ")
