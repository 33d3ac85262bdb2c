"""DDP scaling on any accelerator: samples/s with 1 process and with 2 DDP processes on the same data, and the efficiency.

`make bench` takes its CPU (gloo) figure from the scaling section (`bench.sections.scaling`); this standalone module is
what `make test-gpu` runs for NCCL on a machine with 2 CUDA devices, and works on CPU too.

    python -m bench.ddp_scaling --data artifacts/data/train.txt --max-rows 200000   # CPU, gloo
    python -m bench.ddp_scaling --accelerator gpu --rows 1000000                    # GPU, NCCL (make test-gpu)

efficiency = samples/s with 2 processes ÷ (2 × samples/s with 1). Each run is `python -m training` itself
(per-process batch size as given, so 2 processes take twice the rows per step), and samples/s is what it
writes to metrics.json: training time only, summed over ranks. On CPU the 2 processes share the machine's
cores (`python -m training` gives each cores ÷ 2 threads), so the figure says what DDP costs on one box,
not what a second machine would add.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.inputs import PROJECT_ROOT


def _train(
    data: Path, out: Path, devices: int, accelerator: str, args: list[str], timeout_s: float
) -> tuple[float, str]:
    """One `python -m training` run; returns (its samples/s, the command)."""
    cmd = [
        sys.executable,
        "-m",
        "training",
        "--data",
        str(data),
        "--out",
        str(out),
        "--accelerator",
        accelerator,
        "--devices",
        str(devices),
        "--no-progress-bar",
        *args,
    ]
    if devices > 1:
        cmd += ["--strategy", "ddp"]
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit code {proc.returncode}: {shlex.join(cmd)}\n{tail}")
    return float(json.loads((out / "metrics.json").read_text())["samples_per_sec"]), shlex.join(cmd)


def measure(
    data: Path,
    workdir: Path,
    *,
    accelerator: str = "cpu",
    epochs: int = 2,
    batch_size: int = 2048,
    max_rows: int | None = None,
    timeout_s: float = 1800,
) -> dict[str, Any]:
    """Train with 1 then 2 processes; returns samples/s of each, the efficiency and the commands."""
    args = ["--max-epochs", str(epochs), "--patience", str(epochs), "--batch-size", str(batch_size)]
    args += ["--max-rows", str(max_rows)] if max_rows else []
    one, cmd1 = _train(data, workdir / "ddp1", 1, accelerator, args, timeout_s)
    two, cmd2 = _train(data, workdir / "ddp2", 2, accelerator, args, timeout_s)
    gpu = accelerator in ("gpu", "cuda")
    return {
        "backend": "nccl" if gpu else "gloo",
        "accelerator": accelerator,
        "samples_per_sec_1": one,
        "samples_per_sec_2": two,
        "efficiency": two / (2 * one),
        "usable_cores": len(os.sched_getaffinity(0)),
        "per_process_batch_size": batch_size,
        "epochs": epochs,
        "commands": [cmd1, cmd2],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ddp_scaling", description=__doc__.splitlines()[0])
    p.add_argument(
        "--data", type=Path, default=None, help="Criteo file both runs train on (default: synthetic)"
    )
    p.add_argument("--rows", type=int, default=200_000, help="synthetic rows generated when --data is absent")
    p.add_argument("--accelerator", default="cpu", help="cpu (gloo) or gpu (NCCL, needs 2 CUDA devices)")
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=2048, help="per process")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / "artifacts" / "ddp_scaling")
    args = p.parse_args(argv)
    if args.accelerator in ("gpu", "cuda"):
        import torch

        if torch.cuda.device_count() < 2:
            print(
                f"ddp_scaling: skipped, NCCL DDP needs 2 CUDA devices and this machine has {torch.cuda.device_count()}"
            )
            return 0
    if args.data is None:
        from training.synth import generate

        args.data = args.workdir / "data" / "train.txt"
        args.data.parent.mkdir(parents=True, exist_ok=True)
        generate(args.data, args.rows, seed=7)
    r = measure(
        args.data,
        args.workdir,
        accelerator=args.accelerator,
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_rows=args.max_rows,
    )
    print(json.dumps(r, indent=2))
    print(
        f"DDP ({r['backend']}): 1 process {r['samples_per_sec_1']:,.0f} samples/s, 2 processes "
        f"{r['samples_per_sec_2']:,.0f} samples/s, efficiency {r['efficiency']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
