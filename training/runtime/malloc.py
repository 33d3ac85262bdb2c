"""glibc malloc settings for training: a step's tensors reuse heap pages; the stream's large slices still go back.

glibc's defaults cost a CPU step twice over: freed blocks above a moving mmap threshold go back to the kernel, and
the heap's top is trimmed above 128 KiB, so a step's activations, masks and gradients (0.5-2 MB each at batch
2048) were faulted in again on the next step: hundreds of minor page faults per step, a large share of its time
(docs/training.md, "Memory allocator"). JAX and TensorFlow keep their own buffer pools; torch's CPU
allocator is malloc. So the mmap threshold is fixed just above the step's largest tensor (at least 4 MiB, at
most glibc's 32 MiB) and the heap is trimmed only above 512 MiB free: a step's tensors come from pages the heap
keeps, while larger blocks (a validation batch's activations, the transforming stream's 16 MB slices) are still
their own mappings and go back when freed.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
MIN_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD = 4 << 20, 32 << 20  # 32 MiB: glibc's maximum on 64-bit
TRIM_THRESHOLD = 512 << 20  # free heap above this still goes back to the OS, so a peak is not held forever
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def mmap_threshold(step_tensor_bytes: int) -> int:
    """The threshold for a step whose largest tensor has `step_tensor_bytes`: the power of two at or above twice
    that (headroom for a batch's last rows and allocator headers), within [4 MiB, 32 MiB]."""
    want = 1 << max(0, 2 * step_tensor_bytes - 1).bit_length()
    return min(max(want, MIN_MMAP_THRESHOLD), MAX_MMAP_THRESHOLD)


def policy(step_tensor_bytes: int) -> str:
    """The policy `keep_freed_memory` sets, in words."""
    return f"heap reuse (mmap above {mmap_threshold(step_tensor_bytes) >> 20} MiB, trim above {TRIM_THRESHOLD >> 20} MiB)"


def keep_freed_memory(step_tensor_bytes: int) -> str:
    """Set glibc's mmap and trim thresholds for a step whose largest tensor has `step_tensor_bytes`, unless the
    user chose an allocator's settings; returns the policy in words for the run's `speed:` line."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    user = [v for v in USER_VARIABLES if v in os.environ] + (
        ["GLIBC_TUNABLES"] if "glibc.malloc." in tunables else []
    )
    if user:
        return f"as set ({', '.join(user)})"
    preload = os.environ.get("LD_PRELOAD", "")
    if any(name in preload for name in OTHER_ALLOCATORS):
        return f"the preloaded allocator's ({preload})"
    mallopt = _mallopt()
    if mallopt is None:
        return "the platform's defaults (no mallopt)"
    threshold = mmap_threshold(step_tensor_bytes)
    if not (mallopt(M_MMAP_THRESHOLD, threshold) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "the C library's defaults (mallopt refused)"  # musl's mallopt is a stub that returns 0
    return policy(step_tensor_bytes)


def return_large_blocks() -> str:
    """The setting before the step's tensors were kept (`--no-malloc-tuning`): the mmap threshold fixed at 1 MiB,
    so every block of 1 MiB and more goes back to the OS when freed (flat RSS, a page fault per reused page)."""
    mallopt = _mallopt()
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, 1 << 20):
        return "the C library's defaults (--no-malloc-tuning)"
    return "mmap above 1 MiB (--no-malloc-tuning: freed blocks of 1 MiB and more go back to the OS)"


def step_tensor_bytes(batch_size: int, widths: tuple[int, ...]) -> int:
    """The largest float32 activation of a step: `batch_size` rows of the widest layer."""
    return batch_size * max(widths) * 4


def _mallopt() -> Any:
    return getattr(ctypes.CDLL(None), "mallopt", None)  # glibc and musl have it; macOS does not
