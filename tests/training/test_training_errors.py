"""`python -m training`'s errors: a user's mistake prints one `error:` line and exits 1; a bug keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import training.train
from ctr_model.errors import CheckpointError
from training.cli import main
from training.errors import (
    ConfigError,
    DataError,
    DistributedSetupError,
    MalformedRowError,
    NonFiniteLossError,
    TrainingError,
)


def test_every_training_error_derives_from_the_base_and_keeps_its_old_builtin_base() -> None:
    for cls in (ConfigError, DataError, MalformedRowError, CheckpointError):  # CheckpointError: ctr_model's
        assert issubclass(cls, TrainingError) and issubclass(cls, ValueError), cls
    for cls in (NonFiniteLossError, DistributedSetupError):
        assert issubclass(cls, TrainingError) and issubclass(cls, RuntimeError), cls


def test_the_old_import_paths_of_the_error_classes_still_work() -> None:
    from ctr_features.data.criteo import MalformedRowError as from_criteo
    from ctr_model.checkpoint import CheckpointError as from_checkpoint
    from training.data.sources import DataError as from_sources
    from training.model.distributed import DistributedSetupError as from_distributed
    from training.model.lightning_module import NonFiniteLossError as from_module

    assert (from_criteo, from_sources, from_checkpoint, from_distributed, from_module) == (
        MalformedRowError,
        DataError,
        CheckpointError,
        DistributedSetupError,
        NonFiniteLossError,
    )


def test_missing_data_prints_one_error_line_and_exits_1(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    data = tmp_path / "absent.txt"
    proc = run_module("training", "--data", data, "--out", tmp_path / "run")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"error: data file not found: {data} (generate one with `python -m training.synth --out {data}`)"
    )
    assert "Traceback" not in proc.stderr


def test_an_os_error_that_names_a_file_prints_the_path_and_exits_1(
    data_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    assert main(["--data", str(data_copy), "--out", str(blocker / "run"), "--no-progress-bar"]) == 1
    assert capsys.readouterr().err == f"error: [Errno 20] Not a directory: '{blocker / 'run'}'\n"


def test_invalid_options_exit_2_naming_each_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--val-fraction", "1.5", "--width", "40"]) == 2
    assert capsys.readouterr().err == "error: invalid --val-fraction: 1.5, invalid --width: 40\n"


def test_an_os_error_without_a_file_is_a_bug_and_propagates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(cfg: object) -> None:
        raise OSError("no file named: not the user's to fix")

    monkeypatch.setattr(training.train, "run_training", broken)
    with pytest.raises(OSError, match="no file named: not the user's to fix"):
        main(["--out", str(tmp_path / "run")])


def test_an_internal_bug_keeps_its_traceback(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        import training.train
        from training.cli import main

        def run_training(cfg):
            raise ValueError("a bug, not the user's mistake")

        training.train.run_training = run_training
        sys.exit(main(["--out", {str(tmp_path / "run")!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.splitlines()[-1] == "ValueError: a bug, not the user's mistake"
    assert "error: a bug" not in proc.stderr
