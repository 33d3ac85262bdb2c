"""The fast dropout's mask source: CPU masks from numpy's bulk bit generator, same maths as `nn.Dropout`.

On CPU, `torch.bernoulli_` draws one Mersenne-Twister double per mask element, which made up most of a
training step; numpy's SFC64 fills the same mask from 16-bit draws several times faster. Each draw is an
integer u in [0, 65536); an element is kept when u >= round(p * 65536), so the keep probability is 1 - p to
within 2^-17 (far below the sampling error of any batch), and kept values are scaled by 1 / (1 - p) (in
bf16 that scale is rounded to bf16, as torch's own dropout does on a bf16 tensor).

`numpy_mask` is the source training installs in the network (`CTRNet(mask_source=...)`, which makes each
dropout a `ctr_model.dropout.MaskedDropout`); `fast_dropout(p)` builds one such module.
The per-call seed is drawn from torch's default generator (so `L.seed_everything` / `torch.manual_seed` fix the
masks, and every call gets a fresh one) and mixed with the process group rank (so DDP ranks differ).
numpy writes the scaled mask in the activation's dtype (bf16 as its bits), so torch runs one multiply forward and
one backward. The next mask is not drawn on a thread while the step runs: that thread takes the core of
torch's second OpenMP thread, and the step got slower.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ctr_model.dropout import MaskedDropout

DRAW_LEVELS = 1 << 16  # each mask element is one uint16 draw
SEED_RANGE = 2**62
_NUMPY: dict[torch.dtype, type[np.floating]] = {torch.float32: np.float32, torch.float64: np.float64}


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _bf16_bits(value: float) -> int:
    """The bfloat16 nearest to `value` (ties to even), as its 16 bits."""
    bits = int(np.float32(value).view(np.uint32))
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def mask_array(seed: int, rank: int, shape: tuple[int, ...], p: float, dtype: torch.dtype) -> np.ndarray:
    """The scaled mask as numpy: 1/(1-p) where kept, 0 where dropped.

    float32/float64: that dtype; bfloat16: its bits as uint16; any other dtype: the 0/1 keep mask as uint8.
    """
    n = int(np.prod(shape))
    # SFC64's raw 64-bit outputs, cut into four uniform 16-bit draws each: ~half the time of `integers`.
    raw = np.random.SFC64([seed, rank]).random_raw(-(-n // 4))
    keep = raw.view(np.uint16)[:n].reshape(shape) >= round(p * DRAW_LEVELS)
    scale = 1.0 / (1.0 - p)
    if dtype == torch.bfloat16:
        return np.multiply(keep, np.uint16(_bf16_bits(scale)), dtype=np.uint16)
    if dtype in _NUMPY:
        np_dtype = _NUMPY[dtype]
        return np.multiply(keep, np_dtype(scale), dtype=np_dtype)  # type: ignore[call-overload]
    return keep.view(np.uint8)


def scaled_mask(seed: int, rank: int, shape: tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """`mask_array(...)` as a tensor of `dtype`."""
    t = torch.from_numpy(mask_array(seed, rank, shape, p, dtype))
    if dtype == torch.bfloat16:
        return t.view(torch.bfloat16)
    if dtype in _NUMPY:
        return t
    # uint8 -> dtype is ~10x faster in torch than bool -> dtype
    return t.to(dtype).mul_(1.0 / (1.0 - p))


def numpy_mask(shape: tuple[int, ...], p: float, dtype: torch.dtype) -> torch.Tensor:
    """The mask source (`ctr_model.dropout.MaskSource`): a fresh seed per call, mixed with this process's rank."""
    seed = int(torch.randint(0, SEED_RANGE, (1,)).item())
    return scaled_mask(seed, _rank(), shape, p, dtype)


def fast_dropout(p: float) -> MaskedDropout:
    """A dropout module drawing its CPU masks from `numpy_mask`."""
    return MaskedDropout(p, numpy_mask)
