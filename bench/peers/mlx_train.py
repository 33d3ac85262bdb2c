"""The MLX row of the training section: the same MLP, Adam, batches and epochs, run in `.venv-mlx` (`mlx[cpu]`).

    .venv-mlx/bin/python -m bench.peers.mlx_train --features features.npz --epochs 2 --repeats 3 --out mlx.json

`mlx.nn` layers (whose Linear starts as torch's does), `mlx.optimizers.Adam` (with torch's bias correction,
which MLX leaves off by default), and one `mx.compile`d train step
whose inputs and outputs include the model, optimiser and random state (dropout draws from it). MLX is lazy:
`mx.eval` after each step keeps the graph one step long. Samples/s counts the epochs after the first.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from bench.peers.train_worker import batch_indices, worker_main
from ctr_model.metrics import roc_auc


class MLP(nn.Module):
    """Linear(128,256) → ReLU → Dropout(0.3) → Linear(256,128) → ReLU → Dropout(0.2) → Linear(128,1)."""

    def __init__(self, in_features: int = 128) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, 256),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Dropout(0.2),
            nn.Linear(128, 1),
        )

    def __call__(self, x: mx.array) -> mx.array:
        return self.layers(x)  # (B, 128) -> (B, 1) logits


def train_once(
    d: dict[str, np.ndarray], epochs: int, batch_size: int, lr: float, seed: int
) -> tuple[float, float]:
    """Train a fresh model; returns (steady samples/s, val AUC)."""
    mx.random.seed(seed)
    model = MLP(d["train_x"].shape[1])
    mx.eval(model.parameters())
    # MLX's Adam skips bias correction unless asked; torch's and optax's apply it (same maths as theirs).
    opt = optim.Adam(learning_rate=lr, bias_correction=True)
    x_all = mx.array(d["train_x"])  # (N, 128)
    y_all = mx.array(d["train_y"].reshape(-1, 1))  # (N, 1)

    def loss_fn(model: MLP, x: mx.array, y: mx.array) -> mx.array:
        return nn.losses.binary_cross_entropy(model(x), y, with_logits=True, reduction="mean")

    loss_and_grad = nn.value_and_grad(model, loss_fn)
    state: list[Any] = [model.state, opt.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(idx: mx.array) -> mx.array:
        loss, grads = loss_and_grad(model, x_all[idx], y_all[idx])
        opt.update(model, grads)
        return loss

    model.train()
    rng = np.random.default_rng(seed)
    seconds = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for idx in batch_indices(len(d["train_y"]), batch_size, rng):
            step(mx.array(idx))
            mx.eval(state)
        seconds.append(time.perf_counter() - t0)
    model.eval()
    logits = np.array(model(mx.array(d["val_x"])))
    timed = seconds[1:] or seconds
    return len(d["train_y"]) * len(timed) / sum(timed), roc_auc(d["val_y"], logits.reshape(-1))


def about() -> dict[str, Any]:
    """The row's package version and the device MLX ran on."""
    import importlib.metadata as m

    return {"versions": {"mlx": m.version("mlx")}, "device": str(mx.default_device())}


def main(argv: list[str] | None = None) -> None:
    worker_main("mlx", __doc__ or "", train_once, about, argv)


if __name__ == "__main__":
    main()
