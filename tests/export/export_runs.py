"""Tiny training run dirs for export tests, written as `python -m training` would write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from training.model import CTRNet, ModelConfig

WIDTH = 128
VAL_ROWS = 2_000


def make_run(
    run: Path, activation: str = "relu", in_features: int = WIDTH, spec_width: int = WIDTH, seed: int = 0
) -> Path:
    """Write a training run dir as `python -m training` would: checkpoint, feature spec, val rows, metrics."""
    torch.manual_seed(seed)
    cfg = ModelConfig(in_features=in_features, hidden1=32, hidden2=16, activation=activation)
    net = CTRNet(cfg)
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": {"net." + k: v for k, v in net.state_dict().items()},
            "hyper_parameters": {"model": cfg.to_dict()},
            "epoch": 3,
            "global_step": 120,
        },
        run / "checkpoints" / "best.ckpt",
    )
    # Export reads only `width` and copies the rest verbatim, so a small spec in training's layout suffices.
    spec = {
        "version": 1,
        "width": spec_width,
        "numeric": {"mean": [0.5] * 13, "std": [2.0] * 13, "clip": 10.0},
    }
    (run / "feature_spec.json").write_text(json.dumps(spec, indent=2))
    rng = np.random.default_rng(seed)
    np.save(run / "val_features.npy", rng.normal(0, 2, size=(VAL_ROWS, spec_width)).astype(np.float32))
    (run / "metrics.json").write_text(json.dumps({"val_auc": 0.71, "val_logloss": 0.52, "global_step": 120}))
    return run
