"""The REST HTTP layer against broken and hostile clients (issue 13, defects 1-4 and 10-13), through raw sockets."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serving.server_process import ServerProcess, http, wait_until

LIMIT_FLAGS = (
    "--header_timeout_seconds=1",
    "--body_timeout_seconds=1",
    "--keepalive_timeout_seconds=2",
    "--max_output_bytes=65536",
)
BODY = json.dumps({"instances": [[0.5] * 128]}).encode()


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory: pytest.TempPathFactory, model_repo: Path) -> Iterator[ServerProcess]:
    """One ONNX server with 1-2 s timeouts and a 64 KiB output buffer, shared by this module."""
    server = ServerProcess(model_repo, tmp_path_factory.mktemp("logs") / "server.log", *LIMIT_FLAGS)
    server.wait_ready()
    yield server
    server.stop()


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)


def read_until_closed(sock: socket.socket, timeout_s: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and the seconds that took."""
    started, received = time.monotonic(), b""
    sock.settimeout(timeout_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        received += chunk
    return received, time.monotonic() - started


def metric(server: ServerProcess, series: str) -> float:
    """The value of one sample line (e.g. `ctr_serving_connection_timeouts_total{kind="header"}`); 0 if absent."""
    _, text = http(server.url("/metrics"))
    match = re.search("^" + re.escape(series) + r" (\S+)$", str(text), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def predict_request(extra_headers: str = "", body: bytes = BODY) -> bytes:
    head = f"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra_headers}\r\n"
    return head.encode() + body


def statuses(raw: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", raw)


# --- 1. slow clients --------------------------------------------------------------------------------
def test_slow_header_and_slow_body_clients_are_closed_at_their_timeouts(
    limited_server: ServerProcess,
) -> None:
    header_series = 'ctr_serving_connection_timeouts_total{kind="header"}'
    body_series = 'ctr_serving_connection_timeouts_total{kind="body"}'
    headers_before, bodies_before = metric(limited_server, header_series), metric(limited_server, body_series)
    slow_header, slow_body = connect(limited_server), connect(limited_server)
    slow_header.sendall(b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
    slow_body.sendall(b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    for sock in (slow_header, slow_body):
        received, seconds = read_until_closed(sock)
        sock.close()
        assert received == b""  # dropped without an answer
        assert seconds < 3.0, f"closed after {seconds:.1f}s; the timeouts are 1 s"
    assert metric(limited_server, header_series) == headers_before + 1
    assert metric(limited_server, body_series) == bodies_before + 1


def test_idle_keepalive_connection_is_closed(limited_server: ServerProcess) -> None:
    before = metric(limited_server, 'ctr_serving_connection_timeouts_total{kind="keepalive"}')
    with connect(limited_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        received, seconds = read_until_closed(sock)
    assert statuses(received) == [b"200"]
    assert 1.5 < seconds < 4.0, f"idle connection closed after {seconds:.1f}s; keep-alive timeout is 2 s"
    assert metric(limited_server, 'ctr_serving_connection_timeouts_total{kind="keepalive"}') == before + 1


def test_connections_over_the_cap_are_refused_at_once(start_server, model_repo) -> None:
    server = start_server(model_repo, "--max_connections=3")
    held = [connect(server) for _ in range(3)]
    try:
        time.sleep(0.2)
        assert metric_from_held(server, held) == 3.0
        with connect(server) as extra:
            received, seconds = read_until_closed(extra)
        assert statuses(received) == [b"503"]
        assert received.endswith(b'{"error": "too many open connections (--max_connections=3)"}')
        assert seconds < 1.0
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert metric(server, 'ctr_serving_requests_refused_total{kind="connections"}') == 1.0
    assert metric(server, "ctr_serving_open_connections") == 1.0  # the scrape's own connection


def metric_from_held(server: ServerProcess, held: list[socket.socket]) -> float:
    """Read the open-connections gauge over one of the `held` connections (a new one would be refused)."""
    sock = held[0]
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(5)
    received = b""
    while b"ctr_serving_open_connections " not in received or not received.endswith(b"\n"):
        received += sock.recv(65536)
    match = re.search(rb"^ctr_serving_open_connections (\S+)$", received, re.MULTILINE)
    assert match, received[-500:]
    return float(match.group(1))


# --- 2. one request must not block the event loop ---------------------------------------------------
def test_pathological_body_is_refused_before_parsing_and_stalls_nobody(limited_server: ServerProcess) -> None:
    pathological = b'{"instances": [' + b"[]," * ((8 << 20) // 3 - 10) + b"[]]}"
    latencies: list[float] = []
    stop = threading.Event()

    def health_client() -> None:
        with connect(limited_server) as sock:
            while not stop.is_set():
                started = time.perf_counter()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                received = b""
                while not received.endswith(b'{"status": "alive"}'):
                    received += sock.recv(4096)
                latencies.append(time.perf_counter() - started)
                time.sleep(0.005)

    before = metric(limited_server, 'ctr_serving_requests_refused_total{kind="instances"}')
    client = threading.Thread(target=health_client)
    client.start()
    try:
        for _ in range(3):
            status, body = http(limited_server.url("/v1/models/ctr:predict"), raw=pathological, timeout=30)
            assert (status, body) == (
                400,
                {
                    "error": f"the body holds {(8 << 20) // 3 - 8} JSON arrays and 1 objects, more than a batch "
                    "of 1024 instances can (--max_instances); split the request"
                },
            )
    finally:
        stop.set()
        client.join()
    assert metric(limited_server, 'ctr_serving_requests_refused_total{kind="instances"}') == before + 3
    assert len(latencies) > 10
    assert max(latencies) < 0.2, f"a health check waited {max(latencies) * 1e3:.0f} ms behind the body"


# --- 3. write back-pressure -------------------------------------------------------------------------
NON_READER_ROUNDS = 20_000


def test_client_that_does_not_read_is_paused_then_dropped(limited_server: ServerProcess) -> None:
    before = metric(limited_server, 'ctr_serving_connection_timeouts_total{kind="write"}')
    rss_before = limited_server.rss_bytes()
    with connect(limited_server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # A small send buffer too: loopback's autotuned send buffer (tcp_wmem, up to 4 MiB) could otherwise
        # swallow every pipelined request without the server reading any of them.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.settimeout(0.5)
        sent = 0
        try:  # pipeline ~14 MB of requests, more than any kernel buffer here; the server stops reading
            for _ in range(NON_READER_ROUNDS):
                sock.sendall(request * 20)
                sent += 20
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass
        rss_during = limited_server.rss_bytes()
        write_timeouts = 'ctr_serving_connection_timeouts_total{kind="write"}'
        # The 1 s send timeout passes and the sweep (every 0.25 s) closes the connection: once.
        wait_until(lambda: metric(limited_server, write_timeouts) > before, "the write timeout")
        assert metric(limited_server, write_timeouts) == before + 1
    assert sent < NON_READER_ROUNDS * 20, "the server read every request although the client read no answer"
    assert rss_during - rss_before < 32 << 20, f"RSS grew by {(rss_during - rss_before) >> 20} MiB"


# --- 4. closed connections free their memory at once -------------------------------------------------
def test_bodies_of_closed_connections_are_freed(start_server, model_repo) -> None:
    server = start_server(model_repo, "--max_buffered_bytes=1073741824")  # let all 20 bodies in
    rss_start = server.rss_bytes()
    head = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 8000000\r\n\r\n"
    for _ in range(3):  # three rounds of 20 clients holding 6 MB each, then leaving
        socks = [connect(server) for _ in range(20)]
        for sock in socks:
            sock.sendall(head + b"0" * 6_000_000)
        time.sleep(0.5)
        for sock in socks:
            sock.close()
        time.sleep(0.5)
    # The sweep hands the freed memory back within a few of its rounds.
    wait_until(lambda: server.rss_bytes() - rss_start < 64 << 20, "RSS back within 64 MiB of its start")


# --- 10. header limits ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "error", "kind"),
    [
        pytest.param(
            "X-Big: " + "a" * (70 << 10) + "\r\n",
            "request header section is over 65536 bytes",
            "header_bytes",
            id="70KiB-header",
        ),
        pytest.param(
            "".join(f"X-H{i}: v\r\n" for i in range(201)),
            "request has over 200 header lines",
            "header_count",
            id="201-headers",
        ),
    ],
)
def test_oversized_headers_get_431_and_close(
    limited_server: ServerProcess, headers: str, error: str, kind: str
) -> None:
    before = metric(limited_server, f'ctr_serving_requests_refused_total{{kind="{kind}"}}')
    with connect(limited_server) as sock:
        sock.sendall(predict_request(headers))
        received, _ = read_until_closed(sock)
    assert statuses(received) == [b"431"]
    assert received.endswith(json.dumps({"error": error}).encode())
    assert b"connection: close\r\n" in received
    assert metric(limited_server, f'ctr_serving_requests_refused_total{{kind="{kind}"}}') == before + 1


# --- 11. 100-continue only when the request can be accepted ------------------------------------------
def test_expect_100_continue_over_the_limit_gets_413_without_continue(limited_server: ServerProcess) -> None:
    with connect(limited_server) as sock:
        sock.sendall(
            b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: 33000000\r\n\r\n"
        )
        received, _ = read_until_closed(sock)
    assert statuses(received) == [b"413"]
    assert received.endswith(
        b'{"error": "request body of 33000000 bytes is over the limit of 8388608 (--max_body_bytes)"}'
    )


def test_expect_100_continue_within_the_limit_gets_continue_then_answer(
    limited_server: ServerProcess,
) -> None:
    with connect(limited_server) as sock:
        head = predict_request("Expect: 100-continue\r\nConnection: close\r\n")[: -len(BODY)]
        sock.sendall(head)
        interim = sock.recv(64)
        sock.sendall(BODY)
        received, _ = read_until_closed(sock)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert statuses(received) == [b"200"]


# --- 12. pipelined answers are never dropped ---------------------------------------------------------
def test_pipelined_request_before_garbage_keeps_its_answer(limited_server: ServerProcess) -> None:
    with connect(limited_server) as sock:
        sock.sendall(predict_request() + b"\x00\x01garbage\r\n\r\n")
        received, _ = read_until_closed(sock)
    assert statuses(received) == [b"200", b"400"]
    assert b'"predictions"' in received


def test_pipelined_requests_up_to_connection_close_get_every_answer(limited_server: ServerProcess) -> None:
    after_close = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # sent after `Connection: close`: ignored
    with connect(limited_server) as sock:
        sock.sendall(predict_request() + predict_request("Connection: close\r\n") + after_close)
        sock.shutdown(socket.SHUT_WR)  # what `printf ... | nc` does
        received, _ = read_until_closed(sock)
    assert statuses(received) == [b"200", b"200"]
    assert received.count(b'"predictions"') == 2


# --- 13. HEAD -----------------------------------------------------------------------------------------
def test_head_gets_get_headers_without_a_body(limited_server: ServerProcess) -> None:
    with connect(limited_server) as sock:
        sock.sendall(
            b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        received, _ = read_until_closed(sock)
    head_answer, get_answer = received.split(b"HTTP/1.1 ")[1:]
    assert head_answer.startswith(b"200 OK\r\n")
    assert b"content-length: 19\r\n" in head_answer
    assert head_answer.endswith(b"\r\n\r\n")  # headers only: the next bytes are the GET's answer
    assert get_answer.endswith(b'{"status": "alive"}')


def test_bodies_over_the_server_budget_get_503(start_server, model_repo) -> None:
    server = start_server(model_repo, "--max_buffered_bytes=1000000")
    head = b"POST /v1/models/ctr:predict HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n"
    with connect(server) as first, connect(server) as second:
        first.sendall(head + b" " * 600_000)  # holds 600 KB of the 1 MB budget
        second.sendall(head + b" " * 390_000)  # 990 KB: still within it
        time.sleep(0.3)
        second.sendall(b" " * 20_000)  # over it; more would be answered with a reset
        received, _ = read_until_closed(second)
    assert statuses(received) == [b"503"]
    assert received.endswith(
        b'{"error": "the server holds over 1000000 bytes of request bodies (--max_buffered_bytes); retry later"}'
    )
    assert metric(server, 'ctr_serving_requests_refused_total{kind="buffered_bytes"}') == 1.0
