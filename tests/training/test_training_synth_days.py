"""Drifting days of the synthetic world (`python -m training.synth --day N`) and warm start (`--init-from`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ctr_contract import repository
from ctr_model.checkpoint import load_net
from ctr_model.errors import CheckpointError
from ctr_model.metrics import roc_auc
from export.onnx.onnx_export import export_onnx
from tests.training.train_runs import TINY_RUN
from training.model.warm_start import load_warm_start
from training.synth import generate, make_world, oracle_paths, sample_rows
from training.truth import CATEGORICAL_DRIFT, NUMERIC_DRIFT, NUMERIC_SHAPE

N = 20_000


def _rows(day: int) -> tuple[np.ndarray, np.ndarray]:
    return sample_rows(np.random.default_rng([11, day]), N, day)


def test_day_0_is_todays_world_and_day_n_moves_only_the_drifting_fields():
    (c0, k0), (c5, k5) = _rows(0), _rows(5)
    same_stream = sample_rows(np.random.default_rng([11, 0]), N)  # the generator before days existed
    assert np.array_equal(c0, same_stream[0], equal_nan=True) and np.array_equal(k0, same_stream[1])
    for j in range(13):
        shift = np.nanmedian(np.log1p(np.maximum(c5[:, j], 0))) - np.nanmedian(
            np.log1p(np.maximum(c0[:, j], 0))
        )
        if j in NUMERIC_DRIFT:  # 5 days x 0.12 spreads, in the direction of the drift
            assert np.sign(shift) == np.sign(NUMERIC_DRIFT[j]) and abs(shift) > 0.3 * NUMERIC_SHAPE[j][1]
        else:
            assert abs(shift) < 0.15, f"I{j + 1} moved by {shift}"
    other_day0 = sample_rows(np.random.default_rng([12, 0]), N)[1]  # sampling noise of "unseen on day 0"
    for j in range(26):
        seen = set(k0[:, j].tolist())
        unseen = np.mean([v not in seen for v in k5[:, j]]) - np.mean(
            [v not in seen for v in other_day0[:, j]]
        )
        top = np.bincount(k0[:, j][k0[:, j] >= 0]).argmax()
        kept = np.mean(k5[:, j] == top) / np.mean(k0[:, j] == top)
        if j in CATEGORICAL_DRIFT:  # new values took the top of the ranking; day 0's favourite faded
            assert unseen > 0.1 and kept < 0.3, (j, unseen, kept)
        else:
            assert abs(unseen) < 0.02 and kept > 0.8, (j, unseen, kept)


def test_a_day_0_click_model_loses_auc_by_day_5():
    today, day5 = make_world(0), make_world(5)
    counts, ids = _rows(5)
    p5 = 1 / (1 + np.exp(-day5.logit(counts, ids)))
    clicks = np.random.default_rng(1).random(N) < p5
    stale = roc_auc(clicks, today.logit(counts, ids))
    assert roc_auc(clicks, p5) - stale > 0.04  # docs/daily-loop.md: 0.063 on 200,000 rows
    assert abs(clicks.mean() - 0.25) < 0.015  # every day is calibrated to the same click rate


def test_cli_writes_day_n_with_its_own_oracle_files(tmp_path: Path, run_module):
    out = tmp_path / "day3.txt"
    proc = run_module("training.synth", "--day", "3", "--rows", "500", "--out", out, check=True)
    assert proc.stdout.startswith(f"wrote 500 rows of day 3 to {out} in ")
    summary = json.loads(oracle_paths(out)[1].read_text())
    assert (summary["day"], summary["rows"]) == (3, 500)
    assert np.load(oracle_paths(out)[0]).shape == (500,)
    generate(tmp_path / "day0.txt", 500, seed=7)
    assert out.read_bytes() != (tmp_path / "day0.txt").read_bytes()
    assert run_module("training.synth", "--day", "-1", "--out", out).returncode == 2


@pytest.fixture(scope="module")
def day0_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run trained on day 0, and day 1's data beside it."""
    from training.cli import main

    root = tmp_path_factory.mktemp("days")
    for day in (0, 1):
        generate(root / f"day{day}.txt", 3000, seed=3, day=day)
    assert main(["--data", str(root / "day0.txt"), "--out", str(root / "run0"), *TINY_RUN]) == 0
    return root / "run0"


def _as_version(run: Path, folder: Path) -> Path:
    """The run's network as a published version folder: model.onnx (export's naming), spec, manifest."""
    net, ckpt = load_net(run / "checkpoints" / "best.ckpt")
    (folder / repository.ASSETS_EXTRA).mkdir(parents=True)
    export_onnx(net, net.cfg.width, folder / repository.ONNX_MODEL, 17)
    shutil.copyfile(run / "feature_spec.json", folder / repository.FEATURE_SPEC_PATH)
    manifest = {"source_checkpoint": {"model": ckpt["hyper_parameters"]["model"]}}
    (folder / repository.MANIFEST_PATH).write_text(json.dumps(manifest))
    return folder


def test_warm_start_reads_checkpoint_run_dir_version_folder_and_base_path(day0_run: Path, tmp_path: Path):
    net, _ = load_net(day0_run / "checkpoints" / "best.ckpt")
    expected = net.state_dict()
    base = tmp_path / "ctr"
    _as_version(day0_run, base / "1")
    sources = [day0_run / "checkpoints" / "best.ckpt", day0_run, base / "1", base]
    for source in sources:
        warm = load_warm_start(source)
        assert warm.model == net.cfg
        assert warm.spec.to_dict() == json.loads((day0_run / "feature_spec.json").read_text())
        assert all(torch.allclose(warm.state[k], v) for k, v in expected.items()), source
    assert load_warm_start(base).source == base / "1"
    with pytest.raises(CheckpointError, match="expected a checkpoint, a run directory, a version folder"):
        load_warm_start(tmp_path / "empty")


def test_init_from_a_version_trains_on_from_its_weights_with_its_frozen_spec(
    day0_run: Path, tmp_path: Path, run_module
):
    version = _as_version(day0_run, tmp_path / "ctr" / "1")
    run1 = tmp_path / "run1"
    data = day0_run.parent / "day1.txt"
    # lr ~ 0: one epoch leaves the weights where the version had them, so the start point is visible.
    proc = run_module(
        "training",
        "--data",
        data,
        "--out",
        run1,
        "--init-from",
        version,
        "--max-epochs",
        "1",
        "--lr",
        "1e-12",
        "--no-progress-bar",
        check=True,
    )
    assert f"warm start from {version}: its weights and its frozen feature spec (width 128)" in proc.stdout
    assert (run1 / "feature_spec.json").read_text() == (day0_run / "feature_spec.json").read_text()
    before, _ = load_net(day0_run / "checkpoints" / "best.ckpt")
    after, _ = load_net(run1 / "checkpoints" / "best.ckpt")
    for (name, a), b in zip(before.state_dict().items(), after.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    metrics = json.loads((run1 / "metrics.json").read_text())
    assert metrics["config"]["init_from"] == str(version)
    assert np.load(run1 / "val_labels.npy").shape == np.load(run1 / "val_features.npy").shape[:1]
    assert np.load(run1 / "train_features_sample.npy").shape[1] == 128
