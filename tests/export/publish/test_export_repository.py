"""Version numbering, no overwrite, retention and atomic publish of the model repository."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from export.__main__ import main as export_main
from export.errors import PublishError
from export.publish.repository import ModelRepository
from tests.export.export_runs import make_run
from tests.helpers import REPO_ROOT


def _entries(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir())


def test_versions_are_numeric_folders_only(tmp_path: Path) -> None:
    for name in ("1", "3", "0", "backup", ".tmp-4-123"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    repo = ModelRepository(tmp_path)
    assert repo.versions() == [1, 3]
    assert repo.choose_version(None) == 4
    assert repo.choose_version(2) == 2
    with pytest.raises(PublishError, match=r"version 3 already exists in .*; versions are never overwritten"):
        repo.choose_version(3)


def test_retention_never_removes_the_new_version(tmp_path: Path) -> None:
    for v in (2, 3, 5):
        (tmp_path / str(v)).mkdir()
    (tmp_path / "1").mkdir()  # just published with an explicit low --version
    assert ModelRepository(tmp_path).retain(1, protect=1) == [2, 3]
    assert _entries(tmp_path) == ["1", "5"]


def test_next_version_explicit_version_no_overwrite_and_keep(
    published, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = published("relu")
    repo = tmp_path / "ctr"
    for v in ("1", "2"):
        shutil.copytree(source.version_dir, repo / v)
    (repo / "notes").mkdir()  # non-numeric entries are not versions and are left alone
    run = source.run

    assert export_main(["--run", str(run), "--repo", str(repo), "--no-torchscript"]) == 0
    assert f"published version 3 at {repo / '3'} in " in capsys.readouterr().out
    assert json.loads((repo / "3" / "assets.extra" / "manifest.json").read_text())["version"] == 3

    before = (repo / "2" / "assets.extra" / "manifest.json").read_bytes()
    assert export_main(["--run", str(run), "--repo", str(repo), "--version", "2"]) == 1
    assert "version 2 already exists" in capsys.readouterr().err
    assert (repo / "2" / "assets.extra" / "manifest.json").read_bytes() == before

    assert (
        export_main(
            ["--run", str(run), "--repo", str(repo), "--version", "10", "--keep", "2", "--no-torchscript"]
        )
        == 0
    )
    assert "retention: removed versions [1, 2]" in capsys.readouterr().out
    assert _entries(repo) == ["10", "3", "config.pbtxt", "notes"]


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_crash_mid_export_leaves_no_version_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    repo = tmp_path / "ctr"
    proc = subprocess.Popen(
        [sys.executable, "-m", "export", "--run", str(run), "--repo", str(repo)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    staged: list[Path] = []
    try:
        deadline = time.monotonic() + 180  # room for importing torch + onnx on a loaded machine
        while not staged and proc.poll() is None and time.monotonic() < deadline:
            staged = [p for p in repo.glob(f".tmp-1-*-{proc.pid}") if p.is_dir()] if repo.is_dir() else []
            time.sleep(0.01)
        assert staged, "the export never created its staging folder"
        staging = staged[0]
        time.sleep(0.5)  # let it write part of the version
    finally:
        proc.send_signal(signal.SIGKILL)  # a crash: no cleanup code runs
        proc.wait(timeout=30)
    assert _entries(repo) == [
        staging.name,
        f"{staging.name}.lock",
    ]  # half a version, invisible to a server polling numeric names
    assert ModelRepository(repo).versions() == []

    assert export_main(["--run", str(run), "--repo", str(repo), "--no-torchscript"]) == 0
    assert _entries(repo) == ["1", "config.pbtxt"]  # the dead export's staging folder was cleaned up
    assert (repo / "1" / "saved_model.pb").is_file()
