"""v2 gRPC (`inference.GRPCInferenceService`, with tritonclient.grpc and its stub) and `grpc.health.v1.Health`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from tests.serving.raw_model_repo import fit_spec, seen_values, write_raw_version
from tests.serving.server_process import ServerProcess, http
from tests.serving.v2_inputs import FEATURES, raw_columns, v1_predictions

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def spec_and_seen() -> tuple[FeatureSpec, list[str]]:
    spec = fit_spec()
    return spec, seen_values(spec)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spec_and_seen) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("v2grpc") / "ctr"
    write_raw_version(base, 1, spec_and_seen[0])
    proc = ServerProcess(base, tmp_path_factory.mktemp("logs") / "server.log", "--enable_batching")
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(server.grpc_target)
    yield c
    c.close()


def test_health_and_metadata_over_tritonclient_grpc(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("ctr") and client.is_model_ready("ctr_raw", "1")
    assert not client.is_model_ready("ctr", "7")
    assert client.get_server_metadata(as_json=True) == {
        "name": "ctr-pipeline",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"],
    }
    assert client.get_model_metadata("ctr", as_json=True) == {
        "name": "ctr",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": ["-1", "128"]}],
        "outputs": [{"name": "ctr", "datatype": "FP32", "shape": ["-1", "1"]}],
    }


def test_infer_with_raw_input_contents_matches_v1(
    server: ServerProcess, client: triton.InferenceServerClient
) -> None:
    tensor = triton.InferInput("features", list(FEATURES.shape), "FP32")
    tensor.set_data_from_numpy(FEATURES)  # tritonclient sends raw_input_contents
    result = client.infer("ctr", [tensor], request_id="g-1", outputs=[triton.InferRequestedOutput("ctr")])
    assert result.get_response().id == "g-1"
    assert result.get_response().model_version == "1"
    np.testing.assert_array_equal(
        result.as_numpy("ctr"), v1_predictions(server, {"instances": FEATURES.tolist()})
    )


def test_infer_with_typed_contents_and_raw_output_contents(server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="ctr", id="typed")
    tensor = request.inputs.add(name="features", datatype="FP32", shape=[2, 128])
    tensor.contents.fp32_contents.extend(FEATURES[:2].ravel().tolist())
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert (response.model_name, response.model_version, response.id) == ("ctr", "1", "typed")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("ctr", "FP32", [2, 1])]
    scores = np.frombuffer(response.raw_output_contents[0], "<f4")
    np.testing.assert_array_equal(
        scores, v1_predictions(server, {"instances": FEATURES[:2].tolist()}).ravel()
    )


def test_ctr_raw_equals_v1_raw_predictions(
    server: ServerProcess, client: triton.InferenceServerClient, spec_and_seen
) -> None:
    columns, rows = raw_columns(spec_and_seen[1])
    tensors = []
    for name, values in columns.items():
        tensor = triton.InferInput(name, [2], "FP64" if name in NUMERIC_FIELDS else "BYTES")
        tensor.set_data_from_numpy(values)
        tensors.append(tensor)
    scores = client.infer("ctr_raw", tensors).as_numpy("ctr")
    np.testing.assert_array_equal(
        scores, v1_predictions(server, {"signature_name": "raw", "instances": rows})
    )


def _infer_error(
    client: triton.InferenceServerClient, model: str, tensors: list[triton.InferInput]
) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, tensors)
    return str(caught.value.status()), caught.value.message()


def test_errors_carry_the_v1_status_codes(client: triton.InferenceServerClient) -> None:
    wide = triton.InferInput("features", [1, 127], "FP32")
    wide.set_data_from_numpy(np.zeros((1, 127), np.float32))
    assert _infer_error(client, "ctr", [wide]) == (
        "StatusCode.INVALID_ARGUMENT",
        "input 'features' has shape [1, 127], expected [N, 128]",
    )
    assert _infer_error(client, "nope", [wide]) == (
        "StatusCode.NOT_FOUND",
        "Request for unknown model: 'nope' is not found",
    )
    text = triton.InferInput("C4", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"ok", b"\xed\xa0\x80"], dtype=object))  # a UTF-8-encoded surrogate
    assert _infer_error(client, "ctr_raw", [text]) == (
        "StatusCode.INVALID_ARGUMENT",
        "row 1 field 'C4' is b'\\xed\\xa0\\x80', not UTF-8 text; send UTF-8 strings",
    )
    huge = triton.InferInput("features", [1, 128], "FP32")
    huge.set_data_from_numpy(np.full((1, 128), 3e38, np.float32))
    status, message = _infer_error(client, "ctr", [huge])
    assert status == "StatusCode.INTERNAL"
    assert message.startswith("the model's output for row 0 is nan (not finite; 1 of 1 rows)")


def test_stock_health_client_checks_the_server_and_each_model(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == SERVING
        assert stub.Check(health_pb2.HealthCheckRequest(service="ctr"), timeout=5).status == SERVING
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_turns_serving_once_a_version_loads(tmp_path: Path, spec_and_seen) -> None:
    base = tmp_path / "ctr"
    base.mkdir()
    proc = ServerProcess(base, tmp_path / "server.log", "--file_system_poll_wait_seconds=1")
    try:
        client = triton.InferenceServerClient(proc.grpc_target)
        with grpc.insecure_channel(proc.grpc_target) as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            stub = health_pb2_grpc.HealthStub(channel)
            assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == NOT_SERVING
            assert not client.is_server_ready() and client.is_server_live()
            assert http(proc.url("/v2/health/ready")) == (503, {"ready": False})
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
            seen = [next(watch).status]
            threading.Thread(target=write_raw_version, args=(base, 1, spec_and_seen[0])).start()
            seen.append(next(watch).status)
            watch.cancel()
        assert seen == [NOT_SERVING, SERVING]
        assert client.is_server_ready()
        client.close()
    finally:
        proc.stop()


def test_raw_model_lists_every_criteo_field(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("ctr_raw", as_json=True)
    assert [i["name"] for i in meta["inputs"]] == [*NUMERIC_FIELDS, *CATEGORICAL_FIELDS]
    assert {i["datatype"] for i in meta["inputs"][:13]} == {"FP64"}
    assert {i["datatype"] for i in meta["inputs"][13:]} == {"BYTES"}
