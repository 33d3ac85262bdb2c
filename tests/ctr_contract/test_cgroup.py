"""The container's CPU and memory limits, read from cgroup v2 and v1 trees written in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ctr_contract import cgroup
from serving.app.cpu_plan import cpu_plan

GIB = 1 << 30
CORES = len(os.sched_getaffinity(0))


def v2_tree(root: Path, cpu_max: str, memory_max: str, current: int = 0, inactive_file: int = 0) -> Path:
    """A cgroup v2 folder as a container sees /sys/fs/cgroup."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.max").write_text(f"{cpu_max}\n")
    (root / "memory.max").write_text(f"{memory_max}\n")
    (root / "memory.current").write_text(f"{current}\n")
    (root / "memory.stat").write_text(f"anon 1\ninactive_file {inactive_file}\nactive_file 7\n")
    return root


def v1_tree(root: Path, quota_us: int, limit: int, usage: int = 0) -> Path:
    """A cgroup v1 hierarchy: one folder per controller."""
    (root / "cpu").mkdir(parents=True)
    (root / "memory").mkdir()
    (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
    (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{limit}\n")
    (root / "memory" / "memory.usage_in_bytes").write_text(f"{usage}\n")
    (root / "memory" / "memory.stat").write_text("total_inactive_file 0\n")
    return root


def test_v2_limits_are_read_and_page_cache_is_not_counted_as_used(tmp_path: Path):
    root = v2_tree(tmp_path, "250000 100000", str(4 * GIB), current=3 * GIB, inactive_file=2 * GIB)
    assert cgroup.cpu_quota(root) == 2.5
    assert cgroup.available_cpus(root) == min(CORES, 3)
    assert cgroup.memory_limit(root) == 4 * GIB
    assert cgroup.memory_used(root) == GIB
    available = cgroup.available_memory(root)
    assert available is not None and available <= 3 * GIB


def test_v2_without_limits_reads_as_unlimited(tmp_path: Path):
    root = v2_tree(tmp_path, "max 100000", "max")
    assert (cgroup.cpu_quota(root), cgroup.memory_limit(root), cgroup.available_cpus(root)) == (
        None,
        None,
        CORES,
    )


def test_v1_cfs_quota_and_memory_limit_are_read(tmp_path: Path):
    root = v1_tree(tmp_path, quota_us=200000, limit=2 * GIB, usage=GIB // 2)
    assert (cgroup.cpu_quota(root), cgroup.memory_limit(root)) == (2.0, 2 * GIB)
    assert cgroup.memory_used(root) == GIB // 2


def test_v1_unlimited_is_minus_one_quota_and_a_huge_limit(tmp_path: Path):
    root = v1_tree(tmp_path, quota_us=-1, limit=9223372036854771712)
    assert (cgroup.cpu_quota(root), cgroup.memory_limit(root)) == (None, None)


def test_no_cgroup_files_means_no_limits(tmp_path: Path):
    assert (cgroup.cpu_quota(tmp_path), cgroup.memory_limit(tmp_path), cgroup.memory_used(tmp_path)) == (
        None,
        None,
        None,
    )


@pytest.mark.skipif(CORES < 2, reason="needs 2 cores in this process's affinity to see a 2-CPU limit")
def test_serving_workers_and_threads_follow_the_cpu_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", v2_tree(tmp_path, "200000 100000", "max"))
    assert cpu_plan(None, None) == (2, 1)  # one worker per CPU of the limit
    assert cpu_plan(1, None) == (1, 2)  # one worker: its ORT threads take the limit
    assert cpu_plan(3, 4) == (3, 4)  # given flags win


def test_serving_without_a_cpu_limit_runs_one_worker_of_one_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", v2_tree(tmp_path, "max 100000", "max"))
    assert cpu_plan(None, None) == (1, 1)
    assert cpu_plan(2, None) == (2, 1)
