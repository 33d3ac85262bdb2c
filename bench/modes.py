"""The bench's run sizes: `full` (the real comparison), `quick` (< 5 min) and `tiny` (the test suite)."""

from __future__ import annotations

from dataclasses import dataclass, field

SECTIONS = ("training", "inference", "serving")
# Sections with a one-time setup step (`python -m bench.section_runner NAME --prepare`).
SECTIONS_WITH_SETUP = ("serving",)
SECTION_TITLES = {
    "training": "Training throughput",
    "inference": "Inference latency (in-process)",
    "serving": "End-to-end serving",
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
        prepare_timeout_s: the bound on a section's one-time setup (installing KServe into `.venv-kserve`),
            kept apart so that a first run's install does not eat into the measurement's bound.
        run_setup: whether to run that setup at all; `tiny` runs inside the test suite's time budget, so it
            measures KServe only when `.venv-kserve` already exists (a quick or full run creates it).
    """

    name: str
    rows: int
    train_args: tuple[str, ...]
    step_timeout_s: float
    section_timeout_s: dict[str, float] = field(default_factory=dict)
    prepare_timeout_s: float = 900
    run_setup: bool = True


MODES: dict[str, BenchMode] = {
    "full": BenchMode(
        name="full",
        rows=200_000,
        train_args=("--no-progress-bar",),
        step_timeout_s=1800,
        section_timeout_s={"training": 3600, "inference": 1800, "serving": 2400},
    ),
    "quick": BenchMode(
        name="quick",
        rows=20_000,
        train_args=("--max-epochs", "1", "--no-progress-bar"),
        step_timeout_s=240,
        section_timeout_s={"training": 240, "inference": 120, "serving": 240},
    ),
    "tiny": BenchMode(
        name="tiny",
        rows=3_000,
        train_args=("--max-epochs", "1", "--no-progress-bar"),
        step_timeout_s=180,
        section_timeout_s={"training": 120, "inference": 90, "serving": 150},
        run_setup=False,
    ),
}


def get_mode(name: str) -> BenchMode:
    """The mode called `name`, or a ValueError naming the valid ones."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown bench mode {name!r}; expected one of {sorted(MODES)}") from None
