"""Training throughput: our Lightning pipeline vs a bare PyTorch loop vs naive Lightning vs Keras `model.fit`,
JAX + Flax and MLX (those two in their own venvs: `bench.peers.jax_train`, `bench.peers.mlx_train`).

Same synthetic data, features, MLP, batch size, epochs and optimiser (Adam) for all six. Each framework
runs in its own process (`python -m bench.sections.training_throughput --worker NAME ...`) so TensorFlow and
PyTorch never share threads; each repeat trains a fresh model. Samples/s counts training epochs only
(after the first, warm-up epoch when there are several); the final model's val AUC is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.sections.training_loops import (
    BATCH_SIZE,
    LR,
    MODEL_WIDTHS,
    SEED,
    bare_loop,
    keras_fit,
    lightning_fit,
    torch_val_auc,
)

WORKERS = {
    "bare": "bare PyTorch loop",
    "ours": "our Lightning pipeline",
    "naive": "naive Lightning DataLoader",
    "keras": "Keras model.fit",
}
# The rows trained outside .venv, in their own venvs (bench.harness.foreign_venvs).
FOREIGN = {"jax": "JAX + Flax (jax.jit)", "mlx": "MLX (mlx.nn, CPU)"}
# Repeats of the JAX and MLX rows: MLX's Linux CPU build runs the MLP far slower than torch, and a full run
# must stay within its bound; the report's `runs` column shows the count.
FOREIGN_REPEATS = {"full": 2, "quick": 1, "tiny": 1}
# rows generated, epochs per repeat, repeats (batch size, lr and seed: bench.sections.training_loops).
SIZES = {"full": (1_000_000, 2, 3), "quick": (60_000, 2, 2), "tiny": (12_000, 2, 2)}


def run(mode: str, workdir: Path) -> dict[str, Any]:
    """Measure the six training setups; returns {"rows": [...], "commands": [...], "config": {...}}."""
    from bench.harness.procs import run_bounded
    from bench.sections.flops import step_flops
    from training.data.preparation import prepare_data
    from training.loader.memory import load_in_memory
    from training.synth import generate

    if mode not in SIZES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(SIZES)}")
    rows, epochs, repeats = SIZES[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    data_file = workdir / "train.txt"
    generate(data_file, rows, seed=11)
    prepared = prepare_data(data_file, None, 0.1, 128, None, False, print)
    data = load_in_memory(prepared.data, prepared.spec, prepared.encoded)
    features = workdir / "features.npz"
    np.savez(features, train_x=data.train_x, train_y=data.train_y, val_x=data.val_x, val_y=data.val_y)
    out_rows, commands = [], []
    for worker, name in WORKERS.items():
        out = workdir / f"{worker}.json"
        cmd = [
            sys.executable,
            "-m",
            "bench.sections.training_throughput",
            "--worker",
            worker,
            "--features",
            str(features),
            "--epochs",
            str(epochs),
            "--repeats",
            str(repeats),
            "--out",
            str(out),
        ]
        run_bounded(cmd, timeout_s=1800, log=workdir / f"{worker}.log")
        commands.append(" ".join(cmd))
        result = json.loads(out.read_text())
        out_rows.append({"name": name, **result})
    for r in out_rows:
        r["versions"] = _versions(r["name"])
    out_rows += foreign_rows(features, epochs, FOREIGN_REPEATS[mode], workdir, commands)
    profile = {"step_mflop": step_flops(BATCH_SIZE) / 1e6}
    for settings in ("torch", "fast"):
        out = workdir / f"profile_{settings}.json"
        cmd = [
            sys.executable,
            "-m",
            "bench.sections.training_profile",
            "--features",
            str(features),
            "--settings",
            settings,
            "--out",
            str(out),
        ]
        run_bounded(cmd, timeout_s=600, log=workdir / f"profile_{settings}.log")
        commands.append(" ".join(cmd))
        profile[settings] = json.loads(out.read_text())
    bare = out_rows[0]["samples_per_sec"]
    for r in out_rows:
        if r.get("samples_per_sec") is not None:
            r["ratio_vs_bare"] = r["samples_per_sec"] / bare
    config = {
        "mode": mode,
        "rows": rows,
        "train_rows": len(data.train_y),
        "epochs": epochs,
        "repeats": repeats,
        "batch_size": BATCH_SIZE,
        "lr": LR,
        "optimizer": "Adam",
        "model": "128-256-128-1 MLP, ReLU, dropout 0.3/0.2",
    }
    return {"rows": out_rows, "commands": commands, "config": config, "profile": profile}


def _versions(name: str) -> dict[str, str]:
    from importlib import metadata

    dists: tuple[str, ...] = ("tensorflow", "keras") if name == WORKERS["keras"] else ("torch", "lightning")
    if name == WORKERS["bare"]:
        dists = ("torch",)
    return {d: metadata.version(d) for d in dists}


def foreign_rows(
    features: Path, epochs: int, repeats: int, workdir: Path, commands: list[str]
) -> list[dict[str, Any]]:
    """The JAX + Flax and MLX rows, each trained in its own venv; a row that cannot run holds the exact error."""
    from bench.harness.foreign_venvs import JAX, MLX, unavailable_reason
    from bench.harness.procs import StepError, run_bounded

    rows = []
    for venv, module, name in (
        (JAX, "bench.peers.jax_train", FOREIGN["jax"]),
        (MLX, "bench.peers.mlx_train", FOREIGN["mlx"]),
    ):
        reason = unavailable_reason(venv, workdir)
        if reason is not None:
            rows.append({"name": name, "error": reason, "versions": {}})
            continue
        out = workdir / f"{venv.name}.json"
        cmd = [
            str(venv.python),
            "-m",
            module,
            "--features",
            str(features),
            "--epochs",
            str(epochs),
            "--repeats",
            str(repeats),
            "--batch-size",
            str(BATCH_SIZE),
            "--lr",
            str(LR),
            "--seed",
            str(SEED),
            "--out",
            str(out),
        ]
        commands.append(" ".join(cmd))
        try:
            run_bounded(cmd, timeout_s=1800, log=workdir / f"{venv.name}.log")
        except StepError as e:
            rows.append({"name": name, "error": str(e), "versions": venv.versions()})
            continue
        rows.append({"name": name, **json.loads(out.read_text())})
    return rows


def _summary(runs: list[float], val_auc: float) -> dict[str, Any]:
    return {
        "samples_per_sec": statistics.median(runs),
        "samples_per_sec_runs": runs,
        "spread": [min(runs), max(runs)],
        "val_auc": val_auc,
    }


def worker_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench.sections.training_throughput", description="one framework's measurement"
    )
    p.add_argument("--worker", choices=list(WORKERS), required=True)
    p.add_argument("--features", type=Path, required=True, help="features.npz written by run()")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (stretch experiments)")
    p.add_argument(
        "--adam-impl",
        choices=("auto", "default", "foreach", "fused"),
        default="auto",
        help="auto: torch's choice for bare/naive, our pipeline's choice (training.runtime.speed) for ours",
    )
    p.add_argument(
        "--precision",
        default="auto",
        help="ours: auto (training.runtime.speed's choice), 32-true, bf16-mixed",
    )
    p.add_argument(
        "--no-fast-dropout", dest="fast_dropout", action="store_false", help="ours: torch's dropout"
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the net (bare loop only)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from ctr_contract import cgroup
    from training.runtime.malloc import keep_freed_memory, step_tensor_bytes
    from training.runtime.speed import SpeedSettings, set_omp_wait_policy

    ours, governed, malloc = args.worker == "ours", False, None
    if ours:
        # As `python -m training` does: the OpenMP wait policy before torch loads, freed memory kept for the
        # next step, one thread per core of the CPU limit (governed unless --threads is given).
        set_omp_wait_policy()
        malloc = keep_freed_memory(step_tensor_bytes(args.batch_size, MODEL_WIDTHS))
        args.threads, governed = args.threads or cgroup.available_cpus(), args.threads is None
    # Only "ours" gets the pipeline's speed settings; bare and naive stay plain torch unless told otherwise.
    speed = SpeedSettings.choose(
        "cpu",
        fast_dropout=ours and args.fast_dropout,
        adam_impl=args.adam_impl if ours or args.adam_impl != "auto" else "default",
        precision=args.precision if ours else "32-true",
        threads=args.threads,
        governed=ours and governed,
        malloc=malloc,
    )
    args.adam_impl = speed.adam_impl
    if ours:
        print(speed.line(), flush=True)
    d = dict(np.load(args.features))
    if args.threads and args.worker != "keras":
        import torch

        torch.set_num_threads(args.threads)
    runs, auc = [], float("nan")
    for _ in range(args.repeats):
        if args.worker == "keras":
            rate, auc = keras_fit(d, args.epochs, args)
        else:
            import lightning as L

            L.seed_everything(SEED, verbose=False)
            if args.worker == "bare":
                rate, net = bare_loop(d, args.epochs, args)
            else:
                rate, net = lightning_fit(
                    d, args.epochs, args.batch_size, speed, naive=args.worker == "naive"
                )
            auc = torch_val_auc(net, d["val_x"], d["val_y"])
        runs.append(round(rate, 1))
        print(f"{args.worker}: {rate:.0f} samples/s, val AUC {auc:.4f}", flush=True)
    args.out.write_text(json.dumps({**_summary(runs, auc), **({"settings": speed.line()} if ours else {})}))


if __name__ == "__main__":
    worker_main()
