"""The checks of `make test-containers` on the compose project: the images, `up serving`, stop, restart."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
from compose_run import COMPOSE, REPO_ROOT, Project, check, timed
from engine import Engine
from sources import say, wait_for

# The README's raw row (by field names; absent fields are missing) and TF Serving's 128-float form.
README_ROW = {"I1": 3, "I2": 20, "I5": 1520, "C1": "68fd1e64", "C2": "80e26c9b", "C6": "fbad5c96"}
WIDTH = 128
# pipelines/ in both: the rollout controller in the serving image, the online trainer and live evaluation in the
# trainer image (docker/Dockerfile.*: each copies its own subpackages of it).
SERVING_PACKAGES = {"ctr_contract", "ctr_store", "ctr_features", "serving", "pipelines"}
TRAINER_PACKAGES = {
    "ctr_contract",
    "ctr_store",
    "ctr_features",
    "ctr_model",
    "training",
    "export",
    "pipelines",
}

_INSPECT = """
import importlib.util, json, os, pathlib, sys
app = pathlib.Path('/app')
print(json.dumps({
    'app': sorted(p.name for p in app.iterdir()),
    'absent': [m for m in sys.argv[1].split(',') if importlib.util.find_spec(m) is None],
    'so': sorted(str(p.relative_to(app)) for p in app.rglob('*.so')),
    'uid': os.getuid(),
}))
"""


def _inspect_image(project: Project, service: str, modules: list[str]) -> dict[str, Any]:
    proc = project.run(
        "run",
        "--rm",
        "--no-deps",
        "-T",
        "--entrypoint",
        "python",
        service,
        "-c",
        _INSPECT,
        ",".join(modules),
        timeout=300,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def image_contents(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """Sizes, and what each image holds: serving no torch/TF/training code; the trainer no serving code."""
    for service in ("serving", "model"):
        image = COMPOSE["services"][service]["image"]
        found = engine.image(image) or engine.image("localhost/" + image)
        check(found, f"image {image} is not in the engine after the build")
        times[f"size_{service}_mb"] = round(found["Size"] / 1e6)  # type: ignore[index]
    heavy = [
        "torch",
        "tensorflow",
        "lightning",
        "onnx",
        "training",
        "export",
        "ctr_model",
        "pipelines.online",
        "pipelines.live_eval",
        "bench",
    ]
    serving = _inspect_image(project, "serving", heavy)
    check(set(serving["app"]) == SERVING_PACKAGES, f"serving image /app holds {serving['app']}")
    check(serving["absent"] == heavy, f"the serving image has {sorted(set(heavy) - set(serving['absent']))}")
    check(serving["so"], "the serving image has no compiled extension (.so) in /app")
    check(serving["uid"] == 10001, f"the serving image runs as uid {serving['uid']}")
    trainer_absent = ["serving", "pipelines.rollout", "bench", "orjson", "msgspec", "uvloop"]
    trainer = _inspect_image(project, "model", trainer_absent)
    check(set(trainer["app"]) == TRAINER_PACKAGES | {"docker"}, f"trainer image /app holds {trainer['app']}")
    check(
        trainer["absent"] == trainer_absent,
        f"the trainer image has {sorted(set(trainer_absent) - set(trainer['absent']))}",
    )
    say(
        f"images: ctr-serving {times['size_serving_mb']} MB ({', '.join(serving['app'])}; .so: {', '.join(serving['so'])}), "
        f"ctr-trainer {times['size_model_mb']} MB ({', '.join(trainer['app'])}; .so: {', '.join(trainer['so']) or 'none'})"
    )


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def available(rest: str) -> bool:
    status, body = _get(f"{rest}/v1/models/ctr")
    return status == 200 and b"AVAILABLE" in body


def _probabilities(answer: Any, rows: int, what: str) -> list[float]:
    check(isinstance(answer, dict) and "predictions" in answer, f"{what}: answered {str(answer)[:300]}")
    values = [float(p[0] if isinstance(p, list) else p) for p in answer["predictions"]]
    check(len(values) == rows and all(0.0 < v < 1.0 for v in values), f"{what}: predictions {values}")
    return values


def _grpc_predictions(target: str) -> tuple[float, float]:
    """The README row (signature raw, one tensor per field) and a 128-float vector over gRPC."""
    import grpc

    # TensorFlow (the protos' package) prints its C++ banner on stderr at import: silenced.
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)

    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        raw = predict_pb2.PredictRequest()
        raw.model_spec.name, raw.model_spec.signature_name = "ctr", "raw"
        for field, value in README_ROW.items():
            tensor = raw.inputs[field]
            tensor.tensor_shape.dim.add().size = 1
            if field.startswith("I"):
                tensor.dtype = 2  # DT_DOUBLE
                tensor.double_val.append(float(value))
            else:
                tensor.dtype = 7  # DT_STRING
                tensor.string_val.append(str(value).encode())
        vector = predict_pb2.PredictRequest()
        vector.model_spec.name = "ctr"
        tensor = vector.inputs["features"]
        tensor.dtype = 1  # DT_FLOAT
        tensor.tensor_shape.dim.add().size = 1
        tensor.tensor_shape.dim.add().size = WIDTH
        tensor.float_val.extend([0.1] * WIDTH)
        out = []
        for request in (raw, vector):
            answer = stub.Predict(request, timeout=30)
            out_tensor = answer.outputs["ctr"]
            values = (
                list(out_tensor.float_val) or np.frombuffer(out_tensor.tensor_content, np.float32).tolist()
            )
            check(len(values) == 1 and 0.0 < values[0] < 1.0, f"gRPC predict: {values}")
            out.append(values[0])
    return out[0], out[1]


def _model_exit(project: Project, engine: Engine) -> tuple[int, str]:
    state = engine.container(project.container_id("model"))["State"]
    logs = project.run("logs", "--no-color", "model", check_rc=False).stdout
    return int(state["ExitCode"]), logs


def bootstrap_and_serve(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """`up serving` from empty volumes: the bootstrap, then every answer the server owes."""
    rest, grpc_target = f"http://127.0.0.1:{project.ports['rest']}", f"127.0.0.1:{project.ports['grpc']}"
    start = time.monotonic()
    project.run("up", "-d", "--no-build", "serving", timeout=1800, log="up-1.log")
    times["bootstrap_s"] = time.monotonic() - start
    code, logs = _model_exit(project, engine)
    (project.logs / "model-1.log").write_text(logs)
    check(code == 0, f"the model service exited {code}")
    check(
        "exporting" in logs and "training on" in logs,
        f"the model service did not train and export:\n{logs[-2000:]}",
    )
    say(f"model service: trained and exported, exit 0 ({times['bootstrap_s']:.0f} s)")
    check(wait_for(lambda: available(rest), 180), "the server did not report version AVAILABLE within 180 s")
    status, body = _get(f"{rest}/v1/models/ctr")
    check(json.loads(body)["model_version_status"][0]["version"] == "1", f"served {body[:200]!r}")
    _only_version_1(project, "after the bootstrap")
    status, answer = _post(f"{rest}/v1/models/ctr:predict", {"instances": [README_ROW]})
    check(status == 200, f"REST raw row: {status} {answer}")
    raw_rest = _probabilities(answer, 1, "REST raw row")[0]
    times["first_answer_s"] = time.monotonic() - start
    status, answer = _post(f"{rest}/v1/models/ctr:predict", {"instances": [[0.1] * WIDTH]})
    check(status == 200, f"REST 128 floats: {status} {answer}")
    vector_rest = _probabilities(answer, 1, "REST 128 floats")[0]
    raw_grpc, vector_grpc = _grpc_predictions(grpc_target)
    check(abs(raw_grpc - raw_rest) < 1e-5 and abs(vector_grpc - vector_rest) < 1e-5, "REST and gRPC disagree")
    say(
        f"REST and gRPC: raw row {raw_rest:.8f}, 128 floats {vector_rest:.8f} (first answer {times['first_answer_s']:.0f} s after up)"
    )
    test = COMPOSE["services"]["serving"]["healthcheck"]["test"]
    check(test[0] == "CMD", f"healthcheck {test}")
    health = project.exec("serving", test[1:])
    check(
        health.returncode == 0, f"the healthcheck command exited {health.returncode}: {health.stderr[-500:]}"
    )
    status, body = _get(f"{rest}/monitoring/prometheus/metrics")
    check(
        status == 200 and b":tensorflow:serving:request_count" in body,
        f"metrics route: {status} {body[:200]!r}",
    )

    def logged() -> list[str]:
        return project.exec("serving", ["find", "/var/log/ctr", "-type", "f", "-size", "+0"]).stdout.split()

    check(wait_for(lambda: bool(logged()), 20), "no request log was written to /var/log/ctr (sample rate 1)")
    say(f"healthcheck command exit 0; metrics 200; request log {logged()[0]}")
    _read_only_root(project)


def _only_version_1(project: Project, when: str) -> None:
    """The repository holds version 1 and no staging folder (a version is published by a rename, whole)."""
    entries = project.exec("serving", ["ls", "-A", "/models/ctr"]).stdout.split()
    versions = [e for e in entries if e.isdigit()]
    staging = [e for e in entries if e.startswith(".")]
    check(
        versions == ["1"] and not staging, f"{when}, the repository holds {entries}, expected version 1 only"
    )


_WRITES = """
import json, os
result = {}
for folder in ('/', '/app', '/app/serving', '/etc', '/opt/venv', '/models/ctr', '/tmp', '/var/log/ctr'):
    try:
        path = os.path.join(folder, '.write-probe')
        open(path, 'w').close()
        os.remove(path)
        result[folder] = 'written'
    except OSError as exc:
        result[folder] = exc.strerror
