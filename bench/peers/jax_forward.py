"""JAX (`jax.jit` forward) in the inference section: the checkpoint's weights in the Flax MLP, in `.venv-jax`.

The parent (`measure`, in the main venv) copies the checkpoint's weights and a probe batch with torch's
predictions into an .npz; the worker (`python -m bench.peers.jax_forward`, in `.venv-jax`) checks it reproduces those
predictions, then times one jitted call (numpy in, numpy out, like every other backend) per batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.timing import time_calls

BACKEND = "JAX jit"
PROBE_ROWS = 256


def export_weights(checkpoint: Path, out: Path) -> None:
    """Write the net's Linear weights (torch layout), its activation and torch's probe predictions to `out`."""
    import torch

    from ctr_model.checkpoint import load_net

    net, _ = load_net(checkpoint)
    net.eval()
    linears = [m for m in net.layers if isinstance(m, torch.nn.Linear)]
    probe = np.random.default_rng(0).standard_normal((PROBE_ROWS, net.cfg.width)).astype(np.float32)
    with torch.no_grad():
        expected = net.predict_proba(torch.from_numpy(probe)).numpy()
    arrays = {f"w{i}": m.weight.detach().numpy() for i, m in enumerate(linears)}
    arrays |= {f"b{i}": m.bias.detach().numpy() for i, m in enumerate(linears)}
    arrays |= {"probe": probe, "expected": expected, "activation": np.array(net.cfg.activation)}
    np.savez(out, **arrays)  # type: ignore[arg-type]


def measure(
    checkpoint: Path, plan: dict[str, Any], threads: int | None, workdir: Path, python: Path
) -> tuple[list[dict[str, Any]], str]:
    """Run the worker in the JAX venv; returns (rows shaped like bench.sections.inference_latency's, the command).

    Args:
        plan: {"warmup_calls": int, "repeats": int, "calls": {"<batch>": timed calls per repeat}}.

    Raises:
        RuntimeError: the worker failed (the message holds its output tail).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    weights, out = workdir / "jax_weights.npz", workdir / "jax_forward.json"
    export_weights(checkpoint, weights)
    cmd = [
        str(python),
        "-m",
        "bench.peers.jax_forward",
        "--weights",
        str(weights),
        "--plan",
        json.dumps(plan),
        "--out",
        str(out),
    ]
    env = dict(os.environ)
    if threads == 1:  # XLA's CPU client otherwise uses every core
        env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise RuntimeError(f"exit code {proc.returncode}: {' '.join(cmd)}\n{tail}")
    rows = json.loads(out.read_text())
    for r in rows:
        r["threads"] = threads if threads is not None else "default"
    return rows, " ".join(cmd)


def worker_main(argv: list[str] | None = None) -> int:
    import importlib.metadata as m

    import jax

    from bench.peers.jax_train import MLP

    p = argparse.ArgumentParser(prog="python -m bench.peers.jax_forward", description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=Path, required=True)
    p.add_argument(
        "--plan", required=True, help='{"warmup_calls": 10, "repeats": 3, "calls": {"1": 300, ...}}'
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    plan = json.loads(args.plan)
    w = np.load(args.weights)
    n = len([k for k in w.files if k.startswith("w")])
    params = {"params": {f"Dense_{i}": {"kernel": w[f"w{i}"].T, "bias": w[f"b{i}"]} for i in range(n)}}
    model = MLP(in_features=w["w0"].shape[1], activation=str(w["activation"]))
    forward = jax.jit(lambda p, x: jax.nn.sigmoid(model.apply(p, x, train=False)))  # (B, 128) -> (B, 1)

    def predict(x: np.ndarray) -> np.ndarray:
        return np.asarray(forward(params, x))  # waits for the result and copies it to the host

    diff = float(np.max(np.abs(predict(w["probe"]) - w["expected"])))
    if diff > 1e-4:
        raise SystemExit(
            f"the Flax MLP does not reproduce the checkpoint: max |jax - torch| = {diff:.2e} > 1e-4"
        )
    rng = np.random.default_rng(0)
    versions = {d: m.version(d) for d in ("jax", "flax")}
    rows = []
    for batch_text, calls in plan["calls"].items():
        batch = int(batch_text)
        x = rng.standard_normal((batch, w["w0"].shape[1])).astype(np.float32)
        time_calls(predict, x, plan["warmup_calls"])
        runs = [time_calls(predict, x, calls) for _ in range(plan["repeats"])]
        p50 = [float(np.percentile(r, 50)) for r in runs]
        p99 = [float(np.percentile(r, 99)) for r in runs]
        rows.append(
            {
                "backend": BACKEND,
                "batch": batch,
                "p50_ms": float(np.median(p50)),
                "p99_ms": float(np.median(p99)),
                "p50_ms_runs": p50,
                "p99_ms_runs": p99,
                "runs": plan["repeats"],
                "calls": calls,
                "max_abs_diff_vs_torch": diff,
                "versions": versions,
            }
        )
        print(
            f"{BACKEND} batch {batch}: p50 {rows[-1]['p50_ms']:.3f} ms, p99 {rows[-1]['p99_ms']:.3f} ms",
            flush=True,
        )
    args.out.write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
