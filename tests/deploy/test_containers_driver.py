"""Static checks of `make test-containers` (tests/deploy/containers/): its override file merges with
compose.yaml, the Kubernetes commands it runs are the rendered ones, and a failed build is reported in one line.
The real run, on an engine, is `make test-containers` itself."""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

import pytest
import yaml
from test_compose import _compose_cli

from tests.helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "tests" / "deploy" / "containers"))
import compose_run
import engine

ARGS = {"PYTHON_IMAGE": "localhost/py:3.11", "TORCH_INDEX_URL": "http://127.0.0.1:9/"}


def test_the_driver_is_not_collected_by_pytest():
    names = [p.name for p in (REPO_ROOT / "tests" / "deploy" / "containers").glob("*.py")]
    assert "run.py" in names
    assert not [n for n in names if n.startswith("test_") or n.endswith("_test.py")]


def test_make_test_containers_runs_the_driver_after_make_test():
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = re.search(r"^test-containers:.*## .+\n\t(.+)$", makefile, re.M)
    assert recipe and recipe.group(1) == "$(PY) tests/deploy/containers/run.py"
    assert re.search(r"^\.PHONY:.* test-containers( |$)", makefile, re.M)
    # .ci/run runs each tier through `tier NAME make TARGET...`: the README's `make test` first, every tier after.
    ci = [
        line.split()[2:]
        for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()
        if line.startswith("tier ")
    ]
    targets = [words[1] for words in ci if words[:1] == ["make"]]
    assert targets[:2] == ["install", "test"], targets
    assert {"bench-guard", "test-slow", "soak", "test-containers", "fuzz"} <= set(targets), targets


def test_override_merges_with_compose_yaml(tmp_path: Path):
    cli = _compose_cli()
    if cli is None:
        pytest.skip("needs `docker compose` or `docker-compose`")
    override = tmp_path / "override.yaml"
    override.write_text(json.dumps(compose_run.override(ARGS)))
    proc = compose_run.subprocess.run(
        [*cli, "-f", "compose.yaml", "-f", str(override), *compose_run.PROFILES, "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **compose_run.os.environ,
            "CTR_REST_PORT": "127.0.0.1:18501",
            "CTR_GRPC_PORT": "127.0.0.1:18500",
            "CTR_S3_REST_PORT": "127.0.0.1:18521",
            "CTR_S3_GRPC_PORT": "127.0.0.1:18520",
            "CTR_S3_PORT": "127.0.0.1:18333",
        },
    )
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in ("model", "serving", "objectstore"):
        assert services[name]["build"]["network"] == "host"
        assert ARGS.items() <= services[name]["build"]["args"].items()
    ports = {_port(p) for p in services["serving"]["ports"]}
    assert ports == {("127.0.0.1", "18500", 8500), ("127.0.0.1", "18501", 8501)}  # only the free ones
    assert "--request_log_sample_rate=1" in services["serving"]["command"]
    assert services["model"]["environment"]["ROWS"] == str(compose_run.ROWS)
    # The objectstore profile: the same tiny model, into the bucket; free ports on the loopback only.
    tiny = {k: services["model"]["environment"][k] for k in ("ROWS", "TRAIN_ARGS")}
    assert tiny.items() <= services["model-s3"]["environment"].items()
    assert {_port(p) for p in services["serving-s3"]["ports"]} == {
        ("127.0.0.1", "18520", 8500),
        ("127.0.0.1", "18521", 8501),
    }
    assert {_port(p) for p in services["objectstore"]["ports"]} == {("127.0.0.1", "18333", 8333)}
    train = services["k8s-train"]
    assert train["entrypoint"] == ["torchrun"]
    assert "--nnodes=1" in train["command"] and train["command"][-3:-1] == ["--num_nodes=1", "--devices=1"]
    assert services["k8s-export"]["entrypoint"] == ["python", "-m", "export"]
    assert "$f" in services["k8s-data"]["command"][0]  # the data Job's shell variables survive interpolation


def _port(entry: str | dict) -> tuple[str, str, int]:
    """(host address, host port, container port) of a rendered port, long or short syntax."""
    if isinstance(entry, dict):
        return str(entry.get("host_ip")), str(entry["published"]), int(entry["target"])
    address, published, target = entry.split("/")[0].rsplit(":", 2)
    return address, published, int(target)


def test_host_ulimits_stay_at_or_below_the_hosts():
    limits = engine.host_ulimits()
    hard_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard_nofile == resource.RLIM_INFINITY or limits["nofile"][1] <= hard_nofile
    assert limits["nproc"][1] <= int(Path("/proc/sys/kernel/pid_max").read_text())


def test_a_failed_build_is_one_line_naming_the_argument():
    log = "\n".join(["STEP 7/20: RUN pip install ..."] * 200)
    log += (
        '\nError: building at STEP "RUN pip ... echo "ctr-build: torch==${TORCH_VERSION} ...": exit status 1'
    )

    marked = (
        log
        + "\nctr-build: torch==2.13.0 could not be installed from http://x/: set the build argument TORCH_INDEX_URL\n"
    )
    assert compose_run.build_failure(marked) == (
        "torch==2.13.0 could not be installed from http://x/: set the build argument TORCH_INDEX_URL"
    )
    pull = (
        log + "\nError: initializing source docker://python:3.11: pinging container registry: no such host\n"
    )
    assert "set the build argument PYTHON_IMAGE" in compose_run.build_failure(pull)


def test_engine_start_failures_say_what_is_missing():
    rlimit = "crun: setrlimit `RLIMIT_NPROC`: Operation not permitted: OCI permission denied"
    assert "rlimits" in engine.explain_start_failure(rlimit, None)
    assert "user namespaces" in engine.explain_start_failure("cannot set up user namespace: newuidmap", None)
