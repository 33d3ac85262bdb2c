"""Issue 35, finding 6: `Content-Encoding: gzip`/`deflate` request bodies (v1 and v2, feature and raw bodies),
the body limit on the decompressed size (a bomb is 413 with the server's RSS bounded), 415 for other codings,
gzip responses over `--response_compression_min_bytes`, and the real tritonclient.http with compression."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from ctr_contract.schema import NUMERIC_FIELDS
from ctr_features.spec import FeatureSpec
from serving.http.encoding import BodyInflater
from tests.serving.raw_model_repo import fit_spec, seen_values, write_raw_version
from tests.serving.server_process import ServerProcess
from tests.serving.v2_inputs import raw_columns

MAX_BODY = 4 << 20
MIN_COMPRESSED = 1000  # --response_compression_min_bytes of the server under test
FEATURES = np.random.default_rng(35).random((100, 128), np.float32)
CODINGS: dict[str, Any] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,  # RFC 9110's deflate: the zlib format, as tritonclient sends it
    "raw-deflate": lambda body: zlib.compress(body)[2:-4],  # what some clients send as deflate
}


@pytest.fixture(scope="module")
def spec() -> FeatureSpec:
    return fit_spec()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("compression") / "ctr"
    write_raw_version(base, 1, spec)
    flags = (f"--max_body_bytes={MAX_BODY}", f"--response_compression_min_bytes={MIN_COMPRESSED}")
    proc = ServerProcess(base, tmp_path_factory.mktemp("logs") / "server.log", *flags)
    proc.wait_ready()
    yield proc
    proc.stop()


def request(
    server: ServerProcess, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers lower-cased, body as sent: not decompressed)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def bodies(spec: FeatureSpec) -> dict[str, tuple[str, bytes]]:
    """(path, JSON body) of each kind: v1 and v2, feature vectors and raw rows (100 rows each)."""
    columns, rows = raw_columns(seen_values(spec))
    raw_inputs = [
        {
            "name": name,
            "datatype": "FP64" if name in NUMERIC_FIELDS else "BYTES",
            "shape": [100],
            "data": [None if v != v else v for v in values.tolist()] * 50
            if name in NUMERIC_FIELDS
            else [v.decode() for v in values] * 50,
        }
        for name, values in columns.items()
    ]
    features = {
        "name": "features",
        "datatype": "FP32",
        "shape": [100, 128],
        "data": FEATURES.ravel().tolist(),
    }
    return {
        "v1-vector": ("/v1/models/ctr:predict", json.dumps({"instances": FEATURES.tolist()}).encode()),
        "v1-raw": (
            "/v1/models/ctr:predict",
            json.dumps({"signature_name": "raw", "instances": rows * 50}).encode(),
        ),
        "v2-vector": ("/v2/models/ctr/infer", json.dumps({"inputs": [features]}).encode()),
        "v2-raw": ("/v2/models/ctr_raw/infer", json.dumps({"inputs": raw_inputs}).encode()),
    }


def scores(answer: bytes) -> list[Any]:
    doc = json.loads(answer)
    return doc["predictions"] if "predictions" in doc else doc["outputs"][0]["data"]


@pytest.mark.parametrize("coding", list(CODINGS))
@pytest.mark.parametrize("kind", ["v1-vector", "v1-raw", "v2-vector", "v2-raw"])
def test_compressed_request_equals_plain(
    server: ServerProcess, spec: FeatureSpec, kind: str, coding: str
) -> None:
    path, body = bodies(spec)[kind]
    status, _, plain = request(server, "POST", path, body)
    assert status == 200, plain
    header = "deflate" if coding == "raw-deflate" else coding
    status, _, packed = request(server, "POST", path, CODINGS[coding](body), {"Content-Encoding": header})
    assert status == 200, packed
    assert len(scores(packed)) == 100 and scores(packed) == scores(plain)


def test_chunked_gzip_body_in_small_pieces(server: ServerProcess, spec: FeatureSpec) -> None:
    """Transfer-Encoding: chunked over a gzip body, 997 bytes a chunk: inflated as it arrives."""
    path, body = bodies(spec)["v1-vector"]
    packed = gzip.compress(body)
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=30)
    try:
        pieces = (packed[i : i + 997] for i in range(0, len(packed), 997))
        conn.request("POST", path, pieces, {"Content-Encoding": "gzip"}, encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 200 and len(scores(response.read())) == 100
    finally:
        conn.close()


def _bomb(coding: str, size: int) -> bytes:
    """`size` zero bytes compressed (~1000:1)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    zeros = b"\0" * (1 << 20)
    return b"".join(packer.compress(zeros) for _ in range(size >> 20)) + packer.flush()


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_decompression_bomb_is_413_with_rss_bounded(server: ServerProcess, coding: str) -> None:
    """256 MiB of zeros in ~260 KB: refused once the output passes --max_body_bytes (4 MiB), holding no more."""
    bomb = _bomb(coding, 256 << 20)
    assert len(bomb) < MAX_BODY  # the compressed size alone passes the limit
    before = server.rss_bytes()
    for _ in range(3):
        status, _, body = request(
            server, "POST", "/v1/models/ctr:predict", bomb, {"Content-Encoding": coding}
        )
        assert (status, body) == (
            413,
            json.dumps(
                {
                    "error": f"request body decompresses to over the limit of {MAX_BODY} bytes (--max_body_bytes); "
                    "send a smaller batch"
                }
            ).encode(),
        )
    assert server.rss_bytes() - before < 32 << 20


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, gzip", "compress"])
def test_unknown_content_encoding_is_415_naming_it(server: ServerProcess, coding: str) -> None:
    status, _, body = request(server, "POST", "/v2/models/ctr/infer", b"{}", {"Content-Encoding": coding})
    message = f"Content-Encoding '{coding}' is not supported; send the body as gzip, deflate or uncompressed"
    assert (status, body) == (415, json.dumps({"error": message}).encode())


