"""The bench's inputs, made through the user surfaces: `python -m training.synth`, `training`, `export`.

The bench measures exactly what a user runs, so it never imports those stages to build its model.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness.modes import BenchMode
from bench.harness.procs import run_bounded
from ctr_contract import run_dir as contract_run_dir
from ctr_contract.repository import version_dirs

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SEED = 7


@dataclass
class PipelineOutputs:
    """Where the pipeline put its artifacts, and what it ran."""

    data: Path
    run_dir: Path
    checkpoint: Path
    model_base_path: Path
    version_dir: Path
    commands: list[str] = field(default_factory=list)
    step_seconds: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("data", "run_dir", "checkpoint", "model_base_path", "version_dir"):
            d[k] = str(d[k])
        return d


def child_env() -> dict[str, str]:
    """The environment of every bench child: unbuffered output, project importable from any cwd."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def latest_version(model_base_path: Path) -> Path:
    """The highest numeric version folder under the model base path (also used by `bench.sections.serving_load`)."""
    versions = version_dirs(model_base_path)
    if not versions:
        raise FileNotFoundError(f"no version folders under {model_base_path}; run `python -m export` first")
    return versions[max(versions)]


def build_inputs(mode: BenchMode, workdir: Path, logs: Path) -> PipelineOutputs:
    """Generate data, train and export into `workdir`; each step bounded by `mode.step_timeout_s`.

    Args:
        mode: the run size (rows, training options, time bounds).
        workdir: holds `data/train.txt`, `run/` and `models/ctr/`.
        logs: each step's output goes to `logs/<step>.log`.

    Returns:
        The artifact paths, the exact commands and each step's seconds.

    Raises:
        bench.harness.procs.StepError: a step failed or timed out (the message holds its log tail).
    """
    data = workdir / "data" / "train.txt"
    run_dir = workdir / "run"
    model_base_path = workdir / "models" / "ctr"
    py = sys.executable
    steps = [
        (
            "synth",
            [py, "-m", "training.synth", "--out", str(data), "--rows", str(mode.rows), "--seed", str(SEED)],
        ),
        ("train", [py, "-m", "training", "--data", str(data), "--out", str(run_dir), *mode.train_args]),
        ("export", [py, "-m", "export", "--run", str(run_dir), "--repo", str(model_base_path)]),
    ]
    commands: list[str] = []
    seconds: dict[str, float] = {}
    data.parent.mkdir(parents=True, exist_ok=True)
    for name, cmd in steps:
        commands.append(shlex.join(cmd))
        t0 = time.monotonic()
        print(f"[bench] pipeline: {name} …", flush=True)
        run_bounded(
            cmd, timeout_s=mode.step_timeout_s, log=logs / f"{name}.log", env=child_env(), cwd=PROJECT_ROOT
        )
        seconds[name] = round(time.monotonic() - t0, 2)
    metrics_path = run_dir / contract_run_dir.METRICS
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    return PipelineOutputs(
        data=data,
        run_dir=run_dir,
        checkpoint=run_dir / contract_run_dir.BEST_CHECKPOINT,
        model_base_path=model_base_path,
        version_dir=latest_version(model_base_path),
        commands=commands,
        step_seconds=seconds,
        train_metrics=metrics,
    )
