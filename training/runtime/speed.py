"""Which speed-ups a run uses, and why: chosen once from the accelerator and the flags, printed as `speed:`.

On CPU (measurements: docs/training.md, "Step time"): torch's dropout draws its mask with a per-element
Mersenne Twister, a large share of a step, so training installs numpy-drawn masks
(`training.runtime.fast_dropout`); bf16 autocast runs the matmuls on AVX512_BF16/AMX at the same val AUC; fused
Adam updates each parameter in one pass; OpenMP threads spin briefly between ops, with one thread when another
process takes a core (`training.runtime.threads`).
On CUDA torch's own dropout (fused Philox), fused Adam and AMP are the fast path; nothing CPU-only applies.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ADAM_IMPLS = ("auto", "default", "foreach", "fused")
SPIN_COUNT = 30_000  # a tenth of libgomp's default (300,000), which spins long against a busy core


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
    governed: bool  # ThreadGovernor picks 1 or `threads` as the run goes
    reasons: tuple[str, ...]

    @classmethod
    def choose(
        cls,
        accelerator: str,
        fast_dropout: bool = True,
        adam_impl: str = "auto",
        precision: str = "auto",
        threads: int | None = None,
        governed: bool = False,
        malloc: str | None = None,
    ) -> SpeedSettings:
        """Resolve the flags for `accelerator`: fast settings unless turned off, torch's own off the CPU.

        `threads`: what the run set (None: torch's default, one per core). `governed`: the count was not given
        (`--threads`), so `ThreadGovernor` may drop to one thread when that is faster. `malloc`: the allocator
        policy the run set, in words (`training.runtime.malloc.keep_freed_memory`), for the printed line.
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
            adam_impl = "fused"
            why = "one pass over each parameter" if cpu else "GPU: one fused kernel"
            reasons.append(f"adam {adam_impl} ({why}; --adam-impl default turns it off)")
        else:
            reasons.append(f"adam {adam_impl} (--adam-impl {adam_impl})")
        if precision == "auto":
            precision, why = _auto_precision(cpu)
            reasons.append(f"precision {precision} ({why}; --precision 32-true turns it off)")
        else:
            reasons.append(f"precision {precision} (--precision {precision})")
        governed = governed and cpu and (threads or 0) > 1
        if cpu:
            import torch

            count = (
                f"{threads} (the CPU limit // devices; ThreadGovernor drops to 1 while that is faster, --threads N fixes it)"
                if governed
                else f"{threads} (--threads)"
                if threads is not None
                else f"{torch.get_num_threads()} (one per core)"
            )
            reasons.append(f"threads {count}, OpenMP waits {omp_wait_policy()}")
        if malloc is not None:
            reasons.append(f"malloc {malloc}")
        return cls(fast_dropout and cpu, adam_impl, precision, threads, governed, tuple(reasons))

    def callbacks(self) -> list[Any]:
        """The Lightning callbacks these settings need: the `ThreadGovernor` of a governed CPU run, else none."""
        if not self.governed or self.threads is None:
            return []
        from training.runtime.threads import ThreadGovernor

        return [ThreadGovernor(self.threads)]

    def line(self) -> str:
        """The one line a run prints, e.g. `speed: dropout fast (...); adam fused (...); ...`."""
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


def set_omp_wait_policy() -> str:
    """Make OpenMP threads spin up to `SPIN_COUNT` loops before sleeping, unless the user chose; call before torch loads.

    Returns the policy in words for the run's `speed:` line. libgomp reads the variables once, when torch loads.
    """
    if "torch" in sys.modules:
        raise RuntimeError("set_omp_wait_policy() must run before torch is imported; it would do nothing now")
    return omp_wait_policy(set_default=True)


def omp_wait_policy(set_default: bool = False) -> str:
    """The OpenMP wait policy this process runs with, in words (setting ours first when `set_default`)."""
    user = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    if not user and set_default:
        os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        return f"GOMP_SPINCOUNT={SPIN_COUNT} (waiting threads spin ~0.7 ms, then sleep)"
    if not user:
        return "libgomp's default (spin 300,000 loops, then sleep)"
    if os.environ.get("GOMP_SPINCOUNT") == str(SPIN_COUNT) and "OMP_WAIT_POLICY" not in user:
        return f"GOMP_SPINCOUNT={SPIN_COUNT} (waiting threads spin ~0.7 ms, then sleep)"
    return " ".join(f"{k}={v}" for k, v in user.items()) + " (as set)"
