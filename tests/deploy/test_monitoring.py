"""docker/prometheus and docker/grafana: valid config, valid PromQL, and the panels the issue asks for."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO_ROOT

DOCKER = REPO_ROOT / "docker"
DASHBOARD = json.loads((DOCKER / "grafana/dashboards/ctr-serving.json").read_text())
COMPOSE = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())
# Grafana's own variables, replaced by plain values so that promtool can parse the queries.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job": "serving", "$model": "ctr"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("needs promtool (`make sysdeps` installs Debian's prometheus package)")
    return path


def _panel(title: str) -> dict:
    found = [p for p in DASHBOARD["panels"] if p["title"] == title]
    assert len(found) == 1, f"expected one panel {title!r}"
    return found[0]


def test_prometheus_config_is_valid():
    proc = subprocess.run(
        [_promtool(), "check", "config", str(DOCKER / "prometheus/prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_prometheus_scrapes_the_servers_metrics_path():
    config = yaml.safe_load((DOCKER / "prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["serving"]["static_configs"][0]["targets"] == ["serving:8501"]
    assert jobs["tfserving"]["static_configs"][0]["targets"] == ["tfserving:8501"]
    assert {jobs[name]["metrics_path"] for name in ("serving", "tfserving")} == {
        "/monitoring/prometheus/metrics"
    }
    # The live evaluator and the rollout controller: prometheus_client's /metrics, Prometheus' default path.
    assert jobs["live-eval"]["static_configs"][0]["targets"] == ["live-eval:9108"]
    assert jobs["rollout"]["static_configs"][0]["targets"] == ["rollout:9109"]
    assert "metrics_path" not in jobs["live-eval"] and "metrics_path" not in jobs["rollout"]
    tfserving_config = (DOCKER / "tfserving/monitoring.config").read_text()
    assert 'path: "/monitoring/prometheus/metrics"' in tfserving_config


def test_every_dashboard_query_is_valid_promql(tmp_path: Path):
    """promtool parses each panel's query as a recording rule (it has no standalone query check)."""
    rules = []
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            rules.append({"record": f"panel_{panel['id']}_{target['refId']}", "expr": expr})
    rule_file = tmp_path / "dashboard_rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([_promtool(), "check", "rules", str(rule_file)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_has_the_operational_panels():
    assert "rate(:tensorflow:serving:request_count" in _panel("Request rate")["targets"][0]["expr"]
    latency = [t["expr"] for t in _panel("Latency p50 / p99")["targets"]]
    assert [e.split(",")[0] for e in latency] == ["histogram_quantile(0.5", "histogram_quantile(0.99"]
    assert all(":tensorflow:serving:request_latency_bucket" in e for e in latency)
    errors = _panel("Error rate by status")["targets"][0]["expr"]
    assert errors.startswith("sum by (status)") and 'status!="OK"' in errors
    assert "ctr_serving_batch_size_bucket" in _panel("Batch size")["targets"][0]["expr"]
    ctr = _panel("Predicted CTR distribution")
    assert ctr["type"] == "heatmap" and "ctr_serving_predicted_ctr_bucket" in ctr["targets"][0]["expr"]
    assert "ctr_serving_model_version" in _panel("Model version")["targets"][0]["expr"]


def test_dashboard_uses_the_provisioned_datasource():
    provisioned = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    assert provisioned["datasources"][0]["url"] == "http://prometheus:9090"
    for panel in DASHBOARD["panels"]:
        assert panel["datasource"]["uid"] == uid
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"])


def test_grafana_loads_dashboards_from_where_compose_mounts_them():
    providers = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/ctr.yml").read_text())["providers"]
    mounts = dict(v.split(":")[:2] for v in COMPOSE["services"]["grafana"]["volumes"])
    assert mounts["./docker/grafana/dashboards"] == providers[0]["options"]["path"]
    assert mounts["./docker/grafana/provisioning"] == "/etc/grafana/provisioning"
    home = COMPOSE["services"]["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == providers[0]["options"]["path"] + "/ctr-serving.json"


def test_dashboard_has_the_drift_panel():
    drift = _panel("Drift (PSI)")
    exprs = [t["expr"] for t in drift["targets"]]
    assert exprs[0].startswith("topk(10, max by (feature) (ctr_serving_feature_drift_psi{")
    assert exprs[1].startswith("max(ctr_serving_score_drift_psi{")
    steps = drift["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.1, 0.2]  # the alert fires above the last one


def test_dashboard_has_the_live_quality_row():
    auc = _panel("Live AUC per version")["targets"][0]["expr"]
    ratio = _panel("Live calibration ratio per version")
    assert auc == 'max by (version, label) (ctr_live_auc{model="$model"})'
    assert "ctr_live_calibration_ratio" in ratio["targets"][0]["expr"]
    steps = ratio["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.9, 1.1]  # CtrLiveCalibrationOff's bounds
    fallbacks = [t["expr"] for t in _panel("Fallbacks and canary share")["targets"]]
    assert (
        "increase(ctr_serving_fallbacks_total" in fallbacks[0]
        and "ctr_rollout_canary_percent" in fallbacks[1]
    )
    row = [p["gridPos"] for p in DASHBOARD["panels"] if p["id"] in (12, 13, 14)]
    assert {g["y"] for g in row} == {max(p["gridPos"]["y"] for p in DASHBOARD["panels"])}
    assert sum(g["w"] for g in row) == 24
