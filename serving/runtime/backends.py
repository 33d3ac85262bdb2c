"""Inference backends: ONNX Runtime (default) and TensorFlow SavedModel (optional, imported lazily)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from ctr_contract.repository import ONNX_MODEL
from serving.signatures import Signature

BACKENDS = ("onnx", "tf")


class Backend(Protocol):
    """A loaded model version that maps a float32 batch (N, F) to scores (N, 1)."""

    signature: Signature
    runtime: str  # label value of `:tensorflow:serving:runtime_latency`

    def predict(self, features: np.ndarray) -> np.ndarray: ...

    def predict_raw(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The `raw` signature: I* float64 (N,), C* str (N,) -> (N, 1); only when `signature.has_raw`."""
        ...


def close_backend(backend: Backend) -> None:
    """Free what an unloaded backend's runtime does not free by itself (TensorFlow's lookup tables); most
    backends have nothing to free: reference counting does it."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


def import_runtime(kind: str, intra_op_threads: int) -> None:
    """Import the backend's runtime (ONNX Runtime, or TensorFlow) before any version loads: the server freezes
    what exists then out of the garbage collector's sight (serving/app/server.py), and the versions must not be
    among it."""
    if kind == "onnx":
        import serving.runtime.onnx_runtime  # noqa: F401  # the import is the point
    elif kind == "tf":
        from serving.runtime.tf_saved_model import import_tensorflow

        import_tensorflow(intra_op_threads)


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
        from serving.runtime.onnx_runtime import OnnxRuntimeBackend

        return OnnxRuntimeBackend(version_dir / ONNX_MODEL, intra_op_threads)
    if kind == "tf":
        from serving.runtime.tf_saved_model import SavedModelBackend

        return SavedModelBackend(version_dir, intra_op_threads)
    raise ValueError(f"unknown backend {kind!r}; expected one of {BACKENDS}")
