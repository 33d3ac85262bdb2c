"""The calibrator in every exported graph (issue 33), end to end on runs whose network learned a click model.

A run trained on a quarter of its negatives (training's `--negative-sample-rate 0.25`) predicts odds 4x too
high; export corrects them in the graph (ctr = calibrator(sigmoid(z + ln w))), fits each method on the run's
validation rows, gates the published graphs on both outputs, and refuses what it cannot calibrate.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_model.calibration import Calibrator
from ctr_model.checkpoint import load_net
from ctr_model.metrics import calibration_ratio, expected_calibration_error
from export.gates.raw_parity import onnxruntime_raw_predictor, savedmodel_raw_predictor
from export.gates.runtimes import onnxruntime_predictor, savedmodel_predictor, torchscript_predictor
from tests.export.export_runs import TRAINED_VAL_ROWS, make_trained_run

BOTH = ("ctr", "raw_score")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`downsampled`: w = 0.25, recorded; `old`: w = 1 and no negative_sample_rate anywhere (an old run)."""
    root = tmp_path_factory.mktemp("calibration")
    return {
        "downsampled": make_trained_run(root / "downsampled", negative_rate=0.25),
        "old": make_trained_run(root / "old", negative_rate=1.0, record_rate=False, seed=1),
    }


def _manifest(version_dir: Path) -> dict:
    return json.loads((version_dir / "assets.extra" / "manifest.json").read_text())


def _logits(run: Path) -> np.ndarray:
    net, _ = load_net(run / "checkpoints" / "best.ckpt")
    with torch.no_grad():
        return net(torch.from_numpy(np.load(run / "val_features.npy"))).numpy().astype(np.float64)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("export:")]


