"""The typed entry point: `python -m training ARGV` is `run_training(parse_config(ARGV))`, and a caller in
Python (the online trainer) builds the same TrainConfig from a base of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import training.train
from training.cli import main, parse_config
from training.config import TrainConfig
from training.errors import ConfigError


def test_the_cli_runs_exactly_the_config_its_options_parse_into(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran: list[TrainConfig] = []
    monkeypatch.setattr(training.train, "run_training", ran.append)
    argv = ["--data", str(tmp_path / "d.txt"), "--out", str(tmp_path / "run"), "--batch-size", "512"]
    assert main([*argv, "--no-progress-bar", "--init-from", str(tmp_path / "v1")]) == 0
    assert ran == [
        TrainConfig(
            data=tmp_path / "d.txt",
            out=tmp_path / "run",
            batch_size=512,
            progress_bar=False,
            init_from=tmp_path / "v1",
        )
    ]


def test_options_override_a_tuned_file_which_overrides_the_base(tmp_path: Path) -> None:
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"params": {"lr": 0.005, "batch_size": 1024, "dropout1": 0.1}}))
    base = TrainConfig(max_epochs=1, lr=0.01, dropout2=0.4)
    assert parse_config([], base) == base
    assert parse_config(["--config", str(best), "--batch-size", "256"], base) == TrainConfig(
        max_epochs=1, lr=0.005, batch_size=256, dropout1=0.1, dropout2=0.4
    )
    assert parse_config(["--seed", "7"]) == TrainConfig(seed=7)  # no base: TrainConfig's defaults


def test_values_that_make_no_run_are_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=r"^invalid --batch-size: 0$"):
        parse_config(["--batch-size", "0"], TrainConfig(max_epochs=1))
    with pytest.raises(SystemExit):  # argparse's usage error: an option training does not know
        parse_config(["--epochs", "2"])
