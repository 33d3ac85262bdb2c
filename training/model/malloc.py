"""glibc malloc settings for training: freed tensors stay in the heap for the next step instead of going back to the OS.

With glibc's defaults a CPU step's activations, masks and gradients (0.5-2 MB each) were handed back to the kernel
when freed (mmap'd chunks, heap trimming) and faulted in again on the next step: 300-600 minor page faults per step
took a 5-6 ms step to 8-9 ms on a 2-core VM (docs/training.md, "Memory allocator"). Fixing the mmap threshold at
32 MB and trimming only above 512 MB of free heap gave 0 faults per step. JAX and TensorFlow keep their own
buffer pools, so the peers never paid this.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit; smaller blocks come from the reusable heap
TRIM_THRESHOLD = 512 << 20  # free heap above this still goes back to the OS, so a peak is not held forever
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
POLICY = f"heap reuse (mmap above {MMAP_THRESHOLD >> 20} MB, trim above {TRIM_THRESHOLD >> 20} MB)"


def keep_freed_memory() -> str:
    """Set glibc's mmap and trim thresholds (`POLICY`) unless the user chose an allocator's settings; returns the
    policy in words for the run's `speed:` line."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    user = [v for v in USER_VARIABLES if v in os.environ] + (
        ["GLIBC_TUNABLES"] if "glibc.malloc." in tunables else []
    )
    if user:
        return f"as set ({', '.join(user)})"
    preload = os.environ.get("LD_PRELOAD", "")
    if any(name in preload for name in OTHER_ALLOCATORS):
        return f"the preloaded allocator's ({preload})"
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # glibc and musl have it; macOS does not
    if mallopt is None:
        return "the platform's defaults (no mallopt)"
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "the C library's defaults (mallopt refused)"  # musl's mallopt is a stub that returns 0
    return POLICY