@pytest.mark.parametrize(
    ("method", "target", "chosen"),
    [
        ("auto", "standard", "platt"),
        ("isotonic", "minimal", "isotonic"),
        pytest.param("platt", "minimal", "platt", marks=pytest.mark.slow),  # auto already exports Platt
    ],
)
def test_each_method_corrects_a_downsampled_run_in_every_graph(
    runs, run_export, tmp_path: Path, method: str, target: str, chosen: str
) -> None:
    run = runs["downsampled"]
    repo = tmp_path / "models" / "ctr"
    proc = run_export("--run", run, "--repo", repo, "--calibration", method, "--target", target)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = repo / "1"
    m = _manifest(version)
    cal = m["calibration"]
    assert cal == json.loads((version / "assets.extra" / "calibration.json").read_text())
    assert (cal["method"], cal["negative_rate"], cal["report"]["method"]) == (chosen, 0.25, chosen)
    report = cal["report"]
    assert (report["fit_rows"], report["report_rows"]) == (TRAINED_VAL_ROWS // 2, TRAINED_VAL_ROWS // 2)
    assert report["after"]["ece"] < report["before"]["ece"] / 2  # on the half it was not fitted on
    # On the gate's rows (all validation rows) the calibrated candidate's mean matches the clicks.
    cand = m["quality_gate"]["candidate"]
    assert 0.95 <= cand["calibration_ratio"] <= 1.05
    assert cand["field_calibration"]["field"] in CATEGORICAL_FIELDS
    assert m["quality_gate"]["candidate_uncalibrated"]["calibration_ratio"] > 2  # raw_score: odds 4x too high

    # Every graph gives the numpy reference's ctr and the network's own probability, within the gate's 1e-5.
    z = _logits(run)
    want = np.concatenate([Calibrator.from_dict(cal).apply(z), 1 / (1 + np.exp(-z))], axis=1)
    x = np.load(run / "val_features.npy")
    for name, predict in (
        ("onnxruntime", onnxruntime_predictor(version / "model.onnx", outputs=BOTH)),
        ("savedmodel", savedmodel_predictor(version, outputs=BOTH)),
        ("torchscript", torchscript_predictor(version / "model.pt", outputs=BOTH)),
    ):
        assert float(np.abs(predict(x) - want).max()) <= 1e-5, name
    with np.load(run / "val_raw.npz") as raw:
        numeric, categorical = raw["numeric"], raw["categorical"].astype(object)
    for name, raw_predict in (
        ("onnxruntime_raw", onnxruntime_raw_predictor(version / "model_raw.onnx", outputs=BOTH)),
        ("savedmodel_raw", savedmodel_raw_predictor(version, outputs=BOTH)),
    ):
        assert float(np.abs(raw_predict(numeric, categorical) - want).max()) <= 1e-5, name
    for gate in (m["parity"], m["parity"]["raw"]):  # both outputs gated, both signatures
        assert gate["outputs"] == list(BOTH) and gate["max_abs_diff"] <= 1e-5
        assert max(gate["by_output"]["ctr"]["max_abs_diff_by_pair"].values()) <= 1e-5
    if target == "minimal":
        assert set(m["target"]["ops_used"]) <= {"Gemm", "MatMul", "Add", "Sub", "Mul", "Relu", "Sigmoid"}

    lines = proc.stdout.splitlines()
    assert lines[3].startswith(f"calibration: {chosen} (") and "negative sample rate 0.25" in lines[3]
    assert f"calibration ratio {cand['calibration_ratio']:.4f}" in lines[4]
    assert "field calibration error" in lines[4]
    assert (run / "reliability.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((run / "metrics.json").read_text())["calibration"]
    assert (written["method"], written["after"]) == (chosen, report["after"])


def test_calibration_none_serves_the_corrected_probability_and_the_ratio_gate_refuses_it(
    runs, run_export, tmp_path: Path
) -> None:
    run = runs["downsampled"]
    repo = tmp_path / "models" / "ctr"
    argv = ["--run", run, "--repo", repo, "--calibration", "none", "--no-torchscript"]
    proc = run_export(*argv)
    assert proc.returncode == 1
    (error,) = _errors(proc.stderr)
    y = np.load(run / "val_labels.npy")
    q = 1 / (1 + np.exp(-(_logits(run) + math.log(0.25))))
    ratio, ece = calibration_ratio(y, q), expected_calibration_error(y, q)
    z = (q.sum() - y.sum()) / np.sqrt((q * (1 - q)).sum())
    assert not 0.95 <= ratio <= 1.05
    assert error.startswith(
        f"export: error: quality gate refused the candidate on {run / 'val_features.npy'} ({len(y)} validation "
        f"rows): calibration ratio {ratio:.4f} (mean predicted CTR {q.mean():.4f} / observed {y.mean():.4f}) is "
        f"outside [0.95, 1.05] (--max-calibration-gap 0.05) by more than the clicks' noise (calibration z {z:.1f}, "
        f"beyond ±3) (candidate: ECE {ece:.4f}, calibration ratio {ratio:.4f} (z {z:.1f}), field calibration error "
    )
    assert error.endswith("; nothing was published (--force publishes anyway)")
    assert not repo.exists() or not any(p.name.isdigit() for p in repo.iterdir())

    proc = run_export(*argv, "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _manifest(repo / "1")
    assert (m["quality_gate"]["passed"], m["quality_gate"]["forced"]) == (False, True)
    assert m["quality_gate"]["reasons"][0].startswith(f"calibration ratio {ratio:.4f}")
    assert (m["calibration"]["method"], m["calibration"]["negative_rate"]) == ("none", 0.25)
    got = onnxruntime_predictor(repo / "1" / "model.onnx", outputs=BOTH)(np.load(run / "val_features.npy"))
    np.testing.assert_allclose(got[:, 0], q.ravel(), rtol=0, atol=1e-6)  # ctr = sigmoid(z + ln w)
    assert float(np.abs(got[:, 0] - got[:, 1]).max()) > 0.1  # raw_score is the network's own

    gap = round(abs(ratio - 1) + 0.01, 2)  # a wider bound passes it, and the manifest records the bound
    proc = run_export(*argv, "--max-calibration-gap", str(gap), "--max-ece-rise", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    gate = _manifest(repo / "2")["quality_gate"]
    assert (gate["passed"], gate["max_calibration_gap"], gate["calibration_ratio_range"]) == (
        True,
        gap,
        [1 - gap, 1 + gap],
    )


def test_an_old_run_without_a_negative_rate_exports_with_w_1_and_none_gives_ctr_equal_to_raw_score(
    runs, run_export, tmp_path: Path
) -> None:
    run = runs["old"]
    repo = tmp_path / "models" / "ctr"
    proc = run_export("--run", run, "--repo", repo, "--no-torchscript")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _manifest(repo / "1")["calibration"]["negative_rate"] == 1.0
    # Uncalibrated, its ECE is more than 0.01 above version 1's: a repository of its own.
    repo = tmp_path / "none" / "ctr"
    proc = run_export("--run", run, "--repo", repo, "--no-torchscript", "--calibration", "none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = _manifest(repo / "1")
    assert (m["calibration"]["method"], m["calibration"]["negative_rate"]) == ("none", 1.0)
    got = onnxruntime_predictor(repo / "1" / "model.onnx", outputs=BOTH)(np.load(run / "val_features.npy"))
    assert np.array_equal(got[:, 0], got[:, 1])  # today's graph: ctr is the network's probability


def _copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to)
    return to


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (lambda y: np.zeros_like(y), "0 positives"),
        (lambda y: np.ones_like(y), "0 negatives"),
        (lambda y: y[:600], "600 rows"),
    ],
    ids=["no_positives", "no_negatives", "too_few_rows"],
)
def test_a_held_out_set_the_calibrator_cannot_use_is_refused_in_one_line(
    runs, run_export, tmp_path: Path, labels, message: str
) -> None:
    run = _copy_run(runs["old"], tmp_path / "run")
    y = labels(np.load(run / "val_labels.npy"))
    np.save(run / "val_labels.npy", y)
    np.save(run / "val_features.npy", np.load(run / "val_features.npy")[: len(y)])
    repo = tmp_path / "models" / "ctr"
    proc = run_export("--run", run, "--repo", repo, "--no-torchscript")
    assert proc.returncode == 1
    (error,) = _errors(proc.stderr)
    assert error.startswith("export: error: ") and message in error and "--calibration none" in error
    assert not repo.exists() or not any(p.name.isdigit() for p in repo.iterdir())
    # --calibration none needs no fit; one class gives no calibration ratio the gate accepts: --force.
    proc = run_export("--run", run, "--repo", repo, "--no-torchscript", "--calibration", "none", "--force")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_lone_checkpoint_without_labels_is_refused_naming_the_ways_out(
    runs, run_export, tmp_path: Path
) -> None:
    src = runs["old"]
    side = tmp_path / "spec"
    side.mkdir()
    for name in ("feature_spec.json", "val_features.npy"):  # no val_labels.npy beside the spec
        shutil.copyfile(src / name, side / name)
    repo = tmp_path / "models" / "ctr"
    argv = ["--checkpoint", src / "checkpoints" / "best.ckpt", "--feature-spec", side / "feature_spec.json"]
    proc = run_export(*argv, "--repo", repo, "--no-torchscript")
    assert proc.returncode == 1
    assert _errors(proc.stderr) == [
        f"export: error: the calibrator needs held-out labels and {side / 'val_features.npy'} has none (no "
        "--val-labels, and no val_labels.npy in the run or beside the feature spec); give --val-labels FILE (the "
        "run's val_labels.npy), --run DIR or --calibration-data FILE, or --calibration none to export without one"
    ]
    proc = run_export(*argv, "--repo", repo, "--no-torchscript", "--val-labels", src / "val_labels.npy")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _manifest(repo / "1")["calibration"]["report"]["rows"] == str(src / "val_labels.npy")


def test_calibration_data_fits_the_calibrator_on_criteo_rows(runs, run_export, tmp_path: Path) -> None:
    run = runs["downsampled"]
    with np.load(run / "val_raw.npz") as raw:
        numeric, categorical = raw["numeric"], raw["categorical"]
    y = np.load(run / "val_labels.npy")
    lines = []
    for label, counts, values in zip(y.astype(int), numeric, categorical, strict=True):
        ints = ["" if np.isnan(v) else str(int(v)) for v in counts]
        lines.append("\t".join([str(label), *ints, *values]))
    data = tmp_path / "heldout.txt"
    data.write_text("\n".join(lines) + "\n")
    assert len(NUMERIC_FIELDS) + len(CATEGORICAL_FIELDS) + 1 == len(lines[0].split("\t"))
    repo = tmp_path / "models" / "ctr"
    proc = run_export("--run", run, "--repo", repo, "--no-torchscript", "--calibration-data", data)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _manifest(repo / "1")["calibration"]["report"]
    assert report["rows"] == f"{data} ({len(y)} rows)"
    assert report["fit_rows"] + report["report_rows"] == len(y)
