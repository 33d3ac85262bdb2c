"""Training callbacks: throughput measurement and the per-epoch sample audit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch


class TrainThroughput(L.Callback):
    """Training samples/s summed over ranks, timing the training part of each epoch (validation excluded)."""

    def __init__(self) -> None:
        self.samples = 0
        self.seconds = 0.0
        self._t0: float | None = None
        self._n = 0

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0, self._n = time.perf_counter(), 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._n += int(batch[0].shape[0])

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._close(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close(trainer)

    def _close(self, trainer: L.Trainer) -> None:
        if self._t0 is None:
            return
        # Shards differ by at most one row, so local rows x world size is the global count to within a row.
        self.seconds += time.perf_counter() - self._t0
        self.samples += self._n * trainer.world_size
        self._t0 = None


class SampleAudit(L.Callback):
    """Writes the training-row indices each rank consumed, one file per (epoch, rank): `epoch{E}_rank{R}.npy`.

    A debugging aid for sharding: across ranks, an epoch's files must partition range(train rows).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: list[torch.Tensor] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seen = []

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._seen.append(batch[2].detach().cpu())

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        seen = torch.cat(self._seen).numpy() if self._seen else np.zeros(0, np.int64)
        np.save(self.directory / f"epoch{trainer.current_epoch}_rank{trainer.global_rank}.npy", seen)
