"""bench/guard/in_process.py: a checkout's server driven in process, behind fake connections (slow: it starts
the server's model in a child process)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.guard import in_process
from tests.serving.raw_model_repo import fit_spec, write_raw_version

PROJECT_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_each_round_is_the_cpu_of_answered_raw_rows(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    write_raw_version(base, 1, fit_spec(), calibrated=True)
    rounds = in_process.measure(PROJECT_ROOT, base, rounds=2, requests=2_000, connections=8)
    assert len(rounds) == 2
    assert all(math.isfinite(r) and 1.0 < r < 10_000.0 for r in rounds), rounds
