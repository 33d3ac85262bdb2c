"""The peers that run outside `.venv`: what they import, the files run by path, and the training workers' JSON."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from bench.peers import torchserve_server
from bench.peers.train_worker import worker_main
from bench.sections import serving_load
from tests.helpers import REPO_ROOT

PEERS = REPO_ROOT / "bench" / "peers"
PROJECT = ("bench", "training", "ctr_contract", "export", "serving")
# Modules run with `python -m` inside .venv-jax or .venv-mlx, which have no torch, lightning or TensorFlow.
FOREIGN_MODULES = ("jax_train", "mlx_train", "jax_forward")


def top_level_project_imports(path: Path) -> set[str]:
    """The project modules `path` imports at module level (what a foreign venv must be able to import)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in PROJECT}
    return found


def test_foreign_workers_import_nothing_that_needs_torch_tensorflow_or_lightning() -> None:
    modules = {"bench.peers.jax_forward"}
    for name in FOREIGN_MODULES:
        modules |= top_level_project_imports(PEERS / f"{name}.py")
    assert "bench.peers.train_worker" in modules
    # None in sys.modules makes `import torch` raise ImportError, as it would in .venv-jax.
    code = (
        "import sys\n"
        "for blocked in ('torch', 'lightning', 'tensorflow', 'onnxruntime'):\n"
        "    sys.modules[blocked] = None\n"
        f"for module in {sorted(modules)!r}:\n"
        "    __import__(module)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_scripts_run_by_path_exist_and_import_nothing_from_the_project() -> None:
    for script in (serving_load.KSERVE_SCRIPT, torchserve_server.HANDLER):
        assert script.is_file(), script
        assert top_level_project_imports(script) == set(), script


def test_training_worker_writes_the_median_run_and_what_the_row_ran_on(tmp_path: Path) -> None:
    features = tmp_path / "features.npz"
    np.savez(features, train_x=np.zeros((4, 2), np.float32), train_y=np.zeros(4, np.float32))
    rates = iter([300.0, 100.0, 200.0])
    calls = []

    def train_once(
        d: dict[str, np.ndarray], epochs: int, batch: int, lr: float, seed: int
    ) -> tuple[float, float]:
        calls.append((sorted(d), epochs, batch, lr, seed))
        return next(rates), 0.75

    out = tmp_path / "demo.json"
    argv = [
        "--features",
        str(features),
        "--epochs",
        "3",
        "--repeats",
        "3",
        "--batch-size",
        "2",
        "--out",
        str(out),
    ]
    worker_main(
        "demo", "Demo worker.", train_once, lambda: {"versions": {"demo": "1.0"}, "device": "cpu"}, argv
    )

    assert calls == [(["train_x", "train_y"], 3, 2, 2e-3, 42)] * 3
    assert json.loads(out.read_text()) == {
        "samples_per_sec": 200.0,
        "samples_per_sec_runs": [300.0, 100.0, 200.0],
        "spread": [100.0, 300.0],
        "val_auc": 0.75,
        "versions": {"demo": "1.0"},
        "device": "cpu",
    }
