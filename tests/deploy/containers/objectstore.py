"""The objectstore profile on the engine: the bucket made at start, export publishing into it, the server on it.

On a project whose objectstore volumes are new: `up serving-s3` starts SeaweedFS (it makes the bucket `models`),
the one-shot `model-s3` trains and exports version 1 into s3://models/ctr, and the server downloads it into its
cache volume and serves it. Checked from outside: the store's healthcheck command, the bucket's listing through
the published S3 port, the model status and a predict's `x-model-version`; no volume is shared between the
exporter and the server; no log holds the secret. Then `down -v`, after which no container or volume of the
project is left.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from checks import README_ROW, _get, available
from compose_run import COMPOSE, PROFILES, Failure, Project, check
from engine import Engine
from sources import say, wait_for

PROFILE = ("--profile", "objectstore")
SERVICES = ("objectstore", "model-s3", "serving-s3")
BUCKET, PREFIX = "models", "ctr"


def _flag(argv: list[str], name: str) -> str:
    [value] = [a.split("=", 1)[1] for a in argv if a.startswith(name + "=")]
    return value


def _bucket_keys(project: Project) -> list[str]:
    """Every key under s3://models/ctr/, listed through the store's published port with the project's keys."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{project.ports['s3']}",
        aws_access_key_id=project.env["CTR_S3_ACCESS_KEY"],
        aws_secret_access_key=project.s3_secret,
        region_name="us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "/")
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _predict(rest: str) -> tuple[int, str, Any]:
    """A predict of the README row: (status, the x-model-version header, the answer)."""
    request = urllib.request.Request(
        f"{rest}/v1/models/ctr:predict",
        data=json.dumps({"instances": [README_ROW]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.headers.get("x-model-version", ""), json.loads(response.read())


def _mounts(engine: Engine, project: Project, service: str) -> dict[str, str]:
    """Container path -> volume name of a service's container."""
    mounts = engine.container(project.container_id(service))["Mounts"]
    return {m["Destination"]: m.get("Name", "") for m in mounts if m.get("Type") == "volume"}


def _save_logs(project: Project) -> str:
    """Each service's log into the logs folder; all of them, joined."""
    joined = []
    for service in SERVICES:
        text = project.run(*PROFILE, "logs", "--no-color", service, check_rc=False, timeout=60).stdout
        (project.logs / f"{service}.log").write_text(text)
        joined.append(text)
    return "\n".join(joined)


def publish_and_serve(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """`up serving-s3` from new volumes: the bucket, the export into it, the server on it; then a clean down."""
    try:
        _publish_and_serve(project, engine, times)
    except Failure:
        _save_logs(project)
        raise
    _clean_down(project, engine, times)


def _publish_and_serve(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    rest = f"http://127.0.0.1:{project.ports['s3_rest']}"
    start = time.monotonic()
    project.run(*PROFILE, "up", "-d", "--no-build", "serving-s3", timeout=1800, log="up-objectstore.log")
    times["objectstore_bootstrap_s"] = time.monotonic() - start
    # Podman runs no healthchecks without systemd: the store's command, run by hand, must pass.
    test = COMPOSE["services"]["objectstore"]["healthcheck"]["test"]
    health = project.run(*PROFILE, "exec", "-T", "objectstore", *test[1:], check_rc=False, timeout=60)
    check(
        health.returncode == 0,
        f"the objectstore healthcheck exited {health.returncode}: {health.stderr[-500:]}",
    )
    [model] = engine.containers(project.name, "model-s3", stopped=True)
    state, model_log = engine.container(model)["State"], engine.logs(model)
    check(state["ExitCode"] == 0, f"model-s3 exited {state['ExitCode']}:\n{model_log[-2000:]}")
    base = COMPOSE["services"]["model-s3"]["environment"]["MODEL_BASE_PATH"]
    check(
        "training on" in model_log and f"into {base}" in model_log,
        f"model-s3 did not train and export into {base}:\n{model_log[-2000:]}",
    )
    keys = _bucket_keys(project)
    versions = sorted({k.split("/")[1] for k in keys if k.split("/")[1].isdigit()})
    manifest = f"{PREFIX}/1/assets.extra/manifest.json"
    check(versions == ["1"] and manifest in keys, f"s3://{BUCKET}/{PREFIX}/ holds {keys}")
    say(
        f"objectstore: bucket {BUCKET} made at start; model-s3 trained and exported version 1 into {base} "
        f"({len(keys)} objects, the manifest among them; {times['objectstore_bootstrap_s']:.0f} s)"
    )
    check(wait_for(lambda: available(rest), 180), "serving-s3 did not report version AVAILABLE within 180 s")
    _, body = _get(f"{rest}/v1/models/ctr")
    check(
        json.loads(body)["model_version_status"][0]["version"] == "1",
        f"serving-s3 model status: {body[:200]!r}",
    )
    code, version, answer = _predict(rest)
    check(
        code == 200 and version == "1", f"serving-s3 predict: {code}, x-model-version {version!r}, {answer}"
    )
    [[score]] = answer["predictions"]
    check(0.0 < score < 1.0, f"serving-s3 predict: {answer}")
    times["objectstore_first_answer_s"] = time.monotonic() - start
    cache = _flag(COMPOSE["services"]["serving-s3"]["command"], "--model_cache_dir")
    found = project.run(
        *PROFILE, "exec", "-T", "serving-s3", "find", cache, "-name", "manifest.json"
    ).stdout.split()
    check(any("/1/" in f for f in found), f"the cache {cache} holds no version 1 manifest: {found}")
    served, exported = _mounts(engine, project, "serving-s3"), _mounts(engine, project, "model-s3")
    shared = set(served.values()) & set(exported.values())
    check(not shared and cache in served, f"volumes: serving-s3 {served}, model-s3 {exported}")
    logs = _save_logs(project)
    check(project.s3_secret not in logs, "a service's log holds the S3 secret key")
    say(
        f"serving-s3: version 1 from the bucket (model status, x-model-version: 1, score {score:.6f}), cached in "
        f"{cache}; no volume shared with model-s3; no log holds the secret (first answer "
        f"{times['objectstore_first_answer_s']:.0f} s after up)"
    )


def _clean_down(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """`down -v` with every profile: no container and no volume of the project is left."""
    start = time.monotonic()
    project.run(
        *PROFILES, "down", "-v", "--remove-orphans", "-t", "5", timeout=300, log="down-objectstore.log"
    )
    times["objectstore_down_s"] = time.monotonic() - start
    label = json.dumps({"label": [f"com.docker.compose.project={project.name}"]})
    containers = engine.call("GET", "/containers/json", params={"all": "1", "filters": label}) or []
    volumes = (engine.call("GET", "/volumes", params={"filters": label}) or {}).get("Volumes") or []
    check(
        not containers and not volumes,
        f"after `down -v`: containers {[c['Names'] for c in containers]}, volumes {[v['Name'] for v in volumes]}",
    )
    say(
        f"objectstore down -v: no container or volume of {project.name} left ({times['objectstore_down_s']:.0f} s)"
    )
