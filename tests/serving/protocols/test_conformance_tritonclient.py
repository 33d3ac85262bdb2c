"""tritonclient against a real server: every client call we support, over HTTP and gRPC, sync and aio.

The calls: is_server_live/ready, is_model_ready, get_server_metadata, get_model_metadata, infer (FP32 features as
JSON and as binary data; the raw signature's FP64 and BYTES inputs; gzip and deflate request and response
compression), async_infer, get_model_config, get_inference_statistics, get_model_repository_index, and
load_model/unload_model (refused with a 400 naming --model_config_file: the repository is read-only). Scores are
checked against the numpy forward pass of the same weights. Not served, so not here: shared memory, trace and
log settings, and gRPC's ModelStreamInfer (decoupled models).
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from ctr_contract.repository import FEATURE_RANGES_PATH
from export.publish.feature_ranges import write_ranges
from tests.serving.model_repo import make_weights, reference_predict, write_manifest
from tests.serving.raw_model_repo import fit_spec, seen_values, write_raw_version
from tests.serving.server_process import ServerProcess

WEIGHTS_SEED = 11  # write_raw_version's default weights
ROWS = np.random.default_rng(4).random((3, 128), np.float32)


@dataclass(frozen=True)
class Flavour:
    """One way to call the server: a tritonclient module, its protocol, sync or aio."""

    name: str
    module: ModuleType
    grpc: bool
    aio: bool


FLAVOURS = [
    Flavour("http", httpclient, grpc=False, aio=False),
    Flavour("http-aio", httpaio, grpc=False, aio=True),
    Flavour("grpc", grpcclient, grpc=True, aio=False),
    Flavour("grpc-aio", grpcaio, grpc=True, aio=True),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("tritonclient") / "ctr"
    version = write_raw_version(base, 1, fit_spec(), seed=WEIGHTS_SEED)
    write_ranges(version / FEATURE_RANGES_PATH, None, np.random.default_rng(1).random((200, 128), np.float32))
    write_manifest(version, 1)
    proc = ServerProcess(base, base.parent / "server.log")
    proc.wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(params=FLAVOURS, ids=[f.name for f in FLAVOURS])
def flavour(request: pytest.FixtureRequest) -> Flavour:
    return request.param


def call(server: ServerProcess, fl: Flavour, fn: Callable[[Any, ModuleType], Any]) -> Any:
    """`fn(client, module)` on a fresh client of `fl` (awaited for aio), the client closed after."""
    url = server.grpc_target if fl.grpc else f"127.0.0.1:{server.rest_port}"
    if not fl.aio:
        client = fl.module.InferenceServerClient(url)
        try:
            return fn(client, fl.module)
        finally:
            client.close()

    async def run() -> Any:
        client = fl.module.InferenceServerClient(url)
        try:
            return await fn(client, fl.module)
        finally:
            await client.close()

    return asyncio.run(run())


def as_json(fl: Flavour) -> dict[str, bool]:
    """gRPC answers protobuf messages; as_json=True gives the JSON the HTTP client returns."""
    return {"as_json": True} if fl.grpc else {}


def features_input(module: ModuleType, rows: np.ndarray, binary: bool) -> Any:
    tensor = module.InferInput("features", list(rows.shape), "FP32")
    if module in (httpclient, httpaio):
        tensor.set_data_from_numpy(rows, binary_data=binary)
    else:
        tensor.set_data_from_numpy(rows)
    return tensor


def expected(rows: np.ndarray) -> np.ndarray:
    return reference_predict(make_weights(seed=WEIGHTS_SEED), rows)


def test_health(server: ServerProcess, flavour: Flavour) -> None:
    async def checks(client: Any, _: ModuleType) -> list[bool]:
        return [
            await client.is_server_live(),
            await client.is_server_ready(),
            await client.is_model_ready("ctr"),
            await client.is_model_ready("ctr", "1"),
            await client.is_model_ready("ctr_raw"),
        ]

    def sync(client: Any, m: ModuleType) -> list[bool]:
        return [
            client.is_server_live(),
            client.is_server_ready(),
            client.is_model_ready("ctr"),
            client.is_model_ready("ctr", "1"),
            client.is_model_ready("ctr_raw"),
        ]

    assert call(server, flavour, checks if flavour.aio else sync) == [True] * 5


def test_server_and_model_metadata(server: ServerProcess, flavour: Flavour) -> None:
    j = as_json(flavour)
    meta = call(server, flavour, lambda c, m: c.get_server_metadata(**j))
    assert meta["name"] == "ctr-pipeline"
    assert {"binary_tensor_data", "model_configuration", "statistics", "model_repository"} <= set(
        meta["extensions"]
    )
    model = call(server, flavour, lambda c, m: c.get_model_metadata("ctr", **j))
    assert model["name"] == "ctr" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in model["inputs"]] == [
        ("features", "FP32", [-1, 128])
    ]
    raw = call(server, flavour, lambda c, m: c.get_model_metadata("ctr_raw", "1", **j))
    assert [t["name"] for t in raw["inputs"]][:2] == ["I1", "I2"] and len(raw["inputs"]) == 39


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_fp32_features(server: ServerProcess, flavour: Flavour, binary: bool) -> None:
    def infer(c: Any, m: ModuleType) -> Any:
        outputs = [
            m.InferRequestedOutput("ctr", binary_data=binary)
            if not flavour.grpc
            else m.InferRequestedOutput("ctr")
        ]
        return c.infer("ctr", [features_input(m, ROWS, binary)], outputs=outputs, request_id="r-1")

    result = call(server, flavour, infer)
    np.testing.assert_allclose(result.as_numpy("ctr"), expected(ROWS), rtol=1e-5, atol=1e-6)
    response = result.get_response(**as_json(flavour))
    assert response["id"] == "r-1" and response["model_name"] == "ctr" and response["model_version"] == "1"


def test_infer_raw_fields(server: ServerProcess, flavour: Flavour) -> None:
    spec = fit_spec()
    values = seen_values(spec)

    def infer(c: Any, m: ModuleType) -> Any:
        count = m.InferInput("I1", [2], "FP64")
        count.set_data_from_numpy(np.array([3.0, np.nan]))
        word = m.InferInput("C1", [2], "BYTES")
        word.set_data_from_numpy(np.array([values[0].encode(), b""], dtype=object))
        return c.infer("ctr_raw", [count, word])

    scores = call(server, flavour, infer).as_numpy("ctr")
    numeric = np.full((2, 13), np.nan)
    numeric[0, 0] = 3.0
    categorical = np.full((2, 26), "", dtype=object)
    categorical[0, 0] = values[0]
    np.testing.assert_allclose(
        scores, expected(spec.transform(numeric, categorical).astype(np.float32)), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_infer_compressed(server: ServerProcess, flavour: Flavour, algorithm: str) -> None:
    def infer(c: Any, m: ModuleType) -> Any:
        inputs = [features_input(m, ROWS, binary=False)]
        if flavour.grpc:
            return c.infer("ctr", inputs, compression_algorithm=algorithm)
        return c.infer(
            "ctr", inputs, request_compression_algorithm=algorithm, response_compression_algorithm=algorithm
        )

    np.testing.assert_allclose(
        call(server, flavour, infer).as_numpy("ctr"), expected(ROWS), rtol=1e-5, atol=1e-6
    )


def test_async_infer(server: ServerProcess) -> None:
    """The sync clients' own async calls: HTTP's gevent pool, gRPC's callback."""
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}", concurrency=2)
    try:
        pending = [http.async_infer("ctr", [features_input(httpclient, ROWS, True)]) for _ in range(2)]
        for request in pending:
            np.testing.assert_allclose(
                request.get_result().as_numpy("ctr"), expected(ROWS), rtol=1e-5, atol=1e-6
            )
    finally:
        http.close()
    done: queue.Queue[Any] = queue.Queue()
    grpc = grpcclient.InferenceServerClient(server.grpc_target)
    try:
        grpc.async_infer(
            "ctr", [features_input(grpcclient, ROWS, True)], lambda result, error: done.put((result, error))
        )
        result, error = done.get(timeout=10)
        assert error is None
        np.testing.assert_allclose(result.as_numpy("ctr"), expected(ROWS), rtol=1e-5, atol=1e-6)
    finally:
        grpc.close()


