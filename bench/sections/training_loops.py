"""How each in-process framework trains one model for the training section: the same MLP, data, batches, Adam.

A bare PyTorch loop, our LightningModule in a Trainer (or a naive per-sample DataLoader), and Keras `model.fit`.
Each returns the steady samples/s (the epochs after the first, warm-up one) and what the val AUC needs.
`bench.sections.training_throughput` runs each in its own process; `bench.sections.training_profile` reuses
`lightning_fit`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ctr_contract.tf_log import quiet_tensorflow_import

# Batch size and lr follow `make train`'s defaults.
BATCH_SIZE, LR, SEED = 2048, 2e-3, 42
MODEL_WIDTHS = (128, 256, 128)  # the MLP's input and hidden widths (ctr_model.net.ModelConfig's defaults)


def steady_rate(epoch_seconds: list[float], n: int) -> float:
    """Samples/s over the epochs after the first (warm-up) one; over all of them when there is one."""
    timed = epoch_seconds[1:] or epoch_seconds
    return n * len(timed) / sum(timed)


def torch_val_auc(net: Any, val_x: np.ndarray, val_y: np.ndarray) -> float:
    import torch

    from ctr_model.metrics import roc_auc

    net.eval()
    with torch.no_grad():
        return roc_auc(val_y, net(torch.from_numpy(val_x)).squeeze(1).numpy())


def bare_loop(d: dict[str, np.ndarray], epochs: int, args: argparse.Namespace) -> tuple[float, Any]:
    """Plain loop: preloaded tensors, the same shuffled whole batches as our pipeline, no Lightning."""
    import torch
    import torch.nn.functional as F

    from ctr_model.net import CTRNet
    from training.loader.memory import ShuffledBatches

    net = CTRNet()
    opt = torch.optim.Adam(
        net.parameters(),
        lr=LR,
        foreach=True if args.adam_impl == "foreach" else None,
        fused=True if args.adam_impl == "fused" else None,
    )
    step = torch.compile(net) if args.compile else net
    batches = ShuffledBatches(
        torch.from_numpy(d["train_x"]), torch.from_numpy(d["train_y"]), args.batch_size, seed=SEED
    )
    seconds = []
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        net.train()
        t0 = time.perf_counter()
        for x, y, _ in batches:
            opt.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(step(x), y).backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
    return steady_rate(seconds, len(d["train_y"])), net


def lightning_fit(
    d: dict[str, np.ndarray], epochs: int, batch_size: int, speed: Any, naive: bool = False
) -> tuple[float, Any]:
    """Our module in a Trainer with `speed` (a `SpeedSettings`); `naive` swaps our batch slicer for a
    per-sample Dataset + default collate. Returns (steady samples/s, the trained net)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ctr_model.net import ModelConfig
    from training.loader.memory import ShuffledBatches
    from training.model.lightning_module import CTRModule

    x, y = torch.from_numpy(d["train_x"]), torch.from_numpy(d["train_y"])
    if naive:
        loader = DataLoader(
            TensorDataset(x, y.unsqueeze(1), torch.arange(len(y))), batch_size=batch_size, shuffle=True
        )
    else:
        loader = DataLoader(ShuffledBatches(x, y, batch_size, seed=SEED), batch_size=None)
    epoch_seconds: list[float] = []

    class EpochClock(L.Callback):
        def on_train_epoch_start(self, *a: Any) -> None:
            self.t0 = time.perf_counter()

        def on_train_epoch_end(self, *a: Any) -> None:
            epoch_seconds.append(time.perf_counter() - self.t0)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[EpochClock(), *speed.callbacks()],
        precision=speed.precision,
    )
    module = CTRModule(
        ModelConfig().to_dict(), lr=LR, adam_impl=speed.adam_impl, fast_dropout=speed.fast_dropout
    )
    trainer.fit(module, train_dataloaders=loader)
    return steady_rate(epoch_seconds, len(y)), module.net


def keras_fit(d: dict[str, np.ndarray], epochs: int, args: argparse.Namespace) -> tuple[float, float]:
    """`keras.Sequential` of the same MLP and `model.fit`: (steady samples/s, val AUC)."""
    with (
        quiet_tensorflow_import()
    ):  # before keras loads it: quiet C++ log, unless the user set TF_CPP_MIN_LOG_LEVEL
        import tensorflow  # noqa: F401
    import keras

    from ctr_model.metrics import roc_auc

    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [
            keras.Input((d["train_x"].shape[1],)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    seconds: list[float] = []

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.t0)

    model.fit(
        d["train_x"],
        d["train_y"],
        batch_size=args.batch_size,
        epochs=epochs,
        shuffle=True,
        verbose=0,
        callbacks=[EpochClock()],
    )
    logits = model.predict(d["val_x"], batch_size=8192, verbose=0).reshape(-1)
    return steady_rate(seconds, len(d["train_y"])), roc_auc(d["val_y"], logits)
