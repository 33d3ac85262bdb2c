"""The synthetic generator: Criteo-looking rows, seeded determinism, and the oracle files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ctr_features.data.criteo import read_batches
from ctr_features.data.split import validation_mask
from ctr_model.metrics import log_loss
from training.synth import generate, oracle_paths


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    generate(a, 2000, seed=5)
    generate(b, 2000, seed=5)
    generate(c, 2000, seed=6)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_rows_look_like_criteo(synth_file: Path) -> None:
    table = pa.Table.from_batches(list(read_batches(synth_file)))  # parses with the strict reader
    assert len(table) == 4000
    assert 0.2 < np.mean(table.column("label").to_numpy()) < 0.3
    i12_missing = table.column("I12").null_count / len(table)
    assert 0.7 < i12_missing < 0.85  # I12 is mostly missing, as in the Kaggle data
    assert table.column("I2").null_count == 0 and pa.compute.min(table.column("I2")).as_py() == -1
    c3 = table.column("C3").to_pylist()
    assert all(re.fullmatch(r"[0-9a-f]{8}", v) for v in c3 if v)  # 8 lower-case hex digits, like Criteo
    assert len(set(table.column("C9").to_pylist())) == 3  # a 3-value field, like the real C9
    assert (
        max(
            table.column("I5").to_numpy(zero_copy_only=False)[
                ~np.isnan(table.column("I5").to_numpy(zero_copy_only=False))
            ]
        )
        > 1e4
    )


def test_oracle_files_score_the_validation_split(synth_file: Path) -> None:
    probs_file, summary_file = oracle_paths(synth_file)
    probs = np.load(probs_file)
    summary = json.loads(summary_file.read_text())
    labels = pa.Table.from_batches(list(read_batches(synth_file))).column("label").to_numpy()
    val = validation_mask(np.arange(4000), summary["val_fraction"])
    assert summary["rows"] == 4000 and summary["val_rows"] == int(val.sum())
    y, p = labels[val], probs[val]
    # The summary's AUC is the validation split's, by AUC's definition (every positive/negative pair).
    pairs = p[y == 1][:, None] - p[y == 0][None, :]
    assert summary["oracle_auc"] == pytest.approx(((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size)
    assert 0.7 < summary["oracle_auc"] < 0.9
    # The oracle holds the true click probabilities: calibrated (the labels were drawn from them: 4 binomial
    # standard deviations), and better than the base rate, which knows only the mean.
    assert abs(labels.mean() - probs.mean()) < 4 * np.sqrt((probs * (1 - probs)).sum()) / len(probs)
    assert summary["oracle_logloss"] == pytest.approx(log_loss(y, p))
    assert summary["oracle_logloss"] < log_loss(y, np.full(len(y), y.mean())) - 0.05
