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
import time
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.tf_log import import_tensorflow

WORKERS = {
    "bare": "bare PyTorch loop",
    "ours": "our Lightning pipeline",
    "naive": "naive Lightning DataLoader",
    "keras": "Keras model.fit",
}
# The rows trained outside .venv, in their own venvs (bench.harness.foreign_venvs).
FOREIGN = {"jax": "JAX + Flax (jax.jit)", "mlx": "MLX (mlx.nn, CPU)"}
# Repeats of the JAX and MLX rows: MLX's Linux CPU build runs the MLP ~10x slower than torch, and a full run
# must stay within its bound; the report's `runs` column shows the count.
FOREIGN_REPEATS = {"full": 2, "quick": 1, "tiny": 1}
# rows generated, epochs per repeat, repeats; batch size and lr follow `make train`'s defaults.
SIZES = {"full": (1_000_000, 2, 3), "quick": (60_000, 2, 3), "tiny": (12_000, 2, 2)}
BATCH_SIZE, LR, SEED = 2048, 2e-3, 42
MODEL_WIDTHS = (
    128,
    256,
    128,
)  # the MLP's input and hidden widths (ctr_model.net.ModelConfig's defaults)


def run(mode: str, workdir: Path) -> dict[str, Any]:
    """Measure the six training setups; returns {"rows": [...], "commands": [...], "config": {...}}."""
    from bench.harness.procs import run_bounded
    from bench.sections.flops import step_flops
    from training.data.cache import ensure_cache
    from training.data.prepare import prepare
    from training.synth import generate

    if mode not in SIZES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(SIZES)}")
    rows, epochs, repeats = SIZES[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    data_file = workdir / "train.txt"
    generate(data_file, rows, seed=11)
    data = prepare(ensure_cache(data_file)[0], val_fraction=0.1, width=128)
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


def _steady_rate(epoch_seconds: list[float], n: int) -> float:
    """Samples/s over the epochs after the first (warm-up) one; over all of them when there is one."""
    timed = epoch_seconds[1:] or epoch_seconds
    return n * len(timed) / sum(timed)


def _torch_val_auc(net: Any, val_x: np.ndarray, val_y: np.ndarray) -> float:
    import torch

    from ctr_model.metrics import roc_auc

    net.eval()
    with torch.no_grad():
        return roc_auc(val_y, net(torch.from_numpy(val_x)).squeeze(1).numpy())


def _bare(d: dict[str, np.ndarray], epochs: int, args: argparse.Namespace) -> tuple[float, Any]:
    """Plain loop: preloaded tensors, the same shuffled whole batches as our pipeline, no Lightning."""
    import torch
    import torch.nn.functional as F

    from ctr_model.net import CTRNet
    from training.data.batches import ShuffledBatches

    net = CTRNet()
    opt = torch.optim.Adam(
        net.parameters(),
        lr=LR,
        foreach=True if args.adam_impl == "foreach" else None,
        fused=True if args.adam_impl == "fused" else None,
    )
    step = torch.compile(net) if args.compile else net
    batches = ShuffledBatches(
        torch.from_numpy(d["train_x"]), torch.from_numpy(d["train_y"]), args.batch_size, seed=SEED
    )
    seconds = []
    for epoch in range(epochs):
        batches.set_epoch(epoch)
        net.train()
        t0 = time.perf_counter()
        for x, y, _ in batches:
            opt.zero_grad(set_to_none=True)
            F.binary_cross_entropy_with_logits(step(x), y).backward()
            opt.step()
        seconds.append(time.perf_counter() - t0)
    return _steady_rate(seconds, len(d["train_y"])), net


def lightning_fit(
    d: dict[str, np.ndarray], epochs: int, batch_size: int, speed: Any, naive: bool = False
) -> tuple[float, Any]:
    """Our module in a Trainer with `speed` (a `SpeedSettings`); `naive` swaps our batch slicer for a
    per-sample Dataset + default collate. Returns (steady samples/s, the trained net)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ctr_model.net import ModelConfig
    from training.data.batches import ShuffledBatches
    from training.model.lightning_module import CTRModule

    x, y = torch.from_numpy(d["train_x"]), torch.from_numpy(d["train_y"])
    if naive:
        loader = DataLoader(
            TensorDataset(x, y.unsqueeze(1), torch.arange(len(y))), batch_size=batch_size, shuffle=True
        )
    else:
        loader = DataLoader(ShuffledBatches(x, y, batch_size, seed=SEED), batch_size=None)
    epoch_seconds: list[float] = []

    class EpochClock(L.Callback):
        def on_train_epoch_start(self, *a: Any) -> None:
            self.t0 = time.perf_counter()

        def on_train_epoch_end(self, *a: Any) -> None:
            epoch_seconds.append(time.perf_counter() - self.t0)

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[EpochClock(), *speed.callbacks()],
        precision=speed.precision,
    )
    module = CTRModule(
        ModelConfig().to_dict(), lr=LR, adam_impl=speed.adam_impl, fast_dropout=speed.fast_dropout
    )
    trainer.fit(module, train_dataloaders=loader)
    return _steady_rate(epoch_seconds, len(y)), module.net


def _keras(d: dict[str, np.ndarray], epochs: int, args: argparse.Namespace) -> tuple[float, float]:

    import_tensorflow()  # before keras loads it: quiet C++ log, unless the user set TF_CPP_MIN_LOG_LEVEL
    import keras

    from ctr_model.metrics import roc_auc

    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [
            keras.Input((d["train_x"].shape[1],)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    seconds: list[float] = []

    class EpochClock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds.append(time.perf_counter() - self.t0)

    model.fit(
        d["train_x"],
        d["train_y"],
        batch_size=args.batch_size,
        epochs=epochs,
        shuffle=True,
        verbose=0,
        callbacks=[EpochClock()],
    )
    logits = model.predict(d["val_x"], batch_size=8192, verbose=0).reshape(-1)
    return _steady_rate(seconds, len(d["train_y"])), roc_auc(d["val_y"], logits)


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
        set_omp_wait_policy()  # as `python -m training` does, before torch loads
        malloc = keep_freed_memory(
            step_tensor_bytes(args.batch_size, MODEL_WIDTHS)
        )  # as `python -m training` does
        # as `python -m training` does: one thread per core of the CPU limit, governed unless --threads is given
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
            rate, auc = _keras(d, args.epochs, args)
        else:
            import lightning as L

            L.seed_everything(SEED, verbose=False)
            if args.worker == "bare":
                rate, net = _bare(d, args.epochs, args)
            else:
                rate, net = lightning_fit(
                    d, args.epochs, args.batch_size, speed, naive=args.worker == "naive"
                )
            auc = _torch_val_auc(net, d["val_x"], d["val_y"])
        runs.append(round(rate, 1))
        print(f"{args.worker}: {rate:.0f} samples/s, val AUC {auc:.4f}", flush=True)
    args.out.write_text(json.dumps({**_summary(runs, auc), **({"settings": speed.line()} if ours else {})}))


if __name__ == "__main__":
    worker_main()
