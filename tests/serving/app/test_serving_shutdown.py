"""SIGTERM: readiness off, new requests refused, in-flight requests finish, exit code 0."""

from __future__ import annotations

import signal
import threading
import time

from tests.serving.server_process import http, wait_for_inflight

ROW = [0.5] * 128


def test_sigterm_drains_in_flight_requests_and_exits_0(start_server, model_repo) -> None:
    # A 3 s batching window keeps the first requests in flight while SIGTERM arrives.
    server = start_server(
        model_repo,
        "--enable_batching",
        "--max_batch_size=64",
        "--batch_timeout_micros=3000000",
        "--grace_period_seconds=10",
    )
    in_flight: list = []
    clients = [
        threading.Thread(
            target=lambda: in_flight.append(http(server.url("/v1/models/ctr:predict"), {"instances": [ROW]}))
        )
        for _ in range(3)
    ]
    for client in clients:
        client.start()
    wait_for_inflight(server, 3)
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (readiness := http(server.url("/v1/models/ctr")))[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.02)  # until the server has handled SIGTERM
    refused = http(server.url("/v1/models/ctr:predict"), {"instances": [ROW]})
    for client in clients:
        client.join(10)
    assert refused == (503, {"error": "the server is shutting down; retry on another replica"})
    assert readiness == (503, {"error": "the server is shutting down"})
    assert [status for status, _ in in_flight] == [200, 200, 200]
    assert server.proc.wait(15) == 0
    assert "draining 3 in-flight requests" in server.log()


def test_sigterm_on_idle_server_exits_0_quickly(start_server, model_repo) -> None:
    server = start_server(model_repo)
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 5
