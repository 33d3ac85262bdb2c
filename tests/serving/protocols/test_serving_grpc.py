"""gRPC against a real server with the stock tensorflow-serving-api stubs and TF's own tensor helpers."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from tests.serving.model_repo import reference_predict
from tests.serving.server_process import ServerProcess, http

ROWS = np.random.default_rng(1).random((5, 128), dtype=np.float32)


@pytest.fixture(scope="module")
def channel(shared_server: ServerProcess):
    with grpc.insecure_channel(shared_server.grpc_target) as ch:
        yield ch


def _request(features: np.ndarray, name: str = "ctr") -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = "serving_default"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
    return request


def _scalar_fill_request(rows: int) -> predict_pb2.PredictRequest:
    """A [rows, 128] tensor given by one float_val (TF's fill form): a few bytes that declare many rows."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    tensor = request.inputs["features"]
    tensor.dtype = tf.float32.as_datatype_enum
    tensor.tensor_shape.dim.add().size = rows
    tensor.tensor_shape.dim.add().size = 128
    tensor.float_val.append(0.5)
    return request


def test_stock_client_predict_gets_ctr_output(channel, weights) -> None:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    response = stub.Predict(_request(ROWS), timeout=10)
    assert list(response.outputs) == ["ctr"]
    scores = tf.make_ndarray(response.outputs["ctr"])
    assert scores.shape == (5, 1)
    np.testing.assert_allclose(scores, reference_predict(weights[1], ROWS), atol=1e-6)
    assert (response.model_spec.name, response.model_spec.version.value) == ("ctr", 1)


def test_predict_accepts_float_val_tensors_and_version_label(channel, weights) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.version_label = "stable"
    tensor = request.inputs["features"]
    tensor.dtype = tf.float32.as_datatype_enum
    tensor.tensor_shape.dim.add().size = 2
    tensor.tensor_shape.dim.add().size = 128
    tensor.float_val.extend(ROWS[:2].ravel().tolist())
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
    np.testing.assert_allclose(
        tf.make_ndarray(response.outputs["ctr"]), reference_predict(weights[1], ROWS[:2]), atol=1e-6
    )


@pytest.mark.parametrize(
    ("request_factory", "code", "details"),
    [
        (
            lambda: _request(ROWS, name="foo"),
            grpc.StatusCode.NOT_FOUND,
            "Servable not found for request: Latest(foo)",
        ),
        (
            lambda: _request(ROWS[:, :100]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input 'features' has shape [5, 100], expected [N, 128]",
        ),
        (
            lambda: _request(np.where(np.arange(128) == 3, np.nan, ROWS[:1]).astype(np.float32)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "row 0 feature 3 is nan (not finite in float32); NaN and Inf are rejected "
            "(start the server with --allow_nonfinite to accept them)",
        ),
        (
            lambda: _request(ROWS.astype(np.float64)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input 'features' expects dtype DT_FLOAT, got DT_DOUBLE",
        ),
        (  # must be refused before 512 GB are allocated
            lambda: _scalar_fill_request(10**9),
            grpc.StatusCode.INVALID_ARGUMENT,
            "batch of 1000000000 rows is over the limit of 1024 (--max_instances); split it",
        ),
        (
            lambda: _scalar_fill_request(2**62),
            grpc.StatusCode.INVALID_ARGUMENT,
            "input 'features' shape [4611686018427387904, 128] is too large",
        ),
    ],
    ids=["unknown-model", "wrong-shape", "nan", "wrong-dtype", "huge-fill", "overflowing-shape"],
)
def test_predict_errors_map_to_grpc_codes(channel, request_factory, code, details) -> None:
    with pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request_factory(), timeout=10)
    assert (info.value.code(), info.value.details()) == (code, details)


def test_get_model_metadata_packs_signature_def_map(channel) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "ctr"
    response = prediction_service_pb2_grpc.PredictionServiceStub(channel).GetModelMetadata(
        request, timeout=10
    )
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(sig_map)
    sig = sig_map.signature_def["serving_default"]
    assert [d.size for d in sig.inputs["features"].tensor_shape.dim] == [-1, 128]
    assert [d.size for d in sig.outputs["ctr"].tensor_shape.dim] == [-1, 1]
    assert sig.inputs["features"].dtype == tf.float32.as_datatype_enum
    assert response.model_spec.version.value == 1


def test_get_model_status_reports_available(channel) -> None:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "ctr"
    response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=10)
    assert [(s.version, s.state, s.status.error_code) for s in response.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)
    ]


def test_client_deadline_is_counted_as_cancelled_not_internal(start_server, model_repo) -> None:
    # A 2 s batching window holds the request until the client's 0.3 s deadline has passed.
    server = start_server(model_repo, "--enable_batching", "--batch_timeout_micros=2000000")
    with grpc.insecure_channel(server.grpc_target) as ch, pytest.raises(grpc.RpcError) as info:
        prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict(_request(ROWS[:1]), timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    counts: dict[str, str] = {}
    deadline = time.monotonic() + 10
    while "CANCELLED" not in counts and time.monotonic() < deadline:  # the server sees the cancel a bit later
        _, text = http(server.url("/metrics"))
        prefix = ':tensorflow:serving:request_count{model_name="ctr",status="'
        counts = dict(
            line[len(prefix) :].split('"} ') for line in text.splitlines() if line.startswith(prefix)
        )
        time.sleep(0.05)
    assert counts == {"CANCELLED": "1"}
