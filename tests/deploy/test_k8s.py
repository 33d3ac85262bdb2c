"""k8s/: every kustomization builds, every object validates, and the pieces agree with each other."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from k8s_render import KUSTOMIZATIONS, container, find
from module_flags import accepted_flags, flags, module_calls

# The oldest Kubernetes the manifests target, and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CRDS = {
    ("kubeflow.org/v1", "PyTorchJob"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
OVERLAYS = [k for k in KUSTOMIZATIONS if "/overlays/" in k]


def _flag(args: list[str], name: str) -> str:
    """The value of `--name=VALUE` in an argv."""
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) == 1, f"expected one {name}=VALUE in {args}"
    return values[0]


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every pod template, as (owner, template), PyTorchJob replicas included."""
    pods = []
    for o in objects:
        if o["kind"] in ("Deployment", "Job"):
            pods.append((f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]))
        elif o["kind"] == "PyTorchJob":
            for role, replica in o["spec"]["pytorchReplicaSpecs"].items():
                pods.append((f"PyTorchJob/{o['metadata']['name']}/{role}", replica["template"]))
    return pods


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(builds, path: str, version: str):
    for obj in builds[path]:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue  # no schema ships for CRDs: their pod templates are validated below, fields by hand
        kubernetes_validate.validate(obj, version, strict=True)
    for owner, template in _pods(builds[path]):
        if owner.startswith("PyTorchJob"):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "x", **template.get("metadata", {})},
                "spec": template["spec"],
            }
            kubernetes_validate.validate(pod, version, strict=True)


