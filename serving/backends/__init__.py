"""Inference backends: ONNX Runtime (default) and TensorFlow SavedModel (optional, imported lazily)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

BACKENDS = ("onnx", "tf")


@dataclass(frozen=True)
class Signature:
    """The `serving_default` signature: one float input [-1, n_features] and one float output [-1, 1]."""

    input_name: str
    output_name: str
    n_features: int
    output_width: int


class Backend(Protocol):
    """A loaded model version that maps a float32 batch (N, F) to scores (N, 1)."""

    signature: Signature
    runtime: str  # label value of `:tensorflow:serving:runtime_latency`

    def predict(self, features: np.ndarray) -> np.ndarray: ...


def load_backend(kind: str, version_dir: Path, intra_op_threads: int) -> Backend:
    """Load one version folder with the chosen backend.

    Args:
        kind: "onnx" (model.onnx via ONNX Runtime) or "tf" (saved_model.pb via TensorFlow).
        version_dir: `<model_base_path>/<N>`.
        intra_op_threads: threads for one inference call (1 = one core per request batch).
    Returns:
        the loaded backend; raises ModelLoadError when the files are missing or do not fit the contract.
    """
    if kind == "onnx":
        from serving.backends.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(version_dir / "model.onnx", intra_op_threads)
    if kind == "tf":
        from serving.backends.tf_saved_model import SavedModelBackend

        return SavedModelBackend(version_dir, intra_op_threads)
    raise ValueError(f"unknown backend {kind!r}; expected one of {BACKENDS}")
