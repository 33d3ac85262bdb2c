"""A synthetic bench results dict with the exact shape the measurement modules return.

A plain module, not conftest: `from conftest import ...` picks whichever conftest.py is first on sys.path,
which breaks when tests/bench runs together with another test folder.
"""

from __future__ import annotations

from typing import Any

TRAINING = [
    ("bare PyTorch loop", 40_000.0),
    ("our Lightning pipeline", 36_000.0),
    ("naive Lightning DataLoader", 4_000.0),
    ("Keras model.fit", 52_000.0),
]
BACKENDS = [("PyTorch eager", 0.20), ("TorchScript", 0.15), ("ONNX Runtime", 0.05), ("TF SavedModel", 0.40)]
SERVERS = [
    ("ours (batching off)", 2_000.0),
    ("ours (batching on)", 3_000.0),
    ("kserve ModelServer", 1_000.0),
    ("naive fastapi+pytorch", 500.0),
]


def make_results(speed: float = 1.0) -> dict[str, Any]:
    """A full run whose throughputs are multiplied and latencies divided by `speed`."""
    training = [
        {
            "name": name,
            "samples_per_sec": sps * speed,
            "samples_per_sec_runs": [sps * speed * 0.9, sps * speed, sps * speed * 1.1],
            "val_auc": 0.75,
            "ratio_vs_bare": sps / 40_000.0,
        }
        for name, sps in TRAINING
    ]
    inference = []
    for name, base in BACKENDS:
        for batch in (1, 64, 1024):
            p50 = base * batch**0.5 / speed
            inference.append(
                {
                    "backend": name,
                    "batch": batch,
                    "p50_ms": p50,
                    "p99_ms": 2 * p50,
                    "p50_ms_runs": [p50 * 0.5, p50, p50 * 1.5],
                    "p99_ms_runs": [2 * p50, 2 * p50, 2 * p50 * 1.25],
                    "runs": 3,
                    "calls": 100,
                }
            )
    serving = [
        {
            "server": name,
            "connections": c,
            "qps": qps * min(c, 8) * speed,
            "p50_ms": c / speed,
            "p90_ms": 2 * c / speed,
            "p99_ms": 4 * c / speed,
            "errors": 0.0,
        }
        for name, qps in SERVERS
        for c in (1, 8, 64)
    ]
    return {
        "schema": 1,
        "mode": "quick",
        "command": "python -m bench --mode quick",
        "started_at": "2026-11-29T18:00:00+00:00",
        "wall_seconds": 240.0,
        "exit_code": 0,
        "machine": {
            "cpu_model": "Test CPU 9000",
            "logical_cores": 2,
            "usable_cores": 2,
            "memory_gib": 24.0,
            "os": "Linux",
            "python": "3.11.2",
            "packages": {
                "torch": "2.13.0",
                "tensorflow": "2.21.0",
                "onnxruntime": "1.23.0",
                "lightning": "2.5.0",
            },
            "tools": {"wrk": "wrk 4.1.0"},
        },
        "pipeline": {
            "status": "ok",
            "seconds": 30.0,
            "step_seconds": {"synth": 2.0, "train": 20.0, "export": 8.0},
            "commands": ["python -m training.synth --out d --rows 20000 --seed 7"],
            "train_metrics": {"val_auc": 0.75, "oracle_auc": 0.76, "val_logloss": 0.5},
            "version_dir": "work/models/ctr/1",
        },
        "sections": {
            "training": {
                "status": "ok",
                "seconds": 60.0,
                "rows": training,
                "commands": ["python -m training ..."],
                "config": {"batch_size": 1024},
            },
            "inference": {"status": "ok", "seconds": 40.0, "rows": inference, "commands": ["in-process"]},
            "serving": {
                "status": "ok",
                "seconds": 90.0,
                "rows": serving,
                "instances_per_sec_batched": 12_000.0 * speed,
                "instances_per_sec_unbatched": 8_000.0 * speed,
                "commands": [
                    "wrk -t1 -c8 -d4s --latency -s single.lua http://127.0.0.1:8501/v1/models/ctr:predict"
                ],
                "notes": ["kserve started in 3 s"],
            },
        },
    }