@pytest.mark.parametrize("path", OVERLAYS)
def test_overlay_puts_everything_in_its_namespace(builds, path: str):
    [namespace] = [o["metadata"]["name"] for o in builds[path] if o["kind"] == "Namespace"]
    for obj in builds[path]:
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == namespace, f"{obj['kind']}/{obj['metadata']['name']}"
    binding = find(builds[path], "RoleBinding", "ctr-export")
    assert binding["subjects"][0]["namespace"] == namespace


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_container_is_hardened_and_sized(builds, path: str):
    for owner, template in _pods(builds[path]):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, owner
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, f"{owner}/{c['name']}"
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], f"{owner}/{c['name']}"
            assert {"requests", "limits"} <= set(c.get("resources", {})), f"{owner}/{c['name']}"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_serving_deployment_probes_drain_and_security(builds, path: str):
    deploy = find(builds[path], "Deployment", "ctr-serving")
    assert "replicas" not in deploy["spec"], "the HPA owns the replica count"
    spec = deploy["spec"]["template"]["spec"]
    serving = container(spec, "serving")
    assert "command" not in serving, "the image's entrypoint is what tests/deploy runs on the host"
    assert serving["readinessProbe"]["httpGet"] == {"path": "/v1/models/ctr", "port": "http"}
    assert serving["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {p["name"]: p["containerPort"] for p in serving["ports"]} == {"grpc": 8500, "http": 8501}
    pre_stop = serving["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(_flag(serving["args"], "--grace_period_seconds"))
    # The kubelet SIGKILLs at terminationGracePeriodSeconds, counted from the start of preStop.
    assert int(pre_stop[1]) + drain < spec["terminationGracePeriodSeconds"]
    assert set(flags(serving["args"])) <= accepted_flags("serving")
    security = serving["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert {"cpu", "memory"} <= set(serving["resources"]["requests"]) & set(serving["resources"]["limits"])
    mounts = {m["name"]: m for m in serving["volumeMounts"]}
    assert mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"] is True
    assert mounts["tmp"]["mountPath"] == "/tmp"
    volumes = {v["name"]: v for v in spec["volumes"]}
    claim = volumes["models"]["persistentVolumeClaim"]["claimName"]
    assert find(builds[path], "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_service_hpa_pdb_and_servicemonitor_select_the_serving_pods(builds, path: str):
    objects = builds[path]
    pod_labels = find(objects, "Deployment", "ctr-serving")["spec"]["template"]["metadata"]["labels"]
    service = find(objects, "Service", "ctr-serving")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("grpc", 8500, "grpc"),
        ("http", 8501, "http"),
    }
    hpa = find(objects, "HorizontalPodAutoscaler", "ctr-serving")["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ctr-serving"}
    assert hpa["metrics"][0]["resource"]["name"] == "cpu" and 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    pdb = find(objects, "PodDisruptionBudget", "ctr-serving")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    monitor = find(objects, "ServiceMonitor", "ctr-serving")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [(e["port"], e["path"]) for e in monitor["endpoints"]] == [
        ("http", "/monitoring/prometheus/metrics")
    ]


def _replicas(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return job["spec"]["pytorchReplicaSpecs"]


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_pytorchjob_has_what_the_training_operator_needs(builds, path: str):
    job = find(builds[path], "PyTorchJob", "ctr-train")
    replicas = _replicas(job)
    assert set(replicas) == {"Master", "Worker"}
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] >= 1
    for role, replica in replicas.items():
        assert replica["restartPolicy"] in ("OnFailure", "Never", "ExitCode", "Always"), role
        names = [c["name"] for c in replica["template"]["spec"]["containers"]]
        assert names == ["pytorch"], f"{role}: the operator injects its env into the container named pytorch"
    master, worker = (container(replicas[r]["template"]["spec"], "pytorch") for r in ("Master", "Worker"))
    assert (master["command"], master["args"], master["env"]) == (
        worker["command"],
        worker["args"],
        worker["env"],
    )


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_pytorchjob_world_size_matches_replicas_processes_and_gpus(builds, path: str):
    job = find(builds[path], "PyTorchJob", "ctr-train")
    nodes = sum(r["replicas"] for r in _replicas(job).values())
    for role, replica in _replicas(job).items():
        spec = replica["template"]["spec"]
        pytorch = container(spec, "pytorch")
        argv = pytorch["command"] + pytorch["args"]
        assert argv[0] == "torchrun"
        launcher = argv[: argv.index("-m")]
        assert _flag(launcher, "--nnodes") == "$(WORLD_SIZE)" and _flag(launcher, "--node-rank") == "$(RANK)"
        [(module, train_args)] = module_calls(argv)
        assert module == "training"
        assert int(_flag(train_args, "--num_nodes")) == nodes, f"{role}: --num_nodes must equal the pod count"
        devices = int(_flag(train_args, "--devices"))
        assert int(_flag(launcher, "--nproc-per-node")) == devices
        gpus = pytorch["resources"]["limits"].get("nvidia.com/gpu")
        if _flag(train_args, "--accelerator") == "gpu":
            assert int(gpus) == devices and pytorch["resources"]["requests"]["nvidia.com/gpu"] == gpus
        else:
            assert gpus is None
        assert set(flags(launcher[1:])) <= accepted_flags("torch.distributed.run")
        assert set(flags(train_args)) <= accepted_flags("training")
        assert float(_flag(train_args, "--ddp-timeout")) >= 300, "a DDP timeout long enough for slow starts"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_pytorchjob_sets_nccl_env_and_memory_backed_dev_shm(builds, path: str):
    for replica in _replicas(find(builds[path], "PyTorchJob", "ctr-train")).values():
        spec = replica["template"]["spec"]
        pytorch = container(spec, "pytorch")
        env = {e["name"]: e["value"] for e in pytorch["env"]}
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["NCCL_DEBUG"] in ("WARN", "INFO")
        shm = [m["name"] for m in pytorch["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        [volume] = [v for v in spec["volumes"] if v["name"] in shm]
        assert volume["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_data_training_and_export_agree_on_paths_and_claims(builds, path: str):
    objects = builds[path]

    def claim_at(spec: dict[str, Any], c: dict[str, Any], mount_path: str) -> str:
        [mount] = [m for m in c["volumeMounts"] if m["mountPath"] == mount_path]
        [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        return volume["persistentVolumeClaim"]["claimName"]

    master_spec = _replicas(find(objects, "PyTorchJob", "ctr-train"))["Master"]["template"]["spec"]
    pytorch = container(master_spec, "pytorch")
    [(_, train_args)] = module_calls(pytorch["command"] + pytorch["args"])
    data, run = _flag(train_args, "--data"), _flag(train_args, "--out")

    data_spec = find(objects, "Job", "ctr-data")["spec"]["template"]["spec"]
    synth = container(data_spec, "synth")
    assert f"mv /data/.synth/train.txt {data}" in synth["args"][0]
    assert claim_at(data_spec, synth, "/data") == claim_at(master_spec, pytorch, "/data")

    export_spec = find(objects, "Job", "ctr-export")["spec"]["template"]["spec"]
    export = container(export_spec, "export")
    [(module, export_args)] = module_calls(export["command"] + export["args"])
    assert module == "export" and set(flags(export_args)) <= accepted_flags("export")
    assert _flag(export_args, "--run") == run
    assert claim_at(export_spec, export, "/runs") == claim_at(master_spec, pytorch, "/runs")
    # Export writes where serving reads: the same claim, and --repo is the server's model base path.
    serving_spec = find(objects, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    assert claim_at(export_spec, export, "/models") == claim_at(
        serving_spec, container(serving_spec, "serving"), "/models"
    )
    assert _flag(export_args, "--repo") == "/models/ctr"
    [wait] = export_spec["initContainers"]
    assert wait["args"][:3] == ["wait", "--for=condition=Succeeded", "pytorchjob/ctr-train"]
    role = find(objects, "Role", export_spec["serviceAccountName"])
    assert role["rules"] == [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["get", "list", "watch"]}
    ]


def test_prod_trains_on_gpus_and_dev_on_cpus(builds):
    def train_args(path: str) -> list[str]:
        pytorch = container(
            _replicas(find(builds[path], "PyTorchJob", "ctr-train"))["Master"]["template"]["spec"], "pytorch"
        )
        return module_calls(pytorch["args"])[0][1]

    assert _flag(train_args("k8s/overlays/prod"), "--accelerator") == "gpu"
    assert _flag(train_args("k8s/overlays/dev"), "--accelerator") == "cpu"
    images = {c["image"] for _, t in _pods(builds["k8s/overlays/prod"]) for c in t["spec"]["containers"]}
    assert all(re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest") for image in images)


@pytest.mark.parametrize("path", OVERLAYS)
def test_training_caches_on_the_shared_writable_runs_claim_not_the_read_only_data(builds, path: str):
    spec = _replicas(find(builds[path], "PyTorchJob", "ctr-train"))
    for role in ("Master", "Worker"):
        pod = spec[role]["template"]["spec"]
        pytorch = container(pod, "pytorch")
        [(_, train_args)] = module_calls(pytorch["command"] + pytorch["args"])
        cache = _flag(train_args, "--cache-dir")
        [mount] = [m for m in pytorch["volumeMounts"] if cache.startswith(m["mountPath"] + "/")]
        assert mount["mountPath"] == "/runs" and not mount.get("readOnly"), f"{role}: {mount}"
        [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == "ctr-runs"  # ReadWriteMany: every rank sees it
