"""Versions: hot reload under load, corrupt versions, deleting the served version, policies, readiness."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from http.client import HTTPConnection
from pathlib import Path

import numpy as np
import pytest

from tests.serving.model_repo import make_weights, reference_predict, write_manifest, write_version
from tests.serving.server_process import ServerProcess, http

ROW = np.random.default_rng(3).random((1, 128), dtype=np.float32)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s}s")
        time.sleep(0.1)


def _states(server: ServerProcess) -> dict[str, str]:
    _, body = http(server.url("/v1/models/ctr"))
    return {s["version"]: s["state"] for s in body["model_version_status"]} if isinstance(body, dict) else {}


def _predict(server: ServerProcess, path: str = "/v1/models/ctr:predict") -> float:
    status, body = http(server.url(path), {"instances": ROW.tolist()})
    assert status == 200, body
    return float(body["predictions"][0][0])


class LoadLoop(threading.Thread):
    """Keep-alive predict requests in a loop; records every status and score."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.server, self.stop = server, threading.Event()
        self.results: list[tuple[int, float]] = []

    def run(self) -> None:
        conn = HTTPConnection("127.0.0.1", self.server.rest_port, timeout=10)
        body = json.dumps({"instances": ROW.tolist()})
        while not self.stop.is_set():
            conn.request("POST", "/v1/models/ctr:predict", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = json.loads(response.read())
            self.results.append((response.status, payload.get("predictions", [[None]])[0][0]))


def test_hot_reload_under_load_has_no_failed_requests(start_server, writable_base: Path, weights) -> None:
    server = start_server(writable_base, "--file_system_poll_wait_seconds=1")
    load = LoadLoop(server)
    load.start()
    _wait_for(lambda: len(load.results) >= 50)  # traffic on version 1 before version 2 lands
    write_version(writable_base, 2, weights[2])
    _wait_for(lambda: _states(server).get("2") == "AVAILABLE")
    answered = len(load.results)
    _wait_for(lambda: len(load.results) >= answered + 50)  # and after the swap
    load.stop.set()
    load.join(10)
    v1, v2 = (float(reference_predict(weights[v], ROW)[0, 0]) for v in (1, 2))
    statuses = {status for status, _ in load.results}
    assert statuses == {200}
    served = [min((abs(score - v1), 1), (abs(score - v2), 2))[1] for _, score in load.results]
    assert served[0] == 1 and served[-1] == 2
    assert served == sorted(served), "once version 2 served, version 1 never came back"
    assert _states(server) == {"2": "AVAILABLE", "1": "END"}
    assert len(load.results) > 50


def test_corrupt_version_is_rejected_and_old_keeps_serving(
    start_server, writable_base: Path, weights
) -> None:
    server = start_server(writable_base, "--file_system_poll_wait_seconds=1")
    tmp = writable_base / ".tmp-2"
    tmp.mkdir()
    (tmp / "model.onnx").write_bytes(b"this is not an onnx model")
    write_manifest(tmp, 2)  # the bytes are as published: the load itself must fail
    tmp.rename(writable_base / "2")
    _wait_for(lambda: _states(server).get("2") == "END")
    status, body = http(server.url("/v1/models/ctr/versions/2"))
    assert status == 503  # the version asked for is not available
    (entry,) = body["model_version_status"]
    assert entry["status"]["error_code"] == "UNKNOWN"
    assert entry["status"]["error_message"].startswith("failed to load version 2: ONNX Runtime cannot load")
    assert http(server.url("/v1/models/ctr"))[0] == 200
    assert _predict(server) == pytest.approx(float(reference_predict(weights[1], ROW)[0, 0]), abs=1e-6)
    _, text = http(server.url("/metrics"))
    assert 'ctr_serving_model_load_failures_total{model_name="ctr"} 1' in text
    assert 'ctr_serving_model_version{model_name="ctr"} 1' in text


def test_deleting_the_served_version_falls_back_to_the_previous(
    start_server, writable_base: Path, weights
) -> None:
    write_version(writable_base, 2, weights[2])
    server = start_server(writable_base, "--file_system_poll_wait_seconds=1")
    assert _predict(server) == pytest.approx(float(reference_predict(weights[2], ROW)[0, 0]), abs=1e-6)
    shutil.rmtree(writable_base / "2")
    _wait_for(lambda: _states(server).get("1") == "AVAILABLE")
    assert _predict(server) == pytest.approx(float(reference_predict(weights[1], ROW)[0, 0]), abs=1e-6)


def test_latest_two_policy_serves_both_versions(start_server, writable_base: Path, weights) -> None:
    write_version(writable_base, 2, weights[2])
    server = start_server(
        writable_base, "--model_version_policy=latest:2", "--version_labels=stable=1,canary=2"
    )
    # Ready once version 2 is AVAILABLE; version 1 loads right after it.
    _wait_for(lambda: _states(server) == {"2": "AVAILABLE", "1": "AVAILABLE"})
    for version, path in (
        (1, "/v1/models/ctr/labels/stable:predict"),
        (2, "/v1/models/ctr/versions/2:predict"),
    ):
        expected = float(reference_predict(weights[version], ROW)[0, 0])
        assert _predict(server, path) == pytest.approx(expected, abs=1e-6)
    # An unlabelled request goes to the `stable` label's version, not the latest (serving/routing/router.py).
    assert _predict(server) == pytest.approx(float(reference_predict(weights[1], ROW)[0, 0]), abs=1e-6)


def test_readiness_is_503_until_a_version_is_loaded(start_server, tmp_path: Path) -> None:
    base = tmp_path / "empty"
    base.mkdir()
    server = start_server(base, "--file_system_poll_wait_seconds=1", wait=False)
    _wait_for(lambda: http(server.url("/healthz"))[0] == 200)
    assert http(server.url("/v1/models/ctr")) == (503, {"model_version_status": []})
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROW.tolist()})
    assert (status, body["error"]) == (
        503,
        "Servable not found for request: Latest(ctr); no version is loaded yet",
    )
    write_version(base, 3, make_weights(seed=3))
    _wait_for(lambda: http(server.url("/v1/models/ctr"))[0] == 200)
