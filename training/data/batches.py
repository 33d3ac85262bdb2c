"""Input pipeline: whole batches sliced from preloaded tensors, reshuffled each epoch, sharded by rank.

A per-sample `Dataset.__getitem__` + `collate` costs one Python call and one small tensor per row, the
classic 10–20x slowdown for a tabular MLP. Here one epoch is one `randperm` and one index-select per batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import IterableDataset

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # features (B, W), labels (B, 1), row index (B,)


def shard_bounds(shard_len: int, n_batches: int) -> torch.Tensor:
    """Batch boundaries that split `shard_len` rows into exactly `n_batches` near-equal, non-empty batches."""
    return (torch.arange(n_batches + 1) * shard_len) // n_batches


class ShuffledBatches(IterableDataset):
    """Yields (x, y, index) batches of this rank's shard of a fresh permutation each epoch.

    Every rank gets the same number of batches (DDP needs equal step counts) and the shards partition the
    permutation, so across ranks each sample is seen exactly once per epoch. Call `set_epoch` before each
    epoch; the permutation depends only on (seed, epoch), so a resumed run replays the same order.
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
    ) -> None:
        super().__init__()
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"features and labels differ in length: {x.shape[0]} vs {y.shape[0]}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if x.shape[0] < world_size:
            raise ValueError(f"{x.shape[0]} rows cannot be sharded over {world_size} ranks")
        self.x, self.y = x, y.reshape(-1, 1)
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.rank, self.world_size = rank, world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        # The largest shard decides, so all ranks agree: ceil(ceil(N / world) / batch).
        largest = -(-self.x.shape[0] // self.world_size)
        return -(-largest // self.batch_size)

    def shard(self) -> torch.Tensor:
        """Row indices this rank visits this epoch, in visiting order."""
        n = self.x.shape[0]
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        return order[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[Batch]:
        idx = self.shard()
        bounds = shard_bounds(idx.numel(), len(self))
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            b = idx[lo:hi]
            yield self.x.index_select(0, b), self.y.index_select(0, b), b
