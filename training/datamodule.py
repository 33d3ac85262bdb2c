"""LightningDataModule: each rank iterates its own shard of whole batches, from memory or streamed from Parquet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from training.batches import Batch, ShuffledBatches
from training.dataset import PreparedData
from training.features import FeatureSpec
from training.stream import ParquetData, Split
from training.stream_batches import DEFAULT_BUFFER_ROWS, StreamedBatches


class EpochFromTrainer(IterableDataset):
    """Wraps a batch source whose epoch is read from the trainer when an epoch's iteration starts.

    Lightning creates (and prefetches from) an epoch's iterator before `on_train_epoch_start`, so the epoch
    is read when the iterator is made; a resumed run therefore replays the same order.
    """

    def __init__(self, trainer: L.Trainer, batches: ShuffledBatches | StreamedBatches) -> None:
        super().__init__()
        self.trainer, self.batches = trainer, batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        # `processed`, not `current_epoch`: after resuming from an epoch-end checkpoint, Lightning builds the
        # first iterator before it bumps `current_epoch`, while `processed` already counts the finished epoch.
        self.batches.set_epoch(self.trainer.fit_loop.epoch_progress.current.processed)  # type: ignore[attr-defined]
        return iter(self.batches)


class CTRDataModule(L.LightningDataModule):
    """Training and validation batches, sharded by the trainer's rank and world size.

    Args:
        data: `PreparedData` (held in memory) or `(ParquetData, FeatureSpec, encoded split files)` (streamed).
        batch_size / seed: training batches and shuffling.
        buffer_rows: shuffle buffer of the streamed path, in rows.
    """

    def __init__(self, data: PreparedData | tuple[ParquetData, FeatureSpec, dict[Split, Path]], batch_size: int, seed: int,
                 eval_batch_size: int = 8192, buffer_rows: int = DEFAULT_BUFFER_ROWS) -> None:  # fmt: skip
        super().__init__()
        self.data = data
        self.batch_size, self.seed, self.eval_batch_size = batch_size, seed, eval_batch_size
        self.buffer_rows = buffer_rows
        self.train_set: IterableDataset | None = None
        self.val_set: IterableDataset | None = None

    def setup(self, stage: str) -> None:
        t = self.trainer
        assert t is not None, "CTRDataModule must be attached to a Trainer"
        rank, world = t.global_rank, t.world_size
        d = self.data
        if isinstance(d, PreparedData):
            train: ShuffledBatches | StreamedBatches = ShuffledBatches(
                torch.from_numpy(d.train_x), torch.from_numpy(d.train_y), self.batch_size, shuffle=True,
                seed=self.seed, rank=rank, world_size=world,
            )  # fmt: skip
            self.val_set = ShuffledBatches(
                torch.from_numpy(d.val_x),
                torch.from_numpy(d.val_y),
                self.eval_batch_size,
                shuffle=False,
                rank=rank,
                world_size=world,
            )
        else:
            pq_data, spec, encoded = d
            train = StreamedBatches(pq_data, spec, "train", self.batch_size, shuffle=True, seed=self.seed, rank=rank,
                                    world_size=world, buffer_rows=self.buffer_rows, encoded=encoded["train"])  # fmt: skip
            self.val_set = StreamedBatches(pq_data, spec, "val", self.eval_batch_size, shuffle=False, rank=rank,
                                           world_size=world, encoded=encoded["val"])  # fmt: skip
        self.train_set = EpochFromTrainer(t, train)

    # batch_size=None: the dataset already yields whole batches; no per-sample collate.
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=None)  # type: ignore[arg-type]

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=None)  # type: ignore[arg-type]
