"""Issue 35, findings 2, 4, 5 and 7 at the HTTP layer: raw-path routing, `Allow` on 405, trimmed header values,
and `GET /v2/`. Each test asserts the exact status and body against a real server."""

from __future__ import annotations

import http.client
import json
import socket

import numpy as np
import pytest

from tests.serving.server_process import ServerProcess

FEATURES = np.random.default_rng(7).random((1, 128), np.float32)


def request(
    server: ServerProcess, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request with the path sent exactly as given: (status, headers lower-cased, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


V2_BODY = json.dumps(
    {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [1, 128], "data": FEATURES.ravel().tolist()}
        ]
    }
).encode()
V1_BODY = json.dumps({"instances": FEATURES.tolist()}).encode()


# --- finding 2: %2F is part of a name, never a separator --------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("GET", "/v2/models/ctr%2Fversions%2F1", "ctr/versions/1"),
        ("GET", "/v2/models/ctr%2Fready", "ctr/ready"),
        ("POST", "/v2/models/ctr%2Finfer", "ctr/infer"),
        ("GET", "/v2/models/ctr%2fready", "ctr/ready"),  # lower-case hex alike
    ],
)
def test_v2_encoded_slash_is_part_of_the_model_name(
    shared_server: ServerProcess, method: str, path: str, name: str
) -> None:
    status, _, body = request(shared_server, method, path, V2_BODY if method == "POST" else b"")
    assert (status, body) == (404, error(f"Request for unknown model: '{name}' is not found"))


STATUS_404 = "Could not find any versions of model {}"  # TF Serving's messages for an unknown model
PREDICT_404 = "Servable not found for request: Latest({})"


@pytest.mark.parametrize(
    ("method", "path", "message"),
    [
        ("GET", "/v1/models/ctr%2Fversions%2F1", STATUS_404.format("ctr/versions/1")),
        ("GET", "/v1/models/ctr%2Fmetadata", STATUS_404.format("ctr/metadata")),
        ("POST", "/v1/models/ctr%3Apredict", STATUS_404.format("ctr:predict")),  # only a raw ':' is a verb
        ("POST", "/v1/models/ctr%2Fversions%2F1:predict", PREDICT_404.format("ctr/versions/1")),
    ],
)
def test_v1_encoded_separators_are_part_of_the_model_name(
    shared_server: ServerProcess, method: str, path: str, message: str
) -> None:
    status, _, body = request(shared_server, method, path, V1_BODY if method == "POST" else b"")
    assert (status, body) == (404, error(message))


def test_decoding_still_applies_inside_a_segment(shared_server: ServerProcess) -> None:
    """`%63` is `c`: a segment is decoded after the split, so an encoded name still finds its model."""
    assert request(shared_server, "GET", "/v2/models/%63tr/ready")[::2] == (
        200,
        b'{"name":"ctr","ready":true}',
    )
    status, _, body = request(shared_server, "POST", "/v1/models/%63tr/versions/%31:predict", V1_BODY)
    assert status == 200 and len(json.loads(body)["predictions"]) == 1


def test_encoded_slash_in_a_route_word_is_no_route(shared_server: ServerProcess) -> None:
    status, _, body = request(shared_server, "GET", "/v2/models/ctr/versions%2F1")
    assert (status, body) == (404, error("Malformed request: GET /v2/models/ctr/versions%2F1"))
    status, _, body = request(shared_server, "GET", "/v2%2Fhealth%2Flive")
    assert (status, body) == (404, error("Malformed request: GET /v2%2Fhealth%2Flive"))


# --- finding 4: every 405 names the methods in Allow ------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "allow", "expected"),
    [
        ("DELETE", "/v2/models/ctr", "GET, HEAD", "GET"),
        ("POST", "/v2/health/ready", "GET, HEAD", "GET"),
        ("GET", "/v2/models/ctr/infer", "POST", "POST"),
        ("PUT", "/v1/models/ctr:predict", "POST", "POST"),
        ("DELETE", "/v1/models/ctr/metadata", "GET, HEAD", "GET"),
        ("POST", "/healthz", "GET, HEAD", "GET"),
        ("DELETE", "/metrics", "GET, HEAD", "GET"),
    ],
)
def test_405_carries_allow(
    shared_server: ServerProcess, method: str, path: str, allow: str, expected: str
) -> None:
    status, headers, body = request(shared_server, method, path)
    assert (status, headers.get("allow"), body) == (
        405,
        allow,
        error(f"method {method} is not allowed here; use {expected}"),
    )


# --- finding 5: header values are trimmed of optional whitespace ------------------------------------------
@pytest.mark.parametrize("value", ["{n} ", " {n}", "\t{n}\t", "  {n}  "])
def test_header_length_with_optional_whitespace(shared_server: ServerProcess, value: str) -> None:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "features",
                    "datatype": "FP32",
                    "shape": [1, 128],
                    "parameters": {"binary_data_size": 512},
                }
            ]
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": value.format(n=len(head))}
    status, _, body = request(
        shared_server, "POST", "/v2/models/ctr/infer", head + FEATURES.tobytes(), headers
    )
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["shape"] == [1, 1]


def exchange(server: ServerProcess, raw: bytes) -> bytes:
    """Send `raw` bytes on one connection (they end with `Connection: close`); everything the server answered."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(raw)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_no_request_id_is_made_when_nothing_reads_it(shared_server: ServerProcess) -> None:
    """No request log: an answer carries the client's x-request-id, and none when the client sent none."""
    raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = exchange(shared_server, raw)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"x-request-id" not in out.lower()


def test_request_id_and_content_length_are_trimmed(shared_server: ServerProcess) -> None:
    raw = (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Request-Id: \t r-35 \t\r\nContent-Length: 0 \r\n"
        b"Connection: close\r\n\r\n"
    )
    out = exchange(shared_server, raw)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nx-request-id: r-35\r\n" in out


# --- finding 7: GET /v2/ is the server metadata, as GET /v2 ----------------------------------------------
def test_v2_with_trailing_slash_is_server_metadata(shared_server: ServerProcess) -> None:
    plain = request(shared_server, "GET", "/v2")
    slashed = request(shared_server, "GET", "/v2/")
    assert plain[0] == slashed[0] == 200
    assert slashed[2] == plain[2]
    assert json.loads(slashed[2])["name"]
    assert request(shared_server, "DELETE", "/v2/")[0] == 405


def test_parsed_paths_are_cached_within_a_bound() -> None:
    from serving.http.messages import PATHS_CACHED, path_segments

    for i in range(2 * PATHS_CACHED):
        assert path_segments(f"/v1/models/m{i}%2Fx") == ("v1", "models", f"m{i}/x")
    assert path_segments.cache_info().currsize == PATHS_CACHED
    assert path_segments("/v2/models/ctr%2Fready") == ("v2", "models", "ctr/ready")
    assert path_segments("no-slash") == ()
