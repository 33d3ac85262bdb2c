"""The speed guard's rule (bench/guard/verdict.py) and its baseline file: exact verdicts on given rounds."""

from __future__ import annotations

import subprocess

import pytest

from bench.guard.trees import BASELINE_FILE, baseline_commit
from bench.guard.verdict import Figure, judge, spread, table
from tests.helpers import REPO_ROOT

QPS = Figure("raw row QPS, 64 connections", "req/s", higher_is_better=True)
P99 = Figure("raw row p99, 8 connections", "ms", higher_is_better=False)


def test_spread_is_the_median_relative_deviation_from_the_median() -> None:
    assert spread([100.0, 90.0, 110.0, 100.0, 300.0]) == pytest.approx(0.10)  # one stray round moves it not
    assert spread([5.0]) == 0.0


def test_a_twenty_percent_slower_head_fails_when_the_rounds_are_steady() -> None:
    verdict = judge(QPS, head=[8000.0, 7900.0, 8100.0], baseline=[10000.0, 9900.0, 10100.0])
    assert verdict.ratio == pytest.approx(0.8)
    assert verdict.ratio_spread < 0.01
    assert verdict.failed


def test_a_head_within_ten_percent_passes() -> None:
    verdict = judge(QPS, head=[9200.0, 9100.0, 9300.0], baseline=[10000.0, 9900.0, 10100.0])
    assert not verdict.failed


def test_the_rounds_spread_widens_the_tolerance() -> None:
    # Round ratios 0.85, 0.75, 0.95: median 0.85, spread 0.1 / 0.85; passes above 1 - (0.10 + 0.1176).
    verdict = judge(QPS, head=[8500.0, 7500.0, 9500.0], baseline=[10000.0, 10000.0, 10000.0])
    assert verdict.ratio == pytest.approx(0.85)
    assert verdict.threshold == pytest.approx(1 - (0.10 + 0.1 / 0.85))
    assert not verdict.failed


def test_a_latency_is_better_when_lower() -> None:
    verdict = judge(P99, head=[2.5, 2.5, 2.5], baseline=[2.0, 2.0, 2.0])
    assert verdict.ratio == pytest.approx(0.8)
    assert verdict.failed
    assert not judge(P99, head=[1.5, 1.5, 1.5], baseline=[2.0, 2.0, 2.0]).failed


def test_judge_refuses_unpaired_or_empty_rounds() -> None:
    with pytest.raises(ValueError, match="2 HEAD rounds against 3 baseline rounds"):
        judge(QPS, head=[1.0, 2.0], baseline=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="every round must be positive"):
        judge(QPS, head=[0.0], baseline=[1.0])


def test_the_table_shows_both_sides_the_ratio_and_the_verdict() -> None:
    rows = table([judge(QPS, head=[8000.0] * 3, baseline=[10000.0] * 3)]).splitlines()
    assert rows[2] == (
        "| raw row QPS, 64 connections | 8,000 req/s (± 0.0%) | 10,000 req/s (± 0.0%) "
        "| 0.800 (± 0.0%) | 0.900 | FAIL |"
    )


def test_bench_baseline_names_a_commit_of_this_repository() -> None:
    commit = baseline_commit()
    assert BASELINE_FILE.read_text() == commit + "\n"
    kind = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "cat-file", "-t", commit], capture_output=True, text=True
    )
    assert kind.stdout.strip() == "commit"
