"""LightningDataModule over preloaded arrays: each rank iterates its own shard of whole batches."""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from training.batches import ShuffledBatches
from training.dataset import PreparedData


class EpochShuffledBatches(ShuffledBatches):
    """ShuffledBatches whose epoch is read from the trainer when an epoch's iteration starts.

    Lightning creates (and prefetches from) an epoch's iterator before `on_train_epoch_start`, so the epoch
    is read when the iterator is made; a resumed run therefore replays the same permutations.
    """

    def __init__(self, trainer: L.Trainer, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.trainer = trainer

    def __iter__(self):  # type: ignore[no-untyped-def]
        # `processed`, not `current_epoch`: after resuming from an epoch-end checkpoint, Lightning builds the
        # first iterator before it bumps `current_epoch`, while `processed` already counts the finished epoch.
        self.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)  # type: ignore[attr-defined]
        return super().__iter__()


class CTRDataModule(L.LightningDataModule):
    """Training and validation batches from `PreparedData`, sharded by the trainer's rank and world size."""

    def __init__(self, data: PreparedData, batch_size: int, seed: int, eval_batch_size: int = 8192) -> None:
        super().__init__()
        self.data = data
        self.batch_size, self.seed, self.eval_batch_size = batch_size, seed, eval_batch_size
        self.train_set: ShuffledBatches | None = None
        self.val_set: ShuffledBatches | None = None

    def setup(self, stage: str) -> None:
        t = self.trainer
        assert t is not None, "CTRDataModule must be attached to a Trainer"
        d = self.data
        self.train_set = EpochShuffledBatches(
            t, torch.from_numpy(d.train_x), torch.from_numpy(d.train_y), self.batch_size,
            shuffle=True, seed=self.seed, rank=t.global_rank, world_size=t.world_size,
        )  # fmt: skip
        self.val_set = ShuffledBatches(
            torch.from_numpy(d.val_x), torch.from_numpy(d.val_y), self.eval_batch_size,
            shuffle=False, rank=t.global_rank, world_size=t.world_size,
        )  # fmt: skip

    # batch_size=None: the dataset already yields whole batches; no per-sample collate.
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=None)  # type: ignore[arg-type]

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=None)  # type: ignore[arg-type]
