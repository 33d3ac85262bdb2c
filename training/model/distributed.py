"""DDP setup: the strategy (NCCL on GPU, gloo on CPU), a short rendezvous timeout, and a clear failure message."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from lightning.pytorch.strategies import DDPStrategy, Strategy

from training.errors import DistributedSetupError

ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# Substrings of the errors torch raises when a peer never joins the rendezvous or a collective times out.
_RENDEZVOUS_SIGNS = ("timed out", "timeout", "clients joined", "connection refused", "connect to")


def launch_rank() -> int:
    """Global rank of this process as the launcher set it (before any process group exists); 0 when single."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return node * per_node + local


def build_strategy(strategy: str, accelerator: str, world: int, timeout_s: float) -> str | Strategy:
    """Lightning strategy for the requested layout.

    Args:
        strategy: "auto", "ddp" or any Lightning strategy name (passed through).
        accelerator: "cpu", "gpu", "cuda" or "auto".
        world: devices x nodes.
        timeout_s: seconds a rank waits for its peers at init and in collectives.
    """
    if strategy not in ("auto", "ddp") or (strategy == "auto" and world == 1):
        return strategy
    use_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and _cuda_available())
    return DDPStrategy(
        process_group_backend="nccl" if use_gpu else "gloo", timeout=timedelta(seconds=timeout_s)
    )


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def rendezvous_help(timeout_s: float, cause: BaseException) -> str:
    env = ", ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in ENV_VARS)
    shm = "absent"
    if os.path.isdir("/dev/shm"):
        shm = f"{shutil.disk_usage('/dev/shm').total / 2**20:.0f} MiB"
    return (
        f"DDP ranks did not all meet within {timeout_s:g}s ({type(cause).__name__}: {str(cause).splitlines()[0][:300]}). "
        f"Check on every node: MASTER_ADDR/MASTER_PORT point at node 0 and the port is open; WORLD_SIZE = "
        f"nodes x devices; NODE_RANK is unique per node; all nodes were started with the same --num_nodes/--devices. "
        f"Now: {env}. /dev/shm is {shm} (NCCL and DataLoader workers need at least ~1 GiB; in Docker "
        f"use --shm-size). Raise --ddp-timeout if nodes start minutes apart."
    )


@contextmanager
def explain_rendezvous_failures(timeout_s: float, distributed: bool) -> Iterator[None]:
    """Re-raise rendezvous/collective timeouts as `DistributedSetupError` with the checklist above."""
    try:
        yield
    except Exception as e:
        text = f"{type(e).__name__} {e}".lower()
        if distributed and (
            "diststore" in text or "distbackend" in text or any(s in text for s in _RENDEZVOUS_SIGNS)
        ):
            raise DistributedSetupError(rendezvous_help(timeout_s, e)) from e
        raise
