"""Where one training step's time goes: input pipeline, forward, dropout, backward, optimizer, Lightning.

A stopwatch per phase around the same step the pipeline runs (net, BCE-with-logits, Adam, batch 2048), for the
"torch defaults" (nn.Dropout, for-loop Adam, fp32, spinning OpenMP waits: the pipeline before issue 17) or our
fast defaults (`training.runtime.speed`); each in its own process, since the OpenMP wait policy is fixed at import.
- input: one `ShuffledBatches` batch (index_select of x and y).
- forward / backward / optimizer: `net(x)` + loss, `loss.backward()`, `zero_grad` + `opt.step()`.
- dropout: the two dropout layers' forward (timed by hooks; their backward is one multiply each, inside backward).
- lightning: one `Trainer.fit` step minus the bare step with the same settings.
Also the step's FLOP rate: 3 x the forward matmul FLOPs (forward + two backward matmuls) per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.sections.flops import matmul_gflops, step_flops


def _settings(fast: bool) -> Any:
    """Our fast defaults, or torch's (the pipeline before issue 17)."""
    from training.runtime.speed import SpeedSettings

    if fast:
        return SpeedSettings.choose("cpu")
    return SpeedSettings.choose("cpu", False, "default", "32-true")


def _phases(d: dict[str, np.ndarray], fast: bool, steps: int, batch: int) -> dict[str, float]:
    """Median ms per step of each phase of the bare step (no Lightning)."""
    import torch
    import torch.nn.functional as F

    from ctr_model.net import ModelConfig
    from training.loader.memory import ShuffledBatches
    from training.model.lightning_module import CTRModule

    speed = _settings(fast)
    module = CTRModule(
        ModelConfig().to_dict(), 2e-3, adam_impl=speed.adam_impl, fast_dropout=speed.fast_dropout
    )
    net, opt = module.net.train(), module.configure_optimizers()
    bf16 = speed.precision.startswith("bf16")
    dropouts = [m for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    drop_s = [0.0]
    for m in dropouts:
        m.register_forward_pre_hook(lambda *_: drop_s.__setitem__(0, drop_s[0] - time.perf_counter()))
        m.register_forward_hook(lambda *_: drop_s.__setitem__(0, drop_s[0] + time.perf_counter()))
    batches = ShuffledBatches(torch.from_numpy(d["train_x"]), torch.from_numpy(d["train_y"]), batch, seed=1)
    out: dict[str, list[float]] = {k: [] for k in ("input", "forward", "dropout", "backward", "optimizer")}
    it = iter(batches)
    for i in range(steps + 3):
        t0 = time.perf_counter()
        try:
            x, y, _ = next(it)
        except StopIteration:
            it = iter(batches)
            x, y, _ = next(it)
        t1 = time.perf_counter()
        drop_s[0] = 0.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = net(x)
        loss = F.binary_cross_entropy_with_logits(logits.float(), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if i >= 3:  # warm-up steps excluded
            for k, v in zip(out, (t1 - t0, t2 - t1 - drop_s[0], drop_s[0], t3 - t2, t4 - t3), strict=True):
                out[k].append(v * 1e3)
    return {k: statistics.median(v) for k, v in out.items()}


def _lightning_ms_per_step(d: dict[str, np.ndarray], fast: bool, batch: int) -> float:
    """ms per step of one Trainer.fit epoch over the data, as the bench's "ours" row runs it."""
    from bench.sections.training_loops import lightning_fit

    rate, _ = lightning_fit(d, 2, batch, _settings(fast))
    return batch / rate * 1e3


def profile(d: dict[str, np.ndarray], fast: bool, steps: int = 40, batch: int = 2048) -> dict[str, Any]:
    """ms per step of each phase, with `fast` defaults or torch's, plus the step's FLOP rate."""
    ph = _phases(d, fast, steps, batch)
    bare = sum(ph.values())
    ours = _lightning_ms_per_step(d, fast, batch)
    ph["lightning"] = max(0.0, ours - bare)
    ph["step_total"] = ours
    ph["gflops"] = step_flops(batch) / (ours / 1e3) / 1e9
    out: dict[str, Any] = {k: round(v, 3) for k, v in ph.items()}
    out["settings"] = _settings(fast).line()
    for dtype in ("float32", "bfloat16"):
        out[f"matmul_gflops_{dtype}"] = round(matmul_gflops(dtype=dtype), 1)
    return out


PHASES = ("input", "forward", "dropout", "backward", "optimizer", "lightning", "step_total")


def profile_lines(profile: dict[str, Any]) -> list[str]:
    """The report's breakdown: ms per step of each phase, torch defaults beside our fast defaults."""
    before, after = profile.get("torch") or {}, profile.get("fast") or {}
    if not before or not after:
        return []
    rows = [[k, f"{before[k]:.2f}", f"{after[k]:.2f}"] for k in PHASES]
    rows.append(["GFLOP/s of the step", f"{before['gflops']:.1f}", f"{after['gflops']:.1f}"])
    peak = f"{after['matmul_gflops_float32']:.0f} GFLOP/s float32, {after['matmul_gflops_bfloat16']:.0f} bfloat16"
    return [
        "Step profile (ms per step at batch 2048, median of the steps; `python -m bench.sections.training_profile`):",
        "",
        "| phase | torch defaults | our fast defaults |",
        "|---|---|---|",
        *[f"| {' | '.join(r)} |" for r in rows],
        "",
        f"A 2048³ matmul measured {peak} in the same process. "
        f"The step does {profile['step_mflop']:.0f} MFLOP of matmuls (forward + 2 backward).",
        "",
        f"Fast defaults: `{after['settings']}`",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.sections.training_profile", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--features", type=Path, required=True, help="features.npz of bench.sections.training_throughput"
    )
    p.add_argument(
        "--settings", choices=("torch", "fast"), required=True, help="torch defaults or our fast ones"
    )
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.settings == "fast":
        from bench.sections.training_loops import BATCH_SIZE, MODEL_WIDTHS
        from training.runtime.malloc import keep_freed_memory, step_tensor_bytes
        from training.runtime.speed import set_omp_wait_policy

        set_omp_wait_policy()  # as `python -m training` does, before torch loads
        keep_freed_memory(step_tensor_bytes(BATCH_SIZE, MODEL_WIDTHS))  # as `python -m training` does
    result = profile(dict(np.load(args.features)), args.settings == "fast", args.steps)
    args.out.write_text(json.dumps(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
