"""The server on a version made by the real pipeline: `training.synth` -> `training` -> `export` -> `serving`.

The other serving tests use a hand-built repository (tests/serving/model_repo.py); this one holds the seam
between export and serving: whatever export publishes, the server loads, verifies, warms and answers with the
checkpoint's own probabilities through its calibrator (`ctr`) and without it (`raw_score`). Tiny on purpose:
4,000 rows (30% held out, so the calibrator has the 1,000 rows it needs), one epoch, no TorchScript.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
import torch
import tritonclient.grpc as triton
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from ctr_contract import (
    BEST_CHECKPOINT,
    DEFAULT_SIGNATURE,
    FEATURE_SPEC_PATH,
    INPUT_NAME,
    MANIFEST_PATH,
    OUTPUT_NAME,
    VAL_FEATURES,
)
from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS
from ctr_contract.signatures import RAW_SCORE_NAME
from ctr_features.spec import FeatureSpec
from ctr_model.calibration import Calibrator
from ctr_model.checkpoint import load_net
from tests.conftest import RunModule
from tests.helpers import REPO_ROOT
from tests.serving.server_process import ServerProcess, http

pytestmark = pytest.mark.slow  # make test-slow: trains and exports through the three CLIs

ROWS = 64


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, run_module: RunModule) -> tuple[Path, Path]:
    """(run dir, model base path) after the three CLI steps."""
    root = tmp_path_factory.mktemp("pipeline")
    data, run, repo = root / "train.txt", root / "run", root / "models" / "ctr"
    run_module("training.synth", "--out", data, "--rows", "4000", "--seed", "3", check=True)
    run_module(
        "training",
        "--data",
        data,
        "--out",
        run,
        "--max-epochs",
        "1",
        "--batch-size",
        "512",
        "--val-fraction",
        "0.3",
        "--no-progress-bar",
        check=True,
    )
    run_module("export", "--run", run, "--repo", repo, "--no-torchscript", check=True)
    return run, repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, exported: tuple[Path, Path]) -> Iterator[ServerProcess]:
    server = ServerProcess(exported[1], tmp_path_factory.mktemp("logs") / "server.log")
    server.wait_ready()
    yield server
    server.stop()


def test_the_exported_version_is_available(server: ServerProcess, exported: tuple[Path, Path]) -> None:
    status, body = http(server.url("/v1/models/ctr"))
    assert (status, body) == (
        200,
        {
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ]
        },
    )
    manifest = json.loads((exported[1] / "1" / MANIFEST_PATH).read_text())
    assert manifest["version"] == 1


def test_metadata_is_the_exported_signature(server: ServerProcess) -> None:
    status, body = http(server.url("/v1/models/ctr/metadata"))
    assert status == 200
    signature = body["metadata"]["signature_def"]["signature_def"][DEFAULT_SIGNATURE]
    shape = {"dim": [{"size": "-1", "name": ""}, {"size": "128", "name": ""}], "unknown_rank": False}
    assert signature["inputs"][INPUT_NAME]["tensor_shape"] == shape
    assert sorted(signature["outputs"]) == [OUTPUT_NAME, RAW_SCORE_NAME]
    for output in signature["outputs"].values():
        assert [d["size"] for d in output["tensor_shape"]["dim"]] == ["-1", "1"]


def _expected(exported: tuple[Path, Path], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The checkpoint's own scores: the manifest's calibrator on its logits (ctr), and its sigmoid (raw_score)."""
    run, repo = exported
    net, _ = load_net(run / BEST_CHECKPOINT)
    with torch.no_grad():
        logits = net(torch.from_numpy(rows)).numpy().astype(np.float64)
    manifest = json.loads((repo / "1" / MANIFEST_PATH).read_text())
    assert list(manifest["io"]["outputs"]) == [OUTPUT_NAME, RAW_SCORE_NAME]
    calibrator = Calibrator.from_dict(manifest["calibration"])
    return {OUTPUT_NAME: calibrator.apply(logits), RAW_SCORE_NAME: 1 / (1 + np.exp(-logits))}


