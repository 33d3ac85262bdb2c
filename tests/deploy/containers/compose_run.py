"""The compose project of `make test-containers`: the project's compose.yaml plus an override file for the test.

The override gives the builds the base image, torch's index, pip's index and the host network; the `model` and
`model-s3` services a small data set and one epoch; the server a request-log sample rate of 1; the online
trainer no calibrator and a loose quality gate (online.py sets its short intervals through compose.yaml's variables); and three extra
services (profile `k8s`) running the rendered Kubernetes data Job, PyTorchJob and export Job commands in the
trainer image on volumes of their own. Host ports are free ones on 127.0.0.1 (compose.yaml's CTR_REST_PORT,
CTR_GRPC_PORT, CTR_S3_PORT, ...); the objectstore profile's key pair is new for each project. `down -v` removes
the containers, networks and every volume.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "deploy")]
from k8s_render import container, find, kustomize_build  # noqa: E402

COMPOSE = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
ROWS = 20000  # the bootstrap's synthetic rows (compose's default is 200000)
K8S_ROWS = 20000  # ~1,900 validation rows: enough for the calibrator's fit (at least 1,000)
# Appended to the export Job's flags: a tiny one-epoch model's calibration ratio on 20,000 rows is noisy.
LOOSE_CALIBRATION_GATE = ["--max-calibration-gap=0.1"]
TINY = ["--max-epochs=1"]
# Appended to the online trainer's flags: a 20-second interval holds a few hundred held-out rows, too few to fit
# a calibrator (1,000) and as noisy a score for the gate as the tiny model's calibration; the run checks that
# the loop publishes, not the candidates' quality.
TINY_INTERVALS = ["--calibration=none", "--max-auc-drop=1", "--max-ece-rise=1", "--max-calibration-gap=0.9"]
# The profiles whose services a run starts: `down` names them all, so it removes their containers and volumes.
PROFILES = ("--profile", "k8s", "--profile", "objectstore", "--profile", "online")


class Failure(AssertionError):
    """A check of the run failed; the message says which and why."""


def check(condition: object, message: str) -> None:
    if not condition:
        raise Failure(message)


def compose_cli() -> list[str]:
    """`docker compose` (v2) when the docker CLI has it, else Debian's `docker-compose` (v1)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise SystemExit("test-containers: needs docker-compose (Debian: apt-get install docker-compose)")


def _escape(value: Any) -> Any:
    """Compose interpolates $VAR in every string: the manifests' shell `$` are written as `$$`."""
    if isinstance(value, str):
        return value.replace("$", "$$")
    if isinstance(value, list):
        return [_escape(v) for v in value]
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    return value


