"""k8s/flink/: the click join's FlinkDeployment builds, validates, and agrees with the job and the other manifests.

kubernetes-validate ships no schema for the Flink operator's CRD, so the parts are validated apart: the PVC and
the ConfigMap against the Kubernetes schema; the pod template as a Pod against it too (strict); the rest of the
FlinkDeployment against FLINK_DEPLOYMENT below, the operator's v1beta1 schema for the fields used here (types and
enums as the CRD gives them, no field outside it). The job's configuration must load as the job loads it, and
every path it and the Flink configuration name must be on a volume the pods mount.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from k8s_render import find, kustomize_build

from pipelines.clicks.flink.config import JobConfig

K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
_RESOURCE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cpu": {"type": "number"},
        "memory": {"type": "string"},
        "ephemeralStorage": {"type": "string"},
    },
}
FLINK_DEPLOYMENT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "flink.apache.org/v1beta1"},
        "kind": {"const": "FlinkDeployment"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "image",
                "flinkVersion",
                "flinkConfiguration",
                "serviceAccount",
                "jobManager",
                "taskManager",
                "job",
            ],
            "properties": {
                "image": {"type": "string"},
                "imagePullPolicy": {"type": "string"},
                "flinkVersion": {"enum": ["v1_18", "v1_19", "v1_20", "v2_0", "v2_1", "v2_2", "v2_3"]},
                "serviceAccount": {"type": "string"},
                "flinkConfiguration": _STRINGS,
                "podTemplate": {"type": "object"},
                "jobManager": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"replicas": {"type": "integer", "minimum": 1}, "resource": _RESOURCE},
                },
                "taskManager": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"replicas": {"type": "integer", "minimum": 1}, "resource": _RESOURCE},
                },
                "job": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["jarURI", "upgradeMode", "state"],
                    "properties": {
                        "jarURI": {"type": "string"},
                        "entryClass": {"type": "string"},
                        "args": {"type": "array", "items": {"type": "string"}},
                        "parallelism": {"type": "integer", "minimum": 1},
                        "upgradeMode": {"enum": ["last-state", "savepoint", "stateless"]},
                        "state": {"enum": ["running", "suspended"]},
                        "allowNonRestoredState": {"type": "boolean"},
                        "initialSavepointPath": {"type": "string"},
                    },
                },
            },
        },
    },
}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return kustomize_build("k8s/flink")


def test_the_flink_deployment_matches_the_operator_schema_and_its_pods_the_kubernetes_one(objects):
    dep = find(objects, "FlinkDeployment", "ctr-click-join")
    jsonschema.validate(dep, FLINK_DEPLOYMENT)
    template = dep["spec"]["podTemplate"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x", **template["metadata"]},
        "spec": template["spec"],
    }
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
        for o in objects:
            if o["kind"] != "FlinkDeployment":
                kubernetes_validate.validate(o, version, strict=True)
    spec = template["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    [main] = spec["containers"]
    assert main["name"] == "flink-main-container", "the operator merges its Flink container by this name"
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]


def _mounts(dep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = dep["spec"]["podTemplate"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in spec["containers"][0]["volumeMounts"]}


def _volume_of(path: str, mounts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    path = path.removeprefix("file://")
    best = max(
        (m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len, default=None
    )
    assert best is not None, f"{path} is on no mounted volume"
    return mounts[best]


def test_checkpoints_go_to_a_shared_volume_and_the_job_reads_what_is_mounted(objects):
    dep = find(objects, "FlinkDeployment", "ctr-click-join")
    conf, mounts = dep["spec"]["flinkConfiguration"], _mounts(dep)
    assert conf["execution.checkpointing.externalized-checkpoint-retention"] == "RETAIN_ON_CANCELLATION"
    assert (
        dep["spec"]["job"]["upgradeMode"] == "last-state" and conf["high-availability.type"] == "kubernetes"
    )
    for key in (
        "execution.checkpointing.dir",
        "execution.checkpointing.savepoint-dir",
        "high-availability.storageDir",
    ):
        claim = _volume_of(conf[key], mounts)["persistentVolumeClaim"]["claimName"]
        assert find(objects, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteMany"], key
    args = dep["spec"]["job"]["args"]
    assert args[:2] == ["-pym", "pipelines.clicks.flink.job"] and args[2] == "--config"
    config_map = _volume_of(args[3], mounts)["configMap"]["name"]
    cfg = JobConfig.from_dict(json.loads(find(objects, "ConfigMap", config_map)["data"]["job.json"]))
    assert cfg.continuous and cfg.window_s <= cfg.interval_s and cfg.parallelism == 0
    for path in (cfg.requests["path"], cfg.clicks["path"]):
        assert "persistentVolumeClaim" in _volume_of(path, mounts), path
    for path in (cfg.out, cfg.reports):
        volume = _volume_of(path, mounts)
        assert not volume["persistentVolumeClaim"].get("readOnly"), f"{path} must be writable"


def test_the_job_reads_the_volumes_the_online_trainer_reads():
    base = kustomize_build("k8s/base")
    trainer = find(base, "Deployment", "ctr-online-trainer")["spec"]["template"]["spec"]
    claims = {
        v["persistentVolumeClaim"]["claimName"] for v in trainer["volumes"] if "persistentVolumeClaim" in v
    }
    dep = find(kustomize_build("k8s/flink"), "FlinkDeployment", "ctr-click-join")
    flink_claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in dep["spec"]["podTemplate"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert {"ctr-events", "ctr-request-logs"} <= claims & flink_claims
