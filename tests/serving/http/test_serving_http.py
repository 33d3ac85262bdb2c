"""The HTTP/1.1 layer under the REST API: keep-alive, pipelining, 100-continue, HTTP/1.0, bad requests."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest

from tests.serving.server_process import ServerProcess

BODY = json.dumps({"instances": [[0.5] * 128]}).encode()


def _exchange(server: ServerProcess, raw: bytes) -> bytes:
    """Send raw bytes, read until the peer closes, return what came back."""
    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(raw)
        received = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def _post(connection: str = "keep-alive", version: str = "1.1") -> bytes:
    head = f"POST /v1/models/ctr:predict HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
    return (head + f"Connection: {connection}\r\nContent-Length: {len(BODY)}\r\n\r\n").encode() + BODY


def test_pipelined_requests_are_answered_in_order(shared_server: ServerProcess) -> None:
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    out = _exchange(shared_server, _post() + health + _post(connection="close"))
    answers = out.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"200 OK"] * 3
    assert (
        b'"predictions"' in answers[0]
        and b'{"status": "alive"}' in answers[1]
        and b'"predictions"' in answers[2]
    )
    assert b"connection: close" in answers[2]


def test_http_1_0_request_gets_an_answer_and_close(shared_server: ServerProcess) -> None:
    out = _exchange(shared_server, _post(connection="close", version="1.0"))
    assert out.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"connection: close\r\n" in out


def test_malformed_http_is_400_and_closes(shared_server: ServerProcess) -> None:
    out = _exchange(shared_server, b"NOT-HTTP\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b'{"error": "malformed HTTP request' in out


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_large_body_with_expect_100_continue(shared_server: ServerProcess) -> None:
    body = json.dumps({"instances": [[0.5] * 128] * 400})  # ~250 KB: curl sends Expect: 100-continue
    result = subprocess.run(
        [
            "curl",
            "-s",
            "-H",
            "Expect: 100-continue",
            "-X",
            "POST",
            "--data-binary",
            "@-",
            shared_server.url("/v1/models/ctr:predict"),
        ],
        input=body,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert len(json.loads(result.stdout)["predictions"]) == 400


def test_overlong_url_is_414_and_closes(shared_server: ServerProcess) -> None:
    out = _exchange(shared_server, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 414 Request-URI Too Long\r\n")
    assert out.endswith(b'{"error": "request URL is over 8192 bytes"}')


def test_pipelined_request_without_a_timeout_header_has_no_deadline_of_the_one_before(
    shared_server: ServerProcess,
) -> None:
    # Both answered by one task of the connection: the second must not inherit the first's header.
    timed = _post().replace(b"Host: x\r\n", b"Host: x\r\nx-request-timeout-ms: 0\r\n")
    out = _exchange(shared_server, timed + _post(connection="close"))
    answers = out.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"400 Bad Request", b"200 OK"]
    assert b"x-request-timeout-ms must be a whole number of milliseconds from 1 to" in answers[0]
