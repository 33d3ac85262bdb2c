"""The deployments' own commands, run on the host end to end (slow: each trains a tiny model).

- compose: the `model` service's script on an empty repository, then the serving entrypoint on its output;
- Kubernetes: the dev overlay's PyTorchJob command as two torchrun "nodes" on 127.0.0.1 (the operator's env
  substituted), then the export Job's command, then the serving entrypoint with the Deployment's args.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml
from host_container import (
    NOT_IN_TRAINER_IMAGE,
    compose_command,
    deployment_args,
    import_blocker,
    start_from_image,
    stop,
    wait_until,
)
from k8s_render import container, find
from tiny_model import WIDTH

from tests.helpers import REPO_ROOT, free_port

pytestmark = pytest.mark.slow
ROWS = 20_000  # ~1,900 validation rows: enough for the calibrator's fit (at least 1,000)
# Appended to the export Job's flags: a tiny one-epoch model's calibration ratio on 20,000 rows is noisy.
LOOSE_CALIBRATION_GATE = ["--max-calibration-gap=0.1"]
# Appended to the deployments' training flags: one short epoch on tiny batches (argparse: the last value wins).
TINY_TRAINING = ["--max-epochs=1", "--batch-size=256"]


def _predict_two_rows(rest: str) -> np.ndarray:
    body = json.dumps({"instances": np.zeros((2, WIDTH)).tolist()}).encode()
    request = urllib.request.Request(f"{rest}/v1/models/ctr:predict", data=body)
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
        return np.asarray(json.loads(r.read())["predictions"])


def _serve_and_predict(model_base: Path, tmp: Path, args: list[str]) -> np.ndarray:
    host = start_from_image(model_base, tmp, args)
    try:
        wait_until(host, "/v1/models/ctr", 200, timeout=120)
        return _predict_two_rows(host.rest)
    finally:
        assert stop(host) == 0


def test_compose_model_service_bootstraps_once_then_serving_answers(tmp_path):
    service = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]["model"]
    env = {**os.environ, **service["environment"]}
    env.update(
        MODEL_BASE_PATH=str(tmp_path / "models" / "ctr"),
        WORK_DIR=str(tmp_path / "artifacts"),
        ROWS=str(ROWS),
        TRAIN_ARGS=" ".join([service["environment"]["TRAIN_ARGS"], *TINY_TRAINING]),
        PYTHON=sys.executable,
        PYTHONPATH=str(import_blocker(tmp_path / "trainer-site", NOT_IN_TRAINER_IMAGE)),
    )
    script = [*service["entrypoint"]]
    first = subprocess.run(script, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    versions = sorted(p.name for p in (tmp_path / "models" / "ctr").iterdir() if p.name.isdigit())
    assert versions == ["1"]
    assert (tmp_path / "models/ctr/1/model.onnx").is_file() and (
        tmp_path / "models/ctr/1/saved_model.pb"
    ).is_file()

    again = subprocess.run(script, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (
        again.stdout.strip()
        == f"model repository {tmp_path}/models/ctr already holds version 1; nothing to do"
    )

    predictions = _serve_and_predict(tmp_path / "models" / "ctr", tmp_path, compose_command())
    assert predictions.shape == (2, 1) and np.all((predictions > 0) & (predictions < 1))


def _k8s_argv(c: dict, paths: dict[str, Path], operator_env: dict[str, str]) -> list[str]:
    """A container's argv with the operator's $(VAR)s substituted and its volume paths mapped to `paths`."""
    argv = []
    for arg in c.get("command", []) + c.get("args", []):
        arg = re.sub(r"\$\((\w+)\)", lambda m: operator_env[m.group(1)], arg)
        for mount, host in paths.items():
            arg = arg.replace(mount, str(host))
        argv.append(arg)
    return argv


def test_dev_pytorchjob_trains_on_two_local_nodes_then_export_and_serving_run(builds, tmp_path):
    objects = builds["k8s/overlays/dev"]
    paths = {"/data": tmp_path / "data", "/runs": tmp_path / "runs", "/models": tmp_path / "models"}
    for name, seed in (("train.txt", "7"), ("eval.txt", "8")):  # as the data Job writes them
        synth = subprocess.run(
            [
                sys.executable,
                "-m",
                "training.synth",
                "--out",
                str(paths["/data"] / name),
                "--rows",
                str(ROWS),
                "--seed",
                seed,
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert synth.returncode == 0, synth.stderr

    job = find(objects, "PyTorchJob", "ctr-train")["spec"]["pytorchReplicaSpecs"]
    roles = [("Master", 0)] + [("Worker", i + 1) for i in range(job["Worker"]["replicas"])]
    port = str(free_port())
    trainer_site = str(import_blocker(tmp_path / "trainer-site", NOT_IN_TRAINER_IMAGE))
    procs = []
    for role, rank in roles:
        pytorch = container(job[role]["template"]["spec"], "pytorch")
        operator_env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": str(len(roles)),
            "RANK": str(rank),
        }
        argv = _k8s_argv(pytorch, paths, operator_env) + TINY_TRAINING
        argv[0] = str(Path(sys.executable).parent / argv[0])  # torchrun from this venv
        env = {**os.environ, **{e["name"]: e["value"] for e in pytorch["env"]}, **operator_env}
        env["PYTHONPATH"] = trainer_site
        log = tmp_path / f"{role}-{rank}.log"
        with log.open("w") as out:
            procs.append(
                (log, subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT))
            )
    try:
        for log, proc in procs:
            assert proc.wait(timeout=900) == 0, f"{log.name}:\n{log.read_text()[-3000:]}"
    finally:
        for _, proc in procs:  # a node whose peer failed waits in the rendezvous: stop it
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run = paths["/runs"] / "ctr-train"
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "metrics.json").is_file()

    export = container(find(objects, "Job", "ctr-export")["spec"]["template"]["spec"], "export")
    argv = _k8s_argv(export, paths, {})
    export_run = subprocess.run(
        [sys.executable, *argv[1:], *LOOSE_CALIBRATION_GATE],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": trainer_site},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert export_run.returncode == 0, export_run.stderr[-3000:]

    predictions = _serve_and_predict(paths["/models"] / "ctr", tmp_path, deployment_args(builds))
    assert predictions.shape == (2, 1) and np.all((predictions > 0) & (predictions < 1))
