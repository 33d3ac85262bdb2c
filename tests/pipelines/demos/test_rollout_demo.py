"""End to end: `make rollout-demo` promotes the good version and rolls the bad one back, with no client error.

A real server, the traffic simulator, live evaluation and the rollout controller, each its own process on
127.0.0.1 (pipelines/demos/rollout.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _demo(run_module, out: Path, *args: str) -> dict:
    proc = run_module("pipelines.demos.rollout", "--out", out, *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.endswith(
        f"rollout-demo: wrote {out / 'report.md'}, {out / 'rollout.png'} and {out / 'results.json'}\n"
    )
    return json.loads((out / "results.json").read_text())


def _check(r: dict, out: Path, max_windows: float) -> None:
    assert r["error"] is None
    assert r["promoted"] and r["rolled_back"], r["decisions"]
    actions = [(d["action"], d["version"]) for d in r["decisions"]]
    assert actions[0] == ("promote", 1)  # the first version: stable at once
    assert ("canary", 2) in actions and ("promote", 2) in actions
    assert ("canary", 3) in actions and ("rollback", 3) in actions and ("promote", 3) not in actions
    bad = r["bad_version"]
    assert bad["answered"] > 0 and bad["all_in_canary_bucket"], bad  # it only ever answered canary traffic
    assert r["bad_windows_to_rollback"] <= max_windows, bad
    assert r["client_errors"] == 0 and r["simulator"]["sent"] > 0, r["simulator"]
    # every answer the client got came from a version the server said answered it
    assert set(r["simulator"]["answered_by"]) == {"1", "2", "3"}, r["simulator"]
    versions = {(x["version"], x["label"]) for x in r["auc_live_vs_offline"]}
    assert {(1, "stable"), (2, "canary"), (3, "canary")} <= versions, versions
    for x in r["auc_live_vs_offline"]:
        assert x["rows"] == x["live_rows"], x  # the report found the evaluator's very rows
        assert abs(x["live_minus_offline"]) <= 0.01 and x["max_score_diff"] < 1e-5, x
    report = (out / "report.md").read_text()
    assert report.startswith("# Rollout demo") and "![canary share" in report
    assert (out / "rollout.png").stat().st_size > 10_000


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_a_short_demo_promotes_the_good_version_and_rolls_the_bad_one_back(tmp_path: Path, run_module):
    # ~90 s on a busy box: 4 s evaluation intervals, 120 rows a figure, models trained on a few thousand rows
    r = _demo(run_module, tmp_path, "--short")
    # short windows (4 s) against a 2 s attribution window and the controller's 1 s tick: a window more slack
    _check(r, tmp_path, max_windows=4)


@pytest.mark.slow  # ~2 minutes: the demo at its default size
def test_the_full_demo_meets_the_goals(tmp_path: Path, run_module):
    r = _demo(run_module, tmp_path)
    _check(r, tmp_path, max_windows=3)
    assert all(r["goals"].values()), r["goals"]
