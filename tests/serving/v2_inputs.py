"""Inputs shared by the v2 protocol tests: feature rows, raw rows in v2 columns and v1 instances, v1 answers."""

from __future__ import annotations

from typing import Any

import numpy as np

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from tests.serving.server_process import ServerProcess, http

FEATURES = np.random.default_rng(5).random((3, 128), np.float32)


def raw_columns(seen: list[str]) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """Two raw rows as v2 columns (FP64 with NaN = missing, BYTES) and as v1 raw instances."""
    numeric = {f: np.array([i * 3.0, np.nan]) for i, f in enumerate(NUMERIC_FIELDS)}
    categorical = {
        f: np.array([seen[j % 2].encode(), b""], dtype=object) for j, f in enumerate(CATEGORICAL_FIELDS)
    }
    rows: list[dict[str, Any]] = [
        {**{f: int(v[0]) for f, v in numeric.items()}, **{f: v[0].decode() for f, v in categorical.items()}},
        {},
    ]
    return {**numeric, **categorical}, rows


def v1_predictions(server: ServerProcess, body: dict[str, Any]) -> np.ndarray:
    status, answer = http(server.url("/v1/models/ctr:predict"), body)
    assert status == 200, answer
    return np.asarray(answer["predictions"], np.float32)
