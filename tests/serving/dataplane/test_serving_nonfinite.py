"""No NaN prediction leaves the server, and no lone surrogate reaches the model: REST and gRPC, one shared server."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.serving.raw_model_repo import fit_spec, write_raw_version
from tests.serving.server_process import ServerProcess, http

# A row of 3e38 is finite in float32, so the input check passes it; the first layer overflows to inf and the
# next one turns inf - inf into NaN.
HUGE = 3e38
NONFINITE_REST = (
    "the model's output for instance 1 is nan (not finite; 2 of 3 instances), so no prediction is returned; "
    "instance 1 is outside what the model handles (e.g. features near the float32 limit): scale its features "
    "into the range the model was trained on"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("nonfinite") / "ctr"
    write_raw_version(base, 1, fit_spec())
    proc = ServerProcess(base, tmp_path_factory.mktemp("logs") / "server.log", "--enable_batching")
    proc.wait_ready()
    yield proc
    proc.stop()


def _rows() -> np.ndarray:
    rows = np.full((3, 128), HUGE, np.float32)
    rows[0] = 0.5
    return rows


def _nonfinite_count(server: ServerProcess) -> float:
    _, text = http(server.url("/metrics"))
    series = 'ctr_serving_nonfinite_outputs_total{model_name="ctr"} '
    values = [float(line[len(series) :]) for line in str(text).splitlines() if line.startswith(series)]
    return values[0] if values else 0.0


def test_rest_nonfinite_output_is_a_500_naming_the_instance_and_counted(server: ServerProcess) -> None:
    before = _nonfinite_count(server)
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": _rows().tolist()})
    assert (status, body) == (500, {"error": NONFINITE_REST})
    assert _nonfinite_count(server) == before + 2
    ok, good = http(server.url("/v1/models/ctr:predict"), {"instances": _rows()[:1].tolist()})
    assert ok == 200 and np.isfinite(good["predictions"]).all()


def test_grpc_nonfinite_output_is_internal_naming_the_row(server: ServerProcess) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    rows = _rows()
    request.inputs["features"].dtype = 1  # DT_FLOAT
    for d in rows.shape:
        request.inputs["features"].tensor_shape.dim.add().size = d
    request.inputs["features"].tensor_content = rows.tobytes()
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert caught.value.details() == NONFINITE_REST.replace("instance", "row")


def test_rest_lone_surrogate_is_a_400_naming_the_field(server: ServerProcess) -> None:
    body = b'{"instances": [{"I1": 1}, {"I1": 2, "C3": "ab\\ud800"}]}'
    status, answer = http(server.url("/v1/models/ctr:predict"), raw=body)
    assert (status, answer) == (
        400,
        {
            "error": "instance 1 field 'C3' holds \\ud800 at character 2, a lone UTF-16 surrogate that is not "
            "text; send valid Unicode (a surrogate pair or the character itself)"
        },
    )


def test_rest_columnar_lone_surrogate_is_a_400_naming_the_field(server: ServerProcess) -> None:
    body = b'{"signature_name": "raw", "inputs": {"C1": ["x", "\\udfff"]}}'
    status, answer = http(server.url("/v1/models/ctr:predict"), raw=body)
    assert status == 400
    assert answer["error"].startswith("instance 1 field 'C1' holds \\udfff at character 0")


def test_grpc_undecodable_string_is_invalid_argument_naming_the_field(server: ServerProcess) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.signature_name = "raw"
    tensor = request.inputs["C2"]
    tensor.dtype = 7  # DT_STRING
    tensor.tensor_shape.dim.add().size = 2
    tensor.string_val.extend([b"ok", b"\xed\xa0\x80"])  # a surrogate encoded as UTF-8: not valid UTF-8
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        caught.value.details() == "row 1 field 'C2' is b'\\xed\\xa0\\x80', not UTF-8 text; send UTF-8 strings"
    )


def test_rest_single_row_nonfinite_output_is_a_500_too(server: ServerProcess) -> None:
    # One row's few scores are checked without numpy (serving/runtime/batcher.py, all_finite).
    before = _nonfinite_count(server)
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": _rows()[1:2].tolist()})
    message = NONFINITE_REST.replace("instance 1 is", "instance 0 is").replace("2 of 3", "1 of 1")
    assert (status, body) == (500, {"error": message})
    assert _nonfinite_count(server) == before + 1
