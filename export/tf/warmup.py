"""`assets.extra/tf_serving_warmup_requests`: a TFRecord of PredictionLog records TF Serving replays on load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import RAW_SIGNATURE

WARMUP_BATCHES = (1, 8, 64)  # a few batch sizes so the first real requests hit warm kernels


def write_warmup(
    path: Path,
    features: np.ndarray,
    model_name: str,
    input_name: str,
    signature: str,
    raw: tuple[np.ndarray, np.ndarray] | None = None,
    raw_expected: dict[str, np.ndarray] | None = None,
) -> int:
    """Write one PredictLog per batch size, taking rows from `features` (N, width); then, when `raw` rows
    (numeric float64 (N, 13), categorical str (N, 26)) are given, one per batch size for the `raw` signature.
    `raw_expected`, the raw rows' outputs by FeatureSpec.transform + PyTorch (name -> (N, 1): ctr and
    raw_score), goes into each raw record's response: our server's load compares its raw path with them
    (TF Serving ignores responses).

    Returns:
        the number of records written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for batch in WARMUP_BATCHES:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature)
            )
            request.inputs[input_name].CopyFrom(tf.make_tensor_proto(features[:batch].astype(np.float32)))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
        for batch in WARMUP_BATCHES if raw is not None else ():
            assert raw is not None
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=RAW_SIGNATURE)
            )
            for field, column in zip(NUMERIC_FIELDS, raw[0][:batch].T, strict=True):
                request.inputs[field].CopyFrom(tf.make_tensor_proto(column.astype(np.float64)))
            for field, column in zip(CATEGORICAL_FIELDS, raw[1][:batch].T, strict=True):
                request.inputs[field].CopyFrom(
                    tf.make_tensor_proto([str(v).encode() for v in column], dtype=tf.string)
                )
            response = predict_pb2.PredictResponse()
            for name, scores in (raw_expected or {}).items():
                response.outputs[name].CopyFrom(
                    tf.make_tensor_proto(np.asarray(scores[:batch], np.float32).reshape(-1, 1))
                )
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request, response=response)
            )
            writer.write(log.SerializeToString())
    return len(WARMUP_BATCHES) * (2 if raw is not None else 1)


def read_warmup(path: Path) -> list[prediction_log_pb2.PredictionLog]:
    """Parse the warmup file back (as TF Serving would)."""
    return [
        prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(str(path))
    ]
