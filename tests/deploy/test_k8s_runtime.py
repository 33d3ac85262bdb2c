"""What a cluster does with the rendered manifests: which images it pulls, where the code may write, which
flags the processes get, and whether their workers and threads fit the CPU and memory they are given."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from k8s_render import KUSTOMIZATIONS, find
from module_flags import accepted_flags, flags, module_calls

from tests.helpers import REPO_ROOT

OUR_IMAGE = re.compile(r"^(?:[\w.-]+(?::\d+)?/)*ctr-(?:serving|trainer)(?::[\w.-]+)?$")
# Flags whose value is a folder the process writes into; ${VAR} and $(VAR) suffixes are per pod.
WRITE_FLAGS = ("--out", "--repo", "--request_log_dir", "--work", "--state-dir")
READ_FLAGS = ("--data", "--run", "--eval-data", "--logs", "--clicks")
WORKER_MIB = 256  # RSS of one serving worker with its body decoder, rounded up (docs/deploy.md)
SERVING_ENTRYPOINT = ["python", "-m", "serving"]  # docker/Dockerfile.serving; args are appended to it


def _pods(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]
        elif o["kind"] == "PyTorchJob":
            for role, replica in o["spec"]["pytorchReplicaSpecs"].items():
                yield f"PyTorchJob/{o['metadata']['name']}/{role}", replica["template"]["spec"]


def our_containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(owner/container, pod spec, container) of every container, init containers too, running our images."""
    for owner, spec in _pods(objects):
        for c in spec.get("initContainers", []) + spec["containers"]:
            if OUR_IMAGE.match(c["image"]):
                yield f"{owner}/{c['name']}", spec, c


def argv(c: dict[str, Any]) -> list[str]:
    """The process's argv: the serving image's entrypoint when the container gives only args."""
    return c.get("command", SERVING_ENTRYPOINT) + c.get("args", [])


def flag_value(args: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) <= 1, f"{name} given twice in {args}"
    return values[0] if values else None


def cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def mebibytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


def mount_for(
    spec: dict[str, Any], c: dict[str, Any], path: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (volumeMount, volume) holding `path`: the mount with the longest matching mountPath."""
    mounts = [
        m
        for m in c.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")
    ]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return mount, volume


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_container_of_ours_pulls_if_not_present(builds, path: str):
    found = list(our_containers(builds[path]))
    # The data Job's, the export Job's, the server's, the online trainer's, live evaluation's, and the init and
    # main containers of Master and Worker.
    assert len(found) == 9
    for name, _, c in found:
        assert c.get("imagePullPolicy") == "IfNotPresent", (
            f"{name}: imagePullPolicy {c.get('imagePullPolicy')}"
        )
    if path == "k8s/overlays/prod":  # a registry, and tags that never move, so IfNotPresent is safe
        for name, _, c in found:
            assert c["image"].startswith("registry.example.com/ctr/"), name
            assert not c["image"].endswith(":latest"), name
    if path == "k8s/overlays/dev":  # the local images that `kind load docker-image` puts on the node
        assert {c["image"] for _, _, c in found} == {"ctr-serving:latest", "ctr-trainer:latest"}


@pytest.mark.parametrize("overlay", ["k8s/overlays/dev", "k8s/overlays/prod"])
def test_each_overlay_says_where_its_images_come_from(overlay: str):
    kustomization = yaml.safe_load((REPO_ROOT / overlay / "kustomization.yaml").read_text())
    assert {image["name"] for image in kustomization["images"]} == {"ctr-serving", "ctr-trainer"}


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_volumes_are_writable_wherever_the_code_writes(builds, path: str):
    checked = set()
    for name, spec, c in our_containers(builds[path]):
        args = argv(c)
        writes = [re.sub(r"/\$[({]\w+[)}]$", "", v) for f in WRITE_FLAGS if (v := flag_value(args, f))]
        if c["name"] == "synth":
            writes.append("/data")  # the data Job's script writes /data/.synth, then renames into /data
        if c.get("securityContext", {}).get("readOnlyRootFilesystem"):
            writes.append("/tmp")  # Python's tempfile, the body decoder's spawn
        for folder in writes:
            found = mount_for(spec, c, folder)
            assert found is not None, (
                f"{name} writes {folder}, which no volume holds (read-only root or lost)"
            )
            mount, volume = found
            assert not mount.get("readOnly"), f"{name} writes {folder}, mounted read-only"
            assert not volume.get("persistentVolumeClaim", {}).get("readOnly"), (
                f"{name}: {folder}'s claim is read-only"
            )
            checked.add(folder)
        for f in READ_FLAGS:
            value = flag_value(args, f)
            if value is not None:
                assert mount_for(spec, c, value) is not None, f"{name} reads {f}={value} from no volume"
    assert checked >= {
        "/runs/ctr-train",
        "/models/ctr",
        "/var/log/ctr",
        "/data",
        "/tmp",
        "/online",
        "/live/eval",
    }


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_flag_in_the_manifests_is_one_the_cli_accepts(builds, path: str):
    for name, _, c in our_containers(builds[path]):
        for module, args in module_calls(argv(c)):
            unknown = set(flags(args)) - accepted_flags(module)
            assert not unknown, f"{name}: python -m {module} has no {sorted(unknown)}"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_serving_workers_and_threads_fit_the_cpu_and_memory_limits(builds, path: str):
    spec = find(builds[path], "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    [c] = spec["containers"]
    args, limits = c["args"], c["resources"]["limits"]
    workers, threads = (
        int(flag_value(args, "--num_workers") or 0),
        int(flag_value(args, "--intra_op_threads") or 0),
    )
    assert workers * threads == cpus(limits["cpu"]), (
        f"{path}: {workers} workers x {threads} threads vs {limits}"
    )
    assert (workers + 1) * WORKER_MIB <= mebibytes(limits["memory"]), f"{path}: {workers} workers in {limits}"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_training_threads_times_processes_fill_the_cpu_limit(builds, path: str):
    job = find(builds[path], "PyTorchJob", "ctr-train")
    for role, replica in job["spec"]["pytorchReplicaSpecs"].items():
        [c] = [c for c in replica["template"]["spec"]["containers"] if c["name"] == "pytorch"]
        processes = int(flag_value(c["args"], "--nproc-per-node") or 0)
        [(_, train_args)] = module_calls(c["args"])
        threads = int(flag_value(train_args, "--threads") or 0)
        assert processes * threads == cpus(c["resources"]["limits"]["cpu"]), f"{path} {role}"


def test_export_job_scores_the_gate_on_the_eval_file_the_data_job_writes(builds):
    objects = builds["k8s/base"]
    export = find(objects, "Job", "ctr-export")["spec"]["template"]["spec"]["containers"][0]
    assert flag_value(export["args"], "--eval-data") == "/data/eval.txt"
    synth = find(objects, "Job", "ctr-data")["spec"]["template"]["spec"]["containers"][0]
    assert "python -m training.synth --out /data/.synth/eval.txt" in synth["args"][0]


@pytest.mark.parametrize("overlay", ["k8s/overlays/dev", "k8s/overlays/prod"])
def test_monitoring_objects_carry_the_release_and_dashboard_labels(builds, overlay: str):
    objects = builds[overlay]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert find(objects, kind, "ctr-serving")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboard = find(objects, "ConfigMap", "ctr-serving-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((REPO_ROOT / "docker/grafana/dashboards/ctr-serving.json").read_text())
    assert json.loads(dashboard["data"]["ctr-serving.json"]) == shipped
