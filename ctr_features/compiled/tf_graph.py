"""The FeatureSpec as TF ops: the SavedModel's `raw` signature beside `serving_default`.

The same computation as `ctr_features.compiled.onnx_graph`, in standard TF ops only (one
`tf.lookup.StaticHashTable` keyed "field\\0value" for all fields), so stock TF Serving runs it with no custom
op. Inputs: I1..I13 float64 (N,) with NaN = missing, C1..C26 string (N,) with "" = missing. The table is
saved with the SavedModel. The model part is any `tf.Module` whose `serve` tf.function maps the features to
the model's outputs, `ctr` and `raw_score` (export's ONNX translator makes it: export/tf/translator.py), so this module needs
nothing of export.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import DEFAULT_SIGNATURE, OUTPUT_NAMES, RAW_SIGNATURE
from ctr_features.compiled.onnx_graph import field_entries
from ctr_features.layout import N_NUM
from ctr_features.spec import FeatureSpec


def raw_specs() -> list[tf.TensorSpec]:
    """The `raw` signature's inputs, named after the Criteo fields."""
    return [tf.TensorSpec([None], tf.float64, name=f) for f in NUMERIC_FIELDS] + [
        tf.TensorSpec([None], tf.string, name=f) for f in CATEGORICAL_FIELDS
    ]


class RawFeatures(tf.Module):
    """The FeatureSpec's numbers and tables as TF constants and one hash table; call it on the 39 fields."""

    def __init__(self, spec: FeatureSpec) -> None:
        super().__init__(name="feature_spec")
        self._n_buckets = spec.buckets
        self._clip = spec.clip
        self.mean = tf.constant(np.array(spec.mean)[:, None], tf.float64)  # (13, 1): field-major
        self.std = tf.constant(np.array(spec.std)[:, None], tf.float64)
        # One table for all fields, keyed "field\0value" (field names hold no NUL, so keys are unique): one
        # lookup per call instead of two per field. Rows index the lift and bucket columns; the last row
        # (lift 0, bucket OOV) is every value the field's tables do not hold.
        entries = field_entries(spec)
        keys = [f"{CATEGORICAL_FIELDS[j]}\0{value}".encode() for j, value, _, _ in entries] or [b"\0"]
        init = tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys, tf.string), tf.constant(np.arange(len(keys), dtype=np.int64))
        )
        self.table = tf.lookup.StaticHashTable(init, default_value=tf.constant(len(entries), tf.int64))
        self.lift = tf.constant(np.array([e[2] for e in entries] + [0.0]).astype(np.float32))
        self.bucket = tf.constant(np.array([e[3] for e in entries] + [spec.buckets], np.int64))
        self.prefixes = tf.constant([[f"{f}\0".encode()] for f in CATEGORICAL_FIELDS], tf.string)  # (26, 1)

    def __call__(self, *fields: tf.Tensor) -> tf.Tensor:
        """The 39 fields -> features float32 (N, width), exactly `FeatureSpec.transform`."""
        numeric, categorical = fields[:N_NUM], fields[N_NUM:]
        x = tf.stack(numeric, axis=0)  # (13, N) float64
        missing = tf.logical_not(tf.math.is_finite(x))
        xc = tf.where(missing, tf.zeros_like(x), x)
        z = (tf.sign(xc) * tf.math.log1p(tf.abs(xc)) - self.mean) / self.std
        z = tf.clip_by_value(tf.where(missing, tf.zeros_like(z), z), -self._clip, self._clip)
        values = tf.stack(categorical, axis=0)  # (26, N)
        row = self.table.lookup(tf.strings.join([tf.broadcast_to(self.prefixes, tf.shape(values)), values]))
        lift = tf.gather(self.lift, row)  # (26, N)
        counts = tf.reduce_sum(tf.one_hot(tf.gather(self.bucket, row), self._n_buckets + 1), axis=0)
        # (HASH_START, N): z-scores, missing indicators, lifts
        dense = tf.concat([tf.cast(z, tf.float32), tf.cast(missing, tf.float32), lift], axis=0)
        return tf.concat([tf.transpose(dense), counts], axis=1)


class RawModule(tf.Module):
    """The model module plus the FeatureSpec; `serve_raw` is the tf.function behind `raw`, with the same outputs
    as the model's `serve` (both signatures give ctr and raw_score)."""

    def __init__(self, model: tf.Module, spec: FeatureSpec) -> None:
        """`model`: a tf.Module whose `serve` tf.function maps features (N, width) to {name: (N, 1)} for names
        among OUTPUT_NAMES."""
        super().__init__(name="raw_model")
        self.model = model
        self.features = RawFeatures(spec)
        self.serve_raw = tf.function(self._run_raw, input_signature=raw_specs())

    def _run_raw(self, *fields: tf.Tensor) -> dict[str, tf.Tensor]:
        outputs = self.model.serve(self.features(*fields))
        return {name: outputs[name] for name in OUTPUT_NAMES if name in outputs}


def save_with_raw(model: tf.Module, spec: FeatureSpec, directory: Path) -> None:
    """Write a SavedModel with `serving_default` (the model's `serve`: features) and `raw` (the 39 fields)."""
    module = RawModule(model, spec)
    signatures = {
        DEFAULT_SIGNATURE: model.serve.get_concrete_function(),
        RAW_SIGNATURE: module.serve_raw.get_concrete_function(),
    }
    tf.saved_model.save(module, str(directory), signatures=signatures)
