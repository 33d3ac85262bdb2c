"""Dynamic batching: concurrent requests are merged into fewer model calls; a full queue answers 429."""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from tests.serving.model_repo import reference_predict
from tests.serving.server_process import http, wait_for_inflight


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in exposition"
    return float(match.group(1))


def test_concurrent_requests_are_merged_into_batches(start_server, model_repo, weights) -> None:
    server = start_server(
        model_repo, "--enable_batching", "--max_batch_size=64", "--batch_timeout_micros=500000"
    )
    rows = np.random.default_rng(2).random((32, 128), dtype=np.float32)
    with ThreadPoolExecutor(32) as pool:
        results = list(
            pool.map(lambda r: http(server.url("/v1/models/ctr:predict"), {"instances": [r.tolist()]}), rows)
        )
    assert [status for status, _ in results] == [200] * 32
    scores = np.array([body["predictions"][0] for _, body in results])
    np.testing.assert_allclose(scores, reference_predict(weights[1], rows), atol=1e-6)
    _, text = http(server.url("/metrics"))
    batches = _metric(text, 'ctr_serving_batch_size_count{model_name="ctr"}')
    merged_rows = _metric(text, 'ctr_serving_batch_size_sum{model_name="ctr"}')
    # 32 clients inside 500 ms batching windows: all rows merged into far fewer model calls.
    assert merged_rows == 32
    assert batches <= 8


def test_full_queue_refuses_at_once_with_429(start_server, model_repo) -> None:
    server = start_server(
        model_repo,
        "--enable_batching",
        "--max_batch_size=4",
        "--max_enqueued_batches=1",
        "--batch_timeout_micros=3000000",
    )
    row = [0.5] * 128
    first: list = []
    waiting = threading.Thread(
        target=lambda: first.append(http(server.url("/v1/models/ctr:predict"), {"instances": [row]}))
    )
    waiting.start()
    wait_for_inflight(server, 1)  # the 1-row request now holds the batch open for 3 s
    started = time.monotonic()
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": [row] * 4})
    refused_after = time.monotonic() - started
    waiting.join(10)
    assert (status, body) == (429, {"error": "batching queue is full (1 rows queued, limit 4); retry later"})
    assert refused_after < 0.5
    assert first[0][0] == 200
    _, text = http(server.url("/metrics"))
    assert (
        _metric(text, ':tensorflow:serving:request_count{model_name="ctr",status="RESOURCE_EXHAUSTED"}') == 1
    )


def test_request_queued_past_its_deadline_gets_504(start_server, model_repo) -> None:
    server = start_server(
        model_repo, "--enable_batching", "--batch_timeout_micros=800000", "--rest_api_timeout_in_ms=200"
    )
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": [[0.5] * 128]})
    assert status == 504
    waited = re.fullmatch(
        r"request waited (\d+\.\d{3})s in the batching queue, over the 200 ms deadline \(--rest_api_timeout_in_ms\)",
        body["error"],
    )
    # At least the 0.8 s window; the upper bound leaves room for a busy machine's late timer.
    assert waited and 0.8 <= float(waited[1]) < 5.0, body
