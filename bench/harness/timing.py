"""The in-process latency loop every backend shares; numpy only, as it also runs in `.venv-jax`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def time_calls(predict: Callable[[np.ndarray], Any], x: np.ndarray, calls: int) -> np.ndarray:
    """Wall time of each of `calls` calls of `predict(x)`, in ms."""
    out = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter()
        predict(x)
        out[i] = (time.perf_counter() - t0) * 1e3
    return out
