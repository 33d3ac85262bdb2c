"""A version with `ctr` and `raw_score` beside one with `ctr` alone, over TF Serving's APIs (v1 REST, gRPC).

v1 REST answers `ctr` alone for both (docs/decisions/0007-v1-rest-answers-ctr.md); gRPC Predict answers every
output unless `output_filter` names some; GetModelMetadata lists what each version serves; the raw signature
gives both outputs, equal to the features path; the request log and the score histogram keep `ctr`.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from serving.errors import ModelLoadError
from serving.runtime.onnx_runtime import OnnxRuntimeBackend
from tests.serving.model_repo import (
    make_weights,
    reference_logits,
    reference_outputs,
    reference_predict,
    write_manifest,
    write_onnx,
    write_saved_model,
    write_version,
)
from tests.serving.raw_model_repo import fit_spec, raw_graph, seen_values, write_both_kinds
from tests.serving.server_process import ServerProcess, http
from tests.serving.v2_inputs import FEATURES, raw_columns

WEIGHTS = make_weights(seed=11)  # the weights write_both_kinds gives both versions
OUTPUTS = ["ctr", "raw_score"]


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("request_logs")


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec, logs: Path
) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("outputs") / "ctr"
    write_both_kinds(base, spec)
    proc = ServerProcess(
        base,
        tmp_path_factory.mktemp("logs") / "server.log",
        "--model_version_policy=latest:2",
        "--enable_batching",
        f"--request_log_dir={logs}",
        "--request_log_sample_rate=1",
    )
    proc.wait_ready()
    proc.wait_versions({1, 2})  # both kinds of versions, loaded in either order
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[prediction_service_pb2_grpc.PredictionServiceStub]:
    with grpc.insecure_channel(server.grpc_target) as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _request(version: int, output_filter: tuple[str, ...] = ()) -> predict_pb2.PredictRequest:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.version.value = version
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(FEATURES))
    request.output_filter.extend(output_filter)
    return request


def _raw_request(version: int, seen: list[str]) -> predict_pb2.PredictRequest:
    columns, _ = raw_columns(seen)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.version.value = version
    request.model_spec.signature_name = "raw"
    for field, values in columns.items():
        request.inputs[field].CopyFrom(
            tf.make_tensor_proto(values.tolist() if field in CATEGORICAL_FIELDS else values)
        )
    return request


def _outputs(response: predict_pb2.PredictResponse) -> dict[str, np.ndarray]:
    return {name: tf.make_ndarray(tensor) for name, tensor in sorted(response.outputs.items())}


def test_v1_rest_answers_ctr_alone_for_both_kinds_of_versions(server: ServerProcess) -> None:
    expected = {1: reference_predict(WEIGHTS, FEATURES), 2: reference_outputs(WEIGHTS, FEATURES)["ctr"]}
    for version, ctr in expected.items():
        url = server.url(f"/v1/models/ctr/versions/{version}:predict")
        status, rows = http(url, {"instances": FEATURES.tolist()})
        assert (status, list(rows)) == (200, ["predictions"])
        assert [len(row) for row in rows["predictions"]] == [1, 1, 1]
        np.testing.assert_allclose(rows["predictions"], ctr, atol=1e-6)
        status, columns = http(url, {"inputs": {"features": FEATURES.tolist()}})
        assert (status, columns) == (200, {"outputs": rows["predictions"]})
    # The calibration moved the score: version 2's ctr is not version 1's.
    assert np.abs(expected[1] - expected[2]).min() > 1e-3


def test_grpc_predict_answers_every_output_unless_output_filter_names_some(stub) -> None:
    expected = reference_outputs(WEIGHTS, FEATURES)
    both = _outputs(stub.Predict(_request(2), timeout=10))
    assert list(both) == OUTPUTS
    for name in OUTPUTS:
        assert both[name].shape == (3, 1)
        np.testing.assert_allclose(both[name], expected[name], atol=1e-6)
    for wanted in (("raw_score",), ("ctr",), ("raw_score", "ctr")):
        answer = _outputs(stub.Predict(_request(2, wanted), timeout=10))
        assert sorted(answer) == sorted(wanted)
        for name in wanted:
            np.testing.assert_array_equal(answer[name], both[name])
    # Version 1 serves ctr alone, as before: its ctr is version 2's raw_score (the same net).
    old = _outputs(stub.Predict(_request(1), timeout=10))
    assert list(old) == ["ctr"]
    np.testing.assert_array_equal(old["ctr"], both["raw_score"])


@pytest.mark.parametrize(
    ("version", "output_filter", "message"),
    [
        (
            2,
            ("ctr", "logit", "bogus"),
            "output_filter names ['bogus', 'logit']; this version's outputs are ['ctr', 'raw_score']",
        ),
        (1, ("raw_score",), "output_filter names ['raw_score']; the only output is 'ctr'"),
    ],
    ids=["two_outputs", "one_output"],
)
def test_grpc_output_filter_naming_an_unknown_output_is_invalid_argument(
    stub, version: int, output_filter: tuple[str, ...], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Predict(_request(version, output_filter), timeout=10)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def _signature_outputs(stub, version: int) -> dict[str, dict[str, str]]:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "ctr"
    request.model_spec.version.value = version
    sig_map = get_model_metadata_pb2.SignatureDefMap()
    stub.GetModelMetadata(request, timeout=10).metadata["signature_def"].Unpack(sig_map)
    return {
        key: {name: info.name for name, info in sig_def.outputs.items()}
        for key, sig_def in sig_map.signature_def.items()
    }


def test_model_metadata_lists_raw_score_where_the_version_serves_it(server: ServerProcess, stub) -> None:
    assert _signature_outputs(stub, 2) == {
        "serving_default": {"ctr": "StatefulPartitionedCall_1:0", "raw_score": "StatefulPartitionedCall_1:1"},
        "raw": {"ctr": "StatefulPartitionedCall:0", "raw_score": "StatefulPartitionedCall:1"},
    }
    assert _signature_outputs(stub, 1) == {
        "serving_default": {"ctr": "StatefulPartitionedCall_1:0"},
        "raw": {"ctr": "StatefulPartitionedCall:0"},
    }
    status, body = http(server.url("/v1/models/ctr/versions/2/metadata"))
    assert status == 200
    outputs = body["metadata"]["signature_def"]["signature_def"]["serving_default"]["outputs"]
    assert {name: info["tensor_shape"]["dim"] for name, info in outputs.items()} == {
        name: [{"size": "-1", "name": ""}, {"size": "1", "name": ""}] for name in OUTPUTS
    }


def test_raw_rows_give_both_outputs_equal_to_the_features_path(stub, spec: FeatureSpec) -> None:
    seen = seen_values(spec)
    _, rows = raw_columns(seen)
    numeric = np.array([[r.get(f, np.nan) for f in NUMERIC_FIELDS] for r in rows], np.float64)
    categorical = np.array([[r.get(f, "") for f in CATEGORICAL_FIELDS] for r in rows], object)
    features = spec.transform(numeric, categorical).astype(np.float32)
    raw = _outputs(stub.Predict(_raw_request(2, seen), timeout=10))
    assert list(raw) == OUTPUTS
    request = _request(2)
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
    through_features = _outputs(stub.Predict(request, timeout=10))
    for name, expected in reference_outputs(WEIGHTS, features).items():
        np.testing.assert_allclose(raw[name], through_features[name], atol=1e-6)
        np.testing.assert_allclose(raw[name], expected, atol=1e-6)
    assert list(_outputs(stub.Predict(_raw_request(1, seen), timeout=10))) == ["ctr"]


def test_request_log_and_score_histogram_keep_ctr(server: ServerProcess, logs: Path) -> None:
    before = _histogram_sum(server)
    status, _ = http(server.url("/v1/models/ctr/versions/2:predict"), {"instances": FEATURES.tolist()})
    assert status == 200
    ctr = reference_outputs(WEIGHTS, FEATURES)["ctr"]
    deadline = time.monotonic() + 10
    while abs(_histogram_sum(server) - before - float(ctr.sum())) > 1e-5:
        assert time.monotonic() < deadline, (before, _histogram_sum(server), float(ctr.sum()))
        time.sleep(0.05)
    entries: list[dict[str, Any]] = []
    while not entries:
        assert time.monotonic() < deadline + 10, "no request log entry of version 2"
        time.sleep(0.1)
        lines = [
            json.loads(x) for f in sorted(logs.glob("requests-*.jsonl")) for x in f.read_text().splitlines()
        ]
        entries = [e for e in lines if e["model"]["version"] == 2 and len(e["outputs"]) == 3]
    assert all(len(row) == 1 for entry in entries for row in entry["outputs"])
    np.testing.assert_allclose(entries[-1]["outputs"], ctr, atol=1e-6)


def _histogram_sum(server: ServerProcess) -> float:
    _, text = http(server.url("/metrics"))
    series = 'ctr_serving_predicted_ctr_sum{model_name="ctr"} '
    return sum(float(line[len(series) :]) for line in str(text).splitlines() if line.startswith(series))


def test_a_manifest_listing_other_outputs_than_the_graphs_fails_the_version(
    start_server, tmp_path: Path
) -> None:
    base = tmp_path / "ctr"
    write_version(base, 1, WEIGHTS)
    staged = tmp_path / "staged"
    shutil.copytree(base / "1", staged)
    write_manifest(staged, 2, ("ctr", "raw_score"))  # model.onnx serves ctr alone
    server = start_server(base, "--file_system_poll_wait_seconds=1")
    staged.rename(base / "2")
    deadline = time.monotonic() + 20
    while (state := _state(server, 2)) is None or state["state"] != "END":
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    assert state["error_message"].endswith(
        "assets.extra/manifest.json lists outputs ['ctr', 'raw_score'] in io.outputs, the version's graphs "
        "serve ['ctr']; re-export the version with `python -m export`"
    ), state
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": FEATURES[:1].tolist()})
    assert status == 200
    np.testing.assert_allclose(body["predictions"], reference_predict(WEIGHTS, FEATURES[:1]), atol=1e-6)


def _state(server: ServerProcess, version: int) -> dict[str, Any] | None:
    _, body = http(server.url("/v1/models/ctr"))
    for entry in body.get("model_version_status", []) if isinstance(body, dict) else []:
        if entry["version"] == str(version):
            return {"state": entry["state"], "error_message": entry["status"]["error_message"]}
    return None


def test_savedmodel_backend_serves_both_outputs(start_server, tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    write_saved_model(WEIGHTS, saved, calibrated=True)
    write_version(tmp_path / "ctr", 1, WEIGHTS, saved_model_from=saved, calibrated=True)
    server = start_server(tmp_path / "ctr", "--backend=tf")
    expected = reference_outputs(WEIGHTS, FEATURES)
    with grpc.insecure_channel(server.grpc_target) as channel:
        tf_stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer = _outputs(tf_stub.Predict(_request(1), timeout=30))
        assert _signature_outputs(tf_stub, 1) == {
            "serving_default": {"ctr": "StatefulPartitionedCall:0", "raw_score": "StatefulPartitionedCall:1"}
        }
    assert list(answer) == OUTPUTS
    for name in OUTPUTS:
        np.testing.assert_allclose(answer[name], expected[name], atol=1e-6)
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": FEATURES.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["predictions"], expected["ctr"], atol=1e-6)


def test_a_nonfinite_raw_score_fails_the_request_though_v1_answers_ctr_alone(
    start_server, tmp_path: Path
) -> None:
    base = tmp_path / "ctr"
    version = write_version(base, 1, WEIGHTS, calibrated=True)
    model = onnx.load(str(version / "model.onnx"))
    (node,) = [n for n in model.graph.node if n.output[0] == "raw_score"]
    node.op_type = "Sqrt"  # raw_score = sqrt(z): NaN where the logit is negative, ctr stays finite
    onnx.save(model, str(version / "model.onnx"))
    write_manifest(version, 1, ("ctr", "raw_score"))  # the new model.onnx's hash
    # A version whose warm-up output is NaN does not load: its warm-up rows (and the zero row) have z > 0.
    rows = np.random.default_rng(3).normal(size=(40, 128)).astype(np.float32)
    z = reference_logits(WEIGHTS, rows)[:, 0]
    assert (z < 0).any() and (z >= 0).any(), z
    server = start_server(base)
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": rows.tolist()})
    first = int(np.argmax(z < 0))
    assert status == 500
    assert body["error"].startswith(f"the model's output for instance {first} is nan (not finite; "), body
    positive = rows[z >= 0]
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": positive.tolist()})
    assert status == 200
    np.testing.assert_allclose(body["predictions"], reference_outputs(WEIGHTS, positive)["ctr"], atol=1e-6)


def test_a_graph_of_several_outputs_without_ctr_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    write_onnx(WEIGHTS, path, calibrated=True)
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.output[:] = ["score" if o == "ctr" else o for o in node.output]
    model.graph.output[0].name = "score"
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError) as caught:
        OnnxRuntimeBackend(path, 1)
    assert str(caught.value) == (
        f"{path} must have 1 input and 1 output (or several, one of them 'ctr'), got inputs ['features'] and "
        "outputs ['score', 'raw_score']"
    )


def test_a_raw_graph_serving_other_outputs_than_model_onnx_does_not_load(
    tmp_path: Path, spec: FeatureSpec
) -> None:
    write_onnx(WEIGHTS, tmp_path / "model.onnx")  # ctr alone
    onnx.save(raw_graph(onnx.load(str(tmp_path / "model.onnx")), spec), tmp_path / "model_raw.onnx")
    write_onnx(WEIGHTS, tmp_path / "model.onnx", calibrated=True)  # ctr and raw_score
    with pytest.raises(ModelLoadError) as caught:
        OnnxRuntimeBackend(tmp_path / "model.onnx", 1)
    assert str(caught.value) == (
        f"{tmp_path / 'model_raw.onnx'} has outputs ['ctr'], model.onnx has ['ctr', 'raw_score']; the two graphs "
        "of a version serve the same outputs: re-export the version"
    )
