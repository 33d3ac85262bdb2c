"""Every export path writes the drift reference (export/publish/drift_reference.py), `--checkpoint` without
`--run` included; an export that has no validation rows to build it from is refused before any slow step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ctr_contract.repository import DRIFT_REFERENCE_PATH
from export.__main__ import main as export_main
from tests.export.export_runs import make_run


def test_a_lone_checkpoint_takes_the_rows_beside_its_feature_spec(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    repo = tmp_path / "repo"
    argv = [
        "--checkpoint",
        str(run / "checkpoints" / "best.ckpt"),
        "--feature-spec",
        str(run / "feature_spec.json"),
    ]
    assert export_main([*argv, "--repo", str(repo), "--no-torchscript"]) == 0
    doc = json.loads((repo / "1" / DRIFT_REFERENCE_PATH).read_text())
    assert doc["sources"]["scores"] == "validation rows (2000)"
    assert len(doc["features"]) == 128 and len(doc["raw"]) == 39  # the raw fields, from val_raw.npz
    manifest = json.loads((repo / "1" / "assets.extra" / "manifest.json").read_text())
    assert DRIFT_REFERENCE_PATH in manifest["files"]


def test_an_export_without_validation_rows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    elsewhere = tmp_path / "specs"
    elsewhere.mkdir()
    shutil.copy(run / "feature_spec.json", elsewhere / "feature_spec.json")  # a spec without its run's rows
    repo = tmp_path / "repo"
    argv = [
        "--checkpoint",
        str(run / "checkpoints" / "best.ckpt"),
        "--feature-spec",
        str(elsewhere / "feature_spec.json"),
    ]
    assert export_main([*argv, "--repo", str(repo)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"export: error: no validation rows: the version would have no {DRIFT_REFERENCE_PATH}, so the server "
        "could not export drift metrics for it; give --val-features FILE (the run's val_features.npy) or --run DIR"
    )
    assert not repo.exists() or not any(repo.iterdir())
