"""Run the serving image's ENTRYPOINT with its ENV, WORKDIR and HEALTHCHECK on the host (no Docker engine).

Container paths map to host paths (/opt/venv -> this venv, /app -> the repository, /models/ctr -> a model
repository), ports to free ones through the server's flags, and a sitecustomize hides the packages the image
lacks (torch, TensorFlow, the training code...), as the image would.
"""

from __future__ import annotations

import os
import re
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

from tests.helpers import REPO_ROOT, free_port

DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile.serving"
VENV = Path(sys.executable).parent.parent
# Installed here for training/export/bench, absent from the serving image (the `serve` extra only).
NOT_IN_SERVING_IMAGE = (
    *("torch", "lightning", "tensorflow", "tensorflow_serving", "keras", "onnx", "onnxscript", "fastapi"),
    *("training", "export", "bench"),
)
# Installed here, absent from the trainer image (train, export and pipelines extras; of ours it copies training/,
# export/ and pipelines/ without rollout/).
NOT_IN_TRAINER_IMAGE = ("serving", "bench", "fastapi", "uvicorn", "matplotlib")


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
        .replace("/app", str(REPO_ROOT))
    )


def import_blocker(folder: Path, absent: tuple[str, ...]) -> Path:
    """A folder with a sitecustomize that hides the `absent` packages, as an image without them would.

    Every import finder is wrapped so that these names are not found: `import x` raises "No module named x",
    `importlib.util.find_spec("x")` is None and importlib.metadata lists no such distribution, so optional-
    dependency probes see them missing too. Put the
    folder first on PYTHONPATH: site imports sitecustomize after the .pth files, before the entrypoint runs.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
        import sys
        ABSENT = {absent!r}
        class Hidden:
            def __init__(self, finder):
                self.finder = finder
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in ABSENT or not hasattr(self.finder, "find_spec"):
                    return None
                return self.finder.find_spec(name, path, target)
            def find_distributions(self, *args, **kwargs):
                # importlib.metadata asks the same finders: hide the packages' metadata as well.
                find = getattr(self.finder, "find_distributions", None)
                for dist in find(*args, **kwargs) if find else ():
                    name = (dist.metadata["Name"] or "").lower().replace("-", "_")
                    if not any(name == a or name.startswith(a + "_") for a in ABSENT):
                        yield dist
            def __getattr__(self, attr):
                return getattr(self.finder, attr)
        sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
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
    blocker = import_blocker(tmp / "site", NOT_IN_SERVING_IMAGE)
    process_env["PYTHONPATH"] = f"{blocker}{os.pathsep}{process_env.get('PYTHONPATH', '')}"
    argv = [host_path(a, model_base) for a in exec_form(single(stage, "ENTRYPOINT").args)]
    grpc_port, rest_port = free_port(), free_port()
    # The request-log volume (compose, k8s) maps into tmp; the pod name comes from the downward API there.
    mounted = [
        a.replace("/var/log/ctr", str(tmp / "request-logs")).replace("$(POD_NAME)", "pod-0")
        for a in extra_args
    ]
    argv += [*mounted, f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--host=127.0.0.1"]
    log = tmp / "server.log"
    # `python` resolves through the mapped PATH, i.e. to this venv, as /opt/venv/bin/python in the image.
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv,
            cwd=host_path(single(stage, "WORKDIR").args, model_base),
            env=process_env,
            stdout=out,
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
    """The command compose appends to the image's entrypoint, its `${VAR:-default}` as compose reads them with
    the variables unset."""
    command = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]["serving"].get(
        "command", []
    )
    return [compose_default(a) for a in command]


def compose_default(text: str) -> str:
    """A compose.yaml string with each `${VAR:-default}` as its default."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
