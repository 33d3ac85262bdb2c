"""Shadow scoring (serving/dataplane/shadow.py) on a real server with two versions: the `shadow` label's version
scores the sampled share of unlabelled requests off the client's path, its scores go to the request log as
shadow lines, the client always gets the stable version's answer, and a corrupt shadow version changes nothing
but a counter.
"""

from __future__ import annotations

import json
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.serving.model_repo import WIDTH, make_weights, reference_predict, write_version
from tests.serving.server_process import ServerProcess, http

SHADOW_PERCENT = 30.0
N_REQUESTS = 120
ROWS = np.random.default_rng(11).random((2, WIDTH)).round(4).astype(np.float32)
WEIGHTS = {1: make_weights(seed=1), 2: make_weights(seed=2)}


def shadowed(request_id: str) -> bool:
    """The documented rule: mix32(crc32(b"shadow:" + id)) < p / 100 * 2**32, mix32 MurmurHash3's fmix32."""
    h = zlib.crc32(b"shadow:" + request_id.encode())
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16) < SHADOW_PERCENT / 100 * 2**32


def predict(server: ServerProcess, request_id: str, path: str = "") -> tuple[list[list[float]], str | None]:
    """One REST predict of ROWS with a client's request id; (predictions, x-model-version)."""
    body = json.dumps({"instances": ROWS.tolist()}).encode()
    url = server.url(f"/v1/models/ctr{path}:predict")
    request = urllib.request.Request(url, body, {"x-request-id": request_id}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        return json.loads(response.read())["predictions"], response.headers.get("x-model-version")


def samples(server: ServerProcess, name: str) -> dict[str, float]:
    """Every sample of metric `name`: label text -> value."""
    _, text = http(server.url("/metrics"))
    prefix = name + "{"
    return {
        line[len(name) :].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in str(text).splitlines()
        if line.startswith(prefix)
    }


def log_lines(directory: Path) -> list[dict]:
    return [
        json.loads(line)
        for f in sorted(directory.glob("requests-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def wait_for_lines(directory: Path, n: int, timeout_s: float = 20.0) -> list[dict]:
    """The log's lines once it holds `n` (the writer thread and the shadow worker are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while len(log_lines(directory)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # a line beyond the expected ones would show now
    return log_lines(directory)


def start(base: Path, logs: Path, tmp: Path, *flags: str) -> ServerProcess:
    server = ServerProcess(
        base,
        tmp / "server.log",
        "--model_version_policy=all",
        "--version_labels=stable=1,shadow=2",
        f"--shadow_percent={SHADOW_PERCENT:g}",
        f"--request_log_dir={logs}",
        "--request_log_sample_rate=1",
        *flags,
    )
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def shadow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    """Versions 1 (stable) and 2 (shadow), batching on, every request logged."""
    tmp = tmp_path_factory.mktemp("shadow")
    base = tmp / "ctr"
    for version, weights in WEIGHTS.items():
        write_version(base, version, weights)
    server = start(base, tmp / "requests", tmp, "--enable_batching=true")
    server.wait_versions({1, 2})
    yield server, tmp / "requests"
    server.stop()


def test_shadow_lines_hold_the_shadow_versions_scores_for_the_sampled_share(shadow_server) -> None:
    server, logs = shadow_server
    ids = [f"shadow-test-{i}" for i in range(N_REQUESTS)]
    expected = {i for i in ids if shadowed(i)}
    assert 0.15 * N_REQUESTS < len(expected) < 0.45 * N_REQUESTS  # the hash spreads these ids as a 30% share
    stable, shadow = reference_predict(WEIGHTS[1], ROWS), reference_predict(WEIGHTS[2], ROWS)
    for request_id in ids:
        predictions, version = predict(server, request_id)
        np.testing.assert_allclose(predictions, stable, rtol=1e-5, atol=1e-6)  # the stable version answers
        assert version == "1"
    lines = wait_for_lines(logs, N_REQUESTS + len(expected))
    primary = {line["request_id"]: line for line in lines if not line["shadow"]}
    shadows = [line for line in lines if line["shadow"]]
    assert sorted(primary) == sorted(ids)
    assert sorted(line["request_id"] for line in shadows) == sorted(expected)  # each sampled one, once
    for line in shadows:
        assert line["model"] == {"name": "ctr", "version": 2, "label": "shadow"}
        assert line["inputs"] is None
        assert line["canary"] is False and line["fallback"] is None
        assert line["time"] == primary[line["request_id"]]["time"]
        np.testing.assert_allclose(line["outputs"], shadow, rtol=1e-5, atol=1e-6)
    for line in primary.values():
        assert line["model"]["version"] == 1
        np.testing.assert_allclose(line["outputs"], stable, rtol=1e-5, atol=1e-6)
    scored = samples(server, "ctr_serving_shadow_scored_total")
    assert scored == {'{model_name="ctr",version="2"}': float(len(expected))}
    dropped = samples(server, "ctr_serving_shadow_dropped_total")
    assert set(dropped.values()) == {0.0} and len(dropped) == 5  # every reason exists at 0, none counted


def test_explicit_versions_and_labels_are_never_shadowed(shadow_server) -> None:
    server, logs = shadow_server
    before = len(log_lines(logs))
    scored = samples(server, "ctr_serving_shadow_scored_total")
    ids = [f"explicit-{i}" for i in range(40)]
    assert any(shadowed(i) for i in ids)  # unlabelled, some of these would be shadowed
    for n, request_id in enumerate(ids):
        path = "/versions/1" if n % 2 else "/labels/stable"
        predictions, _ = predict(server, request_id, path)
        np.testing.assert_allclose(predictions, reference_predict(WEIGHTS[1], ROWS), rtol=1e-5, atol=1e-6)
    lines = wait_for_lines(logs, before + len(ids))[before:]
    assert len(lines) == len(ids)
    assert not any(line["shadow"] for line in lines)
    assert samples(server, "ctr_serving_shadow_scored_total") == scored


def test_a_corrupt_shadow_version_is_never_loaded_and_never_touches_an_answer(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    write_version(base, 1, WEIGHTS[1])
    corrupt = write_version(base, 2, WEIGHTS[2])
    (corrupt / "model.onnx").write_bytes(b"not the file the manifest hashed")
    logs = tmp_path / "requests"
    server = start(base, logs, tmp_path)
    try:
        ids = [f"corrupt-{i}" for i in range(60)]
        expected = sum(shadowed(i) for i in ids)
        for request_id in ids:
            predictions, version = predict(server, request_id)
            np.testing.assert_allclose(predictions, reference_predict(WEIGHTS[1], ROWS), rtol=1e-5, atol=1e-6)
            assert version == "1"
        lines = wait_for_lines(logs, len(ids))
        assert len(lines) == len(ids) and not any(line["shadow"] for line in lines)
        dropped = samples(server, "ctr_serving_shadow_dropped_total")
        assert dropped['{model_name="ctr",reason="unavailable"}'] == expected > 0
        assert samples(server, "ctr_serving_shadow_scored_total") == {}
        _, status = http(server.url("/v1/models/ctr"))
        states = {int(v["version"]): v["state"] for v in status["model_version_status"]}
        assert states[1] == "AVAILABLE" and states[2] != "AVAILABLE"  # its hash is checked before any load
    finally:
        server.stop()
