"""k8s/: the online loop's services, the traffic simulator as a component (k8s/components/traffic), and compose's
online profile carrying the same commands."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from k8s_render import claim_at, container, find, with_components
from module_flags import accepted_flags, flags

from tests.helpers import REPO_ROOT

COMPOSE = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]
CRDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "PyTorchJob"}


def _flag(args: list[str], name: str) -> str:
    [value] = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


@pytest.fixture(scope="module")
def with_traffic(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The dev overlay with the traffic component added to it."""
    return with_components("k8s/overlays/dev", ["components/traffic"], tmp_path_factory.mktemp("overlay"))


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.latest_version()])
def test_traffic_component_validates_and_is_hardened(with_traffic, version: str):
    for obj in with_traffic:
        assert obj["metadata"].get("namespace") == "ctr-dev" or obj["kind"] == "Namespace"
        if obj["kind"] not in CRDS:
            kubernetes_validate.validate(obj, version, strict=True)
    deploy = find(with_traffic, "Deployment", "ctr-traffic")
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]["type"]) == (1, "Recreate")
    spec = deploy["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    c = container(spec, "traffic")
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"requests", "limits"} <= set(c["resources"])


def test_traffic_sends_to_the_service_and_writes_where_the_trainer_reads(with_traffic):
    spec = find(with_traffic, "Deployment", "ctr-traffic")["spec"]["template"]["spec"]
    c = container(spec, "traffic")
    assert c["image"] == "ctr-trainer:latest"
    # The script and flags of compose's traffic service, with the Service's address for compose's.
    traffic = COMPOSE["traffic"]
    script = traffic["entrypoint"][2].replace("$$", "$").replace("serving:8501", "ctr-serving:8501")
    assert c["command"] == [*traffic["entrypoint"][:2], script, *traffic["entrypoint"][3:]]
    module = script.split("exec python -m ")[1].split()[0]
    assert set(flags(c["args"])) <= accepted_flags(module)
    service = find(with_traffic, "Service", "ctr-serving")
    rest = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert _flag(c["args"], "--url") == f"http://ctr-serving:{rest}"
    # Its clicks, on the claim and folder the online trainer and live evaluation read.
    clicks = _flag(c["args"], "--clicks-dir")
    assert claim_at(spec, c, clicks) == ("ctr-events", False)
    for name, reader in (("ctr-online-trainer", "online-trainer"), ("ctr-live-eval", "live-eval")):
        reader_spec = find(with_traffic, "Deployment", name)["spec"]["template"]["spec"]
        r = container(reader_spec, reader)
        assert _flag(r["args"], "--clicks") == clicks
        assert claim_at(reader_spec, r, clicks) == ("ctr-events", True)
    # Every request logged: the serving pods' sample rate is 1 with the component, 1% without.
    serving = container(
        find(with_traffic, "Deployment", "ctr-serving")["spec"]["template"]["spec"], "serving"
    )
    assert _flag(serving["args"], "--request_log_sample_rate") == "1"


@pytest.mark.parametrize("path", ["k8s/base", "k8s/overlays/dev", "k8s/overlays/prod"])
def test_no_overlay_of_ours_simulates_traffic(builds, path: str):
    objects = builds[path]
    assert not [o for o in objects if o["metadata"]["name"] == "ctr-traffic"]
    serving = container(find(objects, "Deployment", "ctr-serving")["spec"]["template"]["spec"], "serving")
    assert _flag(serving["args"], "--request_log_sample_rate") == "0.01"


def test_the_online_trainer_runs_composes_command_on_the_same_folders(builds):
    objects = builds["k8s/overlays/dev"]
    spec = find(objects, "Deployment", "ctr-online-trainer")["spec"]["template"]["spec"]
    c = container(spec, "online-trainer")
    online = COMPOSE["online"]
    assert c["command"] == online["entrypoint"]
    for flag in ("--clicks", "--repo", "--work"):
        assert _flag(c["args"], flag) == _flag(online["command"], flag), flag
    assert claim_at(spec, c, _flag(c["args"], "--repo")) == ("ctr-models", False)
    assert claim_at(spec, c, _flag(c["args"], "--work")) == ("ctr-online", False)
    assert claim_at(spec, c, _flag(c["args"], "--logs")) == ("ctr-request-logs", True)
