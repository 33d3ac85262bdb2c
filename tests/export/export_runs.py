"""Tiny training run dirs for export tests, written as `python -m training` would write them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ctr_features.spec import FeatureSpec
from ctr_model.net import CTRNet, ModelConfig
from training.synth import sample_rows

WIDTH = 128
VAL_ROWS = 2_000
RAW_ROWS = 3_000


def raw_rows(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic raw Criteo rows: counts float64 [n, 13] (NaN = missing), strings [n, 26] ("" = missing)."""
    numeric, ranks = sample_rows(rng, n)
    categorical = np.char.mod("%08x", ranks % 50).astype(object)
    categorical[ranks < 0] = ""
    return numeric, categorical


def make_run(
    run: Path, activation: str = "relu", net_width: int = WIDTH, spec_width: int = WIDTH, seed: int = 0
) -> Path:
    """Write a training run dir as `python -m training` would: checkpoint, feature spec, val rows, metrics."""
    torch.manual_seed(seed)
    cfg = ModelConfig(width=net_width, hidden1=32, hidden2=16, activation=activation)
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
    # A real FeatureSpec, fitted on a few synthetic rows: export builds the raw graphs from it.
    rng = np.random.default_rng(seed)
    numeric, categorical = raw_rows(rng, RAW_ROWS)
    labels = (rng.random(RAW_ROWS) < 0.3).astype(np.float32)
    FeatureSpec.fit(numeric, categorical, labels, width=spec_width, min_count=20).save(
        run / "feature_spec.json"
    )
    np.savez(run / "val_raw.npz", numeric=numeric[:VAL_ROWS], categorical=categorical[:VAL_ROWS].astype(str))
    np.save(run / "val_features.npy", rng.normal(0, 2, size=(VAL_ROWS, spec_width)).astype(np.float32))
    np.save(run / "val_labels.npy", (rng.random(VAL_ROWS) < 0.3).astype(np.float32))  # the quality gate's
    (run / "metrics.json").write_text(json.dumps({"val_auc": 0.71, "val_logloss": 0.52, "global_step": 120}))
    return run
