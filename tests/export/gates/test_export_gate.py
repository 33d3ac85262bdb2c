"""The quality gate: a candidate worse than the newest published version is refused, a better one is published,
and `--force` publishes a refused one with the manifest saying so.

Labels are drawn from model A's own probabilities on the run's validation rows, so A is the best model on
them, a model with other weights (B) is worse, and A with its output layer negated is far worse.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ctr_model.checkpoint import load_net
from ctr_model.metrics import expected_calibration_error, roc_auc
from export.gates.gate import EvalRows, GateError, check_quality, figures, gate_export
from export.request import ExportRequest
from tests.export.export_runs import make_run
from tests.serving.model_repo import reference_predict, write_manifest, write_onnx


def mlp_weights(run: Path) -> list[np.ndarray]:
    """The run's CTRNet (128 -> 32 -> 16 -> 1) in tests.serving.model_repo's layout: [W1, b1, W2, b2, W3, b3]."""
    state = torch.load(run / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)[
        "state_dict"
    ]
    out = []
    for layer in (0, 3, 6):
        out += [
            state[f"net.layers.{layer}.weight"].numpy().T.copy(),
            state[f"net.layers.{layer}.bias"].numpy(),
        ]
    return out


def publish_by_hand(repo: Path, version: int, run: Path) -> None:
    """A version folder holding the run's network as model.onnx and the run's feature spec."""
    stage = repo / f".tmp-{version}"
    (stage / "assets.extra").mkdir(parents=True)
    write_onnx(mlp_weights(run), stage / "model.onnx")
    shutil.copyfile(run / "feature_spec.json", stage / "assets.extra" / "feature_spec.json")
    write_manifest(stage, version)
    stage.rename(repo / str(version))


def negate_output(run: Path, out: Path) -> Path:
    """A copy of `run` whose network ranks every row backwards."""
    shutil.copytree(run, out)
    path = out / "checkpoints" / "best.ckpt"
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    for key in ("net.layers.6.weight", "net.layers.6.bias"):
        ckpt["state_dict"][key] = -ckpt["state_dict"][key]
    torch.save(ckpt, path)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs A (the label model), B (other weights) and A negated, sharing validation rows, labels and spec."""
    root = tmp_path_factory.mktemp("gate")
    a = make_run(root / "a", seed=1)
    b = make_run(root / "b", seed=2)
    for name in ("val_features.npy", "feature_spec.json"):  # the same rows through the same (frozen) spec
        shutil.copyfile(a / name, b / name)
    x = np.load(a / "val_features.npy")
    p = reference_predict(mlp_weights(a), x).ravel()
    labels = (np.random.default_rng(0).random(len(p)) < p).astype(np.float32)
    for run in (a, b):
        np.save(run / "val_labels.npy", labels)
    return {"a": a, "b": b, "a_negated": negate_output(a, root / "a_negated")}


def versions(repo: Path) -> list[int]:
    return sorted(int(p.name) for p in repo.iterdir() if p.name.isdigit())


def test_ece_is_zero_when_calibrated_and_the_offset_when_shifted():
    labels = np.tile([1.0, 1.0] + [0.0] * 8, 10)  # 20% clicks in every block of 10 rows
    assert expected_calibration_error(labels, np.full(100, 0.2)) == pytest.approx(0.0, abs=1e-12)
    assert expected_calibration_error(labels, np.full(100, 0.3)) == pytest.approx(0.1, abs=1e-12)
    f = figures(labels, np.full(100, 0.3))
    assert (f["mean_predicted_ctr"], f["observed_ctr"], f["auc"]) == (
        pytest.approx(0.3),
        pytest.approx(0.2),
        0.5,
    )


def test_gate_refuses_a_worse_candidate_with_one_error_line(runs, run_export, tmp_path: Path):
    repo = tmp_path / "models" / "ctr"
    publish_by_hand(repo, 1, runs["a"])
    proc = run_export("--run", runs["a_negated"], "--repo", repo)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("export:")]
    assert len(errors) == 1
    assert errors[0].startswith("export: error: quality gate refused the candidate on ")
    assert "below version 1's" in errors[0] and "(--max-auc-drop 0.002)" in errors[0]
    assert "(--force publishes anyway)" in errors[0]
    assert versions(repo) == [1] and not list(repo.glob(".tmp-*"))


