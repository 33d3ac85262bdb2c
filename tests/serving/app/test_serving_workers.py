"""`--num_workers 2`: two server processes behind the same REST and gRPC ports, with summed metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.helpers import REPO_ROOT, free_port
from tests.serving.model_repo import reference_predict
from tests.serving.server_process import ServerProcess, http, wait_for_inflight

ROW = [0.5] * 128


def children(pid: int) -> set[int]:
    """Pids of the live processes whose parent is `pid`."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process exited while we looked
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def predict_served_by(server: ServerProcess) -> tuple[int, int, float]:
    """One REST predict on a new connection: (status, pid of the worker that answered, score)."""
    request = urllib.request.Request(
        server.url("/v1/models/ctr:predict"), data=json.dumps({"instances": [ROW]}).encode()
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        score = json.loads(response.read())["predictions"][0][0]
        return response.status, int(response.headers["x-served-by-pid"]), score


def scrape(server: ServerProcess) -> tuple[int, str]:
    """(pid of the worker that answered, exposition text)."""
    with urllib.request.urlopen(server.url("/monitoring/prometheus/metrics"), timeout=10) as response:
        return int(response.headers["x-served-by-pid"]), response.read().decode()


def sample(text: str, series: str) -> float:
    """The value of one exact series line, e.g. `ctr_serving_model_version{model_name="ctr"}`."""
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.rsplit(" ", 1)[0] == series]
    assert len(values) == 1, f"{series} appears {len(values)} times"
    return float(values[0])


def predict_until_served_by(server: ServerProcess, pids: set[int], timeout_s: float = 20.0) -> int:
    """Send predicts on new connections until every worker in `pids` answered; returns how many were sent."""
    seen: set[int] = set()
    sent = 0
    deadline = time.monotonic() + timeout_s
    while seen != pids:
        assert time.monotonic() < deadline, f"served by {seen}, workers are {pids}:\n{server.log()}"
        status, pid, _ = predict_served_by(server)
        assert status == 200 and pid in pids
        seen.add(pid)
        sent += 1
    return sent


def test_two_workers_share_rest_and_grpc_ports_and_one_scrape_sums_them(
    start_server, model_repo, weights
) -> None:
    server = start_server(model_repo, "--num_workers=2")
    workers = children(server.proc.pid)
    assert len(workers) == 2
    rest_sent = predict_until_served_by(server, workers)
    while rest_sent < 20:
        predict_served_by(server)
        rest_sent += 1
    features = np.full((1, 128), 0.5, np.float32)
    expected = reference_predict(weights[1], features)
    grpc_sent = 4
    for _ in range(grpc_sent):  # a new channel each time: a new connection, to either worker
        with grpc.insecure_channel(server.grpc_target) as channel:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "ctr"
            request.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
            np.testing.assert_allclose(tf.make_ndarray(response.outputs["ctr"]), expected, atol=1e-6)
    scraped_by = set()
    for _ in range(50):  # until each worker has answered a scrape; every scrape shows both workers' totals
        pid, text = scrape(server)
        scraped_by.add(pid)
        total = rest_sent + grpc_sent
        assert sample(text, ':tensorflow:serving:request_count{model_name="ctr",status="OK"}') == total
        assert sample(text, 'ctr_serving_predicted_ctr_count{model_name="ctr"}') == total
        assert sample(text, 'ctr_serving_model_version{model_name="ctr"}') == 1
        assert sample(text, 'ctr_serving_inflight_requests{model_name="ctr"}') == 0
        rest_latency = (
            ':tensorflow:serving:request_latency_count{model_name="ctr",API="predict",entrypoint="REST"}'
        )
        assert sample(text, rest_latency) == rest_sent
        if scraped_by == workers:
            break
    assert scraped_by == workers


def test_killed_worker_is_restarted_and_its_requests_stay_counted(start_server, model_repo) -> None:
    server = start_server(model_repo, "--num_workers=2")
    workers = children(server.proc.pid)
    sent = predict_until_served_by(server, workers)
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while len(children(server.proc.pid) - {victim}) < 2:  # the parent forks a replacement
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    replacement = children(server.proc.pid) - workers
    sent += predict_until_served_by(server, (workers - {victim}) | replacement)
    _, text = scrape(server)
    assert sample(text, ':tensorflow:serving:request_count{model_name="ctr",status="OK"}') == sent
    assert re.search(rf"WORKER \d \(pid {victim}\) was killed by SIGKILL; restarting it", server.log())


def test_sigterm_drains_every_worker_and_exits_0_without_orphans(start_server, model_repo) -> None:
    # A 3 s batching window keeps the requests in flight, on both workers, while SIGTERM arrives.
    server = start_server(
        model_repo,
        "--num_workers=2",
        "--enable_batching",
        "--batch_timeout_micros=3000000",
        "--grace_period_seconds=10",
    )
    workers = children(server.proc.pid)
    metrics_dir = Path(re.search(r"metrics aggregated in (\S+)", server.log())[1])
    assert sorted(p.name for p in metrics_dir.iterdir()) == sorted(
        f"{kind}_{pid}.db" for pid in workers for kind in ("live", "totals")
    )
    in_flight: list = []
    clients = [
        threading.Thread(target=lambda: in_flight.append(predict_served_by(server)[0])) for _ in range(6)
    ]
    for client in clients:
        client.start()
    wait_for_inflight(server, 6)  # summed over both workers
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(http(server.url("/v1/models/ctr"))[0] == 200 for _ in range(4)):  # until both workers drain
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.02)
    # Every worker is draining, so a new connection gets the refusal whichever worker takes it.
    refused = [http(server.url("/v1/models/ctr:predict"), {"instances": [ROW]})[0] for _ in range(4)]
    readiness = [http(server.url("/v1/models/ctr"))[0] for _ in range(4)]
    for client in clients:
        client.join(15)
    assert in_flight == [200] * 6
    assert refused == [503] * 4 and readiness == [503] * 4
    assert server.proc.wait(20) == 0
    log = server.log()
    drained = [int(n) for n in re.findall(r"draining (\d+) in-flight requests", log)]
    assert len(drained) == 2 and sum(drained) == 6, log
    assert all(not Path(f"/proc/{pid}").exists() for pid in workers), "a worker outlived the parent"
    assert not metrics_dir.exists()


def test_num_workers_below_1_exits_2_with_a_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "serving", "--model_base_path=/m", "--num_workers=0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--num_workers must be >= 1, got 0" in result.stderr


def test_busy_rest_port_fails_at_once_with_exit_1(model_repo) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "serving",
                "--host=127.0.0.1",
                f"--port={free_port()}",
                f"--rest_api_port={port}",
                f"--model_base_path={model_repo}",
                "--num_workers=2",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot bind REST to 127.0.0.1:{port}: Address already in use" in result.stderr
