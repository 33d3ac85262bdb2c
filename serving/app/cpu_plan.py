"""How many worker processes and ONNX Runtime threads a server runs when the flags do not say.

In a container the CPU limit (cgroup `cpu.max`, or v1's CFS quota) is the budget, not the node's cores: a
pod limited to 2 CPUs runs 2 workers of 1 thread each, so no more threads are runnable than the quota pays
for. Without a limit nothing tells the process its share, so the defaults stay 1 worker and 1 thread, the
quietest choice where the cores are shared.
"""

from __future__ import annotations

from ctr_contract import cgroup


def cpu_plan(num_workers: int | None, intra_op_threads: int | None) -> tuple[int, int]:
    """(workers, threads per worker): the given values, the rest filled from the cgroup CPU limit."""
    # `is None`, not `or`: a given 0 must reach ServerConfig's check ("--num_workers must be >= 1").
    if cgroup.cpu_quota() is None:
        return _given(num_workers, 1), _given(intra_op_threads, 1)
    cpus = cgroup.available_cpus()
    workers = _given(num_workers, cpus)
    return workers, _given(intra_op_threads, max(1, cpus // max(1, workers)))


def _given(value: int | None, default: int) -> int:
    return default if value is None else value
