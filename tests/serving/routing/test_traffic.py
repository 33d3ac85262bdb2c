"""Traffic split by label on a real server: the canary share by a hash of the request id, the stable label,
explicit versions never split, the version headers, the request log's fields, and the ctr-traffic line of
`--model_config_file` re-read at run time (a bad edit keeps the last good split)."""

from __future__ import annotations

import http.client
import json
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from ctr_contract.traffic import format_traffic, with_traffic
from serving import protos
from serving.codecs.tensors import from_ndarray
from serving.http.messages import answer_headers
from tests.serving.model_repo import make_weights, reference_predict, write_version
from tests.serving.server_process import CONFIG_POLLS, ServerProcess, wait_polls

ROW = np.random.default_rng(32).random((1, 128), np.float32)
WEIGHTS = {1: make_weights(seed=1), 2: make_weights(seed=2)}
IDS = [f"t-{i}" for i in range(240)]


def hashed(salt: bytes, request_id: str, percent: float) -> bool:
    """The documented rule, written out independently of the server's code."""
    h = zlib.crc32(salt + request_id.encode())  # then MurmurHash3's fmix32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16) < percent / 100 * 2**32


def config_text(
    base: Path, canary: int = 2, traffic: str = "", versions: str = "versions: 1 versions: 2"
) -> str:
    text = (
        "model_config_list {\n  config {\n"
        f'    name: "ctr"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ specific {{ {versions} }} }}\n"
        '    version_labels { key: "stable" value: 1 }\n'
        f'    version_labels {{ key: "canary" value: {canary} }}\n'
        "  }\n}\n"
    )
    return text + traffic


class Client:
    """One keep-alive REST connection: (status, body, lower-cased headers) per request."""

    def __init__(self, server: ServerProcess) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)

    def post(self, path: str, body: Any, request_id: str | None = None) -> tuple[int, Any, dict[str, str]]:
        headers = {"content-type": "application/json"}
        if request_id is not None:
            headers["x-request-id"] = request_id
        self.conn.request("POST", path, json.dumps(body), headers)
        response = self.conn.getresponse()
        return response.status, json.loads(response.read()), {k.lower(): v for k, v in response.getheaders()}

    def version(self, request_id: str | None = None, path: str = "/v1/models/ctr:predict") -> int:
        """The version that answered, from the `x-model-version` header; its scores must be that version's."""
        status, body, headers = self.post(path, {"instances": ROW.tolist()}, request_id)
        assert status == 200, body
        version = int(headers["x-model-version"])
        expected = reference_predict(WEIGHTS[version], ROW)
        np.testing.assert_allclose(body["predictions"], expected, rtol=1e-5, atol=1e-6)
        return version


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not in time: {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("traffic") / "ctr"
    for version, weights in WEIGHTS.items():
        write_version(base, version, weights)
    return base


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, base: Path
) -> Iterator[tuple[ServerProcess, Path, Path]]:
    """A --model_config_file server: stable=1, canary=2 at 10 %, every request logged; (server, config, logs)."""
    root = tmp_path_factory.mktemp("served")
    config, logs = root / "models.config", root / "logs"
    config.write_text(with_traffic(config_text(base), "ctr", canary_percent=10))
    server = ServerProcess(
        None,
        root / "server.log",
        f"--model_config_file={config}",
        "--model_config_file_poll_wait_seconds=1",
        f"--request_log_dir={logs}",
        "--request_log_sample_rate=1",
    )
    try:
        server.wait_ready()
        server.wait_versions({1, 2})
        yield server, config, logs
    finally:
        server.stop()


@pytest.fixture(scope="module")
def client(served: tuple[ServerProcess, Path, Path]) -> Client:
    return Client(served[0])


