"""k8s/overlays/s3: the model repository in a bucket. It renders and validates; no claim holds models, no volume
for models is shared between pods; every reader and writer of the bucket gets the same s3:// paths, the endpoint
and the credentials; every name a pod refers to exists in the render."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from k8s_render import container, find, kustomize_build
from module_flags import accepted_flags, flags, module_calls
from test_k8s import CRDS, K8S_VERSIONS, _flag, _pods

OVERLAY = "k8s/overlays/s3"
# The variables the training operator sets in each PyTorchJob container.
OPERATOR_ENV = {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize_build(OVERLAY)


def _config(objects: list[dict[str, Any]]) -> dict[str, str]:
    [config] = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("ctr-object-store")
    ]
    return config["data"]


def _env(objects: list[dict[str, Any]], c: dict[str, Any]) -> dict[str, str]:
    """A container's environment as far as the render says: its env values and its envFrom ConfigMaps' keys."""
    env = {e["name"]: e.get("value", "<from a reference>") for e in c.get("env", [])}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env |= find(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
    return env


def _bucket_users(objects: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """The containers that read or write the bucket: name -> (pod spec, container)."""
    serving = find(objects, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    export = find(objects, "Job", "ctr-export")["spec"]["template"]["spec"]
    online = find(objects, "Deployment", "ctr-online-trainer")["spec"]["template"]["spec"]
    users = {
        "serving": (serving, container(serving, "serving")),
        "export": (export, container(export, "export")),
        "online-trainer": (online, container(online, "online-trainer")),
    }
    for role, replica in find(objects, "PyTorchJob", "ctr-train")["spec"]["pytorchReplicaSpecs"].items():
        users[f"train-{role}"] = (
            replica["template"]["spec"],
            container(replica["template"]["spec"], "pytorch"),
        )
    return users


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_overlay_renders_and_every_object_validates(objects, version: str):
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) not in CRDS:
            kubernetes_validate.validate(obj, version, strict=True)
    for owner, template in _pods(objects):
        if owner.startswith("PyTorchJob"):
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": template["spec"]}
            kubernetes_validate.validate(pod, version, strict=True)
    [namespace] = [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"]
    assert namespace == "ctr-s3"
    assert all(o["metadata"].get("namespace") == namespace for o in objects if o["kind"] != "Namespace")


def test_no_claim_holds_models_and_no_volume_for_models_is_shared(objects):
    claims = {
        o["metadata"]["name"]: o["spec"]["accessModes"]
        for o in objects
        if o["kind"] == "PersistentVolumeClaim"
    }
    assert "ctr-models" not in claims
    assert not [name for name, modes in claims.items() if "models" in name], claims
    # What each pod mounts where a model could be: only the server's own cache, an emptyDir.
    claims_by_pod: dict[str, set[str]] = {}
    for owner, template in _pods(objects):
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{owner}/{c['name']} mounts {mount['name']}, which is gone"
                if "models" in mount["mountPath"]:
                    assert "emptyDir" in volumes[mount["name"]], (
                        f"{owner}: {mount['mountPath']} is not an emptyDir"
                    )
        claims_by_pod[owner] = {
            v["persistentVolumeClaim"]["claimName"] for v in volumes.values() if "persistentVolumeClaim" in v
        }
    serving, export = claims_by_pod["Deployment/ctr-serving"], claims_by_pod["Job/ctr-export"]
    assert serving == {"ctr-request-logs"} and not serving & export, (serving, export)
    serving_spec = find(objects, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    serving_c = container(serving_spec, "serving")
    cache = _flag(serving_c["args"], "--model_cache_dir")
    [mount] = [m for m in serving_c["volumeMounts"] if m["mountPath"] == cache]
    [volume] = [v for v in serving_spec["volumes"] if v["name"] == mount["name"]]
    assert volume == {"name": mount["name"], "emptyDir": {"sizeLimit": "2Gi"}}


def test_every_bucket_user_gets_the_paths_the_endpoint_and_the_credentials(objects):
    config = _config(objects)
    assert config["CTR_MODEL_REPO"] == "s3://ctr-models/ctr"
    assert re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]+/\S+", config["CTR_TRAINING_DATA"])
    assert {"AWS_REGION", "AWS_ENDPOINT_URL"} <= set(config)
    secret = find(objects, "Secret", "ctr-object-store-credentials")
    assert set(secret["stringData"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    paths = {}
    for name, (spec, c) in _bucket_users(objects).items():
        sources = c["envFrom"]
        assert {"name": secret["metadata"]["name"], "optional": True} in [
            s.get("secretRef") for s in sources
        ], name
        env = _env(objects, c)
        assert {"AWS_REGION", "AWS_ENDPOINT_URL"} <= set(env), name
        # Every $(VAR) in the argv is defined, so the kubelet expands it (an undefined one stays as text).
        argv = c.get("command", []) + c["args"]
        used = {v for a in argv for v in re.findall(r"\$\((\w+)\)", a)}
        assert used <= set(env) | (OPERATOR_ENV if name.startswith("train-") else set()), (name, used)
        calls = module_calls(argv) or [("serving", argv)]  # the server's args follow the image's entrypoint
        [(module, args)] = calls
        assert set(flags(args)) <= accepted_flags(module), name
        flag = {"serving": "--model_base_path", "training": "--data"}.get(module, "--repo")
        paths[name] = _flag(args, flag)
        if spec.get("serviceAccountName") != "ctr-export":  # the export Job's own account (its RBAC)
            assert spec["serviceAccountName"] == "ctr-object-store", name
    assert paths == {
        "serving": "$(CTR_MODEL_REPO)",
        "export": "$(CTR_MODEL_REPO)",
        "online-trainer": "$(CTR_MODEL_REPO)",
        "train-Master": "$(CTR_TRAINING_DATA)",
        "train-Worker": "$(CTR_TRAINING_DATA)",
    }
    find(objects, "ServiceAccount", "ctr-object-store")


def test_every_name_a_pod_refers_to_exists(objects):
    """The generated ConfigMap's hashed name reaches every reference, the PyTorchJob's included."""
    for _, template in _pods(objects):
        spec = template["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            for source in c.get("envFrom", []):
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if key in source:
                        find(objects, kind, source[key]["name"])
        if "serviceAccountName" in spec:
            find(objects, "ServiceAccount", spec["serviceAccountName"])
