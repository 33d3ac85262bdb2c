"""The serving image's exact entrypoint and environment, run on the host against a test repository."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from host_container import (
    HostContainer,
    compose_command,
    deployment_args,
    http_get,
    run_healthcheck,
    start_from_image,
    stop,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families
from tiny_model import WIDTH, expected_ctr

from tests.helpers import REPO_ROOT


@pytest.fixture(scope="module")
def served(model_repository, builds, tmp_path_factory) -> Iterator[HostContainer]:
    """The image's server on the test repository, with the Deployment's args (they must parse)."""
    base, _, _ = model_repository
    host = start_from_image(base, tmp_path_factory.mktemp("serving"), deployment_args(builds))
    try:
        wait_until(host, "/v1/models/ctr", 200)
        yield host
    finally:
        stop(host)


def test_entrypoint_answers_predict_with_the_models_scores(served, model_repository):
    _, weights, bias = model_repository
    features = np.stack([np.zeros(WIDTH), np.linspace(-1.0, 1.0, WIDTH)]).astype(np.float32)
    request = urllib.request.Request(
        served.rest + "/v1/models/ctr:predict",
        data=json.dumps({"instances": features.tolist()}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.status == 200
        predictions = np.asarray(json.loads(r.read())["predictions"])
    assert predictions.shape == (2, 1)
    np.testing.assert_allclose(predictions, expected_ctr(features, weights, bias), rtol=1e-5)


def test_entrypoint_serves_a_metrics_scrape(served):
    status, body = http_get(served.rest + "/v1/models/ctr")
    assert status == 200 and json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"
    for path in ("/monitoring/prometheus/metrics", "/metrics"):
        status, text = http_get(served.rest + path)
        assert status == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples
        }
        assert samples[("ctr_serving_model_version", (("model_name", "ctr"),))] == 1.0


def test_image_healthcheck_passes_once_a_version_is_loaded(served):
    assert run_healthcheck(served.rest_port) == 0


def test_dashboard_queries_only_metrics_the_server_exports(served):
    """Every metric a Grafana panel queries is in the exposition of the server, live evaluation or the rollout
    controller (names drift otherwise)."""
    from prometheus_client import generate_latest

    from pipelines.live_eval.metrics import LiveMetrics
    from pipelines.rollout.metrics import RolloutMetrics

    _, text = http_get(served.rest + "/monitoring/prometheus/metrics")
    texts = [text.decode()] + [
        generate_latest(m.registry).decode() for m in (LiveMetrics(), RolloutMetrics())
    ]
    exported = {m.group(1) for t in texts for m in re.finditer(r"^# TYPE (\S+) ", t, re.M)}
    dashboard = json.loads((REPO_ROOT / "docker/grafana/dashboards/ctr-serving.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {m.group(1) for e in exprs for m in re.finditer(r"([:a-zA-Z_][:\w]*)\{", e)}
    suffixes = ("_bucket", "_sum", "_count")
    missing = {
        q
        for q in queried
        if q not in exported and not any(q.endswith(s) and q[: -len(s)] in exported for s in suffixes)
    }
    assert not missing, f"dashboard queries metrics the server does not export: {sorted(missing)}"


def test_empty_repository_is_live_but_not_ready_and_unhealthy(tmp_path):
    """Probe semantics: /healthz (liveness) 200, model status (readiness, HEALTHCHECK) 503 until a version."""
    host = start_from_image(tmp_path / "models" / "ctr", tmp_path, compose_command())
    try:
        wait_until(host, "/healthz", 200, timeout=60)
        assert http_get(host.rest + "/v1/models/ctr")[0] == 503
        assert run_healthcheck(host.rest_port) == 1
    finally:
        assert stop(host) == 0, host.log.read_text()[-3000:]


def test_sigterm_drains_and_exits_zero(model_repository, tmp_path):
    base, _, _ = model_repository
    host = start_from_image(base, tmp_path, compose_command())
    wait_until(host, "/v1/models/ctr", 200)
    started = time.monotonic()
    assert stop(host) == 0, host.log.read_text()[-3000:]
    assert time.monotonic() - started < 20.0
