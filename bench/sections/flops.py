"""The training step's arithmetic: its matmul FLOPs, and a measured matmul rate as this CPU's practical peak."""

from __future__ import annotations

import itertools
import statistics
import time


def step_flops(batch: int, widths: tuple[int, ...] = (128, 256, 128, 1)) -> int:
    """Matmul FLOPs of one training step: 2·B·in·out per layer forward, twice that backward."""
    return 3 * sum(2 * batch * a * b for a, b in itertools.pairwise(widths))


def matmul_gflops(n: int = 2048, repeats: int = 5, dtype: str = "float32") -> float:
    """Measured GFLOP/s of one (n, n) @ (n, n) matmul in `dtype`, median of `repeats`: the practical peak."""
    import torch

    a, b = torch.randn(n, n, dtype=getattr(torch, dtype)), torch.randn(n, n, dtype=getattr(torch, dtype))
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9