def k8s_services() -> dict[str, Any]:
    """The dev overlay's data Job, PyTorchJob (Master, one node, --devices 1) and export Job as services."""
    objects = kustomize_build("k8s/overlays/dev")
    synth = container(find(objects, "Job", "ctr-data")["spec"]["template"]["spec"], "synth")
    master = find(objects, "PyTorchJob", "ctr-train")["spec"]["pytorchReplicaSpecs"]["Master"]
    pytorch = container(master["template"]["spec"], "pytorch")
    export = container(find(objects, "Job", "ctr-export")["spec"]["template"]["spec"], "export")
    operator_env = {"WORLD_SIZE": "1", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    train_args = [re.sub(r"\$\((\w+)\)", lambda m: operator_env[m.group(1)], a) for a in pytorch["args"]]
    # One pod of one process: world size 1 (argparse and torchrun take the last value).
    train_args += ["--num_nodes=1", "--devices=1", *TINY]
    image = COMPOSE["services"]["model"]["image"]
    common = {"image": image, "profiles": ["k8s"], "restart": "no", "user": "10001:10001"}
    return _escape(
        {
            "k8s-data": {
                **common,
                "entrypoint": synth["command"],
                "command": synth["args"],
                "environment": {"ROWS": str(K8S_ROWS), "EVAL_ROWS": str(K8S_ROWS)},
                "volumes": ["k8s-data:/data"],
            },
            "k8s-train": {
                **common,
                "entrypoint": pytorch["command"],
                "command": train_args,
                "environment": {e["name"]: e["value"] for e in pytorch.get("env", [])},
                "volumes": ["k8s-data:/data:ro", "k8s-runs:/runs"],
                "shm_size": "1gb",
            },
            "k8s-export": {
                **common,
                "entrypoint": export["command"],
                "command": [*export["args"], *LOOSE_CALIBRATION_GATE],
                "volumes": ["k8s-runs:/runs:ro", "k8s-models:/models", "k8s-data:/data:ro"],
            },
        }
    )


def override(build_args: dict[str, str]) -> dict[str, Any]:
    """The test's override file (JSON, which is YAML)."""
    model_env = COMPOSE["services"]["model"]["environment"]
    serving_command = [
        "--request_log_sample_rate=1" if a.startswith("--request_log_sample_rate=") else a
        for a in COMPOSE["services"]["serving"]["command"]
    ]
    build = {"network": "host", "args": build_args}
    tiny_model = {"ROWS": str(ROWS), "TRAIN_ARGS": " ".join([model_env["TRAIN_ARGS"], *TINY])}
    return {
        "services": {
            "model": {"build": build, "environment": tiny_model},
            "serving": {"build": build, "command": serving_command},
            "objectstore": {"build": build},
            "model-s3": {"environment": tiny_model},
            "online": {"command": [*COMPOSE["services"]["online"]["command"], *TINY_INTERVALS]},
            **k8s_services(),
        },
        "volumes": {"k8s-data": {}, "k8s-runs": {}, "k8s-models": {}},
    }


class Project:
    """One compose project (a fresh name, so fresh volumes) on the engine at DOCKER_HOST."""

    def __init__(
        self, docker_host: str, state: Path, logs: Path, build_args: dict[str, str], ports: dict[str, int]
    ):
        self.name = "ctrtest" + uuid.uuid4().hex[:8]
        self.logs = logs
        self.override = state / f"{self.name}.yaml"
        self.override.write_text(json.dumps(override(build_args), indent=1))
        self.ports = ports
        # The objectstore profile's key pair, new for each project (no log may show the secret: objectstore.py).
        self.s3_secret = uuid.uuid4().hex
        self.env = {
            **os.environ,
            "DOCKER_HOST": docker_host,
            "COMPOSE_PROJECT_NAME": self.name,
            # Each port as compose.yaml's variable: rest -> CTR_REST_PORT, s3_rest -> CTR_S3_REST_PORT, ...
            **{f"CTR_{key.upper()}_PORT": f"127.0.0.1:{port}" for key, port in ports.items()},
            "CTR_S3_ACCESS_KEY": self.name,
            "CTR_S3_SECRET_KEY": self.s3_secret,
            "COMPOSE_HTTP_TIMEOUT": "900",
        }
        self.cli = [
            *compose_cli(),
            "-f",
            str(REPO_ROOT / "compose.yaml"),
            "-f",
            str(self.override),
            "-p",
            self.name,
        ]

    def run(
        self, *args: str, timeout: float = 600, log: str | None = None, check_rc: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`compose ARGS`; its output goes to logs/LOG when named. A non-zero exit raises Failure."""
        try:
            proc = subprocess.run(
                [*self.cli, *args],
                cwd=REPO_ROOT,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise Failure(f"`compose {' '.join(args)}` ran over {timeout:.0f} s") from exc
        if log:
            (self.logs / log).write_text(proc.stdout + proc.stderr)
        if check_rc and proc.returncode != 0:
            raise Failure(
                f"`compose {' '.join(args)}` exited {proc.returncode}:\n{_tail(proc.stdout + proc.stderr)}"
            )
        return proc

    def container_id(self, service: str) -> str:
        ids = self.run("ps", "-a", "-q", service, check_rc=False).stdout.split()
        if not ids:  # compose v1's ps has no -a: it lists stopped containers anyway
            ids = self.run("ps", "-q", service).stdout.split()
        check(ids, f"no container for service {service}")
        return ids[0]

    def exec(self, service: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.run("exec", "-T", service, *argv, timeout=timeout, check_rc=False)

    def down(self) -> str:
        proc = self.run(*PROFILES, "down", "-v", "--remove-orphans", "-t", "5", timeout=300, check_rc=False)
        return "" if proc.returncode == 0 else _tail(proc.stdout + proc.stderr)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def build_failure(text: str) -> str:
    """One clear line for a failed build: the Dockerfiles' `ctr-build:` lines, or the base image's pull."""
    # The Dockerfiles' own output starts with the marker; the engine's echo of the failed RUN holds it too.
    marked = [
        line.strip()[len("ctr-build:") :].strip()
        for line in text.splitlines()
        if line.strip().startswith("ctr-build:")
    ]
    if marked:
        return marked[-1]
    for line in text.splitlines():
        low = line.lower()
        if ("pull" in low or "manifest" in low or "registry" in low or "resolv" in low) and (
            "error" in low or "denied" in low
        ):
            image = re.search(r"docker://([^\s:]+(?::[\w.-]+)?)", line)
            lookup = re.search(r"lookup (\S+) on \S+: (.+)$", line)
            why = f"{lookup.group(1)}: {lookup.group(2)}" if lookup else line.strip()[-120:]
            name = f" {image.group(1)}" if image else ""
            return f"the base image{name} cannot be pulled ({why}): set the build argument PYTHON_IMAGE to an image you can reach"
    return "the build failed:\n" + _tail(text, 15)


def timed(times: dict[str, float], key: str):  # type: ignore[no-untyped-def]
    """A context manager recording the seconds a step took under times[key]."""

    class _Timer:
        def __enter__(self) -> None:
            self.start = time.monotonic()

        def __exit__(self, *exc: object) -> None:
            times[key] = time.monotonic() - self.start

    return _Timer()
