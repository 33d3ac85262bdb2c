"""k8s/: live evaluation in the base, the rollout controller as a component, and the monitors that scrape them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from dockerfiles import exec_form, final_stage, single
from k8s_render import claim_at, container, find, with_components
from module_flags import accepted_flags, flags

from tests.helpers import REPO_ROOT

COMPONENT = REPO_ROOT / "k8s/components/rollout"
CRDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "PyTorchJob"}


def _flag(args: list[str], name: str) -> str:
    [value] = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


@pytest.fixture(scope="module")
def with_rollout(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The dev overlay with the rollout component added to it, as one's own overlay would add it."""
    return with_components("k8s/overlays/dev", ["components/rollout"], tmp_path_factory.mktemp("overlay"))


@pytest.mark.parametrize("path", ["k8s/base", "k8s/overlays/dev", "k8s/overlays/prod"])
def test_live_eval_reads_what_the_servers_and_the_click_tracker_write(builds, path: str):
    objects = builds[path]
    deploy = find(objects, "Deployment", "ctr-live-eval")
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]["type"]) == (1, "Recreate")
    spec = deploy["spec"]["template"]["spec"]
    c = container(spec, "live-eval")
    assert c["command"] == ["python", "-m", "pipelines.live_eval"]
    assert set(flags(c["args"])) <= accepted_flags("pipelines.live_eval")
    assert c["image"].split("/")[-1].startswith("ctr-trainer")  # pyarrow and ctr_model: the trainer image
    serving_spec = find(objects, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    serving = container(serving_spec, "serving")
    logs_claim = claim_at(serving_spec, serving, "/var/log/ctr")[0]
    assert claim_at(spec, c, _flag(c["args"], "--logs")) == (logs_claim, True)
    online_spec = find(objects, "Deployment", "ctr-online-trainer")["spec"]["template"]["spec"]
    online = container(online_spec, "online-trainer")
    clicks = _flag(c["args"], "--clicks")
    assert clicks == _flag(online["args"], "--clicks")  # the click tracker's folder both read
    assert claim_at(spec, c, clicks) == (claim_at(online_spec, online, clicks)[0], True)
    state_claim, read_only = claim_at(spec, c, _flag(c["args"], "--state-dir"))
    assert not read_only
    assert find(objects, "PersistentVolumeClaim", state_claim)["spec"]["accessModes"] == ["ReadWriteMany"]
    port = int(_flag(c["args"], "--metrics-port"))
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": port}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert _flag(c["args"], "--window-s") == "300" and _flag(c["args"], "--min-rows") == "500"


@pytest.mark.parametrize("path", ["k8s/base", "k8s/overlays/dev", "k8s/overlays/prod"])
def test_podmonitor_scrapes_every_pipeline_pod_on_its_metrics_port(builds, path: str):
    objects = builds[path]
    monitor = find(objects, "PodMonitor", "ctr-pipelines")["spec"]
    [expression] = monitor["selector"]["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("app.kubernetes.io/component", "In")
    assert [(e["port"], e["path"]) for e in monitor["podMetricsEndpoints"]] == [("metrics", "/metrics")]
    for name in ("ctr-online-trainer", "ctr-live-eval"):
        template = find(objects, "Deployment", name)["spec"]["template"]
        assert template["metadata"]["labels"]["app.kubernetes.io/component"] in expression["values"]
        [c] = template["spec"]["containers"]
        assert "metrics" in {p["name"] for p in c["ports"]}
        assert int(_flag(c["args"], "--metrics-port")) == next(
            p["containerPort"] for p in c["ports"] if p["name"] == "metrics"
        )
    if path != "k8s/base":
        for kind, name in (("PodMonitor", "ctr-pipelines"), ("PrometheusRule", "ctr-online-trainer")):
            assert find(objects, kind, name)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.latest_version()])
