"""`python -m training` end to end: the run directory contract, resume after a kill, NaN stop, bad data, --help."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from ctr_features.spec import FeatureSpec
from ctr_model.checkpoint import load_net
from ctr_model.net import CTRNet, ModelConfig
from tests.training.reference_prepare import prepare_streaming
from tests.training.train_runs import TINY_RUN
from training.config import TrainConfig
from training.data.cache import cache_path
from training.loader.memory import ShuffledBatches
from training.loader.stream import StreamedBatches


def test_tiny_run_writes_checkpoints_spec_metrics_and_val_features(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    out = tmp_path / "run"
    proc = run_module("training", "--data", data_copy, "--out", out, *TINY_RUN, check=True)
    m = json.loads((out / "metrics.json").read_text())
    steps_per_epoch = math.ceil(m["train_rows"] / 256)
    assert m["global_step"] == 2 * steps_per_epoch and m["epochs"] == 2
    assert m["train_rows"] + m["val_rows"] == 4000
    assert 0.6 < m["val_auc"] <= 1.0 and 0.0 < m["val_logloss"] < 0.7
    assert 0.7 < m["oracle_auc"] < 0.9 and m["samples_per_sec"] > 0
    assert f"val AUC {m['val_auc']:.4f}" in proc.stdout and f"oracle AUC {m['oracle_auc']:.4f}" in proc.stdout
    net, ckpt = load_net(out / "checkpoints" / "best.ckpt")
    assert ckpt["hyper_parameters"]["model"] == net.cfg.to_dict()
    assert (out / "checkpoints" / "last.ckpt").is_file() and (out / "feature_spec.json").is_file()
    val = np.load(out / "val_features.npy")
    assert val.dtype == np.float32 and val.shape == (m["val_rows"], 128) and np.isfinite(val).all()
    with torch.no_grad():
        assert net.predict_proba(torch.from_numpy(val)).shape == (m["val_rows"], 1)
    # The same validation rows, raw (export's raw-signature parity rows): the spec maps them to val_features.
    with np.load(out / "val_raw.npz") as raw:
        numeric, categorical = raw["numeric"], raw["categorical"].astype(object)
    spec = FeatureSpec.load(out / "feature_spec.json")
    assert spec.transform(numeric, categorical).tobytes() == val.tobytes()


def expected_order(data: Path, loader: str, epoch: int, n: int) -> list[int]:
    """The training-row order an uninterrupted run visits in `epoch` (a function of seed and epoch only)."""
    if loader == "memory":
        batches = ShuffledBatches(torch.zeros(n, 1), torch.zeros(n), 256, seed=42)
        batches.set_epoch(epoch)
        return batches.shard().tolist()
    pq_data, spec, _ = prepare_streaming([cache_path(data)], 0.1, 128, None, print)
    streamed = StreamedBatches(pq_data, spec, "train", 256, seed=42, buffer_rows=1000)
    streamed.set_epoch(epoch)
    return torch.cat([b[2] for b in streamed]).tolist()


@pytest.mark.slow  # make test-slow (docs/testing.md)
@pytest.mark.parametrize("loader", ["memory", "stream"])
def test_resume_after_kill_ends_with_the_same_optimizer_steps(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess], loader: str
) -> None:
    out = tmp_path / "run"
    # A real SIGKILL in the middle of epoch 2 (of 3): only the epoch-1 checkpoints survive.
    script = textwrap.dedent(f"""
        import os, signal
        import lightning as L
        from training.config import TrainConfig
        from training.train import run_training

        class KillMidEpoch(L.Callback):
            def on_train_batch_end(self, trainer, *args):
                if trainer.current_epoch == 1 and trainer.global_step >= 20:
                    os.kill(os.getpid(), signal.SIGKILL)

        cfg = TrainConfig(data={str(data_copy)!r}, out={str(out)!r}, batch_size=256, max_epochs=3, patience=5,
                          progress_bar=False, loader={loader!r}, shuffle_buffer=1000)
        run_training(cfg, callbacks=[KillMidEpoch()])
    """)
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (out / "metrics.json").exists()
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["epoch"] == 0

    resumed = run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        out,
        "--batch-size",
        "256",
        "--max-epochs",
        "3",
        "--patience",
        "5",
        "--no-progress-bar",
        "--resume",
        "--sample-audit",
        "--loader",
        loader,
        "--shuffle-buffer",
        "1000",
        check=True,
    )
    assert "Restoring states from the checkpoint path" in resumed.stdout + resumed.stderr
    assert f"loader: {loader} (--loader {loader})" in resumed.stdout
    m = json.loads((out / "metrics.json").read_text())
    assert m["epochs"] == 3 and m["global_step"] == 3 * math.ceil(m["train_rows"] / 256)
    assert m["loader"] == loader
    # The resumed epochs replay exactly the sample order of an uninterrupted run.
    for epoch in (1, 2):
        seen = np.load(out / "sample_audit" / f"epoch{epoch}_rank0.npy").tolist()
        assert seen == expected_order(data_copy, loader, epoch, m["train_rows"])


def test_resume_without_a_checkpoint_is_a_clear_error(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    proc = run_module("training", "--data", data_copy, "--out", tmp_path / "none", "--resume")
    assert proc.returncode == 1
    assert (
        f"--resume needs {tmp_path / 'none' / 'checkpoints' / 'last.ckpt'}, which does not exist"
        in proc.stderr
    )


def test_nan_loss_stops_the_run_naming_the_step(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    out = tmp_path / "run"
    proc = run_module("training", "--data", data_copy, "--out", out, *TINY_RUN, "--lr", "1e30")
    assert proc.returncode == 1
    assert "error: training loss is nan at global step 1 (epoch 0, batch 1)" in proc.stderr
    assert not (out / "checkpoints").exists() and not (out / "metrics.json").exists()


def test_malformed_data_fails_naming_file_line_and_field(
    tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    data = tmp_path / "train.txt"
    data.write_text("1\t" + "\t".join(["1"] * 13 + ["ab"] * 26) + "\n" + "0\tx" + "\t" * 38 + "\n")
    proc = run_module("training", "--data", data, "--out", tmp_path / "run")
    assert proc.returncode == 1
    assert f"error: {data}:2: field I1 is 'x', expected an integer count or an empty cell" in proc.stderr
    assert "--skip-bad-rows" in proc.stderr


def test_help_lists_every_option(run_module: Callable[..., subprocess.CompletedProcess]) -> None:
    proc = run_module("training", "--help", check=True)
    for name in TrainConfig.__dataclass_fields__:
        flag = {
            "progress_bar": "--no-progress-bar",
            "num_nodes": "--num_nodes",
            "fast_dropout": "--no-fast-dropout",
            "malloc_tuning": "--no-malloc-tuning",
        }.get(name, "--" + name.replace("_", "-"))
        assert flag in proc.stdout, flag
    assert "torchrun" in proc.stdout


def test_a_checkpoint_written_before_the_width_rename_still_loads(tmp_path: Path) -> None:
    net = CTRNet(ModelConfig(width=100, hidden1=32, hidden2=16))
    old = {
        "in_features": 100,
        "hidden1": 32,
        "hidden2": 16,
        "dropout1": 0.3,
        "dropout2": 0.2,
        "activation": "relu",
    }
    state = {f"net.{k}": v for k, v in net.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"model": old}}, tmp_path / "old.ckpt")
    loaded, _ = load_net(tmp_path / "old.ckpt")
    assert loaded.cfg.width == 100
    assert ModelConfig.from_dict({**old, "width": 64}).width == 64  # a new key wins over the old one
