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


def _exposed(text: str, job: str) -> dict[str, float]:
    """promtool series selectors -> values of a text exposition, as Prometheus stores a scrape of job `job`."""
    from prometheus_client.parser import text_string_to_metric_families

    series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted({"job": job, **sample.labels}.items()))
            series[f"{sample.name}{{{labels}}}"] = sample.value
    return series


def test_rules_fire_on_the_series_the_evaluator_controller_and_server_export(tmp_path: Path):
    """The exporters' own exposition, scraped before (0-5 min) and after (6-40 min) the events, fires each alert."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (`make sysdeps` installs Debian's prometheus package)")
    from prometheus_client import generate_latest

    from pipelines.live_eval.metrics import LiveMetrics
    from pipelines.rollout.metrics import RolloutMetrics
    from serving.observability.metrics import ServingMetrics

    def figure(version: int, label: str, rows: int, auc: float, ratio: float) -> dict[str, object]:
        return {
            "model": "ctr",
            "version": version,
            "label": label,
            "rows": rows,
            "pending": 10,
            "auc": auc,
        } | {
            "auc_var": 1e-4,
            "logloss": 0.45,
            "ne": 0.9,
            "calibration_ratio": ratio,
        }

    def scrape(after: bool) -> dict[str, float]:
        live, rollout, server = LiveMetrics(), RolloutMetrics(), ServingMetrics()
        # Stable 3 fine; canary 4 (10%) worse and miscalibrated. The evaluator stopped at -120 s.
        live.show([figure(3, "stable", 5000, 0.80, 1.0), figure(4, "canary", 800, 0.74, 1.25)], -120.0)
        rollout.start("ctr", [{"action": "rollback"}] if after else [])
        rollout.show("ctr", 3, 4, {"canary_percent": 10.0})
        for model, newest in (("ctr", 4), ("other", 2)):  # "other": logged, never evaluated
            server.start_at_zero(model)
            server.model_version.set(newest, model)
            server.version_at_zero(model, newest)
            server.request_log_lines.inc(model)  # its values: below
        if after:
            server.fallbacks.inc("ctr", "4", "errors", amount=3)
        text = [generate_latest(live.registry).decode(), generate_latest(rollout.registry).decode()]
        return (
            _exposed(text[0], "live-eval")
            | _exposed(text[1], "rollout")
            | _exposed(server.render(), "serving")
        )

    before, after = scrape(False), scrape(True)
    inputs = []
    for name in sorted(set(before) | set(after)):
        if name.startswith("ctr_serving_request_log_lines_total"):
            inputs.append({"series": name, "values": "0+6x40"})  # the request log keeps writing
        else:
            first = "_" if name not in before else repr(before[name])
            inputs.append({"series": name, "values": f"{first}x5 {after.get(name, 0.0)!r}x34"})
    descriptions = {
        r["alert"]: r["annotations"]["description"] for g in _groups() for r in g["rules"] if "alert" in r
    }

    def expect(at: str, alert: str, *fired: tuple[dict[str, str], str]) -> dict[str, object]:
        alerts = [
            {
                "exp_labels": labels,
                "exp_annotations": {"summary": summary, "description": descriptions[alert]},
            }
            for labels, summary in fired
        ]
        return {"eval_time": at, "alertname": alert, "exp_alerts": alerts}

    canary = {"job": "live-eval", "model": "ctr", "version": "4", "label": "canary", "severity": "ticket"}
    checks = [
        expect(
            "30m",
            "CtrLiveCalibrationOff",
            (canary, "ctr version 4 (canary): live calibration ratio 1.250, outside [0.9, 1.1]"),
        ),
        expect(
            "30m",
            "CtrLiveAucBelowPrevious",
            (
                canary | {"previous_version": "3"},
                "ctr version 4 (canary): live AUC 0.7400, over 0.02 below version 3's",
            ),
        ),
        expect(
            "30m",
            "CtrLiveNoJoinedRows",
            (
                {"model": "other", "version": "2", "severity": "ticket"},
                "other version 2 serves but has no joined rows in the live evaluation",
            ),
        ),
        expect(
            "30m",
            "CtrLiveEvaluatorStale",
            ({"job": "live-eval", "severity": "ticket"}, "live evaluation is 32m 0s behind (down or stuck)"),
        ),
        expect(
            "8m",
            "CtrServingFallback",
            (
                {"model_name": "ctr", "version": "4", "reason": "errors", "severity": "ticket"},
                "ctr version 4: 3 requests answered by the fallback version in 5 minutes (errors)",
            ),
        ),
        expect(
            "8m",
            "CtrRolloutRolledBack",
            ({"model": "ctr", "severity": "info"}, "ctr: the rollout controller rolled a candidate back"),
        ),
        expect("30m", "CtrServingFallback"),  # 5 minutes after the last fallback
    ]
    assert {c["alertname"] for c in checks} == EXPECTED
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}],
    }
    path = tmp_path / "exporters_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr
