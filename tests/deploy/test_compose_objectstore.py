"""compose.yaml's objectstore profile: the store, the bootstrap into the bucket, the server on it, and no volume
for models between them. The bootstrap's bucket branch runs against a real SeaweedFS (tests/object_store.py);
the profile itself runs on an engine in `make test-containers` (tests/deploy/containers/objectstore.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfiles import final_stage, healthcheck
from module_flags import accepted_flags, flag_value, flags, named_mounts
from test_compose import SERVICES, _compose_cli

from tests.helpers import REPO_ROOT

STORE, EXPORTER, SERVER = SERVICES["objectstore"], SERVICES["model-s3"], SERVICES["serving-s3"]


def _rendered(env: dict[str, str]) -> dict[str, Any]:
    """The services as the compose CLI renders them with these variables set."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip("needs `docker compose` or `docker-compose` (Debian: apt-get install docker-compose)")
    proc = subprocess.run(
        [*cli, "-f", "compose.yaml", "--profile", "objectstore", "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["services"]


def test_the_server_reads_the_bucket_the_bootstrap_exports_to():
    base = EXPORTER["environment"]["MODEL_BASE_PATH"]
    assert base == "s3://models/ctr"
    assert flag_value(SERVER["command"], "--model_base_path") == base
    # Serving's own flags follow the bucket's, so the two servers differ only in where the models come from.
    assert SERVER["command"][2:] == SERVICES["serving"]["command"]
    assert set(flags(SERVER["command"])) <= accepted_flags("serving")
    assert base.removeprefix("s3://").split("/")[0] in STORE["environment"]["OBJECTSTORE_BUCKETS"].split()
    # The bootstrap is the `model` service's, on its own training run.
    assert EXPORTER["entrypoint"] == SERVICES["model"]["entrypoint"]
    assert EXPORTER["image"] == SERVICES["model"]["image"] and SERVER["image"] == SERVICES["serving"]["image"]
    model_env = {k: v for k, v in SERVICES["model"]["environment"].items() if k != "MODEL_BASE_PATH"}
    assert model_env.items() <= EXPORTER["environment"].items()
    assert SERVER["depends_on"] == {"model-s3": {"condition": "service_completed_successfully"}}
    assert EXPORTER["depends_on"] == {"objectstore": {"condition": "service_started"}}


def test_no_volume_holds_models_between_the_exporter_and_the_server():
    exporter, server = named_mounts(EXPORTER), named_mounts(SERVER)
    assert {v for v, _ in exporter.values()} == {"s3-artifacts"}
    assert not {v for v, _ in exporter.values()} & {v for v, _ in server.values()}
    assert all(volume != "models" for volume, _ in [*exporter.values(), *server.values()])
    cache = flag_value(SERVER["command"], "--model_cache_dir")
    assert server[cache] == ("s3-model-cache", False)
    # The run of `model` is not the run of `model-s3`: two bootstraps never train into one folder.
    assert named_mounts(SERVICES["model"])["/artifacts"][0] != exporter["/artifacts"][0]
    assert "/var/cache/ctr-models" in _owned_folders(REPO_ROOT / "docker" / "Dockerfile.serving")


def _owned_folders(dockerfile: Path) -> list[str]:
    """The folders the runtime stage creates for uid 10001 (`install -d -o 10001 ...`)."""
    [run] = [i.args for i in final_stage(dockerfile) if i.keyword == "RUN" and "install -d" in i.args]
    return run.split("install -d -o 10001 -g 10001")[1].split()


def test_the_store_and_its_clients_share_one_key_pair_and_the_endpoint():
    services = _rendered({"CTR_S3_ACCESS_KEY": "key-a", "CTR_S3_SECRET_KEY": "secret-b"})
    store = services["objectstore"]["environment"]
    assert (store["OBJECTSTORE_ACCESS_KEY"], store["OBJECTSTORE_SECRET_KEY"]) == ("key-a", "secret-b")
    for name in ("model-s3", "serving-s3"):
        env = services[name]["environment"]
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("key-a", "secret-b"), name
        assert env["AWS_ENDPOINT_URL"] == "http://objectstore:8333" and env["AWS_REGION"] == "us-east-1"
    assert STORE["ports"] == ["${CTR_S3_PORT:-127.0.0.1:8333}:8333"]  # the host's loopback by default


def test_the_store_runs_hardened_with_the_images_healthcheck():
    _, image_check = healthcheck(final_stage(REPO_ROOT / "docker" / "Dockerfile.objectstore"))
    assert STORE["healthcheck"]["test"] == ["CMD", *image_check]
    _, serving_check = healthcheck(final_stage(REPO_ROOT / "docker" / "Dockerfile.serving"))
    assert SERVER["healthcheck"]["test"] == ["CMD", *serving_check]
    for service in (STORE, SERVER):
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"]
        assert service["cap_drop"] == ["ALL"] and service["security_opt"] == ["no-new-privileges:true"]
    assert named_mounts(STORE) == {"/data": ("objectstore", False)}


def _bootstrap_s3(
    tmp_path: Path, env: dict[str, str], base: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The bootstrap on a bucket path: the version lookup runs in real Python; each `-m MODULE` is recorded."""
    tmp_path.mkdir()
    calls = tmp_path / "calls"
    stub = tmp_path / "python"
    stub.write_text(
        f'#!/bin/sh\nif [ "$1" = -c ]; then exec {sys.executable} "$@"; fi\necho "$2" >> {calls}\n'
    )
    stub.chmod(0o755)
    run_env = {
        **env,
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHON": str(stub),
        "MODEL_BASE_PATH": base,
        "WORK_DIR": str(tmp_path / "artifacts"),
        "STORE_WAIT_S": "2",
    }
    proc = subprocess.run(
        ["sh", str(REPO_ROOT / "docker" / "bootstrap-model.sh")], env=run_env, capture_output=True, text=True
    )
    return proc, calls.read_text().split() if calls.exists() else []


def test_bootstrap_into_a_bucket_trains_until_a_complete_version_is_there(s3_store, tmp_path):
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "S3_"))} | s3_store.env()
    bucket = s3_store.make_bucket("bootstrap-s3")
    client = s3_store.client()
    base = f"s3://{bucket}/ctr"

    proc, calls = _bootstrap_s3(tmp_path / "empty", env, base)
    assert proc.returncode == 0 and calls == ["training.synth", "training", "export"], proc.stderr
    # A version without its manifest is an upload still running, or a failed export's: not a version.
    client.put_object(Bucket=bucket, Key="ctr/2/model.onnx", Body=b"half")
    proc, calls = _bootstrap_s3(tmp_path / "half", env, base)
    assert proc.returncode == 0 and calls == ["training.synth", "training", "export"], proc.stderr
    manifest = {"files": {"model.onnx": "0" * 64}}
    client.put_object(
        Bucket=bucket, Key="ctr/1/assets.extra/manifest.json", Body=json.dumps(manifest).encode()
    )
    proc, calls = _bootstrap_s3(tmp_path / "published", env, base)
    assert proc.returncode == 0 and calls == [], proc.stderr
    assert proc.stdout == f"model repository {base} already holds version 1; nothing to do\n"


def test_bootstrap_names_the_bucket_it_waited_for(s3_store, tmp_path):
    env = s3_store.env()
    start = time.monotonic()
    proc, calls = _bootstrap_s3(tmp_path / "none", env, "s3://no-such-bucket-here/ctr")
    assert proc.returncode != 0 and calls == []
    assert time.monotonic() - start >= 2.0, "it gave up before STORE_WAIT_S (2 s): a bucket still being made"
    assert "bootstrap: s3://no-such-bucket-here/ctr:" in proc.stderr and "STORE_WAIT_S" in proc.stderr
    assert env["AWS_SECRET_ACCESS_KEY"] not in proc.stderr + proc.stdout
