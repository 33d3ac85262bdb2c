"""LightningDataModule: each rank iterates its own shard of whole batches, from memory or streamed from records.

The data is prepared before the Trainer exists (`training.loader.inputs.load_inputs`), not in `prepare_data`
or `setup`: every rank does its share of the preparation in its own process group, while Lightning runs
`prepare_data` in one process per node and `setup` only once DDP is up, and the run needs the fitted spec,
the loader and the row counts before the Trainer is built and after `fit` (metrics, export's samples).
`setup` turns those inputs into this rank's batch sources.
"""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from training.loader.inputs import RunInputs
from training.loader.memory import Batch, ShuffledBatches
from training.loader.stream import DEFAULT_BUFFER_ROWS, StreamedBatches


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

    Under negative sampling (`inputs.kept`) the training batches visit only the kept rows; validation all.

    Args:
        inputs: the run's inputs; their loader says whether batches come from memory or stream from disk.
        batch_size / seed: training batches and shuffling.
        buffer_rows: shuffle buffer of the streamed path, in rows.
    """

    def __init__(
        self,
        inputs: RunInputs,
        batch_size: int,
        seed: int,
        eval_batch_size: int = 8192,
        buffer_rows: int = DEFAULT_BUFFER_ROWS,
    ) -> None:
        super().__init__()
        self.inputs = inputs
        self.batch_size, self.seed, self.eval_batch_size = batch_size, seed, eval_batch_size
        self.buffer_rows = buffer_rows
        self.train_set: IterableDataset | None = None
        self.val_set: IterableDataset | None = None

    def setup(self, stage: str) -> None:
        t = self.trainer
        assert t is not None, "CTRDataModule must be attached to a Trainer"
        rank, world = t.global_rank, t.world_size
        m, i = self.inputs.memory, self.inputs
        if m is not None:  # the memory loader: slices of arrays held in this process
            train: ShuffledBatches | StreamedBatches = ShuffledBatches(
                torch.from_numpy(m.train_x),
                torch.from_numpy(m.train_y),
                self.batch_size,
                shuffle=True,
                seed=self.seed,
                rank=rank,
                world_size=world,
                rows=torch.from_numpy(i.kept.indices()) if i.kept is not None else None,
            )
            self.val_set = ShuffledBatches(
                torch.from_numpy(m.val_x),
                torch.from_numpy(m.val_y),
                self.eval_batch_size,
                shuffle=False,
                rank=rank,
                world_size=world,
            )
        else:  # the stream loader: the encoded splits read from disk through a shuffle buffer
            train = StreamedBatches(
                i.data,
                i.spec,
                "train",
                self.batch_size,
                shuffle=True,
                seed=self.seed,
                rank=rank,
                world_size=world,
                buffer_rows=self.buffer_rows,
                encoded=i.encoded["train"],
                kept=i.kept,
            )
            self.val_set = StreamedBatches(
                i.data,
                i.spec,
                "val",
                self.eval_batch_size,
                shuffle=False,
                rank=rank,
                world_size=world,
                encoded=i.encoded["val"],
            )
        self.train_set = EpochFromTrainer(t, train)

    # batch_size=None: the dataset already yields whole batches; no per-sample collate.
    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=None)  # type: ignore[arg-type]

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=None)  # type: ignore[arg-type]
