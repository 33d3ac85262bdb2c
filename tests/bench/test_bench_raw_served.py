"""bench/raw_served.py's goals table: ours against the --before checkout, round by round."""

from __future__ import annotations

from bench.raw_served import goals


def test_goals_pairs_rounds_and_says_which_targets_are_met() -> None:
    def row(qps: list[float], p99: list[float]) -> dict[str, object]:
        return {"qps_runs": qps, "p99_runs": p99}

    rows = {
        ("on", 64, "raw1.lua"): row([13000.0, 11000.0, 12000.0], [9.0, 9.0, 9.0]),
        ("before", 64, "raw1.lua"): row([10000.0, 10000.0, 9000.0], [9.0, 9.0, 9.0]),
        ("on", 8, "raw100.lua"): row([3100.0, 2900.0, 3000.0], [5.0, 5.0, 5.0]),
        ("before", 8, "raw100.lua"): row([2000.0, 2000.0, 2000.0], [5.0, 5.0, 5.0]),
        ("on", 8, "raw1.lua"): row([1.0, 1.0, 1.0], [0.9, 1.2, 0.8]),
        ("before", 8, "raw1.lua"): row([1.0, 1.0, 1.0], [1.8, 2.4, 1.6]),
    }
    assert goals(rows, "on", "before").splitlines()[2:] == [
        "| single raw row QPS, 64 connections | 12,000 (11,000 to 13,000) | 10,000 (9,000 to 10,000) "
        "| 1.30 (1.10, 1.33) | ≥ 1.25× before | yes |",
        "| raw ranking rows/s (100 rows a request, 8 connections) | 300,000 (290,000 to 310,000) "
        "| 200,000 (200,000 to 200,000) | 1.50 (1.45, 1.55) | ≥ 300,000 rows/s | yes |",
        "| single raw row p99 ms, 8 connections | 0.90 (0.80 to 1.20) | 1.80 (1.60 to 2.40) "
        "| 0.50 (0.50, 0.50) | ≤ 1 ms | yes |",
    ]
