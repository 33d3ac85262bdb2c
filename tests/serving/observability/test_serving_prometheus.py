"""A real Prometheus scrapes a running server; promtool accepts the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.serving.server_process import http

# promtool's lint rules that TF Serving's own metric names break by design (they are kept for dashboards).
TF_SERVING_LINT = (
    "metric names should not contain ':'",
    'counter metrics should have "_total" suffix',
    'non-histogram and non-summary metrics should not have "_count" suffix',
)
LATENCY_P99 = 'histogram_quantile(0.99, sum by (le) (rate({__name__=":tensorflow:serving:request_latency_bucket"}[1m])))'


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (run `make sysdeps`)")
def test_promtool_accepts_the_exposition(shared_server) -> None:
    http(shared_server.url("/v1/models/ctr:predict"), {"instances": [[0.5] * 128]})
    _, text = http(shared_server.url("/monitoring/prometheus/metrics"))
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    # Exit 3 = lint findings only (a parse error exits 1); every finding must be on a TF Serving name.
    assert result.returncode in (0, 3), problems
    for problem in problems:
        name, _, rule = problem.partition(" ")
        assert name.startswith(":tensorflow:serving:") and rule in TF_SERVING_LINT, problem


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="prometheus is not installed (run `make sysdeps`)"
)
def test_prometheus_scrapes_and_computes_p99_latency(start_server, model_repo, tmp_path: Path) -> None:
    server = start_server(model_repo)
    prom_port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        json.dumps(  # JSON is valid YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "ctr-serving",
                        "metrics_path": "/monitoring/prometheus/metrics",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.rest_port}"]}],
                    }
                ],
            }
        )
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        value = None
        deadline = time.monotonic() + 45
        while value is None and time.monotonic() < deadline:
            for _ in range(20):
                http(server.url("/v1/models/ctr:predict"), {"instances": [[0.5] * 128]})
            time.sleep(0.5)
            query = urllib.parse.urlencode({"query": LATENCY_P99})
            status, body = http(f"http://127.0.0.1:{prom_port}/api/v1/query?{query}")
            if status == 200 and body["data"]["result"]:
                sample = body["data"]["result"][0]["value"][1]
                value = float(sample) if sample != "NaN" else None
        assert value is not None, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert 0 < value < 1e7  # microseconds, as TF Serving reports them
        status, body = http(f"http://127.0.0.1:{prom_port}/api/v1/query?query=ctr_serving_model_version")
        assert body["data"]["result"][0]["value"][1] == "1"
    finally:
        prom.terminate()
        prom.wait(15)
