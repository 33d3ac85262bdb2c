"""Sampled request logs: the sample rate, the x-request-id round trip, size rotation, lines dropped (and
counted) instead of failing or slowing a predict when the disk is full, unwritable or slow, and files removed,
renamed or truncated by a shipper without a line lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from serving.observability.request_log import RequestLog, new_request_id, sampled, server_made
from tests.serving.model_repo import WIDTH
from tests.serving.server_process import ServerProcess, http

ROWS = np.random.default_rng(7).random((3, WIDTH)).round(4).astype(np.float32)


def predict(server: ServerProcess, request_id: str | None = None) -> tuple[int, str | None, list]:
    """One REST predict of ROWS; returns (status, x-request-id of the answer, predictions)."""
    body = json.dumps({"instances": ROWS.tolist()}).encode()
    headers = {"x-request-id": request_id} if request_id else {}
    request = urllib.request.Request(server.url("/v1/models/ctr:predict"), body, headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return (
            response.status,
            response.headers.get("x-request-id"),
            json.loads(response.read())["predictions"],
        )


def counter(server: ServerProcess, name: str) -> float:
    _, text = http(server.url("/metrics"))
    prefix = f'{name}{{model_name="ctr"}} '
    values = [float(line[len(prefix) :]) for line in str(text).splitlines() if line.startswith(prefix)]
    assert len(values) == 1, f"no {name} in the metrics"
    return values[0]


def wait_for(read, expected: float, timeout_s: float = 10.0) -> float:
    """Poll `read()` until it returns `expected` (the writer thread is asynchronous); returns the last value."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


def log_lines(directory: Path) -> list[dict]:
    return [
        json.loads(line)
        for f in sorted(directory.glob("requests-*.jsonl"))
        for line in f.read_text().splitlines()
    ]


