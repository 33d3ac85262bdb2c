"""Raw Criteo rows against the real server (REST and gRPC, ONNX and TF backends): the `raw` signature.

Every missing-value form must give what the features path gives for `FeatureSpec.transform` of the same row,
and every kind of bad raw input is a 400 (INVALID_ARGUMENT) naming the field and the instance.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_metadata_pb2, predict_pb2, prediction_service_pb2_grpc

from ctr_contract.schema import CATEGORICAL_FIELDS, NUMERIC_FIELDS, RAW_FIELDS
from ctr_features.compiled.onnx_graph import build_raw_model
from ctr_features.spec import FeatureSpec
from export.raw_graphs import save_saved_model_with_raw
from serving.protocols.rest_body import INLINE_MAX_BYTES
from tests.serving.model_repo import make_weights, write_manifest, write_onnx, write_warmup
from tests.serving.server_process import ServerProcess, http
from training.synth import sample_rows

N_TRAIN = 3_000


def _fit_spec() -> tuple[FeatureSpec, list[str]]:
    """A FeatureSpec fitted on synthetic rows, and a few values C1 saw in training."""
    rng = np.random.default_rng(3)
    numeric, ranks = sample_rows(rng, N_TRAIN)
    categorical = np.char.mod("%08x", ranks % 40).astype(object)
    categorical[ranks < 0] = ""
    labels = (rng.random(N_TRAIN) < 0.25 + 0.3 * (ranks[:, 8] == 0)).astype(np.float32)
    spec = FeatureSpec.fit(numeric, categorical, labels, min_count=20)
    return spec, [v.decode() for v in spec.tables[0].vocab[:3]]


@pytest.fixture(scope="module")
def raw_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FeatureSpec, list[str]]:
    """`<base>/1/` with model.onnx, model_raw.onnx and a SavedModel with `serving_default` and `raw`."""
    spec, seen = _fit_spec()
    base = tmp_path_factory.mktemp("raw_repo") / "ctr"
    stage = base / ".tmp-1"
    stage.mkdir(parents=True)
    write_onnx(make_weights(seed=11), stage / "model.onnx")
    proto = onnx.load(str(stage / "model.onnx"))
    onnx.save(build_raw_model(proto, spec), stage / "model_raw.onnx")
    save_saved_model_with_raw(proto, spec, stage)
    (stage / "assets.extra").mkdir(exist_ok=True)
    spec.save(stage / "assets.extra" / "feature_spec.json")
    write_warmup(stage / "assets.extra" / "tf_serving_warmup_requests", [np.zeros((1, 128), np.float32)])
    write_manifest(stage, 1)
    stage.rename(base / "1")
    return base, spec, seen


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory: pytest.TempPathFactory, raw_repo) -> Iterator[ServerProcess]:
    server = ServerProcess(raw_repo[0], tmp_path_factory.mktemp("logs") / "onnx.log", "--enable_batching")
    server.wait_ready()
    yield server
    server.stop()


def raw_rows(seen: list[str]) -> list[dict[str, Any]]:
    """One row per missing-value form and count encoding."""
    full: dict[str, Any] = {f: i * 7 - 1 for i, f in enumerate(NUMERIC_FIELDS)}
    full.update({f: seen[j % len(seen)] for j, f in enumerate(CATEGORICAL_FIELDS)})
    return [
        full,  # JSON integers, values seen in training
        {**{f: str(v) for f, v in full.items() if f in NUMERIC_FIELDS}, "C1": seen[1]},  # numeric strings
        {"I1": 5, "C3": seen[0]},  # absent fields
        {"I1": None, "I2": 7, "C1": None, "C2": seen[2]},  # null
        {"I1": "", "I2": 2, "C1": "", "C2": ""},  # empty strings
        {},  # all missing
        {"I3": 2_000_000, "I4": -1, "C1": "héllo", "C2": "日本", "C3": "never-seen"},  # huge, -1, non-ASCII
        {"I1": 3.0, "I5": 2**53, "I6": "-9007199254740992", "C4": " "},  # integral float, the range's ends
    ]


def as_arrays(rows: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """What FeatureSpec.transform takes for the rows: NaN and "" where missing."""
    numeric = np.array(
        [[math.nan if r.get(f) in (None, "") else float(r[f]) for f in NUMERIC_FIELDS] for r in rows]
    )
    categorical = np.array([[r.get(f) or "" for f in CATEGORICAL_FIELDS] for r in rows], dtype=object)
    return numeric, categorical


def features_path(server: ServerProcess, spec: FeatureSpec, rows: list[dict[str, Any]]) -> np.ndarray:
    x = spec.transform(*as_arrays(rows))
    status, body = http(
        server.url("/v1/models/ctr:predict"), {"signature_name": "serving_default", "instances": x.tolist()}
    )
    assert status == 200, body
    return np.array(body["predictions"])


def predict(server: ServerProcess, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    return http(server.url("/v1/models/ctr:predict"), body, raw=raw)


def test_rest_raw_rows_in_every_missing_form_match_the_features_path(
    onnx_server: ServerProcess, raw_repo
) -> None:
    _, spec, seen = raw_repo
    rows = raw_rows(seen)
    want = features_path(onnx_server, spec, rows)
    status, body = predict(onnx_server, {"instances": rows})  # no signature_name: raw field names pick `raw`
    assert status == 200, body
    np.testing.assert_allclose(body["predictions"], want, atol=1e-6, rtol=0)
    status, named = predict(onnx_server, {"signature_name": "raw", "instances": rows})
    assert status == 200 and named["predictions"] == body["predictions"]
    assert len({round(p[0], 6) for p in body["predictions"]}) == len(rows)  # every row reaches the model


def test_rest_columnar_raw_inputs_and_nan_token(onnx_server: ServerProcess, raw_repo) -> None:
    _, spec, seen = raw_repo
    rows = raw_rows(seen)
    want = features_path(onnx_server, spec, rows)
    columns = {f: [r.get(f) for r in rows] for f in RAW_FIELDS}
    status, body = predict(onnx_server, {"inputs": columns})
    assert status == 200, body
    np.testing.assert_allclose(body["outputs"], want, atol=1e-6, rtol=0)
    # TF Serving's JSON form of a missing count is the NaN token: the same as the all-missing row {}.
    status, nan = predict(onnx_server, raw=b'{"instances": [{"I1": NaN, "C1": ""}]}')
    assert status == 200 and nan["predictions"] == [body["outputs"][5]]


def test_rest_features_rows_still_take_serving_default(onnx_server: ServerProcess) -> None:
    status, body = predict(onnx_server, {"instances": [[0.0] * 128]})
    assert status == 200 and len(body["predictions"]) == 1
    status, body = predict(onnx_server, {"signature_name": "serving_default", "instances": [{"I1": 3}]})
    assert status == 400 and body == {
        "error": "instance 0 must be an object with exactly the key 'features', got ['I1']"
    }


BAD_INSTANCES = [
    (
        [{"I1": 1}, {"I14": 2}],
        'instance 1 has unknown field "I14"; raw fields are I1..I13 (counts) and C1..C26 (strings)',
    ),
    (
        [{"I1": "abc"}],
        'instance 0 field \'I1\' is "abc", not a count; send an integer, a numeric string, null or "" (missing)',
    ),
    (
        [{"I1": True}],
        "instance 0 field 'I1' is true (bool), not a count; send an integer, a numeric string, null or \"\" (missing)",
    ),
    (
        [{"I1": [3]}],
        "instance 0 field 'I1' is [3] (list), not a count; send an integer, a numeric string, null or \"\" (missing)",
    ),
    ([{"C1": "a"}, {"I2": 2.5}], "instance 1 field 'I2' is 2.5, a fractional count; counts are integers"),
    ([{"I2": "2.5"}], "instance 0 field 'I2' is \"2.5\", a fractional count; counts are integers"),
    (
        [{"I3": 1e300}],
        "instance 0 field 'I3' is 1e+300, out of range; counts must be within ±9007199254740992 (2**53)",
    ),
    (
        [{"I3": 2**53 + 1}],
        "instance 0 field 'I3' is 9007199254740993, out of range; counts must be within ±9007199254740992 (2**53)",
    ),
    (
        [{"I3": "-9007199254740993"}],
        "instance 0 field 'I3' is \"-9007199254740993\", out of range; counts must be within ±9007199254740992 (2**53)",
    ),
    (
        [{"C5": 123}],
        "instance 0 field 'C5' is 123 (int), not a string; send a string, null or \"\" (missing)",
    ),
    (
        [{"C5": ["a"]}],
        'instance 0 field \'C5\' is ["a"] (list), not a string; send a string, null or "" (missing)',
    ),
    (
        [{"I1": 1}, [1, 2]],
        'instance 1 is [1, 2] (list), expected an object of raw Criteo fields such as {"I1": 3, "C1": "68fd1e64"}',
    ),
]


@pytest.mark.parametrize(("instances", "message"), BAD_INSTANCES)
def test_bad_raw_instance_is_a_400_naming_field_and_instance(
    onnx_server: ServerProcess, instances: list[Any], message: str
) -> None:
    status, body = predict(onnx_server, {"instances": instances})
    assert (status, body) == (400, {"error": message})
    status, body = predict(onnx_server, {"instances": [{}]})  # and the server keeps serving
    assert status == 200


def test_bad_raw_body_forms_are_400(onnx_server: ServerProcess) -> None:
    cases = [
        (
            {"signature_name": "raw", "instances": [[1, 2]]},
            'instance 0 is [1, 2] (list), expected an object of raw Criteo fields such as {"I1": 3, "C1": "68fd1e64"}',
        ),
        (
            {"signature_name": "raw", "instances": []},
            "empty batch: no instances for signature 'raw'; send at least one",
        ),
        (
            {"inputs": {"I1": [1], "C9": 3}},
            "'inputs' field 'C9' is 3 (int), expected a list with one value per instance",
        ),
        (
            {"inputs": {"I1": [1, 2], "C1": ["a"]}},
            "'inputs' fields have different lengths {'I1': 2, 'C1': 1}; send one value per instance",
        ),
        (
            {"inputs": {"I1": [1, "x"]}},
            'instance 1 field \'I1\' is "x", not a count; send an integer, a numeric string, null or "" (missing)',
        ),
        (
            {"signature_name": "raw", "inputs": {"Z": [1]}},
            "'inputs' has unknown field \"Z\"; raw fields are I1..I13 (counts) and C1..C26 (strings)",
        ),
    ]
    for body, message in cases:
        assert predict(onnx_server, body) == (400, {"error": message})


def test_metadata_shows_both_signatures(onnx_server: ServerProcess) -> None:
    status, body = http(onnx_server.url("/v1/models/ctr/metadata"))
    assert status == 200
    defs = body["metadata"]["signature_def"]["signature_def"]
    assert set(defs) == {"serving_default", "raw"}
    raw = defs["raw"]
    assert sorted(raw["inputs"]) == sorted(RAW_FIELDS)
    assert raw["inputs"]["I1"]["dtype"] == "DT_DOUBLE" and raw["inputs"]["C1"]["dtype"] == "DT_STRING"
    assert raw["outputs"]["ctr"]["tensor_shape"]["dim"] == [
        {"size": "-1", "name": ""},
        {"size": "1", "name": ""},
    ]


def grpc_raw_request(
    numeric: np.ndarray, categorical: np.ndarray, signature: str = ""
) -> predict_pb2.PredictRequest:
    """C* DT_STRING [N]; I* DT_DOUBLE [N] with NaN = missing (the stock TF Serving form)."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.signature_name = signature
    for i, f in enumerate(NUMERIC_FIELDS):
        request.inputs[f].CopyFrom(tf.make_tensor_proto(numeric[:, i], dtype=tf.float64))
    for j, f in enumerate(CATEGORICAL_FIELDS):
        request.inputs[f].CopyFrom(
            tf.make_tensor_proto([s.encode() for s in categorical[:, j]], dtype=tf.string)
        )
    return request


