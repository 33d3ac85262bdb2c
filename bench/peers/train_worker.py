"""What the foreign training workers (JAX, MLX) share: an epoch's batches and the command line around a run.

Numpy and the standard library only: this runs in `.venv-jax` and `.venv-mlx`, which have no torch.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

# train_once(arrays, epochs, batch_size, lr, seed) -> (samples/s over the epochs after the first, val AUC)
TrainOnce = Callable[[dict[str, np.ndarray], int, int, float, int], tuple[float, float]]


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """One epoch of a fresh permutation in ceil(n / batch_size) near-equal batches (the same step count as torch)."""
    perm = rng.permutation(n)
    n_batches = -(-n // batch_size)
    bounds = (np.arange(n_batches + 1) * n) // n_batches
    for a, b in itertools.pairwise(bounds):
        yield perm[a:b]


def worker_main(
    name: str, doc: str, train_once: TrainOnce, about: Callable[[], dict[str, Any]], argv: list[str] | None
) -> None:
    """`python -m bench.peers.<name>_train --features F --out J`: repeat `train_once`, write the median as JSON.

    Args:
        name: the framework's short name, e.g. "jax" (the module is `bench.peers.<name>_train`).
        doc: the module's docstring (its first line is the description).
        train_once: one training run from fresh weights.
        about: the row's `versions` and `device`, asked once the runs are done.
    """
    p = argparse.ArgumentParser(prog=f"python -m bench.peers.{name}_train", description=doc.splitlines()[0])
    p.add_argument(
        "--features", type=Path, required=True, help="features.npz of bench.sections.training_throughput"
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    d = dict(np.load(args.features))
    runs, auc = [], float("nan")
    for _ in range(args.repeats):
        rate, auc = train_once(d, args.epochs, args.batch_size, args.lr, args.seed)
        runs.append(round(rate, 1))
        print(f"{name}: {rate:.0f} samples/s, val AUC {auc:.4f}", flush=True)
    result = {
        "samples_per_sec": float(np.median(runs)),
        "samples_per_sec_runs": runs,
        "spread": [min(runs), max(runs)],
        "val_auc": auc,
        **about(),
    }
    args.out.write_text(json.dumps(result))