def test_rollout_component_validates_and_is_hardened(with_rollout, version: str):
    for obj in with_rollout:
        assert obj["metadata"].get("namespace") == "ctr-dev" or obj["kind"] == "Namespace"
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, version, strict=True)
    for name in ("ctr-rollout-controller", "ctr-serving"):
        spec = find(with_rollout, "Deployment", name)["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], c["name"]
            assert {"requests", "limits"} <= set(c["resources"]), c["name"]


def test_rollout_controller_edits_the_file_every_serving_pod_reads(with_rollout):
    controller_spec = find(with_rollout, "Deployment", "ctr-rollout-controller")["spec"]["template"]["spec"]
    deploy = find(with_rollout, "Deployment", "ctr-rollout-controller")
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]["type"]) == (1, "Recreate")
    c = container(controller_spec, "rollout")
    assert c["command"] == ["python", "-m", "pipelines.rollout"]
    assert set(flags(c["args"])) <= accepted_flags("pipelines.rollout")
    assert c["image"] == "ctr-serving:latest"  # it parses the config with the server's code
    config = _flag(c["args"], "--model-config")
    serving_spec = find(with_rollout, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    serving = container(serving_spec, "serving")
    argv = serving["command"] + serving["args"]
    assert _flag(argv, "--model_config_file") == config
    assert set(flags(argv)) <= accepted_flags("serving")
    entrypoint = exec_form(single(final_stage(REPO_ROOT / "docker/Dockerfile.serving"), "ENTRYPOINT").args)
    assert [a for a in entrypoint if not a.startswith(("--model_name=", "--model_base_path="))] == serving[
        "command"
    ][:5]
    assert claim_at(controller_spec, c, config) == ("ctr-models", False)
    assert claim_at(serving_spec, serving, config) == ("ctr-models", True)
    # The figures: the live evaluator's state folder, on the same claim, read-only here.
    live_spec = find(with_rollout, "Deployment", "ctr-live-eval")["spec"]["template"]["spec"]
    live = container(live_spec, "live-eval")
    state = _flag(live["args"], "--state-dir")
    assert _flag(c["args"], "--eval-state") == state
    assert claim_at(controller_spec, c, state) == (claim_at(live_spec, live, state)[0], True)
    assert claim_at(controller_spec, c, _flag(c["args"], "--state-dir"))[1] is False
    # The server it asks: the serving Service's REST port.
    service = find(with_rollout, "Service", "ctr-serving")
    rest = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert _flag(c["args"], "--server") == f"http://ctr-serving:{rest}"
    template = find(with_rollout, "Deployment", "ctr-rollout-controller")["spec"]["template"]
    monitor = find(with_rollout, "PodMonitor", "ctr-pipelines")["spec"]["selector"]["matchExpressions"][0]
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] in monitor["values"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {
        "metrics": int(_flag(c["args"], "--metrics-port"))
    }


def test_serving_init_container_writes_the_seed_config_once(with_rollout, tmp_path: Path):
    from serving.repository.model_config import read_model_config

    seed = find(with_rollout, "ConfigMap", "ctr-model-config-seed")["data"]["models.config"]
    assert seed == (REPO_ROOT / "docker/rollout/models.config").read_text()  # the component's copy is equal
    [spec] = read_model_config(REPO_ROOT / "docker/rollout/models.config")
    assert (spec.name, str(spec.base_path)) == ("ctr", "/models/ctr")
    serving_spec = find(with_rollout, "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    [init] = serving_spec["initContainers"]
    mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    volumes = {v["name"]: v for v in serving_spec["volumes"]}
    assert volumes[mounts["/models"]["name"]]["persistentVolumeClaim"] == {"claimName": "ctr-models"}
    assert volumes[mounts["/seed"]["name"]]["configMap"]["name"] == "ctr-model-config-seed"
    assert init["command"][:2] == ["sh", "-c"]
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "models.config").write_text(seed)
    (tmp_path / "models").mkdir()
    script = (
        init["command"][2].replace("/models/", f"{tmp_path}/models/").replace("/seed/", f"{tmp_path}/seed/")
    )
    env = {"PATH": "/usr/bin:/bin", "HOSTNAME": "ctr-serving-abc"}
    subprocess.run(["sh", "-c", script], check=True, env=env)
    written = tmp_path / "models" / "models.config"
    assert written.read_text() == seed
    written.write_text("# the controller's\n")
    subprocess.run(["sh", "-c", script], check=True, env=env)
    assert written.read_text() == "# the controller's\n"
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["models.config"]
