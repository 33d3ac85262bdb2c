"""Deadlines on a real server: REST's x-request-timeout-ms and gRPC deadlines; a version that misses them breaks.

The server batches with a 500 ms batch window, so every request waits 500 ms in the queue before its model
runs: a deadline shorter than that passes while the request waits.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from tensorflow_serving.apis import prediction_service_pb2_grpc

from tests.serving.fallback_repo import rows, write_good_version
from tests.serving.model_repo import make_weights
from tests.serving.routing.test_fallback import fallbacks, grpc_request, predict
from tests.serving.server_process import ServerProcess

WINDOW_US = 500_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("deadline") / "ctr"
    base.mkdir()
    write_good_version(base, 1, make_weights(1))
    write_good_version(base, 2, make_weights(2))
    proc = ServerProcess(
        base,
        tmp_path_factory.mktemp("logs") / "server.log",
        "--model_version_policy=all",
        "--num_workers=1",
        "--enable_batching",
        f"--batch_timeout_micros={WINDOW_US}",
        "--fallback_min_requests=4",
        "--fallback_window_s=60",
        "--fallback_cooldown_s=60",
    )
    proc.wait_versions({1, 2})
    yield proc
    proc.stop()


def metric(server: ServerProcess, series: str) -> float:
    """The value of one exact series (name{labels}) of the metrics page; 0 when absent."""
    conn = http.client.HTTPConnection("127.0.0.1", server.rest_port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series + " ")]
    return values[0] if values else 0.0


def test_rest_timeout_passed_before_the_work_started_is_a_504(server: ServerProcess) -> None:
    # Two pipelined requests on one connection: the second is read at once but starts only after the first
    # has answered (>= 500 ms), past its 100 ms timeout.
    body = json.dumps({"instances": rows(0.5).tolist()}).encode()

    def request(extra: bytes) -> bytes:
        return (
            b"POST /v1/models/ctr:predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + extra
            + b"content-length: %d\r\n\r\n" % len(body)
            + body
        )

    with socket.create_connection(("127.0.0.1", server.rest_port), timeout=10) as sock:
        sock.sendall(request(b"") + request(b"x-request-timeout-ms: 100\r\n"))
        reader = sock.makefile("rb")
        answers = [_read_response(reader) for _ in range(2)]
    assert answers[0][0] == 200
    status, payload = answers[1]
    assert status == 504, payload
    message = payload["error"]
    assert message.startswith("the request's deadline passed ") and "before its work started" in message
    assert "x-request-timeout-ms" in message


def _read_response(reader: Any) -> tuple[int, Any]:
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return status, json.loads(reader.read(length))


def test_rest_timeout_header_is_checked(server: ServerProcess) -> None:
    status, body, _ = predict(server, 0.5, headers={"x-request-timeout-ms": "5000"})
    assert status == 200 and len(body["predictions"]) == 1
    for bad in ("abc", "0", "-5", "1.5"):
        status, body, _ = predict(server, 0.5, headers={"x-request-timeout-ms": bad})
        assert status == 400, (bad, body)
        assert body["error"].startswith("x-request-timeout-ms must be a whole number of milliseconds"), body


def test_rest_timeout_cuts_a_run_still_waiting_in_the_batching_queue(server: ServerProcess) -> None:
    batches = 'ctr_serving_batch_size_count{model_name="ctr"}'
    before = metric(server, batches)
    started = time.monotonic()
    status, body, _ = predict(server, 0.5, headers={"x-request-timeout-ms": "100"})  # the window is 500 ms
    assert time.monotonic() - started < WINDOW_US / 1e6  # answered at its deadline, not at the window's end
    assert status == 504, body
    assert body["error"].startswith("the model did not answer within the request's x-request-timeout-ms"), (
        body
    )
    time.sleep(WINDOW_US / 1e6 + 0.2)  # the batch window it was queued in has closed
    assert metric(server, batches) == before  # it was dropped from the queue unrun


def test_grpc_deadline_passed_in_the_queue_is_not_run_and_breaks_the_version(server: ServerProcess) -> None:
    batches = 'ctr_serving_batch_size_count{model_name="ctr"}'
    before = metric(server, batches)
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        # Each waits in the queue past its 100 ms deadline: a miss of version 2 (or, once its circuit is open,
        # of version 1, which answers for it).
        for _ in range(4):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Predict(grpc_request(rows(0.5)), timeout=0.1)
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(WINDOW_US / 1e6 + 0.2)  # the batch window the cancelled requests were in has closed
        assert metric(server, batches) == before  # none of them ran
        # Misses are at least half of version 2's outcomes (at least 4): its circuit is open, so routed
        # requests are answered by version 1.
        response, call = stub.Predict.with_call(grpc_request(rows(0.5)), timeout=10)
        assert response.model_spec.version.value == 1
        assert dict(call.trailing_metadata() or ())["x-ctr-fallback"] == "deadline"
    assert fallbacks(server)[("2", "deadline")] >= 1
    assert "version 2: circuit open (deadline)" in server.log()
