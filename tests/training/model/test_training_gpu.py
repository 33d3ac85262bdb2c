"""GPU training and NCCL DDP: the same CLI runs as the CPU tests, on CUDA devices. Skipped without a GPU."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.training.train_runs import TINY_RUN

pytestmark = pytest.mark.gpu

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
needs_two_gpus = pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL DDP needs at least 2 CUDA devices"
)


@needs_gpu
def test_single_gpu_run_writes_a_checkpoint_and_metrics(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    out = tmp_path / "run"
    run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        out,
        *TINY_RUN,
        "--accelerator",
        "gpu",
        "--devices",
        "1",
        check=True,
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 1 and m["epochs"] == 2
    assert 0.5 < m["val_auc"] <= 1.0
    assert (out / "checkpoints" / "best.ckpt").is_file()
    # CUDA's own fast paths, no CPU trick: torch's dropout, fused Adam, AMP.
    amp = "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    assert (m["speed"]["fast_dropout"], m["speed"]["adam_impl"], m["speed"]["precision"]) == (
        False,
        "fused",
        amp,
    )


@needs_two_gpus
def test_two_gpu_nccl_run_covers_each_sample_once_per_epoch(
    data_copy: Path, tmp_path: Path, run_module: Callable[..., subprocess.CompletedProcess]
) -> None:
    out = tmp_path / "run"
    proc = run_module(
        "training",
        "--data",
        data_copy,
        "--out",
        out,
        *TINY_RUN,
        "--accelerator",
        "gpu",
        "--devices",
        "2",
        "--strategy",
        "ddp",
        "--sample-audit",
        check=True,
    )
    assert "distributed_backend=nccl" in proc.stdout + proc.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["world_size"] == 2
    for epoch in range(m["epochs"]):
        seen = np.concatenate([np.load(out / "sample_audit" / f"epoch{epoch}_rank{r}.npy") for r in range(2)])
        assert np.array_equal(np.sort(seen), np.arange(m["train_rows"]))
