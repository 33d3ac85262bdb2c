"""Data scaling: peak RSS per process and training samples/s against the row count, streamed and in memory.

    python -m bench.sections.scaling --mode quick --workdir /tmp/scaling      # standalone; `make bench` runs it too
    python -m bench.sections.scaling --ab artifacts/data/train.txt            # loader A/B in one process
    python -m bench.sections.scaling --primitives artifacts/data/train.txt    # read / transform rows/s

One data set of the largest size is generated; each point is one `python -m training --loader L
--max-rows N --max-epochs 1` on it, so every point reads the same rows. Peak RSS is the run's high-water
mark as `wait4` reports it (the largest of the process and the ranks it waited for). Samples/s is what
the run writes to metrics.json (training time only, summed over ranks). The DDP point runs 2 gloo
processes on the `stream` loader beside a 1-process run of the same size: speedup = 2-process ÷ 1-process
samples/s (on one machine the two share its cores).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness.inputs import PROJECT_ROOT

# rows measured, the largest row count the in-memory loader is also measured at, the DDP point's rows
SIZES: dict[str, tuple[tuple[int, ...], int, int]] = {
    "full": ((250_000, 1_000_000, 3_000_000), 1_000_000, 1_000_000),
    "quick": ((30_000, 90_000), 90_000, 90_000),
    "tiny": ((4_000, 12_000), 12_000, 12_000),
}
RUN_TIMEOUT_S = {"full": 3600.0, "quick": 600.0, "tiny": 300.0}
# Whole runs of each loader at the largest in-memory size, alternating: one run's samples/s moves ±25% on a shared
# machine, so the loaders' ratio is the median over pairs (the first pair is the table's own two runs).
LOADER_PAIRS = 3
AB_ROUNDS = {"full": 60, "quick": 30, "tiny": 10}  # `--ab` rounds of 10 steps per loader


def _train(data: Path, out: Path, rows: int, loader: str, devices: int, timeout_s: float) -> dict[str, Any]:
    """One training run; returns its peak RSS, samples/s, AUCs and command."""
    cmd = [
        sys.executable,
        "-m",
        "training",
        "--data",
        str(data),
        "--out",
        str(out),
        "--max-rows",
        str(rows),
        "--loader",
        loader,
        "--max-epochs",
        "1",
        "--no-progress-bar",
        "--accelerator",
        "cpu",
        "--devices",
        str(devices),
        *(["--strategy", "ddp"] if devices > 1 else []),
    ]
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=PROJECT_ROOT, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            os.wait4(proc.pid, 0)
            raise RuntimeError(f"timed out after {timeout_s:.0f} s: {shlex.join(cmd)}")
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"exit code {proc.returncode}: {shlex.join(cmd)}\n{tail}")
    m = json.loads((out / "metrics.json").read_text())
    return {
        "loader": loader,
        "processes": devices,
        "rows": rows,
        "train_rows": m["train_rows"],
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
        "samples_per_sec": m["samples_per_sec"],
        "val_auc": m["val_auc"],
        "oracle_auc": m["oracle_auc"],
        "command": shlex.join(cmd),
    }


def run(mode: str, workdir: Path) -> dict[str, Any]:
    """Measure every point of `mode`; returns {"rows": [...], "ddp": {...}, "commands": [...], "config": {...}}."""
    from training.synth import generate

    if mode not in SIZES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {sorted(SIZES)}")
    sizes, memory_max, ddp_rows = SIZES[mode]
    timeout = RUN_TIMEOUT_S[mode]
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "train.txt"
    generate(data, max(sizes), seed=7)
    rows = []
    for n in sizes:
        for loader in ("stream", "memory"):
            if loader == "memory" and n > memory_max:
                continue
            rows.append(_train(data, workdir / f"{loader}_{n}", n, loader, 1, timeout))
            print(
                f"[scaling] {loader} {n} rows: {rows[-1]['peak_rss_mib']} MiB, {rows[-1]['samples_per_sec']} samples/s"
            )
    loaders = _loader_ratio(data, workdir, rows, memory_max, timeout, AB_ROUNDS[mode])
    one = next((r for r in rows if r["loader"] == "stream" and r["rows"] == ddp_rows), None)
    if one is None:
        one = _train(data, workdir / f"stream_{ddp_rows}", ddp_rows, "stream", 1, timeout)
    two = _train(data, workdir / f"ddp2_{ddp_rows}", ddp_rows, "stream", 2, timeout)
    rows.append(two)
    ddp = {
        "rows": ddp_rows,
        "samples_per_sec_1": one["samples_per_sec"],
        "samples_per_sec_2": two["samples_per_sec"],
        "speedup": two["samples_per_sec"] / one["samples_per_sec"],
        "backend": "gloo",
        "usable_cores": len(os.sched_getaffinity(0)),
    }
    config = {"mode": mode, "sizes": list(sizes), "memory_loader_up_to": memory_max, "epochs": 1}
    commands = [r["command"] for r in rows] + [loaders["ab_command"]]
    return {"rows": rows, "ddp": ddp, "loaders": loaders, "commands": commands, "config": config}


def _loader_ratio(
    data: Path, workdir: Path, rows: list[dict[str, Any]], n: int, timeout: float, ab_rounds: int
) -> dict[str, Any]:
    """Streamed ÷ in-memory samples/s at `n` rows: the median of `LOADER_PAIRS` alternating whole runs (Lightning,
    `python -m training`), and the in-process `--ab` figure (alternating rounds of the same step, one process)."""
    import statistics

    def first(loader: str) -> dict[str, Any]:
        return next(r for r in rows if r["rows"] == n and r["loader"] == loader)

    pairs = [(first("stream"), first("memory"))]
    for i in range(1, LOADER_PAIRS):
        stream = _train(data, workdir / f"stream_{n}_pair{i}", n, "stream", 1, timeout)
        pairs.append((stream, _train(data, workdir / f"memory_{n}_pair{i}", n, "memory", 1, timeout)))
    ratios = [s["samples_per_sec"] / m["samples_per_sec"] for s, m in pairs]
    out = workdir / "loader_ab.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.sections.scaling",
        "--ab",
        str(data),
        "--ab-rows",
        str(n),
        "--ab-rounds",
        str(ab_rounds),
        "--out",
        str(out),
    ]
    subprocess.run(cmd, cwd=PROJECT_ROOT, check=True, capture_output=True, timeout=timeout)
    ab = json.loads(out.read_text())
    return {
        "rows": n,
        "pairs": [[s["samples_per_sec"], m["samples_per_sec"]] for s, m in pairs],
        "stream_over_memory": statistics.median(ratios),
        "spread": [min(ratios), max(ratios)],
        "ab_stream_over_memory": ab["stream_over_memory"],
        "ab_rounds": ab_rounds,
        "ab_command": shlex.join(cmd),
    }


def loader_ab(data: Path, rows: int | None, batches: int, rounds: int) -> dict[str, Any]:
    """In one process, train from both loaders in alternating rounds of `batches` steps; samples/s of each.

    The step is the pipeline's on this CPU (`training.runtime.speed`: its dropout, Adam, precision, threads,
    OpenMP waits and malloc policy), batch 2048. Alternating short rounds cancel the drift of a shared
    machine's load, which two separate runs (or long phases) would not.
    """
    from training.runtime.malloc import keep_freed_memory, step_tensor_bytes
    from training.runtime.speed import SpeedSettings, set_omp_wait_policy

    set_omp_wait_policy()  # as `python -m training` does, before torch loads
    malloc = keep_freed_memory(step_tensor_bytes(2048, (128, 256, 128)))
    import torch
    import torch.nn.functional as F

    from ctr_model.net import ModelConfig
    from training.data.preparation import prepare_data
    from training.loader.memory import ShuffledBatches, load_in_memory
    from training.loader.stream import StreamedBatches
    from training.model.lightning_module import CTRModule

    speed = SpeedSettings.choose("cpu", malloc=malloc)
    prepared = prepare_data(data, None, 0.1, 128, rows, False, print)
    pq_data, spec, encoded = prepared.data, prepared.spec, prepared.encoded
    memory = load_in_memory(pq_data, spec, encoded)
    sources: dict[str, ShuffledBatches | StreamedBatches] = {
        "memory": ShuffledBatches(
            torch.from_numpy(memory.train_x), torch.from_numpy(memory.train_y), 2048, seed=1
        ),
        "stream": StreamedBatches(pq_data, spec, "train", 2048, seed=1, encoded=encoded["train"]),
    }
    iters = {name: iter(source) for name, source in sources.items()}
    module = CTRModule(
        ModelConfig().to_dict(), 2e-3, adam_impl=speed.adam_impl, fast_dropout=speed.fast_dropout
    )
    net, opt = module.net.train(), module.configure_optimizers()
    bf16 = speed.precision.startswith("bf16")
    seconds = dict.fromkeys(sources, 0.0)
    samples = dict.fromkeys(sources, 0)
    for _ in range(rounds):
        for name in sources:
            t0 = time.perf_counter()
            for _ in range(batches):
                batch = next(iters[name], None)
                if batch is None:  # epoch over: start the next one
                    iters[name] = iter(sources[name])
                    batch = next(iters[name])
                x, y, _ = batch
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = net(x)
                loss = F.binary_cross_entropy_with_logits(logits.float(), y.reshape(-1, 1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                samples[name] += x.shape[0]
            seconds[name] += time.perf_counter() - t0
    sps = {name: samples[name] / seconds[name] for name in sources}
    return {
        "samples_per_sec": sps,
        "stream_over_memory": sps["stream"] / sps["memory"],
        "rounds": rounds,
        "batches_per_round": batches,
        "settings": speed.line(),
    }


def primitives(data: Path) -> dict[str, float]:
    """Rows/s of each way to get rows off disk, and of the transform: the measurement behind the loader's design."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from ctr_features.compiled.records import expand, transform_chunk
    from training.data.cache import ensure_cache
    from training.data.feature_cache import iter_records
    from training.data.preparation import prepare_data

    cache = ensure_cache(data)[0]
    prepared = prepare_data(data, None, 0.1, 128, None, False, print)
    pq_data, spec, encoded = prepared.data, prepared.spec, prepared.encoded
    pf = pq.ParquetFile(cache)
    n, n_train = pf.metadata.num_rows, pq_data.rows("train")
    first = pq_data.read(pq_data.pieces[0], "train").table
    steps = {
        "ParquetFile.read_row_group, all columns": (
            n,
            lambda: [pf.read_row_group(g) for g in range(pf.num_row_groups)],
        ),
        "pyarrow.dataset to_batches, whole file": (
            n,
            lambda: sum(b.num_rows for b in ds.dataset(cache).to_batches()),
        ),
        "ParquetData.read, one split, typed": (
            n_train,
            lambda: [pq_data.read(p, "train") for p in pq_data.pieces],
        ),
        "FeatureSpec.transform, one row group": (len(first), lambda: transform_chunk(spec, first)),
        "encoded records, read + expand": (
            n_train,
            lambda: [expand(r, 128) for r in iter_records(encoded["train"], n_train)],
        ),
    }
    out = {}
    for name, (rows, step) in steps.items():
        t0 = time.perf_counter()
        step()
        out[name] = round(rows / (time.perf_counter() - t0))
        print(f"{name}: {out[name]} rows/s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sections.scaling", description=__doc__.splitlines()[0])
    p.add_argument("--mode", default="quick", choices=sorted(SIZES))
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / "artifacts" / "scaling")
    p.add_argument("--out", type=Path, default=None, help="write the result JSON here too")
    p.add_argument("--ab", type=Path, default=None, help="instead: loader A/B throughput on this Criteo file")
    p.add_argument("--ab-rows", type=int, default=None, help="--max-rows for --ab")
    p.add_argument("--ab-batches", type=int, default=10, help="training steps per loader and round")
    p.add_argument("--ab-rounds", type=int, default=40, help="alternating rounds")
    p.add_argument(
        "--primitives", type=Path, default=None, help="instead: read/transform rows/s on this file"
    )
    args = p.parse_args(argv)
    if args.primitives:
        result: dict[str, Any] = primitives(args.primitives)
    elif args.ab:
        result = loader_ab(args.ab, args.ab_rows, args.ab_batches, args.ab_rounds)
    else:
        result = run(args.mode, args.workdir)
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
