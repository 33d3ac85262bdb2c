"""Fixtures every stage's tests may use. Keep this generic; stage fixtures live in tests/<stage>/conftest.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

RunModule = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def run_module() -> RunModule:
    """Run `python -m MODULE ARGS...` from the repo root with this interpreter; returns the finished process.

    Keyword args: timeout (s, default 300), env (extra variables), check (raise on non-zero exit, default False).
    """

    def run(
        module: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None, check: bool = False
    ) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", module, *map(str, args)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"python -m {module} exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
            )
        return proc

    return run
