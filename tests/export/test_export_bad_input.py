"""Each bad input is a clear error naming the problem, a non-zero exit, and no version (or staging) left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export.__main__ import main as export_main
from tests.export.export_runs import make_run
from tests.helpers import REPO_ROOT


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], repo: Path) -> str:
    """Run the CLI, assert exit 1 and an untouched repository; return the error line."""
    assert export_main([*argv, "--repo", str(repo)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("export: error: ")
    leftovers = sorted(p.name for p in repo.iterdir()) if repo.exists() else []
    assert leftovers == [], leftovers  # no version folder, no staging folder
    return err.removeprefix("export: error: ")


def test_missing_checkpoint_exits_non_zero_from_the_command_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    (run / "checkpoints" / "best.ckpt").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "export", "--run", str(run), "--repo", str(tmp_path / "repo")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"export: error: checkpoint not found: {run / 'checkpoints' / 'best.ckpt'}; "
        f"train first (`make train` or `python -m training --out {run}`)"
    )
    assert not (tmp_path / "repo").exists()


def test_explicit_checkpoint_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    missing = tmp_path / "epoch=9.ckpt"
    err = _fails(capsys, ["--run", str(run), "--checkpoint", str(missing)], tmp_path / "repo")
    assert err == f"checkpoint not found: {missing}"


def test_corrupt_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    ckpt = run / "checkpoints" / "best.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:100])  # truncated mid-write
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert err.startswith(f"checkpoint {ckpt} is corrupt or not a torch checkpoint")


def test_checkpoint_width_differs_from_feature_spec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run", net_width=100, spec_width=128)
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert err == (
        f"checkpoint {run / 'checkpoints' / 'best.ckpt'} takes 100 features but feature spec "
        f"{run / 'feature_spec.json'} produces 128; export a checkpoint trained with this spec"
    )


def test_unreadable_feature_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    (run / "feature_spec.json").write_text("{not json")
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert err.startswith(f"cannot read feature spec {run / 'feature_spec.json'}: ")


@pytest.mark.parametrize("spec", ['{"version": 1}', '{"width": "128"}', "[128]"])
def test_feature_spec_without_integer_width(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str
) -> None:
    run = make_run(tmp_path / "run")
    (run / "feature_spec.json").write_text(spec)
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert err.startswith(f"feature spec {run / 'feature_spec.json'} has width ")
    assert err.endswith("; expected a positive integer under 'width'")


def test_unreadable_training_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    (run / "metrics.json").write_text('{"val_auc": 0.7')  # truncated by a full disk
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert err.startswith(f"cannot read training metrics {run / 'metrics.json'}: ")


def test_validation_rows_of_the_wrong_width(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    np.save(run / "val_features.npy", np.zeros((10, 127), np.float32))
    err = _fails(capsys, ["--run", str(run)], tmp_path / "repo")
    assert (
        err
        == f"validation rows {run / 'val_features.npy'} have shape [10, 127]; expected finite float32 [N, 128]"
    )


def test_unwritable_destination(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run")
    blocker = tmp_path / "models"
    blocker.write_text("a file where the repository's parent should be")
    repo = blocker / "ctr"
    assert export_main(["--run", str(run), "--repo", str(repo)]) == 1
    err = capsys.readouterr().err
    assert f"export: error: model repository {repo} is not writable: " in err
    assert blocker.read_text() == "a file where the repository's parent should be"


def test_op_outside_target_set_names_op_node_and_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    err = _fails(capsys, ["--run", str(run), "--target-ops", "Gemm,Relu,Clip"], tmp_path / "repo")
    assert err == (
        "ONNX op 'Sigmoid' (node 'node_sigmoid') is not supported by target custom [Clip, Gemm, Relu]; "
        "no patch in export/onnx/patches.py rewrites it (patched ops: ['Clip', 'LeakyRelu'])"
    )


def test_failed_parity_publishes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Three runtimes with different GEMM kernels never agree to 1e-12 on 10,000 rows.
    run = make_run(tmp_path / "run")
    err = _fails(capsys, ["--run", str(run), "--parity-tol", "1e-12", "--no-torchscript"], tmp_path / "repo")
    assert err.startswith("parity failed: max abs difference ")
    assert "> tolerance 1e-12" in err and err.endswith("nothing was published")


def test_diverged_checkpoint_with_nan_weights_fails_parity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    ckpt_path = run / "checkpoints" / "best.ckpt"
    ckpt = torch.load(ckpt_path, weights_only=False)
    ckpt["state_dict"]["net.layers.6.bias"].fill_(float("nan"))
    torch.save(ckpt, ckpt_path)
    err = _fails(capsys, ["--run", str(run), "--no-torchscript"], tmp_path / "repo")
    assert err == (
        f"the network's logit on held-out row 0 (labels: {run / 'val_labels.npy'}) is nan: the checkpoint gives "
        "non-finite scores (did training diverge?), so no calibrator can be fitted"
    )
    argv = ["--run", str(run), "--no-torchscript", "--calibration", "none"]
    assert "calibration ratio nan" in _fails(capsys, argv, tmp_path / "repo")  # the quality gate's refusal
    err = _fails(capsys, [*argv, "--force"], tmp_path / "repo")
    assert "non-finite outputs: {'pytorch': 20000, 'onnxruntime': 20000, 'savedmodel': 20000}" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parity-rows", "9999"], "--parity-rows must be >= 10000, got 9999"),
        (["--keep", "0"], "--keep must be >= 1, got 0"),
        (["--max-calibration-gap", "1"], "--max-calibration-gap must be in [0, 1), got 1.0"),
        (["--target-ops", " , "], "--target-ops ' , ' lists no ops; expected e.g. 'Gemm,Relu,Sigmoid'"),
    ],
)
def test_invalid_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    run = make_run(tmp_path / "run")
    assert _fails(capsys, ["--run", str(run), *argv], tmp_path / "repo") == message


def test_run_dir_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert _fails(capsys, ["--run", str(missing)], tmp_path / "repo") == (
        f"--run {missing} is not a directory; expected a training run dir"
    )
    assert not os.path.exists(missing)


@pytest.mark.parametrize("rate", [0, 1.5, "a quarter"])
def test_a_negative_sample_rate_outside_0_1_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rate: object
) -> None:
    run = make_run(tmp_path / "run")
    (run / "metrics.json").write_text(json.dumps({"negative_sample_rate": rate}))
    assert _fails(capsys, ["--run", str(run)], tmp_path / "repo") == (
        f"metrics.json gives negative_sample_rate {rate!r}; expected a number in (0, 1]"
    )


def test_calibration_options_that_cannot_be_used_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path / "run")
    for flag in ("--val-labels", "--calibration-data"):
        assert _fails(
            capsys, ["--run", str(run), flag, str(tmp_path / "absent")], tmp_path / "repo"
        ).startswith(f"{flag} {tmp_path / 'absent'} is not a file")
    np.save(tmp_path / "labels.npy", np.full(10, 0.5))
    assert _fails(
        capsys, ["--run", str(run), "--val-labels", str(tmp_path / "labels.npy")], tmp_path / "repo"
    ) == (
        f"validation labels {tmp_path / 'labels.npy'} have shape [10]; expected 2000 labels of 0 or 1, one per row "
        f"of {run / 'val_features.npy'}"
    )
