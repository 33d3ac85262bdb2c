"""glibc malloc settings: a step's freed tensors stay in the heap (reused, not faulted in again); large blocks go back."""

from __future__ import annotations

import os
import subprocess
import sys

from training.runtime.malloc import mmap_threshold, policy, step_tensor_bytes

# Allocate, touch and free a 16 MB block twice; print the minor page faults of the second time, after the policy.
REUSE = """
import resource, numpy as np
from training.runtime.malloc import keep_freed_memory
print(keep_freed_memory(2 << 20) if {tune} else "untouched")
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def block(mib):  # written, then freed
    a = np.ones(mib << 17); del a
block(3)  # a 3 MiB block (below the 4 MiB threshold)
before = faults()
block(3)
print(faults() - before)
block(64)  # a 64 MiB block (above it)
before = faults()
block(64)
print(faults() - before)
"""
ALLOCATOR_VARS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
)


def _fresh(tune: bool, **env: str) -> tuple[str, int, int]:
    clean = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARS}
    out = subprocess.run(
        [sys.executable, "-c", REUSE.format(tune=tune)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    words, small, large = out.stdout.splitlines()
    return words, int(small), int(large)


def test_a_steps_freed_tensor_is_reused_without_page_faults_and_a_large_block_goes_back() -> None:
    words, small, large = _fresh(tune=True)
    assert words == policy(2 << 20) == "heap reuse (mmap above 4 MiB, trim above 512 MiB)"
    assert small < 50  # the same heap pages again (768 pages of 4 KB were faulted in the first time)
    # 64 MiB is its own mapping, returned when freed and faulted in again (16384 pages of 4 KB; the kernel maps
    # several per fault): what keeps a streamed epoch's RSS flat.
    assert large >= 256


def test_glibc_defaults_fault_a_reused_block_in_again() -> None:
    words, small, _ = _fresh(tune=False)
    assert words == "untouched"
    # Why the policy exists: glibc's moving mmap threshold and 128 KiB trim hand the 3 MiB back and fault it in again.
    assert small >= 48


def test_the_threshold_sits_above_the_steps_largest_tensor_within_glibcs_range() -> None:
    assert step_tensor_bytes(2048, (128, 256, 128)) == 2 << 20
    assert mmap_threshold(2 << 20) == 4 << 20
    assert mmap_threshold(8192 * 256 * 4) == 16 << 20
    assert mmap_threshold(64) == 4 << 20 and mmap_threshold(1 << 30) == 32 << 20


def test_the_users_allocator_settings_win() -> None:
    assert _fresh(tune=True, MALLOC_TRIM_THRESHOLD_="0")[0] == "as set (MALLOC_TRIM_THRESHOLD_)"
    assert (
        _fresh(tune=True, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")[0] == "as set (GLIBC_TUNABLES)"
    )
