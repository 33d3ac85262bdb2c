"""Alert rules: promtool's unit tests fire and silence every alert; compose and k8s load the same rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s_render import find

from tests.helpers import REPO_ROOT

ALERTS = REPO_ROOT / "docker/prometheus/alerts.yml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yml")
EXPECTED_ALERTS = {
    "CtrServingLatencyBudgetFastBurn",
    "CtrServingLatencyBudgetSlowBurn",
    "CtrServingErrorRatioHigh",
    "CtrServingModelLoadFailed",
    "CtrServingFeatureDrift",
    "CtrServingScoreDrift",
    "CtrServingRequestLogDropping",
    "CtrServingNonFiniteOutputs",
}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("needs promtool (`make sysdeps` installs Debian's prometheus package)")
    return path


def _alerts() -> set[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_promtool_unit_tests_pass():
    proc = subprocess.run(
        [_promtool(), "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, cwd=UNIT_TESTS.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test():
    assert _alerts() == EXPECTED_ALERTS
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == EXPECTED_ALERTS
    assert silent == EXPECTED_ALERTS


def test_compose_prometheus_loads_the_rules_file():
    config = yaml.safe_load((REPO_ROOT / "docker/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./docker/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert "./docker/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_k8s_prometheusrule_holds_the_same_groups(builds):
    rule = find(builds["k8s/base"], "PrometheusRule", "ctr-serving")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    for overlay in ("k8s/overlays/dev", "k8s/overlays/prod"):
        assert find(builds[overlay], "PrometheusRule", "ctr-serving")["spec"] == rule["spec"]
