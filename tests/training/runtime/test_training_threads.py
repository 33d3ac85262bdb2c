"""CPU threads: the OpenMP wait policy a run sets before torch loads, and the governor's choice of thread count."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from training.runtime import threads
from training.runtime.fast_dropout import fast_dropout, mask_array
from training.runtime.speed import SPIN_COUNT, SpeedSettings, set_omp_wait_policy
from training.runtime.threads import ThreadGovernor

POLICY = (
    "from training.runtime.speed import set_omp_wait_policy; import os; "
    "print(set_omp_wait_policy()); print(os.environ.get('GOMP_SPINCOUNT'))"
)


def _policy_in_fresh_process(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", POLICY], env={**clean, **env}, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_a_run_spins_a_bounded_count_before_sleeping_unless_the_user_chose() -> None:
    assert _policy_in_fresh_process() == [
        f"GOMP_SPINCOUNT={SPIN_COUNT} (waiting threads spin ~0.7 ms, then sleep)",
        str(SPIN_COUNT),
    ]
    assert _policy_in_fresh_process(OMP_WAIT_POLICY="PASSIVE") == ["OMP_WAIT_POLICY=PASSIVE (as set)", "None"]


def test_the_wait_policy_refuses_to_be_set_after_torch_loaded() -> None:
    with pytest.raises(RuntimeError, match="must run before torch is imported"):
        set_omp_wait_policy()


def _drive(governor: ThreadGovernor, step_ms: dict[int, float], steps: int, monkeypatch: Any) -> None:
    """Run `steps` training steps through the hooks, each taking step_ms[current thread count]."""
    clock = [0.0]
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock[0])
    for i in range(steps):
        governor.on_train_batch_start(None, None, None, i)  # type: ignore[arg-type]
        clock[0] += step_ms[governor.current] / 1e3
        governor.on_train_batch_end(None, None, None, None, i)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _restore_threads() -> Any:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_governor_keeps_all_threads_when_they_are_faster(monkeypatch: Any) -> None:
    governor = ThreadGovernor(2, period=20, probe_steps=3, first_probe=2)
    _drive(governor, {1: 8.0, 2: 5.5}, 40, monkeypatch)
    assert governor.current == 2
    assert governor.choices == [(10, 8.0, 5.5, 2), (38, 8.0, 5.5, 2)]


def test_governor_drops_to_one_thread_when_a_busy_neighbour_makes_two_slower(monkeypatch: Any) -> None:
    governor = ThreadGovernor(2, period=20, probe_steps=3, first_probe=2)
    _drive(governor, {1: 8.0, 2: 48.0}, 12, monkeypatch)
    assert governor.current == 1 and torch.get_num_threads() == 1
    assert governor.summary() == {"threads": 2, "period": 20, "probes": [[10, 8.0, 48.0, 1]]}


def test_governor_keeps_all_threads_when_one_is_only_slightly_faster(monkeypatch: Any) -> None:
    governor = ThreadGovernor(2, period=20, probe_steps=3, first_probe=2)
    _drive(governor, {1: 5.0, 2: 5.5}, 12, monkeypatch)  # within noise: 1 thread must be < 0.8x
    assert governor.current == 2


def test_only_an_unpinned_multi_thread_cpu_run_is_governed() -> None:
    assert SpeedSettings.choose("cpu", threads=2, governed=True).callbacks()[0].threads == 2
    assert SpeedSettings.choose("cpu", threads=1, governed=True).callbacks() == []
    assert SpeedSettings.choose("cpu", threads=2, governed=False).callbacks() == []
    assert SpeedSettings.choose("gpu", threads=2, governed=True).callbacks() == []


def test_bf16_mask_holds_the_bf16_rounded_scale_as_torch_dropout_does_on_bf16() -> None:
    got = torch.from_numpy(mask_array(3, 0, (64, 64), 0.3, torch.bfloat16)).view(torch.bfloat16)
    assert set(torch.unique(got).tolist()) == {0.0, torch.tensor(1 / 0.7).bfloat16().item()}
    torch.manual_seed(0)
    ref = torch.nn.functional.dropout(torch.ones(64, 64, dtype=torch.bfloat16), 0.3, True)
    assert set(torch.unique(ref).tolist()) == set(torch.unique(got).tolist())


def test_float64_activation_gets_a_float64_mask_scaled_exactly() -> None:
    x = torch.randn(256, 32, dtype=torch.float64)
    out = fast_dropout(0.2).train()(x)
    kept = out != 0
    assert out.dtype == torch.float64
    assert torch.equal(out[kept], x[kept] * np.float64(1 / 0.8))
