"""Metric series per version live as long as the version (issue 44): unloading one drops its series from the
process, from the worker's metrics file and from the exited workers' folded totals (metrics_shared.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from serving.observability.metrics import ServingMetrics
from serving.observability.metrics_shared import DEAD_TOTALS, SharedServingMetrics, fold_totals, read_samples
from serving.observability.model_stats import RequestTiming
from tests.helpers import REPO_ROOT
from tests.serving.observability.test_serving_metrics_merge import samples

SERVED = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from serving.observability.metrics_shared import SharedServingMetrics

    metrics = SharedServingMetrics(Path(sys.argv[1]))
    for version in ("1", "2"):
        metrics.version_at_zero("ctr", int(version))
        metrics.fallbacks.inc("ctr", version, "errors")
    print(os.getpid())
""")


def versions(text: str) -> set[str]:
    return {line.split('version="')[1].split('"')[0] for line in text.splitlines() if 'version="' in line}


def serve_versions(metrics: ServingMetrics, *numbers: int) -> None:
    """What serving `numbers` leaves: fallback counters (at 0 from the load, one error), shadow scores, stats."""
    for version in numbers:
        metrics.version_at_zero("ctr", version)
        metrics.fallbacks.inc("ctr", str(version), "errors")
        metrics.shadow_scored.inc("ctr", str(version))
        metrics.model_stats.record("ctr", version, None, RequestTiming(), "INTERNAL")


def test_one_process_forgets_an_unloaded_versions_series() -> None:
    metrics = ServingMetrics()
    serve_versions(metrics, 1, 2)
    assert versions(metrics.render()) == {"1", "2"} and set(metrics.statistics()) == {
        ("ctr", "1"),
        ("ctr", "2"),
    }
    metrics.forget_version("ctr", 1)
    assert versions(metrics.render()) == {"2"}
    assert set(metrics.statistics()) == {("ctr", "2")}
    metrics.forget_version("other", 2)  # another model's version 2: not ctr's
    assert versions(metrics.render()) == {"2"}


def test_a_worker_forgets_an_unloaded_version_in_its_file_and_in_the_folded_totals(tmp_path: Path) -> None:
    worker = SharedServingMetrics(tmp_path)  # this process: a live worker serving versions 1 and 2
    serve_versions(worker, 1, 2)
    exited = subprocess.run(  # a worker that served 1 and 2 too, then exited: the parent folds its totals
        [sys.executable, "-c", SERVED, str(tmp_path)],
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    assert fold_totals(tmp_path, int(exited.stdout))
    before = samples(worker.render())
    assert before['ctr_serving_fallbacks_total{model_name="ctr",version="1",reason="errors"}'] == 2

    worker.forget_version("ctr", 1)  # the live worker unloads 1: no live worker holds it any more
    after = worker.render()
    assert versions(after) == {"2"}
    assert samples(after)['ctr_serving_fallbacks_total{model_name="ctr",version="2",reason="errors"}'] == 2
    own = read_samples([tmp_path / f"totals_{os.getpid()}.db"])
    dead = read_samples([tmp_path / DEAD_TOTALS])
    per_version = {m.name for m in ServingMetrics().per_version()}  # each with its version label second
    assert {labels[1] for name, labels, _ in [*own, *dead] if name in per_version} == {"2"}
    assert not list(tmp_path.glob("*.rewrite"))

    worker.fallbacks.inc("ctr", "2", "errors")  # the rewritten file takes writes as the old one did
    serve_versions(worker, 3)
    s = samples(worker.render())
    assert s['ctr_serving_fallbacks_total{model_name="ctr",version="2",reason="errors"}'] == 3
    assert s['ctr_serving_fallbacks_total{model_name="ctr",version="3",reason="errors"}'] == 1
    assert versions(worker.render()) == {"2", "3"}
