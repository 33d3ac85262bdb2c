"""The processes that prepare the data together: one process, or every rank of a torchrun / DDP job.

Preparation needs only a few collectives (barrier, gather to rank 0, broadcast from rank 0) over small
Python objects, so it uses torch.distributed's object collectives on a gloo group. torch is imported only
when there is more than one rank: `python -m training.prepare` on one machine never loads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from training.errors import DataError


class RankGroup:
    """Rank `rank` of `world` preparing processes; the collectives are no-ops for a single process."""

    def __init__(self, rank: int = 0, world: int = 1, group: Any = None) -> None:
        self.rank, self.world, self._group = rank, world, group

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier(group=self._group)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (in rank order); None on the other ranks."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self._group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self._group)
        return box[0]

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank."""
        if self.world == 1:
            return flag
        import torch.distributed as dist

        flags: list[Any] = [None] * self.world
        dist.all_gather_object(flags, flag, group=self._group)
        return all(flags)

    def raise_any(self, error: BaseException | None) -> None:
        """Raise on every rank when any rank failed: its own error, or one naming the rank that failed."""
        if self.world > 1:
            import torch.distributed as dist

            messages: list[Any] = [None] * self.world
            dist.all_gather_object(messages, None if error is None else str(error), group=self._group)
            if error is None:
                failed = next(((k, m) for k, m in enumerate(messages) if m is not None), None)
                if failed is not None:
                    raise DataError(f"rank {failed[0]}: {failed[1]}")
        if error is not None:
            raise error


@contextmanager
def launched_group(timeout_s: float = 600.0) -> Iterator[RankGroup]:
    """The ranks torchrun (or a PyTorchJob) launched, joined in a gloo group for the preparation only.

    Uses the group that already exists if any; otherwise joins one from the launcher's environment and
    leaves it afterwards, so the training's own DDP setup starts clean. A single process gets a plain group.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    # torchrun (and so a PyTorchJob) starts every rank at once, with its agent's store for them all.
    # Lightning's own launcher (`--devices N`) starts ranks 1.. only once rank 0 is in `fit`: it prepared
    # alone, and they must not wait for it here.
    if world <= 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        yield RankGroup()
        return
    import torch.distributed as dist

    if dist.is_initialized():
        yield RankGroup(dist.get_rank(), dist.get_world_size(), None)
        return
    timeout = timedelta(seconds=timeout_s)
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    # Keys under their own prefix: the DDP group Lightning makes next on the same store must not find ours.
    store = dist.PrefixStore("ctr-pipeline/prepare/", agent)
    dist.init_process_group(
        "gloo", store=store, rank=int(os.environ["RANK"]), world_size=world, timeout=timeout
    )
    try:
        yield RankGroup(dist.get_rank(), dist.get_world_size(), None)
    finally:
        dist.destroy_process_group()
