"""`--model_base_path=s3://...` when the store fails, when the server restarts, and with several workers: each
test runs its own SeaweedFS (tests/object_store.py), which it stops and starts again (`make test-slow`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from tests.object_store import SeaweedS3
from tests.serving.bucket_repo import expected, metric, predict, publish
from tests.serving.server_process import ServerProcess, http, wait_polls, wait_until

pytestmark = pytest.mark.slow
REQUESTS = "ctr_serving_repository_store_requests_total"
ERRORS = "ctr_serving_repository_errors_total"
Start = Callable[..., ServerProcess]


@pytest.fixture
def store_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SeaweedS3]:
    """A SeaweedFS of this test's own, its variables in the environment the servers inherit."""
    s3 = SeaweedS3(tmp_path / "s3")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    with s3:
        yield s3


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start servers of `base` with the test's cache folder; every one is stopped at teardown."""
    started: list[ServerProcess] = []

    def start_one(base: BucketPath, *flags: str, wait: bool = True) -> ServerProcess:
        server = ServerProcess(
            None,
            tmp_path / f"server{len(started)}.log",
            "--model_name=ctr",
            f"--model_base_path={base}",
            f"--model_cache_dir={tmp_path / 'cache'}",
            "--file_system_poll_wait_seconds=0.2",
            *flags,
        )
        started.append(server)
        if wait:
            server.wait_ready()
        return server

    yield start_one
    for server in started:
        server.stop()


def test_a_store_outage_keeps_serving_and_the_next_version_loads_after(
    store_up: SeaweedS3, start: Start, tmp_path: Path
) -> None:
    store = ObjectStore()
    base = BucketPath(store_up.make_bucket("outage"), "ctr")
    publish(store, base, 1, tmp_path / "local")
    server = start(base)
    store_up.stop()
    wait_until(lambda: metric(server, ERRORS, reason="unreachable") >= 3, "three failed polls", timeout_s=60)
    for _ in range(5):  # serving and readiness go on
        assert predict(server) == pytest.approx(expected(1), abs=1e-6)
        assert http(server.url("/v1/models/ctr"))[0] == 200
    assert server.log().count("cannot poll s3://outage (") == 1
    store_up.start()
    publish(ObjectStore(), base, 2, tmp_path / "local")
    server.wait_versions({2}, timeout_s=60)
    assert predict(server) == pytest.approx(expected(2), abs=1e-6)
    log = server.log()
    assert log.count("cannot poll s3://") == 1
    assert log.count("ctr: s3://outage answers again") == 1


def test_a_restart_serves_from_the_cache_without_downloading_it_again(
    store_up: SeaweedS3, start: Start, tmp_path: Path
) -> None:
    store = ObjectStore()
    base = BucketPath(store_up.make_bucket("restart"), "ctr")
    publish(store, base, 1, tmp_path / "local")
    start(base).stop()
    cached = tmp_path / "cache" / "ctr" / "1"
    inode = cached.stat().st_ino
    # Restarted with the store up: one GET, the manifest compared with the cached one; no model file.
    server = start(base)
    wait_polls(server, 2)
    assert metric(server, REQUESTS, kind="GET") == 1
    assert cached.stat().st_ino == inode
    assert predict(server) == pytest.approx(expected(1), abs=1e-6)
    assert "downloading version" not in server.log()
    server.stop()
    # Restarted with the store down: served from the cache, retrying.
    store_up.stop()
    server = start(base, wait=False)
    server.wait_ready(timeout_s=120)
    assert predict(server) == pytest.approx(expected(1), abs=1e-6)
    wait_until(lambda: metric(server, ERRORS, reason="unreachable") >= 2, "failed polls", timeout_s=60)
    assert server.log().count("cannot poll s3://restart (") == 1


def test_two_workers_download_a_version_once(store_up: SeaweedS3, start: Start, tmp_path: Path) -> None:
    store = ObjectStore()
    base = BucketPath(store_up.make_bucket("workers"), "ctr")
    publish(store, base, 1, tmp_path / "local")
    server = start(base, "--num_workers=2")
    server.wait_versions({1})
    # Each worker reads the manifest (1 GET each); the one that takes the cache's lock first downloads the
    # version's one listed file, model.onnx (1 GET); the other finds it renamed into place.
    wait_until(lambda: metric(server, REQUESTS, kind="GET") >= 3, "both workers' polls counted", timeout_s=60)
    wait_polls(server, 4)
    assert metric(server, REQUESTS, kind="GET") == 3
    assert server.log().count("ctr: downloading version 1") == 1