def test_sampled_lines_follow_the_rate_and_hold_the_request(model_repo: Path, start_server, tmp_path: Path):
    logs = tmp_path / "logs"
    server = start_server(model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=0.25")
    ids = [f"req-{i}" for i in range(200)]
    answers = {}
    for request_id in ids:
        status, echoed, predictions = predict(server, request_id)
        assert (status, echoed) == (200, request_id)  # the client's id comes back
        answers[request_id] = predictions
    expected = [i for i in ids if sampled(i, 0.25)]
    assert 30 < len(expected) < 70  # the hash spreads ids evenly
    assert wait_for(lambda: counter(server, "ctr_serving_request_log_lines_total"), len(expected)) == len(
        expected
    )
    lines = log_lines(logs)
    assert sorted(line["request_id"] for line in lines) == sorted(expected)
    line = lines[0]
    # The latest version answered (no label routed it): no canary, no shadow, no fallback.
    assert line["model"] == {"name": "ctr", "version": 1, "label": None}
    assert (line["canary"], line["shadow"], line["fallback"]) == (False, False, None)
    assert np.allclose(line["inputs"]["instances"], ROWS)
    assert np.allclose(line["outputs"], answers[line["request_id"]])
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-11-30T08:00:00.123Z")
    assert counter(server, "ctr_serving_request_log_dropped_total") == 0

    status, generated, _ = predict(server)  # no id sent: the server makes one
    assert status == 200 and generated and generated != predict(server)[1]


def test_rate_0_writes_nothing_and_ids_are_still_returned(model_repo: Path, start_server, tmp_path: Path):
    logs = tmp_path / "logs"
    server = start_server(model_repo, f"--request_log_dir={logs}")
    assert predict(server, "abc-1")[1] == "abc-1"
    assert predict(server, "bad id with spaces")[1] != "bad id with spaces"  # not a sane token: replaced
    assert not logs.exists()


def test_files_rotate_by_size(model_repo: Path, start_server, tmp_path: Path):
    logs = tmp_path / "logs"
    server = start_server(
        model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=1", "--request_log_max_bytes=1000"
    )
    for i in range(12):
        predict(server, f"rot-{i}")
    assert wait_for(lambda: counter(server, "ctr_serving_request_log_lines_total"), 12) == 12
    files = sorted(logs.glob("requests-*.jsonl"))
    # Every line (3 rows of 128 floats) is over 1,000 bytes, so each file holds exactly one.
    assert len(files) == 12
    assert [len(f.read_text().splitlines()) for f in files] == [1] * 12


def test_unwritable_directory_drops_and_counts_lines_and_predicts_succeed(
    model_repo: Path, start_server, tmp_path: Path
):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the log directory should be")
    server = start_server(model_repo, f"--request_log_dir={blocker}/logs", "--request_log_sample_rate=1")
    for i in range(20):
        assert predict(server, f"u-{i}")[0] == 200
    assert wait_for(lambda: counter(server, "ctr_serving_request_log_dropped_total"), 20) == 20
    assert counter(server, "ctr_serving_request_log_lines_total") == 0


def test_full_disk_drops_and_counts_lines_and_predicts_succeed(
    model_repo: Path, start_server, tmp_path: Path
):
    logs = tmp_path / "logs"
    logs.mkdir()
    server = start_server(model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=1")
    for seq in range(1, 4):  # every file the writer opens is /dev/full: each write fails with ENOSPC
        (logs / f"requests-{server.proc.pid}-{seq}.jsonl").symlink_to("/dev/full")
    for i in range(20):
        assert predict(server, f"f-{i}")[0] == 200
    assert wait_for(lambda: counter(server, "ctr_serving_request_log_dropped_total"), 20) == 20
    assert counter(server, "ctr_serving_request_log_lines_total") == 0
    assert "request log: dropping lines" in server.log()


def test_a_stuck_writer_never_blocks_record_and_counts_the_overflow(tmp_path: Path):
    """A disk that hangs: the writer thread is stuck on its first line, the queue (3 lines) fills up."""
    dropped: list[int] = []
    stuck = threading.Event()

    async def scenario() -> list[float]:
        log = RequestLog(tmp_path, 1.0, 1 << 20, on_drop=dropped.append, queue_lines=3)
        log._append = lambda lines, start: stuck.wait(10) and len(lines)  # type: ignore[method-assign]
        log.start()
        outputs = np.zeros((1, 1), np.float32)
        log.record("first", "ctr", 1, lambda: {"instances": []}, outputs)
        while log._queue:  # the writer took the first line and hangs on it
            await asyncio.sleep(0.01)
        took = []
        for i in range(9):
            started = time.perf_counter()
            log.record(f"r{i}", "ctr", 1, lambda: {"instances": []}, outputs)
            took.append(time.perf_counter() - started)
        stuck.set()
        log.stop()
        return took

    took = asyncio.run(scenario())
    assert dropped == [1] * 6  # 3 lines fit in the queue, the other 6 are dropped and counted
    assert max(took) < 0.05


def test_grpc_requests_are_logged_with_the_clients_id_in_the_trailing_metadata(
    model_repo: Path, start_server, tmp_path: Path
):
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    logs = tmp_path / "logs"
    server = start_server(model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=1")
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "ctr"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(ROWS))
    with grpc.insecure_channel(server.grpc_target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        _, call = stub.Predict.with_call(request, timeout=10, metadata=(("x-request-id", "grpc-7"),))
    assert dict(call.trailing_metadata())["x-request-id"] == "grpc-7"
    assert wait_for(lambda: counter(server, "ctr_serving_request_log_lines_total"), 1) == 1
    [line] = log_lines(logs)
    assert line["request_id"] == "grpc-7" and np.allclose(line["inputs"]["instances"], ROWS)


def shipped_ids(directory: Path, shipped: list[str]) -> list[str]:
    """Request ids of every line in the folder's files (shipped copies included) and in `shipped`."""
    ids = [json.loads(line)["request_id"] for line in shipped]
    for f in sorted(directory.glob("requests-*")):
        ids += [json.loads(line)["request_id"] for line in f.read_text().splitlines()]
    return ids


def open_logs(server: ServerProcess, directory: Path) -> set[str]:
    """The request-log paths the server's process holds open (Linux /proc), as the kernel names them."""
    fds = Path(f"/proc/{server.proc.pid}/fd")
    held = set()
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith(str(directory)):
            held.add(target)
    return held


def test_removed_renamed_and_copy_truncated_files_lose_no_line(
    model_repo: Path, start_server, tmp_path: Path
):
    """At rate 1, the file the server writes is shipped three ways between requests: copied and removed, renamed
    (logrotate's default) and copied then truncated (logrotate's copytruncate). Every id is in exactly one file."""
    logs = tmp_path / "logs"
    server = start_server(model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=1")
    ids: list[str] = []
    shipped: list[str] = []  # lines of the removed file, as a shipper copied them before removing it

    def burst(tag: str) -> Path:
        for i in range(25):
            ids.append(f"{tag}-{i}")
            assert predict(server, ids[-1])[0] == 200
        lines = lambda: counter(server, "ctr_serving_request_log_lines_total")  # noqa: E731
        assert wait_for(lines, len(ids)) == len(ids)
        [current] = [f for f in logs.glob("requests-*.jsonl")]  # one file at a time: the one being written
        return current

    current = burst("a")
    shipped += current.read_text().splitlines()
    current.unlink()  # ship, then remove

    current = burst("b")
    assert current.name.endswith("-2.jsonl")  # the removal was noticed at the next line
    current.rename(current.with_name(current.name + ".1"))  # logrotate, rename style (no postrotate)

    current = burst("c")
    assert current.name.endswith("-3.jsonl")
    copy = current.with_name(current.name + ".2")
    copy.write_bytes(current.read_bytes())  # logrotate, copytruncate style
    with current.open("r+b") as f:
        f.truncate(0)

    current = burst("d")
    assert current.name.endswith("-3.jsonl")  # written on after the truncation: it holds d-* only
    assert [json.loads(line)["request_id"] for line in current.read_text().splitlines()] == [
        f"d-{i}" for i in range(25)
    ]
    found = shipped_ids(logs, shipped)
    assert sorted(found) == sorted(ids) and len(found) == len(set(found)) == 100  # each id exactly once
    assert counter(server, "ctr_serving_request_log_dropped_total") == 0

    # A quiet server lets go of a renamed file within a second: the shipper may take it.
    moved = current.with_name("shipped-now.jsonl")
    current.rename(moved)
    deadline = time.monotonic() + 5
    while str(moved) in open_logs(server, logs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert str(moved) not in open_logs(server, logs)
    assert "was removed; starting a new file" in server.log() and "was renamed" in server.log()


def test_files_renamed_under_concurrent_traffic_keep_every_line(
    model_repo: Path, start_server, tmp_path: Path
):
    """8 clients at rate 1 while the file is renamed every 40 requests: written + dropped = sent, and every
    id is in exactly one file."""
    logs = tmp_path / "logs"
    server = start_server(model_repo, f"--request_log_dir={logs}", "--request_log_sample_rate=1")
    ids = [f"conc-{i}" for i in range(320)]
    done = threading.Semaphore(0)

    def client(mine: list[str]) -> None:
        for request_id in mine:
            assert predict(server, request_id)[0] == 200
            done.release()

    threads = [threading.Thread(target=client, args=(ids[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    moved = 0
    for n in range(len(ids)):
        assert done.acquire(timeout=30)
        if n % 40 == 39:
            for f in logs.glob("requests-*.jsonl"):
                f.rename(f.with_name(f"{f.name}.shipped-{moved}"))
                moved += 1
    for t in threads:
        t.join(30)
    lines = wait_for(lambda: counter(server, "ctr_serving_request_log_lines_total"), len(ids))
    assert lines + counter(server, "ctr_serving_request_log_dropped_total") == len(ids) == lines
    found = shipped_ids(logs, [])
    assert sorted(found) == sorted(ids) and moved >= 3


def test_a_forked_worker_makes_ids_of_its_own_prefix() -> None:
    """`--num_workers` forks its workers after this module is imported: their made ids must not collide."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then exit without unwinding
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child_id = os.read(read, 256).decode()
    os.close(read)
    parent_id = new_request_id()
    assert child_id.rsplit("-", 1)[0] != parent_id.rsplit("-", 1)[0]
    assert server_made(parent_id) and not server_made(child_id)
