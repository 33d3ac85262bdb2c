"""The memory loader (`--loader memory`): both splits held as arrays in each process, batches sliced from them.

`load_in_memory` expands the encoded splits (training/data/preparation.py) into preallocated arrays, no Arrow
table of all rows is ever built. `ShuffledBatches` yields whole batches, reshuffled each epoch and sharded
by rank: a per-sample `Dataset.__getitem__` + `collate` costs one Python call and one small tensor per row,
the classic 10-20x slowdown for a tabular MLP; here one epoch is one `randperm` and one index-select per batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import IterableDataset

from ctr_contract.schema import LABEL
from ctr_features.compiled.records import expand
from ctr_features.spec import FeatureSpec
from training.data.feature_cache import iter_records
from training.data.parquet import ParquetData, Split

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # features (B, W), labels (B, 1), row index (B,)


@dataclass
class PreparedData:
    """Features float32 [N, width], labels float32 [N], and source row ids int64 [N] for each split."""

    spec: FeatureSpec
    train_x: np.ndarray
    train_y: np.ndarray
    train_ids: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    val_ids: np.ndarray


def load_in_memory(data: ParquetData, spec: FeatureSpec, encoded: dict[Split, Path]) -> PreparedData:
    """Both splits as preallocated arrays, expanded from their encoded records (not transformed again)."""
    parts = []
    for split in ("train", "val"):
        n = data.rows(split)  # type: ignore[arg-type]
        x, y = np.empty((n, spec.width), np.float32), np.empty(n, np.float32)
        at = 0
        for rec in iter_records(encoded[split], n):  # type: ignore[index]
            bx, by, _ = expand(rec, spec.width)
            x[at : at + len(rec)], y[at : at + len(rec)] = bx.numpy(), by.reshape(-1).numpy()
            at += len(rec)
        ids = np.concatenate([c.ids for c in data.chunks(split, (LABEL,))])  # type: ignore[arg-type]
        parts += [x, y, ids]
    return PreparedData(spec, *parts)


def shard_bounds(shard_len: int, n_batches: int) -> torch.Tensor:
    """Batch boundaries that split `shard_len` rows into exactly `n_batches` near-equal, non-empty batches."""
    return (torch.arange(n_batches + 1) * shard_len) // n_batches


class ShuffledBatches(IterableDataset):
    """Yields (x, y, index) batches of this rank's shard of a fresh permutation each epoch.

    Every rank gets the same number of batches (DDP needs equal step counts) and the shards partition the
    permutation, so across ranks each sample is seen exactly once per epoch. Call `set_epoch` before each
    epoch; the permutation depends only on (seed, epoch), so a resumed run replays the same order.
    `rows` (int64 positions into x, e.g. the kept rows of negative sampling) limits the epoch to those rows;
    the batches' index is then still the position in x.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        rows: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"features and labels differ in length: {x.shape[0]} vs {y.shape[0]}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.rows = rows
        self.n = x.shape[0] if rows is None else rows.numel()
        if self.n < world_size:
            raise ValueError(f"{self.n} rows cannot be sharded over {world_size} ranks")
        self.x, self.y = x, y.reshape(-1, 1)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        # The largest shard decides, so all ranks agree: ceil(ceil(N / world) / batch).
        largest = -(-self.n // self.world_size)
        return -(-largest // self.batch_size)

    def shard(self) -> torch.Tensor:
        """Row indices this rank visits this epoch, in visiting order."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(self.n, generator=g)
        else:
            order = torch.arange(self.n)
        if self.rows is not None:
            order = self.rows[order]
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[Batch]:
        idx = self.shard()
        bounds = shard_bounds(idx.numel(), len(self))
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            b = idx[lo:hi]
            yield self.x.index_select(0, b), self.y.index_select(0, b), b
