"""The two sides of the guard on disk: the baseline's worktree and the fixture both sides are measured on.

The baseline is the commit `bench/baseline` names. Its worktree (`git worktree add --detach`) and the fixture
(a synthetic Criteo file, and the model the baseline's own training and export make from it) are cached under
artifacts/bench-guard/ by that commit, so only the first run after moving the baseline makes them. Every
command runs with its own tree as the working directory and the only entry of PYTHONPATH, so each side imports
its own code (the venv's editable install points at one checkout, which PYTHONPATH overrides).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.harness.inputs import PROJECT_ROOT
from bench.harness.procs import run_bounded

BASELINE_FILE = PROJECT_ROOT / "bench" / "baseline"
GUARD_DIR = PROJECT_ROOT / "artifacts" / "bench-guard"
FIXTURE_ROWS = 200_000  # the training figure's file: about 1 s of training an epoch on 2 cores
STEP_TIMEOUT_S = 600


@dataclass(frozen=True)
class Fixture:
    """What both sides are measured on: the training file and the model base path (`.../ctr`)."""

    data: Path
    model_base_path: Path


def baseline_commit(path: Path = BASELINE_FILE) -> str:
    """The full commit hash `path` holds, checked against the repository.

    Raises:
        ValueError: the file holds no 40-hex commit, or this clone lacks the commit.
    """
    text = path.read_text().strip()
    if not re.fullmatch(r"[0-9a-f]{40}", text):
        raise ValueError(f"{path} must hold one full commit hash (40 hex digits), got {text[:60]!r}")
    found = subprocess.run(
        ["git", "-C", str(PROJECT_ROOT), "cat-file", "-e", f"{text}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        raise ValueError(f"commit {text} of {path} is not in this clone; fetch it (git fetch --unshallow)")
    return text


def side_env(tree: Path) -> dict[str, str]:
    """The environment of every command of one side: its tree first on the import path, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**env, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}


def build_extensions(tree: Path, log: Path) -> None:
    """Build `tree`'s C extensions in place (setuptools skips what is up to date)."""
    run_bounded(
        [sys.executable, "setup.py", "build_ext", "--inplace"],
        timeout_s=STEP_TIMEOUT_S,
        log=log,
        env=side_env(tree),
        cwd=tree,
    )


def baseline_tree(commit: str) -> Path:
    """The baseline's worktree with its extensions built, made on first use and reused after."""
    tree = GUARD_DIR / "trees" / commit
    ready = GUARD_DIR / "trees" / f"{commit}.ready"
    if ready.is_file():
        return tree
    log = GUARD_DIR / "trees" / f"{commit}.log"
    git = ["git", "-C", str(PROJECT_ROOT), "worktree"]
    if tree.exists():  # a run stopped halfway through making it
        run_bounded([*git, "remove", "--force", str(tree)], timeout_s=120, log=log)
    run_bounded([*git, "prune"], timeout_s=120, log=log)
    run_bounded([*git, "add", "--detach", str(tree), commit], timeout_s=STEP_TIMEOUT_S, log=log)
    build_extensions(tree, log)
    ready.write_text(commit + "\n")
    return tree


def fixture(commit: str, tree: Path) -> Fixture:
    """The synthetic file and the model made from it by the baseline's training and export, made once a commit."""
    root = GUARD_DIR / f"fixture-{commit}"
    made = Fixture(root / "train.txt", root / "models" / "ctr")
    if (root / "ready").is_file():
        return made
    py, log, env = sys.executable, root / "make.log", side_env(tree)
    steps = [
        ["training.synth", "--out", str(made.data), "--rows", str(FIXTURE_ROWS), "--seed", "7"],
        ["training", "--data", str(made.data), "--out", str(root / "run"), "--max-epochs", "1"],
        ["export", "--run", str(root / "run"), "--repo", str(made.model_base_path)],
    ]
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        step = [*step, "--no-progress-bar"] if step[0] == "training" else step
        run_bounded([py, "-m", *step], timeout_s=STEP_TIMEOUT_S, log=log, env=env, cwd=tree)
    (root / "ready").write_text(commit + "\n")
    return made


def imported_from(tree: Path) -> str:
    """Where a process of this side imports the server and its native scan from (the proof that each side
    runs its own code), as `python -m serving` would in that tree."""
    code = (
        "import serving, importlib.util as u; "
        "print(serving.__file__, getattr(u.find_spec('serving.codecs._scan_native'), 'origin', None))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=side_env(tree),
        cwd=tree,
        timeout=120,
    )
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]
