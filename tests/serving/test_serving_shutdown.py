"""SIGTERM: readiness off, new requests refused, in-flight requests finish, exit code 0."""

from __future__ import annotations

import signal
import threading
import time

from tests.serving.server_process import http

ROW = [0.5] * 128


def test_sigterm_drains_in_flight_requests_and_exits_0(start_server, model_repo) -> None:
    # A 1.5 s batching window keeps the first requests in flight while SIGTERM arrives.
    server = start_server(
        model_repo,
        "--enable_batching",
        "--max_batch_size=64",
        "--batch_timeout_micros=1500000",
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
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = http(server.url("/v1/models/ctr:predict"), {"instances": [ROW]})
    readiness = http(server.url("/v1/models/ctr"))
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
