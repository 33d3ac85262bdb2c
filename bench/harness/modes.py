"""The bench's run sizes: `full` (the real comparison), `quick` (~10 min) and `tiny` (the test suite)."""

from __future__ import annotations

from dataclasses import dataclass, field

SECTIONS = ("training", "inference", "serving", "scaling")
# Sections that need no exported model (they generate and train on their own data).
STANDALONE_SECTIONS = ("training", "scaling")
# Sections with a one-time setup step (`python -m bench.section_runner NAME --prepare`).
SECTIONS_WITH_SETUP = ("training", "inference", "serving")
SECTION_TITLES = {
    "training": "Training throughput",
    "inference": "Inference latency (in-process)",
    "serving": "End-to-end serving",
    "scaling": "Training at data scale (memory and throughput vs rows)",
}


@dataclass(frozen=True)
class BenchMode:
    """How big the pipeline inputs are and how long each step may take.

    Args:
        name: passed to each measurement module as its `mode`.
        rows: synthetic rows generated for the model the inference and serving sections use.
        train_args: extra `python -m training` options (kept small: those sections need a model, not a good one).
        step_timeout_s: the bound on each pipeline step (synth, train, export).
        section_timeout_s: the bound on each measured section, killed (whole process group) when exceeded.
        prepare_timeout_s: the bound on a section's one-time setup (KServe, JAX, MLX, TorchServe venvs),
            kept apart so that a first run's install does not eat into the measurement's bound.
        run_setup: whether to run that setup at all; `tiny` runs inside the test suite's time budget, so it
            measures KServe, JAX, MLX and TorchServe only when their venvs already exist (quick or full creates them).
    """

    name: str
    rows: int
    train_args: tuple[str, ...]
    step_timeout_s: float
    section_timeout_s: dict[str, float] = field(default_factory=dict)
    prepare_timeout_s: float = 2400  # first run: JAX, MLX, TorchServe and KServe venvs, 900 s bound each
    run_setup: bool = False  # only the quick and full modes install (a test's mode must never pip install)


MODES: dict[str, BenchMode] = {
    "full": BenchMode(
        name="full",
        rows=200_000,
        train_args=("--no-progress-bar",),
        step_timeout_s=1800,
        section_timeout_s={"training": 7200, "inference": 1800, "serving": 2400, "scaling": 7200},
        run_setup=True,
    ),
    "quick": BenchMode(
        name="quick",
        rows=20_000,
        train_args=("--max-epochs", "1", "--no-progress-bar"),
        step_timeout_s=240,
        # Under 15 minutes in all (tests/bench/harness/test_bench_quick_budget.py); each bound is about 1.3x
        # (serving: fixed-length wrk points) to 2x (the CPU-bound sections) what the section took on 2 busy cores.
        section_timeout_s={"training": 240, "inference": 60, "serving": 330, "scaling": 240},
        run_setup=True,
    ),
    "tiny": BenchMode(
        name="tiny",
        rows=3_000,
        # Half held out: export fits the calibrator on at least 1,000 validation rows.
        train_args=("--max-epochs", "1", "--val-fraction", "0.5", "--no-progress-bar"),
        step_timeout_s=180,
        section_timeout_s={"training": 420, "inference": 180, "serving": 540, "scaling": 400},
        run_setup=False,
    ),
}


def get_mode(name: str) -> BenchMode:
    """The mode called `name`, or a ValueError naming the valid ones."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown bench mode {name!r}; expected one of {sorted(MODES)}") from None
