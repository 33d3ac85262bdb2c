"""Fixtures every stage's tests may use. Keep this generic; stage fixtures live in tests/<stage>/conftest.py."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port
from training.synth import generate

__all__ = ["REPO_ROOT", "free_port"]


RunModule = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class Published:
    """One session export: its run dir, model base path and version folder."""

    run: Path
    repo: Path
    version_dir: Path


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Published]:
    """Export (activation, target profile) once per session; returns a lookup function.

    Exports are slow-ish (TF import, SavedModel write), so each case is exported once per session into its own
    repository, and the export and bench tests read the published files.
    """
    from export.__main__ import main as export_main  # deferred: torch, onnx and TF load only when used
    from tests.export.export_runs import make_run

    cache: dict[tuple[str, str], Published] = {}

    def get(activation: str, target: str = "standard") -> Published:
        key = (activation, target)
        if key not in cache:
            root = tmp_path_factory.mktemp(f"export-{activation}-{target}")
            run = make_run(root / "run", activation)
            repo = root / "models" / "ctr"
            assert export_main(["--run", str(run), "--repo", str(repo), "--target", target]) == 0
            cache[key] = Published(run, repo, repo / "1")
        return cache[key]

    return get


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


@pytest.fixture(scope="session")
def run_export() -> RunModule:
    """`python -m export ARGS...` run in this process: exit code, stdout and stderr as the subprocess gives them.

    An export in a fresh process spends about half its time importing torch, TensorFlow and ONNX; here they load
    once a session. What export prints, its warnings (`export: ...`, as its own logging set-up writes them) and
    its exit code are the same. Tests of what only a fresh process shows (TensorFlow's start-up lines on file
    descriptor 2, a kill, pid 1) still start one.
    """
    from export.__main__ import main as export_main

    def run(*args: object, check: bool = False) -> subprocess.CompletedProcess:
        out, err = io.StringIO(), io.StringIO()
        handler = logging.StreamHandler(err)
        handler.setFormatter(logging.Formatter("export: %(message)s"))
        handler.setLevel(logging.WARNING)
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = export_main([str(a) for a in args])
                except SystemExit as e:  # argparse's usage errors
                    code = e.code if isinstance(e.code, int) else 2
        finally:
            root.removeHandler(handler)
        proc = subprocess.CompletedProcess(["export", *map(str, args)], code, out.getvalue(), err.getvalue())
        if check and code != 0:
            raise AssertionError(
                f"export exited {code}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
            )
        return proc

    return run


@pytest.fixture(scope="session")
def synth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4000 synthetic rows in Kaggle TSV form, with the oracle files beside them (shared, treat as read-only)."""
    path = tmp_path_factory.mktemp("synth") / "train.txt"
    generate(path, rows=4000, seed=3)
    return path


@pytest.fixture
def data_copy(synth_file: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic file (tests that build caches or runs beside it)."""
    dst = tmp_path / "data" / "train.txt"
    dst.parent.mkdir()
    for src in synth_file.parent.glob("train.txt*"):
        if ".cache." not in src.name:
            (dst.parent / src.name).write_bytes(src.read_bytes())
    return dst


# The longest end-to-end runs (test-slow, measured in docs/testing.md) start first: pytest-xdist's loadfile hands
# files to its workers in collection order, so a long file collected last would run alone at the end.
LONGEST_FIRST = (
    "tests/bench/test_bench_end_to_end.py",
    "tests/pipelines/demos/test_online_demo.py",
    "tests/pipelines/demos/test_rollout_demo.py",
    "tests/pipelines/clicks/flink/test_flink_join_checkpoint.py",
    "tests/scripts/test_daily_loop.py",
    "tests/serving/repository/test_serving_reload_memory.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(
        key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank))
    )  # stable: the rest keep order


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One SeaweedFS S3 store for the session (tests/object_store.py); a test makes its own bucket with
    `s3_store.make_bucket(name)`. A test that stops the store starts its own SeaweedS3 instead."""
    from tests.object_store import SeaweedS3

    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as store:
        yield store


@pytest.fixture
def s3_env(s3_store, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The session store's endpoint and credentials in this test's environment (and returned)."""
    env = s3_store.env()
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env
