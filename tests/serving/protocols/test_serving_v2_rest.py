"""Open Inference Protocol v2 over REST, with the real tritonclient.http and plain HTTP: one shared server."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from ctr_contract.schema import NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from tests.serving.raw_model_repo import fit_spec, seen_values, write_raw_version
from tests.serving.server_process import ServerProcess, http
from tests.serving.v2_inputs import FEATURES, raw_columns, v1_predictions


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("v2rest") / "ctr"
    write_raw_version(base, 1, spec)
    proc = ServerProcess(base, tmp_path_factory.mktemp("logs") / "server.log", "--enable_batching")
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    yield c
    c.close()


def test_health_and_metadata_over_tritonclient_http(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert (
        client.is_model_ready("ctr")
        and client.is_model_ready("ctr_raw")
        and client.is_model_ready("ctr", "1")
    )
    assert not client.is_model_ready("ctr", "7")
    assert client.get_server_metadata() == {
        "name": "ctr-pipeline",
        "version": "0.1.0",
        "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"],
    }
    assert client.get_model_metadata("ctr", "1") == {
        "name": "ctr",
        "versions": ["1"],
        "platform": "onnxruntime_onnx",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 128]}],
        "outputs": [{"name": "ctr", "datatype": "FP32", "shape": [-1, 1]}],
    }
    raw = client.get_model_metadata("ctr_raw")
    assert raw["inputs"][0] == {"name": "I1", "datatype": "FP64", "shape": [-1]}
    assert raw["inputs"][13] == {"name": "C1", "datatype": "BYTES", "shape": [-1]}
    assert len(raw["inputs"]) == 39


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_matches_v1_predictions(
    server: ServerProcess, client: triton.InferenceServerClient, binary: bool
) -> None:
    tensor = triton.InferInput("features", list(FEATURES.shape), "FP32")
    tensor.set_data_from_numpy(FEATURES, binary_data=binary)
    result = client.infer(
        "ctr", [tensor], outputs=[triton.InferRequestedOutput("ctr", binary_data=binary)], request_id="r-1"
    )
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("ctr", "1", "r-1")
    np.testing.assert_array_equal(
        result.as_numpy("ctr"), v1_predictions(server, {"instances": FEATURES.tolist()})
    )


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_ctr_raw_equals_v1_raw_predictions(
    server: ServerProcess, client: triton.InferenceServerClient, spec: FeatureSpec, binary: bool
) -> None:
    columns, rows = raw_columns(seen_values(spec))
    tensors = []
    for name, values in columns.items():
        tensor = triton.InferInput(name, [2], "FP64" if name in NUMERIC_FIELDS else "BYTES")
        tensor.set_data_from_numpy(values, binary_data=binary)
        tensors.append(tensor)
    scores = client.infer("ctr_raw", tensors).as_numpy("ctr")
    expected = v1_predictions(server, {"signature_name": "raw", "instances": rows})
    np.testing.assert_array_equal(scores, expected)


def test_nested_data_echoes_id_and_honours_outputs(server: ServerProcess) -> None:
    body = {
        "id": "nested-7",
        "inputs": [
            {"name": "features", "shape": [2, 128], "datatype": "FP32", "data": FEATURES[:2].tolist()}
        ],
        "outputs": [{"name": "ctr"}],
    }
    status, answer = http(server.url("/v2/models/ctr/versions/1/infer"), body)
    assert status == 200
    _, v1 = http(server.url("/v1/models/ctr:predict"), {"instances": FEATURES[:2].tolist()})
    assert answer == {
        "model_name": "ctr",
        "model_version": "1",
        "id": "nested-7",
        "outputs": [
            {"name": "ctr", "datatype": "FP32", "shape": [2, 1], "data": [p for [p] in v1["predictions"]]}
        ],
    }
    status, answer = http(server.url("/v2/models/ctr/infer"), {**body, "outputs": [{"name": "score"}]})
    assert (status, answer) == (400, {"error": "outputs names ['score']; the only output is 'ctr'"})


def test_binary_data_output_splits_the_body_at_the_header_length(server: ServerProcess) -> None:
    body = {
        "inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": FEATURES[0].tolist()}],
        "parameters": {"binary_data_output": True},
    }
    request = urllib.request.Request(server.url("/v2/models/ctr/infer"), data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=10) as response:
        length = int(response.headers["Inference-Header-Content-Length"])
        content_type, payload = response.headers["content-type"], response.read()
    assert content_type == "application/octet-stream"
    header = json.loads(payload[:length])
    assert header["outputs"] == [
        {"name": "ctr", "datatype": "FP32", "shape": [1, 1], "parameters": {"binary_data_size": 4}}
    ]
    score = np.frombuffer(payload[length:], "<f4")
    np.testing.assert_array_equal(
        score, v1_predictions(server, {"instances": [FEATURES[0].tolist()]}).ravel()
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "error"),
    [
        ("/v2/models/nope/infer", {"inputs": []}, 404, "Request for unknown model: 'nope' is not found"),
        ("/v2/models/ctr/versions/7", None, 404, "Servable not found for request: Specific(ctr, 7)"),
        (
            "/v2/models/ctr/versions/01/infer",
            {},
            400,
            "version must be an integer from 1 to 9223372036854775807 without leading zeros, got '01'",
        ),
        (
            "/v2/models/ctr/infer",
            {"inputs": [{"name": "features", "shape": [1, 127], "datatype": "FP32", "data": [0.5] * 127}]},
            400,
            "input 'features' has shape [1, 127], expected [N, 128]",
        ),
        (
            "/v2/models/ctr/infer",
            {"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.5] * 3}]},
            400,
            "input 'features' FP32 data has 3, expected 128 numbers for shape [1, 128]",
        ),
        (
            "/v2/models/ctr/infer",
            {"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP64", "data": [0.5] * 128}]},
            400,
            "input 'features' has datatype FP64, expected FP32",
        ),
        (
            "/v2/models/ctr_raw/infer",
            {"inputs": [{"name": "C1", "shape": [2], "datatype": "BYTES", "data": ["a", "b\ud800"]}]},
            400,
            "row 1 field 'C1' holds \\ud800 at character 1, a lone UTF-16 surrogate that is not text; send valid "
            "Unicode (a surrogate pair or the character itself)",
        ),
        (
            "/v2/models/ctr_raw/infer",
            {"inputs": [{"name": "I1", "shape": [1], "datatype": "FP64", "data": [1.5]}]},
            400,
            "row 0 field 'I1' is 1.5, a fractional count; counts are integers",
        ),
        ("/v2/models/ctr/ready", {}, 405, "method POST is not allowed here; use GET"),
        (
            "/v2/models/ctr/infer",
            {
                "inputs": [
                    {
                        "name": "features",
                        "shape": [1, 128],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 512},
                    }
                ]
            },
            400,
            "input 'features' has binary_data_size but the request has no Inference-Header-Content-Length header; "
            "send the JSON header's length in it",
        ),
        (
            "/v2/models/ctr/infer",
            {
                "inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.5] * 128}],
                "outputs": [{"name": "ctr", "parameters": 5}],
            },
            400,
            "output 'ctr' has 'parameters' 5; send an object",
        ),
    ],
)
def test_errors_are_an_error_object_with_the_v1_status(
    server: ServerProcess, path: str, body: Any, status: int, error: str
) -> None:
    # The surrogate is sent as JSON's escape `\ud800`: json.dumps writes it so, and Python keeps it unpaired.
    assert http(server.url(path), body) == (status, {"error": error})


def test_not_ready_version_is_503_and_unknown_model_404_over_tritonclient(
    server: ServerProcess, client: triton.InferenceServerClient
) -> None:
    assert http(server.url("/v2/models/ctr/versions/7/ready")) == (503, {"name": "ctr", "ready": False})
    with pytest.raises(InferenceServerException) as caught:
        client.get_model_metadata("nope")
    assert (caught.value.status(), caught.value.message()) == (
        "404",
        "Request for unknown model: 'nope' is not found",
    )
    tensor = triton.InferInput("features", [1, 128], "FP32")
    tensor.set_data_from_numpy(np.full((1, 128), np.nan, np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("ctr", [tensor])
    assert caught.value.status() == "400"
    assert caught.value.message().startswith("instance 0 feature 0 is nan (not finite in float32)")


def test_nonfinite_output_is_a_500_naming_the_instance(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [3e38] * 128}]}
    status, answer = http(server.url("/v2/models/ctr/infer"), body)
    assert status == 500
    assert answer["error"].startswith(
        "the model's output for instance 0 is nan (not finite; 1 of 1 instances)"
    )


def test_health_routes_answer_without_a_model_name(server: ServerProcess) -> None:
    assert http(server.url("/v2/health/live")) == (200, {"live": True})
    assert http(server.url("/v2/health/ready")) == (200, {"ready": True})


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_large_body_is_parsed_off_the_event_loop_and_matches_v1(
    server: ServerProcess, client: triton.InferenceServerClient, binary: bool
) -> None:
    rows = np.random.default_rng(11).random(
        (600, 128), np.float32
    )  # over 256 KiB either way: the child parses
    tensor = triton.InferInput("features", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows, binary_data=binary)
    scores = client.infer("ctr", [tensor]).as_numpy("ctr")
    np.testing.assert_array_equal(scores, v1_predictions(server, {"instances": rows.tolist()}))
