"""TensorFlow backend: `<version>/saved_model.pb`, signature `serving_default`. TF is imported here only."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.repository import SAVED_MODEL
from serving.errors import ModelLoadError
from serving.signatures import DEFAULT_SIGNATURE, RAW_SIGNATURE, Signature

SIGNATURE = DEFAULT_SIGNATURE
log = logging.getLogger(__name__)


def _import_tensorflow(intra_op_threads: int) -> Any:
    import tensorflow as tf  # heavy and optional: only `--backend tf` reaches this line

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError as exc:
        # TF's runtime is already initialised (a second version loading): its thread pools stay as they are.
        log.warning("TensorFlow thread settings unchanged: %s", exc)
    return tf


class SavedModelBackend:
    """Runs the SavedModel's `serving_default` concrete function."""

    runtime = "TF2"

    def __init__(self, version_dir: Path, intra_op_threads: int) -> None:
        if not (version_dir / SAVED_MODEL).is_file():
            raise ModelLoadError(f"{version_dir / 'saved_model.pb'} does not exist")
        self._tf = tf = _import_tensorflow(intra_op_threads)
        try:
            self._loaded = tf.saved_model.load(str(version_dir))
            fn = self._loaded.signatures[SIGNATURE]
        except Exception as exc:  # TF raises many types for corrupt SavedModels
            raise ModelLoadError(f"TensorFlow cannot load {version_dir}: {exc}") from exc
        inputs = fn.structured_input_signature[1]
        outputs = fn.structured_outputs
        if len(inputs) != 1 or len(outputs) != 1:
            raise ModelLoadError(
                f"{SIGNATURE} must have 1 input and 1 output, got {list(inputs)} -> {list(outputs)}"
            )
        (in_name, in_spec), (out_name, out_spec) = next(iter(inputs.items())), next(iter(outputs.items()))
        in_shape, out_shape = in_spec.shape.as_list(), out_spec.shape.as_list()
        if in_spec.dtype != tf.float32 or len(in_shape) != 2 or in_shape[1] is None or len(out_shape) != 2:
            raise ModelLoadError(
                f"{SIGNATURE} must map float32 [N, F] to [N, K]; got {in_spec} -> {out_spec}"
            )
        self._fn = fn
        self._raw_fn = self._loaded.signatures.get(RAW_SIGNATURE)  # None for versions exported before it
        self.signature = Signature(
            in_name, out_name, int(in_shape[1]), int(out_shape[1] or 1), self._raw_fn is not None
        )

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(N, F) float32 -> (N, K) float32."""
        result = self._fn(**{self.signature.input_name: self._tf.constant(features)})
        return result[self.signature.output_name].numpy()

    def predict_raw(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The 39 raw fields, each (N,) -> (N, K) float32, through the `raw` signature."""
        assert self._raw_fn is not None, "predict_raw needs a SavedModel with a raw signature"
        tf = self._tf
        feed = {k: tf.constant(v.tolist() if v.dtype == object else v) for k, v in inputs.items()}
        return self._raw_fn(**feed)[self.signature.output_name].numpy()