def test_grpc_raw_tensors_match_the_features_path(onnx_server: ServerProcess, raw_repo) -> None:
    _, spec, seen = raw_repo
    rows = raw_rows(seen)
    want = features_path(onnx_server, spec, rows)
    numeric, categorical = as_arrays(rows)
    with grpc.insecure_channel(onnx_server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(grpc_raw_request(numeric, categorical), timeout=10)
        assert response.model_spec.signature_name == "raw"
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["ctr"]), want, atol=1e-6, rtol=0)
        # Counts as DT_STRING ("" = missing) and DT_INT64, and absent inputs (all missing), give the same.
        request = grpc_raw_request(numeric, categorical, "raw")
        texts = [b"" if math.isnan(v) else str(int(v)).encode() for v in numeric[:, 0]]
        request.inputs["I1"].CopyFrom(tf.make_tensor_proto(texts, dtype=tf.string))
        request.inputs["I2"].CopyFrom(
            tf.make_tensor_proto(np.nan_to_num(numeric[:, 1], nan=7).astype(np.int64))
        )
        del request.inputs["C26"]
        response = stub.Predict(request, timeout=10)
        numeric[:, 1] = np.nan_to_num(numeric[:, 1], nan=7)
        categorical[:, 25] = ""
        want = features_path(
            onnx_server,
            spec,
            [
                {
                    **{
                        f: (None if math.isnan(v) else int(v)) for f, v in zip(NUMERIC_FIELDS, n, strict=True)
                    },
                    **dict(zip(CATEGORICAL_FIELDS, c, strict=True)),
                }
                for n, c in zip(numeric, categorical, strict=True)
            ],
        )
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["ctr"]), want, atol=1e-6, rtol=0)
        metadata = stub.GetModelMetadata(
            get_model_metadata_pb2.GetModelMetadataRequest(
                model_spec={"name": "ctr"}, metadata_field=["signature_def"]
            ),
            timeout=10,
        )
        assert "raw" in str(metadata.metadata["signature_def"].value)


