"""`--model_config_file`: several models from TF Serving's text format, edited at run time under load."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.http as triton
from google.protobuf import text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from serving.repository.model_config import parse_model_config
from serving.repository.policy import VersionPolicy
from tests.helpers import REPO_ROOT
from tests.serving.model_repo import make_weights, reference_predict, write_version
from tests.serving.server_process import CONFIG_POLLS, ServerProcess, http, wait_polls

ROW = np.random.default_rng(9).random((1, 128), np.float32)


def config_text(models: dict[str, Path], labels: str = "") -> str:
    """A model_config_list naming each model's base path (stock TF Serving's platform and policy fields)."""
    entries = "".join(
        f'  config {{\n    name: "{name}"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ latest {{ num_versions: 1 }} }}\n{labels}  }}\n"
        for name, base in models.items()
    )
    return f"model_config_list {{\n{entries}}}\n"


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three one-version models with different weights (seeds 1, 2, 3)."""
    root = tmp_path_factory.mktemp("models")
    for seed, name in enumerate("abc", start=1):
        write_version(root / name, 1, make_weights(seed=seed))
    return {name: root / name for name in "abc"}


def _predict(server: ServerProcess, name: str) -> tuple[int, object]:
    return http(server.url(f"/v1/models/{name}:predict"), {"instances": ROW.tolist()})


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_stock_tf_serving_parses_the_same_file(bases: dict[str, Path]) -> None:
    text = config_text(bases, '    version_labels { key: "stable" value: 1 }\n')
    stock = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    assert [c.name for c in stock.model_config_list.config] == ["a", "b", "c"]
    specs = parse_model_config(text)
    assert [(s.name, s.base_path, s.policy, s.labels) for s in specs] == [
        (name, base, VersionPolicy("latest", 1), {"stable": 1}) for name, base in bases.items()
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "model_config_list { config { name: 'a' } }",
            "config 0 (a): every config needs a name and a base_path",
        ),
        (
            "model_config_list { config { name: 'a' base_path: '/x' model_platform: 'pytorch' } }",
            "config 0 (a): model_platform 'pytorch' is not served",
        ),
        (
            "model_config_list { config { name: 'a' base_path: '/x' } config { name: 'a' base_path: '/y' } }",
            "config 1 (a): repeats a name; model names are unique and URL-safe",
        ),
        (
            "model_config_list { config { name: 'a' base_path: '/x' bogus: 1 } }",
            "is not ModelServerConfig text",
        ),
    ],
)
def test_bad_config_file_at_start_exits_with_one_line(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "models.config"
    path.write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "serving", f"--model_config_file={path}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()  # the error alone: no usage block before it
    assert line.startswith("python -m serving: error: ") and error in line


def test_edit_adds_and_removes_models_while_the_staying_one_serves_under_load(
    tmp_path: Path, bases: dict[str, Path]
) -> None:
    config = tmp_path / "models.config"
    config.write_text(config_text({"a": bases["a"], "b": bases["b"]}))
    server = ServerProcess(
        None,
        tmp_path / "server.log",
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        "--enable_batching",
        model_name="a",
    )
    try:
        server.wait_ready()
        _wait_for(lambda: http(server.url("/v1/models/b"))[0] == 200)
        for name, seed in (("a", 1), ("b", 2)):
            status, body = http(server.url(f"/v1/models/{name}:predict"), {"instances": ROW.tolist()})
            assert status == 200
            np.testing.assert_allclose(
                body["predictions"], reference_predict(make_weights(seed), ROW), rtol=1e-5
            )
        assert http(server.url("/v2/health/ready")) == (200, {"ready": True})

        results: list[int] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                results.append(_predict(server, "a")[0])

        workers = [threading.Thread(target=load) for _ in range(4)]
        for w in workers:
            w.start()
        config.write_text(config_text({"a": bases["a"], "c": bases["c"]}))  # b out, c in
        _wait_for(lambda: http(server.url("/v1/models/c"))[0] == 200)
        _wait_for(lambda: _predict(server, "b")[0] == 404)
        config.write_text("model_config_list { config { name: 'a' ")  # a bad edit: the last good one stays
        wait_polls(server, 2, metric=CONFIG_POLLS)  # read twice: one error line, still serving
        assert _predict(server, "c")[0] == 200
        stop.set()
        for w in workers:
            w.join()
        assert len(results) > 20 and set(results) == {200}, (
            f"{len(results)} requests, statuses {set(results)}"
        )
        assert _predict(server, "b") == (
            404,
            {"error": "Servable not found for request: Latest(b); served models: ['a', 'c']"},
        )
        errors = [line for line in server.log().splitlines() if "keeping the last good model config" in line]
        assert len(errors) == 1, errors
        assert "is not ModelServerConfig text format" in errors[0]

        client = triton.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
        assert client.is_model_ready("c") and not client.is_model_ready("b")
        assert client.get_model_metadata("c")["versions"] == ["1"]
        client.close()
        with grpc.insecure_channel(server.grpc_target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            statuses = {
                name: stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
                for name in ("", "a", "b", "c")
            }
        serving, unknown = (
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.SERVICE_UNKNOWN,
        )
        assert statuses == {"": serving, "a": serving, "b": unknown, "c": serving}
    finally:
        server.stop()
