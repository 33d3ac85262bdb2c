"""Run the serving image's ENTRYPOINT with its ENV, WORKDIR and HEALTHCHECK on the host (no Docker engine).

Container paths map to host paths (/opt/venv -> this venv, /app -> the repository, /models/ctr -> a model
repository), ports to free ones through the server's flags, and a sitecustomize makes the packages the image
lacks (torch, TensorFlow, the training code...) fail to import, as they would in the image.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from dockerfiles import env, exec_form, final_stage, healthcheck, single
from k8s_render import container, find
from tiny_model import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile.serving"
VENV = Path(sys.executable).parent.parent
# Installed here for training/export/bench, absent from the serving image (the `serve` extra only).
NOT_IN_IMAGE = ("torch", "lightning", "tensorflow", "tensorflow_serving", "keras", "onnx", "onnxscript",
                "fastapi", "training", "export", "bench")  # fmt: skip


@dataclass
class HostContainer:
    """A server started from the image's entrypoint; `rest` is its REST base URL."""

    proc: subprocess.Popen[str]
    rest: str
    rest_port: int
    log: Path


def host_path(value: str, model_base: Path) -> str:
    """Map the image's paths in a value to host paths."""
    return (
        value.replace("/opt/venv", str(VENV))
        .replace("/models/ctr", str(model_base))
        .replace("/app", str(ROOT))
    )


def _import_blocker(folder: Path) -> Path:
    """A sitecustomize that refuses the packages the serving image does not install."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        import importlib.abc, sys
        class NotInServingImage(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {NOT_IN_IMAGE!r}:
                    raise ModuleNotFoundError(f"{{name}} is not installed in the serving image")
                return None
        sys.meta_path.insert(0, NotInServingImage())
        """)
    )
    return folder


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET a URL; returns (status, body), HTTP errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_from_image(model_base: Path, tmp: Path, extra_args: list[str]) -> HostContainer:
    """Start `ENTRYPOINT + extra_args` with the image's ENV and WORKDIR mapped to this host."""
    stage = final_stage(DOCKERFILE)
    image_env = {k: host_path(v, model_base) for k, v in env(stage).items()}
    process_env = {"HOME": str(tmp), "TMPDIR": str(tmp)}
    for key, value in image_env.items():
        # `$PATH` in the image's ENV is the base image's PATH; here it is the host's.
        process_env[key] = value.replace("$PATH", os.environ["PATH"])
    blocker = _import_blocker(tmp / "site")
    process_env["PYTHONPATH"] = f"{blocker}{os.pathsep}{process_env.get('PYTHONPATH', '')}"
    argv = [host_path(a, model_base) for a in exec_form(single(stage, "ENTRYPOINT").args)]
    grpc_port, rest_port = free_port(), free_port()
    argv += [*extra_args, f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--host=127.0.0.1"]
    log = tmp / "server.log"
    proc = subprocess.Popen(
        argv,
        cwd=host_path(single(stage, "WORKDIR").args, model_base),
        env=process_env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    return HostContainer(proc, f"http://127.0.0.1:{rest_port}", rest_port, log)


def wait_until(host: HostContainer, path: str, status: int, timeout: float = 90.0) -> bytes:
    """Poll a REST path until it answers `status`; fail with the server's log otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.proc.poll() is not None:
            pytest.fail(f"server exited {host.proc.returncode}:\n{host.log.read_text()[-3000:]}")
        try:
            code, body = http_get(host.rest + path, timeout=2)
            if code == status:
                return body
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    pytest.fail(f"{path} never answered {status} within {timeout}s:\n{host.log.read_text()[-3000:]}")


def stop(host: HostContainer, timeout: float = 30.0) -> int:
    """SIGTERM, as `docker stop` and the kubelet send it; returns the exit code."""
    if host.proc.poll() is None:
        host.proc.send_signal(signal.SIGTERM)
        try:
            host.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            host.proc.kill()
            host.proc.wait()
            pytest.fail(f"server ignored SIGTERM for {timeout}s:\n{host.log.read_text()[-3000:]}")
    return host.proc.returncode


def run_healthcheck(rest_port: int) -> int:
    """Run the image's HEALTHCHECK command, its port mapped to `rest_port`; returns its exit code."""
    _, argv = healthcheck(final_stage(DOCKERFILE))
    argv = [a.replace("127.0.0.1:8501", f"127.0.0.1:{rest_port}") for a in argv]
    argv[0] = str(VENV / "bin" / argv[0])
    return subprocess.run(argv, capture_output=True, timeout=30).returncode


def deployment_args(builds: dict) -> list[str]:
    """The args the k8s Deployment appends to the image's entrypoint."""
    deploy = find(builds["k8s/base"], "Deployment", "ctr-serving")
    return list(container(deploy["spec"]["template"]["spec"], "serving").get("args", []))


def compose_command() -> list[str]:
    """The command compose appends to the image's entrypoint."""
    return list(yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["serving"].get("command", []))
