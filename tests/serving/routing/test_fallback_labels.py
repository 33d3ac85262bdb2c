"""Which version is the last good one: the stable label's, else the newest other version with a closed breaker.

Versions 1 and 3 are plain MLPs; version 2 answers NaN for rows whose feature 0 is above 10
(tests/serving/fallback_repo.py). Every routed request of a poison row fails on version 2 and is retried once on
the last good version, so its answer says which version that is.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.serving.fallback_repo import rows as make_rows
from tests.serving.fallback_repo import write_broken_version, write_good_version
from tests.serving.model_repo import make_weights
from tests.serving.routing.test_fallback import (
    BREAKER_FLAGS,
    CLEAN,
    POISON_NAN,
    WEIGHTS,
    answered_by,
    predict,
)
from tests.serving.server_process import ServerProcess

WEIGHTS_3 = make_weights(3)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("labels") / "ctr"
    base.mkdir()
    write_good_version(base, 1, WEIGHTS[1])
    write_broken_version(base, 2, WEIGHTS[2])
    write_good_version(base, 3, WEIGHTS_3)
    return base


def _server(base: Path, log: Path, *flags: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(base, log, "--model_version_policy=all", *BREAKER_FLAGS, *flags)
    try:
        proc.wait_versions({1, 2, 3})
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def canary(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Version 2 is the canary at 100 %, version 1 stable; every request logged."""
    folder = tmp_path_factory.mktemp("canary")
    yield from _server(
        base,
        folder / "server.log",
        "--version_labels=stable=1,canary=2",
        "--canary_percent=100",
        f"--request_log_dir={folder / 'requests'}",
        "--request_log_sample_rate=1",
    )


def logged(server: ServerProcess, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The request log line of `request_id` (the writer thread is polled for it)."""
    folder = Path(
        next(f for f in server.proc.args if str(f).startswith("--request_log_dir=")).split("=", 1)[1]
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in folder.glob("requests-*.jsonl"):
            for line in path.read_text().splitlines():
                entry = json.loads(line)
                if entry["request_id"] == request_id and not entry["shadow"]:
                    return entry
        time.sleep(0.05)
    raise AssertionError(f"no request log line for {request_id}")


def test_a_broken_canary_falls_back_to_stable_not_to_the_newest(canary: ServerProcess) -> None:
    status, body, headers = predict(canary, CLEAN)
    assert status == 200 and headers["x-model-version"] == "2" and "x-ctr-fallback" not in headers
    status, body, headers = predict(canary, POISON_NAN, headers={"x-request-id": "poisoned-canary-1"})
    assert status == 200 and answered_by(body, POISON_NAN) == 1
    assert (headers["x-model-version"], headers["x-ctr-fallback"]) == ("1", "non_finite")
    entry = logged(canary, "poisoned-canary-1")  # the log says which version answered, and why
    assert (entry["model"]["version"], entry["fallback"]) == (1, "non_finite")


def test_a_broken_stable_falls_back_to_the_newest_other_version(base: Path, tmp_path: Path) -> None:
    for proc in _server(base, tmp_path / "server.log", "--version_labels=stable=2"):
        status, body, headers = predict(proc, CLEAN)
        assert status == 200 and headers["x-model-version"] == "2"
        status, body, headers = predict(proc, POISON_NAN)
        assert status == 200 and (headers["x-model-version"], headers["x-ctr-fallback"]) == (
            "3",
            "non_finite",
        )
        # An explicit label is never redirected: /labels/stable is version 2's answer or its error.
        status, body, headers = predict(proc, POISON_NAN, "/v1/models/ctr/labels/stable:predict")
        assert status == 500 and "not finite" in body["error"] and "x-ctr-fallback" not in headers


def test_the_v2_protocol_falls_back_alike(canary: ServerProcess) -> None:
    batch = make_rows(POISON_NAN)
    tensor = {
        "name": "features",
        "shape": list(batch.shape),
        "datatype": "FP32",
        "data": batch.ravel().tolist(),
    }
    conn = http.client.HTTPConnection("127.0.0.1", canary.rest_port, timeout=10)
    conn.request(
        "POST", "/v2/models/ctr/infer", json.dumps({"inputs": [tensor]}), {"content-type": "application/json"}
    )
    response = conn.getresponse()
    answer, headers = json.loads(response.read()), dict(response.getheaders())
    conn.close()
    assert response.status == 200, answer
    assert answer["model_version"] == "1"
    assert (headers["x-model-version"], headers["x-ctr-fallback"]) == ("1", "non_finite")
    assert answered_by({"predictions": [answer["outputs"][0]["data"][0]]}, POISON_NAN) == 1
