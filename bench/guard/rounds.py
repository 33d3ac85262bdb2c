"""The guard's measurements: HEAD and the baseline in interleaved rounds, the servers side by side.

Each side's server is our server from its own tree (bench.harness.servers.our_server, as bench/raw_served.py
serves two checkouts): one worker, batching on, `--intra_op_threads=1`, the same model, REST on 127.0.0.1,
driven by wrk (bench.harness.servers.wrk_point: a 1 s unmeasured warm-up, then the measured run). A round
measures every figure on both sides, one side right after the other, the sides' order reversed every other
round (the side measured first in a round did better often enough to matter; bench/sections/serving_tracing.py),
and a point's seconds alternate between the sides in 1 s wrk runs, whose mean is the round's value:
- a single raw Criteo row at 64 connections: QPS;
- ranking requests of 100 raw rows at 8 connections: rows/s;
- a single raw row at 8 connections: p99 latency;
- a fixed small training run (`python -m training` on the fixture's file, TRAIN_ARGS): samples/s.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench.guard.trees import side_env
from bench.guard.verdict import Figure
from bench.harness import procs
from bench.harness.servers import Server, our_server, wrk_point
from bench.sections.serving_load import RANKING_INSTANCES, write_raw_lua
from ctr_contract.run_dir import METRICS

RAW_QPS = Figure("raw row QPS, 64 connections", "req/s", higher_is_better=True)
RANKING = Figure(f"{RANKING_INSTANCES}-row raw ranking, 8 connections", "rows/s", higher_is_better=True)
RAW_P99 = Figure("raw row p99, 8 connections", "ms", higher_is_better=False)
TRAINING = Figure("training samples/s", "samples/s", higher_is_better=True)
FIGURES = (RAW_QPS, RANKING, RAW_P99, TRAINING)
TRAIN_ARGS = ("--max-epochs", "2", "--seed", "7", "--no-progress-bar")
TRAIN_TIMEOUT_S = 300


@dataclass
class Rounds:
    """Every round's value per figure and side (in round order), and the failed responses wrk counted."""

    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)

    def add(self, figure: Figure, side: str, value: float) -> None:
        self.values.setdefault(figure.name, {}).setdefault(side, []).append(value)


def measure_rounds(
    trees: dict[str, Path], base: Path, data: Path, workdir: Path, rounds: int, seconds: int
) -> Rounds:
    """Measure FIGURES on each side (`trees`: side name -> its tree) in `rounds` interleaved rounds.

    Args:
        trees: the sides, each a tree of the project with its extensions built.
        base: the model base path both servers serve.
        data: the training file of the training figure.
        workdir: logs, wrk scripts and the training runs.
        rounds: interleaved rounds.
        seconds: measured seconds a side of each point, in alternating 1 s wrk runs (their mean is the round's).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    raw1, raw100 = (
        write_raw_lua(workdir / "raw1.lua", 1),
        write_raw_lua(workdir / "raw100.lua", RANKING_INSTANCES),
    )
    plan = ((RAW_QPS, 64, raw1), (RANKING, 8, raw100), (RAW_P99, 8, raw1))
    flags = ("--num_workers=1",)
    servers = {
        side: our_server(side, base, batching=True, flags=flags, checkout=tree, env=side_env(tree))
        for side, tree in trees.items()
    }
    found = Rounds()
    commands: list[str] = []
    try:
        for server in servers.values():
            server.start(workdir, commands)
        for round_ in range(rounds):
            order = list(trees) if round_ % 2 == 0 else list(trees)[::-1]
            for figure, connections, script in plan:
                # `seconds` 1 s runs a side, alternating (H B, B H, H B, ...): a burst of the machine's load
                # lasting a second or two falls on both sides, where one run of `seconds` would give it to one.
                slices: dict[str, list[float]] = {side: [] for side in order}
                for second in range(seconds):
                    for side in order if second % 2 == 0 else order[::-1]:
                        warm = round_ == 0 and second == 0  # the first round warms each point up (1 s)
                        row = wrk_point(servers[side], connections, script, 1, commands, warm)
                        found.errors[side] = found.errors.get(side, 0.0) + row["errors"]
                        slices[side].append(_figure_value(figure, row))
                for side, values in slices.items():
                    found.add(figure, side, sum(values) / len(values))
            for side in order:
                run = workdir / side / f"run{round_}"
                found.add(TRAINING, side, training_samples_per_sec(trees[side], data, run, workdir / side))
            print(f"[bench-guard] round {round_ + 1}/{rounds} done", flush=True)
    finally:
        _stop(servers.values())
    return found


def _figure_value(figure: Figure, row: dict[str, float]) -> float:
    if figure is RAW_P99:
        return row["p99_ms"]
    return row["qps"] * (RANKING_INSTANCES if figure is RANKING else 1)


def training_samples_per_sec(tree: Path, data: Path, run: Path, side_dir: Path) -> float:
    """One training run of `tree` on `data` (TRAIN_ARGS): its metrics' training samples/s (validation and data
    preparation excluded). Each side keeps its own cache of the prepared data, made by its first run."""
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "training", "--data", str(data), "--out", str(run), *TRAIN_ARGS]
    cmd += ["--cache-dir", str(side_dir / "cache")]
    procs.run_bounded(
        cmd, timeout_s=TRAIN_TIMEOUT_S, log=side_dir / "training.log", env=side_env(tree), cwd=tree
    )
    samples_per_sec = float(json.loads((run / METRICS).read_text())["samples_per_sec"])
    shutil.rmtree(run, ignore_errors=True)  # checkpoints: tens of MB a run
    return samples_per_sec


def _stop(servers: Iterable[Server]) -> None:
    for server in servers:
        if server.proc is not None:
            procs.stop(server.proc)