def test_identity_content_encoding_is_plain(server: ServerProcess, spec: FeatureSpec) -> None:
    path, body = bodies(spec)["v1-vector"]
    status, _, answer = request(server, "POST", path, body, {"Content-Encoding": "identity"})
    assert status == 200 and len(scores(answer)) == 100


@pytest.mark.parametrize(
    ("packed", "detail"),
    [
        (gzip.compress(b'{"instances": [[0.5]]}')[:-6], "the stream is truncated"),
        (b"not gzip at all", "Error -3 while decompressing data: incorrect header check"),
    ],
)
def test_corrupt_gzip_is_400_naming_the_coding(server: ServerProcess, packed: bytes, detail: str) -> None:
    status, _, body = request(server, "POST", "/v1/models/ctr:predict", packed, {"Content-Encoding": "gzip"})
    message = (
        f"request body is not valid gzip (Content-Encoding: gzip): {detail}; "
        "send it gzip-compressed, or without Content-Encoding"
    )
    assert (status, body) == (400, json.dumps({"error": message}).encode())


def test_gzip_response_above_the_threshold(server: ServerProcess, spec: FeatureSpec) -> None:
    path, body = bodies(spec)["v2-vector"]
    _, plain_headers, plain = request(server, "POST", path, body)
    assert len(plain) > MIN_COMPRESSED and "content-encoding" not in plain_headers
    status, headers, packed = request(server, "POST", path, body, {"Accept-Encoding": "br, gzip;q=0.8"})
    assert status == 200 and headers["content-encoding"] == "gzip" and headers["vary"] == "accept-encoding"
    assert int(headers["content-length"]) == len(packed) < len(plain)
    assert gzip.decompress(packed) == plain
    status, headers, packed = request(server, "POST", path, body, {"Accept-Encoding": "deflate"})
    assert headers["content-encoding"] == "deflate" and zlib.decompress(packed) == plain


def test_no_compression_below_the_threshold_or_when_refused(server: ServerProcess) -> None:
    status, headers, body = request(server, "GET", "/v2/health/live", headers={"Accept-Encoding": "gzip"})
    assert (status, body) == (200, b'{"live": true}') and "content-encoding" not in headers
    plain = request(server, "GET", "/metrics")[2]
    assert len(plain) > MIN_COMPRESSED
    for refused in ("gzip;q=0", "br", "identity"):
        _, headers, body = request(
            server, "GET", "/v1/models/ctr/metadata", headers={"Accept-Encoding": refused}
        )
        assert "content-encoding" not in headers and json.loads(body)["metadata"]


def test_head_has_the_compressed_length(server: ServerProcess) -> None:
    accept = {"Accept-Encoding": "gzip"}
    _, get_headers, packed = request(server, "GET", "/v1/models/ctr/metadata", headers=accept)
    assert get_headers["content-encoding"] == "gzip"
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(
            b"HEAD /v1/models/ctr/metadata HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n"
        )
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    assert f"content-length: {len(packed)}\r\n".encode() in out and out.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_compression(
    server: ServerProcess, request_coding: str | None, response_coding: str | None, binary: bool
) -> None:
    client = triton.InferenceServerClient(f"127.0.0.1:{server.rest_port}")
    try:
        tensor = triton.InferInput("features", list(FEATURES.shape), "FP32")
        tensor.set_data_from_numpy(FEATURES, binary_data=binary)
        outputs = [triton.InferRequestedOutput("ctr", binary_data=binary)]
        plain = client.infer("ctr", [tensor], outputs=outputs).as_numpy("ctr")
        result = client.infer(
            "ctr",
            [tensor],
            outputs=outputs,
            request_compression_algorithm=request_coding,
            response_compression_algorithm=response_coding,
        )
        np.testing.assert_array_equal(result.as_numpy("ctr"), plain)
        assert plain.shape == (100, 1)
    finally:
        client.close()


def test_bomb_is_refused_before_the_rest_is_sent(server: ServerProcess) -> None:
    """The first 32 KB of a 256 MiB bomb already inflate past the limit: the 413 comes without the rest."""
    bomb = _bomb("gzip", 256 << 20)
    head = (
        b"POST /v2/models/ctr/infer HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n" % len(bomb)
    )
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(head + bomb[: 32 << 10])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert answer.endswith(
        b'decompresses to over the limit of 4194304 bytes (--max_body_bytes); send a smaller batch"}'
    )


@pytest.mark.parametrize("step", [1, 2, 7, 4096, 1 << 20])
@pytest.mark.parametrize("coding", ["gzip", "gzip-members", "deflate", "raw-deflate"])
def test_inflater_gives_the_body_in_any_chunking(coding: str, step: int) -> None:
    """serving/http/encoding.py's BodyInflater alone: any split of the compressed bytes, concatenated members."""
    body = np.random.default_rng(3).integers(0, 10, 300_000).astype(np.uint8).tobytes()
    packed = (
        gzip.compress(body[:1000]) + gzip.compress(body[1000:])
        if coding == "gzip-members"
        else CODINGS[coding](body)
    )
    inflater = BodyInflater("gzip" if coding.startswith("gzip") else "deflate", len(body))
    out = b"".join(
        piece for i in range(0, len(packed), step) for piece in inflater.feed(packed[i : i + step])
    )
    inflater.finish()
    assert out == body
