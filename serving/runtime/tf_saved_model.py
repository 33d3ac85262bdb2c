"""TensorFlow backend: `<version>/saved_model.pb`, signature `serving_default`. TF is imported here only."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ctr_contract.repository import SAVED_MODEL
from serving.errors import ModelLoadError
from serving.signatures import DEFAULT_SIGNATURE, OUTPUT_NAME, RAW_SIGNATURE, Signature, output_order

SIGNATURE = DEFAULT_SIGNATURE
log = logging.getLogger(__name__)


def import_tensorflow(intra_op_threads: int) -> Any:
    """TensorFlow, its thread pools sized (only the first call, before its runtime starts, can size them)."""
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
        self._tf = tf = import_tensorflow(intra_op_threads)
        try:
            self._loaded = tf.saved_model.load(str(version_dir))
            fn = self._loaded.signatures[SIGNATURE]
        except Exception as exc:  # TF raises many types for corrupt SavedModels
            raise ModelLoadError(f"TensorFlow cannot load {version_dir}: {exc}") from exc
        inputs = fn.structured_input_signature[1]
        outputs = fn.structured_outputs
        order = list(outputs) if len(outputs) == 1 else output_order(outputs)
        if len(inputs) != 1 or order is None:
            raise ModelLoadError(
                f"{SIGNATURE} must have 1 input and 1 output (or several, one of them '{OUTPUT_NAME}'), got "
                f"{list(inputs)} -> {list(outputs)}"
            )
        in_name, in_spec = next(iter(inputs.items()))
        in_shape = in_spec.shape.as_list()
        out_shapes = [outputs[n].shape.as_list() for n in order]
        widths = {int(s[1] or 1) if len(s) == 2 else 0 for s in out_shapes}  # 0: not [N, K]
        if (
            in_spec.dtype != tf.float32
            or len(in_shape) != 2
            or in_shape[1] is None
            or len(widths) != 1
            or 0 in widths
        ):
            raise ModelLoadError(
                f"{SIGNATURE} must map float32 [N, F] to outputs [N, K] of one K; got {in_spec} -> {outputs}"
            )
        self._fn = fn
        self._raw_fn = self._loaded.signatures.get(RAW_SIGNATURE)  # None for versions exported before it
        if self._raw_fn is not None and sorted(self._raw_fn.structured_outputs) != sorted(order):
            raise ModelLoadError(
                f"the {RAW_SIGNATURE} signature outputs {sorted(self._raw_fn.structured_outputs)}, {SIGNATURE} "
                f"{sorted(order)}; the two signatures of a version serve the same outputs: re-export the version"
            )
        self._order = order
        self.signature = Signature(
            in_name, order[0], int(in_shape[1]), widths.pop(), self._raw_fn is not None, tuple(order[1:])
        )

    def close(self) -> None:
        """The version is unloaded: destroy the resources its functions capture (the raw signature's lookup
        tables, the variables). TensorFlow frees a restored table only when told to (tensorflow#61866): each
        unloaded version kept its tables, megabytes a reload (docs/perf/serving-memory.md)."""
        tf = self._tf
        functions = [f for f in (self._fn, self._raw_fn) if f is not None]
        handles = {id(t): t for f in functions for t in f.captured_inputs if t.dtype == tf.resource}
        for handle in handles.values():
            tf.raw_ops.DestroyResourceOp(resource=handle, ignore_lookup_error=True)

    def _scores(self, result: dict[str, Any]) -> np.ndarray:
        """The signature's output dict -> (N, K), or (N, k * K) with its k outputs side by side."""
        if len(self._order) == 1:
            return result[self._order[0]].numpy()
        return np.concatenate([result[n].numpy() for n in self._order], axis=1)

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(N, F) float32 -> (N, K) float32, or (N, k * K) with k outputs (serving/signatures.py)."""
        return self._scores(self._fn(**{self.signature.input_name: self._tf.constant(features)}))

    def predict_raw(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        """The 39 raw fields, each (N,) -> the scores of `predict`, through the `raw` signature."""
        assert self._raw_fn is not None, "predict_raw needs a SavedModel with a raw signature"
        tf = self._tf
        feed = {k: tf.constant(v.tolist() if v.dtype == object else v) for k, v in inputs.items()}
        return self._scores(self._raw_fn(**feed))
