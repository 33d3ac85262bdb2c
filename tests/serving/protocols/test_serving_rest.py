"""REST API against a real server: every endpoint, both predict formats, versions, labels and errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.serving.model_repo import reference_predict
from tests.serving.server_process import ServerProcess, http

ROWS = np.random.default_rng(0).random((3, 128), dtype=np.float32)


def _scores(body: dict, key: str) -> np.ndarray:
    return np.asarray(body[key], dtype=np.float64)


def test_predict_row_format_matches_reference(shared_server: ServerProcess, weights) -> None:
    status, body = http(shared_server.url("/v1/models/ctr:predict"), {"instances": ROWS.tolist()})
    assert status == 200
    assert list(body) == ["predictions"]
    np.testing.assert_allclose(_scores(body, "predictions"), reference_predict(weights[1], ROWS), atol=1e-6)


def test_predict_row_format_with_named_instances(shared_server: ServerProcess, weights) -> None:
    instances = [{"features": row} for row in ROWS.tolist()]
    status, body = http(shared_server.url("/v1/models/ctr:predict"), {"instances": instances})
    assert status == 200
    np.testing.assert_allclose(_scores(body, "predictions"), reference_predict(weights[1], ROWS), atol=1e-6)


@pytest.mark.parametrize("inputs", [{"features": ROWS.tolist()}, ROWS.tolist()], ids=["named", "bare"])
def test_predict_columnar_format_returns_outputs(shared_server: ServerProcess, weights, inputs) -> None:
    request = {"signature_name": "serving_default", "inputs": inputs}
    status, body = http(shared_server.url("/v1/models/ctr:predict"), request)
    assert status == 200
    assert list(body) == ["outputs"]
    np.testing.assert_allclose(_scores(body, "outputs"), reference_predict(weights[1], ROWS), atol=1e-6)


@pytest.mark.parametrize(
    "path", ["/v1/models/ctr/versions/1:predict", "/v1/models/ctr/labels/stable:predict"]
)
def test_predict_by_version_and_label(shared_server: ServerProcess, weights, path: str) -> None:
    status, body = http(shared_server.url(path), {"instances": ROWS[:1].tolist()})
    assert status == 200
    np.testing.assert_allclose(
        _scores(body, "predictions"), reference_predict(weights[1], ROWS[:1]), atol=1e-6
    )


@pytest.mark.parametrize(
    ("path", "status", "error"),
    [
        ("/v1/models/foo:predict", 404, "Servable not found for request: Latest(foo)"),
        ("/v1/models/ctr/versions/7:predict", 404, "Servable not found for request: Specific(ctr, 7)"),
        ("/v1/models/ctr/labels/canary:predict", 400, "Unrecognized servable version label: canary"),
        ("/v1/models/ctr/versions/x1:predict", 400, "version must be a positive integer, got 'x1'"),
        ("/v1/models/ctr/versions/%C2%B2:predict", 400, "version must be a positive integer, got '²'"),
        ("/v1/models/ctr:classify", 501, "classify is not served; this model has a predict signature only"),
    ],
)
def test_predict_errors_use_tf_serving_status_and_shape(
    shared_server, path: str, status: int, error: str
) -> None:
    assert http(shared_server.url(path), {"instances": ROWS[:1].tolist()}) == (status, {"error": error})


def test_status_reports_the_available_version(shared_server: ServerProcess) -> None:
    expected = {
        "model_version_status": [
            {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]
    }
    for path in ("/v1/models/ctr", "/v1/models/ctr/versions/1", "/v1/models/ctr/labels/stable"):
        assert http(shared_server.url(path)) == (200, expected)


def test_status_of_unknown_model_or_version_is_404(shared_server: ServerProcess) -> None:
    assert http(shared_server.url("/v1/models/foo")) == (
        404,
        {"error": "Could not find any versions of model foo"},
    )
    assert http(shared_server.url("/v1/models/ctr/versions/9")) == (
        404,
        {"error": "Could not find version 9 of model ctr"},
    )


def test_metadata_reports_the_signature(shared_server: ServerProcess) -> None:
    status, body = http(shared_server.url("/v1/models/ctr/metadata"))
    assert status == 200
    assert body["model_spec"] == {"name": "ctr", "version": "1", "signature_name": ""}
    sig = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    dims = {"dim": [{"size": "-1", "name": ""}, {"size": "128", "name": ""}], "unknown_rank": False}
    assert sig["inputs"] == {
        "features": {"name": "serving_default_features:0", "dtype": "DT_FLOAT", "tensor_shape": dims}
    }
    assert sig["outputs"]["ctr"]["dtype"] == "DT_FLOAT"
    assert sig["outputs"]["ctr"]["tensor_shape"]["dim"] == [
        {"size": "-1", "name": ""},
        {"size": "1", "name": ""},
    ]


def test_liveness_route(shared_server: ServerProcess) -> None:
    assert http(shared_server.url("/healthz")) == (200, {"status": "alive"})


def test_both_metrics_paths_serve_tf_serving_names(shared_server: ServerProcess) -> None:
    http(shared_server.url("/v1/models/ctr:predict"), {"instances": ROWS[:1].tolist()})
    for path in ("/monitoring/prometheus/metrics", "/metrics"):
        status, text = http(shared_server.url(path))
        assert status == 200
        assert "# TYPE :tensorflow:serving:request_count counter" in text
        assert "# TYPE :tensorflow:serving:request_latency histogram" in text
        assert 'ctr_serving_model_version{model_name="ctr"} 1' in text


def test_wrong_method_and_unknown_route(shared_server: ServerProcess) -> None:
    assert http(shared_server.url("/v1/models/ctr:predict")) == (
        405,
        {"error": "method GET is not allowed here; use POST"},
    )
    assert http(shared_server.url("/v2/models"), method="GET") == (
        404,
        {"error": "Malformed request: GET /v2/models"},
    )


@pytest.mark.parametrize(
    ("path", "target"),
    [
        ("/v1/models/ctr:predict", (("ctr", None, None, ()), "predict")),
        ("/v1/models/ctr/labels/stable:predict", (("ctr", None, "stable", ()), "predict")),
        ("/v1/models/ctr/versions/2/metadata", (("ctr", "2", None, ("metadata",)), None)),
        (
            "/v1/models/ctr%3Apredict",
            (("ctr:predict", None, None, ()), None),
        ),  # an encoded `:` is in the name
        ("/v1/other/ctr:predict", (None, "predict")),
    ],
)
def test_v1_target_splits_name_version_label_and_verb_the_same_when_cached(
    path: str, target: tuple[object, object]
) -> None:
    from serving.protocols.tfs_rest import v1_target

    assert v1_target(path) == target
    assert v1_target(path) == target  # the second answer is the cache's
