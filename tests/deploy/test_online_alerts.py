"""The online trainer's alert rules: promtool fires and silences each; k8s loads the same groups."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s_render import find
from module_flags import accepted_flags, flags

from tests.helpers import REPO_ROOT

ALERTS = REPO_ROOT / "docker/prometheus/online-alerts.yml"
UNIT_TESTS = Path(__file__).with_name("online_alerts_test.yml")
EXPECTED = {"CtrOnlineModelStale", "CtrOnlineGateRefusing"}


def test_promtool_unit_tests_of_the_online_alerts_pass():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (`make sysdeps` installs Debian's prometheus package)")
    proc = subprocess.run(
        [promtool, "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, cwd=UNIT_TESTS.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_online_alert_has_a_firing_and_a_silent_unit_test():
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    assert {r["alert"] for g in groups for r in g["rules"]} == EXPECTED
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == silent == EXPECTED


def test_k8s_online_prometheusrule_holds_the_same_groups(builds):
    rule = find(builds["k8s/base"], "PrometheusRule", "ctr-online-trainer")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


def test_online_trainer_is_one_replica_writing_where_serving_reads(builds):
    deploy = find(builds["k8s/base"], "Deployment", "ctr-online-trainer")
    assert (deploy["spec"]["replicas"], deploy["spec"]["strategy"]["type"]) == (1, "Recreate")
    spec = deploy["spec"]["template"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]}
    serving = find(builds["k8s/base"], "Deployment", "ctr-serving")["spec"]["template"]["spec"]
    serving_claims = {
        v["persistentVolumeClaim"]["claimName"] for v in serving["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims == {
        "events": "ctr-events",
        "request-logs": "ctr-request-logs",
        "online": "ctr-online",
        "models": "ctr-models",
    }
    assert {"ctr-models", "ctr-request-logs"} <= serving_claims  # it reads the logs serving writes
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert (
        mounts["request-logs"] == "/events/requests"
        and "--logs=/events/requests" in spec["containers"][0]["args"]
    )
    [c] = spec["containers"]
    assert c["command"] == ["python", "-m", "pipelines.online"] and "--repo=/models/ctr" in c["args"]
    assert set(flags(c["args"])) <= accepted_flags("pipelines.online")
