"""The quality target on the `make train` defaults: validation AUC within 0.01 of the oracle (slow: ~1-3 min)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.mark.slow
def test_default_run_is_within_001_auc_of_the_oracle(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    data = tmp_path / "train.txt"
    run_module("training.synth", "--out", data, "--rows", "1000000", "--seed", "7", check=True)
    run_module(
        "training", "--data", data, "--out", tmp_path / "run", "--no-progress-bar", timeout=900, check=True
    )
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["oracle_auc"] - m["val_auc"] < 0.01
    assert m["val_logloss"] - m["oracle_logloss"] < 0.01