status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)
print(json.dumps({'writes': result, 'uid': os.getuid(), 'cap_eff': status['CapEff'].strip()}))
"""


def _read_only_root(project: Project) -> None:
    proc = project.exec("serving", ["python", "-c", _WRITES])
    check(proc.returncode == 0, f"write probe: {proc.stderr[-500:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    writable = sorted(f for f, r in found["writes"].items() if r == "written")
    check(writable == ["/tmp", "/var/log/ctr"], f"the server can write {writable} ({found['writes']})")
    check(
        found["uid"] == 10001 and int(found["cap_eff"], 16) == 0,
        f"uid {found['uid']}, CapEff {found['cap_eff']}",
    )
    say("read-only root: writes only /tmp and /var/log/ctr; uid 10001, no capabilities")


def _load(rest: str, stop: threading.Event, stopping: threading.Event, seen: dict[str, int]) -> None:
    """Predicts one after another until `stop`; each answer's status (or error) counted in `seen`, keyed
    `before:` or `after:` the stop command began (`stopping`)."""
    body = json.dumps({"instances": [README_ROW] * 8}).encode()
    while not stop.is_set():
        when = "after" if stopping.is_set() else "before"
        request = urllib.request.Request(f"{rest}/v1/models/ctr:predict", data=body)
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                key = str(r.status)
        except urllib.error.HTTPError as exc:
            key = str(exc.code)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError):
                key = "refused"
            elif isinstance(exc.reason, BrokenPipeError | ConnectionResetError):
                key = "reset"  # as below
            else:
                key = type(exc.reason).__name__
            time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            # A connection the kernel queued on the listening socket but the server never accepted is reset
            # when the listener closes: the request was never read, so, like a refused one, it is safe to retry.
            key = "reset"
        except OSError as exc:
            key = type(exc).__name__
        seen[f"{when}:{key}"] = seen.get(f"{when}:{key}", 0) + 1


def stop_drains(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """`stop` under load, within the grace period, and the server exits 0. Requests sent before the stop all
    answer 200; after it, a new request is answered 200 (still draining), 503 (shutting down), refused, or reset
    unread (queued on the closing listener)."""
    grace = float(COMPOSE["services"]["serving"]["stop_grace_period"].rstrip("s"))
    rest = f"http://127.0.0.1:{project.ports['rest']}"
    cid = project.container_id("serving")
    seen: dict[str, int] = {}
    done, stopping = threading.Event(), threading.Event()
    load = threading.Thread(target=_load, args=(rest, done, stopping, seen), daemon=True)
    load.start()
    deadline = time.monotonic() + 30
    while seen.get("before:200", 0) < 20:  # the load runs before the stop
        check(load.is_alive() and time.monotonic() < deadline, f"no load before the stop: {seen}")
        time.sleep(0.05)
    stopping.set()
    with timed(times, "stop_s"):
        project.run("stop", "serving", timeout=grace + 30)
    done.set()
    load.join(timeout=40)
    state = engine.container(cid)["State"]
    check(state["ExitCode"] == 0, f"the server exited {state['ExitCode']} on stop")
    check(times["stop_s"] < grace, f"stop took {times['stop_s']:.1f} s, over the {grace:.0f} s grace period")
    before = {k: v for k, v in seen.items() if k.startswith("before:")}
    check(set(before) == {"before:200"}, f"requests before the stop did not all answer 200: {seen}")
    after = set(seen) - set(before)
    check(
        after <= {"after:200", "after:503", "after:refused", "after:reset"},
        f"requests failed while the server drained: {seen}",
    )
    say(f"stop under load: exit 0 in {times['stop_s']:.1f} s (grace {grace:.0f} s); answers {seen}")


def second_up_and_kill_mid_load(project: Project, engine: Engine, times: dict[str, Any]) -> None:
    """A second `up` does not retrain; killing the server mid-load and `up` again serves version 1."""
    rest = f"http://127.0.0.1:{project.ports['rest']}"
    start = time.monotonic()
    phase = _up_and_kill_serving_once_it_runs(project, engine, rest)
    code, logs = _model_exit(project, engine)
    check(code == 0 and "already holds version 1" in logs, f"second up: model exit {code}:\n{logs[-1500:]}")
    check(logs.count("training on") == 1, "the second up trained again")
    say(
        f"second up: the bootstrap saw version 1 ({time.monotonic() - start:.0f} s); server SIGKILLed {phase}"
    )
    project.run("up", "-d", "--no-build", "serving", timeout=600, log="up-3.log")
    code, logs = _model_exit(project, engine)
    check(code == 0 and logs.count("training on") == 1, "the bootstrap trained again after the kill")
    check(wait_for(lambda: available(rest), 180), "after the kill, the server did not load version 1")
    _only_version_1(project, "after the kill")
    status, answer = _post(f"{rest}/v1/models/ctr:predict", {"instances": [README_ROW]})
    check(status == 200, f"after the kill: {status} {answer}")
    _probabilities(answer, 1, "after the kill")
    times["restart_after_kill_s"] = time.monotonic() - start
    say("after the kill: version 1 served, no second training")


def _up_and_kill_serving_once_it_runs(project: Project, engine: Engine, rest: str) -> str:
    """`up -d serving`, and SIGKILL the server the moment its container runs (before the model is AVAILABLE)."""
    filters = json.dumps(
        {"label": [f"com.docker.compose.project={project.name}", "com.docker.compose.service=serving"]}
    )
    phase = ""
    with (project.logs / "up-2.log").open("w") as log:
        up = subprocess.Popen(
            [*project.cli, "up", "-d", "--no-build", "serving"],
            cwd=REPO_ROOT,
            env=project.env,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 600
        while not phase and time.monotonic() < deadline:
            running = _running(engine, filters)
            if running:
                status, body = _get(f"{rest}/v1/models/ctr", timeout=1)
                loaded = b"AVAILABLE" in body
                phase = (
                    "after version 1 was AVAILABLE (it loaded first)"
                    if loaded
                    else f"before version 1 was AVAILABLE (REST {status or 'not answering yet'})"
                )
                engine.call("POST", f"/containers/{running[0]}/kill", params={"signal": "KILL"})
            elif up.poll() is not None:
                break
            time.sleep(0.05)
        code = up.wait(timeout=600)
    check(code == 0, f"second up exited {code}: {(project.logs / 'up-2.log').read_text()[-1500:]}")
    check(phase, "the server never ran on the second up")
    return phase


def _running(engine: Engine, filters: str) -> list[str]:
    return [c["Id"] for c in engine.call("GET", "/containers/json", params={"filters": filters}) or []]
