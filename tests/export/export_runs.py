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
TRAINED_TRAIN_ROWS = 20_000  # make_trained_run: enough for the network to learn the click model
TRAINED_VAL_ROWS = 6_000  # its validation rows: 3,000 to fit the calibrator on, 3,000 to report on
TRAINED_STEPS = 400


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


def make_trained_run(run: Path, negative_rate: float = 1.0, record_rate: bool = True, seed: int = 0) -> Path:
    """A run dir whose network learned a known click model, trained as `python -m training` would.

    Clicks follow a logistic model of the raw fields; the spec is fitted on the training rows, the network
    (128 -> 32 -> 16 -> 1) is trained with Adam on all positives and a fraction `negative_rate` of the
    negatives (training's `--negative-sample-rate`), so its probabilities are 1/w too high in odds. The rate
    goes into the checkpoint's hyper_parameters and metrics.json unless `record_rate` is False (an old run).
    Validation rows: val_raw.npz and val_features.npy hold the same TRAINED_VAL_ROWS rows, val_labels.npy theirs.
    """
    rng = np.random.default_rng(seed)
    numeric, categorical = raw_rows(rng, TRAINED_TRAIN_ROWS + TRAINED_VAL_ROWS)
    ranks = np.array([[int(v, 16) if v else -1 for v in row] for row in categorical[:, :3].tolist()])
    counts = np.log1p(np.nan_to_num(np.maximum(numeric[:, :2], 0.0)))
    logit = (
        -1.6
        + 0.5 * counts[:, 0]
        - 0.3 * counts[:, 1]
        + 1.2 * (ranks[:, 0] % 7 == 0)
        - 0.9 * (ranks[:, 1] < 3)
    )
    labels = (rng.random(len(logit)) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    train, val = slice(0, TRAINED_TRAIN_ROWS), slice(TRAINED_TRAIN_ROWS, None)
    spec = FeatureSpec.fit(numeric[train], categorical[train], labels[train], width=WIDTH, min_count=20)
    x = spec.transform(numeric, categorical)
    kept = (labels[train] == 1) | (rng.random(TRAINED_TRAIN_ROWS) < negative_rate)
    xt, yt = torch.from_numpy(x[train][kept]), torch.from_numpy(labels[train][kept]).reshape(-1, 1)
    torch.manual_seed(seed)
    cfg = ModelConfig(width=WIDTH, hidden1=32, hidden2=16)
    net = CTRNet(cfg)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(TRAINED_STEPS):
        batch = torch.from_numpy(np.random.default_rng(step).integers(0, len(yt), 512))
        opt.zero_grad()
        loss_fn(net(xt[batch]), yt[batch]).backward()
        opt.step()
    net.eval()
    hp: dict = {"model": cfg.to_dict()}
    metrics: dict = {"val_auc": 0.7, "global_step": TRAINED_STEPS}
    if record_rate:
        hp["negative_sample_rate"] = metrics["negative_sample_rate"] = negative_rate
    (run / "checkpoints").mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "state_dict": {"net." + k: v for k, v in net.state_dict().items()},
            "hyper_parameters": hp,
            "epoch": 0,
        },
        run / "checkpoints" / "best.ckpt",
    )
    spec.save(run / "feature_spec.json")
    np.savez(run / "val_raw.npz", numeric=numeric[val], categorical=categorical[val].astype(str))
    np.save(run / "val_features.npy", x[val])
    np.save(run / "val_labels.npy", labels[val])
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run
