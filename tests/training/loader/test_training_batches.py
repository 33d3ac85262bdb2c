"""The input pipeline: whole batches, reshuffled per epoch, rank shards that partition each epoch."""

from __future__ import annotations

import pytest
import torch

from training.loader.memory import ShuffledBatches


def epoch_rows(n: int, batch: int, world: int, epoch: int) -> list[list[int]]:
    out = []
    for rank in range(world):
        ds = ShuffledBatches(
            torch.zeros(n, 4),
            torch.arange(n, dtype=torch.float32),
            batch,
            seed=1,
            rank=rank,
            world_size=world,
        )
        ds.set_epoch(epoch)
        batches = list(ds)
        assert len(batches) == len(ds)
        for x, y, idx in batches:
            assert x.shape == (idx.numel(), 4) and y.squeeze(1).long().tolist() == idx.tolist()
        out.append(torch.cat([b[2] for b in batches]).tolist())
    return out


@pytest.mark.parametrize(("n", "batch", "world"), [(1000, 64, 1), (1001, 64, 2), (1023, 100, 3), (10, 4, 4)])
def test_rank_shards_partition_every_epoch_with_equal_batch_counts(n: int, batch: int, world: int) -> None:
    for epoch in (0, 1):
        shards = epoch_rows(n, batch, world, epoch)
        assert sorted(i for s in shards for i in s) == list(range(n))
        assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1


def test_order_changes_per_epoch_and_repeats_for_the_same_epoch() -> None:
    assert epoch_rows(500, 50, 1, 0) != epoch_rows(500, 50, 1, 1)
    assert epoch_rows(500, 50, 1, 3) == epoch_rows(500, 50, 1, 3)


def test_batches_are_full_size_when_the_shard_divides_evenly() -> None:
    ds = ShuffledBatches(torch.zeros(1024, 2), torch.zeros(1024), 256)
    assert [b[0].shape[0] for b in ds] == [256] * 4
