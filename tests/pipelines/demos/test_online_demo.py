"""End to end: a server, the simulator and the online trainer publish versions that the server then serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _demo(run_module, out: Path, *args: str) -> dict:
    proc = run_module("pipelines.demos.online", "--out", out, *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.endswith(f"online-demo: wrote {out / 'report.md'} and {out / 'results.json'}\n")
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow  # make test-slow (docs/testing.md)
def test_a_short_run_publishes_versions_and_the_server_serves_them(tmp_path: Path, run_module):
    # ~2 min: 2,000 static rows, 45 s of traffic in 15 s intervals, a 3 s attribution window
    r = _demo(
        run_module,
        tmp_path,
        "--duration",
        "45",
        "--interval-s",
        "15",
        "--window-s",
        "3",
        "--rate",
        "10",
        "--static-rows",
        "2000",
        "--max-ece-rise",
        "1",
        "--calibration",
        "none",  # 15 s intervals hold a few hundred held-out rows: fewer than a calibrator's fit needs
        "--max-calibration-gap",
        "0.99",
    )
    published = r["published_versions"]
    assert published and published == list(range(2, 2 + len(published)))  # version 1 is the static model
    assert set(map(str, [1, *published])) <= set(r["served_at"])  # the server loaded every one
    trained = [o for o in r["outcomes"] if o["outcome"] in ("published", "refused")]
    assert trained and all(o["rows"] > 0 for o in trained)
    assert {"repo", "end_day", "drift_scale", "published_versions", "intervals"} <= set(r)
    assert (tmp_path / "report.md").read_text().startswith("# Online learning demo")


@pytest.mark.slow  # ~7 minutes: the demo at its default size
def test_the_full_demo_meets_the_goals(tmp_path: Path, run_module):
    r = _demo(run_module, tmp_path)
    g = r["goals"]
    assert g["never_worse_than_static_by_more_than_0.002"], r["intervals"]
    assert g["freshness_within_2_intervals"], r["freshness"]
    assert g["online_beats_static_by_0.02_at_the_end"], r["intervals"]
