"""Metrics across `--num_workers`: the files of real worker processes, merged into one exposition.

Each worker is its own process (its own pid, so its own files), as under serving/app/workers.py. Also holds
prometheus_client's MmapedDict, which is not public API, to the behaviour the server relies on.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from serving.observability.metrics_shared import SharedServingMetrics, read_samples
from tests.helpers import REPO_ROOT

WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from serving.observability.metrics_shared import SharedServingMetrics

    metrics = SharedServingMetrics(Path(sys.argv[1]))
    n = int(sys.argv[2])
    for _ in range(n):
        metrics.request_count.inc("ctr", "OK")
    metrics.request_count.inc("ctr", "INVALID_ARGUMENT")
    metrics.batch_size.observe(float(n), "ctr")
    metrics.inflight.set(float(n), "ctr")
    metrics.model_version.set(float(n), "ctr")
""")


def run_worker(directory: Path, n: int) -> None:
    subprocess.run(
        [sys.executable, "-c", WORKER, str(directory), str(n)], cwd=REPO_ROOT, check=True, timeout=60
    )


def samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value for every sample line of an exposition."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_counters_and_histograms_sum_and_gauges_combine_by_mode(tmp_path: Path) -> None:
    run_worker(tmp_path, 2)
    run_worker(tmp_path, 5)
    s = samples(SharedServingMetrics(tmp_path).render())  # a third worker scrapes
    assert s[':tensorflow:serving:request_count{model_name="ctr",status="OK"}'] == 7
    assert s[':tensorflow:serving:request_count{model_name="ctr",status="INVALID_ARGUMENT"}'] == 2
    assert s['ctr_serving_batch_size_count{model_name="ctr"}'] == 2
    assert s['ctr_serving_batch_size_sum{model_name="ctr"}'] == 7
    assert s['ctr_serving_batch_size_bucket{model_name="ctr",le="1"}'] == 0
    assert s['ctr_serving_batch_size_bucket{model_name="ctr",le="2"}'] == 1
    assert s['ctr_serving_batch_size_bucket{model_name="ctr",le="4"}'] == 1
    assert s['ctr_serving_batch_size_bucket{model_name="ctr",le="8"}'] == 2
    assert s['ctr_serving_batch_size_bucket{model_name="ctr",le="+Inf"}'] == 2
    assert s['ctr_serving_inflight_requests{model_name="ctr"}'] == 7  # livesum
    assert s['ctr_serving_model_version{model_name="ctr"}'] == 5  # max


def test_an_exited_worker_keeps_its_totals_but_not_its_gauges(tmp_path: Path) -> None:
    run_worker(tmp_path, 2)
    run_worker(tmp_path, 5)
    scraper = SharedServingMetrics(tmp_path)
    version = ("ctr_serving_model_version", ("ctr",), "")
    [gone] = [p for p in tmp_path.glob("live_*.db") if read_samples([p]).get(version) == [5.0]]
    gone.unlink()  # what the parent does when a worker exits: here the one that served 5 requests
    s = samples(scraper.render())
    assert s[':tensorflow:serving:request_count{model_name="ctr",status="OK"}'] == 7
    assert s['ctr_serving_inflight_requests{model_name="ctr"}'] == 2
    assert s['ctr_serving_model_version{model_name="ctr"}'] == 2
