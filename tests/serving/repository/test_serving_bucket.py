"""`--model_base_path=s3://...` against a real SeaweedFS: one server for the module, versions published to its
bucket one after the other (docs/serving-versions.md, "Object storage"). The tests run in file order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ctr_contract.repository import MANIFEST_PATH
from ctr_store.objects import ObjectStore
from ctr_store.url import BucketPath
from ctr_store.versions import upload_version
from tests.object_store import SECRET
from tests.serving.bucket_repo import (
    ROWS,
    corrupt_manifest,
    expected,
    metric,
    metric_in,
    predict,
    publish,
    scrape,
    version_states,
    write_local_version,
)
from tests.serving.conftest import StartServer
from tests.serving.server_process import ServerProcess, http, wait_polls, wait_until

REQUESTS = "ctr_serving_repository_store_requests_total"
ERRORS = "ctr_serving_repository_errors_total"
POLLS = "ctr_serving_repository_polls_total"
STORE_VARIABLES = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT")


@dataclass
class Served:
    server: ServerProcess
    store: ObjectStore
    base: BucketPath
    root: Path  # local/: the versions as published; cache/: the server's --model_cache_dir


@pytest.fixture(scope="module")
def served(s3_store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("bucket")
    with pytest.MonkeyPatch.context() as env:
        for name in STORE_VARIABLES:
            env.delenv(name, raising=False)
        for name, value in s3_store.env().items():
            env.setenv(name, value)
        store = ObjectStore()
        base = BucketPath(s3_store.make_bucket("serving-from-a-bucket"), "prod/ctr")
        publish(store, base, 1, root / "local")
        server = ServerProcess(
            None,
            root / "server.log",
            "--model_name=ctr",
            f"--model_base_path={base}",
            f"--model_cache_dir={root / 'cache'}",
            "--file_system_poll_wait_seconds=0.2",
        )
        try:
            server.wait_ready()
            yield Served(server, store, base, root)
        finally:
            server.stop()


def test_a_bucket_version_answers_as_the_same_version_on_disk(
    served: Served, start_server: StartServer
) -> None:
    on_disk = start_server(served.root / "local")
    assert predict(served.server) == predict(on_disk)
    assert predict(served.server) == pytest.approx(expected(1), abs=1e-6)
    cached = served.root / "cache" / "ctr" / "1"
    assert (cached / "model.onnx").read_bytes() == (served.root / "local" / "1" / "model.onnx").read_bytes()
    assert sorted(p.name for p in (served.root / "cache" / "ctr").iterdir()) == [".lock", "1"]


def test_a_poll_with_nothing_new_costs_one_list(served: Served) -> None:
    # Each figure pair comes from one scrape: a poll ending between two scrapes would count its LIST in one
    # and not the other (the server counts both in the same step of its event loop).
    server = served.server
    before = scrape(server)
    wait_polls(server, 5)
    after = scrape(server)
    polls = metric_in(after, POLLS) - metric_in(before, POLLS)
    assert polls >= 5
    assert metric_in(after, REQUESTS, kind="LIST") - metric_in(before, REQUESTS, kind="LIST") == polls
    assert metric_in(after, REQUESTS, kind="GET") == metric_in(before, REQUESTS, kind="GET")


def test_a_half_uploaded_version_waits_and_is_never_served(served: Served) -> None:
    server = served.server
    folder = publish(served.store, served.base, 2, served.root / "local", manifest=False)
    wait_until(lambda: 2 in version_states(server), "version 2 in the status", timeout_s=30)
    wait_polls(server, 3)
    state = version_states(server)[2]
    assert state["state"] == "START"
    message = str(state["status"]["error_message"])  # type: ignore[index]
    assert message.startswith("not ready yet: no s3://serving-from-a-bucket/prod/ctr/2/assets.extra/manifest")
    assert predict(server) == pytest.approx(expected(1), abs=1e-6)
    assert not (served.root / "cache" / "ctr" / "2").exists()
    assert server.log().count("ctr version 2 is not ready yet") == 1
    # The manifest written last completes it: the next poll downloads and serves it.
    served.store.upload(served.base.bucket, served.base.key("2", MANIFEST_PATH), folder / MANIFEST_PATH)
    server.wait_versions({2}, timeout_s=30)
    wait_until(lambda: 1 not in server_versions(server), "version 1 unloaded")
    assert predict(server) == pytest.approx(expected(2), abs=1e-6)
    wait_polls(server, 2)  # the poll after version 1's unload removes it from the cache
    assert sorted(p.name for p in (served.root / "cache" / "ctr").iterdir()) == [".lock", "2"]


def test_a_version_with_a_bad_sha256_is_never_served(served: Served) -> None:
    server = served.server
    folder = write_local_version(served.root / "bad", 3)
    corrupt_manifest(folder)
    upload_version(served.store, served.base, 3, folder)
    wait_until(lambda: version_states(server).get(3, {}).get("state") == "END", "version 3 rejected")
    status = version_states(server)[3]["status"]
    assert status["error_code"] == "DATA_LOSS"  # type: ignore[index]
    assert "has sha256" in status["error_message"]  # type: ignore[index]
    assert metric(server, ERRORS, reason="hash_mismatch") == 1
    assert metric(server, "ctr_serving_versions_rejected_total", reason="hash_mismatch") == 1
    gets = metric(server, REQUESTS, kind="GET")
    wait_polls(server, 5)
    assert metric(server, REQUESTS, kind="GET") == gets  # not downloaded again at every poll
    assert predict(server) == pytest.approx(expected(2), abs=1e-6)
    assert sorted(p.name for p in (served.root / "cache" / "ctr").iterdir()) == [".lock", "2"]
    assert server.log().count("ctr version 3 rejected (hash_mismatch)") == 1


@pytest.mark.parametrize("reason", ["denied", "no_credentials"])
def test_refused_credentials_stop_the_start_with_one_line_and_exit_2(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_store, reason: str
) -> None:  # type: ignore[no-untyped-def]
    secret = "wrong-secret-do-not-log-4711"
    for name, value in s3_store.env(AWS_SECRET_ACCESS_KEY=secret).items():
        monkeypatch.setenv(name, value)
    if reason == "no_credentials":  # nothing anywhere in boto3's chain
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        for name in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
            monkeypatch.setenv(name, str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = ServerProcess(
        None,
        tmp_path / "server.log",
        "--model_name=ctr",
        f"--model_base_path={served.base}",
        f"--model_cache_dir={tmp_path / 'cache'}",
    )
    assert server.proc.wait(60) == 2
    lines = server.log().strip().splitlines()
    assert len(lines) == 1, lines
    assert f"cannot start: the object store refuses the credentials ({reason})" in lines[0]
    assert "s3://serving-from-a-bucket/prod/ctr" in lines[0]
    assert secret not in server.log()
    assert not (tmp_path / "cache").exists()


def server_versions(server: ServerProcess) -> set[int]:
    return {v for v, e in version_states(server).items() if e["state"] == "AVAILABLE"}


def test_no_secret_in_the_metrics_or_the_log(served: Served) -> None:
    _, page = http(served.server.url("/metrics"))
    assert SECRET not in str(page) and SECRET not in served.server.log()
    assert f'{REQUESTS}{{model_name="ctr",kind="LIST"}}' in str(page)


def test_a_model_config_file_serves_a_bucket_base_path_with_labels(served: Served, tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text(
        f'model_config_list {{ config {{ name: "ctr" base_path: "{served.base}" model_platform: "tensorflow" '
        'version_labels { key: "stable" value: 2 } } }\n'
    )
    server = ServerProcess(
        None, tmp_path / "server.log", f"--model_config_file={config}", f"--model_cache_dir={tmp_path / 'c'}"
    )
    try:
        server.wait_ready()
        status, body = http(server.url("/v1/models/ctr/labels/stable:predict"), {"instances": ROWS.tolist()})
        assert status == 200, body
        assert [row[0] for row in body["predictions"]] == pytest.approx(expected(2), abs=1e-6)
        assert sorted(p.name for p in (tmp_path / "c" / "ctr").iterdir()) == [".lock", "2"]
    finally:
        server.stop()