def test_model_config(server: ServerProcess, flavour: Flavour) -> None:
    answer = call(server, flavour, lambda c, m: c.get_model_config("ctr", "1", **as_json(flavour)))
    config = answer["config"] if flavour.grpc else answer
    assert config["name"] == "ctr" and config["platform"] == "onnxruntime_onnx"
    assert int(config["max_batch_size"]) > 0
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        ("features", "TYPE_FP32", [128])
    ]
    assert [(t["name"], [int(d) for d in t["dims"]]) for t in config["output"]] == [("ctr", [1])]


def test_inference_statistics(server: ServerProcess, flavour: Flavour) -> None:
    call(server, flavour, lambda c, m: c.infer("ctr", [features_input(m, ROWS, True)]))
    stats = call(server, flavour, lambda c, m: c.get_inference_statistics("ctr", **as_json(flavour)))
    (model,) = stats["model_stats"]
    assert model["name"] == "ctr" and model["version"] == "1"
    assert int(model["inference_stats"]["success"]["count"]) >= 1
    assert int(model["inference_count"]) >= len(ROWS)
    every = call(server, flavour, lambda c, m: c.get_inference_statistics(**as_json(flavour)))
    assert {s["name"] for s in every["model_stats"]} == {"ctr", "ctr_raw"}


