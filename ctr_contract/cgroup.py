"""The CPU and memory a container may use: its cgroup limits (v2 or v1), not the host's cores and RAM.

`os.cpu_count()` and /proc/meminfo describe the node. A pod limited to 2 CPUs and 4 GiB on a 64-core node
that sizes its threads and buffers from them oversubscribes its quota (CFS throttling) or gets OOM-killed.
Standard library only, so that training, export and serving can all import it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")  # a test may point this at a fake tree
_UNLIMITED_BYTES = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # no such controller here (not Linux, or not mounted)
        return None


def cpu_quota(root: Path | None = None) -> float | None:
    """CPUs the cgroup may use (quota / period, e.g. 2.5), or None when unlimited or unknown."""
    root = root or CGROUP_ROOT
    v2 = _read(root / "cpu.max")  # "max 100000" or "200000 100000"
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        if quota == "max" or not period:
            return None
        return int(quota) / int(period)
    quota_us = _read(root / "cpu" / "cpu.cfs_quota_us")
    period_us = _read(root / "cpu" / "cpu.cfs_period_us")
    if quota_us is None or period_us is None or int(quota_us) <= 0:
        return None
    return int(quota_us) / int(period_us)


def available_cpus(root: Path | None = None) -> int:
    """Whole CPUs this process may keep busy: the CPU affinity, capped by the cgroup quota (rounded up)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cpu_quota(root)
    return max(1, min(cores, math.ceil(quota) if quota else cores))


def memory_limit(root: Path | None = None) -> int | None:
    """The cgroup's memory limit in bytes, or None when unlimited or unknown."""
    root = root or CGROUP_ROOT
    text = _read(root / "memory.max")  # v2: "max" or bytes
    if text is None:
        text = _read(root / "memory" / "memory.limit_in_bytes")  # v1
    if text is None or text == "max" or int(text) >= _UNLIMITED_BYTES:
        return None
    return int(text)


def memory_used(root: Path | None = None) -> int | None:
    """Bytes the cgroup uses now, less its inactive page cache (reclaimable), or None when unknown."""
    root = root or CGROUP_ROOT
    used, stat = _read(root / "memory.current"), _read(root / "memory.stat")
    inactive_key = "inactive_file"
    if used is None:
        used, stat = _read(root / "memory" / "memory.usage_in_bytes"), _read(root / "memory" / "memory.stat")
        inactive_key = "total_inactive_file"
    if used is None:
        return None
    inactive = 0
    for line in (stat or "").splitlines():
        key, _, value = line.partition(" ")
        if key == inactive_key:
            inactive = int(value)
    return max(0, int(used) - inactive)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def available_memory(root: Path | None = None) -> int | None:
    """Bytes this process can still allocate: the host's MemAvailable, capped by the cgroup's headroom."""
    host = _meminfo_available()
    limit = memory_limit(root)
    if limit is None:
        return host
    headroom = max(0, limit - (memory_used(root) or 0))
    return headroom if host is None else min(host, headroom)
