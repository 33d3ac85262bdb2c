"""Triton's extensions (model_configuration, statistics, model_repository) with the real tritonclient, http and
grpc, sync and aio; and the v2 front door's UTF-8 and boolean checks (exact REST bodies, gRPC codes)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import InferenceServerException

from ctr_features.spec import FeatureSpec
from tests.serving.raw_model_repo import fit_spec, write_raw_version
from tests.serving.server_process import ServerProcess, http
from tests.serving.v2_inputs import FEATURES

EXTENSIONS = ["binary_tensor_data", "model_configuration", "statistics", "model_repository"]
LOAD_MESSAGE = (
    "model {action} is not served: this server loads the versions its model repository holds, by each "
    "model's version policy. To add or remove a model, edit the --model_config_file (read again every "
    "--model_config_file_poll_wait_seconds); to add a version, publish it into the model's base path "
    "('ctr' is left as it is)"
)
CTR_CONFIG = {
    "name": "ctr",
    "platform": "onnxruntime_onnx",
    "backend": "onnxruntime",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 1024,
    "input": [{"name": "features", "data_type": "TYPE_FP32", "dims": [128]}],
    "output": [{"name": "ctr", "data_type": "TYPE_FP32", "dims": [1]}],
    "dynamic_batching": {"preferred_batch_size": [256], "max_queue_delay_microseconds": 0},
}
INDEX = [
    {"name": "ctr", "version": "1", "state": "READY", "reason": ""},
    {"name": "ctr_raw", "version": "1", "state": "READY", "reason": ""},
]
SURROGATE_HINT = (
    "is not valid UTF-8: it holds \\ud800 at character 0, a lone UTF-16 surrogate; "
    "send valid Unicode (a surrogate pair or the character itself)"
)


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("triton") / "ctr"
    write_raw_version(base, 1, spec)
    proc = ServerProcess(base, tmp_path_factory.mktemp("logs") / "server.log", "--enable_batching")
    proc.wait_ready()
    yield proc
    proc.stop()


def infer_body(rows: int = 2, **extra: Any) -> dict[str, Any]:
    features = FEATURES[:rows]
    tensor = {
        "name": "features",
        "datatype": "FP32",
        "shape": list(features.shape),
        "data": features.tolist(),
    }
    return {"inputs": [tensor], **extra}


def ctr_stats(stats: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [s for s in stats["model_stats"] if s["name"] == "ctr"]
    return entry


def test_server_metadata_lists_the_extensions(server: ServerProcess) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    assert rest.get_server_metadata()["extensions"] == EXTENSIONS
    rpc = grpcclient.InferenceServerClient(server.grpc_target)
    assert list(rpc.get_server_metadata().extensions) == EXTENSIONS


def test_model_config_over_http_and_grpc(server: ServerProcess) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    assert rest.get_model_config("ctr") == CTR_CONFIG
    assert rest.get_model_config("ctr", "1") == CTR_CONFIG
    raw = rest.get_model_config("ctr_raw")
    assert raw["input"][0] == {"name": "I1", "data_type": "TYPE_FP64", "dims": [1], "reshape": {"shape": []}}
    assert raw["input"][13]["data_type"] == "TYPE_STRING" and len(raw["input"]) == 39
    with pytest.raises(InferenceServerException) as unknown:
        rest.get_model_config("ctr", "7")
    assert unknown.value.status() == "404"
    config = grpcclient.InferenceServerClient(server.grpc_target).get_model_config("ctr").config
    assert (config.name, config.platform, config.max_batch_size) == ("ctr", "onnxruntime_onnx", 1024)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("features", model_config_pb2.TYPE_FP32, [128])
    ]
    assert list(config.dynamic_batching.preferred_batch_size) == [256]
    assert config.version_policy.latest.num_versions == 1


def test_statistics_count_every_infer(server: ServerProcess) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    before = ctr_stats(rest.get_inference_statistics("ctr"))
    for _ in range(3):
        assert http(server.url("/v2/models/ctr/infer"), infer_body(2))[0] == 200
    assert http(server.url("/v1/models/ctr:predict"), {"instances": FEATURES[:1].tolist()})[0] == 200
    after = ctr_stats(rest.get_inference_statistics("ctr", "1"))
    assert after["inference_count"] - before["inference_count"] == 7  # rows, v1 and v2 alike
    assert after["execution_count"] - before["execution_count"] == 4  # one at a time: a batch each
    stats, old = after["inference_stats"], before["inference_stats"]
    assert stats["success"]["count"] - old["success"]["count"] == 4
    for phase in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[phase]["ns"] > old[phase]["ns"], phase
    assert stats["success"]["ns"] >= stats["compute_infer"]["ns"] + stats["queue"]["ns"]
    assert after["last_inference"] >= time.time() * 1e3 - 60_000
    wrong = {"inputs": [{**infer_body()["inputs"][0], "name": "other"}]}
    assert http(server.url("/v2/models/ctr/infer"), wrong)[0] == 400  # fails in the predict: a fail
    fail = ctr_stats(rest.get_inference_statistics("ctr"))["inference_stats"]["fail"]
    assert fail["count"] - old["fail"]["count"] == 1 and fail["ns"] > old["fail"]["ns"]
    status, answer = http(server.url("/v2/models/stats"))
    assert status == 200 and {s["name"] for s in answer["model_stats"]} == {"ctr", "ctr_raw"}
    rpc = grpcclient.InferenceServerClient(server.grpc_target)
    (entry,) = rpc.get_inference_statistics("ctr").model_stats
    assert (entry.name, entry.version, entry.inference_count) == ("ctr", "1", after["inference_count"])
    assert entry.inference_stats.success.count == stats["success"]["count"]


def test_repository_index_and_load_unload(server: ServerProcess) -> None:
    rest = httpclient.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    assert rest.get_model_repository_index() == INDEX
    for action, call in (("load", rest.load_model), ("unload", rest.unload_model)):
        with pytest.raises(InferenceServerException) as refused:
            call("ctr")
        assert (refused.value.status(), refused.value.message()) == (
            "400",
            LOAD_MESSAGE.format(action=action),
        )
    rpc = grpcclient.InferenceServerClient(server.grpc_target)
    index = rpc.get_model_repository_index().models
    assert [(m.name, m.version, m.state, m.reason) for m in index] == [tuple(e.values()) for e in INDEX]
    for action, call in (("load", rpc.load_model), ("unload", rpc.unload_model)):
        with pytest.raises(InferenceServerException) as refused:
            call("ctr")
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert refused.value.message() == LOAD_MESSAGE.format(action=action)
    assert http(server.url("/v2/repository/index"), {"ready": True}) == (200, INDEX)
    assert http(server.url("/v2/repository/index"), {"ready": "yes"}) == (
        400,
        {
            "error": "the index request's 'ready' has ready \"yes\" (a string); send a JSON boolean, true or false"
        },
    )


def test_the_aio_clients(server: ServerProcess) -> None:
    async def both() -> None:
        rest = httpaio.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
        rpc = grpcaio.InferenceServerClient(server.grpc_target)
        try:
            assert (await rest.get_server_metadata())["extensions"] == EXTENSIONS
            assert await rest.get_model_config("ctr") == CTR_CONFIG
            assert ctr_stats(await rest.get_inference_statistics())["inference_count"] >= 0
            assert await rest.get_model_repository_index() == INDEX
            with pytest.raises(InferenceServerException, match="--model_config_file"):
                await rest.load_model("ctr")
            assert list((await rpc.get_server_metadata()).extensions) == EXTENSIONS
            assert (await rpc.get_model_config("ctr_raw")).config.name == "ctr_raw"
            assert len((await rpc.get_inference_statistics()).model_stats) == 2
            assert len((await rpc.get_model_repository_index()).models) == 2
            with pytest.raises(InferenceServerException, match="--model_config_file"):
                await rpc.unload_model("ctr")
        finally:
            await rest.close()
            await rpc.close()

    asyncio.run(both())


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (infer_body(id="\ud800"), "the request id ('id')"),
        ({"inputs": [{**infer_body()["inputs"][0], "name": "\ud800"}]}, "inputs[0].name"),
        (infer_body(outputs=[{"name": "\ud800"}]), "outputs[0].name"),
        (infer_body(parameters={"tag": "\ud800"}), "parameters.tag"),
        (infer_body(parameters={"\ud800": 1}), "a key of parameters"),
    ],
    ids=["id", "input-name", "output-name", "parameter-value", "parameter-key"],
)
def test_a_lone_surrogate_is_a_400_naming_the_field(server: ServerProcess, body: dict, where: str) -> None:
    assert http(server.url("/v2/models/ctr/infer"), body) == (400, {"error": f"{where} {SURROGATE_HINT}"})


def test_v1_signature_name_surrogate_is_a_400(server: ServerProcess) -> None:
    body = {"signature_name": "\ud800", "instances": FEATURES[:1].tolist()}
    assert http(server.url("/v1/models/ctr:predict"), body) == (
        400,
        {"error": f"'signature_name' {SURROGATE_HINT}"},
    )


def test_grpc_strings_that_are_not_utf8_name_the_field(server: ServerProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="ctr", id="IDIDID")
    request.inputs.add(name="features", datatype="FP32", shape=[1, 128])
    request.raw_input_contents.append(np.zeros((1, 128), "<f4").tobytes())
    wire = request.SerializeToString()
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        assert call(wire, timeout=10)  # the same bytes with valid strings are answered
        for marker, field in ((b"IDIDID", "id"), (b"features", "inputs[0].name")):
            with pytest.raises(grpc.RpcError) as refused:
                call(wire.replace(marker, b"\xff\xfe" + marker[2:]), timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == f"the request's {field} is not valid UTF-8; send UTF-8 strings"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"parameters": {"binary_data_output": "false"}},
            'parameters has binary_data_output "false" (a string); send a JSON boolean, true or false',
        ),
        (
            {"outputs": [{"name": "ctr", "parameters": {"binary_data": "false"}}]},
            "output 'ctr' has binary_data \"false\" (a string); send a JSON boolean, true or false",
        ),
        (
            {"outputs": [{"name": "ctr", "parameters": {"binary_data": 0}}]},
            "output 'ctr' has binary_data 0 (a number); send a JSON boolean, true or false",
        ),
    ],
    ids=["binary_data_output", "binary_data", "number"],
)
def test_boolean_parameters_must_be_json_booleans(server: ServerProcess, extra: dict, message: str) -> None:
    assert http(server.url("/v2/models/ctr/infer"), infer_body(**extra)) == (400, {"error": message})


def test_false_means_json_output(server: ServerProcess) -> None:
    extra = {"parameters": {"binary_data_output": False}, "outputs": [{"name": "ctr", "parameters": {}}]}
    status, answer = http(server.url("/v2/models/ctr/infer"), infer_body(**extra))
    assert status == 200 and len(answer["outputs"][0]["data"]) == 2


def _post_infer(server: ServerProcess) -> int:
    """One infer on a new connection; returns the pid of the worker that served it."""
    data = json.dumps(infer_body(1)).encode()
    with urllib.request.urlopen(
        urllib.request.Request(server.url("/v2/models/ctr/infer"), data), timeout=10
    ) as r:
        assert r.status == 200
        return int(r.headers["x-served-by-pid"])


def _stats_by(server: ServerProcess) -> tuple[int, int]:
    with urllib.request.urlopen(server.url("/v2/models/ctr/stats"), timeout=10) as r:
        return int(r.headers["x-served-by-pid"]), ctr_stats(json.loads(r.read()))["inference_count"]


def test_statistics_are_merged_across_workers(tmp_path, spec: FeatureSpec) -> None:
    base = tmp_path / "ctr"
    write_raw_version(base, 1, spec)
    proc = ServerProcess(base, tmp_path / "server.log", "--num_workers=2")
    try:
        proc.wait_ready()
        served: list[int] = []
        while len(set(served)) < 2:  # new connections until each worker has served some
            served.append(_post_infer(proc))
            assert len(served) < 200, f"one worker served all {len(served)}:\n{proc.log()}"
        answers: dict[int, int] = {}
        for _ in range(200):
            pid, count = _stats_by(proc)
            answers[pid] = count
            if len(answers) == 2:
                break
        assert answers == dict.fromkeys(set(served), len(served))
    finally:
        proc.stop()
