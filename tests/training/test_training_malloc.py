"""glibc malloc settings: freed blocks below 32 MB stay in the heap, so a step's tensors reuse pages, not fault them."""

from __future__ import annotations

import os
import subprocess
import sys

from training.model.malloc import POLICY

# Allocate, touch and free a 16 MB block twice; print the minor page faults of the second time, after the policy.
REUSE = """
import resource, numpy as np
from training.model.malloc import keep_freed_memory
print(keep_freed_memory() if {tune} else "untouched")
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.ones(2 << 20); del a  # 16 MB of float64, written
before = faults()
a = np.ones(2 << 20); del a
print(faults() - before)
"""
ALLOCATOR_VARS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
)


def _fresh(tune: bool, **env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARS}
    out = subprocess.run([sys.executable, "-c", REUSE.format(tune=tune)], env={**clean, **env}, capture_output=True,
                         text=True, check=True)  # fmt: skip
    policy, faults = out.stdout.splitlines()
    return policy, int(faults)


def test_a_freed_16mb_block_is_reused_without_page_faults() -> None:
    policy, faults = _fresh(tune=True)
    assert policy == POLICY
    assert faults < 100  # the same pages again (16 MB of 4 KB pages were faulted in the first time)


def test_glibc_defaults_hand_the_block_back_and_fault_it_in_again() -> None:
    policy, faults = _fresh(tune=False)
    assert policy == "untouched"
    # Why the policy exists: the second 16 MB is faulted in again (4096 pages of 4 KB; the kernel maps up to 16 per
    # fault, so at least 256 faults).
    assert faults >= 256


def test_the_users_allocator_settings_win() -> None:
    assert _fresh(tune=True, MALLOC_TRIM_THRESHOLD_="0")[0] == "as set (MALLOC_TRIM_THRESHOLD_)"
    assert (
        _fresh(tune=True, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")[0] == "as set (GLIBC_TUNABLES)"
    )
