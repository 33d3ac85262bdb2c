"""Which speed-ups a run uses, and why: chosen once from the accelerator and the flags, printed as `speed:`.

Measured on a 2-core AVX-512 CPU (docs/training.md, "Step time"): torch's CPU dropout draws its mask with a
per-element Mersenne Twister (5–7 ms of a ~15 ms step); bf16 autocast runs the matmuls on AVX512_BF16 at the same
val AUC; the for-loop Adam walks six tensors one op at a time; and when other processes share the cores,
OpenMP threads that spin while they wait for each other at every op make a step 3–10x slower
(`prefer_passive_omp_wait` makes them sleep instead).
On CUDA torch's own dropout (fused Philox), fused Adam and AMP are the fast path; nothing CPU-only applies.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ADAM_IMPLS = ("auto", "default", "foreach", "fused")
CALIBRATION_STEPS = 6  # steps per thread count per round; two rounds, interleaved


def on_cpu(accelerator: str) -> bool:
    """True when the run's tensors live on the CPU ("cpu", or "auto" without a GPU)."""
    if accelerator == "cpu":
        return True
    if accelerator != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


def cpu_has_bf16() -> bool:
    """True when the CPU multiplies bf16 natively (AVX512_BF16 or AMX): where bf16 autocast pays."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512_bf16" in flags or " amx_bf16" in flags


@dataclass(frozen=True)
class SpeedSettings:
    """The resolved settings (never "auto") and one reason per setting."""

    fast_dropout: bool
    adam_impl: str
    precision: str
    threads: int | None  # None: leave torch's choice
    reasons: tuple[str, ...]

    @classmethod
    def choose(cls, accelerator: str, fast_dropout: bool = True, adam_impl: str = "auto",
               precision: str = "auto", threads: int | None = None) -> SpeedSettings:  # fmt: skip
        """Resolve the flags for `accelerator`: fast settings unless turned off, torch's own off the CPU.

        `threads`: what the run set (None: torch's default, one per core).
        """
        if adam_impl not in ADAM_IMPLS:
            raise ValueError(f"adam_impl must be one of {ADAM_IMPLS}, got {adam_impl!r}")
        cpu = on_cpu(accelerator)
        reasons = []
        if not fast_dropout:
            reasons.append("dropout torch (--no-fast-dropout)")
        elif cpu:
            reasons.append("dropout fast (CPU: numpy-drawn mask, ~7x cheaper than torch's bernoulli_)")
        else:
            reasons.append("dropout torch (GPU: torch's fused dropout is already fast)")
        if adam_impl == "auto":
            adam_impl = "foreach" if cpu else "fused"
            why = "CPU: one multi-tensor op per update step" if cpu else "GPU: one fused kernel"
            reasons.append(f"adam {adam_impl} ({why}; --adam-impl default turns it off)")
        else:
            reasons.append(f"adam {adam_impl} (--adam-impl {adam_impl})")
        if precision == "auto":
            precision, why = _auto_precision(cpu)
            reasons.append(f"precision {precision} ({why}; --precision 32-true turns it off)")
        else:
            reasons.append(f"precision {precision} (--precision {precision})")
        if cpu:
            import torch

            policy = os.environ.get("OMP_WAIT_POLICY", "unset")
            why = (
                "waiting threads sleep: shared cores stay usable" if policy.upper() == "PASSIVE" else "as set"
            )
            count = (
                f"{threads} (--threads, or the CPU limit // devices)"
                if threads is not None
                else f"{torch.get_num_threads()} (one per core)"
            )
            reasons.append(f"threads {count}, OMP_WAIT_POLICY={policy} ({why})")
        return cls(fast_dropout and cpu, adam_impl, precision, threads, tuple(reasons))

    def line(self) -> str:
        """The one line a run prints, e.g. `speed: dropout fast (...); adam foreach (...); ...`."""
        return "speed: " + "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _auto_precision(cpu: bool) -> tuple[str, str]:
    if cpu:
        if cpu_has_bf16():
            return "bf16-mixed", "CPU has AVX512_BF16/AMX: bf16 matmuls, fp32 weights, same val AUC"
        return "32-true", "CPU without native bf16: autocast would only add casts"
    import torch

    if torch.cuda.is_bf16_supported():
        return "bf16-mixed", "GPU AMP in bf16"
    return "16-mixed", "GPU AMP in fp16 with a gradient scaler"


def prefer_passive_omp_wait() -> None:
    """Make OpenMP threads sleep, not spin, while they wait (unless OMP_WAIT_POLICY is set); call before torch loads.

    With spinning waits, a thread that finished its half of an op holds its core while its peer waits for one
    (other processes run there): on this 2-core box a 2-thread step went from ~12 ms to 90–140 ms; sleeping
    waits kept it at ~13 ms. libgomp reads the variable once, when torch is imported.
    """
    if "torch" in sys.modules:
        raise RuntimeError(
            "prefer_passive_omp_wait() must run before torch is imported; it would do nothing now"
        )
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
