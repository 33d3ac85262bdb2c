"""`ctr` and `raw_score` over the Open Inference Protocol v2 (REST and gRPC, with the real tritonclient).

A version that serves both lists both in its metadata and answers both unless the request's `outputs` names
some; a version exported before calibration answers and lists `ctr` alone, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from ctr_contract.schema import NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from tests.serving.model_repo import make_weights, reference_outputs
from tests.serving.raw_model_repo import fit_spec, seen_values, write_both_kinds
from tests.serving.server_process import ServerProcess, http
from tests.serving.v2_inputs import FEATURES, raw_columns, v1_predictions

WEIGHTS = make_weights(seed=11)  # the weights write_both_kinds gives both versions
OUTPUTS = ["ctr", "raw_score"]


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("outputs_v2") / "ctr"
    write_both_kinds(base, spec)
    proc = ServerProcess(
        base, tmp_path_factory.mktemp("logs") / "server.log", "--model_version_policy=latest:2"
    )
    proc.wait_ready()
    proc.wait_versions({1, 2})  # both kinds of versions, loaded in either order
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def rest(server: ServerProcess) -> Iterator[triton_http.InferenceServerClient]:
    c = triton_http.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[triton_grpc.InferenceServerClient]:
    c = triton_grpc.InferenceServerClient(server.grpc_target)
    yield c
    c.close()


def _tensors(module: Any, binary: bool = True) -> list[Any]:
    tensor = module.InferInput("features", list(FEATURES.shape), "FP32")
    if module is triton_http:
        tensor.set_data_from_numpy(FEATURES, binary_data=binary)
    else:
        tensor.set_data_from_numpy(FEATURES)
    return [tensor]


def test_metadata_and_config_list_raw_score_where_the_version_serves_it(
    server: ServerProcess, rest, grpc_client
) -> None:
    both = [{"name": n, "datatype": "FP32", "shape": [-1, 1]} for n in OUTPUTS]
    assert rest.get_model_metadata("ctr")["outputs"] == both  # the newest version: 2
    assert rest.get_model_metadata("ctr", "2")["outputs"] == both
    assert rest.get_model_metadata("ctr_raw", "2")["outputs"] == both
    assert rest.get_model_metadata("ctr", "1")["outputs"] == both[:1]
    assert rest.get_model_metadata("ctr_raw", "1")["outputs"] == both[:1]
    over_grpc = [{"name": n, "datatype": "FP32", "shape": ["-1", "1"]} for n in OUTPUTS]
    assert grpc_client.get_model_metadata("ctr", "2", as_json=True)["outputs"] == over_grpc
    assert grpc_client.get_model_metadata("ctr", "1", as_json=True)["outputs"] == over_grpc[:1]
    status, config = http(server.url("/v2/models/ctr/versions/2/config"))
    assert status == 200
    assert config["output"] == [{"name": n, "data_type": "TYPE_FP32", "dims": [1]} for n in OUTPUTS]
    assert grpc_client.get_model_config("ctr", "2", as_json=True)["config"]["output"] == [
        {"name": n, "data_type": "TYPE_FP32", "dims": ["1"]} for n in OUTPUTS
    ]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rest_infer_answers_both_unless_outputs_names_some(rest, binary: bool) -> None:
    expected = reference_outputs(WEIGHTS, FEATURES)
    result = rest.infer("ctr", _tensors(triton_http, binary), model_version="2")
    assert [o["name"] for o in result.get_response()["outputs"]] == OUTPUTS
    for name in OUTPUTS:
        np.testing.assert_allclose(result.as_numpy(name), expected[name], atol=1e-6)
    wanted = [triton_http.InferRequestedOutput("raw_score", binary_data=binary)]
    one = rest.infer("ctr", _tensors(triton_http, binary), model_version="2", outputs=wanted)
    assert [o["name"] for o in one.get_response()["outputs"]] == ["raw_score"]
    np.testing.assert_array_equal(one.as_numpy("raw_score"), result.as_numpy("raw_score"))
    old = rest.infer("ctr", _tensors(triton_http, binary), model_version="1")
    assert [o["name"] for o in old.get_response()["outputs"]] == ["ctr"]
    np.testing.assert_array_equal(old.as_numpy("ctr"), result.as_numpy("raw_score"))


def test_rest_outputs_in_the_requested_order_each_binary_or_json(server: ServerProcess, rest) -> None:
    outputs = [
        triton_http.InferRequestedOutput("raw_score", binary_data=True),
        triton_http.InferRequestedOutput("ctr", binary_data=False),
    ]
    result = rest.infer("ctr", _tensors(triton_http), model_version="2", outputs=outputs)
    heads = result.get_response()["outputs"]
    assert [(o["name"], "data" in o, "parameters" in o) for o in heads] == [
        ("raw_score", False, True),
        ("ctr", True, False),
    ]
    expected = reference_outputs(WEIGHTS, FEATURES)
    for name in OUTPUTS:
        np.testing.assert_allclose(result.as_numpy(name), expected[name], atol=1e-6)
    np.testing.assert_array_equal(
        result.as_numpy("ctr"),
        v1_predictions(server, {"instances": FEATURES.tolist()}),  # v1 answers version 2's ctr
    )


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("2", "outputs names ['score']; this version's outputs are ['ctr', 'raw_score']"),
        ("1", "outputs names ['score']; the only output is 'ctr'"),
    ],
)
def test_outputs_naming_an_unknown_output_is_a_400_and_invalid_argument(
    server: ServerProcess, grpc_client, version: str, message: str
) -> None:
    body = {
        "inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": FEATURES[0].tolist()}],
        "outputs": [{"name": "ctr"}, {"name": "score"}],
    }
    status, answer = http(server.url(f"/v2/models/ctr/versions/{version}/infer"), body)
    assert (status, answer) == (400, {"error": message})
    wanted = [triton_grpc.InferRequestedOutput("score")]
    with pytest.raises(InferenceServerException) as err:
        grpc_client.infer("ctr", _tensors(triton_grpc), model_version=version, outputs=wanted)
    assert (err.value.status(), err.value.message()) == ("StatusCode.INVALID_ARGUMENT", message)


def test_grpc_infer_answers_both_unless_outputs_names_some(grpc_client) -> None:
    expected = reference_outputs(WEIGHTS, FEATURES)
    result = grpc_client.infer("ctr", _tensors(triton_grpc), model_version="2")
    response = result.get_response()
    assert [o.name for o in response.outputs] == OUTPUTS
    assert len(response.raw_output_contents) == 2
    for name in OUTPUTS:
        assert result.as_numpy(name).shape == (3, 1)
        np.testing.assert_allclose(result.as_numpy(name), expected[name], atol=1e-6)
    for wanted in (["raw_score"], ["raw_score", "ctr"]):
        requested = [triton_grpc.InferRequestedOutput(n) for n in wanted]
        some = grpc_client.infer("ctr", _tensors(triton_grpc), model_version="2", outputs=requested)
        assert [o.name for o in some.get_response().outputs] == wanted
        for name in wanted:
            np.testing.assert_array_equal(some.as_numpy(name), result.as_numpy(name))
    old = grpc_client.infer("ctr", _tensors(triton_grpc), model_version="1")
    assert [o.name for o in old.get_response().outputs] == ["ctr"]
    np.testing.assert_array_equal(old.as_numpy("ctr"), result.as_numpy("raw_score"))


def test_ctr_raw_gives_both_outputs_equal_to_the_features_path(
    server: ServerProcess, rest, grpc_client, spec: FeatureSpec
) -> None:
    columns, rows = raw_columns(seen_values(spec))
    answers = []
    for module, client in ((triton_http, rest), (triton_grpc, grpc_client)):
        tensors = []
        for name, values in columns.items():
            tensor = module.InferInput(name, [2], "FP64" if name in NUMERIC_FIELDS else "BYTES")
            tensor.set_data_from_numpy(values)
            tensors.append(tensor)
        answers.append(client.infer("ctr_raw", tensors, model_version="2"))
    numeric = np.stack([columns[f] for f in NUMERIC_FIELDS], axis=1)
    categorical = np.stack(
        [np.array([v.decode() for v in columns[f]], object) for f in columns if f not in NUMERIC_FIELDS],
        axis=1,
    )
    expected = reference_outputs(WEIGHTS, spec.transform(numeric, categorical).astype(np.float32))
    for result in answers:
        for name in OUTPUTS:
            np.testing.assert_allclose(result.as_numpy(name), expected[name], atol=1e-6)
    v1 = v1_predictions(server, {"signature_name": "raw", "instances": rows})
    np.testing.assert_array_equal(answers[0].as_numpy("ctr"), v1)
