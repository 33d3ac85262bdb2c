"""The checks of `make test-containers` beyond compose's serving: the Kubernetes Jobs' commands in the trainer
image, the stock tensorflow_model_server on the same repository, and builds from unreachable sources."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from checks import available
from compose_run import COMPOSE, REPO_ROOT, Project, build_failure, check, timed
from engine import Engine, EngineError
from sources import free_port, say, short_reason, wait_for


def bad_sources(project: Project, python_image: str, podman_env: dict[str, str] | None) -> None:
    """An unreachable torch index, pip index or base image: the build names the argument to set, in one line."""
    cli = ["podman"] if podman_env else ["docker"] if shutil.which("docker") else None
    if cli is None:
        say("SKIPPED the unreachable-source builds: no podman or docker CLI for this engine")
        return
    closed = f"http://127.0.0.1:{free_port()}/"
    cases = [
        ("Dockerfile.trainer", {"TORCH_INDEX_URL": closed}, "TORCH_INDEX_URL"),
        ("Dockerfile.serving", {"PIP_INDEX_URL": closed + "simple"}, "PIP_INDEX_URL"),
        (
            "Dockerfile.serving",
            {"PYTHON_IMAGE": "registry.invalid/python:3.11-slim-bookworm"},
            "PYTHON_IMAGE",
        ),
    ]
    for dockerfile, args, wanted in cases:
        argv = [*cli, "build", "--network", "host", "--target", "deps", "-f", f"docker/{dockerfile}"]
        for key, value in {"PYTHON_IMAGE": python_image, **args}.items():
            argv += ["--build-arg", f"{key}={value}"]
        proc = subprocess.run(
            [*argv, "."],
            cwd=REPO_ROOT,
            env=podman_env or project.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = proc.stdout + proc.stderr
        line = build_failure(output)
        check(proc.returncode != 0 and wanted in line and "\n" not in line, f"{dockerfile} {args}: {line}")
        say(f"unreachable {wanted}: the build fails with the line: {line[:200]}")


def kubernetes_commands(project: Project, times: dict[str, Any]) -> None:
    """The dev overlay's data Job, PyTorchJob and export Job commands in the trainer image."""
    with timed(times, "k8s_s"):
        for service in ("k8s-data", "k8s-train", "k8s-export"):
            project.run("--profile", "k8s", "run", "--rm", "-T", service, timeout=1200, log=f"{service}.log")
        proc = project.run(
            "--profile",
            "k8s",
            "run",
            "--rm",
            "-T",
            "--entrypoint",
            "ls",
            "k8s-export",
            "-A",
            "/models/ctr",
            "/runs/ctr-train/checkpoints",
        )
    listed = proc.stdout
    check(
        re.search(r"^1$", listed, re.M) and "best.ckpt" in listed,
        f"k8s: after the Jobs, /models/ctr and the run hold:\n{listed}",
    )
    say(
        f"Kubernetes commands: data Job, PyTorchJob (1 node, --devices 1) trained, export Job published version 1 ({times['k8s_s']:.0f} s)"
    )


