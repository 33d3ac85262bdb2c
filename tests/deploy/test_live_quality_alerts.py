"""Live-quality and rollout alert rules: promtool fires and silences each; compose and k8s load the same groups."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from k8s_render import find

from tests.helpers import REPO_ROOT

ALERTS = REPO_ROOT / "docker/prometheus/live-quality-alerts.yml"
UNIT_TESTS = Path(__file__).with_name("live_quality_alerts_test.yml")
EXPECTED = {
    "CtrLiveCalibrationOff",
    "CtrLiveAucBelowPrevious",
    "CtrLiveNoJoinedRows",
    "CtrLiveEvaluatorStale",
    "CtrServingFallback",
    "CtrRolloutRolledBack",
}


def _groups() -> list[dict]:
    return yaml.safe_load(ALERTS.read_text())["groups"]


def test_promtool_unit_tests_of_the_live_quality_alerts_pass():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (`make sysdeps` installs Debian's prometheus package)")
    proc = subprocess.run(
        [promtool, "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, cwd=UNIT_TESTS.parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_live_quality_alert_has_a_firing_and_a_silent_unit_test():
    assert {r["alert"] for g in _groups() for r in g["rules"] if "alert" in r} == EXPECTED
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    assert firing == silent == EXPECTED


def test_rules_hold_the_issues_bounds_on_the_shared_metric_names():
    rules = {r["alert"]: r["expr"] for g in _groups() for r in g["rules"] if "alert" in r}
    calibration = rules["CtrLiveCalibrationOff"]
    assert (
        "ctr_live_calibration_ratio < 0.9" in calibration
        and "ctr_live_calibration_ratio > 1.1" in calibration
    )
    auc = rules["CtrLiveAucBelowPrevious"]
    assert 'ctr_live_auc{label=~"canary|shadow"}' in auc and 'ctr_live_auc{label="none"}' in auc
    assert auc.count(") - 0.02") == 2
    names = set(re.findall(r"[\w:]+", rules["CtrLiveNoJoinedRows"]))
    assert {"ctr_live_joined_rows", "ctr:serving_newest_version", "ctr_rollout_stable_version"} <= names
    assert "ctr_live_last_interval_end_seconds" in rules["CtrLiveEvaluatorStale"]
    assert re.findall(r"increase\((\w+)", ALERTS.read_text()) == [
        "ctr_serving_request_log_lines_total",
        "ctr_serving_fallbacks_total",
        "ctr_rollout_decisions_total",
    ]


def test_the_server_exports_the_series_the_rules_read():
    from serving.observability.metrics import ServingMetrics

    names = {m.name for m in ServingMetrics().metrics()}
    assert {"ctr_serving_model_version", "ctr_serving_request_log_lines_total"} <= names


def test_compose_prometheus_loads_the_live_quality_rules_and_scrapes_both_services():
    config = yaml.safe_load((REPO_ROOT / "docker/prometheus/prometheus.yml").read_text())
    assert "live-quality-alerts.yml" in config["rule_files"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["live-eval"]["static_configs"][0]["targets"] == ["live-eval:9108"]
    assert jobs["rollout"]["static_configs"][0]["targets"] == ["rollout:9109"]
    compose = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./docker/prometheus/live-quality-alerts.yml:/etc/prometheus/live-quality-alerts.yml:ro" in mounts


def test_k8s_live_quality_prometheusrule_holds_the_same_groups(builds):
    rule = find(builds["k8s/base"], "PrometheusRule", "ctr-live-quality")
    assert rule["spec"]["groups"] == _groups()
    for overlay in ("k8s/overlays/dev", "k8s/overlays/prod"):
        rendered = find(builds[overlay], "PrometheusRule", "ctr-live-quality")
        assert rendered["spec"] == rule["spec"]
        assert rendered["metadata"]["labels"]["release"] == "kube-prometheus-stack"
