"""The quality gate fails closed: with a version served and no rows both models can score, export refuses,
and `--force` publishes anyway with the manifest saying the gate was skipped. Without labels there is no
calibrator to fit either: export says so unless `--calibration none`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.export.export_runs import make_run
from tests.export.gates.test_export_gate import publish_by_hand, versions

WHY = "the run has no val_labels.npy and no data file; give --eval-data FILE (Criteo rows)"


def test_export_refuses_when_the_gate_cannot_run_and_force_overrides(run_export, tmp_path: Path):
    run = make_run(tmp_path / "run")
    (run / "val_labels.npy").unlink()  # no held-out labels, no data file in metrics.json, no --eval-data
    repo = tmp_path / "models" / "ctr"
    publish_by_hand(repo, 1, run)

    proc = run_export("--run", run, "--repo", repo, "--no-torchscript")
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.startswith("export:")] == [
        f"export: error: the calibrator needs held-out labels and {run / 'val_features.npy'} has none (no "
        "--val-labels, and no val_labels.npy in the run or beside the feature spec); give --val-labels FILE (the "
        "run's val_labels.npy), --run DIR or --calibration-data FILE, or --calibration none to export without one"
    ]

    proc = run_export("--run", run, "--repo", repo, "--no-torchscript", "--calibration", "none")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("export:")]
    assert errors == [
        f"export: error: the quality gate cannot compare the candidate with version 1: {WHY}; "
        "nothing was published (--force publishes without the gate)"
    ]
    assert versions(repo) == [1] and not list(repo.glob(".tmp-*"))

    proc = run_export("--run", run, "--repo", repo, "--no-torchscript", "--calibration", "none", "--force")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"quality gate: skipped: {WHY} (published with --force)" in proc.stdout
    gate = json.loads((repo / "2" / "assets.extra" / "manifest.json").read_text())["quality_gate"]
    assert gate == {"skipped": WHY, "passed": None, "forced": True, "candidate": None, "served": None}
    assert versions(repo) == [1, 2]
