"""Client mistakes stay client errors: exact 400 / INVALID_ARGUMENT answers, no traceback, a log that cannot flood."""

from __future__ import annotations

import logging
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from ctr_contract.ratelog import RateLimitedLog
from tests.serving.server_process import ServerProcess, http

ROW = [0.25] * 128
MAX_INT64 = 2**63 - 1


def _with(row: list[object], j: int, value: object) -> list[object]:
    return [*row[:j], value, *row[j + 1 :]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            {"instances": [ROW, _with(ROW, 5, True)]},
            "instance 1 feature 5 is true (bool), expected a number",
            id="bool-among-numbers",
        ),
        pytest.param(
            {"inputs": {"features": [_with(ROW, 0, False)]}},
            "instance 0 feature 0 is false (bool), expected a number",
            id="columnar-bool",
        ),
        pytest.param(
            {"instances": [{"features": _with(ROW, 127, True)}]},
            "instance 0 feature 127 is true (bool), expected a number",
            id="named-instance-bool",
        ),
        pytest.param(
            {"instances": [[True] * 128]},
            "instance 0 feature 0 is true (bool), expected a number",
            id="all-bool",
        ),
    ],
)
def test_predict_rejects_booleans_like_any_other_non_number(
    shared_server: ServerProcess, body: object, message: str
) -> None:
    assert http(shared_server.url("/v1/models/ctr:predict"), body) == (400, {"error": message})


def test_predict_accepts_true_inside_a_string_field(shared_server: ServerProcess) -> None:
    body = {"signature_name": "serving_default", "instances": [ROW]}
    status, answer = http(shared_server.url("/v1/models/ctr:predict"), body)
    assert status == 200 and len(answer["predictions"]) == 1
    status, answer = http(shared_server.url("/v1/models/ctr/labels/true:predict"), body)
    assert (status, answer) == (400, {"error": "Unrecognized servable version label: true"})


def test_grpc_rejects_a_boolean_tensor(shared_server: ServerProcess) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(np.ones((1, 128), dtype=bool)))
    with grpc.insecure_channel(shared_server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "input 'features' expects dtype DT_FLOAT, got DT_BOOL"


@pytest.mark.parametrize(
    "method",
    [
        "/tensorflow.serving.PredictionService/Predict",
        "/tensorflow.serving.PredictionService/GetModelMetadata",
        "/tensorflow.serving.ModelService/GetModelStatus",
    ],
)
def test_grpc_bytes_that_do_not_decode_are_invalid_argument(
    shared_server: ServerProcess, method: str
) -> None:
    with grpc.insecure_channel(shared_server.grpc_target) as channel:
        call = channel.unary_unary(method)  # no serializers: the bytes go out as they are
        with pytest.raises(grpc.RpcError) as info:
            call(b"\xff\xff\xff\xff", timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("cannot decode the request: Error parsing message")


FIT = f"version must be an integer from 1 to {MAX_INT64} without leading zeros, got"


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("7" * 5000, f"{FIT} '{'7' * 40}... (5000 characters)'"),
        (str(MAX_INT64 + 1), f"{FIT} '{MAX_INT64 + 1}'"),
        ("01", f"{FIT} '01'"),
        ("0", f"{FIT} '0'"),
    ],
)
def test_url_version_that_does_not_fit_is_400_without_a_traceback(
    shared_server: ServerProcess, version: str, message: str
) -> None:
    for path in (f"/v1/models/ctr/versions/{version}:predict", f"/v1/models/ctr/versions/{version}"):
        assert http(shared_server.url(path), {"instances": [ROW]} if "predict" in path else None) == (
            400,
            {"error": message},
        )
    assert "Traceback" not in shared_server.log()


def test_url_version_at_int64_max_is_a_plain_not_found(shared_server: ServerProcess) -> None:
    status, body = http(
        shared_server.url(f"/v1/models/ctr/versions/{MAX_INT64}:predict"), {"instances": [ROW]}
    )
    assert (status, body) == (404, {"error": f"Servable not found for request: Specific(ctr, {MAX_INT64})"})


def test_rate_limited_log_keeps_a_burst_per_period_and_counts_the_rest(caplog) -> None:
    limited = RateLimitedLog(logging.getLogger("test.limited"), burst=3, period_s=0.3)
    with caplog.at_level(logging.ERROR, logger="test.limited"):
        logged = [limited.log(logging.ERROR, "client", "bad request %d", i) for i in range(10)]
        limited.log(logging.ERROR, "other", "another kind")
        time.sleep(0.35)
        limited.log(logging.ERROR, "client", "bad request %d", 10)
    assert logged == [True] * 3 + [False] * 7
    assert [r.getMessage() for r in caplog.records] == [
        "bad request 0",
        "bad request 1",
        "bad request 2",
        "another kind",
        "bad request 10 (7 similar lines suppressed)",
    ]
