"""Continuous drift: `python -m training.synth --day D` with a fractional D and `--drift-scale K`."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from training.synth import generate, make_world, sample_rows
from training.truth import effective_day

# sha256 of `python -m training.synth --day 0 --rows 3000 --seed 7` before days could be fractions.
DAY0_TXT = "e2423bc86c46f37fce2cf40f378100ecf06a121a31c35845cd9a5d15f768ff3a"
DAY0_ORACLE = "b1d57367fed696499e238f7349cc1990b3bbb0ac614e450cb784961b3ffbd158"
DAY3_TXT = "eacaff623b1314b1d2ad4e93576f95f1e95cf09fbd71f03a164a3a15fb522cff"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_day_0_and_whole_days_are_byte_identical_to_the_day_by_day_world(tmp_path: Path):
    generate(tmp_path / "d0.txt", 3000, seed=7)
    generate(tmp_path / "d3.txt", 3000, seed=7, day=3)
    assert (_sha(tmp_path / "d0.txt"), _sha(tmp_path / "d0.txt.oracle.npy")) == (DAY0_TXT, DAY0_ORACLE)
    assert _sha(tmp_path / "d3.txt") == DAY3_TXT


def test_drift_scale_k_at_day_d_is_day_k_times_d(tmp_path: Path):
    generate(tmp_path / "a.txt", 3000, seed=7, day=0.25, drift_scale=12)
    assert _sha(tmp_path / "a.txt") == DAY3_TXT
    assert effective_day(0.25, 12) == 3 and effective_day(2.25) == 2.25


def test_the_click_model_moves_continuously_within_a_day():
    counts, ids = sample_rows(np.random.default_rng([5, 1]), 5000, 2.25)

    def step(a: float, b: float) -> np.ndarray:
        return np.abs(make_world(a, 20_000).logit(counts, ids) - make_world(b, 20_000).logit(counts, ids))

    hour, day = step(2.25, 2.25 + 1 / 24).mean(), step(2.25, 3.25).mean()
    assert 0 < hour < day / 10  # an hour moves the logits a little, a day much more


def test_cli_takes_a_fractional_day_and_a_drift_scale(tmp_path: Path, run_module):
    out = tmp_path / "f.txt"
    proc = run_module("training.synth", "--day", "2.25", "--drift-scale", "2", "--rows", "200", "--out", out)
    assert proc.returncode == 0 and proc.stdout.startswith(f"wrote 200 rows of day 2.25 to {out} in ")
    bad = run_module("training.synth", "--day", "1", "--drift-scale", "-1", "--out", out)
    assert bad.returncode == 2 and "--drift-scale must be >= 0, got -1" in bad.stderr
