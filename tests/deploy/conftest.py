"""Fixtures for the deployment checks: the rendered k8s/ kustomizations and a tiny model repository."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from k8s_render import KUSTOMIZATIONS, kustomize_build
from tiny_model import WIDTH, write_logistic_model


@pytest.fixture(scope="session")
def builds() -> dict[str, list[dict[str, Any]]]:
    """Every kustomization under k8s/, rendered once: path -> objects."""
    return {path: kustomize_build(path) for path in KUSTOMIZATIONS}


@pytest.fixture(scope="module")
def model_repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, float]:
    """A model base path holding version 1 of a logistic model; returns (base path, weights, bias)."""
    base = tmp_path_factory.mktemp("models") / "ctr"
    weights = np.linspace(-0.02, 0.02, WIDTH, dtype=np.float32)
    bias = -1.5
    write_logistic_model(base / "1", weights, bias)
    return base, weights, bias