@pytest.mark.parametrize(
    ("field", "tensor", "message"),
    [
        (
            "C1",
            tf.make_tensor_proto([1.0], dtype=tf.float64),
            "input 'C1' has dtype DT_DOUBLE, expected DT_STRING",
        ),
        (
            "I1",
            tf.make_tensor_proto([1.0, 2.5], dtype=tf.float64),
            "row 1 field 'I1' is 2.5, a fractional count; counts are integers",
        ),
        (
            "I1",
            tf.make_tensor_proto([math.inf, 1.0], dtype=tf.float64),
            "row 0 field 'I1' is Infinity, out of range; counts must be within ±9007199254740992 (2**53)",
        ),
        (
            "I1",
            tf.make_tensor_proto([b"1", b"x"], dtype=tf.string),
            'row 1 field \'I1\' is "x", not a count; send an integer, a numeric string, null or "" (missing)',
        ),
        (
            "I99",
            tf.make_tensor_proto([1.0], dtype=tf.float64),
            'inputs has unknown field "I99"; raw fields are I1..I13 (counts) and C1..C26 (strings)',
        ),
    ],
)
def test_bad_grpc_raw_tensor_is_invalid_argument(
    onnx_server: ServerProcess, field: str, tensor: Any, message: str
) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.model_spec.signature_name = "raw"
    request.inputs[field].CopyFrom(tensor)
    with grpc.insecure_channel(onnx_server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Predict(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == message


def test_tf_backend_serves_the_savedmodel_raw_signature(
    tmp_path: Path, raw_repo, onnx_server: ServerProcess
) -> None:
    base, spec, seen = raw_repo
    rows = raw_rows(seen)
    _, from_onnx = predict(onnx_server, {"instances": rows})
    server = ServerProcess(base, tmp_path / "tf.log", "--backend=tf")
    try:
        server.wait_ready()
        status, body = predict(server, {"instances": rows})
        assert status == 200, body
        np.testing.assert_allclose(body["predictions"], from_onnx["predictions"], atol=1e-6, rtol=0)
        np.testing.assert_allclose(body["predictions"], features_path(server, spec, rows), atol=1e-6, rtol=0)
    finally:
        server.stop()


def test_version_without_raw_graph_names_the_fix(tmp_path: Path, raw_repo, start_server) -> None:
    base = tmp_path / "ctr"
    shutil.copytree(raw_repo[0], base)
    (base / "1" / "model_raw.onnx").unlink()
    write_manifest(base / "1", 1)
    server = start_server(base)
    status, body = predict(server, {"instances": [{"I1": 1}]})
    assert status == 400
    assert body == {
        "error": 'Serving signature name: "raw" not found in signature def; this version was exported before raw '
        "serving: send 'features' or re-export it"
    }
    metadata = http(server.url("/v1/models/ctr/metadata"))[1]
    assert set(metadata["metadata"]["signature_def"]["signature_def"]) == {"serving_default"}


def test_print_curl_example_sends_a_readable_criteo_row(tmp_path: Path, raw_repo) -> None:
    server = ServerProcess(raw_repo[0], tmp_path / "server.log", "--print_curl_example")
    try:
        server.wait_ready()
        deadline = time.monotonic() + 10
        while "curl -s" not in server.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        log = server.log()
        command = log[log.index("curl -s") : log.index("}'", log.index("curl -s")) + 2]
        assert '{"instances":[{"I1":1,"I2":1,"I3":5,' in command and '"C26":"9727dd16"}]}' in command
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.startswith('{"predictions":[[') and out.stdout.endswith("]]}")
    finally:
        assert server.stop() == 0


def test_concurrent_raw_requests_through_the_batcher_each_get_their_own_rows(
    onnx_server: ServerProcess, raw_repo
) -> None:
    _, spec, seen = raw_repo
    rows = raw_rows(seen) * 4  # 32 different requests of 1..3 rows, sent at once to the batching server
    bodies = [{"instances": rows[i : i + 1 + i % 3]} for i in range(len(rows))]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda b: predict(onnx_server, b), bodies))
    for body, (status, answer) in zip(bodies, answers, strict=True):
        assert status == 200, answer
        np.testing.assert_allclose(
            answer["predictions"], features_path(onnx_server, spec, body["instances"]), atol=1e-6, rtol=0
        )


def test_fast_path_rows_alone_again_and_in_a_body_for_the_child_match_the_features_path(
    onnx_server: ServerProcess, raw_repo
) -> None:
    _, spec, seen = raw_repo
    rows = [raw_rows(seen)[i] for i in (0, 2, 3, 4, 5, 6)]  # no numeric strings, no ±2**53: scan forms
    want = features_path(onnx_server, spec, rows)
    for _ in range(2):  # a single row: numpy's z-scores first, the one-row cache's the second time
        for row, expected in zip(rows, want, strict=True):
            status, answer = predict(onnx_server, {"instances": [row]})
            assert status == 200 and answer["predictions"] == [expected.tolist()], answer
    many = json.dumps({"instances": rows * 170}, indent=4).encode()  # 1,020 rows spaced out over 256 KiB
    assert len(many) > INLINE_MAX_BYTES  # decoded in the child process
    status, answer = predict(onnx_server, raw=many)
    assert status == 200, answer
    np.testing.assert_array_equal(answer["predictions"], np.tile(want, (170, 1)))
