"""Bad version folders against a real server: each fault fails its own version, never the poll or the others."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    get_model_status_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from serving.errors import ModelLoadError
from serving.observability.metrics import ServingMetrics
from serving.repository.manager import ModelManager
from serving.repository.policy import VersionPolicy
from serving.repository.states import VersionState, VersionStates
from serving.repository.warmup import read_tfrecords
from serving.routing.router import Router
from tests.serving.model_repo import reference_predict, write_manifest, write_version
from tests.serving.server_process import ServerProcess, http, wait_polls

ROW = np.random.default_rng(5).random((1, 128), dtype=np.float32)
POLL = "--file_system_poll_wait_seconds=0.25"


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s}s"
        time.sleep(0.1)


def _states(server: ServerProcess) -> dict[str, str]:
    _, body = http(server.url("/v1/models/ctr"))
    return {s["version"]: s["state"] for s in body["model_version_status"]} if isinstance(body, dict) else {}


def _status(server: ServerProcess, version: int) -> dict[str, Any]:
    _, body = http(server.url(f"/v1/models/ctr/versions/{version}"))
    (entry,) = body["model_version_status"]
    return {"state": entry["state"], **entry["status"]}


def _score(server: ServerProcess) -> float:
    status, body = http(server.url("/v1/models/ctr:predict"), {"instances": ROW.tolist()})
    assert status == 200, body
    return float(body["predictions"][0][0])


def _expected(weights: list[np.ndarray]) -> float:
    return pytest.approx(float(reference_predict(weights, ROW)[0, 0]), abs=1e-6)


def _metrics(server: ServerProcess) -> str:
    return str(http(server.url("/metrics"))[1])


def _rejected(reason: str) -> str:
    return f'ctr_serving_versions_rejected_total{{model_name="ctr",reason="{reason}"}}'


def test_symlink_loop_fails_its_version_alone_and_newer_versions_load(
    start_server, writable_base: Path, weights
) -> None:
    server = start_server(writable_base, POLL)
    staged = writable_base / ".tmp-5"
    shutil.copytree(writable_base / "1", staged)
    (staged / "loop").symlink_to("loop")  # stat() of it: ELOOP
    staged.rename(writable_base / "5")
    (writable_base / "notes.txt").write_text("a file")
    (writable_base / "8").symlink_to("8")  # the version entry itself loops: ELOOP
    (writable_base / "9").symlink_to("notes.txt/9")  # ENOTDIR
    _wait_for(lambda: _states(server).get("5") == "END")
    write_version(writable_base, 6, weights[2])
    _wait_for(lambda: _states(server).get("6") == "AVAILABLE")
    wait_polls(server, 3)  # more polls pass over versions 5, 8 and 9
    assert _status(server, 5) == {
        "state": "END",
        "error_code": "FAILED_PRECONDITION",
        "error_message": "version 5 rejected (os_error): [Errno 40] Too many levels of symbolic links: "
        f"'{writable_base}/5/loop'",
    }
    for version, error in (
        (8, "[Errno 40] Too many levels of symbolic links"),
        (9, "[Errno 20] Not a directory"),
    ):
        assert _status(server, version) == {
            "state": "END",
            "error_code": "FAILED_PRECONDITION",
            "error_message": f"version {version} rejected (os_error): cannot read the folder: {error}: "
            f"'{writable_base}/{version}'",
        }
    assert _score(server) == _expected(weights[2])
    log = server.log()
    assert log.count("Too many levels of symbolic links") == 2, log
    assert log.count("Not a directory") == 1, log
    assert "Traceback" not in log
    assert f"{_rejected('os_error')} 3" in _metrics(server)


def test_base_path_that_is_a_file_logs_one_clear_line(start_server, tmp_path: Path) -> None:
    base = tmp_path / "models.tar"
    base.write_bytes(b"not a folder")
    server = start_server(base, POLL, wait=False)
    _wait_for(lambda: http(server.url("/healthz"))[0] == 200)
    wait_polls(server, 3)
    assert http(server.url("/v1/models/ctr")) == (503, {"model_version_status": []})
    log = server.log()
    lines = [line for line in log.splitlines() if "is a file" in line]
    assert len(lines) == 1, log
    assert lines[0].endswith(
        f"{base} is a file, not a folder; --model_base_path must be the folder that holds the version folders "
        "1/, 2/, ...; keeping loaded versions []"
    )
    assert "Traceback" not in log


def test_huge_and_noncanonical_version_folders_are_ignored(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    v2 = write_version(tmp_path / "staging", 2, weights[2])
    shutil.copytree(v2, writable_base / "99999999999999999999")  # a valid model, beyond int64
    shutil.copytree(v2, writable_base / "01")  # would be version 1 a second time
    server = start_server(writable_base, POLL)
    wait_polls(server, 2)
    assert http(server.url("/v1/models/ctr"))[0] == 200
    assert _states(server) == {"1": "AVAILABLE"}
    assert _score(server) == _expected(weights[1])
    with grpc.insecure_channel(server.grpc_target) as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "ctr"
        request.inputs["features"].CopyFrom(tf.make_tensor_proto(ROW))
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=10)
        assert response.model_spec.version.value == 1
        status_request = get_model_status_pb2.GetModelStatusRequest()
        status_request.model_spec.name = "ctr"
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(status_request, timeout=10)
        assert [s.version for s in status.model_version_status] == [1]
    log = server.log()
    for name in ("99999999999999999999", "01"):
        assert log.count(f"ignoring folder {writable_base}/{name}:") == 1, log


def test_failed_version_is_retried_after_an_in_place_fix_that_keeps_mtimes(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    server = start_server(writable_base, POLL)
    good = write_version(tmp_path / "staging", 2, weights[2])
    staged = writable_base / ".tmp-2"
    shutil.copytree(good, staged)
    (staged / "model.onnx").write_bytes(b"x" * (good / "model.onnx").stat().st_size)  # same size, no model
    write_manifest(staged, 2)  # published as it is: the load itself fails
    staged.rename(writable_base / "2")
    _wait_for(lambda: _states(server).get("2") == "END")
    assert _status(server, 2)["error_code"] == "UNKNOWN"
    # The fix `cp -p` or `rsync -a` makes: new bytes, same sizes, the old mtimes put back.
    v2 = writable_base / "2"
    fixed = ["model.onnx", "assets.extra/manifest.json"]
    times = {p: p.stat() for p in [v2, v2 / "assets.extra", *(v2 / f for f in fixed)]}
    for f in fixed:
        shutil.copyfile(good / f, v2 / f)
    for p, st in times.items():
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    _wait_for(lambda: _states(server).get("2") == "AVAILABLE")
    assert _score(server) == _expected(weights[2])


def test_manifest_hash_mismatch_is_rejected_and_old_version_keeps_serving(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    server = start_server(writable_base, POLL)
    staged = write_version(tmp_path / "staging", 2, weights[2])
    model = staged / "model.onnx"
    data = bytearray(model.read_bytes())
    expected = hashlib.sha256(data).hexdigest()
    data[len(data) // 2] ^= 0x01  # one flipped bit in the weights
    model.write_bytes(data)
    staged.rename(writable_base / "2")
    _wait_for(lambda: _states(server).get("2") == "END")
    message = (
        f"version 2 rejected (hash_mismatch): model.onnx has sha256 {hashlib.sha256(data).hexdigest()}, "
        f"assets.extra/manifest.json lists {expected}"
    )
    assert _status(server, 2) == {"state": "END", "error_code": "DATA_LOSS", "error_message": message}
    assert _score(server) == _expected(weights[1])
    assert f"{_rejected('hash_mismatch')} 1" in _metrics(server)
    assert server.log().count(message) == 1


def test_half_copied_version_waits_for_its_manifest_without_failing(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    server = start_server(writable_base, POLL)
    source = write_version(tmp_path / "staging", 2, weights[2])
    target = writable_base / "2"
    (target / "assets.extra").mkdir(parents=True)  # copied file by file, as `kubectl cp` or a sync job does
    shutil.copyfile(source / "model.onnx", target / "model.onnx")
    _wait_for(lambda: _states(server).get("2") == "START")
    wait_polls(server, 2)  # two more polls see a complete model.onnx and nothing else
    assert _status(server, 2) == {
        "state": "START",
        "error_code": "OK",
        "error_message": "not ready yet: no assets.extra/manifest.json yet",
    }
    assert _score(server) == _expected(weights[1])
    for name in ("feature_spec.json", "tf_serving_warmup_requests", "manifest.json"):
        shutil.copyfile(source / "assets.extra" / name, target / "assets.extra" / name)
    _wait_for(lambda: _states(server).get("2") == "AVAILABLE")
    assert _score(server) == _expected(weights[2])
    text = _metrics(server)
    # Both exist at 0 from start-up (alerts need the 0 before a 1); a wait is neither a rejection nor a failure.
    counted = [
        line
        for line in text.splitlines()
        if line.startswith(("ctr_serving_versions_rejected_total{", "ctr_serving_model_load_failures_total{"))
    ]
    assert len(counted) == 7 and all(line.endswith(" 0") for line in counted), counted
    assert "ctr version 2 available (2 warm-up requests" in server.log()


def test_version_without_manifest_is_rejected_after_the_wait_timeout(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    server = start_server(writable_base, POLL, "--manifest_wait_timeout_seconds=1")
    source = write_version(tmp_path / "staging", 3, weights[3])
    (writable_base / "3").mkdir()
    shutil.copyfile(source / "model.onnx", writable_base / "3" / "model.onnx")
    _wait_for(lambda: _states(server).get("3") == "END")
    assert _status(server, 3) == {
        "state": "END",
        "error_code": "DEADLINE_EXCEEDED",
        "error_message": "version 3 rejected (not_ready): still incomplete after 1s "
        "(--manifest_wait_timeout_seconds): no assets.extra/manifest.json yet",
    }
    assert f"{_rejected('not_ready')} 1" in _metrics(server)
    assert _score(server) == _expected(weights[1])


def test_hung_load_times_out_alone_and_polling_goes_on(
    start_server, writable_base: Path, tmp_path: Path, weights
) -> None:
    server = start_server(writable_base, POLL, "--model_load_timeout_seconds=3")
    staged = write_version(tmp_path / "staging", 2, weights[2])
    fifo = staged / "model.onnx"
    fifo.unlink()
    os.mkfifo(fifo)  # reading it blocks until a writer comes: a load stuck on a hung mount
    staged.rename(writable_base / "2")
    fifo = writable_base / "2" / "model.onnx"
    try:
        _wait_for(lambda: _states(server).get("2") == "END")
        assert _status(server, 2) == {
            "state": "END",
            "error_code": "DEADLINE_EXCEEDED",
            "error_message": "version 2 rejected (load_timeout): not loaded within 3s "
            "(--model_load_timeout_seconds); the load was abandoned",
        }
        write_version(writable_base, 3, weights[3])
        _wait_for(lambda: _states(server).get("3") == "AVAILABLE")
        assert _score(server) == _expected(weights[3])
        assert f"{_rejected('load_timeout')} 1" in _metrics(server)
    finally:
        with contextlib.suppress(OSError):  # end the abandoned read: a writer opens the FIFO and leaves (EOF)
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_state_history_of_deleted_failed_versions_is_bounded(tmp_path: Path) -> None:
    base = tmp_path / "ctr"
    for v in range(1, 42):
        (base / str(v)).mkdir(parents=True)
        (base / str(v) / "model.onnx").write_bytes(b"not a model %d" % v)
        write_manifest(base / str(v), v)
    with ThreadPoolExecutor(1) as disk:
        metrics = ServingMetrics()
        router = Router("ctr", {}, metrics)
        manager = ModelManager("ctr", base, "onnx", 1, VersionPolicy("all"), metrics, disk, router)
        asyncio.run(manager.poll_once())
        assert [(s.version, s.state) for s in manager.status("ctr")] == [(v, "END") for v in range(41, 0, -1)]
        for v in range(1, 41):
            shutil.rmtree(base / str(v))
        asyncio.run(manager.poll_once())
    assert [s.version for s in manager.status("ctr")] == list(
        range(41, 24, -1)
    )  # on disk + the newest 16 gone


def test_warmup_reader_checks_an_8_mib_record_in_milliseconds(tmp_path: Path) -> None:
    path = tmp_path / "records"
    payload = np.random.default_rng(0).bytes(8 << 20)
    with tf.io.TFRecordWriter(str(path)) as writer:  # TF's own framing and CRC32C
        writer.write(payload)
    started = time.perf_counter()
    records = list(read_tfrecords(path))
    elapsed = time.perf_counter() - started
    assert records == [payload]
    assert elapsed < 0.2, f"{elapsed:.3f}s for 8 MiB"  # the pure-Python CRC took 0.8-4 s
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(data)
    with pytest.raises(ModelLoadError, match="corrupt data checksum in record at byte 0"):
        list(read_tfrecords(path))


def test_failed_version_is_retried_when_only_its_bytes_changed(monkeypatch) -> None:
    # A filesystem that keeps no honest ctime (some FUSE and network mounts): the stat stamp stays equal, and
    # only the content digest, taken every CONTENT_RECHECK_S, shows the fix.
    metrics = ServingMetrics()
    states = VersionStates("ctr", metrics, manifest_wait_s=600)
    state = states.setdefault(2, VersionState(2))
    files_stamp = (("model.onnx", 10, 1, 1, 1),)
    states.fail(state, "load_error", "UNKNOWN", "not a model", files_stamp, digest="a" * 64)
    assert states.due_for_content_check() == frozenset()  # hashed at the failure, a moment ago
    monkeypatch.setattr("serving.repository.states.CONTENT_RECHECK_S", 0.0)
    assert states.due_for_content_check() == frozenset({2})
    assert states.still_failed(2, files_stamp) is True  # not hashed this scan
    assert states.still_failed(2, files_stamp, "a" * 64) is True  # same bytes
    assert states.still_failed(2, files_stamp, "b" * 64) is False  # same stat fields, new bytes: retry
    assert (state.failed_stamp, state.failed_digest) == (None, None)
    assert metrics.versions_rejected.values == {("ctr", "load_error"): 1.0}