def test_repository_index(server: ServerProcess, flavour: Flavour) -> None:
    index = call(server, flavour, lambda c, m: c.get_model_repository_index(**as_json(flavour)))
    models = index["models"] if flavour.grpc else index
    assert {(e["name"], e["version"], e["state"]) for e in models} == {
        ("ctr", "1", "READY"),
        ("ctr_raw", "1", "READY"),
    }


@pytest.mark.parametrize("method", ["load_model", "unload_model"])
def test_load_and_unload_are_refused_naming_the_config_file(
    server: ServerProcess, flavour: Flavour, method: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(server, flavour, lambda c, m: getattr(c, method)("ctr"))
    assert "--model_config_file" in caught.value.message()
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert call(server, flavour, lambda c, m: c.is_model_ready("ctr"))  # still served


def test_unknown_model_is_not_found(server: ServerProcess, flavour: Flavour) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call(server, flavour, lambda c, m: c.get_model_metadata("nope"))
    assert caught.value.status() in ("404", "StatusCode.NOT_FOUND")
    assert "nope" in caught.value.message()


def test_v2_compresses_only_inference_answers_as_triton(server: ServerProcess) -> None:
    """tritonclient's aio HTTP client offers gzip on every call (aiohttp) but inflates only infer's answer."""
    import urllib.request

    def encoding(path: str, body: bytes | None = None) -> str | None:
        request = urllib.request.Request(server.url(path), data=body, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.headers.get("Content-Encoding")

    assert encoding("/v2/models/ctr_raw") is None  # about 2 KB of metadata: over the threshold
    assert encoding("/v2/repository/index", b"{}") is None
    rows = np.random.default_rng(0).random((256, 128), np.float32)  # its scores: over 1,400 bytes
    infer = {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [256, 128], "data": rows.ravel().tolist()}
        ]
    }
    assert encoding("/v2/models/ctr/infer", json.dumps(infer).encode()) == "gzip"


def test_calls_we_do_not_serve_are_not_found_or_unimplemented(
    server: ServerProcess, flavour: Flavour
) -> None:
    """Shared memory, trace and log settings: a clear 404 / UNIMPLEMENTED, never a 5xx."""
    for method in ("get_system_shared_memory_status", "get_trace_settings", "get_log_settings"):
        with pytest.raises(InferenceServerException) as caught:
            call(server, flavour, lambda c, m, name=method: getattr(c, name)())
        assert caught.value.status() in ("404", "StatusCode.UNIMPLEMENTED"), (method, caught.value)
