"""In-process inference latency of one exported version: PyTorch eager, TorchScript, ONNX Runtime, TF SavedModel.

Every backend runs the artifacts `python -m export` published (PyTorch eager rebuilds the net from the
checkpoint), one call per batch, timed with perf_counter. p50/p99 are taken per repeat and the median over
repeats is reported. JAX (jit forward on the checkpoint's weights) runs in `.venv-jax` via `bench.peers.jax_forward`. Run alone: `python -m bench.sections.inference_latency --version-dir DIR [--checkpoint F]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.timing import time_calls
from ctr_contract.repository import (
    FEATURE_SPEC_PATH,
    MANIFEST_PATH,
    ONNX_MODEL,
    RAW_ONNX_MODEL,
    TORCHSCRIPT_MODEL,
)
from ctr_contract.tf_log import quiet_tensorflow_import

BATCHES = (1, 64, 256, 1024)
RAW_BATCHES = (1, 256)


@dataclass(frozen=True)
class LatencyPlan:
    """How much to measure: timed calls per batch size (scaled down for big batches) and repeats."""

    calls_at_batch1: int
    min_calls: int
    repeats: int
    warmup_calls: int = 10

    def calls(self, batch: int) -> int:
        return max(self.min_calls, self.calls_at_batch1 // max(1, batch // 16))


PLANS = {
    "full": LatencyPlan(calls_at_batch1=2000, min_calls=100, repeats=5),
    "quick": LatencyPlan(calls_at_batch1=300, min_calls=30, repeats=3),
    "tiny": LatencyPlan(calls_at_batch1=50, min_calls=10, repeats=2),
}


def _backends(
    version_dir: Path, checkpoint: Path | None, threads: int | None
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """Load every backend the version (and checkpoint) provides, in report order.

    Args:
        threads: intra-op threads for every framework (None: each framework's default).
    """
    import torch

    from export.gates.runtimes import (
        onnxruntime_predictor,
        savedmodel_predictor,
        torch_predictor,
        torchscript_predictor,
    )

    with quiet_tensorflow_import():  # quiet C++ log, unless the user set TF_CPP_MIN_LOG_LEVEL
        import tensorflow as tf
    if threads is not None:
        # Same pool size everywhere, set before TF runs its first op (it cannot change afterwards).
        torch.set_num_threads(threads)
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    out: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    if checkpoint is not None:
        from ctr_model.checkpoint import load_net

        out["PyTorch eager"] = torch_predictor(load_net(checkpoint)[0])
    if (version_dir / TORCHSCRIPT_MODEL).is_file():
        out["TorchScript"] = torchscript_predictor(version_dir / TORCHSCRIPT_MODEL)
    out["ONNX Runtime"] = onnxruntime_predictor(version_dir / ONNX_MODEL, threads=threads)
    out["TF SavedModel"] = savedmodel_predictor(version_dir)
    return out


def _source_checkpoint(version_dir: Path) -> Path | None:
    """The checkpoint the manifest names, when it is still on disk."""
    manifest = version_dir / MANIFEST_PATH
    if not manifest.is_file():
        return None
    path = Path(json.loads(manifest.read_text())["source_checkpoint"]["path"])
    return path if path.is_file() else None


def run(
    mode: str,
    version_dir: Path,
    checkpoint: Path | None,
    threads: int | None = None,
    workdir: Path | None = None,
) -> dict[str, Any]:
    """Measure p50/p99 per backend and batch size.

    Args:
        mode: a key of PLANS ("full", "quick" or "tiny"): how many calls and repeats each point gets.
        version_dir: a published version folder (model.onnx, saved_model.pb, model.pt).
        checkpoint: the source checkpoint for PyTorch eager; None falls back to the manifest's.
        threads: intra-op threads for every backend; None keeps each framework's default.
    Returns:
        {"rows": [{"backend", "batch", "p50_ms", "p99_ms", "p50_ms_runs", "p99_ms_runs", "runs", "calls", "threads"}],
         "commands": [...]}.
    """
    if mode not in PLANS:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(PLANS)}")
    plan = PLANS[mode]
    if not (version_dir / ONNX_MODEL).is_file():
        raise FileNotFoundError(
            f"{version_dir} has no model.onnx; expected a version folder from `python -m export`"
        )
    checkpoint = checkpoint or _source_checkpoint(version_dir)
    backends = _backends(version_dir, checkpoint, threads)
    width = _width(version_dir)
    rng = np.random.default_rng(0)
    rows = []
    for name, predict in backends.items():
        for batch in BATCHES:
            x = rng.standard_normal((batch, width)).astype(np.float32)
            time_calls(predict, x, plan.warmup_calls)
            calls = plan.calls(batch)
            runs = [time_calls(predict, x, calls) for _ in range(plan.repeats)]
            p50 = [float(np.percentile(r, 50)) for r in runs]
            p99 = [float(np.percentile(r, 99)) for r in runs]
            rows.append(
                {
                    "backend": name,
                    "batch": batch,
                    "p50_ms": float(np.median(p50)),
                    "p99_ms": float(np.median(p99)),
                    "p50_ms_runs": p50,
                    "p99_ms_runs": p99,
                    "runs": plan.repeats,
                    "calls": calls,
                    "threads": threads if threads is not None else "default",
                }
            )
    command = f"python -m bench.sections.inference_latency --mode {mode} --version-dir {version_dir}"
    if checkpoint is not None:
        command += f" --checkpoint {checkpoint}"
    if threads is not None:
        command += f" --threads {threads}"
    jax_rows, jax_commands, notes = _jax_rows(plan, checkpoint, threads, workdir)
    rows += _raw_rows(plan, version_dir, threads)
    return {"rows": rows + jax_rows, "commands": [command, *jax_commands], "notes": notes}


def _call_raw(
    predict: Callable[[np.ndarray, np.ndarray], np.ndarray], x: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    return predict(*x)


def _raw_rows(plan: LatencyPlan, version_dir: Path, threads: int | None) -> list[dict[str, Any]]:
    """The `raw` signature on ORT and the SavedModel (FeatureSpec in the graph) and as our server runs it (the
    compiled FeatureSpec, then model.onnx), batch 1 and 256."""
    if not (version_dir / RAW_ONNX_MODEL).is_file():
        return []  # a version exported before raw serving
    from ctr_features.parity import build_raw_rows
    from ctr_features.spec import FeatureSpec
    from export.gates.raw_parity import (
        onnxruntime_raw_predictor,
        savedmodel_raw_predictor,
        serving_predictor,
    )
    from export.gates.runtimes import onnxruntime_predictor

    spec = FeatureSpec.load(version_dir / FEATURE_SPEC_PATH)
    numeric, categorical = build_raw_rows(spec, 0, None)[0]  # known, unseen, missing, extreme, odd values
    raw = {
        "ONNX Runtime (raw)": onnxruntime_raw_predictor(version_dir / RAW_ONNX_MODEL, threads=threads),
        "TF SavedModel (raw)": savedmodel_raw_predictor(version_dir),
        # What our server runs for `raw`: the compiled FeatureSpec (ctr_features/compiled/table.py) + model.onnx.
        "ONNX Runtime (raw, our server's FeatureSpec)": serving_predictor(
            spec, onnxruntime_predictor(version_dir / ONNX_MODEL, threads=threads)
        ),
    }
    rows = []
    for name, predict in raw.items():
        for batch in RAW_BATCHES:
            x = (numeric[:batch], categorical[:batch])
            call = functools.partial(_call_raw, predict)  # time_calls passes one argument
            time_calls(call, x, plan.warmup_calls)  # type: ignore[arg-type]
            runs = [time_calls(call, x, plan.calls(batch)) for _ in range(plan.repeats)]  # type: ignore[arg-type]
            p50 = [float(np.percentile(r, 50)) for r in runs]
            p99 = [float(np.percentile(r, 99)) for r in runs]
            rows.append(
                {
                    "backend": name,
                    "batch": batch,
                    "p50_ms": float(np.median(p50)),
                    "p99_ms": float(np.median(p99)),
                    "p50_ms_runs": p50,
                    "p99_ms_runs": p99,
                    "runs": plan.repeats,
                    "calls": plan.calls(batch),
                    "threads": threads if threads is not None else "default",
                }
            )
    return rows


def _jax_rows(
    plan: LatencyPlan, checkpoint: Path | None, threads: int | None, workdir: Path | None
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """JAX (jit forward) rows, measured in `.venv-jax`; when it cannot run, no rows and a note saying why."""
    import tempfile

    from bench.harness.foreign_venvs import JAX, unavailable_reason
    from bench.peers import jax_forward

    with tempfile.TemporaryDirectory() as tmp:
        where = workdir or Path(tmp)
        reason = unavailable_reason(JAX, where)
        if reason is None and checkpoint is None:
            reason = "no checkpoint to take the weights from"
        if reason is not None:
            return [], [], [f"{jax_forward.BACKEND} not measured: {reason}"]
        assert checkpoint is not None
        calls = {str(b): plan.calls(b) for b in BATCHES}
        spec = {"warmup_calls": plan.warmup_calls, "repeats": plan.repeats, "calls": calls}
        try:
            rows, command = jax_forward.measure(checkpoint, spec, threads, where, JAX.python)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            return [], [], [f"{jax_forward.BACKEND} not measured: {e}"]
    return rows, [command], []


def _width(version_dir: Path) -> int:
    """Input width from the ONNX graph: features [batch, width]."""
    import onnx

    graph = onnx.load(str(version_dir / ONNX_MODEL), load_external_data=False).graph
    return graph.input[0].type.tensor_type.shape.dim[1].dim_value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sections.inference_latency", description=__doc__)
    p.add_argument(
        "--version-dir",
        type=Path,
        required=True,
        help="published version folder, e.g. artifacts/models/ctr/1",
    )
    p.add_argument("--checkpoint", type=Path, help="checkpoint for PyTorch eager (default: the manifest's)")
    p.add_argument("--mode", choices=sorted(PLANS), default="quick")
    p.add_argument(
        "--threads", type=int, help="intra-op threads for every backend (default: each framework's own)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    result = run(args.mode, args.version_dir, args.checkpoint, args.threads)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{'backend':<15}{'batch':>6}{'p50 ms':>10}{'p99 ms':>10}")
    for r in result["rows"]:
        print(f"{r['backend']:<15}{r['batch']:>6}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
