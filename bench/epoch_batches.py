"""The batches of one epoch for the foreign training rows (JAX, MLX): numpy only, as `ShuffledBatches` cuts them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np


def batch_indices(n: int, batch_size: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """One epoch of a fresh permutation in ceil(n / batch_size) near-equal batches (the same step count as torch)."""
    perm = rng.permutation(n)
    n_batches = -(-n // batch_size)
    bounds = (np.arange(n_batches + 1) * n) // n_batches
    for a, b in itertools.pairwise(bounds):
        yield perm[a:b]
