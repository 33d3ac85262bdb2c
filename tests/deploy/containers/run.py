"""`make test-containers`: the images built and run by a real engine, `docker compose up serving` end to end.

    .venv/bin/python tests/deploy/containers/run.py     # what `make test-containers` runs (root, Debian)

An engine: DOCKER_HOST (or CONTAINER_HOST) when set, otherwise a private `podman system service` started here
and stopped at the end. Podman and docker-compose are installed from Debian when missing. Then, on a fresh
compose project (new volumes) through an override file (compose_run.py):

1. the base image (pulled, or a Debian stand-in) and torch's wheel served from 127.0.0.1 (sources.py);
2. the images built (and the objectstore's); what is in each (no torch/TF/training code in serving, no serving code in the trainer);
3. `up serving`: the `model` service trains and exports version 1 and exits 0; the server passes its own
   healthcheck command; the README's raw row and a 128-float vector answer over REST and gRPC; the metrics
   route answers and a request log is written; the root filesystem is read-only;
4. `stop` under load drains within the grace period and exits 0; a second `up` does not retrain; the server
   SIGKILLed before its version is AVAILABLE, then `up` again, serves version 1 without a second training;
   then the online profile (online.py): the simulated traffic, the online trainer publishing two versions the
   server serves in turn, live-eval's figures of each, and `stop`: every container exits 0, nothing lost;
5. on a second fresh project, the `model` service SIGKILLed during its export: nothing is published, and `up`
   again exports the finished run (no second training) and serves version 1 (jobs.py, as the rest below);
   then its objectstore profile (objectstore.py): SeaweedFS makes the bucket, `model-s3` exports version 1 into
   it, `serving-s3` serves it from its cache (model status, x-model-version), and `down -v` leaves nothing;
6. the Kubernetes data Job, PyTorchJob (one node, --devices 1) and export Job commands in the trainer image;
7. the stock tensorflow_model_server on the same repository, when an image or binary for it can be had;
8. builds from an unreachable TORCH_INDEX_URL, PIP_INDEX_URL and PYTHON_IMAGE: one line naming the argument.

Everything started is removed at the end (`down -v`, the API service, the wheel server), after a failure too,
and so are build layers of earlier runs that this run's builds did not use. The timings are printed and
written to artifacts/test-containers/times.json; logs are in that folder.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # the gRPC client's protos import TensorFlow: no banner
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checks
import jobs
import objectstore
import online
from compose_run import REPO_ROOT, Failure, Project, build_failure, timed
from engine import Engine, EngineError, PrivatePodman, explain_start_failure, prune_stale_images
from sources import (
    CACHE,
    WheelServer,
    base_image,
    build_args,
    ensure_debs,
    find_torch_wheel,
    free_port,
    say,
)

LOGS = REPO_ROOT / "artifacts" / "test-containers"


def engine_host(state: Path) -> tuple[str, PrivatePodman | None]:
    """DOCKER_HOST/CONTAINER_HOST when given (never started or stopped here), else a private podman."""
    given = os.environ.get("DOCKER_HOST") or os.environ.get("CONTAINER_HOST")
    if given:
        ensure_debs(["docker-compose"], ["docker-compose"])
        if not Engine(given).ping():
            raise SystemExit(
                f"test-containers: no engine answers at {given} (DOCKER_HOST/CONTAINER_HOST): start it, or unset"
                " both to run a private podman"
            )
        say(f"using the engine at {given}")
        return given, None
    ensure_debs(["podman", "docker-compose"], ["podman", "docker-compose"])
    podman = PrivatePodman(state, CACHE / "storage")
    host = podman.start()
    say(
        f"podman system service on {host} (its own containers.conf and storage.conf; images in {podman.store})"
    )
    return host, podman


def probe(engine: Engine, image: str, podman: PrivatePodman | None) -> None:
    """A first container must start: otherwise say what is missing."""
    try:
        code, logs = engine.run(image, ["python", "-c", "print('ok')"], HostConfig={"NetworkMode": "none"})
    except EngineError as exc:
        raise SystemExit(
            f"test-containers: the engine cannot start a container: {exc}\n"
            f"  what is missing: {explain_start_failure(str(exc), podman.conf if podman else None)}"
        ) from None
    if code != 0 or "ok" not in logs:
        raise SystemExit(f"test-containers: a probe container exited {code}: {logs[-500:]}")


def main() -> int:
    started = time.monotonic()
    LOGS.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    state = Path(tempfile.mkdtemp(prefix="ctr-containers-"))
    podman: PrivatePodman | None = None
    server: WheelServer | None = None
    project: Project | None = None
    projects: list[Project] = []
    engine: Engine | None = None
    build_output = ""
    failed = False
    try:
        host, podman = engine_host(state)
        engine = Engine(host)
        with timed(times, "base_image_s"):
            python_image, how = base_image(engine)
        say(f"base image {python_image} ({how}, {times['base_image_s']:.0f} s)")
        probe(engine, python_image, podman)
        wheel = find_torch_wheel()
        torch_index = None
        if wheel:
            server = WheelServer(wheel, state)
            torch_index = server.url
            say(f"torch from {wheel} served at {server.url}")
        else:
            say("no CPU torch wheel on this host's disk: the Dockerfile's TORCH_INDEX_URL default")
        ports = {"rest": free_port(), "grpc": free_port(), "live_eval": free_port(), "online": free_port()}
        project = Project(host, state, LOGS, build_args(python_image, torch_index), ports)
        projects.append(project)
        say(f"compose project {project.name}, REST 127.0.0.1:{ports['rest']}, gRPC 127.0.0.1:{ports['grpc']}")
        with timed(times, "build_s"):
            proc = project.run(
                "--profile",
                "objectstore",
                "build",
                "model",
                "serving",
                "objectstore",
                timeout=3600,
                log="build.log",
                check_rc=False,
            )
        if proc.returncode != 0:
            raise Failure(f"build: {build_failure(proc.stdout + proc.stderr)} (log: {LOGS / 'build.log'})")
        build_output = proc.stdout + proc.stderr
        say(f"the images built in {times['build_s']:.0f} s")
        checks.image_contents(project, engine, times)
        checks.bootstrap_and_serve(project, engine, times)
        checks.stop_drains(project, engine, times)
        checks.second_up_and_kill_mid_load(project, engine, times)
        with timed(times, "online_s"):
            online.loop(project, engine, times)
        fresh_ports = {"rest": free_port(), "grpc": free_port()}
        fresh_ports.update(s3=free_port(), s3_rest=free_port(), s3_grpc=free_port())
        fresh = Project(host, state, LOGS, build_args(python_image, torch_index), fresh_ports)
        projects.append(fresh)
        jobs.kill_model_mid_export(fresh, engine, times)
        objectstore.publish_and_serve(fresh, engine, times)  # ends with `down -v`, every profile's
        jobs.kubernetes_commands(project, times)
        jobs.stock_server(project, engine)
        with timed(times, "bad_sources_s"):
            jobs.bad_sources(project, python_image, podman.env() if podman else None)
    except (Failure, EngineError) as exc:
        failed = True
        print(f"\ntest-containers: FAILED: {exc}", file=sys.stderr)
        if project:
            for service in ("model", "serving"):
                proc = project.run("logs", "--no-color", service, check_rc=False, timeout=60)
                (LOGS / f"{service}.log").write_text(proc.stdout + proc.stderr)
                print(f"--- the end of {service}'s log ---\n{proc.stdout[-3000:]}", file=sys.stderr)
    except Exception:
        failed = True
        traceback.print_exc()
    finally:
        for each in projects:
            problem = each.down()
            if problem:
                failed = True
                print(f"test-containers: `down -v` of {each.name} failed:\n{problem}", file=sys.stderr)
        if server:
            server.stop()
        if podman and build_output and engine:  # only in our own store, and knowing what the builds used
            try:
                say(
                    f"removed {prune_stale_images(engine, build_output)} stale build layers from {podman.store}"
                )
            except EngineError as exc:
                say(f"could not remove stale build layers: {exc}")
        if podman:
            podman.stop()
        shutil.rmtree(state, ignore_errors=True)
    times["total_s"] = time.monotonic() - started
    (LOGS / "times.json").write_text(json.dumps({k: round(v, 1) for k, v in times.items()}, indent=1) + "\n")
    summary = ", ".join(f"{k} {v:.0f}" if k.endswith("_s") else f"{k} {v}" for k, v in times.items())
    say(f"{'FAILED' if failed else 'passed'} ({summary})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