def test_the_canary_share_is_the_hash_of_the_request_id_and_a_retry_gets_the_same_version(
    client: Client,
) -> None:
    answered = {request_id: client.version(request_id) for request_id in IDS}
    canary = {i for i, v in answered.items() if v == 2}
    assert canary == {
        i for i in IDS if hashed(b"canary:", i, 10)
    }  # the rest went to stable (1), not latest (2)
    assert 0.04 < len(canary) / len(IDS) < 0.17
    assert {i: client.version(i) for i in IDS[:40]} == {i: answered[i] for i in IDS[:40]}  # retries


def test_requests_without_an_id_are_split_at_random(client: Client) -> None:
    versions = [client.version() for _ in range(300)]
    assert 8 <= versions.count(2) <= 60  # 10 % of 300 is 30: far outside this is not a 10 % split
    assert set(versions) == {1, 2}


def test_explicit_versions_and_labels_are_never_split(client: Client) -> None:
    canary_ids = [i for i in IDS if hashed(b"canary:", i, 10)][:10]
    for request_id in canary_ids:
        assert client.version(request_id, "/v1/models/ctr/versions/1:predict") == 1
        assert client.version(request_id, "/v1/models/ctr/labels/stable:predict") == 1
    stable_ids = [i for i in IDS if not hashed(b"canary:", i, 10)][:10]
    for request_id in stable_ids:
        assert client.version(request_id, "/v1/models/ctr/labels/canary:predict") == 2
        assert client.version(request_id, "/v1/models/ctr/versions/2:predict") == 2


def test_v2_and_grpc_answers_name_the_version_of_the_split(served: tuple[ServerProcess, Path, Path]) -> None:
    server = served[0]
    canary_id = next(i for i in IDS if hashed(b"canary:", i, 10))
    stable_id = next(i for i in IDS if not hashed(b"canary:", i, 10))
    body = {
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 128], "data": ROW.ravel().tolist()}]
    }
    for request_id, version in ((canary_id, 2), (stable_id, 1)):
        status, answer, headers = Client(server).post("/v2/models/ctr/infer", body, request_id)
        assert status == 200 and headers["x-model-version"] == str(version) == answer["model_version"]
        assert "x-ctr-fallback" not in headers  # no fallback answered
    request = protos.PredictRequest()
    request.model_spec.name = "ctr"
    from_ndarray(ROW, request.inputs["features"])
    with grpc.insecure_channel(server.grpc_target) as channel:
        call = channel.unary_unary(
            "/tensorflow.serving.PredictionService/Predict",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=protos.PredictResponse.FromString,
        )
        for request_id, version in ((canary_id, 2), (stable_id, 1)):
            response, state = call.with_call(request, metadata=(("x-request-id", request_id),), timeout=10)
            assert response.model_spec.version.value == version
            trailing = dict(state.trailing_metadata())
            assert trailing["x-request-id"] == request_id and "x-ctr-fallback" not in trailing


def test_the_fallback_header_names_the_reason() -> None:
    # Prediction.fallback (serving/routing/fallback.py sets it) becomes this header line of the answer.
    assert answer_headers(3, None) == b"\r\nx-model-version: 3"
    assert answer_headers(3, "errors") == b"\r\nx-model-version: 3\r\nx-ctr-fallback: errors"


