"""Dropout whose CPU mask comes from numpy's bulk bit generator: same maths as `nn.Dropout`, ~7x less time.

On CPU, `torch.bernoulli_` draws one Mersenne-Twister double per element: 5–7 ms for a (2048, 256) batch on a
2-core box, which was most of a training step. numpy's PCG64 fills the same mask's 16-bit draws in ~0.3 ms.
Each draw is an integer u in [0, 65536); an element is kept when u >= round(p * 65536), so the keep probability
is 1 - p to within 2^-17 (far below the sampling error of any batch), and kept values are scaled by 1 / (1 - p).

The per-call seed is drawn from torch's default generator (so `L.seed_everything` / `torch.manual_seed` fix the
masks, and every call gets a fresh one) and mixed with the process group rank (so DDP ranks differ).
Off CPU the module is plain `F.dropout`: CUDA's fused Philox dropout is already fast.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DRAW_LEVELS = 1 << 16  # each mask element is one uint16 draw


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A bool mask of `shape`, True with probability 1 - p, from a seed drawn off torch's default generator."""
    seed = int(torch.randint(0, 2**62, (1,)).item())
    n = shape.numel()
    # PCG64's raw 64-bit outputs, cut into four uniform 16-bit draws each: ~half the time of `integers`.
    raw = np.random.PCG64([seed, _rank()]).random_raw(-(-n // 4))
    draws = raw.view(np.uint16)[:n].reshape(tuple(shape))
    return torch.from_numpy(draws >= round(p * DRAW_LEVELS))


class FastDropout(nn.Dropout):
    """`nn.Dropout` (same class for isinstance checks, no parameters) with the numpy-drawn mask on CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x  # eval: the identity, exactly what export traces
        if x.device.type != "cpu" or self.inplace:
            return F.dropout(x, self.p, True, self.inplace)
        # (B, H) * (B, H): the scaled mask is a constant to autograd, so backward is one multiply too.
        scaled = keep_mask(x.shape, self.p).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scaled
