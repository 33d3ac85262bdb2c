"""The network's dropout when training installs a mask source: `nn.Dropout` with the CPU mask drawn elsewhere.

A mask source maps (shape, p, dtype) to the scaled mask: 1 / (1 - p) where an element is kept, 0 where it
is dropped, as a tensor of that shape and dtype. The module is what the network needs of dropout: its
position, no parameters, the identity in eval mode, an `nn.Dropout` for isinstance checks. How the mask is
drawn quickly is run-time tuning that training installs (`training/runtime/fast_dropout.py`); a network
built without a source uses torch's `nn.Dropout`, so the state_dict and the eval graph are the same
either way. Off CPU, or in place, the module is plain `F.dropout`: CUDA's fused dropout needs no help.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

MaskSource = Callable[[tuple[int, ...], float, torch.dtype], torch.Tensor]


class MaskedDropout(nn.Dropout):
    """`nn.Dropout` whose CPU training mask comes from `source` (see the module docstring)."""

    def __init__(self, p: float, source: MaskSource) -> None:
        super().__init__(p)
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x  # eval: the identity, exactly what export traces
        if x.device.type != "cpu" or self.inplace:
            return F.dropout(x, self.p, True, self.inplace)
        # (B, H) * (B, H): the scaled mask is a constant to autograd, so backward is one multiply too.
        return x * self.source(tuple(x.shape), self.p, x.dtype)
