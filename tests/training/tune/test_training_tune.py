"""`python -m training.tune`: trials in subprocesses, best.json, the PNG, crash handling, --resume, --config."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from training.errors import ConfigError
from training.tune import search as tune
from training.tune.params import TUNED_KEYS, load_tuned_params

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROGRESS = re.compile(r"^\[tune\] trial (\d+)/(\d+) \(#(\d+)\) (COMPLETE|PRUNED|FAIL)", re.M)


def _study(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=tune.STUDY_NAME, storage=tune.storage_url(out))


@pytest.mark.slow  # two real trials
def test_two_trials_write_best_json_history_png_and_a_line_each(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    out = tmp_path / "tune"

    proc = run_module(
        "training.tune", "--data", data_copy, "--trials", "2", "--epochs", "1", "--out", out, check=True
    )

    assert [m[:4] for m in PROGRESS.findall(proc.stdout)] == [
        ("1", "2", "0", "COMPLETE"),
        ("2", "2", "1", "COMPLETE"),
    ]
    best = json.loads((out / "best.json").read_text())
    trials = _study(out).trials
    winner = max(trials, key=lambda t: t.value or 0.0)
    assert best["trials"] == {"total": 2, "complete": 2, "pruned": 0, "failed": 0}
    assert best["trial"] == winner.number
    assert best["val_auc"] == winner.value
    assert best["params"] == winner.params
    assert sorted(best["params"]) == sorted(TUNED_KEYS)
    assert best["sampler"] == "TPESampler(seed=42)"
    assert (out / "optimization_history.png").read_bytes()[:8] == PNG_MAGIC
    assert not (out / "param_importances.png").exists()  # 2 complete trials are too few
    assert "no param_importances.png: 2 complete trials, importances need at least 5" in proc.stdout
    for t in trials:
        assert (out / "trials" / f"{t.number:04d}" / "checkpoints" / "best.ckpt").is_file()


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_crashing_trial_is_recorded_failed_and_the_study_goes_on_and_resumes(
    data_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tune"
    real_command = tune.trial_command

    def crash_first(args, trial, params, run_dir):  # type: ignore[no-untyped-def]
        # Trial #0 dies of SIGABRT in its own process, as a segfaulting native op would.
        if trial.number == 0:
            return [sys.executable, "-c", "import os; os.abort()"]
        return real_command(args, trial, params, run_dir)

    monkeypatch.setattr(tune, "trial_command", crash_first)
    base = ["--data", str(data_copy), "--epochs", "1", "--out", str(out)]

    assert tune.main([*base, "--trials", "2"]) == 0

    lines = capsys.readouterr().out
    assert [(m[2], m[3]) for m in PROGRESS.findall(lines)] == [("0", "FAIL"), ("1", "COMPLETE")]
    assert "FAIL (exit code -6; " in lines
    states = [t.state for t in _study(out).trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE]
    best = json.loads((out / "best.json").read_text())
    assert best["trial"] == 1
    assert best["trials"] == {"total": 2, "complete": 1, "pruned": 0, "failed": 1}
    assert (out / "optimization_history.png").read_bytes()[:8] == PNG_MAGIC

    assert tune.main([*base, "--trials", "1"]) == 2  # an existing study needs --resume
    assert "already holds a study; pass --resume" in capsys.readouterr().err

    monkeypatch.setattr(tune, "trial_command", lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    assert tune.main([*base, "--trials", "1", "--resume"]) == 0  # the earlier complete trial is still best
    assert "trial 1/1 (#2) FAIL (exit code 3; " in capsys.readouterr().out
    assert json.loads((out / "best.json").read_text())["trials"] == {
        "total": 3,
        "complete": 1,
        "pruned": 0,
        "failed": 2,
    }


def test_training_takes_its_hyperparameters_from_best_json_and_flags_still_win(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    params = {
        "lr": 0.004,
        "batch_size": 512,
        "dropout1": 0.1,
        "dropout2": 0.05,
        "weight_decay": 1e-5,
        "activation": "hardtanh",
    }
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"params": params, "val_auc": 0.7, "trial": 3}))
    out = tmp_path / "run"

    run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        out,
        "--config",
        config,
        "--max-epochs",
        "1",
        "--lr",
        "0.001",
        "--no-progress-bar",
        check=True,
    )

    used = json.loads((out / "metrics.json").read_text())["config"]
    assert {k: used[k] for k in TUNED_KEYS} == {**params, "lr": 0.001}


def test_config_file_with_an_unknown_parameter_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"params": {"lr": 0.01, "momentum": 0.9}}))

    with pytest.raises(ValueError, match=r"unknown parameters \['momentum'\]"):
        load_tuned_params(config)
    with pytest.raises(ConfigError, match="no such file"):
        load_tuned_params(tmp_path / "absent.json")
