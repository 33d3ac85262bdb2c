"""CPU threads of a training run: OpenMP threads spin briefly between ops, and one thread is used when two lose.

A training step is ~40 parallel ops (matmuls, then elementwise work on (2048, 256) activations). Between two ops
torch's OpenMP worker threads wait for the next one:
- sleeping at once (`OMP_WAIT_POLICY=PASSIVE`) costs a futex wake-up per op, enough that a step with all
  threads takes about as long as one thread alone;
- spinning up to `SPIN_COUNT` pause loops first keeps the wake-ups off the step, when the cores are idle;
- but when another process takes a core, a spinning worker holds its core while its peer waits for one, and
  the step gets several times slower than with passive waits.
So a run spins (`training.runtime.speed.set_omp_wait_policy`), and `ThreadGovernor` times a few steps with one
thread and with all of them every `PERIOD` steps and keeps the faster count: all threads while the cores are
idle, one beside a busy process. Measurements: docs/training.md, "Threads".
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning as L

PERIOD = 200  # steps between two probes
PROBE_STEPS = 4  # steps timed per thread count in a probe (the first after a switch is not timed)
FIRST_PROBE = 5  # the first probe starts after these warm-up steps
# One thread is kept only when clearly faster (beside a busy process it is several times faster, on idle cores
# slower), so a noisy probe does not cost `PERIOD` steps at the slower count.
SWITCH_RATIO = 0.8


class ThreadGovernor(L.Callback):
    """Every `period` steps, time `probe_steps` steps at 1 thread and at `threads`, and keep the faster count.

    `choices` records each probe's (step, ms per step at 1 thread, at `threads`, the count kept) for metrics.json.
    """

    def __init__(
        self,
        threads: int,
        period: int = PERIOD,
        probe_steps: int = PROBE_STEPS,
        first_probe: int = FIRST_PROBE,
    ) -> None:
        if threads < 2:
            raise ValueError(f"ThreadGovernor needs at least 2 threads to choose from, got {threads}")
        self.threads, self.period, self.probe_steps = threads, period, probe_steps
        self.plan = [1] * (probe_steps + 1) + [threads] * (probe_steps + 1)  # thread count per probe step
        self.next_probe = first_probe
        self.steps = 0
        self.choices: list[tuple[int, float, float, int]] = []
        self.current = threads
        self._times: dict[int, list[float]] = {}
        self._t0 = 0.0
        self._pos: int | None = None  # position in `plan` while probing

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._pos is None and self.steps >= self.next_probe:
            self._pos, self._times = 0, {1: [], self.threads: []}
        if self._pos is not None:
            self._set(self.plan[self._pos])
        self._t0 = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        dt = time.perf_counter() - self._t0
        self.steps += 1
        if self._pos is None:
            return
        count = self.plan[self._pos]
        if self._pos > 0 and self.plan[self._pos - 1] == count:  # the first step after a switch is not timed
            self._times[count].append(dt)
        self._pos += 1
        if self._pos == len(self.plan):
            self._decide()

    def _decide(self) -> None:
        one, full = (statistics.median(self._times[c]) for c in (1, self.threads))
        keep = 1 if one < full * SWITCH_RATIO else self.threads
        self.choices.append((self.steps, round(one * 1e3, 3), round(full * 1e3, 3), keep))
        self._set(keep)
        self._pos, self.next_probe = None, self.steps + self.period

    def _set(self, count: int) -> None:
        if count != self.current:
            import torch

            torch.set_num_threads(count)
            self.current = count

    def summary(self) -> dict[str, Any]:
        """The probes for metrics.json: [step, ms at 1 thread, ms at `threads`, kept] each, and the share at 1."""
        return {"threads": self.threads, "period": self.period, "probes": [list(c) for c in self.choices]}