def test_predictions_are_the_checkpoints_calibrated_probabilities(
    server: ServerProcess, exported: tuple[Path, Path]
) -> None:
    rows = np.load(exported[0] / VAL_FEATURES)[:ROWS]
    expected = _expected(exported, rows)
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": rows.tolist()})
    assert status == 200, body
    served = np.array(body["predictions"], dtype=np.float32)
    assert served.shape == (ROWS, 1)  # v1 REST answers ctr alone
    np.testing.assert_allclose(served, expected[OUTPUT_NAME], rtol=0, atol=1e-5)  # export's parity tolerance


def test_grpc_answers_ctr_and_the_uncalibrated_raw_score(
    server: ServerProcess, exported: tuple[Path, Path]
) -> None:
    rows = np.load(exported[0] / VAL_FEATURES)[:ROWS]
    expected = _expected(exported, rows)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.inputs[INPUT_NAME].CopyFrom(tf.make_tensor_proto(rows))
    with grpc.insecure_channel(server.grpc_target) as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=30)
    assert sorted(response.outputs) == [OUTPUT_NAME, RAW_SCORE_NAME]
    for name, scores in expected.items():
        np.testing.assert_allclose(tf.make_ndarray(response.outputs[name]), scores, rtol=0, atol=1e-5)


def test_raw_rows_give_both_outputs_equal_to_the_features_path(
    server: ServerProcess, exported: tuple[Path, Path]
) -> None:
    """Raw rows through the server's own raw path (gRPC `raw`, v2 `ctr_raw`) and their FeatureSpec features
    through `serving_default` answer the same ctr and raw_score."""
    spec = FeatureSpec.load(exported[1] / "1" / FEATURE_SPEC_PATH)
    numeric = np.array([[3.0] + [np.nan] * 12, [np.nan] * 13])
    categorical = np.array([["68fd1e64"] + [""] * 25, [""] * 26], object)
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "ctr", "raw"
    for j, field in enumerate(NUMERIC_FIELDS):
        request.inputs[field].CopyFrom(tf.make_tensor_proto(numeric[:, j]))
    for j, field in enumerate(CATEGORICAL_FIELDS):
        request.inputs[field].CopyFrom(tf.make_tensor_proto([v.encode() for v in categorical[:, j]]))
    features = predict_pb2.PredictRequest()
    features.model_spec.name = "ctr"
    features.inputs[INPUT_NAME].CopyFrom(
        tf.make_tensor_proto(spec.transform(numeric, categorical).astype(np.float32))
    )
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        raw, through_features = stub.Predict(request, timeout=30), stub.Predict(features, timeout=30)
    client = triton.InferenceServerClient(server.grpc_target)
    tensors = []
    for j, field in enumerate(NUMERIC_FIELDS):
        tensors.append(triton.InferInput(field, [2], "FP64"))
        tensors[-1].set_data_from_numpy(numeric[:, j])
    for j, field in enumerate(CATEGORICAL_FIELDS):
        tensors.append(triton.InferInput(field, [2], "BYTES"))
        tensors[-1].set_data_from_numpy(np.array([v.encode() for v in categorical[:, j]], object))
    v2 = client.infer("ctr_raw", tensors)
    client.close()
    assert sorted(raw.outputs) == sorted(through_features.outputs) == [OUTPUT_NAME, RAW_SCORE_NAME]
    assert [o.name for o in v2.get_response().outputs] == [OUTPUT_NAME, RAW_SCORE_NAME]
    for name in (OUTPUT_NAME, RAW_SCORE_NAME):
        served = tf.make_ndarray(raw.outputs[name])
        np.testing.assert_allclose(served, tf.make_ndarray(through_features.outputs[name]), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(v2.as_numpy(name), served)


def test_the_readme_request_is_answered(server: ServerProcess) -> None:
    """The raw Criteo row the README shows, sent as it is written there."""
    body = re.search(r"-d '(\{\"instances\": .+?\})'\n", (REPO_ROOT / "README.md").read_text())
    assert body, "README has no raw request example"
    status, answer = http(server.url("/v1/models/ctr:predict"), raw=body.group(1).encode())
    assert status == 200, answer
    [[p]] = answer["predictions"]
    assert 0 < p < 1
