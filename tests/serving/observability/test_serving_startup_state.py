"""What a scrape sees from start-up, and what a `--num_workers` server leaves behind when it stops."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from serving.observability.metrics import REJECT_REASONS
from tests.helpers import REPO_ROOT
from tests.serving.server_process import http

ALERTS = REPO_ROOT / "docker/prometheus/alerts.yml"


def test_counters_alerts_take_increase_of_start_at_0_and_two_workers_stop_without_leaks(
    start_server, model_repo, tmp_path: Path
):
    server = start_server(
        model_repo,
        "--num_workers=2",
        f"--request_log_dir={tmp_path / 'requests'}",
        "--request_log_sample_rate=0.5",
    )
    _, text = http(server.url("/monitoring/prometheus/metrics"))
    samples = dict(line.rsplit(" ", 1) for line in str(text).splitlines() if not line.startswith("#"))
    alerted = set(re.findall(r"increase\((\w+)", ALERTS.read_text()))
    expected = {
        'ctr_serving_model_load_failures_total{model_name="ctr"}',
        'ctr_serving_request_log_dropped_total{model_name="ctr"}',
        'ctr_serving_nonfinite_outputs_total{model_name="ctr"}',
        *(f'ctr_serving_versions_rejected_total{{model_name="ctr",reason="{r}"}}' for r in REJECT_REASONS),
    }
    assert {key.split("{")[0] for key in expected} == alerted  # every counter an alert reads is covered
    assert {key: samples.get(key) for key in expected} == dict.fromkeys(expected, "0")
    assert server.stop() == 0
    # Each worker's body-decoder pool holds multiprocessing semaphores; os._exit must not leak them.
    assert "leaked semaphore" not in server.log()
    assert "resource_tracker" not in server.log()


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("serving", ["gRPC port (default: 8500)", "(default: 10000)"]),
        ("export", ["(default: standard)", "(default: 0.002)"]),
        ("training", ["Lightning strategy (default: auto)", "(default 128)"]),
    ],
)
def test_help_shows_defaults(module: str, expected: list[str]):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    for fragment in expected:
        assert fragment in text, f"python -m {module} --help lacks {fragment!r}"
