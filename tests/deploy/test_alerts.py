"""Alert rules: promtool's unit tests fire and silence every alert; compose and k8s load the same rules."""

from __future__ import annotations

import re
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
    "CtrServingVersionRejected",
    "CtrServingFeatureDrift",
    "CtrServingScoreDrift",
    "CtrServingRequestLogDropping",
    "CtrServingNonFiniteOutputs",
    "CtrServingMemoryGrowsAcrossReloads",
    "CtrServingModelStoreFailing",
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


def increased_counters() -> set[str]:
    """The counters an alert takes increase() of."""
    return set(re.findall(r"increase\((\w+)", ALERTS.read_text()))


def test_unit_tests_feed_both_bucket_forms_and_counters_that_start_absent():
    assert increased_counters() == {
        "ctr_serving_model_load_failures_total",
        "ctr_serving_versions_rejected_total",
        "ctr_serving_request_log_dropped_total",
        "ctr_serving_nonfinite_outputs_total",
    }
    les: set[str] = set()
    first_values: dict[str, set[str]] = {name: set() for name in increased_counters()}
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for series in case["input_series"]:
            les.update(re.findall(r'le="([^"]+)"', series["series"]))
            name = series["series"].split("{")[0]
            if name in first_values:
                first_values[name].add(series["values"].split()[0])
    assert les == {"20823", "20823.0"}  # Prometheus v2 keeps the scraped text, v3 stores a float
    # As a scrape shows a counter: absent before the server starts, then 0 (created at start-up), or
    # absent then already past 0 (its first scrape came after the event).
    assert first_values == {
        "ctr_serving_model_load_failures_total": {"_x5", "_x10"},
        "ctr_serving_versions_rejected_total": {"_x5", "_x10", "_x30"},
        "ctr_serving_request_log_dropped_total": {"_x5", "_x10"},
        "ctr_serving_nonfinite_outputs_total": {"_x5", "_x10"},
    }


def test_compose_prometheus_loads_the_rules_file():
    config = yaml.safe_load((REPO_ROOT / "docker/prometheus/prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml", "online-alerts.yml", "live-quality-alerts.yml"]
    compose = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./docker/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert "./docker/prometheus/online-alerts.yml:/etc/prometheus/online-alerts.yml:ro" in mounts
    assert "./docker/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts


def test_k8s_prometheusrule_holds_the_same_groups(builds):
    rule = find(builds["k8s/base"], "PrometheusRule", "ctr-serving")
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    for overlay in ("k8s/overlays/dev", "k8s/overlays/prod"):
        assert find(builds[overlay], "PrometheusRule", "ctr-serving")["spec"] == rule["spec"]
