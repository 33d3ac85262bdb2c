"""The `raw` signature served by the compiled FeatureSpec and the features model, around a runtime backend.

A version with a raw graph (`model_raw.onnx`, the SavedModel's `raw` signature) and a `feature_spec.json`
serves raw rows as RawTransform (ctr_features/compiled/table.py) then the backend's `serving_default`
model: one float32 input instead of 39 per-field inputs, each of which costs ONNX Runtime a conversion per
call and TF a `tf.constant`. The raw graph stays loaded: stock TF Serving and Triton use it, and a load whose
warm-up records carry no expected scores checks the transform against it (serving/repository/warmup.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ctr_contract.repository import FEATURE_SPEC_PATH
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.compiled.raw_batch import RawBatch
from ctr_features.compiled.table import RawTransform
from serving.errors import ModelLoadError
from serving.runtime.backends import Backend, close_backend


class SpecBackend:
    """`backend` with its `raw` signature run as RawTransform + `backend.predict`."""

    def __init__(self, backend: Backend, transform: RawTransform) -> None:
        self.backend, self.transform = backend, transform
        self.signature, self.runtime = backend.signature, backend.runtime

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(N, F) float32 -> (N, K) float32: the runtime backend's model."""
        return self.backend.predict(features)

    def predict_batch(self, batch: RawBatch) -> np.ndarray:
        """A RawBatch -> (N, K) float32 through the transform and the features model (the serving path)."""
        return self.backend.predict(self.transform(batch))

    def predict_raw(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The 39 raw fields, each (N,) -> (N, K) float32, through the transform (Backend's raw call)."""
        numeric = np.stack([np.asarray(inputs[f], np.float64) for f in NUMERIC_FIELDS])
        categorical = np.stack([np.asarray(inputs[f], object) for f in CATEGORICAL_FIELDS])
        return self.predict_batch(RawBatch(numeric, categorical))

    def close(self) -> None:
        """The version is unloaded: the runtime backend lets go of what it must free by hand."""
        close_backend(self.backend)

    def predict_raw_graph(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The same rows through the version's raw graph (the reference when warm-up has no expected scores)."""
        return self.backend.predict_raw(inputs)


def with_spec_transform(backend: Backend, version_dir: Path) -> Backend:
    """`backend` serving `raw` through the FeatureSpec when the version has a raw graph and a spec, else itself."""
    path = version_dir / FEATURE_SPEC_PATH
    if not backend.signature.has_raw or not path.is_file():
        return backend
    try:
        return SpecBackend(backend, RawTransform.load(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a spec this serving code cannot read
        raise ModelLoadError(f"cannot read the feature spec {path}: {exc}") from exc