def stock_server(project: Project, engine: Engine) -> None:
    """The same repository's saved_model.pb in tensorflow_model_server, when an image or binary can be had."""
    image = COMPOSE["services"]["tfserving"]["image"]
    have_image = engine.image(image) is not None
    if not have_image:
        try:
            engine.pull(image, timeout=120)
            have_image = True
        except EngineError as exc:
            reason = short_reason(exc)
    binary = shutil.which("tensorflow_model_server")
    if have_image:
        script = (
            "tensorflow_model_server --model_name=ctr --model_base_path=/models/ctr --rest_api_port=8501 --port=8500 & "
            "for i in $(seq 60); do exec 3<>/dev/tcp/127.0.0.1/8501 2>/dev/null && printf 'GET /v1/models/ctr HTTP/1.0\\r\\n\\r\\n' >&3 "
            "&& grep -q AVAILABLE <&3 && echo AVAILABLE && exit 0; sleep 1; done; exit 1"
        )
        proc = project.run(
            "--profile",
            "tfserving",
            "run",
            "--rm",
            "--no-deps",
            "-T",
            "--entrypoint",
            "bash",
            "tfserving",
            "-c",
            script,
            timeout=300,
            check_rc=False,
        )
        check(
            proc.returncode == 0,
            f"stock TF Serving did not load version 1:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}",
        )
        say(f"stock TF Serving ({image}) loaded version 1")
        return
    if binary:
        with tempfile.TemporaryDirectory() as tmp:
            argv = [
                *project.cli,
                "run",
                "--rm",
                "--no-deps",
                "-T",
                "--entrypoint",
                "tar",
                "serving",
                "-C",
                "/models",
                "-c",
                "ctr",
            ]
            tar = subprocess.run(argv, env=project.env, capture_output=True, timeout=300, check=True).stdout
            with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
                archive.extractall(tmp)
            port = free_port()
            server = subprocess.Popen(
                [
                    binary,
                    "--model_name=ctr",
                    f"--model_base_path={Path(tmp) / 'ctr'}",
                    f"--rest_api_port={port}",
                    f"--port={free_port()}",
                ]
            )
            try:
                ok = wait_for(lambda: available(f"http://127.0.0.1:{port}"), 120)
            finally:
                server.terminate()
                server.wait(timeout=30)
        check(ok, "tensorflow_model_server did not load version 1")
        say(f"stock TF Serving ({binary}) loaded version 1")
        return
    raise_skip = f"SKIPPED the stock-server check: no {image} image ({reason}) and no tensorflow_model_server binary on PATH"
    say(raise_skip)


def _repository(project: Project) -> str:
    """What /models/ctr holds (nothing when export never created it)."""
    script = "ls -A /models/ctr 2>/dev/null; true"
    return project.run("run", "--rm", "--no-deps", "-T", "--entrypoint", "sh", "model", "-c", script).stdout


def kill_model_mid_export(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """On fresh volumes: the `model` service SIGKILLed during its export publishes nothing; `up` again exports
    the finished training run (no second training) and serves version 1."""
    rest = f"http://127.0.0.1:{project.ports['rest']}"
    start = time.monotonic()
    killed_after = ""
    with (project.logs / "up-kill-export.log").open("w") as log:
        up = subprocess.Popen(
            [*project.cli, "up", "-d", "--no-build", "serving"],
            cwd=REPO_ROOT,
            env=project.env,
            stdout=log,
            stderr=log,
        )
        while up.poll() is None and not killed_after:
            for cid in engine.containers(project.name, "model"):
                if "exporting" in engine.logs(cid):
                    time.sleep(2.5)  # into the export: ONNX, the SavedModel, the gates
                    engine.call("POST", f"/containers/{cid}/kill", params={"signal": "KILL"})
                    killed_after = f"{time.monotonic() - start:.0f} s"
            time.sleep(0.3)
        up.wait(timeout=900)
    check(killed_after, "the model service never reached its export")
    listed = _repository(project)
    published = [e for e in listed.split() if e.isdigit()]
    project.run("up", "-d", "--no-build", "serving", timeout=900, log="up-after-kill.log")
    [cid] = engine.containers(project.name, "model", stopped=True)
    logs = engine.logs(cid)
    check(
        logs.count("training on") == 1,
        f"the bootstrap trained again after the killed export:\n{logs[-1500:]}",
    )
    if not published:
        check("exporting it without training again" in logs, f"the bootstrap did not resume:\n{logs[-1500:]}")
    check(
        wait_for(lambda: available(rest), 180), "after the killed export, the server did not load version 1"
    )
    listed = _repository(project)
    versions = [e for e in listed.split() if e.isdigit()]
    check(versions == ["1"], f"after the killed export and `up`, the repository holds {listed.split()}")
    leftovers = [e for e in listed.split() if e.startswith(".")]
    times["resume_after_killed_export_s"] = time.monotonic() - start
    say(
        f"model SIGKILLed {killed_after} into the bootstrap, during its export: "
        f"{'nothing published' if not published else f'version {published} already published'}; `up` again "
        f"exported the finished run without training again, serves version 1"
        + (f" (staging folders left by the kill, ignored by servers: {leftovers})" if leftovers else "")
    )