def _log_lines(logs: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for f in sorted(logs.glob("ctr/requests-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_the_request_log_says_which_label_routed_each_request(
    served: tuple[ServerProcess, Path, Path], client: Client
) -> None:
    logs = served[2]
    # Ids of this test's own (no other test sends them): one of each kind, picked by the rule.
    canary_id = next(f"log-c{i}" for i in range(1000) if hashed(b"canary:", f"log-c{i}", 10))
    stable_id = next(f"log-s{i}" for i in range(1000) if not hashed(b"canary:", f"log-s{i}", 10))
    assert client.version(canary_id) == 2 and client.version(stable_id) == 1
    client.version("log-version", "/v1/models/ctr/versions/2:predict")
    client.version("log-label", "/v1/models/ctr/labels/canary:predict")
    wanted = {canary_id, stable_id, "log-version", "log-label"}
    _wait_for(lambda: wanted <= {line["request_id"] for line in _log_lines(logs)}, "the log lines")
    fields = {
        line["request_id"]: (line["model"], line["canary"], line["shadow"], line["fallback"])
        for line in _log_lines(logs)
        if line["request_id"] in wanted
    }
    assert fields == {
        canary_id: ({"name": "ctr", "version": 2, "label": "canary"}, True, False, None),
        stable_id: ({"name": "ctr", "version": 1, "label": "stable"}, False, False, None),
        "log-version": ({"name": "ctr", "version": 2, "label": None}, False, False, None),
        "log-label": ({"name": "ctr", "version": 2, "label": "canary"}, False, False, None),
    }


def test_an_edit_of_the_share_applies_at_run_time(
    served: tuple[ServerProcess, Path, Path], base: Path, client: Client
) -> None:
    server, config = served[0], served[1]
    config.write_text(config_text(base, traffic=format_traffic("ctr", canary_percent=50) + "\n"))
    probe = next(i for i in IDS if hashed(b"canary:", i, 50) and not hashed(b"canary:", i, 10))
    _wait_for(lambda: client.version(probe) == 2, "the 50 % share")
    canary = {i for i in IDS if client.version(i) == 2}
    assert canary == {i for i in IDS if hashed(b"canary:", i, 50)}
    assert "model ctr: traffic TrafficSplit(canary_percent=50.0, shadow_percent=0.0)" in server.log()
    # The line removed: the flags' default (--canary_percent 0) applies; stable answers every request.
    config.write_text(config_text(base))
    _wait_for(lambda: client.version(probe) == 1, "no share")
    assert {client.version(i) for i in IDS[:60]} == {1}


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (
            lambda base: config_text(base, traffic="# ctr-traffic: model=ctr canary_percent=150\n"),
            "canary_percent '150' must be a number in [0, 100]; keeping the last good model config",
        ),
        (
            lambda base: config_text(
                base, 7, "# ctr-traffic: model=ctr canary_percent=90\n", "versions: 1 versions: 2 versions: 7"
            ),
            "version_labels {'canary': 7} name versions with no such version under",
        ),
        (
            lambda base: config_text(base, canary=1, versions="versions: 2"),
            "version_labels ['canary=1', 'stable=1'] name versions the specific policy [2] does not serve",
        ),
    ],
    ids=["share-150", "missing-version", "version-not-in-policy"],
)
def test_a_bad_edit_keeps_the_last_good_config_with_one_log_line(
    served: tuple[ServerProcess, Path, Path],
    base: Path,
    client: Client,
    edit: Callable[[Path], str],
    error: str,
) -> None:
    server, config = served[0], served[1]
    config.write_text(config_text(base, traffic=format_traffic("ctr", canary_percent=30) + "\n"))
    probe = next(i for i in IDS if hashed(b"canary:", i, 30) and not hashed(b"canary:", i, 10))
    _wait_for(lambda: client.version(probe) == 2, "the good 30 % share")
    config.write_text(edit(base))
    _wait_for(lambda: error in server.log(), "the error line")
    wait_polls(server, 2, metric=CONFIG_POLLS)  # two more reads of the same bad file: no second line
    assert server.log().count(error) == 1
    canary = {i for i in IDS if client.version(i) == 2}
    assert canary == {i for i in IDS if hashed(b"canary:", i, 30)}  # the last good split still holds
    assert client.version("x", "/v1/models/ctr/labels/canary:predict") == 2  # and its labels


def test_canary_percent_flag_splits_a_single_model_server(tmp_path: Path, base: Path) -> None:
    server = ServerProcess(
        base,
        tmp_path / "server.log",
        "--model_version_policy=all",
        "--version_labels=stable=1,canary=2",
        "--canary_percent=30",
    )
    try:
        server.wait_ready()
        server.wait_versions({1, 2})
        client = Client(server)
        canary = {i for i in IDS[:120] if client.version(i) == 2}
        assert canary == {i for i in IDS[:120] if hashed(b"canary:", i, 30)}
    finally:
        server.stop()
