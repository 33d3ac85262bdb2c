"""Circuit breaking and fallback on a real server: a broken version's routed requests are answered by the good one.

Version 1 is a plain MLP; version 2 the same kind of MLP that answers NaN for rows whose feature 0 is above 10
and fails for feature 0 from 200 on (tests/serving/fallback_repo.py). With no labels, routed (unlabelled)
requests go to the latest version, 2. The breaker's flags are small so that each phase takes a few requests.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.routing.fallback import PROBE_SUCCESSES
from tests.serving.fallback_repo import ERROR_AT, write_broken_version, write_good_version
from tests.serving.fallback_repo import rows as make_rows
from tests.serving.model_repo import make_weights, reference_predict
from tests.serving.server_process import ServerProcess

WEIGHTS = {1: make_weights(1), 2: make_weights(2)}
COOLDOWN_S = 3.0
PROBE_EVERY = 2
BREAKER_FLAGS = (
    "--num_workers=1",  # the breakers are per worker: one sees every request
    "--fallback_error_rate=0.5",
    "--fallback_min_requests=4",
    "--fallback_window_s=60",
    f"--fallback_cooldown_s={COOLDOWN_S}",
    f"--fallback_probe_every={PROBE_EVERY}",
)
CLEAN, POISON_NAN, POISON_ERROR = 0.5, 20.0, ERROR_AT + 300


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("fallback") / "ctr"
    base.mkdir()
    write_good_version(base, 1, WEIGHTS[1])
    write_broken_version(base, 2, WEIGHTS[2])
    proc = ServerProcess(
        base, tmp_path_factory.mktemp("logs") / "server.log", "--model_version_policy=all", *BREAKER_FLAGS
    )
    proc.wait_versions({1, 2})
    yield proc
    proc.stop()


def predict(
    server: ServerProcess,
    x0: float,
    path: str = "/v1/models/ctr:predict",
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """One REST predict of one row with feature 0 = x0: (status, body, lower-cased response headers)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    try:
        body = json.dumps({"instances": make_rows(x0).tolist()})
        conn.request("POST", path, body, {"content-type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, json.loads(response.read()), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def answered_by(body: Any, x0: float) -> int:
    """Which version's weights made the one prediction in `body`."""
    score = np.asarray(body["predictions"], np.float64).reshape(-1)[0]
    for version, weights in WEIGHTS.items():
        if abs(score - reference_predict(weights, make_rows(x0))[0, 0]) < 1e-5:
            return version
    raise AssertionError(f"prediction {score} is neither version's")


def fallbacks(server: ServerProcess) -> dict[tuple[str, str], float]:
    """ctr_serving_fallbacks_total by (version, reason)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    found = {}
    for line in text.splitlines():
        if line.startswith("ctr_serving_fallbacks_total{"):
            labels, value = line[len("ctr_serving_fallbacks_total{") :].split("} ")
            pairs = dict(p.split("=", 1) for p in labels.split(","))
            found[(pairs["version"].strip('"'), pairs["reason"].strip('"'))] = float(value)
    return found


def test_counter_exists_at_zero_for_each_version_and_reason(server: ServerProcess) -> None:
    counts = fallbacks(server)
    for version in ("1", "2"):
        for reason in ("errors", "non_finite", "deadline", "unavailable"):
            assert counts.get((version, reason)) == 0, counts


def test_nonfinite_version_is_retried_then_opened_then_probed_back(server: ServerProcess) -> None:
    status, body, headers = predict(server, CLEAN)
    assert status == 200 and answered_by(body, CLEAN) == 2 and "x-ctr-fallback" not in headers
    # A NaN on version 2 is retried on version 1: the client gets version 1's score, marked.
    for _ in range(3):
        status, body, headers = predict(server, POISON_NAN)
        assert status == 200, body
        assert answered_by(body, POISON_NAN) == 1
        assert headers["x-ctr-fallback"] == "non_finite" and headers["x-model-version"] == "1"
    # 3 failures in 4 outcomes (>= 0.5, >= 4 outcomes): open. Even clean rows now go to version 1.
    status, body, headers = predict(server, CLEAN)
    assert status == 200 and answered_by(body, CLEAN) == 1
    assert headers["x-ctr-fallback"] == "non_finite" and headers["x-model-version"] == "1"
    assert fallbacks(server)[("2", "non_finite")] == 4
    # An explicit version is never redirected: the client asked for version 2.
    status, body, _ = predict(server, CLEAN, "/v1/models/ctr/versions/2:predict")
    assert status == 200 and answered_by(body, CLEAN) == 2
    status, body, _ = predict(server, POISON_NAN, "/v1/models/ctr/versions/2:predict")
    assert status == 500 and "not finite" in body["error"]
    # After the cool-down: half-open, one routed request in PROBE_EVERY goes to version 2; 3 good ones close it.
    time.sleep(COOLDOWN_S + 0.2)
    versions = [answered_by(predict(server, CLEAN)[1], CLEAN) for _ in range(PROBE_EVERY * PROBE_SUCCESSES)]
    assert versions == [2, 1, 2, 1, 2, 2], versions
    assert [answered_by(predict(server, CLEAN)[1], CLEAN) for _ in range(3)] == [2, 2, 2]
    assert fallbacks(server)[("2", "non_finite")] == 4 + PROBE_SUCCESSES - 1
    assert "version 2: circuit open (non_finite)" in server.log()


def test_backend_error_is_retried_on_the_last_good_version_over_grpc(server: ServerProcess) -> None:
    before = fallbacks(server)[("2", "errors")]
    request = grpc_request(make_rows(POISON_ERROR))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response, call = stub.Predict.with_call(request, timeout=10)
        trailing = dict(call.trailing_metadata() or ())
    assert response.model_spec.version.value == 1
    score = float(np.frombuffer(response.outputs["ctr"].tensor_content, np.float32)[0])
    assert abs(score - reference_predict(WEIGHTS[1], make_rows(POISON_ERROR))[0, 0]) < 1e-5
    assert trailing["x-ctr-fallback"] == "errors"
    assert fallbacks(server)[("2", "errors")] == before + 1


def grpc_request(batch: np.ndarray) -> Any:
    """A TF Serving PredictRequest of `batch` for model ctr, unlabelled."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.inputs["features"].dtype = 1  # DT_FLOAT
    for d in batch.shape:
        request.inputs["features"].tensor_shape.dim.add().size = d
    request.inputs["features"].tensor_content = batch.tobytes()
    return request


def test_without_a_last_good_version_the_error_is_returned(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    base.mkdir()
    write_broken_version(base, 2, WEIGHTS[2])
    proc = ServerProcess(base, tmp_path / "server.log", *BREAKER_FLAGS)
    try:
        proc.wait_ready()
        for _ in range(6):  # past the threshold: the circuit opens, but nothing else can answer
            status, body, headers = predict(proc, POISON_NAN)
            assert status == 500 and "not finite" in body["error"] and "x-ctr-fallback" not in headers
        status, body, _ = predict(proc, CLEAN)
        assert status == 200 and answered_by(body, CLEAN) == 2
        assert all(v == 0 for v in fallbacks(proc).values()), fallbacks(proc)
    finally:
        proc.stop()