def test_gate_publishes_a_better_candidate_and_force_overrides_a_refusal(runs, run_export, tmp_path: Path):
    repo = tmp_path / "models" / "ctr"
    publish_by_hand(repo, 1, runs["b"])
    # Platt keeps the order of the scores, so the candidate's AUC is its network's.
    proc = run_export("--run", runs["a"], "--repo", repo, "--no-torchscript", "--calibration", "platt")
    assert proc.returncode == 0, proc.stderr[-2000:]
    gate = json.loads((repo / "2" / "assets.extra" / "manifest.json").read_text())["quality_gate"]
    x, y = np.load(runs["a"] / "val_features.npy"), np.load(runs["a"] / "val_labels.npy")
    assert gate["candidate"]["auc"] == pytest.approx(
        roc_auc(y, reference_predict(mlp_weights(runs["a"]), x)), abs=1e-6
    )
    assert gate["served"]["auc"] == pytest.approx(
        roc_auc(y, reference_predict(mlp_weights(runs["b"]), x)), abs=1e-6
    )
    assert gate["served"]["version"] == 1 and gate["candidate"]["auc"] > gate["served"]["auc"]
    assert (gate["passed"], gate["forced"], gate["reasons"], gate["rows"]) == (True, False, [], len(y))
    assert set(gate["candidate"]) == {
        "auc",
        "logloss",
        "ece",
        "calibration_ratio",
        "calibration_z",
        "mean_predicted_ctr",
        "observed_ctr",
        "field_calibration",
    }
    assert gate["candidate_uncalibrated"]["auc"] == pytest.approx(gate["candidate"]["auc"], abs=1e-6)

    proc = run_export("--run", runs["a_negated"], "--repo", repo, "--no-torchscript", "--force")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(refused, published with --force)" in proc.stdout
    gate = json.loads((repo / "3" / "assets.extra" / "manifest.json").read_text())["quality_gate"]
    assert (gate["passed"], gate["forced"], gate["served"]["version"]) == (False, True, 2)
    assert gate["reasons"][0].startswith(f"AUC {gate['candidate']['auc']:.4f} is ")
    assert versions(repo) == [1, 2, 3]


def test_gate_is_skipped_and_says_why_without_held_out_labels(runs, tmp_path: Path):
    req = ExportRequest(
        checkpoint=runs["a"] / "checkpoints" / "best.ckpt",
        feature_spec=runs["a"] / "feature_spec.json",
        repo=tmp_path / "ctr",
        val_features=runs["a"] / "val_features.npy",
    )
    net, _ = load_net(req.checkpoint)
    gate = gate_export(req, net, metrics=None, served_dir=None)
    assert gate == {
        "skipped": "the run has no val_labels.npy and no data file; give --eval-data FILE (Criteo rows)",
        "passed": None,
        "forced": False,
        "candidate": None,
        "served": None,
    }


@pytest.mark.parametrize(("rows", "refused"), [(2_000, False), (20_000, True)])
def test_a_calibration_ratio_gap_is_refused_only_beyond_the_click_counts_noise(
    rows: int, refused: bool
) -> None:
    # Predicted 25% everywhere, observed 23.3%: ratio 1.073. On 2,000 rows that is z = 1.75 (a calibrated model
    # misses by that much often); on 20,000 rows z = 5.5.
    labels = np.zeros(rows)
    labels[: round(rows * 0.233)] = 1.0
    data = EvalRows(f"{rows} rows", labels, lambda spec: np.zeros((rows, 1), np.float32))
    z = (0.25 * rows - labels.sum()) / np.sqrt(rows * 0.25 * 0.75)

    def check() -> dict:
        return check_quality(
            lambda x: np.full((len(x), 1), 0.25), Path("spec"), None, None, data, 0.002, 0.01, False
        )

    if not refused:
        report = check()
        assert report["passed"] and report["candidate"]["calibration_z"] == pytest.approx(z)
        return
    with pytest.raises(GateError) as e:
        check()
    assert (
        "calibration ratio 1.0730 (mean predicted CTR 0.2500 / observed 0.2330) is outside [0.95, 1.05]"
        in str(e.value)
    )
    assert f"(calibration z {z:.1f}, beyond ±3)" in str(e.value)
